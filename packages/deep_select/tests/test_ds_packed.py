"""Packed FP8 / FP4 indexer inputs (`_packed.py`): dequantised on entry, then the dense path.

The decoders are checked bit for bit against hand-built vectors (every e2m1 code, UE8M0 edge exponents, e4m3
bit patterns); the ops must give exactly what they give for the dequantised tensor (same dense input, same
path), on the reference, on the Triton kernels (interpreter on CPU) and, marked `gpu`, on the H200.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from test_ds_indexer import _paged_layout  # noqa: E402

from deepinfer.deep_select import api  # noqa: E402
from deepinfer.deep_select._packed import dequant_e2m1, dequant_e8m0, dequant_packed  # noqa: E402

gpu = pytest.mark.gpu
E8M0 = torch.float8_e8m0fnu


def _bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns (so -0.0 != +0.0 and NaN == NaN in torch.equal)."""
    return x.float().contiguous().view(torch.int32)


# ---- decoders against hand-built vectors ----


def test_e2m1_every_code_low_nibble_first() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    packed = codes[0::2] | (codes[1::2] << 4)  # element 2i in the low nibble
    want = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)
    assert torch.equal(_bits(dequant_e2m1(packed)), _bits(want))
    # one byte, both nibbles: 0x7A = hi 7 (6.0), lo 10 (-1.0)
    assert dequant_e2m1(torch.tensor([[0x7A]], dtype=torch.uint8)).tolist() == [[-1.0, 6.0]]


@pytest.mark.parametrize("as_dtype", [torch.uint8, E8M0])
def test_e8m0_edges(as_dtype: torch.dtype) -> None:
    e = torch.tensor([0, 1, 100, 126, 127, 128, 254, 255], dtype=torch.uint8)
    got = dequant_e8m0(e.view(as_dtype))
    want = [2.0**-127, 2.0**-126, 2.0**-27, 0.5, 1.0, 2.0, 2.0**127]
    assert got.dtype == torch.float32 and got[:-1].tolist() == want and bool(got[-1].isnan())


def test_fp8_e4m3_hand_vector_ue8m0_and_fp32_scales() -> None:
    # e4m3 bits: 0x38 = 1.0, 0x40 = 2.0, 0x7E = 448 (max), 0x01 = 2 ** -9 (min subnormal), 0xB8 = -1.0, 0x3C = 1.5
    bits = torch.tensor([[0x38, 0x40, 0x7E, 0x01], [0xB8, 0x3C, 0x38, 0x38]], dtype=torch.uint8)
    vals = bits.view(torch.float8_e4m3fn)
    ue = torch.tensor([[130, 124], [127, 1]], dtype=torch.uint8)  # x8, /8 | x1, x2 ** -126; block 2
    got = dequant_packed("q", (vals, ue))
    want = torch.tensor([[8.0, 16.0, 56.0, 2.0**-12], [-1.0, 1.5, 2.0**-126, 2.0**-126]])
    assert got.dtype == torch.bfloat16 and torch.equal(_bits(got), _bits(want))
    s32 = torch.tensor([[0.1], [3.0]])  # one fp32 scale per row (block 4): fp32 result, one rounding
    got32 = dequant_packed("q", (vals, s32))
    assert got32.dtype == torch.float32
    assert torch.equal(_bits(got32), _bits(vals.float() * torch.tensor([[0.1], [3.0]])))


# ---- ops: packed == dequantised ----


