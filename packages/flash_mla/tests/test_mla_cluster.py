"""Merge 4 ("cluster") of the serial CUDA kernel: C = 2 / 4 / 8 consecutive splits of a token run as one thread-block
cluster and reduce their partials in distributed shared memory, so the global PDL merge reads C times fewer partials
(csrc/cuda/fm_sparse_decode.cu, `cluster_merge`). Not bit-equal to "pdl_wide" (another summation order): checked
against the reference within the format tolerance of the other merges (tests/mla_checks.py inputs: NaN in unused
slots, NaN-poisoned outputs, holes of every kind, ragged counts, a token without any valid index, large / small /
random / no sinks), at HCA 1M lengths (8,320 indices) and small lists (one split, fewer splits than C).
CPU: registration, ABI gate, plan, option errors, forwarding, the sm_90a build of the new instances.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (as test_mla_cuda.py does)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

pytest.importorskip("triton")

import mla_checks as mc  # noqa: E402
from test_mla_cuda import _CU, _K, SCALE, _cuda_call, gpu, needs_c, probed  # noqa: E402, F401
from test_mla_small import _hca_inputs  # noqa: E402
from test_mla_split import _check, _fp8  # noqa: E402
from test_mla_triton import _v4_inputs  # noqa: E402

_SRC = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda"
_H200 = (16, 32, 64)  # _estimated_capacity(132): clusters of 8 / 4 / 2 resident at once

# ------------------------------------------------------------------------------------------------------ CPU


def test_cluster_merge_registered_not_default() -> None:
    """Selectable by name (merge code 4, plan "cluster"), gated on ABI 5, and neither the default merge nor plan."""
    assert "cluster" in _CU.MERGES and _CU._MERGE_CODE["cluster"] == 4 and _CU._MERGE_ABI["cluster"] == 5
    assert "cluster" in _CU.PLANS
    assert _CU.DEFAULT_OPTIONS["merge"] != "cluster" and _CU.DEFAULT_OPTIONS["plan"] != "cluster"
    assert _CU._estimated_capacity(132) == _H200


def test_cluster_needs_abi5_and_valid_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale _C (ABI 4) refuses merge="cluster" cleanly; a bad cluster size, the FP8 "stage" path and
    tiles_per_split together with num_splits are ValueErrors before any launch (supports() stubbed: no GPU)."""
    monkeypatch.setattr(_CU, "supports", lambda q, kv, ex: None)
    q = torch.randn(1, 64, 512).bfloat16()
    kv = torch.randn(64, 512).bfloat16()
    idx = torch.zeros(1, 64, dtype=torch.int32)
    monkeypatch.setattr(_CU, "_abi", lambda: 4)
    with pytest.raises(ValueError, match="needs SPARSE_DECODE_ABI >= 5"):
        _CU.sparse_attn_cuda(q, kv, idx, None, SCALE, merge="cluster")
    monkeypatch.setattr(_CU, "_abi", lambda: 5)
    with pytest.raises(ValueError, match="cluster: expected one of"):
        _CU.sparse_attn_cuda(q, kv, idx, None, SCALE, merge="cluster", cluster=3)
    fp8 = torch.zeros(64, 584, dtype=torch.uint8)
    with pytest.raises(ValueError, match="stage"):
        _CU.sparse_attn_cuda(q, fp8, idx, None, SCALE, merge="cluster", fp8_path="stage")
    with pytest.raises(ValueError, match="tiles_per_split"):
        _CU._plan(1, 1, 130, torch.device("cpu"), 0, "auto", "cluster", 65, 8, 1)


def test_cluster_plan_choices() -> None:
    """cluster_plan (H200 capacities): HCA 1M b = 1 -> 2 tiles per split in clusters of 8 (9 partials, one wave: 17
    clusters of 8 would not fit); explicit C / tiles per split respected; one cluster per token when it fits (no
    global merge); many tokens -> the default plan's splits."""
    plan = _CU.cluster_plan
    assert plan(1, 1, 130, 132, _H200) == (65, 8)
    assert plan(1, 1, 130, 132, _H200, 4, 1) == (130, 4)  # 33 clusters of 4 > 32: no wave fits, kept as asked
    assert plan(1, 1, 130, 132, _H200, None, 1) == (130, 2)  # 17 / 33 / 65 clusters fit no wave: C falls back to 2
    assert plan(1, 1, 10, 132, _H200) == (10, 8)  # decode b = 1: 2 clusters of 8 (tiles 1 each)
    assert plan(1, 1, 8, 132, _H200) == (8, 8)  # one cluster holds the token: out written by the cluster
    assert plan(2, 1, 130, 132, _H200)[1] == 8
    assert plan(64, 1, 130, 132, _H200) == (_CU.plan_num_splits(64, 1, 130, 132), 2)
    assert _CU.cuda_num_splits(1, 1, 130, 132, "cluster") == 65


