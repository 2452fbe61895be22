"""Triton FP8 x FP8 GEMM with DeepGEMM's SM90 "1D2D" scaling: out = c + dequant(a, sfa) @ dequant(b, sfb)^T.

a: float8_e4m3fn [m, k], sfa [m, ceil(k/128)] (one scale per row and 128 columns); b: float8_e4m3fn [n, k],
sfb [ceil(n/128), ceil(k/128)] (one scale per 128x128 block); scales float32 or float8_e8m0fnu; c optional
float32/bf16 [m, n] (may alias out); out bf16 or float32 [m, n]. Semantics = `reference.fp8_gemm_nt`.

Algorithm. One program per (BLOCK_M x BLOCK_N) output tile (1-D grid, GROUP_M-swizzled for L2 reuse of b). K is
walked in blocks of BLOCK_K = 128, the scale granularity, so every k block has ONE scale per row (sfa) and ONE
scale per tile (sfb: BLOCK_N divides 128, so a tile never straddles two 128-row weight blocks):

    blk = tl.dot(a_tile e4m3 [BM, 128], b_tile^T e4m3 [128, BN])    # fresh fp32 accumulator (FP8 wgmma on Hopper)
    acc += blk * (sfa[rows, kb][:, None] * sfb[n0 // 128, kb])        # promotion to fp32 with the scales

This is DeepGEMM's scheme: the tensor core never accumulates more than 128 products (Hopper's FP8 wgmma
accumulator keeps fewer than 24 mantissa bits), and the scales are applied once per block on CUDA cores.
SWAP_AB (default for m <= 64) computes acc^T [BN, BM] = b_tile @ a_tile^T instead, so the weight tile is the
MMA's M side (>= 64 rows, as FP8 wgmma wants) and the few activation rows are its N side (>= 16).

Numerics. Products of two e4m3 values are exact in fp32; each block sum is an fp32 sum of <= 128 exact products;
the scaling adds two roundings (sfa * sfb, then blk * s; exact for E8M0 scales) and the k-loop ceil(k/128)
additions. The reference rounds a * sfa and b * sfb to fp32 first, then sums k products: both are fp32
evaluations of the same exact sum, differing only in rounding order (see the test module for the bound).
E8M0 scale bytes s are decoded bit-exactly to 2^(s-127) (s = 0 -> 2^-127, a subnormal; s = 255 -> NaN), as
torch's float8_e8m0fnu -> float32 conversion does.

Requirements: k % 16 == 0 (16-byte aligned rows of a and b, so loads vectorise; k need NOT be a multiple of 128:
the last k block is masked), a and b with unit stride along k, out and c with unit stride along n (sfa, sfb
may have any strides, e.g. an MN-major sfa view). m, n: any size (masked tiles).
Under TRITON_INTERPRET=1 the bf16 output cast is done by integer ops (BF16_RNE_BITS): the interpreter's fp32 ->
bf16 cast does not round to nearest even; on a GPU the native cast (cvt.rn.bf16.f32) is used.
The launcher never syncs with the host (no .item() / .tolist()): CUDA-graph safe.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["fp8_gemm_nt_triton", "default_config", "BLOCK_K", "GROUP_M"]

BLOCK_K = 128  # = scale granularity along k; fixed
GROUP_M = 8  # m tiles per L2 swizzle group
_E8M0 = torch.float8_e8m0fnu
_FP8 = torch.float8_e4m3fn


@triton.jit
def _e8m0_to_f32(s):
    """E8M0 bytes (uint8 tensor) -> fp32 2^(s-127), bit-exact: exponent field s, byte 0 -> 2^-127, 255 -> NaN."""
    s32 = s.to(tl.int32)
    bits = tl.where(s32 == 0, 0x00400000, s32 << 23)  # 2^-127 is the subnormal with mantissa bit 22 set
    bits = tl.where(s32 == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _f32_to_bf16_rne(x):
    """fp32 -> bf16 round-to-nearest-even by integer ops (the CPU interpreter's cast does not round to nearest).

    Exact for finite values and infinities (a carry out of the mantissa correctly rounds up to the next binade or
    to inf); quiet NaNs stay NaN.
    """
    bits = x.to(tl.int32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _fp8_gemm_nt_kernel(
    a_ptr,
    sfa_ptr,
    b_ptr,
    sfb_ptr,
    c_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_am,
    stride_sfa_m,
    stride_sfa_k,
    stride_bn,
    stride_sfb_n,
    stride_sfb_k,
    stride_cm,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SFA_E8M0: tl.constexpr,
    SFB_E8M0: tl.constexpr,
    HAS_C: tl.constexpr,
    EVEN_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    BF16_RNE_BITS: tl.constexpr,
):
    """a e4m3 [M, K]; sfa fp32|uint8 [M, cdiv(K,128)]; b e4m3 [N, K]; sfb fp32|uint8 [cdiv(N,128), cdiv(K,128)];
    c fp32|bf16 [M, N] (HAS_C); out bf16|fp32 [M, N]. Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    r_mask = rows < M
    c_mask = cols < N
    offs_k = tl.arange(0, BLOCK_K)  # [BK]
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + offs_k[None, :]  # [BM, BK]
    b_ptrs = b_ptr + cols.to(tl.int64)[:, None] * stride_bn + offs_k[None, :]  # [BN, BK]
    sfa_ptrs = sfa_ptr + rows.to(tl.int64) * stride_sfa_m  # [BM]
    sfb_row = sfb_ptr + ((pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sfb_n  # scalar: BLOCK_N divides 128

    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        if EVEN_K:
            a = tl.load(a_ptrs + k0, mask=r_mask[:, None], other=0.0)
            b = tl.load(b_ptrs + k0, mask=c_mask[:, None], other=0.0)
        else:
            k_mask = (k0 + offs_k) < K
            a = tl.load(a_ptrs + k0, mask=r_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(b_ptrs + k0, mask=c_mask[:, None] & k_mask[None, :], other=0.0)
        if SFA_E8M0:
            sa = _e8m0_to_f32(tl.load(sfa_ptrs + kb * stride_sfa_k, mask=r_mask, other=127))
        else:
            sa = tl.load(sfa_ptrs + kb * stride_sfa_k, mask=r_mask, other=1.0)
        if SFB_E8M0:
            sb = _e8m0_to_f32(tl.load(sfb_row + kb * stride_sfb_k))
        else:
            sb = tl.load(sfb_row + kb * stride_sfb_k)
        s = sa * sb  # [BM] fp32
        if SWAP_AB:
            blk = tl.dot(b, tl.trans(a))  # [BN, BM] fp32, fresh accumulator per 128-wide k block
            acc += blk * s[None, :]
        else:
            blk = tl.dot(a, tl.trans(b))  # [BM, BN]
            acc += blk * s[:, None]

    if SWAP_AB:
        o_off = rows.to(tl.int64)[None, :] * stride_om + cols[:, None]  # [BN, BM]
        mask = r_mask[None, :] & c_mask[:, None]
        if HAS_C:
            acc += tl.load(c_ptr + rows.to(tl.int64)[None, :] * stride_cm + cols[:, None], mask=mask).to(tl.float32)
    else:
        o_off = rows.to(tl.int64)[:, None] * stride_om + cols[None, :]  # [BM, BN]
        mask = r_mask[:, None] & c_mask[None, :]
        if HAS_C:
            acc += tl.load(c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :], mask=mask).to(tl.float32)
    if BF16_RNE_BITS:
        tl.store(out_ptr + o_off, _f32_to_bf16_rne(acc), mask=mask)
    else:
        tl.store(out_ptr + o_off, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _interpreting() -> bool:
    """True when Triton runs in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def default_config(m: int, n: int) -> tuple[int, int, int, int]:
    """Heuristic (block_m, block_n, num_warps, num_stages) for an [m, n] output (k is walked 128 at a time).

    Decode (m <= 64): swap-AB tiles; block_m = 16/32/64 (the MMA's N side), block_n = 64 (the FP8 wgmma's
    M side) or 32 when n is too small to give >= 128 programs (memory bound: spread b over the SMs).
    Prefill: 64 x 128 tiles for m <= 256, else 128 x 128 with 8 warps (two consumer warpgroups).
    Untuned (no GPU run yet): chosen from the smem budget, stages x (block_m + block_n) x 128 bytes <= 128 KiB.
    Offline sm_90 compile (Triton 3.9): swap 16x64, 64x128 and 128x128 lower to FP8 wgmma, swap 16x32 to
    mma.sync e4m3; with k % 16 == 0 (16-divisible strides) the loads are cp.async-pipelined num_stages deep.
    """
    if m <= 64:
        block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
        block_n = 64 if triton.cdiv(n, 64) >= 128 else 32
        return block_m, block_n, 4, 4
    if m <= 256:
        return 64, 128, 4, 4
    return 128, 128, 8, 4


def _check_block(name: str, v: int, allowed: tuple[int, ...]) -> None:
    if v not in allowed:
        raise ValueError(f"{name}: expected one of {allowed}, got {v}")


def fp8_gemm_nt_triton(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    out: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    swap_ab: bool | None = None,
) -> torch.Tensor:
    """out = c + dequant(a, sfa) @ dequant(b, sfb)^T on already-validated operands (see `api.fp8_gemm_nt`).

    a: float8_e4m3fn [m, k], unit stride along k; sfa: float32 | float8_e8m0fnu [m, ceil(k/128)] (any strides);
    b: float8_e4m3fn [n, k], unit stride along k; sfb: float32 | float8_e8m0fnu [ceil(n/128), ceil(k/128)];
    out: bfloat16 | float32 [m, n], unit stride along n; c: optional float32 | bfloat16 [m, n] (may alias out).
    Requires k % 16 == 0. block_m in {16, 32, 64, 128}, block_n in {16, 32, 64, 128} (divides 128);
    None -> `default_config(m, n)`; swap_ab None -> m <= 64. Returns out. Never syncs with the host.
    """
    m, k = a.shape
    n = b.shape[0]
    if a.dtype != _FP8 or b.dtype != _FP8:
        raise TypeError(f"a and b must be float8_e4m3fn, got {a.dtype} and {b.dtype}")
    if b.shape[1] != k:
        raise ValueError(f"K mismatch: a has K={k} but b has K={b.shape[1]}")
    if k % 16:
        raise ValueError(f"k must be a multiple of 16 for the Triton FP8 GEMM, got k={k}")
    kb = triton.cdiv(k, BLOCK_K)
    if tuple(sfa.shape) != (m, kb) or tuple(sfb.shape) != (triton.cdiv(n, 128), kb):
        raise ValueError(
            f"scale shapes: expected sfa {(m, kb)} and sfb {(triton.cdiv(n, 128), kb)}, "
            f"got {tuple(sfa.shape)} and {tuple(sfb.shape)}"
        )
    for name, t in (("sfa", sfa), ("sfb", sfb)):
        if t.dtype not in (torch.float32, _E8M0):
            raise TypeError(f"{name}: expected float32 or float8_e8m0fnu scales, got {t.dtype}")
    if out.dtype not in (torch.bfloat16, torch.float32) or tuple(out.shape) != (m, n):
        raise ValueError(f"out: expected bfloat16/float32 [{m}, {n}], got {out.dtype} {tuple(out.shape)}")
    if c is not None and (c.dtype not in (torch.bfloat16, torch.float32) or tuple(c.shape) != (m, n)):
        raise ValueError(f"c: expected bfloat16/float32 [{m}, {n}], got {c.dtype} {tuple(c.shape)}")
    for name, t in (("a", a), ("b", b), ("out", out), ("c", c)):
        if t is not None and t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name}: expected unit stride along its last dim, got strides {t.stride()}")
    dm, dn, dw, ds = default_config(m, n)
    block_m = dm if block_m is None else block_m
    block_n = dn if block_n is None else block_n
    _check_block("block_m", block_m, (16, 32, 64, 128))
    _check_block("block_n", block_n, (16, 32, 64, 128))
    if m == 0 or n == 0:
        return out
    if k == 0:  # no k blocks: out = c (or 0); kept off the kernel so sfa/sfb (empty) are never indexed
        return out.copy_(c) if c is not None else out.zero_()
    swap_ab = m <= 64 if swap_ab is None else swap_ab
    sfa_k = sfa.view(torch.uint8) if sfa.dtype == _E8M0 else sfa  # bit views: no copies
    sfb_k = sfb.view(torch.uint8) if sfb.dtype == _E8M0 else sfb
    c_arg = out if c is None else c  # dummy pointer when HAS_C is False (never read)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _fp8_gemm_nt_kernel[grid](
        a,
        sfa_k,
        b,
        sfb_k,
        c_arg,
        out,
        m,
        n,
        k,
        a.stride(0),
        sfa_k.stride(0),
        sfa_k.stride(1),
        b.stride(0),
        sfb_k.stride(0),
        sfb_k.stride(1),
        c_arg.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=BLOCK_K,
        GROUP_M=GROUP_M,
        SFA_E8M0=sfa.dtype == _E8M0,
        SFB_E8M0=sfb.dtype == _E8M0,
        HAS_C=c is not None,
        EVEN_K=k % BLOCK_K == 0,
        SWAP_AB=bool(swap_ab),
        BF16_RNE_BITS=out.dtype == torch.bfloat16 and _interpreting(),
        num_warps=dw if num_warps is None else num_warps,
        num_stages=ds if num_stages is None else num_stages,
    )
    return out
