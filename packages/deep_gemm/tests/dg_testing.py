"""Test helpers for deep_gemm: random quantised operands and an independent float64 oracle.

The float64 dequantisation here is written differently from the package's (bit arithmetic for e2m1 and
e8m0, explicit block loops for the scales) so a shared bug cannot hide in both.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
U = 2.0**-24  # unit roundoff of float32
BF16_REL = 2.0**-8  # largest relative rounding error of a float32 -> bfloat16 cast


def gen(seed: int) -> torch.Generator:
    """A CPU generator with a fixed seed (reproducible but distinct per test case)."""
    return torch.Generator().manual_seed(seed)


def rand_float(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Standard-normal values rounded to `dtype`."""
    return torch.randn(shape, generator=g).to(dtype)


def rand_fp8(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """e4m3 values spread over several binades (|x| up to ~100, well inside the 448 range)."""
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-3, 6, shape, generator=g).float())
    return x.to(FP8)


def rand_scales(shape: tuple[int, ...], g: torch.Generator, e8m0: bool) -> torch.Tensor:
    """Positive scale factors: random fp32 in [2^-4, 2^4), or random powers of two stored as e8m0."""
    if e8m0:
        exps = torch.randint(-6, 7, shape, generator=g) + 127
        return exps.to(torch.uint8).view(E8M0)
    return torch.exp2(torch.rand(shape, generator=g) * 8 - 4)


def rand_fp4(shape_packed: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Random packed e2m1 bytes (every one of the 256 byte values is a valid pair of codes)."""
    return torch.randint(-128, 128, shape_packed, generator=g, dtype=torch.int16).to(torch.int8)


def scales64(sf: torch.Tensor) -> torch.Tensor:
    """Scale factors -> float64; e8m0 decoded from its exponent bits."""
    if sf.dtype == E8M0:
        return torch.exp2(sf.view(torch.uint8).double() - 127)
    return sf.double()


def act64(a: torch.Tensor, sfa: torch.Tensor) -> torch.Tensor:
    """float64 dequantisation of 1x128-scaled FP8 activations [..., m, k]."""
    out = a.double()
    s = scales64(sfa)
    for j in range(s.shape[-1]):
        out[..., j * 128 : (j + 1) * 128] *= s[..., j : j + 1]
    return out


def fp8_weight64(b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """float64 dequantisation of 128x128-block-scaled FP8 weights [..., n, k]."""
    out = b.double()
    s = scales64(sfb)
    for i in range(s.shape[-2]):
        for j in range(s.shape[-1]):
            out[..., i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] *= s[..., i, j][..., None, None]
    return out


def e2m1_64(codes: torch.Tensor) -> torch.Tensor:
    """Decode 4-bit e2m1 codes (int64) by their bit fields: sign | 2-bit exponent (bias 1) | 1-bit mantissa."""
    sign = torch.where((codes >> 3) & 1 == 1, -1.0, 1.0).double()
    exp = (codes >> 1) & 3
    man = (codes & 1).double()
    subnormal = 0.5 * man
    normal = torch.exp2(exp.double() - 1) * (1 + 0.5 * man)
    return sign * torch.where(exp == 0, subnormal, normal)


def fp4_weight64(b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """float64 dequantisation of packed FP4 weights int8 [..., n, k/2] with per-32 scales [..., n, k/32]."""
    u = b.view(torch.uint8).long()
    vals = torch.empty((*b.shape[:-1], 2 * b.shape[-1]), dtype=torch.float64)
    vals[..., 0::2] = e2m1_64(u & 15)
    vals[..., 1::2] = e2m1_64(u >> 4)
    blocks = vals.unflatten(-1, (-1, 32)) * scales64(sfb)[..., None]
    return blocks.flatten(-2)


def weight64(b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """float64 dequantisation of either weight format (by dtype)."""
    return fp8_weight64(b, sfb) if b.dtype == FP8 else fp4_weight64(b, sfb)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity error 1 - 2*sum(xy) / sum(x^2 + y^2), in float64 (0 for two empty tensors)."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    if x.numel() == 0 or denom == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denom)


def assert_gemm_close(
    out: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, k: int, diff_limit: float | None = None
) -> None:
    """Check a float32-accumulated GEMM result against its float64 value, element by element.

    ref: the exact (float64) result; mag: the float64 sum of |a_i b_i| of each output (|A| @ |B|^T).
    Bound: a k-term float32 dot product (plus up to two roundings when a scale multiplies a value) errs by at
    most (k + 2) u * mag (u = 2^-24); we allow 2(k + 2) u * mag for the order the backend picks, and bf16
    outputs add one rounding of at most 2^-8 of the value. `diff_limit` additionally bounds calc_diff.
    """
    assert out.shape == ref.shape, (out.shape, ref.shape)
    got = out.double()
    assert torch.isfinite(got).all(), "non-finite values in the output"
    acc = 2 * (k + 2) * U * mag
    rel = BF16_REL if out.dtype == torch.bfloat16 else 0.0
    tol = rel * (ref.abs() + acc) + acc
    err = (got - ref).abs()
    worst = float((err - tol).max()) if err.numel() else 0.0
    assert worst <= 0, f"error exceeds the format bound by {worst:.3e} (max err {float(err.max()):.3e})"
    if diff_limit is None:
        diff_limit = BF16_REL**2 if out.dtype == torch.bfloat16 else (k * U) ** 2
    diff = calc_diff(got, ref)
    assert diff < diff_limit, f"calc_diff {diff:.3e} >= {diff_limit:.3e}"
