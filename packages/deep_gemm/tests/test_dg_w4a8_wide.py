"""The W4A8 wide kernel (`backends/cuda/cuda_w4a8_wide.py`, csrc/cuda/dg_w4a8_wide.cuh) and its weight format
(`backends/cuda/w4a8_wide_pack.py`).

CPU: the prepared format decodes (`dequant_w4a8_wide`, which emulates the kernel's conversion: table, nibble
permutation, sign bits) to EXACTLY the reference dequantisation on fresh random codes and scales, at the 11-binade
bound too; the lossless flag (12 binades, the NaN byte 255 -> False; groups of zeros do not count); validation
errors name the argument; the API with a prepared weight on CPU equals the call with (packed, scales); the impl
routing; an sm_90a nvcc compile without spills. `gpu`: the kernel's output is BIT-equal to the FP8 wide kernel
(fp8_wide_t3: the same consumers) fed the e4m3 operand the producer is meant to write (`e4m3_operand`), so the bulk
copies, the conversion and the ring protocol are checked byte for byte; and within the float64-oracle bound on
ragged groups (empty groups, m % 128 != 0, rows past offs[-1] untouched). Run in its own pytest process on the GPU.
"""

from __future__ import annotations

import re

import pytest
import torch
from dg_testing import act64, calc_diff, fp4_group_weights, gen, rand_fp8, rand_scales
from test_dg_fp8_db import _ptxas_entries, compile_fp8_db

from deepinfer.deep_gemm import api_w4a8
from deepinfer.deep_gemm.backends.cuda import cuda_fp8_db as db
from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_wide as ww
from deepinfer.deep_gemm.backends.cuda import w4a8_wide_pack as wp

FP8 = torch.float8_e4m3fn
DIFF_LIMIT = 1e-5  # as test_dg_fp8_db: summation order + one bf16 rounding (a wrong block gives ~1e-2 .. 1)


def _weights(g: int, n: int, k: int, seed: int, lo: int = 118, hi: int = 129) -> tuple[torch.Tensor, torch.Tensor]:
    packed, scales, _ = fp4_group_weights([0] * g, n, k, gen(seed), sb=(lo, hi))
    return packed, scales


# ---------------------------------------------------------------- CPU


