"""Split-KV sparse sink attention in 64-dim chunks: the `chunked` variant of `triton_split_attn.py` (d = 512).

Same math, grid, split-KV plan, partial workspace and combine kernel as `triton_split_attn._split_attn_kernel`
(same argument list, so the launcher there runs either); selected with
`sparse_attn_split_triton(..., kernel="chunked")`. Not the API default until the GPU run says it is faster.

Why: the fused kernel gathers a [BLOCK_N, 512] tile as one tensor. For FP8 rows it loads the 448 e4m3 bytes and
the 7 UE8M0 scale bytes as [BN, 512] / [BN, 8], multiplies through a [BN, 8, 64] reshape and selects the RoPE
dims with a [BN, 512] `where`, so the whole bf16 tile is built in registers on top of the 128-register [64, 512]
fp32 accumulator (sm_90a compile of the fused FP8 kernel, Triton 3.9: 255 registers, 376 B of stack at
BN = 32 x 3 stages, 840 B at 64 x 2: spills in the inner loop). Here a tile is eight [BN, 64] chunks, each
the operand of its own wgmma: chunk c < 7 is e4m3 bytes [BN, 64] times the row's scale byte c (a [BN] vector
broadcast along the chunk: one multiply per element, no division, no gather, no reshape; exact in bf16, an
e4m3 value times a power of two), chunk 7 the bf16 RoPE dims loaded directly. Scores are the sum of eight
K = 64 products, q held as eight [64, 64] chunks; P @ V updates eight [64, 64] fp32 accumulators (the same
128 registers per thread as one [64, 512] one). Only one bf16 chunk is in flight in registers at a time,
and the same per-chunk code serves BF16 caches (chunk c is the plain [BN, 64] slice).

DOT_FP32 / BF16_RNE: interpreter-only switches, as in the other kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_split_attn import _store_out

__all__ = ["chunked_supported"]


def chunked_supported(d: int) -> bool:
    """The chunked kernel is written for V4's d = 512 (eight 64-dim chunks, FP8 scales per 64 dims)."""
    return d == 512


@triton.jit
def _kv_chunk(kv_ptr, kv16_ptr, rows, valid, stride_kv, sc, C: tl.constexpr, offs_c, FP8: tl.constexpr):
    """Dims [64C, 64C + 64) of the gathered rows as bf16 [BN, 64]; rows int64 [BN] (0 at holes).

    FP8 (uint8 [.., 584] rows): C < 7 -> e4m3 bytes [64C, 64C + 64) times sc [BN] (the row's scale C); C = 7 ->
    the bf16 RoPE dims (bytes 448..575, seen as bf16 element 224.. of the 292-element row). BF16: a plain slice.
    """
    if FP8:
        if C < 7:
            b = tl.load(kv_ptr + rows[:, None] * 584 + C * 64 + offs_c[None, :], mask=valid[:, None], other=0)
            x = b.to(tl.float8e4nv, bitcast=True).to(tl.float32) * sc[:, None]
            return x.to(tl.bfloat16)
        else:
            return tl.load(kv16_ptr + rows[:, None] * 292 + 224 + offs_c[None, :], mask=valid[:, None], other=0.0)
    else:
        return tl.load(kv_ptr + rows[:, None] * stride_kv + C * 64 + offs_c[None, :], mask=valid[:, None], other=0.0)


@triton.jit
def _scale_of(scales, offs_s, C: tl.constexpr):
    """Column C of the [BN, 8] fp32 scales as [BN]: a select-sum inside each thread's 8 bytes (no gather)."""
    return tl.sum(tl.where(offs_s[None, :] == C, scales, 0.0), 1)


@triton.jit
def _row_scales(kv_ptr, rows, valid, BLOCK_N: tl.constexpr, FP8: tl.constexpr):
    """fp32 [BN, 8]: 2^(byte - 127) of the 7 UE8M0 bytes at 576.. (NaN for 255; column 7, the pad, is 1)."""
    offs_s = tl.arange(0, 8)
    if FP8:
        sb = tl.load(kv_ptr + rows[:, None] * 584 + 576 + offs_s[None, :], mask=valid[:, None], other=127)
        sb = tl.where(offs_s[None, :] < 7, sb.to(tl.uint32), 127)
        scale = (sb << 23).to(tl.float32, bitcast=True)  # 2^(sb - 127) for 1 <= sb <= 254 (the format's range)
        return tl.where(sb == 255, float("nan"), scale), offs_s
    else:
        return tl.full([BLOCK_N, 8], 1.0, tl.float32), offs_s


