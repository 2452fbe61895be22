"""Tests of the Triton `fp8_gemm_nt` kernel (backends/cuda/triton_fp8_gemm.py) against the reference and float64.

Without CUDA the kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1, set below before triton is imported;
e4m3 `tl.dot` is computed correctly there). GPU tests (V4 shapes, CUDA graph) are skipped without CUDA.

Bound vs the reference (fp32 out). Let y be the exact value of one output, mag = sum_i |a_i sa_i b_i sb_i| and u =
2^-24. The reference rounds a*sa and b*sb, multiplies (3 roundings per term) and sums k terms: |x_ref - y| <=
(k + 2) u mag (first order). The kernel sums exact e4m3 products in blocks of 128 (127 roundings), scales each
block sum (2 roundings) and adds ceil(k/128) blocks: |x_tri - y| <= (129 + ceil(k/128)) u mag <= (k + 2) u mag
for k >= 128. Hence |x_tri - x_ref| <= 2 (k + 2) u mag element-wise and

    calc_diff(x_tri, x_ref) = sum (x_tri - x_ref)^2 / sum (x_tri^2 + x_ref^2)
                            <= 4 (k + 2)^2 u^2 sum mag^2 / sum (x_tri^2 + x_ref^2),

a worst case computed from the data below (about 1e-7 for k = 384, far above what rounding-order noise gives,
~1e-14). For bf16 outputs both results are rounded once more; they differ (by one bf16 ulp) only where the two
fp32 values straddle a rounding boundary, which happens with probability ~ |x_tri - x_ref| / ulp, so the expected
calc_diff is ~ 2^-8 times the fp32 relative discrepancy (~1e-7 * 4e-3) -- not a worst-case bound, but 1e-6
leaves orders of magnitude of margin. Every case is also checked element-wise against float64
(`dg_testing.assert_gemm_close`: 2 (k + 2) u mag, plus one bf16 rounding for bf16 out).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from dg_testing import U, act64, assert_gemm_close, calc_diff, fp8_weight64, gen, rand_fp8, rand_scales  # noqa: E402

from deepinfer.deep_gemm import reference as ref  # noqa: E402
from deepinfer.deep_gemm.backends.cuda.triton_fp8_gemm import default_config, fp8_gemm_nt_triton  # noqa: E402

FP8 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
runnable = pytest.mark.skipif(
    not CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or TRITON_INTERPRET=1"
)
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def _operands(m: int, n: int, k: int, e8m0: bool, seed: int, device: str = DEV) -> tuple[torch.Tensor, ...]:
    """Random a [m, k], sfa [m, ceil(k/128)], b [n, k], sfb [ceil(n/128), ceil(k/128)], c fp32 [m, n]."""
    g = gen(seed)
    kb = -(-k // 128)
    a = rand_fp8((m, k), g)
    b = rand_fp8((n, k), g)
    sfa = rand_scales((m, kb), g, e8m0)
    sfb = rand_scales((-(-n // 128), kb), g, e8m0)
    c = torch.randn((m, n), generator=g) * 100
    return tuple(t.to(device) for t in (a, sfa, b, sfb, c))


def _poisoned(m: int, n: int, dtype: torch.dtype, device: str = DEV, pad: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN-filled buffer [m, n + pad] and its [m, n] view (row stride n + pad): writes past n would show."""
    buf = torch.full((m, n + pad), float("nan"), dtype=dtype, device=device)
    return buf, buf[:, :n]


def _check(
    out: torch.Tensor, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, c: torch.Tensor | None
) -> None:
    """out vs the reference (calc_diff < 1e-6 and, for fp32, <= the worst-case bound) and vs float64."""
    k = a.shape[1]
    want = ref.fp8_gemm_nt(a, sfa, b, sfb, torch.empty_like(out), c)
    da, db = act64(a.cpu(), sfa.cpu()), fp8_weight64(b.cpu(), sfb.cpu())
    exact = da @ db.T + (c.cpu().double() if c is not None else 0)
    mag = da.abs() @ db.abs().T + (c.cpu().double().abs() if c is not None else 0)
    got = out.cpu()
    assert torch.isfinite(got).all(), "output has non-finite values (unwritten poison?)"
    diff = calc_diff(got, want.cpu())
    assert diff < 1e-6, f"calc_diff vs reference {diff:.3e}"
    if out.dtype == torch.float32:
        x, y = got.double(), want.cpu().double()
        bound = float(4 * (k + 2) ** 2 * U**2 * (mag * mag).sum() / (x * x + y * y).sum())
        assert diff <= bound, f"calc_diff {diff:.3e} above the worst-case rounding bound {bound:.3e}"
    assert_gemm_close(got, exact, mag, k)


