"""Triton FP4 quantiser (`triton_fp4.py`), Walsh-Hadamard (`triton_hadamard.py`) and hash router
(`triton_route.py::hash_route_triton`) against `ref/`, plus their API dispatch.

* FP4: every step is exact or one correctly rounded fp32 multiply done as the reference does it (kernel
  docstring), so codes, exponents and dequantised values must be identical bit for bit (NaN where the reference
  has NaN), and the official fixture vectors (tests/data/v4-tiny-official, as test_quant_fixture.py) must come
  out exactly. Triton's CPU interpreter converts bf16 subnormals to fp32 wrongly (the GPU does not), so CPU
  tests feed bf16 subnormals only through fp32 inputs; the GPU test includes them in bf16.
* Hadamard "butterfly": the reference's fp32 stages in its order, then one fp32 multiply and one RNE rounding to
  x's dtype: bit-exact. "dot" (bf16 / fp16): the same exact products summed in another order, so per output
  |d| <= 1 ulp of the output dtype at |ref| + 2 * n * u * scale * sum|x| (u = 2^-24; both sides' fp32 sums). The
  CPU test runs it in fp16 only (the interpreter's tl.dot mishandles bf16 operands).
* hash_route: ids are a table lookup, exact. Weights: scores differ per side by a relative (10 + 2|x|) u for
  sqrtsoftplus / sigmoid, (10 + 2|x - max| + E) u for softmax (see test_pool_route_triton.py); a weight is a
  ratio of scores: relative 2 * that + (topk + 3) u.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the @triton.jit in the kernel modules
pytest.importorskip("triton")

import deepinfer.tile_kernels as tk  # noqa: E402
from deepinfer.tile_kernels import _dispatch  # noqa: E402
from deepinfer.tile_kernels.ref import quant as ref  # noqa: E402
from deepinfer.tile_kernels.ref.fused import hadamard_fp4_quant_dequant  # noqa: E402
from deepinfer.tile_kernels.ref.moe import hash_route, moe_scores  # noqa: E402


def _kernels(name: str):  # noqa: ANN202 (a module)
    mod = f"deepinfer.tile_kernels.backends.cuda.{name}"
    if not _CUDA and mod in sys.modules:
        importlib.reload(sys.modules[mod])
    return importlib.import_module(mod)


_FP4 = _kernels("triton_fp4")
_HAD = _kernels("triton_hadamard")
_ROUTE = _kernels("triton_route")
DEV = "cuda" if _CUDA else "cpu"
U = 2.0**-24
FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "data" / "v4-tiny-official"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bitwise equality (sign of zero included), NaN == NaN; prints the first differing index on failure."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    g, w = got.float().cpu(), want.float().cpu()
    nan = torch.isnan(w)
    assert torch.equal(torch.isnan(g), nan), f"NaN pattern differs at {(torch.isnan(g) != nan).nonzero()[:4]}"
    diff = ((g != w) | (torch.signbit(g) != torch.signbit(w))) & ~nan
    if diff.any():
        first = diff.nonzero()[0].tolist()
        raise AssertionError(
            f"{int(diff.sum())} differ; first at {first}: got {g[tuple(first)]} want {w[tuple(first)]}"
        )


def _fp4_inputs(rows: int, n: int, group: int, seed: int, dtype: torch.dtype, subnormal: bool) -> torch.Tensor:
    """N(0, 1) times 2^U(-20, 20) per group; the first groups: zeros, a NaN, an inf, huge values, exact e2m1
    ties (k + 0.5 grid points times the block scale), negatives; `subnormal` adds a group of fp32 subnormals."""
    g = _gen(seed)
    x = torch.randn(rows, n // group, group, generator=g)
    x = x * torch.exp2(torch.randint(-20, 21, (rows, n // group, 1), generator=g).float())
    flat = x.view(-1, group)
    flat[0] = 0.0
    flat[1, 3] = float("nan")
    flat[2, 5] = float("-inf")
    flat[3] = torch.randn(group, generator=g) * 1e37
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    flat[4] = ties[torch.randint(0, 8, (group,), generator=g)] * 2.0**-3 * torch.sign(torch.randn(group, generator=g))
    flat[4, 0] = 6.0 * 2.0**-3  # amax exactly 6 * 2^-3: the block scale is 2^-3, the ties stay ties
    flat[5] = -flat[5].abs()
    if subnormal:
        flat[6] = torch.randn(group, generator=g) * 1e-39
    return x.reshape(rows, n).to(dtype).to(DEV)


@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_fp4_matches_reference(group: int, dtype: torch.dtype) -> None:
    """Codes, exponents and dequantised values bit for bit, including the extreme groups."""
    x = _fp4_inputs(3, 4 * group, group, seed=group, dtype=dtype, subnormal=dtype == torch.float32)
    codes, e = _FP4.fp4_group_quant_triton(x, group, "codes")
    c_ref, e_ref = ref.fp4_quant_ue8m0(x, group)
    assert codes.dtype == torch.uint8 and torch.equal(codes.cpu(), c_ref.cpu()), (codes != c_ref).nonzero()[:4]
    assert torch.equal(e.cpu(), e_ref.cpu())
    d, none = _FP4.fp4_group_quant_triton(x, group, "dequant")
    assert none is None
    _same(d, ref.fp4_quant_dequant_ue8m0(x, group))


def test_fp4_strided_and_3d() -> None:
    """A [t, heads, 128] view with a padded row stride reads in place; results contiguous."""
    base = _fp4_inputs(4, 3 * 160, 32, seed=7, dtype=torch.bfloat16, subnormal=False).view(4, 3, 160)
    x = base[..., :128]
    d, _ = _FP4.fp4_group_quant_triton(x, 32, "dequant")
    assert d.is_contiguous()
    _same(d, ref.fp4_quant_dequant_ue8m0(x, 32))


def test_fp4_fixture_vectors() -> None:
    """The official fixture's FP4 vectors (post-Hadamard indexer input and edge cases) come out exactly."""
    from safetensors.torch import load_file

    golden = load_file(str(FIXTURE / "golden.safetensors"))
    for prefix, name in (("qat_index_fp4", "qat_index_fp4_post_hadamard"), ("qat_fp4_edge", "qat_fp4_edge_input")):
        x = golden[name].to(DEV)
        _, e = _FP4.fp4_group_quant_triton(x, 32, "codes")
        assert torch.equal(e.cpu(), golden[f"{prefix}_scale_exp"])
        _same(_FP4.fp4_group_quant_triton(x, 32, "dequant")[0], golden[f"{prefix}_output"])
    h = _HAD.hadamard_triton(golden["qat_index_fp4_pre_hadamard"].to(DEV))
    _same(h, ref.hadamard_transform(golden["qat_index_fp4_pre_hadamard"]).to(DEV))


