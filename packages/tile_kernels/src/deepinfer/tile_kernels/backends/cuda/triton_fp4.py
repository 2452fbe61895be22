"""Triton per-block FP4 (e2m1) quantisation with UE8M0 scales (`ref/quant.py`), bit-exact to the reference.

Serves `fp4_quant_ue8m0` (codes uint8 + int32 exponents) and `fp4_quant_dequant_ue8m0` (V4's indexer simulation,
block 32, after the 128-point Hadamard). x [rows, n] is seen as rows * n/GROUP groups; a program takes BLOCK_G
groups as a [BLOCK_G, GROUP] tile (4096 elements: 8 KB of bf16 in, 8 KB out per program; at V4's indexer shape
[16384 * 64, 128] that is 32,768 programs, ~250 waves of 132 SMs), so x is read once and the result written once.

Bit-exactness, step by step against the reference (no rounding happens except where noted):
* amax = max |x| (NaN carried by a flag: `tl.max` need not propagate it), floored at 6 * 2^-126 (a max, exact).
* e = ceil(log2(amax * fp32(1/6))) from the IEEE bits of the one rounded fp32 product, as the reference; the
  floor keeps the product >= 2^-126 (normal), so e is in [-126, 126], or 128 for a NaN / inf block.
* y = x * 2^-e: one fp32 multiply by an exact power of two built from bits (2^-127 / 2^-128 as subnormal bits
  for the NaN block's e = 128, as the reference's ldexp), so it rounds exactly as the reference's multiply.
* codes: count of midpoints below |y| (ties to the even code: > at 0.25, 1.25, 2.5, 5; >= at 0.75, 1.75, 3.5),
  plus the sign bit of y in bit 3 (NaN: code 0 or 8): the reference's comparisons, exact.
* dequantised: {0, .5, 1, 1.5, 2, 3, 4, 6}[code & 7] with the sign, times 2^e (exact in fp32, and in bf16: at
  most 2 significant bits, exponent >= -127), NaN for a NaN / inf block; the cast to fp16 rounds as torch's.
No host sync (CUDA-graph safe); tile sizes come from shapes only. No fp8/bf16 hardware cast is involved, so the
interpreter and the GPU run the same arithmetic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["fp4_group_quant_triton"]

FP4_MAX = 6.0
AMAX_FLOOR = 6.0 * 2.0**-126
TILE_ELEMS = 4096  # elements of one [BLOCK_G, GROUP] tile
MAX_GROUP = 4096
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FLOOR = tl.constexpr(AMAX_FLOOR)
_MODES = {"codes": 0, "dequant": 1}


@triton.jit
def _nan():
    """A quiet fp32 NaN from its bits (a NaN constexpr global fails Triton's global-consistency check)."""
    return tl.full([], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _pow2_neg(e):
    """2^-e as fp32 for int32 e in [-126, 128], exact (e = 127, 128 give the subnormals 2^-127, 2^-128)."""
    normal = ((127 - tl.minimum(e, 126)) << 23).to(tl.float32, bitcast=True)
    sub = (0x00800000 >> tl.minimum(tl.maximum(e - 126, 0), 2)).to(tl.float32, bitcast=True)
    return tl.where(e <= 126, normal, sub)


@triton.jit
def fp4_tile(x, GROUP: tl.constexpr):
    """fp32 groups x [BG, GROUP] -> (codes int32 [BG, GROUP] in 0..15, e int32 [BG], dequantised fp32 [BG, GROUP])
    as `ref.quant.fp4_quant_ue8m0` / `fp4_quant_dequant_ue8m0` (module docstring)."""
    ax = tl.abs(x)
    has_nan = tl.max((ax != ax).to(tl.int32), axis=1) > 0
    amax = tl.maximum(tl.max(ax, axis=1), _FLOOR)
    amax = tl.where(has_nan, _nan(), amax)
    bits = (amax * (1.0 / 6.0)).to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    bad = (bits & 0x7F800000) == 0x7F800000  # product inf or NaN
    e = tl.where(bad, 128, e)
    y = x * _pow2_neg(e)[:, None]
    m = tl.abs(y)
    c = (m > 0.25).to(tl.int32) + (m >= 0.75).to(tl.int32) + (m > 1.25).to(tl.int32) + (m >= 1.75).to(tl.int32)
    c = c + (m > 2.5).to(tl.int32) + (m >= 3.5).to(tl.int32) + (m > 5.0).to(tl.int32)
    neg = (y.to(tl.int32, bitcast=True) >> 31) != 0
    codes = c + tl.where(neg, 8, 0)
    cf = c.to(tl.float32)
    mag = tl.where(c <= 4, cf * 0.5, tl.where(c == 7, 6.0, cf - 2.0))
    pw = ((tl.minimum(e, 127) + 127) << 23).to(tl.float32, bitcast=True)  # 2^e (e >= -126 here)
    deq = tl.where(neg, -mag, mag) * pw[:, None]
    deq = tl.where(bad[:, None], _nan(), deq)
    return codes, e, deq


@triton.jit
def _fp4_group_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    n_groups,
    groups_per_row,
    stride_xr,
    stride_xc,
    DEQUANT: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """x [rows, groups_per_row * GROUP] strided -> q [rows, n] contiguous (uint8 codes, or x's dtype for DEQUANT)
    and s [rows, groups_per_row] int32 exponents (not written for DEQUANT)."""
    g = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    gmask = g < n_groups
    row = g // groups_per_row
    col0 = (g % groups_per_row) * GROUP
    j = tl.arange(0, GROUP)
    mask = gmask[:, None]
    x = tl.load(x_ptr + row[:, None] * stride_xr + (col0[:, None] + j[None, :]) * stride_xc, mask=mask, other=0.0)
    codes, e, deq = fp4_tile(x.to(tl.float32), GROUP)
    out = g[:, None] * GROUP + j[None, :]
    if DEQUANT:
        tl.store(q_ptr + out, deq.to(q_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(q_ptr + out, codes.to(tl.uint8), mask=mask)
        tl.store(s_ptr + g, e, mask=gmask)


def _check(x: torch.Tensor, group: int, mode: str) -> None:
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")
    if not isinstance(x, torch.Tensor) or x.dtype not in _DTYPES:
        raise TypeError(f"x must be a fp32/bf16/fp16 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if isinstance(group, bool) or not isinstance(group, int) or not 2 <= group <= MAX_GROUP or group & (group - 1):
        raise ValueError(f"group must be a power of two in [2, {MAX_GROUP}], got {group!r}")
    if x.dim() < 1 or x.shape[-1] % group:
        raise ValueError(f"x's last dim must be a multiple of group ({group}), got shape {tuple(x.shape)}")
    check_runnable(x)


def fp4_group_quant_triton(
    x: torch.Tensor, group: int = 32, mode: str = "dequant"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-group e2m1 quantisation of the last dim with UE8M0 scales, bit-exact to `ref/quant.py`.

    x: [..., n] fp32/bf16/fp16, any strides (leading dims that do not merge are copied first), n % group == 0,
    group a power of two in [2, 4096]. mode:
      "codes"   -> (codes uint8 [..., n] in 0..15, e int32 [..., n/group])  as `fp4_quant_ue8m0`
      "dequant" -> (code value * 2^e in x.dtype [..., n], None)             as `fp4_quant_dequant_ue8m0`
    No host sync.
    """
    _check(x, group, mode)
    n = x.shape[-1]
    deq = mode == "dequant"
    out = torch.empty(x.shape, dtype=x.dtype if deq else torch.uint8, device=x.device)
    scales = None if deq else torch.empty((*x.shape[:-1], n // group), dtype=torch.int32, device=x.device)
    if x.numel() == 0:
        return out, scales
    x2 = x.reshape(-1, n)  # a view whenever the leading dims merge into one stride
    n_groups = x.numel() // group
    bg = max(1, min(TILE_ELEMS // group, triton.next_power_of_2(n_groups)))
    _fp4_group_kernel[(triton.cdiv(n_groups, bg),)](
        x2,
        out,
        scales if scales is not None else out,
        n_groups,
        n // group,
        x2.stride(0),
        x2.stride(1),
        DEQUANT=deq,
        GROUP=group,
        BLOCK_G=bg,
        num_warps=max(1, min(8, bg * group // 512)),
        enable_fp_fusion=False,
    )
    return out, scales