@runnable
@pytest.mark.parametrize("m", [1, 17, 64])
@pytest.mark.parametrize("n", [64, 130])
@pytest.mark.parametrize("k", [128, 256, 384])
@pytest.mark.parametrize("e8m0", [False, True])
def test_vs_reference_and_float64(m: int, n: int, k: int, e8m0: bool) -> None:
    """Default config (swap-AB for these m); with/without C and bf16/fp32 out alternate over the grid."""
    a, sfa, b, sfb, c = _operands(m, n, k, e8m0, seed=m * 1000 + n * 10 + k + e8m0)
    use_c = (m + k // 128 + e8m0) % 2 == 0
    out_dtype = torch.float32 if (n + k // 128) % 2 == 0 else torch.bfloat16
    c = c if use_c else None
    buf, out = _poisoned(m, n, out_dtype)
    res = fp8_gemm_nt_triton(a, sfa, b, sfb, out, c)
    assert res.data_ptr() == out.data_ptr()
    assert torch.isnan(buf[:, n:]).all(), "kernel wrote past column n"
    _check(out, a, sfa, b, sfb, c)


@runnable
@pytest.mark.parametrize(
    ("m", "n", "k", "block_m", "block_n", "swap_ab"),
    [
        (17, 130, 144, 16, 64, False),  # k not a multiple of 128: masked last k block
        (70, 200, 256, 64, 128, False),
        (130, 64, 128, 128, 128, False),
        (33, 130, 272, 32, 32, True),
        (5, 70, 128, 16, 16, True),
    ],
)
def test_explicit_configs(m: int, n: int, k: int, block_m: int, block_n: int, swap_ab: bool) -> None:
    """Both MMA orientations, every block_n size class, ragged m / n / k tails; mixed scale dtypes; C and fp32 out."""
    a, sfa, _, _, c = _operands(m, n, k, e8m0=False, seed=k + n)
    _, _, b, sfb, _ = _operands(m, n, k, e8m0=True, seed=k + n + 1)
    buf, out = _poisoned(m, n, torch.float32)
    fp8_gemm_nt_triton(a, sfa, b, sfb, out, c, block_m=block_m, block_n=block_n, swap_ab=swap_ab)
    assert torch.isnan(buf[:, n:]).all()
    _check(out, a, sfa, b, sfb, c)


@runnable
def test_c_aliases_out_and_mn_major_sfa() -> None:
    """c may alias out (bf16 in place); sfa may be a transposed (MN-major, DeepGEMM-style) view."""
    m, n, k = 17, 64, 256
    a, sfa, b, sfb, c = _operands(m, n, k, e8m0=False, seed=7)
    sfa_mn = sfa.T.contiguous().T  # same values, strides (1, m)
    acc = c.to(torch.bfloat16)
    want_c = acc.clone()
    fp8_gemm_nt_triton(a, sfa_mn, b, sfb, acc, acc)
    _check(acc, a, sfa, b, sfb, want_c)


@runnable
@pytest.mark.parametrize(("sa_byte", "sb_byte"), [(254, 1), (0, 200), (1, 127)])
def test_e8m0_extreme_bytes(sa_byte: int, sb_byte: int) -> None:
    """E8M0 bytes 254 (2^127), 1 (2^-126) and 0 (2^-127, an fp32 subnormal) decode like torch's e8m0 -> fp32.

    Checked against float64 only: the reference's a * 2^127 may overflow fp32 where the kernel's sa * sb does not.
    """
    m, n, k = 2, 64, 128
    a, _, b, _, _ = _operands(m, n, k, e8m0=True, seed=sa_byte + sb_byte)
    sfa = torch.full((m, 1), sa_byte, dtype=torch.uint8, device=DEV).view(E8M0)
    sfb = torch.full((1, 1), sb_byte, dtype=torch.uint8, device=DEV).view(E8M0)
    out = torch.full((m, n), float("nan"), device=DEV)
    fp8_gemm_nt_triton(a, sfa, b, sfb, out)
    da, db = act64(a.cpu(), sfa.cpu()), fp8_weight64(b.cpu(), sfb.cpu())
    assert_gemm_close(out.cpu(), da @ db.T, da.abs() @ db.abs().T, k)


@runnable
def test_empty_sizes() -> None:
    """m = 0 / n = 0 launch nothing; k = 0 gives out = c (or 0)."""
    a, sfa, b, sfb, _ = _operands(0, 64, 128, False, seed=1)
    fp8_gemm_nt_triton(a, sfa, b, sfb, torch.empty((0, 64), device=DEV))
    a0 = torch.empty((3, 0), dtype=FP8, device=DEV)
    b0 = torch.empty((64, 0), dtype=FP8, device=DEV)
    sf0a, sf0b = torch.empty((3, 0), device=DEV), torch.empty((1, 0), device=DEV)
    out = torch.full((3, 64), float("nan"), device=DEV)
    assert (fp8_gemm_nt_triton(a0, sf0a, b0, sf0b, out) == 0).all()
    c = torch.randn(3, 64, device=DEV)
    assert torch.equal(fp8_gemm_nt_triton(a0, sf0a, b0, sf0b, out, c), c)


def _bad_cases() -> list[tuple[str, dict, type[Exception], str]]:
    return [
        ("k % 16", {"k": 136}, ValueError, "multiple of 16"),
        ("a dtype", {"a_dtype": torch.bfloat16}, TypeError, "float8_e4m3fn"),
        ("sfa shape", {"sfa_shape": (4, 2)}, ValueError, "scale shapes"),
        ("sfb dtype", {"sfb_dtype": torch.float16}, TypeError, "sfb"),
        ("out dtype", {"out_dtype": torch.float16}, ValueError, "out"),
        ("c shape", {"c_shape": (4, 63)}, ValueError, "c:"),
        ("block_n", {"block_n": 256}, ValueError, "block_n"),
        ("block_m", {"block_m": 8}, ValueError, "block_m"),
        ("a stride", {"a_strided": True}, ValueError, "unit stride"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_inputs(case: tuple[str, dict, type[Exception], str]) -> None:
    """Metadata errors raise before any launch (no device needed: they are raised on the host)."""
    _, kw, exc, match = case
    m, n, k = 4, 64, kw.get("k", 128)
    kb = -(-k // 128)
    a = torch.zeros((m, 2 * k) if kw.get("a_strided") else (m, k), dtype=FP8)
    a = a[:, ::2] if kw.get("a_strided") else a
    if "a_dtype" in kw:
        a = torch.zeros((m, k), dtype=kw["a_dtype"])
    b = torch.zeros((n, k), dtype=FP8)
    sfa = torch.ones(kw.get("sfa_shape", (m, kb)))
    sfb = torch.ones((1, kb), dtype=kw.get("sfb_dtype", torch.float32))
    out = torch.empty((m, n), dtype=kw.get("out_dtype", torch.bfloat16))
    c = torch.zeros(kw["c_shape"]) if "c_shape" in kw else None
    blocks = {key: kw[key] for key in ("block_m", "block_n") if key in kw}
    with pytest.raises(exc, match=match):
        fp8_gemm_nt_triton(a, sfa, b, sfb, out, c, **blocks)


def test_default_config() -> None:
    """Decode uses small swap-AB tiles, prefill 128 x 128; block_n always divides 128."""
    assert default_config(1, 4096)[:2] == (16, 32)
    assert default_config(64, 16384)[:2] == (64, 64)
    assert default_config(128, 4096)[:2] == (64, 128)
    assert default_config(4096, 4096) == (128, 128, 8, 4)
    for m in (1, 17, 33, 64, 65, 300):
        for n in (64, 2048, 16384):
            assert 128 % default_config(m, n)[1] == 0


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("m", [1, 128, 4096])
@pytest.mark.parametrize(("n", "k"), [(4096, 2048), (2048, 4096)])
@pytest.mark.parametrize("e8m0", [False, True])
def test_gpu_v4_shapes(m: int, n: int, k: int, e8m0: bool) -> None:
    """V4 shapes vs the reference. Hopper's FP8 wgmma accumulates each 128-deep block with fewer than fp32's
    mantissa bits (DeepGEMM promotes every 128 for the same reason), so the limit is 1e-5, not 1e-6."""
    a, sfa, b, sfb, c = _operands(m, n, k, e8m0, seed=m + n + k, device="cpu")
    a, sfa, b, sfb, c = (t.cuda() for t in (a, sfa, b, sfb, c))
    for cc in (None, c):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        fp8_gemm_nt_triton(a, sfa, b, sfb, out, cc)
        want = ref.fp8_gemm_nt(a, sfa, b, sfb, torch.empty_like(out), cc)
        assert torch.isfinite(out).all()
        assert calc_diff(out, want) < 1e-5


@pytest.mark.gpu
@needs_cuda
def test_gpu_cuda_graph_replay() -> None:
    """The launcher never syncs: capture once, change the inputs in place, replay."""
    m, n, k = 4, 4096, 2048
    a, sfa, b, sfb, _ = _operands(m, n, k, False, seed=11, device="cuda")
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    fp8_gemm_nt_triton(a, sfa, b, sfb, out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8_gemm_nt_triton(a, sfa, b, sfb, out)
    a2, sfa2, _, _, _ = _operands(m, n, k, False, seed=12, device="cuda")
    a.copy_(a2)
    sfa.copy_(sfa2)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = ref.fp8_gemm_nt(a, sfa, b, sfb, torch.empty_like(out))
    assert calc_diff(out, want) < 1e-5
