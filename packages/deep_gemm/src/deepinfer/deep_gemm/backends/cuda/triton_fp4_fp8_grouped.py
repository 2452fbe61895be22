"""Triton M-grouped GEMM, contiguous layout: FP8 (e4m3) activations x FP4 (e2m1) weights ("W4A8" MoE experts).

out[r] = (a[r] * sfa[r]) @ W_i^T for every row r of group i, W_i = e2m1(packed[i]) * 2^(sw[i] - 127) [n, k] with
one E8M0 scale per 32 inputs; a's scales sfa are fp32, one per 128 inputs. bf16 out, fp32 accumulation. Groups
come from `offs` (int32 [g], cumulative END rows, as `triton_fp4_grouped.py`); empty groups read no weights.

Why FP8 tensor cores: the W4A16 kernels dequantise every weight to bf16 (>= 3.25 instructions per weight), which
caps decode at ~1.7 TB/s of FP4 on an H200 (ALU-bound). Here a weight becomes an FP8 byte with <= 1 instruction:

* e2m1 -> e4m3 exactly: every e2m1 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6} times 2^-6 is an e4m3 value whose byte is
  just the code's bits moved: sign to bit 7, (exponent, mantissa) = 3 magnitude bits to bits 4..2 (e4m3 bias 7 vs
  e2m1 bias 1 gives the 2^-6; code 1 = 0.5 lands on the e4m3 SUBNORMAL 0x04 = 2^-7, which tensor cores take as
  is: no flush). Per 32-bit word of 8 codes (`_e2m1x8_e4m3_asm`): odd elements (high nibbles) =
  (w & 0x80808080) | ((w >> 2) & 0x1C1C1C1C), even elements (low nibbles) = ((w << 4) & 0x80808080) |
  ((w << 2) & 0x1C1C1C1C): 7 instructions (and, shr, lop3; shl, shl, and, lop3) = 0.875 per weight, vs 26-30 per
  8 in the W4A16 kernels. No table, no scale: the 2^6 goes onto the activation scale (below);
* scales on the fp32 accumulator, DeepGEMM-style promotion: one FP8 dot per 32-k group (K = 32 is one wgmma),
  blk += dot * 2^(s-127) per weight row, and per 128-k block acc += blk * (64 * sfa[row]). Chosen over folding
  the per-32 scale into the e4m3 exponent (a per-row base exponent + per-group remainder): adding the remainder to
  the exponent field is one SIMD add per 4 weights, but codes 0 and 1 (zero, the subnormal) need fix-ups
  (~3 more ops per 4 weights) and an exact fallback when the remainders span more than e4m3's range; the
  promotion costs block_m / 32 FFMA per weight (0.5 at the decode tile) plus one fp32 scale per row and group,
  and is exact for every scale byte in [1, 254]. (Prefill with 64-128-row tiles pays 2-4 FFMA per weight there:
  the benchmark says whether it keeps up with the FP8 grouped kernel.)
* swap AB: acc^T [BLOCK_N, BLOCK_M] += W [BLOCK_N, 32] @ a^T [32, BLOCK_M], the converted weights are the MMA's
  A operand (registers on Hopper) and the few token rows its N side, as in the W4A16 decode kernels;
* the even / odd bytes are re-interleaved in registers (`tl.join` + reshape) so one 32-deep dot takes `a` in its
  natural k order;
* split-K (SPLIT_K constexpr): k splits write fp32 partials, `triton_fp4_grouped_v3._splitk_reduce` sums them in
  a fixed order (deterministic).

Exact (products exact in fp32) apart from the accumulation order, for weight scale bytes in [1, 254]; byte 0
(2^-127) reads as 0 and 255 (NaN) is undefined. The interpreter (and use_asm=False) runs the same bit trick with
Triton integer ops. The launcher never syncs with the host: CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_fp4_grouped import _int32_view, _interpreting
from .triton_fp4_grouped_v3 import _splitk_reduce
from .w4a8_configs import W4A8Config, default_w4a8_config

__all__ = ["m_grouped_fp8_fp4_gemm_nt_offsets_triton"]


@triton.jit
def _e2m1x8_e4m3_asm(packed):
    """packed uint8 [...] (low nibble = even element) -> (even, odd) uint8 e4m3 bytes of e2m1 * 2^-6, 4 bytes
    (8 codes) per 32-bit register; lop3 LUT 0xF8 = a | (b & c)."""
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 h, y, l, z;
        and.b32 h, $2, 0x80808080;
        shr.b32 y, $2, 2;
        lop3.b32 $1, h, y, 0x1C1C1C1C, 0xF8;
        shl.b32 l, $2, 4;
        shl.b32 z, $2, 2;
        and.b32 l, l, 0x80808080;
        lop3.b32 $0, l, z, 0x1C1C1C1C, 0xF8;
        }
        """,
        "=r,=r,r",
        [packed],
        dtype=(tl.uint8, tl.uint8),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _e2m1_e4m3_int(packed):
    """Integer-op twin of `_e2m1x8_e4m3_asm` (interpreter / use_asm=False): uint8 -> (even, odd) uint8."""
    p = packed.to(tl.int32)
    even = ((p << 4) & 0x80) | ((p << 2) & 0x1C)
    odd = (p & 0x80) | ((p >> 2) & 0x1C)
    return even.to(tl.uint8), odd.to(tl.uint8)


