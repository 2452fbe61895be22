"""Session 7, small batch / long lists on the serial CUDA kernel: the "pdl_wide" merge (csrc/cuda/fm_combine_wide.cu)
and the explicit split counts the benchmark (benchmarks/bench_fm_small.py) sweeps.

"pdl_wide" does the PDL combine's arithmetic in the same order, so on the GPU it must be bit-equal to merge="pdl"
(same kernel, same partials) and within the format tolerance of the reference (tests/mla_checks.py: NaN in unused
slots, NaN-poisoned outputs, holes of every kind, ragged counts, a token without any valid index, large / small /
no sinks). CPU: the registration / error paths and the sm_90a build of the new file (nvcc, when on PATH).
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import zlib

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

pytest.importorskip("triton")

import mla_checks as mc  # noqa: E402
from test_mla_cuda import _CU, SCALE, _cuda_call, gpu, needs_c, probed  # noqa: E402, F401
from test_mla_split import _check  # noqa: E402
from test_mla_triton import _holes, _v4_inputs  # noqa: E402

_SRC = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda"

# ------------------------------------------------------------------------------------------------------ CPU


def test_pdl_wide_is_registered_and_default() -> None:
    """The merge is selectable by name, maps to the kernel's merge code 3 and is the default (session 8)."""
    assert "pdl_wide" in _CU.MERGES and _CU._MERGE_CODE["pdl_wide"] == 3
    assert _CU.DEFAULT_OPTIONS["merge"] == "pdl_wide"
    assert _CU._MERGE_ABI["pdl_wide"] == 3


def test_default_merge_falls_back_on_a_stale_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A _C built before ABI 3 runs the default as "pdl"; a newer one runs "pdl_wide"; a named merge is kept."""
    monkeypatch.setattr(_CU, "_abi", lambda: 2)
    assert _CU._resolve_merge(None) == "pdl" and _CU._resolve_merge("triton") == "triton"
    monkeypatch.setattr(_CU, "_abi", lambda: 3)
    assert _CU._resolve_merge(None) == "pdl_wide"


def test_unknown_merge_is_a_clean_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad merge name fails before any launch, naming the expected values (supports() stubbed: no GPU here)."""
    monkeypatch.setattr(_CU, "supports", lambda q, kv, ex: None)
    q = torch.randn(1, 64, 512).bfloat16()
    kv = torch.randn(64, 512).bfloat16()
    idx = torch.zeros(1, 64, dtype=torch.int32)
    with pytest.raises(ValueError, match="merge: expected one of .*pdl_wide"):
        _CU.sparse_attn_cuda(q, kv, idx, None, SCALE, merge="wide")


def test_wave_plan_split_counts() -> None:
    """plan="wave": one CTA per tile whenever that fits one wave (HCA b = 1 s_q = 1: 130 splits where auto gives 65),
    else the default plan; the same as auto at decode (10 tiles)."""
    assert "wave" in _CU.PLANS
    assert _CU.cuda_num_splits(1, 1, 130, 132, "wave") == 130
    assert _CU.cuda_num_splits(1, 1, 130, 132, "auto") == 65
    assert _CU.cuda_num_splits(2, 1, 130, 132, "wave") == _CU.cuda_num_splits(2, 1, 130, 132, "default") == 65
    for t in (1, 2, 4, 8):
        assert _CU.cuda_num_splits(t, 1, 10, 132, "wave") == _CU.cuda_num_splits(t, 1, 10, 132, "auto") == 10
    assert _CU.cuda_num_splits(64, 1, 130, 132, "wave") == 2  # b = 32 s_q = 2: the default plan
    with pytest.raises(ValueError, match="plan: expected one of"):
        _CU.cuda_num_splits(1, 1, 10, 132, "waves")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_combine_wide_compiles_for_sm90a_without_spills(tmp_path: pathlib.Path) -> None:
    """fm_combine_wide.cu: one kernel, no stack frame, no spills (its 8 loads in flight stay in registers)."""
    out, props, regs = mc.nvcc_sm90a(_SRC / "fm_combine_wide.cu", tmp_path / "cw.o")
    assert len(props) == 1 and len(regs) == 1, out[-2000:]
    assert props[0] == ("0", "0", "0"), props
    assert regs[0] <= 128, regs


# ------------------------------------------------------------------------------------------------------ GPU


