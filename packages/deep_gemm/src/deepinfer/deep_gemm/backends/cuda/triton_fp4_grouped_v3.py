"""Third W4A16 grouped kernel ("kernel 3" of `W4A16Config`), aimed at decode (1-16 rows per expert), where the
GEMM is a weight stream and the instructions spent per dequantised weight set the speed.

Same contract as `triton_fp4_grouped.py` (kernel 1): same swap-AB orientation, same even / odd split into two
dots, `a` read as int32 bf16 pairs, empty groups read no weights. What changes:

* dequantisation with fewer PTX ops per 32-bit word (8 codes): kernel 1 writes 30 (2 prmt, 2 shl, 2 scale
  lop3, 4 x (and, shr, and, or, 2 mul)), kernel 3 writes 26, or 22 with FOLD:
  `prmt` puts bytes b0, b1 (b2, b3) at bits 8..15 / 24..31 of a word u with zero bytes between them, so
  `v = u & 0xF000F000` holds the two high nibbles at the top of each 16-bit lane (sign at bit 15) and
  `v = (u << 4) & 0xF000F000` the two low nibbles; then ONE lop3 `(v | v >> 6) & 0x81C081C0` keeps the sign
  at bit 15 and moves the 3 magnitude bits to bits 8..6: the bf16x2 bits of e2m1 * 2^-126 (code 1 = 0.5 gives
  the bf16 subnormal 0x0040, which `mul.rn.bf16x2` keeps: no flush). Measured in the sm_90a SASS (Triton 3.9,
  16 x 64 x 128 tile, 2 warps; tests/dg_w4a16_sm90_compile.py builds it): ptxas already fuses kernel 1's
  and/or into LOP3, so the k-loop body is 588 instructions for kernel 1, 584 for kernel 3 and 521 with FOLD
  (the second HMUL2 per word is what goes). Registers 189 / 176 / 180, no spills;
* FOLD (constexpr): 2^126 is folded into the scale, one bf16x2 multiply by 2^(s-1) per two weights instead
  of two multiplies (by 2^126, then by 2^(s-127)). 2^(s-1) is a finite bf16 only for s <= 128 (scales up to
  2), so FOLD is exact for scale bytes in [2, 128] and NOT for larger ones (inf / garbage); without FOLD the
  kernel is exact on kernel 1's domain [2, 252]. A scale above 2 would mean expert weights up to 12 * 2^k, unusual
  for a checkpoint (not checked against the V4 weights here), but the API documents [2, 252]: FOLD stays an
  opt-in config until the API (and a load-time check of the scales) says otherwise;
* split-K (SPLIT_K constexpr, grid (g, n tiles, SPLIT_K)): at 1-8 rows per expert each program streams a long
  [BLOCK_N, k] weight slice with few programs alive when few experts are active; split-K multiplies the programs
  (bytes in flight) and shortens the slice. Atomic-free: each split writes fp32 partials to a workspace
  [SPLIT_K, m, n]; `_splitk_reduce` sums them in a fixed order (deterministic) and rounds once to bf16;
* EVEN_N (n % BLOCK_N == 0, the V4 shapes) drops the column masks.

The non-asm path (interpreter; DEEPINFER_DG_W4A16_ASM=0 on a GPU) runs the same bit trick with Triton integer
ops and fp32 multiplies, so the CPU tests check the bit layout and the subnormal code 1 too; a PTX emulator in
tests/test_dg_w4a16_v3.py runs the asm strings themselves on every byte value.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_fp4_grouped import _int32_view
from .w4a16_configs import W4A16Config

__all__ = ["launch_v3"]


@triton.jit
def _scale_mult(sb, FOLD: tl.constexpr):
    """E8M0 bytes -> int32 bf16x2 bits (both lanes) of the per-32 multiplier: 2^(s-1) with FOLD, else 2^(s-127)."""
    s = sb.to(tl.int32)
    if FOLD:
        s = s + 126
    return (s << 7) * 0x10001


@triton.jit
def _e2m1x4_fold_asm(packed, mult):
    """4 packed bytes (uint8, low nibble = even element) -> (even, odd) bf16 = e2m1 * 2^(s-1) * 2^-126, exact.

    mult: int32 `_scale_mult(.., FOLD=True)` per element. Lane i of every output word takes element i's
    multiplier (lop3 0xD8 = (a & ~c) | (b & c) merges two elements' words).
    """
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 z, s0, s1, u, v, y, x;
        mov.b32 z, 0;
        lop3.b32 s0, $5, $6, 0xFFFF0000, 0xD8;
        lop3.b32 s1, $7, $8, 0xFFFF0000, 0xD8;
        prmt.b32 u, $4, z, 0x1404;
        and.b32 v, u, 0xF000F000; shr.b32 y, v, 6; lop3.b32 x, v, y, 0x81C081C0, 0xA8;
        mul.rn.bf16x2 $2, x, s0;
        shl.b32 v, u, 4; and.b32 v, v, 0xF000F000; shr.b32 y, v, 6; lop3.b32 x, v, y, 0x81C081C0, 0xA8;
        mul.rn.bf16x2 $0, x, s0;
        prmt.b32 u, $4, z, 0x3424;
        and.b32 v, u, 0xF000F000; shr.b32 y, v, 6; lop3.b32 x, v, y, 0x81C081C0, 0xA8;
        mul.rn.bf16x2 $3, x, s1;
        shl.b32 v, u, 4; and.b32 v, v, 0xF000F000; shr.b32 y, v, 6; lop3.b32 x, v, y, 0x81C081C0, 0xA8;
        mul.rn.bf16x2 $1, x, s1;
        }
        """,
        "=r,=r,=r,=r,r,r,r,r,r",
        [packed, mult],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _e2m1x4_asm(packed, mult):
    """As `_e2m1x4_fold_asm` with a separate multiply by 2^126 (mult = 2^(s-127)): exact for s in [2, 252]."""
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 z, c, s0, s1, u, v, y, x;
        mov.b32 z, 0;
        mov.b32 c, 0x7E807E80;
        lop3.b32 s0, $5, $6, 0xFFFF0000, 0xD8;
        lop3.b32 s1, $7, $8, 0xFFFF0000, 0xD8;
        prmt.b32 u, $4, z, 0x1404;
        and.b32 v, u, 0xF000F000; shr.b32 y, v, 6; lop3.b32 x, v, y, 0x81C081C0, 0xA8;
        mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 $2, x, s0;
        shl.b32 v, u, 4; and.b32 v, v, 0xF000F000; shr.b32 y, v, 6; lop3.b32 x, v, y, 0x81C081C0, 0xA8;
        mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 $0, x, s0;
        prmt.b32 u, $4, z, 0x3424;
        and.b32 v, u, 0xF000F000; shr.b32 y, v, 6; lop3.b32 x, v, y, 0x81C081C0, 0xA8;
        mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 $3, x, s1;
        shl.b32 v, u, 4; and.b32 v, v, 0xF000F000; shr.b32 y, v, 6; lop3.b32 x, v, y, 0x81C081C0, 0xA8;
        mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 $1, x, s1;
        }
        """,
        "=r,=r,=r,=r,r,r,r,r,r",
        [packed, mult],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _e2m1_f32(code):
    """e2m1 codes (int32 0..15) -> float32 e2m1 * 2^-126: the asm's bf16 bits `(v | v >> 6) & 0x81C0`
    (v = code << 12; sign at bit 15, magnitude bits at 8..6; code 1 -> 0x0040, a subnormal) widened to fp32 by
    `<< 16` (fp32 = bf16 bits followed by 16 zero bits, subnormals included: the interpreter's bf16 -> fp32 cast
    flushes them, a shift does not)."""
    v = code << 12
    return (((v | (v >> 6)) & 0x81C0) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _dequant_int(packed, sb, FOLD: tl.constexpr):
    """Integer-op twin of the asm: packed uint8 [BN, SG, 16], sb uint8 [BN, SG] -> (even, odd) bf16.

    The multiplies run in fp32 (exact: a 2-bit significand times a power of two; Triton's fp32 mul is not
    .ftz, which the sm90 compile check asserts), and fp32 shares bf16's exponent range, so the subnormal
    e2m1 * 2^-126 of code 1 survives as on the asm path. Multiplier bits: exponent field s (2^(s-127)) or
    s + 126 (FOLD: 2^(s-1)) at bit 23.
    """
    p32 = packed.to(tl.int32)
    s = sb.to(tl.int32)
    if FOLD:
        s = s + 126
    mult = (s << 23).to(tl.float32, bitcast=True)[:, :, None]
    w_even = _e2m1_f32(p32 & 15)
    w_odd = _e2m1_f32(p32 >> 4)
    if not FOLD:
        w_even = w_even * 8.507059173023462e37  # 2^126
        w_odd = w_odd * 8.507059173023462e37
    return (w_even * mult).to(tl.bfloat16), (w_odd * mult).to(tl.bfloat16)


@triton.jit(do_not_specialize=["M"])  # M varies per call (tokens): one compile for all
def _w4a16_grouped_kernel_v3(
    a_ptr, b_ptr, s_ptr, offs_ptr, out_ptr, ws_ptr,
    M, N, K,
    stride_am, stride_bg, stride_bn, stride_sg, stride_sn, stride_om, stride_wk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    EVEN_N: tl.constexpr, FOLD: tl.constexpr, DOT_FP32: tl.constexpr, USE_ASM: tl.constexpr,
):  # fmt: skip
    """a int32 [M, K/2]; b uint8 [G, N, K/2]; s uint8 [G, N, K/32]; offs int32 [G]; out bf16 [M, N];
    ws fp32 [SPLIT_K, M, N] (row stride N; unused when SPLIT_K == 1). Grid (G, cdiv(N, BLOCK_N), SPLIT_K)."""
    HALF_K: tl.constexpr = BLOCK_K // 2
    SG: tl.constexpr = BLOCK_K // 32
    gid = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    end = tl.minimum(tl.load(offs_ptr + gid), M)
    start = tl.maximum(tl.where(gid > 0, tl.load(offs_ptr + tl.maximum(gid - 1, 0)), 0), 0)
    k_len = K // SPLIT_K
    # multiple_of: without it the compiler cannot prove 16-byte weight rows / 4-byte scale words per k step, and
    # the weight and scale loads lose cp.async pipelining (checked in the sm90 TTGIR: a synchronous scale load).
    k_beg = tl.multiple_of(pid_k * k_len, BLOCK_K)

    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    b_rows = b_ptr + gid.to(tl.int64) * stride_bg + n.to(tl.int64) * stride_bn  # [BN]
    s_rows = s_ptr + gid.to(tl.int64) * stride_sg + n.to(tl.int64) * stride_sn  # [BN]
    grp = tl.arange(0, SG)
    byte3 = grp[:, None] * 16 + tl.arange(0, 16)[None, :]  # [SG, 16]
    c = tl.arange(0, HALF_K)

    for m0 in range(start, end, BLOCK_M):  # zero trips for an empty group: no weight bytes are read
        rows = m0 + tl.arange(0, BLOCK_M)
        r_mask = rows < end
        a_cols = a_ptr + rows.to(tl.int64)[None, :] * stride_am  # [1, BM]
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # acc^T: swap AB
        for k0 in range(k_beg, k_beg + k_len, BLOCK_K):
            b_ptrs = b_rows[:, None, None] + (k0 // 2 + byte3)[None, :, :]
            s_ptrs = s_rows[:, None] + (k0 // 32 + grp)[None, :]
            if EVEN_N:
                packed = tl.load(b_ptrs)  # [BN, SG, 16] uint8
                sb = tl.load(s_ptrs)  # [BN, SG]
            else:
                packed = tl.load(b_ptrs, mask=n_mask[:, None, None], other=0)
                sb = tl.load(s_ptrs, mask=n_mask[:, None], other=0)
            if USE_ASM:
                mult = tl.broadcast_to(_scale_mult(sb, FOLD)[:, :, None], [BLOCK_N, SG, 16])
                if FOLD:
                    w_even, w_odd = _e2m1x4_fold_asm(packed, mult)
                else:
                    w_even, w_odd = _e2m1x4_asm(packed, mult)
            else:
                w_even, w_odd = _dequant_int(packed, sb, FOLD)
            w_even = tl.reshape(w_even, [BLOCK_N, HALF_K])  # columns k0 + 2c
            w_odd = tl.reshape(w_odd, [BLOCK_N, HALF_K])  # columns k0 + 2c + 1
            a_pair = tl.load(a_cols + (k0 // 2 + c)[:, None], mask=r_mask[None, :], other=0)  # [HK, BM] int32
            a_even = a_pair.to(tl.int16).to(tl.bfloat16, bitcast=True)
            a_odd = (a_pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
            if DOT_FP32:
                acc = tl.dot(w_even.to(tl.float32), a_even.to(tl.float32), acc, input_precision="ieee")
                acc = tl.dot(w_odd.to(tl.float32), a_odd.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(w_even, a_even, acc)
                acc = tl.dot(w_odd, a_odd, acc)
        o_mask = r_mask[None, :] & n_mask[:, None]
        if SPLIT_K == 1:
            o_ptrs = out_ptr + rows.to(tl.int64)[None, :] * stride_om + n[:, None]  # [BN, BM]
            tl.store(o_ptrs, acc.to(tl.bfloat16), mask=o_mask)
        else:
            w_ptrs = ws_ptr + pid_k.to(tl.int64) * stride_wk + rows.to(tl.int64)[None, :] * N + n[:, None]
            tl.store(w_ptrs, acc, mask=o_mask)


@triton.jit(do_not_specialize=["M"])
def _splitk_reduce(
    ws_ptr, out_ptr, offs_ptr, G, M, N, stride_wk, stride_om,
    SPLIT_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """out[r, c] = bf16(sum_s ws[s, r, c]) for rows r < offs[G-1] (the grouped rows; later rows untouched)."""
    end = tl.minimum(tl.load(offs_ptr + G - 1), M)
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (r < end)[:, None] & (col < N)[None, :]
    ptrs = ws_ptr + r.to(tl.int64)[:, None] * N + col[None, :]
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):  # fixed order: deterministic
        acc += tl.load(ptrs + s * stride_wk, mask=mask, other=0.0)
    tl.store(out_ptr + r.to(tl.int64)[:, None] * stride_om + col[None, :], acc.to(tl.bfloat16), mask=mask)


def launch_v3(
    a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor, out: torch.Tensor,
    cfg: W4A16Config, dot_fp32: bool, use_asm: bool,
) -> torch.Tensor:  # fmt: skip
    """Launch kernel 3 on validated operands (see `triton_fp4_grouped.m_grouped_bf16_fp4_gemm_nt_contiguous_triton`).

    a bf16 [m, k]; packed uint8/int8 [g, n, k/2]; scales E8M0 [g, n, k/32]; offs int32 [g]; out bf16 [m, n].
    k must be a multiple of cfg.block_k * cfg.split_k. split_k > 1 allocates an fp32 workspace
    [split_k, m, n] (from the caching allocator: CUDA-graph safe) and launches a second, tiny reduce kernel.
    """
    m, k = a.shape
    g, n, _ = packed.shape
    if k % (cfg.block_k * cfg.split_k):
        raise ValueError(
            f"config.split_k: expected k={k} to be a multiple of block_k * split_k = {cfg.block_k * cfg.split_k}"
        )
    a32 = _int32_view(a)
    b_u8 = packed.view(torch.uint8)
    s_u8 = scales.view(torch.uint8)
    split = cfg.split_k
    ws = torch.empty((split, m, n), dtype=torch.float32, device=a.device) if split > 1 else out
    grid = (g, triton.cdiv(n, cfg.block_n), split)
    _w4a16_grouped_kernel_v3[grid](
        a32, b_u8, s_u8, offs, out, ws,
        m, n, k,
        a32.stride(0), b_u8.stride(0), b_u8.stride(1), s_u8.stride(0), s_u8.stride(1), out.stride(0),
        ws.stride(0) if split > 1 else 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split, EVEN_N=n % cfg.block_n == 0,
        FOLD=cfg.fold, DOT_FP32=bool(dot_fp32), USE_ASM=bool(use_asm),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if split > 1:
        br, bc = 16, 256
        _splitk_reduce[(triton.cdiv(m, br), triton.cdiv(n, bc))](
            ws, out, offs, g, m, n, ws.stride(0), out.stride(0), SPLIT_K=split, BLOCK_R=br, BLOCK_C=bc, num_warps=4
        )
    return out
