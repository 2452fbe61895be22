"""Pure PyTorch reference of the FP8 (e4m3) / FP4 (e2m1) quantisers with power-of-two (UE8M0) scales.

These repeat the arithmetic of DeepSeek's V4 kernels bit for bit: per-block amax with a floor, the
scale exponent read from the IEEE bits of the fp32 product ``amax * fp32(1/max)`` (``ceil(log2)``
without a transcendental), round-to-nearest-even casts and explicit saturation. No validation
happens here; `api_quant.py` checks arguments and then calls these functions.

Non-finite blocks: a block whose amax is NaN or +inf gets scale exponent 128 (E8M0 byte 255, E8M0's
NaN code) and every element of that block quantises / dequantises to NaN.
"""

from __future__ import annotations

import torch

__all__ = [
    "fp8_quant_ue8m0",
    "fp8_quant_dequant_ue8m0",
    "fp4_quant_ue8m0",
    "fp4_quant_dequant_ue8m0",
    "hadamard_transform",
    "per_token_group_quant_fp8",
    "fp8_block_quant",
    "dequant_fp8_block",
    "fp4_pack",
    "unpack_fp4",
]

FP8_E4M3_MAX = 448.0
FP4_E2M1_MAX = 6.0
FP8_AMAX_FLOOR = 1e-4
FP4_AMAX_FLOOR = 6.0 * 2.0**-126
NONFINITE_EXP = 128  # E8M0 byte 255 = NaN
E8M0_BIAS = 127

# e2m1 magnitudes of codes 0..7; codes 8..15 are the same with the sign bit set.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring magnitudes and whether a tie goes up (the upper code is even).
_E2M1_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def _ieee_div(x: torch.Tensor, c: float) -> torch.Tensor:
    """x / c correctly rounded on every device. (PyTorch's CUDA division by a Python / CPU scalar multiplies by
    the rounded reciprocal instead, which can differ in the last bit; dividing by a same-device tensor does not.)"""
    return x / torch.full_like(x, c)


def ue8m0_exponent(amax: torch.Tensor, inv_max: float) -> torch.Tensor:
    """Scale exponent e = ceil(log2(amax * fp32(inv_max))) read from the fp32 bits of the product.

    amax: fp32, any shape, already floored (> 0). Returns int32 of the same shape; non-finite amax gives 128.
    """
    prod = amax.float() * torch.tensor(inv_max, dtype=torch.float32)
    bits = prod.view(torch.int32)
    exp = ((bits >> 23) & 0xFF) - E8M0_BIAS
    # A non-zero mantissa means the product lies strictly above 2^exp, so the ceiling is one more.
    exp = exp + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.where(torch.isfinite(prod), exp, torch.full_like(exp, NONFINITE_EXP)).to(torch.int32)


def exp2_int(e: torch.Tensor) -> torch.Tensor:
    """2^e as fp32 for int32 e (exact for -149 <= e <= 127; 128 gives inf)."""
    return torch.ldexp(torch.ones_like(e, dtype=torch.float32), e)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """View [..., n] as fp32 [..., n/block, block]."""
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block)


def _block_exponent(xb: torch.Tensor, floor: float, inv_max: float) -> torch.Tensor:
    """Per-block exponent of fp32 blocks [..., nb, block] -> int32 [..., nb] (NaN amax -> 128)."""
    amax = xb.abs().amax(dim=-1)
    # clamp_min keeps NaN, which ue8m0_exponent turns into the non-finite code.
    return ue8m0_exponent(amax.clamp_min(floor), inv_max)


