"""The Triton `moe_permute` / `moe_unpermute` kernels (`backends/cuda/triton_moe.py`) against the reference.

On a CPU-only machine the kernels run under the Triton interpreter (TRITON_INTERPRET=1, set before the kernel
module is imported); with CUDA they run compiled. The permutation is a row copy and integer bookkeeping, so every
field must equal the brute-force oracle of `test_moe_permute.py` exactly (any dtype, any block). The un-permute
adds fp32 products in slot order with fp fusion off, exactly as the reference: equal bit for bit in fp32, and in
bf16 on the GPU; the interpreter truncates fp32 -> bf16 casts, so there a bf16 result is held to 1 bf16 ulp of the
reference (the fp32 results of the same call are exact).
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the @triton.jit in the kernel module
pytest.importorskip("triton")

from test_moe_permute import _oracle, _routing, _unpermute_oracle  # noqa: E402

from deepinfer.tile_kernels.ref import moe as ref_moe  # noqa: E402

_MOD = "deepinfer.tile_kernels.backends.cuda.triton_moe"
if not _CUDA and _MOD in sys.modules:  # imported earlier without the interpreter: re-decorate the kernels
    importlib.reload(sys.modules[_MOD])
_K = importlib.import_module(_MOD)
DEV = "cuda" if _CUDA else "cpu"
FIELDS = ("x", "expert_counts", "expert_offsets", "row_expert", "src_map")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """1-byte floats (FP8 codes) as uint8: torch.equal compares their bits."""
    return t.view(torch.uint8) if t.is_floating_point() and t.element_size() == 1 else t


def _assert_fields_equal(got: tuple, want: dict[str, torch.Tensor] | tuple) -> None:
    for i, name in enumerate(FIELDS):
        g = _bits(got[i].cpu())
        w = _bits((want[name] if isinstance(want, dict) else want[i]).cpu())
        assert g.dtype == w.dtype and g.shape == w.shape, f"{name}: {g.dtype} {tuple(g.shape)} vs {w.dtype} {w.shape}"
        assert torch.equal(g, w), name


@pytest.mark.parametrize("block", [None, 1, 16])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_permute_matches_oracle(block: int | None, idx_dtype: torch.dtype) -> None:
    """More slots than one histogram block (t * k = 222 > 128), an all-masked token, an expert with no rows."""
    t, k, e, h = 37, 6, 16, 24
    x = torch.randn(t, h, generator=_gen(1)).bfloat16()
    idx = _routing(t, k, e, seed=2, dtype=idx_dtype)
    idx[5] = -1
    idx[idx == 3] = 7
    got = _K.moe_permute_triton(x.to(DEV), idx.to(DEV), e, block)
    _assert_fields_equal(got, _oracle(x, idx, e, block))


@pytest.mark.parametrize("block", [None, 128])
def test_permute_many_experts_and_blocks(block: int | None) -> None:
    """E = 300 > HIST_BLOCK_E (several histogram steps), 3 histogram blocks, padding to 128; fp32 rows."""
    t, k, e, h = 50, 6, 300, 40
    x = torch.randn(t, h, generator=_gen(3))
    idx = _routing(t, k, e, seed=4, hole=0.1)
    got = _K.moe_permute_triton(x.to(DEV), idx.to(DEV), e, block)
    _assert_fields_equal(got, ref_moe.moe_permute(x, idx, e, block=block))


def test_permute_edge_shapes_and_dtypes() -> None:
    x = torch.randn(6, 4, generator=_gen(5))
    masked, none, one = torch.full((6, 3), -1), torch.zeros(0, 3, dtype=torch.int64), torch.zeros(6, 2).long()
    for block in (None, 16):
        _assert_fields_equal(_K.moe_permute_triton(x, masked, 5, block), _oracle(x, masked, 5, block))
        _assert_fields_equal(_K.moe_permute_triton(x[:0], none, 5, block), _oracle(x[:0], none, 5, block))
        _assert_fields_equal(_K.moe_permute_triton(x, one, 1, block), _oracle(x, one, 1, block))
    empty = _K.moe_permute_triton(x, torch.zeros(6, 0, dtype=torch.int32), 5)  # k = 0: no slots
    assert empty[0].shape == (0, 4) and empty[4].shape == (6, 0)
    # raw-bits copy: FP8 codes, int64 ids and a strided (column-sliced) x permute like the activations
    idx = _routing(6, 3, 4, seed=6)
    q = (x * 8).to(torch.float8_e4m3fn)
    _assert_fields_equal(_K.moe_permute_triton(q, idx, 4, 16), _oracle(q.view(torch.uint8), idx, 4, 16))
    ids = torch.arange(6)[:, None] * 1000 + torch.arange(3)
    _assert_fields_equal(_K.moe_permute_triton(ids, idx, 4, None), _oracle(ids, idx, 4, None))
    wide = torch.randn(6, 10, generator=_gen(7))
    _assert_fields_equal(_K.moe_permute_triton(wide[:, 3:7], idx, 4, 8), _oracle(wide[:, 3:7].contiguous(), idx, 4, 8))


def test_permute_bad_inputs() -> None:
    x = torch.randn(4, 8)
    idx = torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="x must be"):
        _K.moe_permute_triton(x[None], idx, 4)
    with pytest.raises(ValueError, match="topk_idx"):
        _K.moe_permute_triton(x, idx[:3], 4)
    with pytest.raises(TypeError, match="element size"):
        _K.moe_permute_triton(x.to(torch.complex128), idx, 4)


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_permute_rejects_out_of_range_ids(idx_dtype: torch.dtype) -> None:
    """The launcher checks the ids in the copy that reads P back (before the row kernel could write out of
    bounds): an id >= E or < -1 raises with the offending value; int64 ids beyond int32 do not wrap into range."""
    x = torch.randn(5, 8, generator=_gen(8)).to(DEV)
    for bad, shown in ((4, 4), (-2, -2), (9, 9)) + (((2**32 + 1, 2**32 + 1),) if idx_dtype == torch.int64 else ()):
        idx = _routing(5, 3, 4, seed=9, dtype=idx_dtype)
        idx[3, 1] = bad
        with pytest.raises(ValueError, match=rf"topk_idx values must be in \[-1, 3\].*got {shown}$"):
            _K.moe_permute_triton(x, idx.to(DEV), 4, 16)


class _HostReads:
    """Counts the device -> host reads a call makes (Tensor.item / tolist / bool / int / float), the calls that
    are a host sync on CUDA; on CPU the counts show what the same code would do on a GPU."""

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in self.NAMES:
            real = getattr(torch.Tensor, name)

            def spy(t, *a, _real=real, _name=name):  # noqa: ANN001, ANN002, ANN202
                self.calls.append(_name)
                return _real(t, *a)

            monkeypatch.setattr(torch.Tensor, name, spy)


def _open_triton_gates(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU, let the API take the Triton path (the kernels run in the interpreter)."""
    from deepinfer.tile_kernels import _dispatch
    from deepinfer.tile_kernels import api as tk_api

    if not _CUDA:
        monkeypatch.setattr(tk_api, "_triton_ok", lambda x: True)
        monkeypatch.setattr(_dispatch, "triton_ok", lambda x: True)
    monkeypatch.delenv("DEEPINFER_TILE_KERNELS_BACKEND", raising=False)