@triton.jit
def _load_rows(ptrs, mask, EVEN: tl.constexpr):
    """Load one value per weight row; the mask only when n is not a multiple of the tile."""
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=mask, other=0)


@triton.jit(do_not_specialize=["M"])  # M varies per call (tokens): one compile for all
def _w4a8_grouped_kernel(
    a_ptr, sa_ptr, b_ptr, s_ptr, offs_ptr, out_ptr, ws_ptr,
    M, N, K,
    stride_am, stride_sam, stride_bg, stride_bn, stride_sg, stride_sn, stride_om, stride_wk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_N: tl.constexpr,
    USE_ASM: tl.constexpr,
):  # fmt: skip
    """a e4m3 [M, K]; sa fp32 [M, K/128]; b uint8 [G, N, K/2]; s int32 [G, N, K/128] (4 E8M0 bytes a word, low
    byte = first group); offs int32 [G];
    out bf16 [M, N]; ws fp32 [SPLIT_K, M, N] (row stride N; unused when SPLIT_K == 1).
    Grid (G, cdiv(N, BLOCK_N), SPLIT_K)."""
    gid = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    end = tl.minimum(tl.load(offs_ptr + gid), M)
    start = tl.maximum(tl.where(gid > 0, tl.load(offs_ptr + tl.maximum(gid - 1, 0)), 0), 0)
    kb_len = K // (128 * SPLIT_K)  # 128-deep blocks per split
    kb_beg = pid_k * kb_len

    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    b_rows = b_ptr + gid.to(tl.int64) * stride_bg + n.to(tl.int64) * stride_bn  # [BN]
    s_rows = s_ptr + gid.to(tl.int64) * stride_sg + n.to(tl.int64) * stride_sn  # [BN]
    j = tl.arange(0, 16)  # the 16 bytes (32 codes) of one scale group
    kk = tl.arange(0, 32)

    for m0 in range(start, end, BLOCK_M):  # zero trips for an empty group: no weight bytes are read
        rows = m0 + tl.arange(0, BLOCK_M)
        r_mask = rows < end
        a_rows = a_ptr + rows.to(tl.int64)[:, None] * stride_am  # [BM, 1]
        sa_rows = sa_ptr + rows.to(tl.int64) * stride_sam  # [BM]
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # acc^T: swap AB
        # A block's 4 weight-scale bytes are ONE int32 word per weight row, split into bytes in registers. Triton
        # does not pipeline these small loads (nor sa's), so they are software-pipelined by hand: the next block's
        # scale word is loaded one iteration ahead, sa at the top of the iteration that uses it at the bottom.
        s_word = _load_rows(s_rows + kb_beg, n_mask, EVEN_N)  # [BN] int32
        kb_last = kb_beg + kb_len - 1
        for kb in range(kb_beg, kb_beg + kb_len):
            sa = tl.load(sa_rows + kb, mask=r_mask, other=0.0) * 64.0  # 2^6: the e4m3 encoding's 2^-6 undone
            s_next = _load_rows(s_rows + tl.minimum(kb + 1, kb_last), n_mask, EVEN_N)
            blk = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for gi in tl.static_range(4):  # the 4 weight-scale groups of a 128-deep activation-scale block
                k0 = kb * 128 + gi * 32
                b_ptrs = b_rows[:, None] + (k0 // 2 + j)[None, :]  # [BN, 16]
                if EVEN_N:
                    packed = tl.load(b_ptrs)
                else:
                    packed = tl.load(b_ptrs, mask=n_mask[:, None], other=0)
                if USE_ASM:
                    w_even, w_odd = _e2m1x8_e4m3_asm(packed)
                else:
                    w_even, w_odd = _e2m1_e4m3_int(packed)
                w = tl.reshape(tl.join(w_even, w_odd), [BLOCK_N, 32]).to(tl.float8e4nv, bitcast=True)
                a = tl.load(a_rows + (k0 + kk)[None, :], mask=r_mask[:, None], other=0.0)  # [BM, 32] e4m3
                sb = (s_word >> (8 * gi)) & 0xFF  # this group's E8M0 byte
                sw = (sb << 23).to(tl.float32, bitcast=True)  # 2^(s-127), exact for s in [1, 254]
                blk += tl.dot(w, tl.trans(a)) * sw[:, None]
            acc += blk * sa[None, :]
            s_word = s_next
        o_mask = r_mask[None, :] & n_mask[:, None]
        if SPLIT_K == 1:
            o_ptrs = out_ptr + rows.to(tl.int64)[None, :] * stride_om + n[:, None]  # [BN, BM]
            tl.store(o_ptrs, acc.to(tl.bfloat16), mask=o_mask)
        else:
            w_ptrs = ws_ptr + pid_k.to(tl.int64) * stride_wk + rows.to(tl.int64)[None, :] * N + n[:, None]
            tl.store(w_ptrs, acc, mask=o_mask)


def m_grouped_fp8_fp4_gemm_nt_offsets_triton(
    a: torch.Tensor, sfa: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor,
    out: torch.Tensor, *, config: W4A8Config | None = None, expected_m: int | None = None,
    use_asm: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """Launch on validated operands (see `api_w4a8.py`); returns `out`.

    a: float8_e4m3fn [m, k] contiguous; sfa: float32 [m, k/128] (row stride any, k stride 1); packed:
    int8/uint8 [g, n, k/2]; scales: float8_e8m0fnu/uint8 [g, n, k/32]; offs: int32 [g]; out: bf16 [m, n].
    config None -> `default_w4a8_config(m, g, expected_m)`; k must be a multiple of 128 * config.split_k.
    use_asm None -> inline PTX on a GPU, integer ops in the interpreter.
    """
    m, k = a.shape
    g, n, _ = packed.shape
    cfg = default_w4a8_config(m, g, expected_m) if config is None else config
    if not isinstance(cfg, W4A8Config):
        raise TypeError(f"config: expected a W4A8Config or None, got {type(cfg).__name__}")
    if k % (128 * cfg.split_k):
        raise ValueError(f"config.split_k: expected 128 * split_k to divide k={k}, got split_k={cfg.split_k}")
    if m == 0 or n == 0 or g == 0:
        return out
    if use_asm is None:
        use_asm = not _interpreting()
    b_u8 = packed.view(torch.uint8)
    s32 = _int32_view(scales.view(torch.uint8))  # [g, n, k/128] words (a copy only when misaligned)
    split = cfg.split_k
    ws = torch.empty((split, m, n), dtype=torch.float32, device=a.device) if split > 1 else out
    grid = (g, triton.cdiv(n, cfg.block_n), split)
    _w4a8_grouped_kernel[grid](
        a, sfa, b_u8, s32, offs, out, ws,
        m, n, k,
        a.stride(0), sfa.stride(0), b_u8.stride(0), b_u8.stride(1), s32.stride(0), s32.stride(1), out.stride(0),
        ws.stride(0) if split > 1 else 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT_K=split, EVEN_N=n % cfg.block_n == 0, USE_ASM=bool(use_asm),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if split > 1:
        br, bc = 16, 256
        _splitk_reduce[(triton.cdiv(m, br), triton.cdiv(n, bc))](
            ws, out, offs, g, m, n, ws.stride(0), out.stride(0), SPLIT_K=split, BLOCK_R=br, BLOCK_C=bc, num_warps=4
        )
    return out