@triton.jit
def _qk(s, q_c, k_c, DOT_FP32: tl.constexpr):
    if DOT_FP32:
        return tl.dot(q_c, tl.trans(k_c.to(tl.float32)), s, input_precision="ieee")
    return tl.dot(q_c, tl.trans(k_c), s)


@triton.jit
def _pv(acc, p, k_c, alpha, DOT_FP32: tl.constexpr):
    acc = acc * alpha[:, None]
    if DOT_FP32:
        return tl.dot(p, k_c.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(p.to(tl.bfloat16), k_c, acc)


@triton.jit
def _tile(
    m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7, q0, q1, q2, q3, q4, q5, q6, q7,
    kv_ptr, kv16_ptr, idx, n_rows, stride_kv, qk_scale, offs_c,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    """One tile of BLOCK_N indices idx [BN]: online-softmax update of (m_i, l_i, a0..a7 [BH, 64])."""
    valid = (idx >= 0) & (idx < n_rows)
    rows = tl.where(valid, idx, 0).to(tl.int64)
    scales, offs_s = _row_scales(kv_ptr, rows, valid, BLOCK_N, FP8)
    k0 = _kv_chunk(kv_ptr, kv16_ptr, rows, valid, stride_kv, _scale_of(scales, offs_s, 0), 0, offs_c, FP8)
    s = _qk(tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32), q0, k0, DOT_FP32)
    k1 = _kv_chunk(kv_ptr, kv16_ptr, rows, valid, stride_kv, _scale_of(scales, offs_s, 1), 1, offs_c, FP8)
    s = _qk(s, q1, k1, DOT_FP32)
    k2 = _kv_chunk(kv_ptr, kv16_ptr, rows, valid, stride_kv, _scale_of(scales, offs_s, 2), 2, offs_c, FP8)
    s = _qk(s, q2, k2, DOT_FP32)
    k3 = _kv_chunk(kv_ptr, kv16_ptr, rows, valid, stride_kv, _scale_of(scales, offs_s, 3), 3, offs_c, FP8)
    s = _qk(s, q3, k3, DOT_FP32)
    k4 = _kv_chunk(kv_ptr, kv16_ptr, rows, valid, stride_kv, _scale_of(scales, offs_s, 4), 4, offs_c, FP8)
    s = _qk(s, q4, k4, DOT_FP32)
    k5 = _kv_chunk(kv_ptr, kv16_ptr, rows, valid, stride_kv, _scale_of(scales, offs_s, 5), 5, offs_c, FP8)
    s = _qk(s, q5, k5, DOT_FP32)
    k6 = _kv_chunk(kv_ptr, kv16_ptr, rows, valid, stride_kv, _scale_of(scales, offs_s, 6), 6, offs_c, FP8)
    s = _qk(s, q6, k6, DOT_FP32)
    k7 = _kv_chunk(kv_ptr, kv16_ptr, rows, valid, stride_kv, _scale_of(scales, offs_s, 7), 7, offs_c, FP8)
    s = _qk(s, q7, k7, DOT_FP32)

    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing valid yet: any finite shift works
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    a0 = _pv(a0, p, k0, alpha, DOT_FP32)
    a1 = _pv(a1, p, k1, alpha, DOT_FP32)
    a2 = _pv(a2, p, k2, alpha, DOT_FP32)
    a3 = _pv(a3, p, k3, alpha, DOT_FP32)
    a4 = _pv(a4, p, k4, alpha, DOT_FP32)
    a5 = _pv(a5, p, k5, alpha, DOT_FP32)
    a6 = _pv(a6, p, k6, alpha, DOT_FP32)
    a7 = _pv(a7, p, k7, alpha, DOT_FP32)
    return m_new, l_i, a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _attend_range(
    m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7, q0, q1, q2, q3, q4, q5, q6, q7,
    kv_ptr, kv16_ptr, idx_row, n_rows, stride_kv, t_lo, t_hi, lim, qk_scale, offs_n, offs_c,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    """Tiles [t_lo, t_hi) of one index list (lim entries at idx_row); indices prefetched one tile ahead."""
    pos = t_lo * BLOCK_N + offs_n
    idx_next = tl.load(idx_row + pos, mask=pos < lim, other=-1)
    for tile in range(t_lo, t_hi):
        idx = idx_next
        pos = (tile + 1) * BLOCK_N + offs_n
        idx_next = tl.load(idx_row + pos, mask=pos < lim, other=-1)
        m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7 = _tile(
            m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7, q0, q1, q2, q3, q4, q5, q6, q7,
            kv_ptr, kv16_ptr, idx, n_rows, stride_kv, qk_scale, offs_c, BLOCK_H, BLOCK_N, FP8, DOT_FP32,
        )  # fmt: skip
    return m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _load_q(q_row, heads, h_mask, stride_qh, C: tl.constexpr, offs_c, DOT_FP32: tl.constexpr):
    q = tl.load(q_row + heads[:, None] * stride_qh + C * 64 + offs_c[None, :], mask=h_mask[:, None], other=0.0)
    return q.to(tl.float32) if DOT_FP32 else q.to(tl.bfloat16)


@triton.jit
def _weights(m_i, l_i, heads, h_mask, sink_ptr, HAS_SINK: tl.constexpr, SPLIT: tl.constexpr):
    """(w [BH], lse [BH]): out = acc * w. Final (natural-log lse, sink in the denominator) or, with SPLIT, the
    partial (1 / l and the base-2 lse m + log2 l; an empty split gives 0 and -inf): as triton_split_attn."""
    if SPLIT:
        has = l_i > 0.0
        w = tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)
        return w, tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=h_mask, other=0.0)
        sink2 = sink * 1.4426950408889634
        m_f = tl.maximum(m_i, sink2)
    else:
        m_f = m_i
    m_f = tl.where(m_f == float("-inf"), 0.0, m_f)
    alpha = tl.exp2(m_i - m_f)
    l_f = l_i * alpha
    if HAS_SINK:
        l_f += tl.exp2(sink2 - m_f)
    has_mass = l_f > 0.0  # False only without any valid index and without a sink
    l_safe = tl.where(has_mass, l_f, 1.0)
    lse = tl.where(has_mass, (m_f + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    if HAS_SINK:  # no valid index: lse is the sink itself, bit for bit
        lse = tl.where(m_i == float("-inf"), sink, lse)
    return tl.where(has_mass, alpha / l_safe, 0.0), lse


@triton.jit
def _store_all(base, rs, heads, h_mask, a0, a1, a2, a3, a4, a5, a6, a7, w, offs_c, BF16_RNE: tl.constexpr):
    """a0..a7 [BH, 64] * w [BH] to rows `heads` (row stride rs) of the token block at base, chunk c at 64c."""
    p = base + heads[:, None] * rs + offs_c[None, :]
    m = h_mask[:, None]
    _store_out(p, a0 * w[:, None], m, BF16_RNE)
    _store_out(p + 64, a1 * w[:, None], m, BF16_RNE)
    _store_out(p + 128, a2 * w[:, None], m, BF16_RNE)
    _store_out(p + 192, a3 * w[:, None], m, BF16_RNE)
    _store_out(p + 256, a4 * w[:, None], m, BF16_RNE)
    _store_out(p + 320, a5 * w[:, None], m, BF16_RNE)
    _store_out(p + 384, a6 * w[:, None], m, BF16_RNE)
    _store_out(p + 448, a7 * w[:, None], m, BF16_RNE)


@triton.jit
def _split_chunked_kernel(
    q_ptr, kv_ptr, kv16_ptr, idx_ptr, ex_kv_ptr, ex16_ptr, ex_idx_ptr, sink_ptr, out_ptr, lse_ptr,
    part_o_ptr, part_lse_ptr,
    H, n_kv, n_ex, topk, topk_ex, qk_scale, num_splits, tiles_per_split,
    stride_qt, stride_qh, stride_kv, stride_it, stride_ex, stride_et, stride_ot, stride_oh, stride_lt, stride_lh,
    D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_HB: tl.constexpr, SPLIT: tl.constexpr,
    HAS_EXTRA: tl.constexpr, HAS_SINK: tl.constexpr, KV_FP8: tl.constexpr, EX_FP8: tl.constexpr,
    DOT_FP32: tl.constexpr, BF16_RNE: tl.constexpr,
):  # fmt: skip
    """Arguments and program ids exactly as `triton_split_attn._split_attn_kernel` (D must be 512)."""
    tl.static_assert(D == 512, "the chunked kernel is written for d = 512")
    pid = tl.program_id(0)
    hb = pid % NUM_HB
    split = (pid // NUM_HB) % num_splits
    tok = (pid // (NUM_HB * num_splits)).to(tl.int64)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < H
    offs_c = tl.arange(0, 64)
    offs_n = tl.arange(0, BLOCK_N)

    q_row = q_ptr + tok * stride_qt
    q0 = _load_q(q_row, heads, h_mask, stride_qh, 0, offs_c, DOT_FP32)
    q1 = _load_q(q_row, heads, h_mask, stride_qh, 1, offs_c, DOT_FP32)
    q2 = _load_q(q_row, heads, h_mask, stride_qh, 2, offs_c, DOT_FP32)
    q3 = _load_q(q_row, heads, h_mask, stride_qh, 3, offs_c, DOT_FP32)
    q4 = _load_q(q_row, heads, h_mask, stride_qh, 4, offs_c, DOT_FP32)
    q5 = _load_q(q_row, heads, h_mask, stride_qh, 5, offs_c, DOT_FP32)
    q6 = _load_q(q_row, heads, h_mask, stride_qh, 6, offs_c, DOT_FP32)
    q7 = _load_q(q_row, heads, h_mask, stride_qh, 7, offs_c, DOT_FP32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    a0 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    a1, a2, a3, a4, a5, a6, a7 = a0, a0, a0, a0, a0, a0, a0

    n1 = tl.cdiv(topk, BLOCK_N)
    lo = split * tiles_per_split
    hi = lo + tiles_per_split
    m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7 = _attend_range(
        m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7, q0, q1, q2, q3, q4, q5, q6, q7,
        kv_ptr, kv16_ptr, idx_ptr + tok * stride_it, n_kv, stride_kv, lo, tl.minimum(hi, n1), topk, qk_scale,
        offs_n, offs_c, BLOCK_H, BLOCK_N, KV_FP8, DOT_FP32,
    )  # fmt: skip
    if HAS_EXTRA:
        n2 = tl.cdiv(topk_ex, BLOCK_N)
        m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7 = _attend_range(
            m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7, q0, q1, q2, q3, q4, q5, q6, q7,
            ex_kv_ptr, ex16_ptr, ex_idx_ptr + tok * stride_et, n_ex, stride_ex,
            tl.maximum(lo, n1) - n1, tl.minimum(hi, n1 + n2) - n1, topk_ex, qk_scale, offs_n, offs_c,
            BLOCK_H, BLOCK_N, EX_FP8, DOT_FP32,
        )  # fmt: skip

    w, lse = _weights(m_i, l_i, heads, h_mask, sink_ptr, HAS_SINK, SPLIT)
    if SPLIT:  # fp32 partials in the [t * S * H, D] workspace, rows (tok * S + split) * H + head
        row = (tok * num_splits + split) * H
        tl.store(part_lse_ptr + row + heads, lse, mask=h_mask)
        _store_all(part_o_ptr + row * D, D, heads, h_mask, a0, a1, a2, a3, a4, a5, a6, a7, w, offs_c, False)
    else:
        tl.store(lse_ptr + tok * stride_lt + heads * stride_lh, lse, mask=h_mask)
        _store_all(out_ptr + tok * stride_ot, stride_oh, heads, h_mask, a0, a1, a2, a3, a4, a5, a6, a7, w, offs_c,
                   BF16_RNE)  # fmt: skip
