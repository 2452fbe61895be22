"""The compiled sm_90a sparse attention kernel (`csrc/cuda/fm_sparse_decode.cu`, `backends/cuda/cuda_sparse_decode.py`).

CPU: the source compiles for sm_90a without spills (when nvcc is on PATH), the Python side falls back or raises
cleanly without `_C` / a GPU, and the dispatcher keeps its Triton routes when auto picks the "cuda" backend.
GPU: V4 shapes (64 heads x 512, 640 indices with holes, NaN in unused cache slots, NaN-poisoned outputs), BF16
and FP8 caches, split-KV plans from 1 to 10 splits, a two-wave grid, strided outputs, CUDA-graph replay;
tolerances as in `test_mla_split.py` (oracle bound + the bf16 rounding of P before P @ V).
"""

from __future__ import annotations

import importlib
import os
import pathlib
import shutil
import sys
import zlib

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the @triton.jit decorators run
pytest.importorskip("triton")

import mla_checks as mc  # noqa: E402
from mla_checks import dense_oracle, poison_unused, ragged_indices  # noqa: E402
from test_mla_split import _call, _check, _fp8, _inputs  # noqa: E402
from test_mla_triton import _assert_close_to, _holes, _v4_inputs, _weight_abs  # noqa: E402

from deepinfer.flash_mla import _dispatch, reference  # noqa: E402

_MOD = "deepinfer.flash_mla.backends.cuda.triton_split_attn"
if not _CUDA and _MOD in sys.modules:
    importlib.reload(sys.modules[_MOD])
_K = importlib.import_module(_MOD)
_CU = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_sparse_decode")
_SRC = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda"
SCALE = 512**-0.5
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
needs_c = pytest.mark.skipif(not _CU.available(), reason="deepinfer.flash_mla._C not built (test_extension_built_gpu)")


@pytest.fixture
def probed() -> None:
    """Skip the in-process kernel tests when the out-of-process probe failed (test_probe_gpu reports it): a kernel
    that faults would otherwise poison this process's CUDA context for every later GPU test."""
    ok, out = _CU.probe()
    if not ok:
        pytest.skip(f"CUDA kernel probe failed (see test_probe_gpu): {out[-300:]}")


# ------------------------------------------------------------------------------------------------------ CPU


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_source_compiles_for_sm90a_without_spills(tmp_path: pathlib.Path) -> None:
    """The three template instances (BF16 cache, FP8 cache, FP8 cache through the session-9 fp8v path) and the PDL
    combine kernel assemble for sm_90a with no stack frame and no spills."""
    out, props, regs = mc.nvcc_sm90a(_SRC / "fm_sparse_decode.cu", tmp_path / "fm.o")
    assert len(props) == 4 and len(regs) == 4, out[-2000:]
    assert all(p == ("0", "0", "0") for p in props), props
    assert all(r <= 255 for r in regs), regs
    assert "serialized" not in out, "ptxas serialised the wgmma instructions"


def test_supports_reasons_and_clean_errors() -> None:
    """Without _C or a GPU (or with shapes the kernel does not take) `supports` names the reason; kernel="cuda"
    raises ValueError with it, never a crash."""
    q = torch.randn(2, 64, 512).bfloat16()
    kv = torch.randn(100, 512).bfloat16()
    why = _CU.supports(q, kv, None)
    assert why is not None and ("_C" in why or "CUDA" in why)
    idx = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="kernel='cuda'"):
        _K.sparse_attn_split_triton(q, kv, idx, None, SCALE, kernel="cuda")
    if _CU.available():  # a CPU build never has _C; a CUDA build on a GPU-less machine checks shapes
        assert "extra_kv" in _CU.supports(q, kv, _fp8(kv)) or "CUDA" in _CU.supports(q, kv, kv)


