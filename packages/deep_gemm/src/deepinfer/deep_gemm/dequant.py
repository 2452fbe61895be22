"""Local FP8 / FP4 dequantisation helpers (deep_gemm installs alone, so it does not use tile_kernels').

All helpers return float32 and never modify their inputs. Scale factors may be float32 or
torch.float8_e8m0fnu (a power of two stored as its biased exponent); both convert exactly to float32.
"""

from __future__ import annotations

import torch

__all__ = [
    "FP4_E2M1_VALUES",
    "scales_to_float",
    "dequant_fp8_act",
    "dequant_fp8_weight",
    "fp4_codes",
    "unpack_fp4",
    "dequant_fp4_weight",
    "dequant_weight",
]

# e2m1 code -> value; bit 3 is the sign, so codes 8..15 mirror 0..7 (code 8 is -0).
FP4_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_FP8_BLOCK = 128
_FP4_BLOCK = 32


def scales_to_float(sf: torch.Tensor) -> torch.Tensor:
    """Scale factors (float32 or float8_e8m0fnu, any shape) -> float32 of the same shape."""
    if sf.dtype not in (torch.float32, torch.float8_e8m0fnu):
        raise TypeError(f"sf: expected float32 or float8_e8m0fnu scale factors, got {sf.dtype}")
    return sf.to(torch.float32)


def _expand(sf: torch.Tensor, dim: int, block: int, size: int) -> torch.Tensor:
    """Repeat each scale `block` times along `dim` and cut to `size` (the last block may be partial)."""
    return sf.repeat_interleave(block, dim=dim).narrow(dim, 0, size)


def dequant_fp8_act(a: torch.Tensor, sfa: torch.Tensor) -> torch.Tensor:
    """Dequantise per-token 1x128-scaled FP8 activations.

    a: float8_e4m3fn [..., m, k]; sfa: float32 or float8_e8m0fnu [..., m, ceil(k/128)], scale of
    a[..., i, 128j : 128j+128]. Returns float32 [..., m, k].
    """
    k = a.shape[-1]
    return a.to(torch.float32) * _expand(scales_to_float(sfa), -1, _FP8_BLOCK, k)


def dequant_fp8_weight(b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """Dequantise 128x128-block-scaled FP8 weights.

    b: float8_e4m3fn [..., n, k]; sfb: float32 or float8_e8m0fnu [..., ceil(n/128), ceil(k/128)], scale of
    the block b[..., 128i : 128i+128, 128j : 128j+128]. Returns float32 [..., n, k].
    """
    n, k = b.shape[-2], b.shape[-1]
    sf = _expand(_expand(scales_to_float(sfb), -1, _FP8_BLOCK, k), -2, _FP8_BLOCK, n)
    return b.to(torch.float32) * sf


def fp4_codes(packed: torch.Tensor) -> torch.Tensor:
    """int8 / uint8 [..., k/2] (byte j: element 2j in the LOW nibble, 2j+1 in the high one) -> uint8 codes [..., k]
    (0..15, bit 3 the sign). A bit view first: int8 shifts would sign-extend the high nibble."""
    u = packed.view(torch.uint8)
    return torch.stack((u & 0x0F, u >> 4), dim=-1).flatten(-2)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Unpack e2m1 codes stored two per byte.

    packed: int8 (or uint8) [..., k/2]; byte j holds element 2j in its LOW nibble and element 2j+1 in its
    high nibble. Returns float32 [..., k] of the code values (no scale applied).
    """
    if packed.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"packed: expected int8 or uint8 packed FP4 codes, got {packed.dtype}")
    codes = fp4_codes(packed).long()
    table = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32, device=packed.device)
    return table[codes]


def dequant_fp4_weight(b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """Dequantise FP4 weights with one scale per 32 inputs.

    b: int8 [..., n, k/2] packed e2m1 (see `unpack_fp4`); sfb: float8_e8m0fnu or float32 [..., n, k/32].
    Returns float32 [..., n, k].
    """
    values = unpack_fp4(b)
    return values * _expand(scales_to_float(sfb), -1, _FP4_BLOCK, values.shape[-1])


def dequant_weight(b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """Dequantise a weight operand in either accepted format, chosen by `b.dtype`.

    float8_e4m3fn b -> `dequant_fp8_weight` (128x128 block scales); int8 b -> `dequant_fp4_weight`
    (packed e2m1, per-32 scales). Returns float32 [..., n, k].
    """
    if b.dtype == torch.float8_e4m3fn:
        return dequant_fp8_weight(b, sfb)
    if b.dtype in (torch.int8, torch.uint8):
        return dequant_fp4_weight(b, sfb)
    raise TypeError(f"b: expected float8_e4m3fn or packed-FP4 int8 weights, got {b.dtype}")
