"""Test helpers for deep_gemm: random quantised operands and an independent float64 oracle.

The float64 dequantisation here is written differently from the package's (bit arithmetic for e2m1 and
e8m0, explicit block loops for the scales) so a shared bug cannot hide in both.
"""

from __future__ import annotations

from collections.abc import Callable

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


def fp4_group_weights(
    counts: list[int], n: int, k: int, g: torch.Generator, sb: tuple[int, int] = (118, 130)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grouped FP4 weights of len(counts) experts: packed uint8 [G, n, k/2] (random e2m1 pairs), E8M0 scale bytes
    uint8 [G, n, k/32] drawn from [sb[0], sb[1]], offs int32 [G] (cumulative ends of `counts`)."""
    packed = torch.randint(0, 256, (len(counts), n, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(sb[0], sb[1] + 1, (len(counts), n, k // 32), generator=g, dtype=torch.int32)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    return packed, scales.to(torch.uint8), offs


def bf16_fp4_operands(
    counts: list[int], n: int, k: int, g: torch.Generator, extra_rows: int = 3, sb: tuple[int, int] = (118, 130)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """W4A16 grouped operands: a bf16 [m, k] (m = sum(counts) + extra_rows) then `fp4_group_weights`."""
    a = torch.randn((sum(counts) + extra_rows, k), generator=g).to(torch.bfloat16)
    return (a, *fp4_group_weights(counts, n, k, g, sb))


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


def grouped_exact64(
    x64: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, counts: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 value and magnitude (|x| @ |W|^T) [sum(counts), n] of the grouped rows: x64 float64 activations
    [m, k] (already dequantised), packed FP4 [G, n, k/2] with E8M0 scale bytes [G, n, k/32] (`fp4_weight64`)."""
    w64 = fp4_weight64(packed.view(torch.int8), scales.view(E8M0))
    rows = sum(counts)
    val = torch.zeros(rows, packed.shape[1], dtype=torch.float64)
    mag = torch.zeros_like(val)
    start = 0
    for i, c in enumerate(counts):
        val[start : start + c] = x64[start : start + c] @ w64[i].T
        mag[start : start + c] = x64[start : start + c].abs() @ w64[i].abs().T
        start += c
    return val, mag


def rel_fro(x: torch.Tensor, y: torch.Tensor) -> float:
    """Relative Frobenius error |x - y| / |y| in float64."""
    return float((x.double() - y.double()).norm() / y.double().norm())


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


def replay_with_new_offs(
    launch: Callable[..., object], a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """CUDA-graph check of a grouped launch (GPU): capture `launch(a, packed, scales, offs, out)` once with offs
    [4, 8, 12, 16] (16 rows, 4 groups; warm-up outside the capture), set offs to [0, 1, 1, 9] (groups 0 and 2
    empty), NaN-fill out and replay. Returns (out bf16 [16, n], offs): rows :9 follow the new offs (no host read of
    offs), rows 9: must stay NaN."""
    offs = torch.tensor([4, 8, 12, 16], dtype=torch.int32, device="cuda")
    out = torch.full((16, packed.shape[1]), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch(a, packed, scales, offs, out)  # warm-up / compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(a, packed, scales, offs, out)
    offs.copy_(torch.tensor([0, 1, 1, 9], dtype=torch.int32))  # groups 0 and 2 empty; rows 9.. untouched
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return out, offs