def test_supports_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    """With _C present the kernel takes bf16 q [t, any h, 512] over one cache format, with or without an extra cache
    of that format (the engine's call); mixed formats, fp32 q or d != 512 are refused with the reason."""
    monkeypatch.setattr(_CU, "available", lambda: True)
    kv = torch.randn(100, 512).bfloat16()
    fp8 = torch.zeros(100, 584, dtype=torch.uint8)
    for h in (4, 64, 96, 128):
        q = torch.randn(2, h, 512).bfloat16()
        for main, extra in ((kv, None), (kv, kv[:7]), (fp8, None), (fp8, fp8[:7])):
            assert "not a CUDA device" in _CU.supports(q, main, extra)  # every format check passed
    q = torch.randn(2, 64, 512).bfloat16()
    assert "extra_kv" in _CU.supports(q, kv, fp8) and "extra_kv" in _CU.supports(q, fp8, kv)
    assert "extra_kv" in _CU.supports(q, kv, kv.float())
    assert "q:" in _CU.supports(q.float(), kv, None) and "q:" in _CU.supports(q[..., :256], kv[:, :256], None)
    assert "kv:" in _CU.supports(q, kv.float(), None)


def test_cuda_plans() -> None:
    """Named split plans (shapes only): default keeps >= 2 tiles per split, fine >= 1, auto is fine only when every
    tile of every token gets its own CTA in one wave and a token has <= FINE_MAX_TILES tiles."""
    n = _CU.cuda_num_splits
    assert (n(4, 1, 10, 132), n(4, 1, 10, 132, "fine"), n(4, 1, 10, 132, "auto")) == (5, 10, 10)  # b = 2, s_q = 2
    assert (n(1, 1, 10, 132), n(1, 1, 10, 132, "fine"), n(1, 1, 10, 132, "auto")) == (5, 10, 10)  # b = 1
    assert (n(1, 1, 130, 132), n(1, 1, 130, 132, "auto"), n(1, 1, 130, 132, "fine")) == (65, 65, 130)  # HCA 1M
    assert (n(32, 1, 10, 132), n(32, 1, 10, 132, "auto"), n(32, 1, 10, 132, "fine")) == (4, 4, 4)  # b = 32
    assert (n(8, 1, 10, 132), n(8, 1, 10, 132, "auto")) == (5, 10)  # b = 4, s_q = 2: 80 CTAs of one tile
    assert n(14, 1, 10, 132, "auto") == n(14, 1, 10, 132) == 5  # 140 CTAs would not fit one wave: default
    assert n(4096, 1, 10, 132, "fine") == 1  # prefill: tokens fill the GPU
    with pytest.raises(ValueError, match="plan"):
        n(4, 1, 10, 132, "finest")