def test_plan_of_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """_plan: (splits, tiles per split, cluster size) for explicit options, plan "cluster", merge "cluster" under
    another plan (C picked for that split count) and other merges (cluster size 1)."""
    monkeypatch.setattr(_CU, "device_sms", lambda dev: 132)
    monkeypatch.setattr(_CU, "_device_capacity", lambda dev, mode: _H200)
    dev = torch.device("cpu")
    p = _CU._plan
    assert p(1, 1, 130, dev, 0, "auto", "cluster", None, 8, 1) == (130, 1, 8)
    assert p(1, 1, 130, dev, 2, "auto", "cluster", None, 4, 2) == (65, 2, 4)
    assert p(1, 1, 130, dev, 0, "cluster", "cluster", None, None, None) == (65, 2, 8)
    assert p(1, 1, 130, dev, 0, "auto", "cluster", None, None, None) == (65, 2, 8)  # auto: 65 splits, C fits
    assert p(1, 1, 130, dev, 0, "cluster", "pdl_wide", None, None, None) == (65, 2, 1)
    assert p(1, 1, 1, dev, 0, "auto", "cluster", None, 8, None) == (1, 1, 8)  # one split, 7 empty CTAs
    assert p(2, 1, 10, dev, 2, "fine", "cluster", None, 4, None) == (10, 1, 4)
    assert p(1, 1, 0, dev, 0, "auto", "cluster", None, 2, None) == (1, 0, 2)  # empty list: out = 0, lse = sink


def test_split_triton_forwards_cluster_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernel="cuda" hands cuda_cluster / cuda_tiles_per_split to the CUDA kernel (recording stand-in)."""
    seen: list[dict] = []

    def fake(q, kv, idx, sink, scale, **kw):  # noqa: ANN001, ANN202
        seen.append(kw)
        return kw["out"], kw["lse_out"]

    monkeypatch.setattr(_CU, "supports", lambda q, kv, ex: None)
    monkeypatch.setattr(_CU, "sparse_attn_cuda", fake)
    q, kv = torch.randn(2, 64, 512).bfloat16(), torch.randn(9, 512).bfloat16()
    i1 = torch.zeros(2, 5, dtype=torch.int32)
    _K.sparse_attn_split_triton(
        q, kv, i1, None, SCALE, kernel="cuda", cuda_merge="cluster", cuda_cluster=4, cuda_tiles_per_split=2
    )
    assert seen[0]["merge"] == "cluster" and seen[0]["cluster"] == 4 and seen[0]["tiles_per_split"] == 2


def test_probe_leaves_cluster_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The out-of-process probe that gates the default kernel does not run the (GPU-unmeasured) cluster merge."""
    merges: list[str | None] = []

    def stand_in(q, kv, idx, sink, scale, *, out, lse_out, merge=None, **kw):  # noqa: ANN001, ANN202
        merges.append(merge)
        out.zero_()
        lse_out.zero_()

    monkeypatch.setattr(_CU, "_abi", lambda: 5)
    monkeypatch.setattr(_CU, "sparse_attn_cuda", stand_in)
    _CU.self_check(device="cpu")
    assert "pdl_wide" in merges and "cluster" not in merges, merges


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_cluster_instances_compile_without_spills(tmp_path: pathlib.Path) -> None:
    """sparse_decode_kernel<false, false, true> (BF16) and <true, true, true> (fp8v) assemble for sm_90a: no stack
    frame, no spills, <= 255 registers; the DSMEM epilogue is there (cluster barriers, mapa, shared::cluster loads)."""
    out, props, regs = mc.nvcc_sm90a(_SRC / "fm_sparse_decode.cu", tmp_path / "fm.o")
    for name in ("sparse_decode_kernelILb0ELb0ELb1EE", "sparse_decode_kernelILb1ELb1ELb1EE"):
        assert name in out, out[-2000:]
    assert all(p == ("0", "0", "0") for p in props), props
    assert all(r <= 255 for r in regs), regs
    text = (_SRC / "fm_sparse_decode.cu").read_text()
    for ptx in ("barrier.cluster.arrive.release", "mapa.shared::cluster", "ld.shared::cluster.v4.f32"):
        assert ptx in text, ptx


# ------------------------------------------------------------------------------------------------------ GPU

