"""The compiled W4A8 FP8-wgmma grouped GEMM (`backends/cuda/cuda_w4a8_grouped.py`, csrc/cuda/dg_w4a8_grouped.cuh).

CPU: the numerics the kernel relies on (the e4m3 table of code * 2^(6 - d) is exact for d <= 14 and not beyond,
normal for d <= 11; a Python model of the byte-permute conversion on every byte; a float64 model of the 128-deep
block promotion equals the reference dequantisation), the impl names and the API routing without `_C`, an sm_90a
nvcc compile check. `gpu`: every compiled variant vs float64 (calc_diff < 1e-3 and an element-wise bound from the
FP8 accumulation), adversarial scales (the exact per-32 path), NaN scale bytes, rows past offs untouched, CUDA-graph
replay, the API's impl choice.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest
import torch
from dg_testing import act64, calc_diff, gen

from deepinfer.deep_gemm import reference_w4a8 as ref
from deepinfer.deep_gemm.api_w4a8 import IMPL_ENV
from deepinfer.deep_gemm.api_w4a8 import m_grouped_fp8_fp4_gemm_nt_offsets as gemm
from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_grouped as cw

FP8 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
_CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc" / "cuda"
MAGS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # |e2m1 code c|, c = 0..7
MAX_SHIFT = 11  # the kernel's fast-path bound on s_max - s_j (kMaxShift)


def _operands(counts: list[int], n: int, k: int, g: torch.Generator, sb=(118, 130), extra_rows: int = 3) -> tuple:
    """a e4m3 [m, k], sfa fp32 [m, k/128], packed uint8 [G, n, k/2], E8M0 bytes uint8 [G, n, k/32], offs int32 [G]."""
    m = sum(counts) + extra_rows
    a = (torch.randn((m, k), generator=g) * 4).to(FP8)
    sfa = torch.rand((m, k // 128), generator=g) + 0.5
    packed = torch.randint(0, 256, (len(counts), n, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(sb[0], sb[1] + 1, (len(counts), n, k // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    return a, sfa, packed, scales, offs


def _codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., k/2] -> e2m1 codes int64 [..., k] (low nibble first)."""
    p = packed.to(torch.int64)
    return torch.stack([p & 15, p >> 4], dim=-1).flatten(-2)


def _code_values(codes: torch.Tensor) -> torch.Tensor:
    mag = torch.tensor(MAGS, dtype=torch.float64)[codes & 7]
    return torch.where(codes >= 8, -mag, mag)


# ---------------------------------------------------------------- CPU: numerics the kernel relies on


def _e4m3_exact(x: float) -> bool:
    return float(torch.tensor([x], dtype=torch.float64).to(FP8).double()) == x


def test_table_exact_up_to_shift_14() -> None:
    """|code| * 2^(6 - d) is an e4m3 value for every code and d in 0..14 (the kernel's fast-path bound), and not for
    d = 15 (0.5 * 2^-9 is below the smallest e4m3 subnormal): the bound is tight."""
    for d in range(15):
        bad = [c for c, v in enumerate(MAGS) if not _e4m3_exact(v * 2.0 ** (6 - d))]
        assert not bad, f"d={d}: codes {bad} not exact in e4m3"
    assert not _e4m3_exact(0.5 * 2.0**-9)
    assert max(MAGS) * 2.0**6 <= 448.0
    # the kernel's bound (kMaxShift = 11): every non-zero stored weight is a normal e4m3 value (>= 2^-6)
    (bound,) = re.findall(r"kMaxShift = (\d+);", (_CSRC / "dg_w4a8_grouped.cuh").read_text())
    assert int(bound) == MAX_SHIFT and min(MAGS[1:]) * 2.0 ** (6 - MAX_SHIFT) == 2.0**-6