def test_split_triton_forwards_extra_and_options_to_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernel="cuda" (and the default) hands extra_kv / extra_indices and the plan / merge names to the CUDA kernel
    (checked with a recording stand-in: no GPU here)."""
    seen: list[dict] = []

    def fake(q, kv, idx, sink, scale, **kw):  # noqa: ANN001, ANN202
        seen.append(kw)
        return kw["out"], kw["lse_out"]

    monkeypatch.setattr(_CU, "supports", lambda q, kv, ex: None)
    monkeypatch.setattr(_CU, "sparse_attn_cuda", fake)
    q, kv, ex = torch.randn(2, 64, 512).bfloat16(), torch.randn(9, 512).bfloat16(), torch.randn(3, 512).bfloat16()
    i1, i2 = torch.zeros(2, 5, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32)
    _K.sparse_attn_split_triton(q, kv, i1, None, SCALE, extra_kv=ex, extra_indices=i2, cuda_merge="pdl")
    _K.sparse_attn_split_triton(q, kv, i1, None, SCALE, kernel="cuda", cuda_plan="fine", num_splits=3)
    assert seen[0]["extra_kv"] is ex and seen[0]["extra_indices"] is i2 and seen[0]["merge"] == "pdl"
    assert seen[1]["extra_kv"] is None and seen[1]["plan"] == "fine" and seen[1]["num_splits"] == 3


def test_kernel_for_names_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_dispatch.kernel_for`: "cuda" for the engine's call (bf16 q [t, 64, 512], bf16 pool + bf16 extra cache) once
    the CUDA kernel takes it; "fused" when it does not (no _C here; mixed formats; the tiny model's h = 4, d = 256);
    "reference" on the CPU backend."""
    q = torch.zeros(3, 64, 512, dtype=torch.bfloat16)
    pool, new = torch.zeros(50, 512, dtype=torch.bfloat16), torch.zeros(3, 512, dtype=torch.bfloat16)
    assert _dispatch.kernel_for(q, pool, new) == "reference"  # CPU tensors: the reference backend
    monkeypatch.setattr(_dispatch, "backend", lambda device: "cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert _dispatch.kernel_for(q, pool, new) == "fused"  # no _C here, or CPU tensors: not the CUDA kernel's
    monkeypatch.setattr(_CU, "available", lambda: True)
    monkeypatch.setattr(_CU, "supports", lambda q, kv, ex: None if q.shape[-1] == 512 else "d")
    assert _dispatch.kernel_for(q, pool, new) == "cuda"
    tiny = torch.zeros(3, 4, 256, dtype=torch.bfloat16)
    assert _dispatch.kernel_for(tiny, torch.zeros(50, 256, dtype=torch.bfloat16), None) == "fused"
    monkeypatch.setitem(_K.DEFAULT_KERNELS, "bf16", "fused")
    assert _dispatch.kernel_for(q, pool, new) == "fused"


def test_default_cuda_falls_back_to_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """DEFAULT_KERNELS naming "cuda" keeps working where the kernel cannot run (here: no _C / CPU): the fused
    Triton kernel runs instead, with the same results."""
    q, caches, lists, sink = _inputs(3, 16, 512, 40, 0, "random", 11)
    want = _call(q, caches, lists, sink, SCALE, (True,), config=(16, 16, 4, 1))
    monkeypatch.setitem(_K.DEFAULT_KERNELS, "fp8", "cuda")
    monkeypatch.setattr(_K, "default_split_config", lambda *a, **k: (16, 16, 4, 1))
    got = _call(q, caches, lists, sink, SCALE, (True,))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_route_keeps_triton_when_backend_is_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once _C is built, `backend()` auto-picks "cuda": the dispatcher must still run the Triton routes (the
    compiled kernel is chosen inside sparse_attn_split_triton), not the reference."""
    monkeypatch.setattr(_dispatch, "backend", lambda device: "cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.zeros(1, 64, 512, dtype=torch.bfloat16)
    assert _dispatch.route(q, torch.zeros(4, 512, dtype=torch.bfloat16), None) == "split"
    assert _dispatch.route(q.float(), torch.zeros(4, 512), None) == "legacy"


def test_cuda_in_kernel_names() -> None:
    assert "cuda" in _K.KERNELS


def test_self_check_logic_with_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's check passes a correct stand-in kernel (the reference) and reports a wrong one (heads mixed up,
    as a layout bug would) with the failing case."""

    memo: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}  # the reference is the slow part on CPU

    def good(q, kv, idx, sink, scale, *, out, lse_out, extra_kv=None, extra_indices=None, **kw):  # noqa: ANN001, ANN202
        key = (kv.dtype, extra_kv is None)
        if key not in memo:
            memo[key] = reference.sparse_attn(q, kv, idx, sink, scale, extra_kv, extra_indices)
        out.copy_(memo[key][0])
        lse_out.copy_(memo[key][1])

    def bad(q, kv, idx, sink, scale, *, out, lse_out, **kw):  # noqa: ANN001, ANN202
        good(q, kv, idx, sink, scale, out=out, lse_out=lse_out, **kw)
        out.copy_(out.roll(1, dims=1))

    monkeypatch.setattr(_CU, "sparse_attn_cuda", good)
    assert _CU.self_check(device="cpu") == ""
    monkeypatch.setattr(_CU, "sparse_attn_cuda", bad)
    why = _CU.self_check(device="cpu")
    assert "fp8=False splits=None extra=False" in why and "max |out - ref|" in why, why
    assert "extra=True merge=last_cta" in why, why


@pytest.mark.skipif(_CUDA, reason="checks the no-GPU answer")
def test_probe_without_gpu_fails_cleanly() -> None:
    ok, out = _CU._probe_cached(120.0)
    assert not ok and "PROBE FAIL" in out, out