def _hca_inputs(seed: int, tiles: int, sink_mode: str) -> tuple:
    """HCA-like long list: t = 2 tokens of tiles x 64 distinct rows of a (tiles x 64 + 128)-row cache (NaN in the
    unnamed rows), ~3 % holes of every kind, token 1 with a ragged count (a third of the list valid)."""
    g = torch.Generator().manual_seed(seed)
    n, k = tiles * 64 + 128, tiles * 64  # small n: the float64 oracle is dense over the cache
    idx = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(2)]).to(torch.int32)
    idx[1, k // 3 :] = -1
    idx = _holes(torch.where(torch.rand(idx.shape, generator=g) < 0.03, -1, idx), n, g)
    cache = mc.poison_unused(torch.randn(n, 512, generator=g).bfloat16(), [idx])
    q = torch.randn(2, 64, 512, generator=g).bfloat16()
    sink = {"none": None, "large": 14.0, "small": -40.0, "random": 0.0}[sink_mode]
    sink = None if sink is None else sink + torch.randn(64, generator=g)
    return q, [cache], [idx], sink


def _bit_equal(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], what: str) -> None:
    for x, y, name in ((a[0], b[0], "out"), (a[1], b[1], "lse")):
        same = (x == y) | (torch.isnan(x) & torch.isnan(y)) | (torch.isinf(x) & torch.isinf(y) & (x == y))
        diff = (x.float() - y.float()).abs().nan_to_num(float("inf"))
        assert bool(same.all()), f"{what} {name}: {int((~same).sum())} differ, max |diff| {float(diff.max())}"


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("sink_mode", ["random", "large", "none"])
def test_pdl_wide_decode_b2_gpu(fp8: bool, sink_mode: str) -> None:
    """b = 2, s_q = 2 (4 tokens, 640 indices, ragged, token 1 empty): fine / auto plan (10 splits) and 3 splits;
    pdl_wide bit-equal to pdl and within tolerance of the reference."""
    q, caches, lists, sink = _v4_inputs(False, sink_mode, zlib.crc32(f"small{fp8}{sink_mode}".encode()))
    q, lists = q[:4], [lists[0][:4]]
    for splits in (None, 3):
        base = _cuda_call(q, caches, lists, sink, fp8, num_splits=splits, cuda_merge="pdl")
        got = _cuda_call(q, caches, lists, sink, fp8, num_splits=splits, cuda_merge="pdl_wide")
        _bit_equal(got, base, f"splits={splits}")
        _check(got, q, caches[:1], lists, sink, SCALE, (fp8,), gpu_p=True)
        mc.assert_empty_token(got, sink)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("splits", [65, 130, 33, 9])
def test_pdl_wide_hca_split_counts_gpu(fp8: bool, splits: int) -> None:
    """130 tiles per token (HCA at 1M): split counts of the benchmark sweep (65 = today's auto plan, 130 = one tile
    per CTA, 33 = 4 tiles, 9 = 15 tiles; 33 and 65 cross the 32-lane batches, 9 is not a multiple of 8) under pdl and
    pdl_wide: bit-equal, and pdl_wide within tolerance of the reference (small sink: the mass is in the rows)."""
    q, caches, lists, sink = _hca_inputs(zlib.crc32(f"hcaw{fp8}{splits}".encode()), 130, "small")
    base = _cuda_call(q, caches, lists, sink, fp8, num_splits=splits, cuda_merge="pdl")
    got = _cuda_call(q, caches, lists, sink, fp8, num_splits=splits, cuda_merge="pdl_wide")
    _bit_equal(got, base, f"splits={splits}")
    _check(got, q, caches, lists, sink, SCALE, (fp8,), gpu_p=True)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
def test_pdl_wide_cuda_graph_replay_gpu() -> None:
    """Captured once with pdl_wide (HCA-like, 65 splits), replayed on new q: equal to an eager pdl call."""
    q, caches, lists, sink = _hca_inputs(zlib.crc32(b"graphw"), 130, "random")
    dev = torch.device("cuda")
    from deepinfer.flash_mla.backends.cuda import triton_split_attn as tsa

    qd, kv, idx, sk = q.to(dev), caches[0].to(dev), lists[0].to(dev), sink.to(dev)
    out = torch.empty_like(qd)
    lse = torch.empty(2, 64, device=dev)

    def call() -> None:
        tsa.sparse_attn_split_triton(qd, kv, idx, sk, SCALE, out=out, lse_out=lse, kernel="cuda", cuda_merge="pdl_wide")

    call()  # warm-up (compiles nothing: the CUDA kernel, but loads the module)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    qd.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).bfloat16().to(dev))
    graph.replay()
    torch.cuda.synchronize()
    want = tsa.sparse_attn_split_triton(qd, kv, idx, sk, SCALE, kernel="cuda", cuda_merge="pdl")
    _bit_equal((out, lse), want, "graph replay")


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("fp8", [False, True])
def test_wave_plan_hca_one_token_gpu(fp8: bool) -> None:
    """plan="wave" at HCA b = 1 s_q = 1 (130 one-tile CTAs) under pdl and pdl_wide: bit-equal to each other and to
    num_splits=130, within tolerance of the reference (large sinks: the rows' weights are small against the sink)."""
    q, caches, lists, sink = _hca_inputs(zlib.crc32(f"wave{fp8}".encode()), 130, "large")
    q, lists = q[:1], [lists[0][:1]]
    base = _cuda_call(q, caches, lists, sink, fp8, num_splits=130, cuda_merge="pdl")
    for merge in ("pdl", "pdl_wide"):
        got = _cuda_call(q, caches, lists, sink, fp8, cuda_plan="wave", cuda_merge=merge)
        _bit_equal(got, base, f"wave {merge}")
    _check(got, q, caches, lists, sink, SCALE, (fp8,), gpu_p=True)