_SIZES = [(c, tps) for c in (2, 4, 8) for tps in (1, 2)]
_SINK_OF = {2: "large", 4: "small", 8: "random"}  # every sink regime across the cluster sizes


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize(("cluster", "tps"), _SIZES)
def test_cluster_hca_two_tokens_gpu(fp8: bool, cluster: int, tps: int) -> None:
    """HCA 1M, b = 1 x s_q = 2: 2 tokens x 8,320 indices (130 tiles), ~3 % holes of every kind, token 1 ragged (a
    third valid: its later clusters are all holes), NaN in unused slots, NaN-poisoned out / lse; 130 or 65 splits
    in clusters of 2 / 4 / 8 (the last cluster padded with empty CTAs when C does not divide the split count)."""
    sink_mode = _SINK_OF[cluster]
    q, caches, lists, sink = _hca_inputs(zlib.crc32(f"cl{fp8}{cluster}{tps}".encode()), 130, sink_mode)
    kw = dict(cuda_merge="cluster", cuda_cluster=cluster, cuda_tiles_per_split=tps)
    got = _cuda_call(q, caches, lists, sink, fp8, **kw)
    _check(got, q, caches, lists, sink, SCALE, (fp8,), gpu_p=True)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("cluster", [2, 8])
@pytest.mark.parametrize("sink_mode", ["large", "none"])
def test_cluster_hca_one_token_and_empty_token_gpu(fp8: bool, cluster: int, sink_mode: str) -> None:
    """b = 1 x s_q = 1 (one token of 8,320 indices, 1 tile per split), then the same with token 1 all holes (every
    split of it empty: out exactly 0, lse exactly the sink)."""
    q, caches, lists, sink = _hca_inputs(zlib.crc32(f"cl1{fp8}{cluster}{sink_mode}".encode()), 130, sink_mode)
    kw = dict(cuda_merge="cluster", cuda_cluster=cluster, cuda_tiles_per_split=1)
    one = _cuda_call(q[:1], caches, [lists[0][:1]], sink, fp8, **kw)
    _check(one, q[:1], caches, [lists[0][:1]], sink, SCALE, (fp8,), gpu_p=True)
    lists = [lists[0].clone()]
    lists[0][1] = -1
    got = _cuda_call(q, caches, lists, sink, fp8, **kw)
    _check(got, q, caches, lists, sink, SCALE, (fp8,), gpu_p=True)
    mc.assert_empty_token(got, sink)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize(("cluster", "tps"), _SIZES)
def test_cluster_small_lists_gpu(fp8: bool, cluster: int, tps: int) -> None:
    """Decode b = 2 x s_q = 2 (640 indices = 10 tiles, ragged, token 1 empty): 10 or 5 splits, so clusters of 8 hold
    fewer splits than C (one cluster per token at 5: out / lse written by the cluster, no global merge); then one
    tile per token (64 indices: 1 split, C - 1 empty CTAs)."""
    sink_mode = _SINK_OF[cluster]
    q, caches, lists, sink = _v4_inputs(False, sink_mode, zlib.crc32(f"cls{fp8}{cluster}{tps}".encode()))
    q, lists = q[:4], [lists[0][:4]]
    kw = dict(cuda_merge="cluster", cuda_cluster=cluster, cuda_tiles_per_split=tps)
    got = _cuda_call(q, caches, lists, sink, fp8, **kw)
    _check(got, q, caches, lists, sink, SCALE, (fp8,), gpu_p=True)
    mc.assert_empty_token(got, sink)
    short = [lists[0][:, :64].contiguous()]
    got = _cuda_call(q, caches, short, sink, fp8, **kw)
    _check(got, q, caches, short, sink, SCALE, (fp8,), gpu_p=True)
    mc.assert_empty_token(got, sink)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("fp8", [False, True])
def test_cluster_plan_and_graph_replay_gpu(fp8: bool) -> None:
    """Plan "cluster" (the device's cluster capacity) at HCA b = 1 x s_q = 2 within tolerance; then captured once in a
    CUDA graph (cluster launch + PDL combine) and replayed on new q: equal to an eager call of the same plan."""
    from deepinfer.flash_mla.backends.cuda import triton_split_attn as tsa

    q, caches, lists, sink = _hca_inputs(zlib.crc32(f"clg{fp8}".encode()), 130, "random")
    kw = dict(kernel="cuda", cuda_plan="cluster", cuda_merge="cluster")
    got = _cuda_call(q, caches, lists, sink, fp8, cuda_plan="cluster", cuda_merge="cluster")
    _check(got, q, caches, lists, sink, SCALE, (fp8,), gpu_p=True)
    dev = torch.device("cuda")
    kv = (_fp8(caches[0]) if fp8 else caches[0]).to(dev)
    qd, idx, sk = q.to(dev), lists[0].to(dev), sink.to(dev)
    out, lse = torch.empty_like(qd), torch.empty(2, 64, device=dev)

    def call() -> None:
        tsa.sparse_attn_split_triton(qd, kv, idx, sk, SCALE, out=out, lse_out=lse, **kw)

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    qd.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(7)).bfloat16().to(dev))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = tsa.sparse_attn_split_triton(qd, kv, idx, sk, SCALE, **kw)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