# ------------------------------------------------------------------------------------------------------ GPU


@gpu
@pytest.mark.gpu
def test_extension_built_gpu() -> None:
    """The GPU install (DEEPINFER_DEVICE=cuda) built deepinfer.flash_mla._C with the sparse decode kernel."""
    from deepinfer.flash_mla import _backend

    assert _CU.available(), f"_C missing: {_backend._compiled_error()} / build_info {_backend.build_info()}"
    smem = _CU._module().smem_bytes(False), _CU._module().smem_bytes(True)
    assert max(smem) <= 227 * 1024, smem


@gpu
@needs_c
@pytest.mark.gpu
def test_probe_gpu() -> None:
    """The kernel on a small V4 case in a child process (BF16 / FP8, split / unsplit): no fault, no hang, close to
    the reference. Its output says what failed; the other CUDA-kernel tests skip when it fails."""
    ok, out = _CU.probe()
    print(out)
    assert ok, out


def _cuda_call(q, caches, lists, sink, fp8: bool, **kw):
    return _call(q, caches[:1], lists[:1], sink, SCALE, (fp8,), kernel="cuda", **kw)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("t", [1, 4, 64])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("sink_mode", ["random", "large", "none"])
def test_v4_shapes_cuda_gpu(t: int, fp8: bool, sink_mode: str) -> None:
    """640 indices in one list over a paged cache with NaN in unused slots, ragged holes (token 1 has none valid),
    auto split plan (t = 1 / 4: 5 splits of 2 tiles, t = 64: 2 splits), NaN-poisoned out / lse."""
    q, caches, lists, sink = _v4_inputs(False, sink_mode, zlib.crc32(f"cuda{t}{fp8}{sink_mode}".encode()))
    q, lists = q[:t], [i[:t] for i in lists]
    got = _cuda_call(q, caches, lists, sink, fp8)
    _check(got, q, caches, lists, sink, SCALE, (fp8,), gpu_p=True)
    if t > 1:  # token 1: no valid index -> zeros and lse = sink (-inf without one), exactly
        mc.assert_empty_token(got, sink)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("splits", [1, 3, 10])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("merge", ["triton", "pdl", "last_cta", "pdl_wide"])
def test_cuda_split_counts_gpu(splits: int, fp8: bool, merge: str) -> None:
    """Forced split counts: 1 (out / lse written by the kernel), 3 (uneven: 4 + 4 + 2 tiles), 10 (one tile each),
    under each merge of the partials (Triton combine, PDL combine kernel, last CTA)."""
    q, caches, lists, sink = _v4_inputs(False, "random", 301 + splits + 7 * fp8)
    q, lists = q[:8], [i[:8] for i in lists]
    got = _cuda_call(q, caches, lists, sink, fp8, num_splits=splits, cuda_merge=merge)
    _check(got, q, caches, lists, sink, SCALE, (fp8,), gpu_p=True)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_two_waves_vs_triton_gpu(fp8: bool) -> None:
    """b = 128 x s_q = 2 tokens (256 CTAs: two waves on 132 SMs), 640 random rows of a 16,384-row cache, ~3 %
    holes: against the reference within the oracle bound, and the fused Triton kernel within twice that."""
    g = torch.Generator().manual_seed(404 + fp8)
    t, n = 256, 16384
    q = torch.randn(t, 64, 512, generator=g).bfloat16()
    cache = torch.randn(n, 512, generator=g).bfloat16()
    idx = _holes(torch.rand(t, n, generator=g).topk(640, dim=-1).indices.to(torch.int32), n, g)
    sink = torch.randn(64, generator=g)
    used = (_fp8(cache) if fp8 else cache).cuda()
    dense = reference.unpack_fp8_kv_ref(_fp8(cache), torch.float32) if fp8 else cache
    got = _K.sparse_attn_split_triton(q.cuda(), used, idx.cuda(), sink.cuda(), SCALE, kernel="cuda")
    tri = _K.sparse_attn_split_triton(q.cuda(), used, idx.cuda(), sink.cuda(), SCALE, kernel="fused")
    ref = reference.sparse_attn(q.cuda(), used, idx.cuda(), sink.cuda(), SCALE)
    want = dense_oracle(q, [dense], [idx], sink, SCALE, torch.bfloat16)
    bf16_p = 2 * 2.0**-9 * _weight_abs(q, [dense], [idx], sink, SCALE)
    got_c = (got[0].cpu(), got[1].cpu())
    _assert_close_to(got_c, (ref[0].cpu(), ref[1].cpu()), 2 * want[2] + bf16_p, 2 * want[3])
    _assert_close_to(got_c, (tri[0].cpu(), tri[1].cpu()), 2 * (want[2] + bf16_p), 2 * want[3])


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
def test_cuda_strided_out_and_flat_q_gpu() -> None:
    """out / lse as strided views of larger buffers, q as a strided view: every element written, same values."""
    q, caches, lists, sink = _v4_inputs(False, "random", 505)
    q, idx = q[:6], lists[0][:6]
    qd, ob, lb = mc.strided_io(q)
    o, lse = _K.sparse_attn_split_triton(
        qd[..., :512], caches[0].cuda(), idx.cuda(), sink.cuda(), SCALE, out=ob[..., :512], lse_out=lb[..., 0],
        kernel="cuda",
    )  # fmt: skip
    assert o.data_ptr() == ob.data_ptr()
    _check((o.cpu(), lse.cpu()), q, caches[:1], [idx], sink, SCALE, (False,), gpu_p=True)
    mc.assert_pad_untouched(ob, lb)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("merge", ["triton", "pdl", "last_cta"])
