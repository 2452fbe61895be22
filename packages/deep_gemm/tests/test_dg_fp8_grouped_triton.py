"""Triton M-grouped FP8 GEMMs (backends/cuda/triton_fp8_grouped.py) vs the reference and float64.

Interpreter on CPU (TRITON_INTERPRET=1, set below without CUDA); `gpu` tests on the H200. Bounds as in
test_dg_fp8_triton.py: fp32 out differs from the reference only by rounding order (calc_diff < 1e-6, and
element-wise within 2 (k + 2) u |a||b| of float64); on a GPU Hopper's FP8 wgmma accumulates each 128-deep
block with fewer than 24 mantissa bits, so bf16 GPU results are checked with calc_diff < 1e-5.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from dg_testing import act64, assert_gemm_close, calc_diff, fp8_weight64, gen, rand_fp8, rand_scales  # noqa: E402

from deepinfer.deep_gemm import reference as ref  # noqa: E402
from deepinfer.deep_gemm.backends.cuda.triton_fp8_grouped import (  # noqa: E402
    m_grouped_fp8_contiguous_triton,
    m_grouped_fp8_masked_triton,
)

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
NAN = float("nan")
runnable = pytest.mark.skipif(
    not CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or TRITON_INTERPRET=1"
)


def _weights(g: int, n: int, k: int, e8m0: bool, seed: int, dev: str = DEV) -> tuple[torch.Tensor, torch.Tensor]:
    gg = gen(seed)
    return rand_fp8((g, n, k), gg).to(dev), rand_scales((g, -(-n // 128), -(-k // 128)), gg, e8m0).to(dev)


def _acts(lead: tuple[int, ...], k: int, e8m0: bool, seed: int, dev: str = DEV) -> tuple[torch.Tensor, torch.Tensor]:
    gg = gen(seed)
    return rand_fp8((*lead, k), gg).to(dev), rand_scales((*lead, -(-k // 128)), gg, e8m0).to(dev)


def _exact_rows(a, sfa, b, sfb, gids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 value and |a||b| magnitude of row i against group gids[i] (rows with -1: zero)."""
    da, db = act64(a.cpu(), sfa.cpu()), fp8_weight64(b.cpu(), sfb.cpu())
    val = torch.zeros(da.shape[0], db.shape[1], dtype=torch.float64)
    mag = torch.zeros_like(val)
    for i, gi in enumerate(gids):
        if gi >= 0:
            val[i] = db[gi] @ da[i]
            mag[i] = db[gi].abs() @ da[i].abs()
    return val, mag


@runnable
@pytest.mark.parametrize(
    ("gids", "n", "k", "block_m", "out_dtype", "e8m0"),
    [
        ([0] * 16 + [2] * 16 + [-1] * 16 + [1] * 5, 64, 256, 16, torch.float32, False),  # aligned, padding, tail
        ([1, 0, 0, 2, -1, 1, 2, 2, 0, -1, 1, 1, 0, 0, 2, 1, 1], 130, 144, 16, torch.float32, True),  # mixed tiles
        ([2] * 40 + [0] * 30, 64, 128, 32, torch.bfloat16, False),  # groups straddle 32-row tiles
        ([1] * 64 + [0] * 64, 128, 256, 64, torch.float32, False),  # 64-row tiles, not swapped
    ],
)
def test_contiguous(gids, n, k, block_m, out_dtype, e8m0) -> None:
    a, sfa = _acts((len(gids),), k, e8m0, seed=len(gids) + n)
    b, sfb = _weights(3, n, k, not e8m0, seed=k + n)
    ids = torch.tensor(gids, dtype=torch.int32, device=DEV)
    out = torch.full((len(gids), n), NAN, dtype=out_dtype, device=DEV)
    res = m_grouped_fp8_contiguous_triton(a, sfa, b, sfb, out, ids, block_m=block_m, swap_ab=block_m < 64)
    assert res is out
    want = ref.m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, torch.empty_like(out), ids)
    if out_dtype == torch.float32:
        assert calc_diff(out, want) < 1e-6
    val, mag = _exact_rows(a, sfa, b, sfb, gids)
    assert_gemm_close(out.cpu(), val, mag, k)
    pad = torch.tensor(gids) < 0
    assert (out.cpu()[pad] == 0).all(), "padding rows must be zero"


@runnable
def test_contiguous_ids_out_of_range_zeroed() -> None:
    """Ids >= g are not validated (no host sync): the kernel zeroes those rows like padding, reads nothing."""
    gids = [0] * 10 + [5] * 6 + [1] * 8  # 5 is outside the 2 groups
    a, sfa = _acts((len(gids),), 128, False, seed=71)
    b, sfb = _weights(2, 32, 128, False, seed=72)
    ids = torch.tensor(gids, dtype=torch.int32, device=DEV)
    out = torch.full((len(gids), 32), NAN, dtype=torch.float32, device=DEV)
    m_grouped_fp8_contiguous_triton(a, sfa, b, sfb, out, ids, block_m=16)
    bad = ids >= 2
    assert torch.equal(out[bad], torch.zeros_like(out[bad]))
    val, mag = _exact_rows(a, sfa, b, sfb, [g if g < 2 else -1 for g in gids])
    assert_gemm_close(out[~bad].cpu(), val[~bad.cpu()], mag[~bad.cpu()], 128)


