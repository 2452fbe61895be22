"""Second W4A16 grouped kernel ("kernel 2" of `W4A16Config`): same contract and dequantisation as
`triton_fp4_grouped.py`, restructured to spend fewer instructions per weight. Not the default until the GPU
sweep says so (the benchmark times both).

Differences from kernel 1 (same grid, same row-tile loop, same swap-AB orientation):

* natural k order: the even / odd halves the dequantiser returns are interleaved back in registers
  (`tl.join` + reshape), so ONE dot of depth BLOCK_K takes `a` as loaded ([BLOCK_M, BLOCK_K] bf16, transposed
  view): no per-tile split of `a` into even / odd columns, and `a` can go to shared memory straight from a
  cp.async load (wgmma reads it there);
* scales as one int32 word per weight row and k step (BLOCK_K = 128: the 4 E8M0 bytes of the step; rows of
  k/32 bytes are 4-byte aligned since k % 128 == 0), split into bytes with shifts in registers instead of
  [BLOCK_N, BLOCK_K/32] byte gathers;
* addresses as int32 offsets from per-program scalar base pointers (64-bit math once per program, not per
  element), and EVEN_N (n % BLOCK_N == 0, the V4 shapes) drops the column masks.

BLOCK_K is fixed at 128 here (one scale word per row and step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_fp4_grouped import _e2m1_bf16, _e2m1x4_bf16_asm, _int32_view, _scale_bf16x2
from .w4a16_configs import W4A16Config

__all__ = ["launch_v2"]


@triton.jit(do_not_specialize=["M"])  # M varies per call (tokens): one compile for all
def _w4a16_grouped_kernel_v2(
    a_ptr, b_ptr, s_ptr, offs_ptr, out_ptr,
    M, N, K,
    stride_am, stride_bg, stride_bn, stride_sg, stride_sn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr, DOT_FP32: tl.constexpr,
    USE_ASM: tl.constexpr,
):  # fmt: skip
    """a bf16 [M, K]; b uint8 [G, N, K/2]; s int32 [G, N, K/128] (4 E8M0 bytes a word); offs int32 [G];
    out bf16 [M, N]. Strides in elements of each tensor's own dtype."""
    BLOCK_K: tl.constexpr = 128
    gid = tl.program_id(0)
    pid_n = tl.program_id(1)
    end = tl.minimum(tl.load(offs_ptr + gid), M)
    start = tl.maximum(tl.where(gid > 0, tl.load(offs_ptr + tl.maximum(gid - 1, 0)), 0), 0)

    n_loc = tl.arange(0, BLOCK_N)  # [BN]
    n_mask = (pid_n * BLOCK_N + n_loc) < N
    b_base = b_ptr + gid.to(tl.int64) * stride_bg + (pid_n * BLOCK_N).to(tl.int64) * stride_bn
    s_base = s_ptr + gid.to(tl.int64) * stride_sg + (pid_n * BLOCK_N).to(tl.int64) * stride_sn
    grp = tl.arange(0, 4)  # the 4 scale groups of a k step
    byte3 = grp[:, None] * 16 + tl.arange(0, 16)[None, :]  # [4, 16]
    b_off = n_loc[:, None, None] * stride_bn + byte3[None, :, :]  # [BN, 4, 16] int32
    s_off = n_loc * stride_sn  # [BN] int32
    kk = tl.arange(0, BLOCK_K)

    for m0 in range(start, end, BLOCK_M):  # zero trips for an empty group: no weight bytes are read
        rows = m0 + tl.arange(0, BLOCK_M)
        r_mask = rows < end
        a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + kk[None, :]  # [BM, BK]
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # acc^T: swap AB
        for k0 in range(0, K, BLOCK_K):
            if EVEN_N:
                packed = tl.load(b_base + (b_off + k0 // 2))  # [BN, 4, 16] uint8
                sw = tl.load(s_base + (s_off + k0 // 128))  # [BN] int32: 4 scale bytes
            else:
                packed = tl.load(b_base + (b_off + k0 // 2), mask=n_mask[:, None, None], other=0)
                sw = tl.load(s_base + (s_off + k0 // 128), mask=n_mask, other=0)
            sb = ((sw[:, None] >> (grp * 8)[None, :]) & 0xFF).to(tl.uint8)  # [BN, 4]
            if USE_ASM:
                w_lo, w_hi = _e2m1x4_bf16_asm(packed, tl.broadcast_to(_scale_bf16x2(sb)[:, :, None], [BLOCK_N, 4, 16]))
            else:
                p32 = packed.to(tl.int32)
                sbits = ((sb.to(tl.int32) - 1) << 7)[:, :, None]
                w_lo = _e2m1_bf16(p32 & 15, sbits)
                w_hi = _e2m1_bf16(p32 >> 4, sbits)
            w = tl.reshape(tl.join(w_lo, w_hi), [BLOCK_N, BLOCK_K])  # natural k order: (lo, hi) per byte
            a = tl.load(a_ptrs + k0, mask=r_mask[:, None], other=0.0)  # [BM, BK] bf16
            if DOT_FP32:
                acc = tl.dot(w.to(tl.float32), tl.trans(a.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(w, tl.trans(a), acc)
        o_ptrs = out_ptr + rows.to(tl.int64)[None, :] * stride_om + (pid_n * BLOCK_N + n_loc)[:, None]
        tl.store(o_ptrs, acc.to(tl.bfloat16), mask=r_mask[None, :] & n_mask[:, None])


def launch_v2(
    a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor, out: torch.Tensor,
    cfg: W4A16Config, dot_fp32: bool, use_asm: bool,
) -> torch.Tensor:  # fmt: skip
    """Launch kernel 2 on validated operands (see `triton_fp4_grouped.m_grouped_bf16_fp4_gemm_nt_contiguous_triton`).

    cfg.block_k must be 128. The scales are read as int32 words, so their start must be 4-byte aligned
    (a copy is made otherwise).
    """
    m, k = a.shape
    g, n, _ = packed.shape
    if cfg.block_k != 128:
        raise ValueError(f"config.block_k: kernel 2 needs 128, got {cfg.block_k}")
    b_u8 = packed.view(torch.uint8)
    s32 = _int32_view(scales.view(torch.uint8))  # [g, n, k/128] words
    grid = (g, triton.cdiv(n, cfg.block_n))
    _w4a16_grouped_kernel_v2[grid](
        a, b_u8, s32, offs, out,
        m, n, k,
        a.stride(0), b_u8.stride(0), b_u8.stride(1), s32.stride(0), s32.stride(1), out.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, EVEN_N=n % cfg.block_n == 0, DOT_FP32=bool(dot_fp32),
        USE_ASM=bool(use_asm), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out