def test_cuda_graph_replay_gpu(fp8: bool, merge: str) -> None:
    """Captured once (b = 2, s_q = 2: split path + merge), replayed twice on new q / indices in the same buffers (the
    last-CTA counters must be back at zero after every replay)."""

    def launch(q, kv, idx, sink, out, lse) -> None:  # noqa: ANN001
        _K.sparse_attn_split_triton(q, kv, idx, sink, SCALE, out=out, lse_out=lse, kernel="cuda", cuda_merge=merge)

    mc.check_graph_replay(launch, fp8, 606 + fp8, [607, 608], SCALE)


# ------------------------------------------------------------------ GPU: extra cache, plans, heads, engine calls


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("t", [4, 64])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("merge", ["triton", "pdl", "last_cta"])
def test_cuda_extra_kv_gpu(t: int, fp8: bool, merge: str) -> None:
    """512 main + 128 extra indices (two caches of one format, NaN in unused slots of both, ragged holes of every
    kind, token 1 none valid in either list), NaN-poisoned out / lse: the CUDA kernel against the reference."""
    q, caches, lists, sink = _v4_inputs(True, "random", zlib.crc32(f"cx{t}{fp8}{merge}".encode()))
    q, lists = q[:t], [i[:t] for i in lists]
    got = _call(q, caches, lists, sink, SCALE, (fp8, fp8), kernel="cuda", cuda_merge=merge)
    _check(got, q, caches, lists, sink, SCALE, (fp8, fp8), gpu_p=True)
    mc.assert_empty_token(got, sink)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize(("t", "h", "k1", "k2", "splits"), [
    (3, 64, 40, 7, None),  # one tile holding rows of both caches
    (3, 64, 7, 70, 2),  # the extra list spans two tiles; split boundary inside it
    (3, 16, 40, 7, None),  # fewer heads than a CTA: 48 q rows zero-filled, never stored
    (3, 96, 100, 30, 2),  # one full and one half head block
    (2, 128, 200, 0, 3),  # two head blocks, no extra list
])  # fmt: skip
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_ragged_shapes_gpu(t: int, h: int, k1: int, k2: int, splits: int | None, fp8: bool) -> None:
    """Index widths that are not multiples of 64, tiles straddling the main / extra boundary, head counts that are
    not multiples of 64 (NaN-poisoned outputs: every head written, none beyond h)."""
    q, caches, lists, sink = _inputs(t, h, 512, k1, k2, "random", zlib.crc32(f"rg{t}{h}{k1}{k2}{fp8}".encode()))
    fmt = (fp8, fp8)[: len(caches)]
    got = _call(q, caches, lists, sink, SCALE, fmt, kernel="cuda", num_splits=splits)
    _check(got, q, caches, lists, sink, SCALE, fmt, gpu_p=True)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("plan", ["fine", "auto"])
