"""Session 10: fp8_db with TMA multicast of B across a 2-CTA cluster (`multicast=True`, `fp8_db_m4` / `fp8_db_m5`;
csrc/cuda/dg_fp8_db_mc.cuh).

CPU: the variant is registered (VARIANTS, names) and validated like the others. GPU (@pytest.mark.gpu): BIT-equal to
`fp8_db_s5` (same consumers, same products and promotion order; the producer only changes where the B bytes come
from) and within calc_diff 1e-5 of the float64 oracle (test_dg_fp8_db.py's bound) on: a pair whose second m tile lies
wholly past its group end (loads, computes, never stores), a group of 1 row (m = 1), odd / single m-tile groups, empty
groups, k = 128 (one block per tile: the drain only), k = 7168 (the ring wraps), one cluster walking every pair tile,
an odd CTA count (rounded down to whole clusters), rows past offs[-1] never written, and a large grouped case.
The new mbarrier protocol (peer releases, multicast transaction bytes) waits with the 2^30-poll watchdog (__trap): run
this file in its OWN pytest process on the GPU (a trap poisons the CUDA context).
"""

from __future__ import annotations

import pytest
import torch
from test_dg_fp8_db import _assert_bits, _assert_close, _good, _ops, _oracle

from deepinfer.deep_gemm.backends.cuda import cuda_fp8_db as db

MC_VARIANTS = ((4, 0, 2), (5, 0, 2))


def test_mc_variants_registered() -> None:
    for v in MC_VARIANTS:
        assert v in db.VARIANTS
    assert db.variant_name(4, False, 2) == "fp8_db_m4" and db.variant_name(5, False, 2) == "fp8_db_m5"
    assert db.variant_name(4, False, True) == "fp8_db_t4"  # tma=True is still the plain TMA kernel


def test_mc_valid_operands_reach_the_launch() -> None:
    exc = ValueError if db.available() else RuntimeError
    with pytest.raises(exc, match="CUDA tensor|not built"):
        db.m_grouped_fp8_gemm_nt_offsets_db(**_good(), stages=4, multicast=True)


# ---------------------------------------------------------------- GPU

needs_kernel = pytest.mark.skipif(not db.available(), reason="_C built without the fp8_db kernel")


def _run(ops: tuple, stages: int, ctas: int = 0, multicast: bool = False, tma: bool = False) -> torch.Tensor:
    a, sfa, b, sfb, offs = ops
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.bfloat16, device=a.device)
    db.m_grouped_fp8_gemm_nt_offsets_db(a, sfa, b, sfb, offs, out, stages=stages, ctas=ctas, tma=tma,
                                        multicast=multicast)  # fmt: skip
    torch.cuda.synchronize()
    return out


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("stages", [4, 5])
@pytest.mark.parametrize(
    ("counts", "n", "k", "extra", "ctas"),
    [
        ([3, 0, 130, 64, 1], 256, 512, 3, 0),  # pairs with a spare half (3, 64, 1 rows) and a split half (130)
        ([1], 128, 128, 0, 0),  # m = 1, k = 128: rank 1's tile wholly past the group and past m
        ([200, 17], 384, 128, 0, 5),  # k = 128, ctas 5 -> 2 clusters
        ([0, 0, 40], 128, 7168, 0, 0),  # leading empty groups, 56 k blocks: the ring wraps many times
        ([300], 384, 1536, 0, 2),  # one cluster walks every pair tile
        ([256] * 6, 512, 2048, 0, 0),  # whole pairs
        ([5, 9, 140, 384], 128, 384, 3, 3),  # odd block count; rows past offs[-1] loaded, never stored
    ],
)
def test_gpu_mc_bit_equal_and_oracle(stages: int, counts: list[int], n: int, k: int, extra: int, ctas: int) -> None:
    ops = _ops(counts, n, k, 202 + sum(counts) + k + stages, "cuda", extra=extra)
    what = f"multicast stages={stages} counts={counts} n={n} k={k} extra={extra} ctas={ctas}"
    got = _run(ops, stages, ctas=ctas, multicast=True)
    _assert_bits(got, _run(ops, 5), what + " vs fp8_db_s5")
    _assert_close(got, _oracle(*ops[:4], counts), what)
    assert got[sum(counts) :].isnan().all(), f"{what}: rows past offs[-1] were written"


@pytest.mark.gpu
@needs_kernel
def test_gpu_mc_large_bit_equal_t4() -> None:
    """Many pair tiles per cluster (16 experts x 256 rows, 2048 x 2048: 256 pair tiles over ~66 clusters; operands
    drawn on the CPU, hence not the benchmark's 64 experts x 4096): bit-equal to fp8_db_t4, repeatable."""
    counts = [256] * 16
    ops = _ops(counts, 2048, 2048, 7, "cuda", extra=0)
    got = _run(ops, 4, multicast=True)
    _assert_bits(got, _run(ops, 4, tma=True), "fp8_db_m4 vs fp8_db_t4 (16 x 256 x 2048 x 2048)")
    _assert_bits(_run(ops, 4, multicast=True), got, "fp8_db_m4 run twice")