@runnable
@pytest.mark.parametrize(("counts", "m_max", "expected_m"), [([0, 5, 17], 17, 8), ([32, 0, 1], 32, 32)])
def test_masked(counts: list[int], m_max: int, expected_m: int) -> None:
    n, k = 64, 256
    g = len(counts)
    a, sfa = _acts((g, m_max), k, False, seed=m_max)
    b, sfb = _weights(g, n, k, True, seed=m_max + 1)
    cnt = torch.tensor(counts, dtype=torch.int32, device=DEV)
    out = torch.full((g, m_max, n), NAN, dtype=torch.float32, device=DEV)
    m_grouped_fp8_masked_triton(a, sfa, b, sfb, out, cnt, expected_m)
    want = ref.m_grouped_fp8_gemm_nt_masked(a, sfa, b, sfb, torch.full_like(out, NAN), cnt)
    for gi, c in enumerate(counts):
        assert out[gi, c:].isnan().all(), "rows past masked_m must stay untouched"
        if c:
            assert calc_diff(out[gi, :c], want[gi, :c]) < 1e-6
            val, mag = _exact_rows(a[gi, :c], sfa[gi, :c], b, sfb, [gi] * c)
            assert_gemm_close(out[gi, :c].cpu(), val, mag, k)


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        ({"k": 136}, ValueError, "k"),
        ({"block_n": 256}, ValueError, "block_n"),
        ({"sfb_shape": (2, 1, 3)}, ValueError, "scale shapes"),
        ({"out_dtype": torch.float16}, ValueError, "out"),
    ],
)
def test_bad_inputs(kw: dict, exc: type[Exception], match: str) -> None:
    k = kw.get("k", 256)
    a, sfa = _acts((4,), k, False, seed=1, dev="cpu")
    b, sfb = _weights(2, 64, k, False, seed=2, dev="cpu")
    if "sfb_shape" in kw:
        sfb = torch.ones(kw["sfb_shape"])
    out = torch.empty(4, 64, dtype=kw.get("out_dtype", torch.bfloat16))
    ids = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(exc, match=match):
        m_grouped_fp8_contiguous_triton(a, sfa, b, sfb, out, ids, block_n=kw.get("block_n"))


@pytest.mark.gpu
@pytest.mark.parametrize(("rows_per_group", "n", "k"), [(128, 4096, 4096), (256, 4096, 2048), (8, 2048, 4096)])
def test_gpu_contiguous_aligned(rows_per_group: int, n: int, k: int) -> None:
    """DeepGEMM's aligned layout (8 groups, one padded to -1 rows) on V4 expert shapes, bf16 out."""
    if not CUDA:
        pytest.skip("needs a CUDA GPU")
    g = 8
    gids = [gi for gi in range(g) for _ in range(rows_per_group)]
    gids[-3:] = [-1, -1, -1]
    a, sfa = _acts((len(gids),), k, False, seed=rows_per_group)
    b, sfb = _weights(g, n, k, False, seed=n)
    ids = torch.tensor(gids, dtype=torch.int32, device="cuda")
    out = torch.full((len(gids), n), NAN, dtype=torch.bfloat16, device="cuda")
    m_grouped_fp8_contiguous_triton(a, sfa, b, sfb, out, ids, expected_m=rows_per_group)
    want = ref.m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, torch.empty_like(out), ids)
    assert torch.isfinite(out).all()
    assert calc_diff(out, want) < 1e-5


@pytest.mark.gpu
def test_gpu_masked_graph_replay() -> None:
    """Masked layout captured in a CUDA graph; new counts (0 and m_max included) take effect on replay."""
    if not CUDA:
        pytest.skip("needs a CUDA GPU")
    g, m_max, n, k = 4, 64, 2048, 4096
    a, sfa = _acts((g, m_max), k, True, seed=5)
    b, sfb = _weights(g, n, k, True, seed=6)
    cnt = torch.tensor([3, 3, 3, 3], dtype=torch.int32, device="cuda")
    out = torch.full((g, m_max, n), NAN, dtype=torch.bfloat16, device="cuda")
    m_grouped_fp8_masked_triton(a, sfa, b, sfb, out, cnt, 8)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        m_grouped_fp8_masked_triton(a, sfa, b, sfb, out, cnt, 8)
    cnt.copy_(torch.tensor([0, 64, 1, 17], dtype=torch.int32))
    out.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize()
    want = ref.m_grouped_fp8_gemm_nt_masked(a, sfa, b, sfb, torch.full_like(out, NAN), cnt)
    for gi, c in enumerate([0, 64, 1, 17]):
        assert out[gi, c:].isnan().all()
        if c:
            assert calc_diff(out[gi, :c], want[gi, :c]) < 1e-5