@pytest.mark.parametrize("merge", ["triton", "pdl", "last_cta"])
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_small_batch_plans_gpu(plan: str, merge: str, fp8: bool) -> None:
    """b = 2, s_q = 2 (4 tokens, 640 indices: fine / auto give 10 splits of one tile) and HCA-like b = 1 with 130
    tiles (auto: 65 splits) under each merge, against the reference."""
    q, caches, lists, sink = _v4_inputs(False, "random", zlib.crc32(f"pl{plan}{merge}{fp8}".encode()))
    got = _cuda_call(q[:4], caches, [lists[0][:4]], sink, fp8, cuda_plan=plan, cuda_merge=merge)
    _check(got, q[:4], caches[:1], [lists[0][:4]], sink, SCALE, (fp8,), gpu_p=True)
    g = torch.Generator().manual_seed(zlib.crc32(f"hca{plan}{merge}{fp8}".encode()))
    n = 16384
    cache = torch.randn(n, 512, generator=g).bfloat16()
    idx = torch.randperm(n, generator=g)[: 130 * 64].view(1, -1).to(torch.int32)
    idx = _holes(torch.where(torch.rand(idx.shape, generator=g) < 0.03, -1, idx), n, g)
    q1 = torch.randn(1, 64, 512, generator=g).bfloat16()
    got = _cuda_call(q1, [cache], [idx], sink, fp8, cuda_plan=plan, cuda_merge=merge)
    _check(got, q1, [cache], [idx], sink, SCALE, (fp8,), gpu_p=True)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("prefetch", [True, 5])
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_prefetch_gpu(prefetch: bool | int, fp8: bool) -> None:
    """The L2 prefetch variant (prefill: 140 tokens > one wave of 132 CTAs, so True prefetches 132 tokens ahead; 5:
    every CTA prefetches) with an extra list: same results as the reference, tokens near the end included."""
    g = torch.Generator().manual_seed(zlib.crc32(f"pf{prefetch}{fp8}".encode()))
    t, n1, n2 = 140, 300, 160
    q = torch.randn(t, 64, 512, generator=g).bfloat16()
    lists = [_holes(ragged_indices(t, k, torch.arange(n - 9), g), n, g) for k, n in ((100, n1), (30, n2))]
    caches = [poison_unused(torch.randn(n, 512, generator=g).bfloat16(), [i]) for n, i in zip((n1, n2), lists)]
    sink = torch.randn(64, generator=g)
    got = _call(q, caches, lists, sink, SCALE, (fp8, fp8), kernel="cuda", cuda_prefetch=prefetch)
    _check(got, q, caches, lists, sink, SCALE, (fp8, fp8), gpu_p=True)