@pytest.mark.parametrize(
    ("g", "n", "k", "lo", "hi"), [(1, 256, 128, 120, 131), (2, 512, 384, 100, 111), (3, 256, 512, 0, 11)]
)
def test_prepared_decodes_exactly(g: int, n: int, k: int, lo: int, hi: int) -> None:
    """Every weight of a lossless prepared tensor decodes to the reference value (scale bytes spanning exactly 11
    binades included; (0, 11): the smallest E8M0 bytes, block scales down to 2^-133)."""
    packed, scales = _weights(g, n, k, g * n + k + lo, lo, hi)
    w = wp.prepare_w4a8_wide(packed, scales)
    assert w.lossless
    assert w.chunks.shape == (g, n // 256, k // 128, wp.CHUNK_BYTES) and w.sfb.shape == (g, n // 128, k // 128)
    got, want = wp.dequant_w4a8_wide(w), wp.reference_dequant(w)
    bad = (got != want) & ~(got.isnan() & want.isnan())
    assert not bad.any(), f"{int(bad.sum())} weights differ; first at {bad.nonzero()[0].tolist()}"


def test_zero_groups_do_not_count() -> None:
    """A group of (signed) zeros with a far-off scale byte neither sets the block exponent nor breaks losslessness."""
    packed, scales = _weights(1, 256, 256, 7)
    packed[0, 5, 16:32] = 0x88  # group 1 of row 5: -0 codes only
    scales[0, 5, 1] = 250
    w = wp.prepare_w4a8_wide(packed, scales)
    assert w.lossless
    assert torch.equal(wp.dequant_w4a8_wide(w), wp.reference_dequant(w))


@pytest.mark.parametrize(("byte", "row"), [(118 - 12, 3), (255, 200)])
def test_not_lossless(byte: int, row: int) -> None:
    """12 binades below the block's largest scale, or the E8M0 NaN byte, make the weight not lossless."""
    packed, scales = _weights(1, 256, 256, byte)
    packed[0, row, :] = 0x11  # nonzero codes everywhere in the row
    scales[0, row, 2] = byte  # (the block's other bytes are 118..129)
    assert not wp.prepare_w4a8_wide(packed, scales).lossless


@pytest.mark.parametrize(
    ("packed", "scales", "words"),
    [
        (torch.zeros(1, 128, 64, dtype=torch.uint8), torch.zeros(1, 128, 4, dtype=torch.uint8), "n % 256"),
        (torch.zeros(1, 256, 32, dtype=torch.uint8), torch.zeros(1, 256, 2, dtype=torch.uint8), "k % 128"),
        (torch.zeros(256, 64, dtype=torch.uint8), torch.zeros(256, 4, dtype=torch.uint8), "packed: expected"),
        (torch.zeros(1, 256, 64, dtype=torch.float32), torch.zeros(1, 256, 4, dtype=torch.uint8), "packed: expected"),
        (torch.zeros(1, 256, 64, dtype=torch.uint8), torch.zeros(1, 256, 3, dtype=torch.uint8), "scales: expected sh"),
        (torch.zeros(1, 256, 64, dtype=torch.uint8), torch.zeros(1, 256, 4), "scales: expected uint8"),
    ],
)  # fmt: skip
def test_prepare_validation(packed: torch.Tensor, scales: torch.Tensor, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        wp.prepare_w4a8_wide(packed, scales)


def _acts(m: int, k: int, seed: int, dev: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g_ = gen(seed)
    return rand_fp8((m, k), g_).to(dev), rand_scales((m, k // 128), g_, e8m0=False).to(dev)


def test_api_prepared_on_cpu_equals_raw() -> None:
    """On CPU the prepared weight runs the reference on its original operands: equal to the (packed, scales) call."""
    packed, scales = _weights(2, 256, 256, 3)
    a, sfa = _acts(9, 256, 4)
    offs = torch.tensor([4, 9], dtype=torch.int32)
    gemm = api_w4a8.m_grouped_fp8_fp4_gemm_nt_offsets
    got = gemm((a, sfa), api_w4a8.prepare_w4a8_wide(packed, scales), offs)
    assert torch.equal(got, gemm((a, sfa), (packed, scales), offs))


def test_wide_routing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prepared weights: "auto" from WIDE_MIN_ROWS rows per group, "wide" always, "triton" / a CUDA name never."""
    monkeypatch.delenv(api_w4a8.IMPL_ENV, raising=False)
    assert api_w4a8._wide_wanted(None, api_w4a8.WIDE_MIN_ROWS)
    assert not api_w4a8._wide_wanted(None, api_w4a8.WIDE_MIN_ROWS - 1)
    assert api_w4a8._wide_wanted("wide", 1) and not api_w4a8._wide_wanted("triton", 4096)
    assert not api_w4a8._wide_wanted("cuda_rs2s4n256", 4096)
    monkeypatch.setenv(api_w4a8.IMPL_ENV, "wide")
    assert api_w4a8._wide_wanted(None, 1)
    assert api_w4a8._cuda_variant("wide", None, 1024) is not None  # when it does not apply: what "rows" runs


def test_wrapper_validation() -> None:
    """The kernel wrapper names a bad argument before any launch (CPU tensors: the checks run first)."""
    w = wp.prepare_w4a8_wide(*_weights(1, 256, 256, 9))
    a, sfa = _acts(5, 256, 10)
    offs, out = torch.tensor([5], dtype=torch.int32), torch.empty(5, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=re.escape("a scales: expected contiguous torch.float32 (5, 2)")):
        ww.m_grouped_fp8_fp4_gemm_nt_offsets_wide(a, sfa[:, :1], w, offs, out)
    with pytest.raises(ValueError, match=re.escape("out: expected contiguous torch.bfloat16 (5, 256)")):
        ww.m_grouped_fp8_fp4_gemm_nt_offsets_wide(a, sfa, w, offs, out[:4])
    with pytest.raises(TypeError, match="w: expected a W4A8WideWeights"):
        ww.m_grouped_fp8_fp4_gemm_nt_offsets_wide(a, sfa, (w.packed, w.scales), offs, out)
    assert not ww.applies(a, w)  # CPU tensors


def test_w4a8_wide_sm90_compile() -> None:
    """nvcc 13 builds w4a8_wide_kernel for sm_90a: no spills / stack, 168 registers at launch (producer 56,
    consumers 224 after setmaxnreg), no wgmma serialisation warning."""
    res = compile_fp8_db()
    info = _ptxas_entries(res.stderr)
    mine = [v for name, v in info.items() if "w4a8_wide_kernel" in name]
    assert len(mine) == 1, list(info)
    assert "0 bytes spill stores, 0 bytes spill loads" in mine[0] and "0 bytes stack frame" in mine[0], mine[0]
    assert int(re.search(r"Used (\d+) registers", mine[0]).group(1)) <= 168, mine[0]
    assert not re.search(r"C75\d\d", res.stderr), res.stderr[-2000:]


# ---------------------------------------------------------------- GPU

needs_kernel = pytest.mark.skipif(not ww.available(), reason="_C built without the W4A8 wide kernel")


def _gpu_case(counts: list[int], n: int, k: int, seed: int, extra: int = 3) -> tuple:
    packed, scales = _weights(len(counts), n, k, seed)
    w = wp.prepare_w4a8_wide(packed.cuda(), scales.cuda())
    m = sum(counts) + extra
    a, sfa = _acts(m, k, seed + 1, "cuda")
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    return a, sfa, w, offs


def _nan_out(m: int, n: int) -> torch.Tensor:
    return torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize(
    ("counts", "n", "k", "ctas"),
    [
        ([3, 0, 130, 64, 1], 256, 512, 0),  # empty group, partial tiles, 2 m tiles in one group
        ([200, 17], 512, 128, 3),  # k = 128: one block per tile; few CTAs, several tiles each (raw ring wraps)
        ([0, 0, 40], 256, 7168, 0),  # leading empty groups, 56 k blocks
        ([300], 768, 1024, 2),  # m % 128 != 0, 2 CTAs
        ([256] * 6, 4096, 2048, 0),  # the down projection's n, full tiles
        ([5, 9, 140], 256, 384, 1),  # one CTA walks every tile
    ],
)
def test_gpu_bit_equal_fp8_wide_and_oracle(counts: list[int], n: int, k: int, ctas: int) -> None:
    a, sfa, w, offs = _gpu_case(counts, n, k, sum(counts) + n + k + ctas)
    rows = sum(counts)
    out = _nan_out(a.shape[0], n)
    ww.m_grouped_fp8_fp4_gemm_nt_offsets_wide(a, sfa, w, offs, out, ctas=ctas)
    want_bits = _nan_out(a.shape[0], n)
    db.m_grouped_fp8_gemm_nt_offsets_db(a, sfa, wp.e4m3_operand(w), w.sfb, offs, want_bits, stages=3, ctas=ctas,
                                        wide=True)  # fmt: skip
    torch.cuda.synchronize()
    what = f"counts={counts} n={n} k={k} ctas={ctas}"
    diff = out.view(torch.int16) != want_bits.view(torch.int16)
    diff[rows:] = False  # NaN rows past offs[-1] (bitwise equal anyway)
    assert not diff.any(), f"{what}: {int(diff.sum())} values differ from fp8_wide_t3, first {diff.nonzero()[0]}"
    assert out[rows:].isnan().all(), f"{what}: rows past offs[-1] were written"
    x = act64(a[:rows], sfa[:rows])
    wt = wp.reference_dequant(w).double()
    want = torch.zeros(rows, n, dtype=torch.float64, device="cuda")
    start = 0
    for i, c in enumerate(counts):
        want[start : start + c] = x[start : start + c] @ wt[i].T
        start += c
    d = calc_diff(out[:rows].double(), want)
    assert d < DIFF_LIMIT, f"{what}: calc_diff {d:.3e} vs the float64 oracle"


@pytest.mark.gpu
@needs_kernel
def test_gpu_api_routes_prepared_weights() -> None:
    """The public W4A8 call with a prepared weight runs the wide kernel from WIDE_MIN_ROWS rows per group (bit-equal
    to the wrapper), and a weight that is not lossless runs the exact kernels on its (packed, scales)."""
    counts = [api_w4a8.WIDE_MIN_ROWS] * 3
    a, sfa, w, offs = _gpu_case(counts, 512, 512, 77, extra=0)
    gemm = api_w4a8.m_grouped_fp8_fp4_gemm_nt_offsets
    got = gemm((a, sfa), w, offs, impl="auto")
    direct = ww.m_grouped_fp8_fp4_gemm_nt_offsets_wide(a, sfa, w, offs, torch.empty_like(got))
    assert torch.equal(got.view(torch.int16), direct.view(torch.int16))
    scales = w.scales.clone()
    scales[0, 0, 0] = 100  # 18 binades below the rest of its block: not lossless
    w2 = wp.prepare_w4a8_wide(w.packed, scales)
    assert not w2.lossless and not ww.applies(a, w2)
    got2 = gemm((a, sfa), w2, offs, impl="wide")
    want2 = gemm((a, sfa), (w.packed, scales), offs, impl="rows")
    assert torch.equal(got2.view(torch.int16), want2.view(torch.int16))


@pytest.mark.gpu
@needs_kernel
def test_gpu_cuda_graph_replay() -> None:
    """Captured once, replayed on new activations: equal to an eager call (tensor map by value, chunks by pointer)."""
    a, sfa, w, offs = _gpu_case([130, 0, 256], 256, 256, 5, extra=0)
    out = torch.empty(a.shape[0], 256, dtype=torch.bfloat16, device="cuda")
    ww.m_grouped_fp8_fp4_gemm_nt_offsets_wide(a, sfa, w, offs, out)  # warm-up (opt-in outside the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ww.m_grouped_fp8_fp4_gemm_nt_offsets_wide(a, sfa, w, offs, out)
    a2, sfa2 = _acts(a.shape[0], 256, 6, "cuda")
    a.copy_(a2)
    sfa.copy_(sfa2)
    graph.replay()
    want = ww.m_grouped_fp8_fp4_gemm_nt_offsets_wide(a, sfa, w, offs, torch.empty_like(out))
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