def test_fp4_bad_inputs() -> None:
    x = torch.randn(2, 64).to(DEV)
    with pytest.raises(ValueError, match="group"):
        _FP4.fp4_group_quant_triton(x, 48)
    with pytest.raises(ValueError, match="multiple"):
        _FP4.fp4_group_quant_triton(x[:, :48], 32)
    with pytest.raises(TypeError, match="x must"):
        _FP4.fp4_group_quant_triton(x.double(), 32)
    assert _FP4.fp4_group_quant_triton(x[:0], 32, "codes")[1].shape == (0, 2)


# ------------------------------------------------------------------------------------------------------ Hadamard


@pytest.mark.parametrize("n", [2, 16, 128, 1024])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_hadamard_butterfly_bit_exact(n: int, dtype: torch.dtype) -> None:
    x = (torch.randn(9, n, generator=_gen(n)) * 3.0).to(dtype).to(DEV)
    _same(_HAD.hadamard_triton(x), ref.hadamard_transform(x))
    _same(_HAD.hadamard_triton(x, 0.25), ref.hadamard_transform(x, 0.25))


def test_hadamard_strided_nan_and_inf() -> None:
    """A strided 3-D view; a NaN spreads over its row; inf gives the reference's inf / NaN pattern."""
    base = torch.randn(5, 3, 256, generator=_gen(3)).to(DEV)
    x = base[:, :, ::2]  # column stride 2
    x[0, 0, 7] = float("nan")
    x[1, 2, 3] = float("inf")
    _same(_HAD.hadamard_triton(x), ref.hadamard_transform(x))