def _engine_inputs(t: int, seed: int, fresh_prompt: bool):
    """The engine's attention call (model/attention.py): q [t, 64, 512] bf16; the layer's pool [rows, 512] bf16
    (NaN-initialised like CachePool, i.e. NaN wherever nothing names a row); main list = 128 window ring rows +
    512 compressed rows; extra = this step's new KV [t, 512] named by win_new_idx [t, 128] (positions inside the
    chunk; a fresh prompt has no ring rows: its first two main tiles are all -1)."""
    g = torch.Generator().manual_seed(seed)
    rows, w = 4096, 128
    q = torch.randn(t, 64, 512, generator=g).bfloat16()
    pool = torch.randn(rows, 512, generator=g).bfloat16()
    ring = torch.rand(t, 512, generator=g).topk(w, dim=-1).indices.to(torch.int32)  # distinct per row
    comp = torch.rand(t, rows - 600, generator=g).topk(512, dim=-1).indices.to(torch.int32) + 600
    pos = torch.arange(t)[:, None]
    kpos = pos - w + 1 + torch.arange(w)[None, :]
    if fresh_prompt:
        ring[:] = -1
        comp[pos[:, 0] < t // 2, 256:] = -1  # early tokens see fewer compressed rows
        win_new = torch.where(kpos >= 0, kpos, -1).to(torch.int32)
    else:  # decode-like: each token's own new row is the last window entry
        win_new = torch.full((t, w), -1, dtype=torch.int32)
        win_new[:, -1] = torch.arange(t, dtype=torch.int32)
    main = torch.cat((ring, comp), dim=1)
    pool = poison_unused(pool, [main])
    new_kv = torch.randn(t, 512, generator=g).bfloat16()
    sink = torch.randn(64, generator=g)
    return q, [pool, new_kv], [main, win_new], sink


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize(("t", "fresh"), [(32, False), (256, True), (3, False)])
def test_engine_call_runs_cuda_kernel_gpu(t: int, fresh: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's `flash_mla.sparse_attn_prefill(q, pool, main_idx, sink, scale, extra_kv=kv, extra_indices=
    win_new_idx)` goes to the CUDA kernel (route / kernel_for say so and the kernel is called exactly once) and
    matches the reference."""
    import deepinfer.flash_mla as fm

    q, caches, lists, sink = _engine_inputs(t, zlib.crc32(f"eng{t}{fresh}".encode()), fresh)
    qd, pool, new_kv = q.cuda(), caches[0].cuda(), caches[1].cuda()
    main, win_new, sd = lists[0].cuda(), lists[1].cuda(), sink.cuda()
    assert _dispatch.route(qd, pool, new_kv) == "split"
    assert _dispatch.kernel_for(qd, pool, new_kv) == "cuda", _CU.supports(qd, pool, new_kv)
    calls = []
    real = _CU.sparse_attn_cuda
    monkeypatch.setattr(_CU, "sparse_attn_cuda", lambda *a, **k: calls.append(1) or real(*a, **k))
    o, lse = fm.sparse_attn_prefill(qd, pool, main, sd, SCALE, extra_kv=new_kv, extra_indices=win_new)
    assert len(calls) == 1, "the engine's call did not reach the CUDA kernel"
    _check((o, lse), q, caches, lists, sink, SCALE, (False, False), gpu_p=True)


@gpu
@pytest.mark.gpu
def test_tiny_model_call_stays_on_triton_gpu() -> None:
    """The tiny test model's shapes (4 heads x 256 dims) are not the CUDA kernel's: the Triton kernel runs them,
    correctly (the engine's tiny-model tests rely on it)."""
    import deepinfer.flash_mla as fm

    q, caches, lists, sink = _inputs(3, 4, 256, 40, 9, "random", 77)  # _inputs builds at most 3 tokens
    qd, c0, c1 = q.cuda(), caches[0].cuda(), caches[1].cuda()
    assert _dispatch.kernel_for(qd, c0, c1) == "fused"
    o, lse = fm.sparse_attn_prefill(qd, c0, lists[0].cuda(), sink.cuda(), 256**-0.5, extra_kv=c1,
                                    extra_indices=lists[1].cuda())  # fmt: skip
    _check((o, lse), q, caches, lists, sink, 256**-0.5, (False, False), gpu_p=True)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
def test_mixed_formats_fall_back_gpu() -> None:
    """An FP8 main cache with a BF16 extra cache is not the CUDA kernel's: the default falls back to the Triton
    kernel (same results), kernel="cuda" raises with the reason."""
    q, caches, lists, sink = _v4_inputs(True, "random", 909)
    q, lists = q[:4], [i[:4] for i in lists]
    used = [_fp8(caches[0]).cuda(), caches[1].cuda()]
    assert _dispatch.kernel_for(q.cuda(), used[0], used[1]) == "fused"
    got = _call(q, caches, lists, sink, SCALE, (True, False))
    _check(got, q, caches, lists, sink, SCALE, (True, False), gpu_p=True)
    with pytest.raises(ValueError, match="extra_kv"):
        _call(q, caches, lists, sink, SCALE, (True, False), kernel="cuda")