def test_api_host_syncs(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the Triton path tk.moe_permute reads the device once (P with the ids' min / max) and tk.moe_unpermute
    never (CUDA-graph safe; src_map unchecked there); the reference path still range-checks src_map."""
    import deepinfer.tile_kernels as tk

    _open_triton_gates(monkeypatch)
    t, k, e, h = 19, 6, 8, 16
    x = torch.randn(t, h, generator=_gen(60)).bfloat16().to(DEV)
    idx = _routing(t, k, e, seed=61, dtype=torch.int32).to(DEV)
    w = torch.rand(t, k, generator=_gen(62)).to(DEV)
    want = ref_moe.moe_permute(x, idx, e, block=4)
    reads = _HostReads(monkeypatch)
    got = tk.moe_permute(x, idx, e, block=4)
    assert reads.calls == ["tolist"], reads.calls
    reads.calls.clear()
    out = tk.moe_unpermute(got.x, got.src_map, w, out_dtype=torch.float32)
    assert reads.calls == [], reads.calls
    monkeypatch.undo()
    _assert_fields_equal(got, want)
    assert torch.equal(out, ref_moe.moe_unpermute(want.x, want.src_map, w, out_dtype=torch.float32))
    with pytest.raises(ValueError, match="topk_idx values must be in"):
        _open_triton_gates(monkeypatch)
        tk.moe_permute(x, torch.full_like(idx, e), e)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="src_map values must be in"):  # fp64 y: the reference path
        tk.moe_unpermute(got.x.double(), got.src_map + want.x.shape[0], w)


@pytest.mark.parametrize("map_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unpermute_matches_slot_order_oracle(map_dtype: torch.dtype, dtype: torch.dtype) -> None:
    """NaN in padding rows and masked weights (never read), an all-masked token (exact zeros)."""
    t, k, e, h = 29, 6, 12, 40
    idx = _routing(t, k, e, seed=12)
    idx[3] = -1
    res = ref_moe.moe_permute(torch.randn(t, h, generator=_gen(11)), idx, e, block=16)
    y = (torch.randn(res.x.shape, generator=_gen(13)) * 4).to(dtype)
    y[res.row_expert < 0] = float("nan")
    w = torch.rand(t, k, generator=_gen(14))
    w[idx < 0] = float("nan")
    src = res.src_map.to(map_dtype)
    want = _unpermute_oracle(y, res.src_map, w)
    out32 = _K.moe_unpermute_triton(y.to(DEV), src.to(DEV), w.to(DEV), torch.float32).cpu()
    assert out32.dtype == torch.float32 and torch.equal(out32, want)
    out = _K.moe_unpermute_triton(y.to(DEV), src.to(DEV), w.to(DEV)).cpu()
    assert out.dtype == dtype and out.shape == (t, h) and bool((out[3] == 0).all())
    if _CUDA or dtype == torch.float32:
        assert torch.equal(out, want.to(dtype))
    else:  # the interpreter truncates the final fp32 -> bf16 cast: within one bf16 ulp
        ulp = 2.0 ** (torch.frexp(want.abs().clamp_min(1e-30))[1].float() - 8)
        assert bool(((out.float() - want).abs() <= ulp).all())


def test_unpermute_strided_and_edge_shapes() -> None:
    y = torch.randn(8, 20, generator=_gen(15))
    src = torch.tensor([[0, 5], [7, -1], [-1, -1]], dtype=torch.int32)
    w = torch.rand(3, 2, generator=_gen(16))
    got = _K.moe_unpermute_triton(y[:, 4:12], src.t().contiguous().t(), w)  # strided y and src_map
    assert torch.equal(got, _unpermute_oracle(y[:, 4:12], src, w))
    assert _K.moe_unpermute_triton(y, src[:0], w[:0]).shape == (0, 20)
    assert bool((_K.moe_unpermute_triton(y, src[:, :0], w[:, :0]) == 0).all())
    with pytest.raises(TypeError, match="out_dtype"):
        _K.moe_unpermute_triton(y, src, w, torch.float64)
    big = torch.zeros(3, _K.MAX_UNPERMUTE_K + 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="k must be <="):
        _K.moe_unpermute_triton(y, big, big.float())
    with pytest.raises(ValueError, match="topk_weights"):
        _K.moe_unpermute_triton(y, src, w[:, :1])


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("block", [None, 128])
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_gpu_v4_flash_shapes(t: int, block: int | None) -> None:
    """V4-Flash: 256 experts, top-6, hidden 4096 bf16; equal to the reference on the GPU, field by field, twice
    (deterministic), and the un-permute bit-exact in bf16 and fp32."""
    import deepinfer.tile_kernels as tk

    e, k, h = 256, 6, 4096
    x = torch.randn(t, h, generator=_gen(t)).bfloat16().cuda()
    idx = _routing(t, k, e, seed=t + 1, hole=0.05, dtype=torch.int32).cuda()
    want = ref_moe.moe_permute(x, idx, e, block=block)
    for _ in range(2):
        got = tk.moe_permute(x, idx, e, block=block)
        for name in FIELDS:
            g, w = getattr(got, name), getattr(want, name)
            assert g.shape == w.shape and torch.equal(g, w), f"{name} differs (t={t}, block={block})"
    y = (torch.randn(want.x.shape, generator=_gen(t + 2)) * 2).bfloat16().cuda()
    w = torch.rand(t, k, generator=_gen(t + 3)).cuda()
    for odt in (None, torch.float32):
        got_u = tk.moe_unpermute(y, want.src_map, w, out_dtype=odt)
        want_u = ref_moe.moe_unpermute(y, want.src_map, w, out_dtype=odt)
        diff = (got_u.float() - want_u.float()).abs().max().item()
        assert torch.equal(got_u, want_u), f"unpermute out_dtype={odt}: max abs diff {diff}"


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_unpermute_cuda_graph_replay() -> None:
    """The un-permute launcher and tk.moe_unpermute have no host sync: capture, change y in place, replay, compare."""
    t, k, e, h = 64, 6, 256, 4096
    idx = _routing(t, k, e, seed=40, dtype=torch.int32).cuda()
    res = ref_moe.moe_permute(torch.randn(t, h, generator=_gen(41)).bfloat16().cuda(), idx, e)
    y = res.x.clone()
    w = torch.rand(t, k, generator=_gen(42)).cuda()
    _K.moe_unpermute_triton(y, res.src_map, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = _K.moe_unpermute_triton(y, res.src_map, w)
    import deepinfer.tile_kernels as tk

    api_graph = torch.cuda.CUDAGraph()  # the API too: no range check (host sync) on this path
    with torch.cuda.graph(api_graph):
        got_api = tk.moe_unpermute(y, res.src_map, w)
    y.copy_(torch.randn(y.shape, generator=_gen(43)).bfloat16())
    graph.replay()
    api_graph.replay()
    torch.cuda.synchronize()
    want = ref_moe.moe_unpermute(y, res.src_map, w)
    assert torch.equal(got, want), f"max abs diff {(got.float() - want.float()).abs().max().item()}"
    assert torch.equal(got_api, want), f"API: max abs diff {(got_api.float() - want.float()).abs().max().item()}"


def test_api_dispatches_to_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """tk.moe_permute / tk.moe_unpermute launch these kernels (on CPU: the CUDA-only gates patched open) and return
    the reference's results; an x that needs a gradient keeps the reference."""
    import deepinfer.tile_kernels as tk
    from deepinfer.tile_kernels import _dispatch
    from deepinfer.tile_kernels import api as tk_api

    seen: list[str] = []
    for name in ("moe_permute_triton", "moe_unpermute_triton"):
        real = getattr(_K, name)

        def spy(*args, _real=real, _name=name, **kwargs):  # noqa: ANN002, ANN003, ANN202
            seen.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(_K, name, spy)
    if not _CUDA:
        monkeypatch.setattr(tk_api, "_triton_ok", lambda x: True)
        monkeypatch.setattr(_dispatch, "triton_ok", lambda x: True)
    monkeypatch.delenv("DEEPINFER_TILE_KERNELS_BACKEND", raising=False)
    t, k, e, h = 21, 4, 8, 16
    x = torch.randn(t, h, generator=_gen(50)).bfloat16().to(DEV)
    idx = _routing(t, k, e, seed=51, dtype=torch.int32).to(DEV)
    got = tk.moe_permute(x, idx, e, block=8)
    _assert_fields_equal(got, ref_moe.moe_permute(x, idx, e, block=8))
    w = torch.rand(t, k, generator=_gen(52)).to(DEV)
    out = tk.moe_unpermute(got.x, got.src_map, w, out_dtype=torch.float32)
    assert torch.equal(out, ref_moe.moe_unpermute(got.x, got.src_map, w, out_dtype=torch.float32))
    assert seen == ["moe_permute_triton", "moe_unpermute_triton"]
    xg = x.float().requires_grad_()
    tk.moe_permute(xg, idx, e).x.sum().backward()  # the reference: differentiable
    assert seen == ["moe_permute_triton", "moe_unpermute_triton"] and xg.grad is not None