def _byte_perm(x: int, y: int, s: int) -> int:
    """CUDA __byte_perm with 3-bit selectors (all the kernel uses)."""
    src = (y << 32) | x
    return sum(((src >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def _codes_to_e4m3(w: int, lo: int, hi: int) -> tuple[int, int]:
    """Python copy of the kernel's codes_to_e4m3 (8 codes of a word -> 8 e4m3 bytes)."""
    x = _byte_perm(lo, hi, w & 0x7777) | _byte_perm(0x8000, 0, (w >> 3) & 0x1111)
    y = _byte_perm(lo, hi, (w >> 16) & 0x7777) | _byte_perm(0x8000, 0, (w >> 19) & 0x1111)
    return x, y


@pytest.mark.parametrize("d", [0, 6, 14])
def test_byte_permute_conversion(d: int) -> None:
    """Every byte value in every byte position: the 8 output bytes are the e4m3 encodings of code * 2^(6 - d), in
    element order (low nibble = even element), -0 for code 8."""
    table = [int(torch.tensor([v * 2.0 ** (6 - d)]).to(FP8).view(torch.uint8)) for v in MAGS]
    lo = sum(b << (8 * i) for i, b in enumerate(table[:4]))
    hi = sum(b << (8 * i) for i, b in enumerate(table[4:]))
    for byte in range(256):
        for pos in range(4):
            w = (byte << (8 * pos)) | (0x21 << (8 * ((pos + 1) % 4)))
            x, y = _codes_to_e4m3(w, lo, hi)
            out = torch.tensor([(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)],
                               dtype=torch.uint8).view(FP8).double()  # fmt: skip
            codes = torch.tensor([(w >> (4 * i)) & 15 for i in range(8)])
            want = _code_values(codes) * 2.0 ** (6 - d)
            assert torch.equal(out, want), (byte, pos, out, want)
            signs = [((v >> 7) & 1) for v in ((x >> (8 * i)) & 0xFF for i in range(4))]
            assert signs == [int(c >= 8) for c in codes[:4]]


def _block_model(a, sfa, packed, scales, rel: bool = False) -> torch.Tensor:  # noqa: ANN001
    """float64 model of the kernel's numerics for one group: per 128-deep block, e4m3 weights code * 2^(6 - d),
    d = ref - s_j (fast path, every row with d <= MAX_SHIFT; ref = the block's s_max, or with `rel` the row's s_max
    over all k unless some row spans > 100 binades) or code * 2^6 per 32-group (slow path), then promotion by
    sfa * 2^(s_j - 133) (rel: relative factors, the column factor 2^(ref - 133) applied once at the end). [m, n]."""
    x = a.double()  # e4m3 values
    codes = _code_values(_codes(packed))  # [n, k]
    s = scales.to(torch.int64)  # [n, k/32]
    m, k = a.shape
    rel = rel and bool(((s.max(dim=1).values - s.min(dim=1).values) <= 100).all())
    sref = s.max(dim=1).values
    out = torch.zeros(m, packed.shape[0], dtype=torch.float64)
    for kb in range(k // 128):
        sb = s[:, 4 * kb : 4 * kb + 4]
        ref = sref if rel else sb.max(dim=1).values
        slow = bool(((ref[:, None] - sb) > MAX_SHIFT).any())
        xs = x[:, 128 * kb : 128 * kb + 128] * sfa[:, kb : kb + 1].double()
        unit = torch.zeros_like(ref, dtype=torch.float64) if rel else None  # rel: exponents relative to ref
        for j in range(1 if not slow else 4):
            if slow:
                w8 = codes[:, 128 * kb + 32 * j : 128 * kb + 32 * j + 32] * 2.0**6
                f = torch.exp2((sb[:, j] - (ref if rel else 133)).double())
                xj = xs[:, 32 * j : 32 * j + 32]
            else:
                d = (ref[:, None] - sb).repeat_interleave(32, dim=1)
                w8 = codes[:, 128 * kb : 128 * kb + 128] * torch.exp2((6 - d).double())
                f = torch.exp2(unit if rel else (ref - 133).double())
                xj = xs
            assert torch.equal(w8.to(FP8).double(), w8), "an e4m3 weight tile is not exact"
            out += (xj @ w8.T) * f[None, :]
    return out * torch.exp2((sref - 133).double())[None, :] if rel else out


@pytest.mark.parametrize("rel", [False, True], ids=["abs", "rel"])
@pytest.mark.parametrize("sb", [(118, 130), (100, 111), (60, 200), (70, 130)])
def test_block_model_vs_reference(sb: tuple[int, int], rel: bool) -> None:
    """The float64 model of the kernel's per-block numerics (fast path for narrow scale spreads, the per-32 path for
    the wide ones; with rel: relative to the row's largest scale, (60, 200) spans > 100 so runs absolute) equals
    the float64 dequantised product to rounding (relative 1e-12)."""
    a, sfa, packed, scales, _ = _operands([7], 16, 512, gen(sb[0]), sb)
    want = act64(a, sfa)[:7] @ _dq64(packed[0], scales[0]).T
    got = _block_model(a[:7], sfa[:7], packed[0], scales[0], rel)
    assert float((got - want).abs().max()) <= 1e-12 * float(want.abs().max())


def _dq64(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return _code_values(_codes(packed)) * torch.exp2(scales.double() - 127).repeat_interleave(32, dim=1)


# ---------------------------------------------------------------- CPU: names, routing, compile


def test_variant_names_round_trip() -> None:
    assert cw.parse_variant("cuda") == cw.DEFAULT_VARIANT
    for v in cw.W4A8_CUDA_VARIANTS:
        assert cw.parse_variant(cw.variant_name(v)) == v
    assert cw.variant_name((2, 4, 1)) == "cuda_wg2s4r"
    with pytest.raises(ValueError, match="cuda_wg2s4"):
        cw.parse_variant("cuda_wg3s9")


def test_variant_list_in_sync_with_cu() -> None:
    """kEntries: DG_W4A8_VARIANT(wg, stages, rel), DG_W4A8_WS_VARIANT(stages, pipe) (= (2, stages, 2 + pipe)) and
    DG_W4A8_RS_VARIANT(stages, tokens) (= (2, stages, 4 / 5 for 128 / 256 tokens)), DG_W4A8_RSF_VARIANT(stages,
    tokens) (= (2, stages, 6 / 7)), DG_W4A8_RSFC_VARIANT(stages) (= (2, stages, 8)), DG_W4A8_RSE_VARIANT(stages,
    tokens) (= (2, stages, 9 / 10 for 256 / 128 tokens)), DG_W4A8_RSP_VARIANT(stages, code, scheme) (= (2, stages,
    scheme))."""
    pat = (r"DG_W4A8_VARIANT\((\d+),\s*(\d+),\s*(\d+)\)|DG_W4A8_WS_VARIANT\((\d+),\s*(\d+)\)"
           r"|DG_W4A8_RS(F?)_VARIANT\((\d+),\s*(\d+)\)|DG_W4A8_RSFC_VARIANT\((\d+)\)"
           r"|DG_W4A8_RSE_VARIANT\((\d+),\s*(\d+)\)|DG_W4A8_RSP_VARIANT\((\d+),\s*\w+,\s*(\d+)\)")  # fmt: skip

    def entry(t: tuple[str, ...]) -> tuple[int, int, int]:
        if t[11]:
            return (2, int(t[11]), int(t[12]))
        if t[9]:
            return (2, int(t[9]), 9 if t[10] == "256" else 10)
        if t[8]:
            return (2, int(t[8]), 8)
        if t[6]:
            return (2, int(t[6]), (6 if t[5] else 4) + (t[7] != "128"))
        return (2, int(t[3]), 2 + int(t[4])) if t[3] else (int(t[0]), int(t[1]), int(t[2]))

    from_cu = [entry(t) for t in re.findall(pat, (_CSRC / "dg_w4a8_grouped.cu").read_text())]
    assert from_cu == list(cw.W4A8_CUDA_VARIANTS)


@pytest.mark.parametrize("impl", [None, "cuda", "cuda_wg1s4", "cuda_wg2s4r", "triton", "auto"])
def test_api_impl_on_cpu_runs_reference(impl: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU tensors every impl choice runs the reference (the CUDA kernel needs CUDA tensors and `_C`)."""
    monkeypatch.delenv("DEEPINFER_DEEP_GEMM_BACKEND", raising=False)
    monkeypatch.setenv(IMPL_ENV, "cuda")
    a, sfa, packed, scales, offs = _operands([5, 0, 9], 32, 256, gen(3))
    got = gemm((a, sfa), (packed, scales), offs, impl=impl)
    want = torch.empty_like(got)
    ref.m_grouped_fp8_fp4_gemm_nt_offsets(a, sfa, packed, scales, offs, want)
    assert torch.equal(got[:14], want[:14])


def test_api_bad_impl(monkeypatch: pytest.MonkeyPatch) -> None:
    a, sfa, packed, scales, offs = _operands([2], 32, 128, gen(4))
    with pytest.raises(ValueError, match="impl"):
        gemm((a, sfa), (packed, scales), offs, impl="cudnn")
    monkeypatch.setenv(IMPL_ENV, "nope")
    with pytest.raises(ValueError, match=IMPL_ENV):
        gemm((a, sfa), (packed, scales), offs)


def test_wrapper_without_kernel_raises() -> None:
    if cw.available():
        pytest.skip("_C has the kernel")
    a, sfa, packed, scales, offs = _operands([2], 32, 128, gen(5))
    with pytest.raises(RuntimeError, match="not built"):
        cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, torch.empty(5, 32))


def test_sm90_compile() -> None:
    """nvcc 13 builds dg_w4a8_grouped.cu for sm_90a (first variant; all with DEEPINFER_DG_NVCC_ALL=1): no spills,
    no stack frame, <= 255 registers, no wgmma serialisation warning (skipped without nvcc)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    every = os.environ.get("DEEPINFER_DG_NVCC_ALL") == "1"
    cmd = [nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c",
           "--expt-relaxed-constexpr", str(_CSRC / "dg_w4a8_grouped.cu"), "-o", os.devnull,
           *([] if every else ["-DDG_W4A8_ONLY_FIRST"])]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", res.stderr)]
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", res.stderr)]
    # + 1: the rel variants' pre-pass kernel (w4a8_sref_kernel) is always built; the ws / rs kernels are in
    # dg_w4a8_ws.cu / dg_w4a8_rs.cu
    n_here = len(cw.W4A8_CUDA_VARIANTS) - len(cw.WS_VARIANTS) - len(cw.RS_VARIANTS)
    assert len(regs) == (n_here if every else 1) + 1, res.stderr[-2000:]
    assert max(regs) <= 255 and max(frames) == 0, res.stderr[-3000:]
    assert "C7510" not in res.stderr and "C7508" not in res.stderr, res.stderr[-3000:]


# ---------------------------------------------------------------- GPU

needs_kernel = pytest.mark.skipif(not cw.available(), reason="_C built without the W4A8 CUDA kernel")


def _run_cuda(ops: tuple, variant: tuple[int, int, int], counts: list[int], ctas: int = 0) -> torch.Tensor:
    """The kernel on CUDA copies of `ops`; out NaN-filled first. Returns out (CPU)."""
    a, sfa, packed, scales, offs = (t.cuda() for t in ops)
    out = torch.full((a.shape[0], packed.shape[1]), float("nan"), dtype=torch.bfloat16, device="cuda")
    cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, out, variant, ctas)
    torch.cuda.synchronize()
    return out.cpu()


def _check(out: torch.Tensor, ops: tuple, counts: list[int], what: str, elementwise: bool = True) -> None:
    """Rows of the groups vs the float64 value (calc_diff < 1e-3 + an element-wise bound derived from the FP8
    accumulation and the bf16 output); rows past offs[-1] untouched (NaN)."""
    a, sfa, packed, scales, _ = ops
    rows = sum(counts)
    x64 = act64(a, sfa)
    val = torch.zeros(rows, packed.shape[1], dtype=torch.float64)
    mag = torch.zeros_like(val)
    start = 0
    for i, c in enumerate(counts):
        w = _dq64(packed[i], scales[i])
        val[start : start + c] = x64[start : start + c] @ w.T
        mag[start : start + c] = x64[start : start + c].abs() @ w.abs().T
        start += c
    d = calc_diff(out[:rows], val)
    assert d < 1e-3, f"{what}: calc_diff {d:.3e}"
    if elementwise:
        got = out[:rows].double()
        assert torch.isfinite(got).all(), f"{what}: non-finite values"
        # FP8 wgmma sums each 128-deep block with a reduced-precision internal accumulator (DeepSeek-V3 reports ~14
        # bits, up to 32 additions a block): allow 2^-9 of sum |x w| on top of the bf16 output rounding (2^-8 of the
        # value). A layout or scale bug errs by O(|value|) on most elements (|value| ~ sum |x w| / sqrt(k)).
        tol = 2.0**-8 * val.abs() + 2.0**-9 * mag
        worst = float(((got - val).abs() - tol).max())
        assert worst <= 0, f"{what}: calc_diff {d:.3e}; an element exceeds the FP8-accumulation bound by {worst:.3e}"
    assert out[rows:].isnan().all(), f"{what}: rows past offs[-1] were written"


@pytest.mark.gpu
@needs_kernel
def test_gpu_compiled_variants() -> None:
    assert cw.compiled_variants() == cw.W4A8_CUDA_VARIANTS


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", cw.W4A8_CUDA_VARIANTS, ids=cw.variant_name)
@pytest.mark.parametrize(
    ("counts", "n", "k", "ctas"),
    [
        ([3, 0, 130, 64, 1], 256, 512, 0),  # empty group, partial tiles, 2 m tiles in one group
        ([200, 17], 192, 256, 3),  # n not a multiple of 128 (tail tile), few CTAs: several tiles each
        ([0, 0, 40], 128, 1024, 0),  # leading empty groups
        ([5, 9, 140], 128, 128, 2),  # one k block per tile: the ring runs across tile boundaries every step
    ],
)
def test_gpu_vs_float64(variant: tuple[int, int, int], counts: list[int], n: int, k: int, ctas: int) -> None:
    ops = _operands(counts, n, k, gen(sum(counts) + n + k))
    out = _run_cuda(ops, variant, counts, ctas)
    _check(out, ops, counts, f"{cw.variant_name(variant)} counts={counts} n={n} k={k} ctas={ctas}")


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", cw.W4A8_CUDA_VARIANTS, ids=cw.variant_name)
@pytest.mark.parametrize(
    "sb", [(113, 127), (70, 130), (30, 200), (1, 40)], ids=["spread14", "spread60", "adversarial", "tiny"]
)
def test_gpu_adversarial_scales(variant: tuple[int, int, int], sb: tuple[int, int]) -> None:
    """Scale bytes spread up to 14 binades (blocks up to the fast path's bound 11 and just past it), 60 (rel variants:
    the per-32 path with relative factors), far beyond it (30..200: the per-32 path; rel variants: every row past
    kRelSpan, so the absolute scheme; wider would overflow fp32 in the reference itself) and tiny (fp32 subnormal
    promotion factors)."""
    counts = [70, 5]
    ops = _operands(counts, 128, 512, gen(sb[1]), sb)
    out = _run_cuda(ops, variant, counts)
    _check(out, ops, counts, f"{cw.variant_name(variant)} scales {sb}", elementwise=sb != (1, 40))


@pytest.mark.gpu
@needs_kernel
def test_gpu_mixed_slow_rows() -> None:
    """One weight row with a 20-binade spread in one k block (its whole tile takes the per-32 path for that block),
    where the small-scale group carries the only non-zero codes: a wrong fast path would zero that column."""
    counts = [33]
    a, sfa, packed, scales, offs = _operands(counts, 128, 256, gen(11))
    scales[0, 5, 0:4] = torch.tensor([140, 120, 120, 120], dtype=torch.uint8)
    packed[0, 5, 0:16] = 0  # group 0 (largest scale) all zero codes
    ops = (a, sfa, packed, scales, offs)
    out = _run_cuda(ops, cw.DEFAULT_VARIANT, counts)
    _check(out, ops, counts, "mixed slow rows")


@pytest.mark.gpu
@needs_kernel
def test_gpu_nan_scale_byte() -> None:
    """E8M0 byte 255 (NaN) in one weight row gives NaN in that output column only, as the reference."""
    counts = [9]
    a, sfa, packed, scales, offs = _operands(counts, 128, 256, gen(12))
    scales[0, 7, 3] = 255
    out = _run_cuda((a, sfa, packed, scales, offs), cw.DEFAULT_VARIANT, counts)
    assert out[:9, 7].isnan().all()
    keep = [c for c in range(128) if c != 7]
    assert not out[:9, keep].isnan().any()


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", cw.W4A8_CUDA_VARIANTS, ids=cw.variant_name)
def test_gpu_v4_shape_vs_reference(variant: tuple[int, int, int], v4_case: tuple) -> None:
    """A V4 expert shape (n 4096, k 4096) with 8 experts of 256 tokens vs the API's reference path on the GPU."""
    (a, sfa, packed, scales, offs), want = v4_case
    out = torch.empty_like(want)
    cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, out, variant)
    d = calc_diff(out, want)
    assert d < 1e-4, f"{cw.variant_name(variant)}: calc_diff {d:.3e} vs the reference"


@pytest.fixture(scope="module")
def v4_case() -> tuple:
    """GPU operands of 8 experts x 256 tokens, n = k = 4096, and the reference output."""
    ops = tuple(t.cuda() for t in _operands([256] * 8, 4096, 4096, gen(13), extra_rows=0))
    want = torch.empty(ops[0].shape[0], 4096, dtype=torch.bfloat16, device="cuda")
    ref.m_grouped_fp8_fp4_gemm_nt_offsets(*ops, want)
    return ops, want


@pytest.mark.gpu
@needs_kernel
def test_gpu_cuda_graph_replay() -> None:
    """Captured once, replayed with new offs (groups 0 and 2 empty): offs is read on the device only."""
    counts = [4, 4, 4, 4]
    a, sfa, packed, scales, offs = (t.cuda() for t in _operands(counts, 128, 256, gen(14), extra_rows=0))
    out = torch.full((16, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, out)
    offs.copy_(torch.tensor([0, 1, 1, 9], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = torch.empty_like(out)
    ref.m_grouped_fp8_fp4_gemm_nt_offsets(a, sfa, packed, scales, offs, want)
    assert calc_diff(out[:9], want[:9]) < 1e-5
    assert out[9:].isnan().all()


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("impl", ["cuda", "cuda_wg1s4", "cuda_wg2s4r"])
def test_gpu_api_impl_choice(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """impl= and the env choice run the CUDA kernel: bit-equal to the direct call of the same variant."""
    monkeypatch.delenv("DEEPINFER_DEEP_GEMM_BACKEND", raising=False)
    counts = [50, 0, 77]
    a, sfa, packed, scales, offs = (t.cuda() for t in _operands(counts, 256, 512, gen(15)))
    direct = torch.empty(a.shape[0], 256, dtype=torch.bfloat16, device="cuda")
    cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, direct, cw.parse_variant(impl))
    got = gemm((a, sfa), (packed, scales.view(E8M0)), offs, impl=impl)
    assert torch.equal(got[:127], direct[:127])
    monkeypatch.setenv(IMPL_ENV, impl)
    got_env = gemm((a, sfa), (packed, scales), offs)
    assert torch.equal(got_env[:127], direct[:127])


def test_auto_picks_by_rows_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Default ("auto" = "rows"): Triton below 64 rows per group, cuda_wg1s4 from 64, cuda_rs2s4n256 from 256
    (session 8); an explicit impl or a Triton `config` wins; `expected_m` is the rows hint."""
    from deepinfer.deep_gemm import api_w4a8 as api

    monkeypatch.delenv(IMPL_ENV, raising=False)
    parse = cw.parse_variant
    assert api._cuda_variant(None, None, 63) is None
    assert api._cuda_variant(None, None, 64) == parse("cuda_wg1s4")
    assert api._cuda_variant("auto", None, 255) == parse("cuda_wg1s4")
    assert api._cuda_variant(None, None, 256) == parse("cuda_rs2s4n256")
    assert api._cuda_variant("triton", None, 1024) is None
    assert api._cuda_variant("cuda_wg1s4", None, 1024) == parse("cuda_wg1s4")
    monkeypatch.setenv(IMPL_ENV, "triton")
    assert api._cuda_variant(None, None, 1024) is None
