"""Split-KV sparse sink attention with P @ V one tile behind: the `deferred` variant of `triton_split_attn.py`.

Same math, arguments, grid, split-KV plan, workspace and combine kernel as `triton_split_attn._split_attn_kernel`;
selected with `sparse_attn_split_triton(..., kernel="deferred")`. Not the API default until the GPU run says so.

Why: Triton (AccelerateMatmul, warpsPerTileV3) gives a dot whose result reaches another dot in the same loop
body all warps along M ({8, 1} at 8 warps). The scores S = q K^T have M = 64 heads, so both warpgroups compute
the same [64, BN] tile (sm_90a code of the fused kernel: `#mma warpsPerCTA = [8, 1]` for S, `[4, 2]` for P @ V):
per tile 3 units of tensor work for 2 useful. Here iteration i computes S_i and P_i but multiplies the *previous*
tile, acc = (acc + P_{i-1} V_{i-1}) * alpha_i, with P_{i-1} carried in registers (bf16) and V_{i-1} gathered
again by its carried indices (an L2 hit: the rows were read from HBM one iteration earlier). S_i then reaches no
dot inside the iteration, gets the `[4, 2]` layout (each warpgroup computes half of the BN columns; the row max
and sum cross the two warpgroups through shared memory) and QK_i is independent of PV_{i-1}, so the two wgmma
groups can overlap (FlashAttention-3's intra-warpgroup pipelining). Cost: the second gather of each tile
(L2 -> SM traffic x2, HBM traffic unchanged) and, for FP8 rows, a second dequantisation.

sm_90a compile (Triton 3.9, `tests/fm_sm90_compile.py`): S gets `warpsPerCTA = [4, 2]` (34 wgmma in the loop
body at 32-row tiles, one list); at 32 x 3 stages 196 KiB of shared memory and no spills with BF16 or FP8 rows
(8-24 B of stack with two lists; 16 x 4: 232-236 registers, 130 KiB); 64 x 2 would need 328 KiB (the launcher
then drops to 1 stage), hence the default (64, 32, 8, 3) of `default_split_config(kernel="deferred")`. The
index tile is loaded inside the loop (not one iteration ahead by hand as in the fused kernel): with the
hand-made prefetch Triton's pipeliner gave up on this loop and issued no cp.async at all.

Bookkeeping: acc after iteration i holds the tiles < i relative to m_i (the running max including S_i); P_i is
relative to m_i. Each list's loop ends with one empty step that adds the last tile's P @ V (`_attend_range`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_split_attn import _finish, _load_fp8_rows, _store_out


@triton.jit
def _rows(kv_ptr, kv16_ptr, idx, n_rows, stride_kv, offs_d, BLOCK_N: tl.constexpr, FP8: tl.constexpr,
          DOT_FP32: tl.constexpr):  # fmt: skip
    """Gathered rows [BN, D] (bf16, fp32 with DOT_FP32) of indices idx [BN]; holes read as 0, never loaded."""
    valid = (idx >= 0) & (idx < n_rows)
    rows = tl.where(valid, idx, 0).to(tl.int64)
    if FP8:
        kv = _load_fp8_rows(kv_ptr, kv16_ptr, rows, valid, offs_d, BLOCK_N)
    else:
        kv = tl.load(kv_ptr + rows[:, None] * stride_kv + offs_d[None, :], mask=valid[:, None], other=0.0)
    if DOT_FP32:
        return kv.to(tl.float32), valid
    return kv.to(tl.bfloat16), valid


@triton.jit
def _pv(acc, p, v, DOT_FP32: tl.constexpr):
    if DOT_FP32:
        return tl.dot(p, v, acc, input_precision="ieee")
    return tl.dot(p, v, acc)


@triton.jit
def _attend_range(
    m_i, l_i, acc, p_prev, idx_prev, q, kv_ptr, kv16_ptr, idx_row, n_rows, stride_kv, t_lo, t_hi, lim, qk_scale,
    offs_n, offs_d, BLOCK_N: tl.constexpr, FP8: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    """Tiles [t_lo, t_hi) of one list, plus one empty step that settles the last tile's P @ V (an empty tile:
    all holes, S = -inf, P = 0, alpha = 1), so no dot runs outside the loop (a dot between the two lists' loops
    got another MMA layout and two [64, 512] accumulator conversions: 6.7 KB of spills per thread). Carries
    (p_prev [BH, BN], idx_prev [BN]): the tile whose P @ V is owed; after the loop P = 0 and idx = -1."""
    t_end = tl.maximum(t_hi, t_lo) + 1
    pos_end = tl.minimum(t_hi * BLOCK_N, lim)  # positions at or past it (the settling step's) read as holes
    for tile in range(t_lo, t_end):
        pos = tile * BLOCK_N + offs_n
        idx = tl.load(idx_row + pos, mask=pos < pos_end, other=-1)
        k, valid = _rows(kv_ptr, kv16_ptr, idx, n_rows, stride_kv, offs_d, BLOCK_N, FP8, DOT_FP32)
        if DOT_FP32:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        v_prev, _ = _rows(kv_ptr, kv16_ptr, idx_prev, n_rows, stride_kv, offs_d, BLOCK_N, FP8, DOT_FP32)
        acc = _pv(acc, p_prev, v_prev, DOT_FP32)  # the previous tile, relative to m_i (before this tile)
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing valid yet: any finite shift works
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_new
        p_prev = p.to(p_prev.dtype)
        idx_prev = idx
    return m_i, l_i, acc, p_prev, idx_prev


@triton.jit
def _split_deferred_kernel(
    q_ptr, kv_ptr, kv16_ptr, idx_ptr, ex_kv_ptr, ex16_ptr, ex_idx_ptr, sink_ptr, out_ptr, lse_ptr,
    part_o_ptr, part_lse_ptr,
    H, n_kv, n_ex, topk, topk_ex, qk_scale, num_splits, tiles_per_split,
    stride_qt, stride_qh, stride_kv, stride_it, stride_ex, stride_et, stride_ot, stride_oh, stride_lt, stride_lh,
    D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_HB: tl.constexpr, SPLIT: tl.constexpr,
    HAS_EXTRA: tl.constexpr, HAS_SINK: tl.constexpr, KV_FP8: tl.constexpr, EX_FP8: tl.constexpr,
    DOT_FP32: tl.constexpr, BF16_RNE: tl.constexpr,
):  # fmt: skip
    """Arguments and program ids exactly as `triton_split_attn._split_attn_kernel`."""
    pid = tl.program_id(0)
    hb = pid % NUM_HB
    split = (pid // NUM_HB) % num_splits
    tok = (pid // (NUM_HB * num_splits)).to(tl.int64)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < H
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)

    q = tl.load(q_ptr + tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :], mask=h_mask[:, None], other=0.0)
    q = q.to(tl.float32) if DOT_FP32 else q.to(tl.bfloat16)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D], dtype=tl.float32)
    p_prev = tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32 if DOT_FP32 else tl.bfloat16)
    idx_none = tl.full([BLOCK_N], -1, dtype=tl.int32)

    n1 = tl.cdiv(topk, BLOCK_N)
    lo = split * tiles_per_split
    hi = lo + tiles_per_split
    m_i, l_i, acc, p_prev, idx_prev = _attend_range(
        m_i, l_i, acc, p_prev, idx_none, q, kv_ptr, kv16_ptr, idx_ptr + tok * stride_it, n_kv, stride_kv, lo,
        tl.minimum(hi, n1), topk, qk_scale, offs_n, offs_d, BLOCK_N, KV_FP8, DOT_FP32,
    )  # fmt: skip
    if HAS_EXTRA:
        n2 = tl.cdiv(topk_ex, BLOCK_N)
        m_i, l_i, acc, p_prev, idx_prev = _attend_range(
            m_i, l_i, acc, p_prev, idx_prev, q, ex_kv_ptr, ex16_ptr, ex_idx_ptr + tok * stride_et, n_ex, stride_ex,
            tl.maximum(lo, n1) - n1, tl.minimum(hi, n1 + n2) - n1, topk_ex, qk_scale, offs_n, offs_d, BLOCK_N,
            EX_FP8, DOT_FP32,
        )  # fmt: skip

    if not SPLIT:
        o, lse = _finish(m_i, l_i, acc, heads, h_mask, sink_ptr, HAS_SINK)
        o_ptrs = out_ptr + tok * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        _store_out(o_ptrs, o, h_mask[:, None], BF16_RNE)
        tl.store(lse_ptr + tok * stride_lt + heads * stride_lh, lse, mask=h_mask)
    else:  # partial: acc / l and base-2 lse (m + log2 l); an empty split stores 0 and -inf
        has = l_i > 0.0
        o = acc * tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)[:, None]
        part = (tok * num_splits + split) * H + heads
        tl.store(part_o_ptr + part[:, None] * D + offs_d[None, :], o, mask=h_mask[:, None])
        tl.store(part_lse_ptr + part, tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf")), mask=h_mask)
