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
import re
import shutil
import subprocess
import sys
import zlib

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the @triton.jit decorators run
pytest.importorskip("triton")

from mla_checks import dense_oracle  # noqa: E402
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
    """Both template instances (BF16 / FP8 cache) assemble for sm_90a with no stack frame and no spills."""
    proc = subprocess.run(
        ["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c",
         str(_SRC / "fm_sparse_decode.cu"), "-o", str(tmp_path / "fm.o")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    props = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", out)
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", out)]
    print(out)
    assert len(props) == 2 and len(regs) == 2, out[-2000:]
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
        assert "extra_kv" in _CU.supports(q, kv, kv) or "CUDA" in _CU.supports(q, kv, kv)


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

    def good(q, kv, idx, sink, scale, *, out, lse_out, num_splits=None):  # noqa: ANN001, ANN202
        if kv.dtype not in memo:
            memo[kv.dtype] = reference.sparse_attn(q, kv, idx, sink, scale)
        out.copy_(memo[kv.dtype][0])
        lse_out.copy_(memo[kv.dtype][1])

    def bad(q, kv, idx, sink, scale, *, out, lse_out, num_splits=None):  # noqa: ANN001, ANN202
        good(q, kv, idx, sink, scale, out=out, lse_out=lse_out)
        out.copy_(out.roll(1, dims=1))

    monkeypatch.setattr(_CU, "sparse_attn_cuda", good)
    assert _CU.self_check(device="cpu") == ""
    monkeypatch.setattr(_CU, "sparse_attn_cuda", bad)
    why = _CU.self_check(device="cpu")
    assert "fp8=False splits=None" in why and "max |out - ref|" in why, why


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
        assert bool((got[0][1] == 0).all()), f"token 1 max |out| {float(got[0][1].abs().max())}"
        if sink is not None:
            assert torch.equal(got[1][1].cpu(), sink), (got[1][1][:4], sink[:4])


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("splits", [1, 3, 10])
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_split_counts_gpu(splits: int, fp8: bool) -> None:
    """Forced split counts: 1 (out / lse written by the kernel), 3 (uneven: 4 + 4 + 2 tiles), 10 (one tile each)."""
    q, caches, lists, sink = _v4_inputs(False, "random", 301 + splits + 7 * fp8)
    q, lists = q[:8], [i[:8] for i in lists]
    got = _cuda_call(q, caches, lists, sink, fp8, num_splits=splits)
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
    qd = torch.zeros(6, 64, 520, dtype=torch.bfloat16, device="cuda")
    qd[..., :512] = q.cuda()
    ob = torch.full((6, 64, 520), float("nan"), dtype=torch.bfloat16, device="cuda")
    lb = torch.full((6, 64, 2), float("nan"), device="cuda")
    o, lse = _K.sparse_attn_split_triton(
        qd[..., :512], caches[0].cuda(), idx.cuda(), sink.cuda(), SCALE, out=ob[..., :512], lse_out=lb[..., 0],
        kernel="cuda",
    )  # fmt: skip
    assert o.data_ptr() == ob.data_ptr()
    _check((o.cpu(), lse.cpu()), q, caches[:1], [idx], sink, SCALE, (False,), gpu_p=True)
    assert bool(torch.isnan(ob[..., 512:].float()).all()) and bool(torch.isnan(lb[..., 1]).all())


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_graph_replay_gpu(fp8: bool) -> None:
    """Captured once (b = 2, s_q = 2: split path + combine), replayed on new q / indices in the same buffers."""
    q, caches, lists, sink = _v4_inputs(False, "random", 606 + fp8)
    used = (_fp8(caches[0]) if fp8 else caches[0]).cuda()
    qd, ld, sd = q[:4].cuda(), lists[0][:4].cuda(), sink.cuda()
    out = torch.empty_like(qd)
    lse = torch.empty(4, 64, device="cuda")

    def call() -> None:
        _K.sparse_attn_split_triton(qd, used, ld, sd, SCALE, out=out, lse_out=lse, kernel="cuda")

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    q2 = torch.randn(4, 64, 512, generator=torch.Generator().manual_seed(607)).bfloat16()
    l2 = lists[0].roll(1, dims=0)[:4]
    qd.copy_(q2.cuda())
    ld.copy_(l2.cuda())
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _check((out.cpu(), lse.cpu()), q2, caches[:1], [l2], sink, SCALE, (fp8,), gpu_p=True)
