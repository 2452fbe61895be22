"""Packed FP8 / FP4 indexer inputs: dequantised on entry (plain torch ops, not fused into any kernel).

The issue's API takes the indexer queries (and keys) "bf16 or FP4/FP8 as the model stores them". The ops accept
such a tensor as a (values, scales) tuple and turn it into a dense tensor before anything else runs:

* FP8: (float8_e4m3fn [..., d], scales [..., d / block]), block = d / scales.shape[-1] (e.g. 128 or 32);
  scales fp32, or UE8M0 (uint8 exponents or float8_e8m0fnu: 2 ** (e - 127), e = 255 is NaN).
* FP4: (uint8 [..., d / 2] packed e2m1, **low nibble first** (element 2i in bits 3:0, 2i + 1 in bits 7:4),
  UE8M0 scales [..., d / 32]), one scale per 32 elements (the OCP MX layout).

Result dtype: bf16 with UE8M0 scales: an e4m3 (4 significant bits) or e2m1 (2 bits) value times a power of two
fits bf16's 8-bit significand, so the dequantisation is exact (unless the product leaves bf16's normal range:
below 2 ** -126 the subnormal spacing rounds; above fp32's range it is inf, as it would be in fp32). fp32 with
fp32 scales: the product of a value and an arbitrary fp32 scale is rounded once, in fp32 (bf16 would round
it to 8 bits). Every op computes its scores in fp32 from the dense tensor, as for bf16 / fp32 inputs.

Only shapes and dtypes are checked (no value reads, no host sync): CUDA-graph safe like the rest of the API.
"""

from __future__ import annotations

import torch

__all__ = ["E2M1_VALUES", "dequant_e2m1", "dequant_e8m0", "dequant_packed", "is_packed"]

# e2m1 code -> value: bit 3 = sign, bits 2:1 = exponent (bias 1), bit 0 = mantissa; code 8 is -0.0.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_E8M0_DTYPES = (torch.uint8, torch.float8_e8m0fnu)
_FP4_BLOCK = 32


def is_packed(x: object) -> bool:
    """True for a (values, scales) tuple / list, the packed form the indexer ops accept."""
    return isinstance(x, (tuple, list))


def dequant_e8m0(scales: torch.Tensor) -> torch.Tensor:
    """UE8M0 exponents (uint8 or float8_e8m0fnu, any shape) -> fp32 2 ** (e - 127), NaN for e = 255.

    Built from the fp32 bit pattern (e << 23; e = 0 is the subnormal 2 ** -127 = bit 22), so it is exact on
    every device (no exp2 call whose last-bit accuracy depends on the math library).
    """
    e = scales.view(torch.uint8).to(torch.int32)
    bits = torch.where(e == 0, torch.full_like(e, 1 << 22), e << 23)
    bits = torch.where(e == 255, torch.full_like(e, 0x7FC00000), bits)
    return bits.view(torch.float32)


def _e2m1_codes(c: torch.Tensor) -> torch.Tensor:
    """int32 e2m1 codes 0..15 -> fp32 values (E2M1_VALUES), by arithmetic: a lookup table would be a host-to-device
    copy per call, which a CUDA-graph capture rejects."""
    e, m = (c >> 1) & 3, (c & 1).to(torch.float32)
    mag = torch.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * ((1 << e) >> 1).to(torch.float32))  # 2 ** (e - 1)
    return torch.where((c & 8) != 0, -mag, mag)  # code 8 gives -0.0


def dequant_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., m] of two e2m1 codes each (low nibble first) -> fp32 [..., 2m] (exact)."""
    c = packed.to(torch.int32)
    return torch.stack((_e2m1_codes(c & 0xF), _e2m1_codes(c >> 4)), dim=-1).flatten(-2)


def _check_pair(name: str, x: object) -> tuple[torch.Tensor, torch.Tensor]:
    """A (values, scales) pair of tensors on one device with equal leading dims; returns it."""
    if len(x) != 2 or not all(isinstance(t, torch.Tensor) for t in x):  # type: ignore[arg-type]
        got = ", ".join(type(t).__name__ for t in x)  # type: ignore[union-attr]
        raise TypeError(f"{name}: a packed input must be a (values, scales) pair of tensors, got ({got})")
    vals, scales = x  # type: ignore[misc]
    if vals.dim() < 1 or vals.shape[:-1] != scales.shape[:-1]:
        raise ValueError(
            f"{name}: scales must have the values' leading dims {tuple(vals.shape[:-1])} + [groups], "
            f"got values {tuple(vals.shape)}, scales {tuple(scales.shape)}"
        )
    if vals.device != scales.device:
        raise ValueError(f"{name}: values and scales must be on one device, got {vals.device} and {scales.device}")
    return vals, scales


def _expand(name: str, scales: torch.Tensor, d: int, block: int | None) -> torch.Tensor:
    """Scales [..., g] (fp32 or UE8M0) -> fp32 [..., d], each repeated over its block of d / g elements."""
    g = scales.shape[-1]
    if g < 1 or d % g or (block is not None and d // g != block):
        want = f"d / {block} = {d // block}" if block else f"a divisor of d = {d}"
        raise ValueError(f"{name}: scales' last dim must be {want}, got {g}")
    if scales.dtype == torch.float32:
        s = scales
    elif scales.dtype in _E8M0_DTYPES:
        s = dequant_e8m0(scales)
    else:
        raise TypeError(f"{name}: scales must be float32, uint8 (UE8M0) or float8_e8m0fnu, got {scales.dtype}")
    # expand + reshape rather than repeat_interleave: the output size is known without reading a device value
    return s.unsqueeze(-1).expand(*s.shape, d // g).reshape(*s.shape[:-1], d)


def dequant_packed(name: str, x: object) -> torch.Tensor:
    """A packed (values, scales) input -> dense tensor [..., d]; tensors pass through unchanged.

    Args:
        name: the argument's name, for error messages.
        x: a tensor, or (float8_e4m3fn [..., d], scales [..., d / block] fp32 / UE8M0), or
            (uint8 [..., d / 2] e2m1 low nibble first, UE8M0 scales [..., d / 32]).

    Returns:
        bf16 [..., d] when the scales are UE8M0 (exact), fp32 [..., d] when they are fp32.
    """
    if not is_packed(x):
        return x  # type: ignore[return-value]  # the caller's tensor checks report any other type
    vals, scales = _check_pair(name, x)
    if vals.dtype == torch.float8_e4m3fn:
        d, block, dense = vals.shape[-1], None, vals.to(torch.float32)
    elif vals.dtype == torch.uint8:
        if scales.dtype not in _E8M0_DTYPES:
            raise TypeError(f"{name}: FP4 (e2m1) scales must be UE8M0 (uint8 / float8_e8m0fnu), got {scales.dtype}")
        d, block, dense = 2 * vals.shape[-1], _FP4_BLOCK, dequant_e2m1(vals)
    else:
        raise TypeError(f"{name}: packed values must be float8_e4m3fn (FP8) or uint8 (packed FP4), got {vals.dtype}")
    out = dense * _expand(name, scales, d, block)  # exact for UE8M0 scales; one fp32 rounding for fp32 scales
    return out if scales.dtype == torch.float32 else out.to(torch.bfloat16)