def _dot_bound(x: torch.Tensor, want: torch.Tensor, scale: float) -> torch.Tensor:
    n = x.shape[-1]
    ulp = torch.finfo(x.dtype).eps * want.float().abs() + torch.finfo(x.dtype).tiny
    return ulp + 2 * n * U * scale * x.float().abs().sum(-1, keepdim=True)


@pytest.mark.parametrize("n", [16, 128])
def test_hadamard_dot_variant_close(n: int) -> None:
    x = (torch.randn(40, n, generator=_gen(n + 1)) * 3.0).to(torch.float16).to(DEV)
    got, want = _HAD.hadamard_triton(x, impl="dot"), ref.hadamard_transform(x)
    err = (got.float() - want.float()).abs()
    bound = _dot_bound(x, want, n**-0.5)
    assert (err <= bound).all(), f"max err {err.max():.3g} at {(err > bound).nonzero()[0].tolist()}"


@pytest.mark.parametrize(("n", "block"), [(128, 32), (64, 64), (256, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_hadamard_fp4_fused_bit_exact(n: int, block: int, dtype: torch.dtype) -> None:
    """The fused indexer op equals Hadamard, rounding to x.dtype, FP4 quant-dequant, bit for bit."""
    x = (torch.randn(6, 3, n, generator=_gen(n + block)) * 4.0).to(dtype).to(DEV)
    x[0, 0, 5] = float("nan")
    _same(_HAD.hadamard_fp4_triton(x, None, block), hadamard_fp4_quant_dequant(x, None, block))
    _same(_HAD.hadamard_fp4_triton(x[:, 1], 0.5, block), hadamard_fp4_quant_dequant(x[:, 1], 0.5, block))


def test_hadamard_fp4_fused_fixture() -> None:
    """The fixture's pre-Hadamard indexer vectors through the fused kernel give the reference's composition."""
    from safetensors.torch import load_file

    pre = load_file(str(FIXTURE / "golden.safetensors"))["qat_index_fp4_pre_hadamard"]
    _same(_HAD.hadamard_fp4_triton(pre.to(DEV)), hadamard_fp4_quant_dequant(pre).to(DEV))


def test_hadamard_bad_inputs() -> None:
    x = torch.randn(2, 128).to(DEV)
    with pytest.raises(ValueError, match="power of two"):
        _HAD.hadamard_triton(x[:, :96])
    with pytest.raises(ValueError, match="impl"):
        _HAD.hadamard_triton(x, impl="fft")
    with pytest.raises(ValueError, match="dot"):
        _HAD.hadamard_triton(x, impl="dot")  # fp32
    assert _HAD.hadamard_triton(x[:0]).shape == (0, 128)
    with pytest.raises(ValueError, match="block"):
        _HAD.hadamard_fp4_triton(x, None, 256)


# ---------------------------------------------------------------------------------------------------- hash_route


def _check_hash(logits: torch.Tensor, tok: torch.Tensor, tab: torch.Tensor, scoring: str, scale: float, renorm: bool):
    w, ids = _ROUTE.hash_route_triton(logits, tok, tab, scoring, scale, renorm)
    w_ref, ids_ref = hash_route(logits, tok, tab, scoring, scale, renorm)
    assert w.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.equal(ids, ids_ref)
    x = logits.float()
    s = moe_scores(x, scoring)
    if scoring == "softmax":
        rel = 10 + 2 * (x - x.amax(-1, keepdim=True)).abs() + x.shape[-1]
    else:
        rel = 10 + 2 * x.abs()
    rel_w = (2 * rel * U).gather(1, ids_ref).amax(-1, keepdim=True)
    bound = (2 * rel_w + (tab.shape[1] + 3) * U) * w_ref.abs()
    err = (w - w_ref).abs()
    assert (err <= bound).all(), f"max weight err {err.max():.3g}, first bad {(err > bound).nonzero()[0].tolist()}"
    del s


@pytest.mark.parametrize("scoring", ["sqrtsoftplus", "sigmoid", "softmax"])
@pytest.mark.parametrize(("t", "e", "k", "renorm"), [(70, 256, 6, True), (5, 64, 8, False), (3, 20, 1, True)])
def test_hash_route_matches_reference(t: int, e: int, k: int, renorm: bool, scoring: str) -> None:
    g = _gen(t + e)
    logits = (torch.randn(t, e, generator=g) * 3.0).to(DEV)
    tab = torch.randint(0, e, (1000, k), generator=g).to(DEV)
    tok = torch.randint(0, 1000, (t,), generator=g).to(DEV)
    _check_hash(logits, tok, tab, scoring, 1.5, renorm)


def test_hash_route_strided_int32_bf16() -> None:
    g = _gen(5)
    logits = (torch.randn(48, 9, generator=g) * 3.0).to(torch.bfloat16).to(DEV).t()  # [9, 48], stride (1, 9)
    tab = torch.randint(0, 48, (6, 100), generator=g, dtype=torch.int32).to(DEV).t()  # [100, 6] strided
    tok = torch.randint(0, 100, (18,), generator=g, dtype=torch.int32).to(DEV)[::2]
    _check_hash(logits, tok, tab, "sqrtsoftplus", 1.0, True)


def test_hash_route_bad_inputs() -> None:
    logits = torch.randn(2, 16).to(DEV)
    tab = torch.zeros(10, 4, dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match="token_ids"):
        _ROUTE.hash_route_triton(logits, torch.zeros(3, dtype=torch.int64, device=DEV), tab)
    with pytest.raises(ValueError, match="tid2eid"):
        _ROUTE.hash_route_triton(logits, torch.zeros(2, dtype=torch.int64, device=DEV), tab.float())
    with pytest.raises(ValueError, match="scoring"):
        _ROUTE.hash_route_triton(logits, torch.zeros(2, dtype=torch.int64, device=DEV), tab, "relu")


# ------------------------------------------------------------------------------------------------------ API


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Spy on the three launchers; on CPU let the dispatch gate accept CPU tensors (kernels interpreted)."""
    seen: list[str] = []
    spied = (
        (_FP4, "fp4_group_quant_triton"),
        (_HAD, "hadamard_triton"),
        (_HAD, "hadamard_fp4_triton"),
        (_ROUTE, "hash_route_triton"),
    )
    for mod, fn_name in spied:
        real = getattr(mod, fn_name)

        def spy(*args, _real=real, _name=fn_name, **kwargs):  # noqa: ANN002, ANN003, ANN202
            seen.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(mod, fn_name, spy)
    if not _CUDA:
        monkeypatch.setattr(_dispatch, "triton_ok", lambda x: True)
    monkeypatch.delenv("DEEPINFER_TILE_KERNELS_BACKEND", raising=False)
    return seen


def test_api_calls_new_kernels(calls: list[str]) -> None:
    x = (torch.randn(4, 2, 128, generator=_gen(11)) * 2.0).to(torch.bfloat16).to(DEV)
    _same(tk.hadamard_transform(x), ref.hadamard_transform(x))
    _same(tk.fp4_quant_dequant_ue8m0(x, 32), ref.fp4_quant_dequant_ue8m0(x, 32))
    codes, e = tk.fp4_quant_ue8m0(x, 32)
    c_ref, e_ref = ref.fp4_quant_ue8m0(x, 32)
    assert torch.equal(codes, c_ref) and torch.equal(e, e_ref)
    logits = torch.randn(6, 32, generator=_gen(12)).to(DEV)
    tab = torch.randint(0, 32, (50, 4), generator=_gen(13)).to(DEV)
    tok = torch.randint(0, 50, (6,), generator=_gen(14)).to(DEV)
    w, ids = tk.hash_route(logits, tok, tab, "sqrtsoftplus", 1.5)
    assert torch.equal(ids, hash_route(logits, tok, tab)[1])
    _same(tk.hadamard_fp4_quant_dequant(x), hadamard_fp4_quant_dequant(x))
    want = ["hadamard_triton", "fp4_group_quant_triton", "fp4_group_quant_triton", "hash_route_triton"]
    assert calls == [*want, "hadamard_fp4_triton"]
    calls.clear()
    tk.hadamard_transform(torch.randn(2, 2048).to(DEV))  # n > 1024: reference
    tk.fp4_quant_dequant_ue8m0(torch.randn(2, 96).to(DEV), 48)  # block not a power of two: reference
    tk.hash_route(logits, tok.float(), tab)  # float token ids: reference
    tk.hadamard_fp4_quant_dequant(torch.randn(2, 2048).to(DEV))  # n > 1024: reference
    assert calls == []


# ------------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 4096])
def test_gpu_v4_flash_shapes(t: int) -> None:
    """Indexer q [t, 64, 128] bf16 (bf16 subnormals included): Hadamard (both impls) then FP4; hash routing
    [t, 256] with a [129280, 6] table in every scoring."""
    x = _fp4_inputs(t * 64, 128, 32, seed=t, dtype=torch.float32, subnormal=True).to(torch.bfloat16).view(t, 64, 128)
    h = _HAD.hadamard_triton(x)
    _same(h, ref.hadamard_transform(x))
    xd = (torch.randn(t, 64, 128, generator=_gen(t + 2)) * 3.0).to(torch.bfloat16).to(DEV)  # no overflow
    hd, want = _HAD.hadamard_triton(xd, impl="dot"), ref.hadamard_transform(xd)
    err = (hd.float() - want.float()).abs()
    bound = _dot_bound(xd, want, 128**-0.5)
    assert (err <= bound).all(), f"dot: max err {err.max():.3g}, {(err > bound).sum()} over the bound"
    codes, e = _FP4.fp4_group_quant_triton(h, 32, "codes")
    c_ref, e_ref = ref.fp4_quant_ue8m0(h, 32)
    assert torch.equal(codes, c_ref), f"{(codes != c_ref).sum()} codes differ, first {(codes != c_ref).nonzero()[0]}"
    assert torch.equal(e, e_ref)
    _same(_FP4.fp4_group_quant_triton(h, 32, "dequant")[0], ref.fp4_quant_dequant_ue8m0(h, 32))
    _same(_HAD.hadamard_fp4_triton(x), hadamard_fp4_quant_dequant(x))
    g = _gen(t + 1)
    logits = (torch.randn(t, 256, generator=g) * 3.0).to(DEV)
    tab = torch.randint(0, 256, (129280, 6), generator=g).to(DEV)
    tok = torch.randint(0, 129280, (t,), generator=g).to(DEV)
    for scoring in ("sqrtsoftplus", "sigmoid", "softmax"):
        _check_hash(logits, tok, tab, scoring, 1.5, True)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_api_and_cuda_graph(calls: list[str]) -> None:
    """The real gate sends CUDA tensors to the three kernels; captured in one CUDA graph, refilled, replayed,
    they equal eager API calls (no host sync)."""
    test_api_calls_new_kernels(calls)
    x = torch.randn(64, 4, 128, device=DEV, dtype=torch.bfloat16)
    logits = torch.randn(64, 256, device=DEV)
    tab = torch.randint(0, 256, (1000, 6), device=DEV)
    tok = torch.randint(0, 1000, (64,), device=DEV)

    def step() -> tuple:
        return (
            tk.fp4_quant_dequant_ue8m0(tk.hadamard_transform(x), 32),
            tk.hadamard_fp4_quant_dequant(x),
            *tk.fp4_quant_ue8m0(x, 32),
            *tk.hash_route(logits, tok, tab, "sqrtsoftplus", 1.5),
        )

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    x.copy_(torch.randn_like(x))
    logits.copy_(torch.randn_like(logits))
    tok.copy_(torch.randint(0, 1000, (64,), device=DEV))
    graph.replay()
    torch.cuda.synchronize()
    captured = [o.clone() for o in outs]
    for got, want in zip(captured, step(), strict=True):
        assert torch.equal(got, want), f"replay differs: max {(got.float() - want.float()).abs().max()}"


def _fp4_paths_and_configs(dtype: torch.dtype, fp4_cfgs: tuple, had_cfgs: tuple) -> None:
    """The FP4 kernels bit for bit incl. -0.0: the contiguous kernel with and without a tail (EVEN), the strided
    kernel, every benchmark config (tile / warps) of FP4 and of the fused Hadamard + FP4, and a block of negatives
    that round to zero (the round-1 GPU kernel gave +0.0 there: its float negate compiled to 0 - x)."""
    x = _fp4_inputs(37, 3 * 32, 32, seed=41, dtype=dtype, subnormal=dtype == torch.float32)  # 111 groups: a tail
    x[1] = -(torch.rand(96, generator=_gen(42)) * 0.2 + 0.01).to(dtype).to(DEV)
    x[1, 0] = -6.0 * 64  # block scale 64: the rest of this block (|x| < 0.21) rounds to -0.0
    even = torch.cat([x, x]).reshape(-1)[:4096].reshape(32, 128)  # 128 groups: no tail at any config
    for xx in (x, x[:, :64], even):  # tail, strided, even
        c_ref, e_ref = ref.fp4_quant_ue8m0(xx, 32)
        want = ref.fp4_quant_dequant_ue8m0(xx, 32)
        for te, w in fp4_cfgs:
            codes, e = _FP4.fp4_group_quant_triton(xx, 32, "codes", tile_elems=te, num_warps=w)
            bad = (codes != c_ref).nonzero()
            assert torch.equal(codes, c_ref), f"tile {te}: {len(bad)} codes differ, first {bad[:1].tolist()}"
            assert torch.equal(e, e_ref), f"tile {te}: exponents differ at {(e != e_ref).nonzero()[:4].tolist()}"
            _same(_FP4.fp4_group_quant_triton(xx, 32, "dequant", tile_elems=te, num_warps=w)[0], want)
    h = _fp4_inputs(40 * 4, 128, 32, seed=43, dtype=torch.float32, subnormal=False).to(dtype).view(40, 4, 128)
    want = hadamard_fp4_quant_dequant(h)
    for te, w in had_cfgs:
        _same(_HAD.hadamard_fp4_triton(h, tile_elems=te, num_warps=w), want)
    _same(_HAD.hadamard_fp4_triton(h[:, 1:3]), hadamard_fp4_quant_dequant(h[:, 1:3]))  # strided rows


def test_fp4_paths_and_configs() -> None:
    """The GPU test's checks under the interpreter (fp32: bf16 subnormals convert wrongly there; two configs each
    to stay cheap)."""
    _fp4_paths_and_configs(torch.float32, ((None, None), (1024, 1)), ((None, None), (2048, 4)))


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_gpu_fp4_paths_and_configs(dtype: torch.dtype) -> None:
    """`_fp4_paths_and_configs` on the GPU in every input dtype."""
    fp4_cfgs = ((None, None), (8192, 8), (2048, 4), (1024, 1))
    _fp4_paths_and_configs(dtype, fp4_cfgs, ((None, None), (2048, 8), (2048, 4), (8192, 8)))