def _fp8(shape: tuple[int, ...], block: int, ue8m0: bool, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    vals = (torch.randn(shape, generator=g) * 4).to(torch.float8_e4m3fn)
    groups = (*shape[:-1], shape[-1] // block)
    if ue8m0:
        return vals, torch.randint(122, 132, groups, generator=g, dtype=torch.uint8).view(E8M0)
    return vals, torch.rand(groups, generator=g) + 0.05


def _fp4(shape: tuple[int, ...], g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    vals = torch.randint(0, 256, (*shape[:-1], shape[-1] // 2), generator=g, dtype=torch.uint8)
    return vals, torch.randint(124, 131, (*shape[:-1], shape[-1] // 32), generator=g, dtype=torch.uint8)


def _inputs(kind: str, t: int, h: int, n: int, d: int, g: torch.Generator) -> tuple:
    """(packed q, weights, packed keys [n, d]) of one format: fp8 (fp32 scales, block d), fp8_ue (UE8M0, 32),
    fp4."""
    if kind == "fp4":
        q, keys = _fp4((t, h, d), g), _fp4((n, d), g)
    else:
        q, keys = _fp8((t, h, d), d if kind == "fp8" else 32, kind == "fp8_ue", g), _fp8((n, d), 32, True, g)
    return q, torch.rand(t, h, generator=g), keys


def _dense(x: tuple) -> torch.Tensor:
    return dequant_packed("x", x)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(torch.sort(a.cpu(), dim=1).values, torch.sort(b.cpu(), dim=1).values)


@pytest.mark.parametrize("kind", ["fp8", "fp8_ue", "fp4"])
def test_scores_and_topk_packed_equal_dequantised(kind: str) -> None:
    g = torch.Generator().manual_seed(40)
    t, h, n, d, k = 6, 8, 200, 64, 32
    q, w, keys = _inputs(kind, t, h, n, d, g)
    qd, kd = _dense(q), _dense(keys)
    assert qd.dtype == (torch.float32 if kind == "fp8" else torch.bfloat16)
    assert torch.equal(api.indexer_scores(q, w, keys), api.indexer_scores(qd, w, kd))
    visible = torch.tensor([200, 0, 31, 32, 150, 199], dtype=torch.int32)
    for q_in, k_in in ((q, keys), (q, kd), (qd, keys)):
        got = api.indexer_topk(q_in, w, k_in, k, visible=visible)
        assert torch.equal(got, api.indexer_topk(qd, w, kd, k, visible=visible))


@pytest.mark.parametrize("flat_cache", [False, True])
def test_indexer_topk_paged_packed_cache(flat_cache: bool) -> None:
    g = torch.Generator().manual_seed(41 + flat_cache)
    h, d, rpb, k, num_blocks = 4, 64, 16, 24, 12
    table, _ = _paged_layout([70, 5, 33], rpb, num_blocks, g)
    cache = _fp4((num_blocks, rpb, d), g)
    if flat_cache:
        cache = (cache[0].view(-1, d // 2), cache[1].view(-1, d // 32))
    q, w, _ = _inputs("fp8", 5, h, 1, d, g)
    seq_rows = torch.tensor([0, 0, 1, 2, 2], dtype=torch.int32)
    visible = torch.tensor([70, 3, 5, 33, 0], dtype=torch.int32)
    kw = dict(visible=visible, seq_rows=seq_rows, block_table=table, rows_per_block=rpb if flat_cache else None)
    got = api.indexer_topk(q, w, cache, k, **kw)
    assert torch.equal(got, api.indexer_topk(_dense(q), w, _dense(cache), k, **kw))


def test_triton_paths_packed_equal_dequantised(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel paths (Triton in the interpreter here): selection after reference scores, and fused=True."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("DEEPINFER_DEEP_SELECT_BACKEND", "triton")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(43)
    q, w, keys = _inputs("fp4", 3, 16, 64, 32, g)
    visible = torch.tensor([64, 10, 0], dtype=torch.int32, device=dev)
    q, keys = tuple(x.to(dev) for x in q), tuple(x.to(dev) for x in keys)
    w = w.to(dev)
    for fused in (False, True):
        got = api.indexer_topk(q, w, keys, 20, visible=visible, fused=fused)
        want = api.indexer_topk(_dense(q), w, _dense(keys), 20, visible=visible, fused=fused)
        assert _same(got, want), f"fused={fused}"


# ---- bad packed inputs: clear errors ----

_W, _V = torch.rand(3, 2), torch.tensor([1, 2, 3], dtype=torch.int32)
_K = torch.randn(10, 64)
_Q8 = torch.randn(3, 2, 64).to(torch.float8_e4m3fn)
_Q4 = torch.randint(0, 256, (3, 2, 32), dtype=torch.uint8)
_S = torch.ones(3, 2, 2, dtype=torch.uint8) * 127


@pytest.mark.parametrize(
    ("q", "exc", "match"),
    [
        ((_Q8, _S, _S), TypeError, "q: a packed input must be a \\(values, scales\\) pair"),
        ((_Q8, 1.0), TypeError, "pair of tensors"),
        ((_Q8.half(), _S), TypeError, "float8_e4m3fn .* or uint8"),
        ((_Q8, _S.int()), TypeError, "scales must be float32, uint8"),
        ((_Q4, torch.ones(3, 2, 2)), TypeError, "FP4 .* scales must be UE8M0"),
        ((_Q4, torch.ones(3, 2, 4, dtype=torch.uint8)), ValueError, "must be d / 32 = 2, got 4"),
        ((_Q8, torch.ones(3, 2, 3)), ValueError, "a divisor of d = 64, got 3"),
        ((_Q8, torch.ones(3, 1, 2)), ValueError, "leading dims \\(3, 2\\)"),
        ((_Q8, torch.ones(3, 2, 2, device="meta")), ValueError, "one device"),
    ],
)
def test_packed_rejects_bad_tuples(q: tuple, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        api.indexer_topk(q, _W, _K, 4, visible=_V)
    with pytest.raises(exc, match=match):
        api.indexer_scores(q, _W, _K)


def test_packed_keys_error_names_the_argument() -> None:
    with pytest.raises(ValueError, match="k_cache: scales"):
        api.indexer_topk(_Q8.float(), _W, (_Q8[0], torch.ones(3, 3)), 4, visible=_V)
    with pytest.raises(ValueError, match="k must have last dim 64"):  # FP4 keys of d = 32 against q's d = 64
        api.indexer_scores(_Q8.float(), _W, (_Q4[0, :, :16], torch.ones(2, 1, dtype=torch.uint8)))


# ---- GPU: V4's shape, packed on the device ----


def _to(x: tuple, dev: str) -> tuple:
    """Move a packed pair; 1-byte dtypes travel as uint8 bytes (no reliance on float8 copy kernels)."""
    return tuple(t.view(torch.uint8).to(dev).view(t.dtype) if t.element_size() == 1 else t.to(dev) for t in x)


@gpu
@pytest.mark.parametrize("kind", ["fp8", "fp8_ue", "fp4"])
def test_gpu_dequant_matches_cpu_bitwise(kind: str) -> None:
    g = torch.Generator().manual_seed(50)
    q, _, keys = _inputs(kind, 64, 64, 4096, 128, g)
    for x in (q, keys):
        got, want = _dense(_to(x, "cuda")).cpu(), _dense(x)
        bad = int((_bits(got) != _bits(want)).sum())
        assert bad == 0, f"{kind}: {bad} of {want.numel()} dequantised values differ between CUDA and CPU"


@gpu
@pytest.mark.parametrize(
    ("kind", "fused"), [("fp8", False), ("fp8_ue", False), ("fp4", False), ("fp8_ue", True), ("fp4", True)]
)
def test_gpu_indexer_topk_packed_v4_paged(kind: str, fused: bool) -> None:
    """Packed q and key cache through the API (reference scores + CUDA selection; fused: the Triton kernel on the
    bf16 the UE8M0 formats dequantise to) equal the API on the dequantised tensors."""
    _check_gpu_packed(kind, fused)


@gpu
def test_gpu_fused_fp32_q_from_fp8_fp32_scales() -> None:
    """FP8 q with fp32 scales dequantises to fp32 q: the fused kernel's IEEE fp32 dot path at V4's 64 x 128 (no
    other GPU test runs that path at this size)."""
    _check_gpu_packed("fp8", True)


def _check_gpu_packed(kind: str, fused: bool) -> None:
    g = torch.Generator().manual_seed(51)
    h, d, rpb, k, n = 64, 128, 64, 512, 16384
    num_blocks = n // rpb + 4
    table = torch.randperm(num_blocks, generator=g)[: n // rpb].to(torch.int32)[None, :].cuda()
    q, w, _ = _inputs(kind, 32, h, 1, d, g)
    cache = _fp4((num_blocks, rpb, d), g) if kind == "fp4" else _fp8((num_blocks, rpb, d), 32, True, g)
    visible = torch.randint(0, n + 1, (32,), generator=g, dtype=torch.int32).cuda()
    q, cache, w = _to(q, "cuda"), _to(cache, "cuda"), w.cuda()
    kw = dict(visible=visible, block_table=table, fused=fused)
    got = api.indexer_topk(q, w, cache, k, **kw)
    want = api.indexer_topk(_dense(q), w, _dense(cache), k, **kw)
    diff = (torch.sort(got, 1).values != torch.sort(want, 1).values).any(1)
    assert not bool(diff.any()), f"{kind} fused={fused}: rows {diff.nonzero().flatten().tolist()[:8]} differ"


@gpu
@pytest.mark.parametrize("kind", ["fp8", "fp8_ue", "fp4"])
def test_gpu_dequant_captures_in_cuda_graph(kind: str) -> None:
    """The dequantisation reads no value on the host and copies nothing from it: a CUDA graph captures it."""
    g = torch.Generator().manual_seed(52)
    q = _to(_inputs(kind, 8, 64, 1, 128, g)[0], "cuda")
    want = _dense(q)  # eager run first (warm-up)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = _dense(q)
    graph.replay()
    torch.cuda.synchronize()
    bad = int((_bits(got) != _bits(want)).sum())
    assert bad == 0, f"{kind}: {bad} of {want.numel()} values differ between the graph replay and eager"