def cast_e4m3_saturate(y: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, round-to-nearest-even, finite values saturated to +-448 (NaN stays NaN)."""
    return y.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def fp8_quant_ue8m0(x: torch.Tensor, block: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block e4m3 quantisation: x [..., n] -> (q e4m3 [..., n], scale_exp int32 [..., n/block])."""
    xb = _blocks(x, block)
    e = _block_exponent(xb, FP8_AMAX_FLOOR, 1.0 / FP8_E4M3_MAX)
    y = xb * exp2_int(-e).unsqueeze(-1)
    y = torch.where((e == NONFINITE_EXP).unsqueeze(-1), torch.full_like(y, float("nan")), y)
    return cast_e4m3_saturate(y).reshape(x.shape), e


def fp8_quant_dequant_ue8m0(x: torch.Tensor, block: int = 64) -> torch.Tensor:
    """Quantise then dequantise (QAT simulation); same shape and dtype as x."""
    q, e = fp8_quant_ue8m0(x, block)
    out = _blocks(q, block) * exp2_int(e).unsqueeze(-1)
    return out.reshape(x.shape).to(x.dtype)


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """fp32 values (already divided by the scale) -> uint8 e2m1 codes 0..15.

    Magnitudes saturate at 6, round to nearest with ties to the even code; bit 3 is the sign bit of y
    (so -0.0 and small negatives give code 8). NaN gives code 0 or 8 (its sign bit).
    """
    mag = y.abs()
    code = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for mid, tie_up in _E2M1_MIDPOINTS:
        code += (mag >= mid if tie_up else mag > mid).to(torch.uint8)
    return code | (torch.signbit(y).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 -> fp32 values (codes 8..15 negative, code 8 is -0.0)."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def fp4_quant_ue8m0(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block e2m1 quantisation: x [..., n] -> (codes uint8 [..., n], scale_exp int32 [..., n/block])."""
    xb = _blocks(x, block)
    e = _block_exponent(xb, FP4_AMAX_FLOOR, 1.0 / FP4_E2M1_MAX)
    codes = e2m1_codes(xb * exp2_int(-e).unsqueeze(-1))
    return codes.reshape(x.shape), e


def fp4_quant_dequant_ue8m0(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Quantise then dequantise (QAT simulation); same shape and dtype as x; non-finite blocks -> NaN."""
    codes, e = fp4_quant_ue8m0(x, block)
    out = _blocks(e2m1_values(codes), block) * exp2_int(e).unsqueeze(-1)
    out = torch.where((e == NONFINITE_EXP).unsqueeze(-1), torch.full_like(out, float("nan")), out)
    return out.reshape(x.shape).to(x.dtype)


def hadamard_transform(x: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Fast Walsh-Hadamard transform over the last dim (power of 2), Sylvester order, fp32 butterflies."""
    n = x.shape[-1]
    y = x.float().reshape(-1, n)
    h = 1
    while h < n:
        # Pair element i with i+h inside each run of 2h: H_2h = [[H_h, H_h], [H_h, -H_h]].
        v = y.view(-1, n // (2 * h), 2, h)
        a, b = v[:, :, 0, :], v[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, n)
        h *= 2
    s = float(n) ** -0.5 if scale is None else float(scale)
    return (y * torch.tensor(s, dtype=torch.float32)).reshape(x.shape).to(x.dtype)


def per_token_group_quant_fp8(
    x: torch.Tensor, group_size: int = 128, scale_fmt: str = "ue8m0"
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., k] -> (q e4m3 [..., k], scales fp32 [..., k/group_size]) with x ~= q * scale per group."""
    if scale_fmt == "ue8m0":
        q, e = fp8_quant_ue8m0(x, group_size)
        return q, exp2_int(e)
    xb = _blocks(x, group_size)
    scale = _ieee_div(xb.abs().amax(dim=-1).clamp_min(FP8_AMAX_FLOOR), FP8_E4M3_MAX)
    return cast_e4m3_saturate(xb / scale.unsqueeze(-1)).reshape(x.shape), scale


def _tile_view(w: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """fp32 [n, k] zero-padded to whole blocks and viewed as [nb, b0, kb, b1]."""
    b0, b1 = block
    n, k = w.shape
    nb, kb = -(-n // b0), -(-k // b1)
    padded = torch.zeros(nb * b0, kb * b1, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    return padded.view(nb, b0, kb, b1)


def exponent_to_e8m0(e: torch.Tensor) -> torch.Tensor:
    """int32 exponents in [-127, 127] (or 128 for NaN) -> torch.float8_e8m0fnu (byte = e + 127)."""
    return (e + E8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)


def fp8_block_quant(
    w: torch.Tensor, block: tuple[int, int] = (128, 128), scale_fmt: str = "ue8m0"
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [n, k] -> (e4m3 [n, k], scale [ceil(n/b0), ceil(k/b1)] e8m0fnu or fp32) per 2-D block."""
    n, k = w.shape
    tiles = _tile_view(w, block)
    amax = tiles.abs().amax(dim=(1, 3)).clamp_min(FP8_AMAX_FLOOR)
    if scale_fmt == "ue8m0":
        e = ue8m0_exponent(amax, 1.0 / FP8_E4M3_MAX)
        y = tiles * exp2_int(-e)[:, None, :, None]
        scale = exponent_to_e8m0(e)
    else:
        scale = _ieee_div(amax, FP8_E4M3_MAX)
        y = tiles / scale[:, None, :, None]
    q = cast_e4m3_saturate(y).reshape(tiles.shape[0] * block[0], -1)[:n, :k]
    return q.contiguous(), scale


def expand_block_scale(scale: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """Scale grid [nb, kb] (e8m0fnu or float) -> fp32 [n, k] per element (ragged edges cropped)."""
    s = scale.float()
    s = s.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
    return s[: shape[0], : shape[1]]


def dequant_fp8_block(
    w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = (128, 128), dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """e4m3 [n, k] times its per-block scale -> dtype [n, k] (fp32 math; exact for power-of-two scales)."""
    return (w.float() * expand_block_scale(scale, block, tuple(w.shape))).to(dtype)


def fp4_pack(w: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """w [n, k] -> (int8 [n, k/2], low nibble = element 2j; scale e8m0fnu [n, k/block])."""
    codes, e = fp4_quant_ue8m0(w, block)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.view(torch.int8), exponent_to_e8m0(e)


def unpack_fp4(
    packed: torch.Tensor, scale: torch.Tensor, block: int = 32, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """int8 [n, k/2] codes + scale [n, k/block] (e8m0fnu or float) -> dtype [n, k]."""
    b = packed.view(torch.uint8)
    codes = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)
    vals = _blocks(e2m1_values(codes), block) * scale.float().unsqueeze(-1)
    return vals.reshape(codes.shape).to(dtype)
