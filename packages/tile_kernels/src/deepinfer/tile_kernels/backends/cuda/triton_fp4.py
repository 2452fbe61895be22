"""Triton per-block FP4 (e2m1) quantisation with UE8M0 scales (`ref/quant.py`), bit-exact to the reference.

Serves `fp4_quant_ue8m0` (codes uint8 + int32 exponents) and `fp4_quant_dequant_ue8m0` (V4's indexer simulation,
block 32, after the 128-point Hadamard). x [rows, n] is seen as rows * n/GROUP groups; a program takes BLOCK_G
groups as a [BLOCK_G, GROUP] tile (4096 elements: 8 KB of bf16 in, 8 KB out per program; at V4's indexer shape
[16384 * 64, 128] that is 32,768 programs), so x is read once and the result written once. Contiguous x (the
usual case) goes to `_fp4_flat_kernel`: one int64 base per program and int32 offsets, no per-element index
math (round 1's (row, group) int64 division per element left the kernel issue-bound at 45 % of copy); strided
x to `_fp4_group_kernel`.

Bit-exactness, step by step against the reference (no rounding happens except where noted):
* amax = max |x| as an integer max over the bits of |x| (a NaN's bits exceed inf's, so NaN propagates),
  floored at 6 * 2^-126 (a max, exact).
* e = ceil(log2(amax * fp32(1/6))) from the IEEE bits of the one rounded fp32 product, as the reference; the
  floor keeps the product >= 2^-126 (normal), so e is in [-126, 126], or 128 for a NaN / inf block.
* y = x * 2^-e: one fp32 multiply by an exact power of two built from bits (2^-127 / 2^-128 as subnormal bits
  for the NaN block's e = 128, as the reference's ldexp), so it rounds exactly as the reference's multiply.
* codes (the reference counts midpoints below |y|: > at 0.25, 1.25, 2.5, 5, >= at 0.75, 1.75, 3.5, i.e. round
  to nearest, ties to the even code): |y| >= 1 rounds its fp32 bits to one mantissa bit (ties to even; the
  kept bits are the e2m1 magnitude, saturated at 6 = code 7); |y| < 1 rounds |y| + 2^22 to a multiple of 0.5
  (one RNE addition; the low mantissa bits are the code); NaN -> 0. Plus y's sign bit in bit 3.
* dequantised: the rounded magnitude times 2^e (exact in fp32, and in bf16: at most 2 significant bits,
  exponent >= -127), y's sign bit OR-ed in (so negatives that round to zero give -0.0, as the reference's
  table; a float negate may compile to 0 - x, +0.0: round 1 on the GPU's Triton 3.6), NaN for a NaN / inf
  block; the cast to fp16 rounds as torch's.
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
NUM_WARPS = 8
MAX_GROUP = 4096
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FLOOR_BITS = tl.constexpr(0x01C00000)  # bits of 6 * 2^-126 = 1.5 * 2^-124
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
    as `ref.quant.fp4_quant_ue8m0` / `fp4_quant_dequant_ue8m0` (module docstring). Integer bit arithmetic where
    the reference compares: fewer instructions per element (the kernel is issue-bound otherwise), same results."""
    xb = x.to(tl.int32, bitcast=True)
    # amax as the max of |x|'s bits (monotone for non-negative floats; a NaN's bits exceed inf's, so a NaN
    # propagates through the integer max, which tl.max over floats need not do), floored at 6 * 2^-126.
    amax = tl.maximum(tl.max(xb & 0x7FFFFFFF, axis=1), _FLOOR_BITS).to(tl.float32, bitcast=True)
    bits = (amax * (1.0 / 6.0)).to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    bad = (bits & 0x7F800000) == 0x7F800000  # product inf or NaN
    e = tl.where(bad, 128, e)
    y = x * _pow2_neg(e)[:, None]
    yb = y.to(tl.int32, bitcast=True)
    mb = yb & 0x7FFFFFFF
    m = mb.to(tl.float32, bitcast=True)
    # |y| >= 1: round to e2m1's one mantissa bit, ties to even, on the bits (the carry moves the exponent up);
    # the kept bits ARE the rounded magnitude (1, 1.5, 2, 3, 4, 6, 8, ...; saturated at 6 below).
    rb = (mb + (0x1FFFFF + ((mb >> 22) & 1))) & -4194304  # -4194304 = 0xFFC00000
    # |y| < 1: steps of 0.5 (codes 0, 1, 2): one RNE rounding to a multiple of 0.5 by adding 2^22 (whose ulp is
    # 0.5); the low mantissa bits of the sum are then the code and subtracting 2^22 back is exact.
    t = m + 4194304.0
    small = m < 1.0
    c = tl.where(small, t.to(tl.int32, bitcast=True) & 3, tl.minimum((rb >> 22) - 252, 7))
    c = tl.where(m != m, 0, c)  # NaN (a non-finite block only): no midpoint is below it, as the reference
    # y's sign bit, not x's: the GPU's multiply turns a NaN into the canonical (positive) NaN, as the reference's.
    sign = (yb >> 31) << 31
    codes = c + ((yb >> 28) & 8)
    # The dequantised magnitude in one rounding: e2m1's step is 0.5 below 2, 1 in [2, 4), 2 from 4 up, i.e. the
    # ulp of 2^22 * 2^max(exponent(|y|), 0); adding that power of two rounds |y| to its step (RNE: the ties of
    # the code rule) and subtracting it back is exact. Fewer instructions than selecting between the two code
    # paths above, which only the codes output uses.
    magic = ((tl.maximum(mb >> 23, 127) + 22) << 23).to(tl.float32, bitcast=True)
    mag = tl.minimum((m + magic) - magic, 6.0)
    pw = ((tl.minimum(e, 127) + 127) << 23).to(tl.float32, bitcast=True)  # 2^e (e >= -126 here)
    # The sign goes in as a bit: -0.0 for negatives that round to 0, as the reference's table (round 1's float
    # negate gave +0.0 on the GPU: Triton 3.6 there evidently compiles -x as 0 - x; 3.9 here as a sign-bit xor).
    deq = ((mag * pw[:, None]).to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    deq = tl.where(bad[:, None], _nan(), deq)
    return codes, e, deq


@triton.jit
def _fp4_flat_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    n_groups,
    DEQUANT: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    EVEN: tl.constexpr,
):
    """Contiguous x (n_groups * GROUP elements) -> q (same layout; uint8 codes, or x's dtype for DEQUANT) and
    s [n_groups] int32 exponents (not written for DEQUANT). One int64 base per program and int32 offsets inside
    the tile: no per-element row / column arithmetic. EVEN: n_groups % BLOCK_G == 0, no masks."""
    base = tl.program_id(0).to(tl.int64) * BLOCK_G
    gi = tl.arange(0, BLOCK_G)
    off = gi[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    if EVEN:
        x = tl.load(x_ptr + base * GROUP + off)
    else:
        gmask = (base + gi) < n_groups
        x = tl.load(x_ptr + base * GROUP + off, mask=gmask[:, None], other=0.0)
    codes, e, deq = fp4_tile(x.to(tl.float32), GROUP)
    if DEQUANT:
        y = deq.to(q_ptr.dtype.element_ty)
    else:
        y = codes.to(tl.uint8)
    if EVEN:
        tl.store(q_ptr + base * GROUP + off, y)
        if not DEQUANT:
            tl.store(s_ptr + base + gi, e)
    else:
        tl.store(q_ptr + base * GROUP + off, y, mask=gmask[:, None])
        if not DEQUANT:
            tl.store(s_ptr + base + gi, e, mask=gmask)


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
    and s [rows, groups_per_row] int32 exponents (not written for DEQUANT). For x that is not contiguous."""
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
    x: torch.Tensor,
    group: int = 32,
    mode: str = "dequant",
    *,
    tile_elems: int | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-group e2m1 quantisation of the last dim with UE8M0 scales, bit-exact to `ref/quant.py`.

    x: [..., n] fp32/bf16/fp16, any strides (leading dims that do not merge are copied first), n % group == 0,
    group a power of two in [2, 4096]. mode:
      "codes"   -> (codes uint8 [..., n] in 0..15, e int32 [..., n/group])  as `fp4_quant_ue8m0`
      "dequant" -> (code value * 2^e in x.dtype [..., n], None)             as `fp4_quant_dequant_ue8m0`
    tile_elems / num_warps: benchmark configs (elements per program, a power of two; None: TILE_ELEMS and one
    warp per 512 elements, at most NUM_WARPS). No host sync.
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
    bg = max(1, min((tile_elems or TILE_ELEMS) // group, triton.next_power_of_2(n_groups)))
    warps = num_warps or max(1, min(NUM_WARPS, bg * group // 512))
    s_arg = scales if scales is not None else out
    grid = (triton.cdiv(n_groups, bg),)
    if x2.is_contiguous():
        even = n_groups % bg == 0
        _fp4_flat_kernel[grid](
            x2, out, s_arg, n_groups, DEQUANT=deq, GROUP=group, BLOCK_G=bg, EVEN=even, num_warps=warps,
            enable_fp_fusion=False,
        )  # fmt: skip
        return out, scales
    _fp4_group_kernel[grid](
        x2,
        out,
        s_arg,
        n_groups,
        n // group,
        x2.stride(0),
        x2.stride(1),
        DEQUANT=deq,
        GROUP=group,
        BLOCK_G=bg,
        num_warps=warps,
        enable_fp_fusion=False,
    )
    return out, scales
