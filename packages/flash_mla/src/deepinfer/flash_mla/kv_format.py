"""The V4 FP8 KV-cache entry ("MODEL1" content, one self-contained 584-byte row per 512-d entry).

Byte layout of one entry (little-endian; dims are the 512 channels of the shared K=V vector):

    bytes [  0, 448)  dims 0..447 as float8_e4m3fn, one byte per dim, in dim order
    bytes [448, 576)  dims 448..511 (the RoPE dims) as bf16, 2 bytes per dim, in dim order
    bytes [576, 583)  7 UE8M0 scale bytes; byte i scales dims 64*i .. 64*i+63 (value 2^(byte-127))
    byte   583        padding, always 0

This is FlashMLA's MODEL1 per-token content (448 e4m3 + 64 bf16 + 7 UE8M0 + 1 pad) in the order its tests
write it, but kept **per token**: FlashMLA stores a paged block block-major (all tokens' 576 data bytes first,
then all tokens' 8 scale bytes); here row s of a uint8 [..., 584] cache is exactly slot s, so a cache write
is one row copy and slot addressing is the same as for the BF16 cache.

Quantisation follows V4's QAT (inference/kernel.py): per 64-dim tile, amax floored at 1e-4, scale exponent
e = ceil(log2(amax * fp32(1/448))) read from the fp32 bits of that product, values multiplied by 2^-e,
saturated to +-448 and rounded to nearest even. A tile holding NaN or +-inf gets scale byte 255 (E8M0's NaN)
and dequantises to NaN. Values already on the QAT grid (fp8_quant_dequant with block 64) round-trip exactly.
"""

from __future__ import annotations

import torch

__all__ = [
    "FP8_KV_BYTES",
    "KV_DIM",
    "NOPE_DIM",
    "ROPE_DIM",
    "SCALE_TILE",
    "pack_fp8_kv_ref",
    "unpack_fp8_kv_ref",
]

KV_DIM = 512
NOPE_DIM = 448
ROPE_DIM = KV_DIM - NOPE_DIM
SCALE_TILE = 64
NUM_TILES = NOPE_DIM // SCALE_TILE  # 7
FP8_KV_BYTES = NOPE_DIM + 2 * ROPE_DIM + NUM_TILES + 1  # 584

_E4M3_MAX = 448.0
_AMAX_FLOOR = 1e-4
_E8M0_BIAS = 127
_NAN_EXP = 128  # byte 255
_ROPE_AT = NOPE_DIM
_SCALE_AT = NOPE_DIM + 2 * ROPE_DIM  # 576


def _tile_exponent(tiles: torch.Tensor) -> torch.Tensor:
    """fp32 [..., 7, 64] -> int32 [..., 7]: ceil(log2(max(amax, 1e-4) * fp32(1/448))), 128 if non-finite."""
    amax = tiles.abs().amax(dim=-1).clamp_min(_AMAX_FLOOR)  # clamp_min keeps NaN
    prod = amax * torch.tensor(1.0 / _E4M3_MAX, dtype=torch.float32)
    bits = prod.view(torch.int32)
    e = ((bits >> 23) & 0xFF) - _E8M0_BIAS
    # A non-zero mantissa puts the product strictly above 2^e: the ceiling is one more.
    e = e + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.where(torch.isfinite(prod), e, torch.full_like(e, _NAN_EXP))


def pack_fp8_kv_ref(kv: torch.Tensor) -> torch.Tensor:
    """kv [..., 512] bf16/fp32 -> uint8 [..., 584] in the layout of the module docstring."""
    lead = kv.shape[:-1]
    x = kv.float().reshape(-1, KV_DIM)
    tiles = x[:, :NOPE_DIM].reshape(-1, NUM_TILES, SCALE_TILE)
    e = _tile_exponent(tiles)
    y = torch.ldexp(tiles, -e.unsqueeze(-1))  # exact: multiplication by a power of two
    y = torch.where((e == _NAN_EXP).unsqueeze(-1), torch.full_like(y, float("nan")), y)
    nope = y.clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    out = torch.zeros(x.shape[0], FP8_KV_BYTES, dtype=torch.uint8, device=kv.device)
    out[:, :NOPE_DIM] = nope.reshape(-1, NOPE_DIM)
    out[:, _ROPE_AT:_SCALE_AT] = x[:, NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8)
    out[:, _SCALE_AT : _SCALE_AT + NUM_TILES] = (e + _E8M0_BIAS).to(torch.uint8)
    return out.reshape(*lead, FP8_KV_BYTES)


def unpack_fp8_kv_ref(packed: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """uint8 [..., 584] -> dtype [..., 512]; exact in fp32 and (barring overflow) in bf16."""
    lead = packed.shape[:-1]
    p = packed.reshape(-1, FP8_KV_BYTES)
    nope = p[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float().reshape(-1, NUM_TILES, SCALE_TILE)
    sbytes = p[:, _SCALE_AT : _SCALE_AT + NUM_TILES].to(torch.int32)
    scale = torch.ldexp(torch.ones_like(sbytes, dtype=torch.float32), sbytes - _E8M0_BIAS)
    scale = torch.where(sbytes == 255, torch.full_like(scale, float("nan")), scale)
    out = torch.empty(p.shape[0], KV_DIM, dtype=torch.float32, device=packed.device)
    out[:, :NOPE_DIM] = (nope * scale.unsqueeze(-1)).reshape(-1, NOPE_DIM)
    out[:, NOPE_DIM:] = p[:, _ROPE_AT:_SCALE_AT].contiguous().view(torch.bfloat16).float()
    return out.to(dtype).reshape(*lead, KV_DIM)
