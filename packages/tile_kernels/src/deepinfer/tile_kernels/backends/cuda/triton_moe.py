"""Triton `moe_permute` / `moe_unpermute` (`ref/moe.py`): the token-to-expert permutation and its weighted reduce.

The permutation is a stable counting sort of the flattened [t, k] slots by expert id, in four launches and no
atomics (so the row order is the reference's: by expert, then token, then slot, and reruns are identical):

1. `_hist_kernel`, one program per BLOCK_S slots (block b): the expert histogram of the block, stored as
   column b of hist [E, nb], and each slot's rank among the earlier slots of its block with the same expert
   (a [BLOCK_S, BLOCK_S] comparison; masked slots (-1) match no expert).
2. `_scan_kernel`, one program per expert e: hist[e, :] -> its exclusive prefix over the blocks (in place) and
   the expert's count.
3. `_offsets_kernel`, one program: counts -> segments padded to `block` -> expert_offsets (cumulative ends) and
   the segment starts.
   The launcher reads the total row count P back here, together with the ids' min and max (one host sync, the
   only one: the API's result is [P, h]; out-of-range ids raise before step 4, the only step that could write
   out of bounds with them: steps 1-3 count an id outside [0, E) in no expert).
4. `_rows_kernel`, program (token, h block): row of slot s = start[e] + hist[e, b(s)] + rank[s]; it writes
   src_map and row_expert (h block 0) and copies the token's row slice to each of its k rows (x read once).
   `_pad_kernel` (only when block > 1), one program per expert: zero rows and row_expert -1 for the padding.

The un-permute `_unpermute_kernel`, program (token, h block), adds w[i, j] * y[src_map[i, j]] in fp32 for
j = 0, 1, ... in slot order from 0 (masked slots add +0.0 and read neither y nor w), with fp fusion off (no FMA),
then casts once: bit-exact to the reference on the GPU (the interpreter truncates fp32 -> bf16 casts).
Rows are copied as raw bits (x viewed as an int type of its element size), so any dtype permutes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["moe_permute_triton", "moe_unpermute_triton"]

BLOCK_S = 128  # slots per histogram block (rank by a BLOCK_S x BLOCK_S comparison)
HIST_BLOCK_E = 128  # experts per histogram step
SCAN_BLOCK = 1024  # blocks per scan step
COPY_BYTES = 8192  # bytes of a row per copy program
UNPERM_BLOCK_H = 1024  # columns per un-permute program
MAX_UNPERMUTE_K = 64  # most slots per token of the un-permute kernel (its slot loop is unrolled)
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # un-permute outputs the kernel writes


@triton.jit
def _hist_kernel(idx_ptr, hist_ptr, rank_ptr, n_slots, nb, E, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
    """idx [n_slots] int (flat [t, k], -1 = masked) -> hist[:, b] [E] counts of block b, rank [n_slots] int32."""
    b = tl.program_id(0)
    ss = tl.arange(0, BLOCK_S)
    s = b * BLOCK_S + ss
    smask = s < n_slots
    e = tl.load(idx_ptr + s, mask=smask, other=-1).to(tl.int32)
    earlier = (e[:, None] == e[None, :]) & (ss[None, :] < ss[:, None])  # [BS, BS]: same expert, earlier slot
    tl.store(rank_ptr + s, tl.sum(earlier.to(tl.int32), axis=1), mask=smask)
    for e0 in range(0, E, BLOCK_E):
        ex = e0 + tl.arange(0, BLOCK_E)
        cnt = tl.sum((e[:, None] == ex[None, :]).to(tl.int32), axis=0)  # -1 slots match no expert
        tl.store(hist_ptr + ex.to(tl.int64) * nb + b, cnt, mask=ex < E)


@triton.jit
def _scan_kernel(hist_ptr, counts_ptr, nb, BLOCK: tl.constexpr):
    """hist [E, nb] -> exclusive prefix along nb in place; counts[e] = the row's total (int32)."""
    e = tl.program_id(0)
    row = hist_ptr + e.to(tl.int64) * nb
    carry = tl.sum(tl.zeros([BLOCK], dtype=tl.int32), axis=0)  # an int32 scalar tensor (loop-carried)
    for b0 in range(0, nb, BLOCK):
        b = b0 + tl.arange(0, BLOCK)
        bm = b < nb
        h = tl.load(row + b, mask=bm, other=0)
        tl.store(row + b, tl.cumsum(h, axis=0) - h + carry, mask=bm)
        carry += tl.sum(h, axis=0)
    tl.store(counts_ptr + e, carry)


@triton.jit
def _offsets_kernel(counts_ptr, offsets_ptr, start_ptr, E, STEP: tl.constexpr, BLOCK: tl.constexpr):
    """counts [E] -> offsets [E] (cumulative ends of the segments padded to STEP), start [E] = their starts."""
    carry = tl.sum(tl.zeros([BLOCK], dtype=tl.int32), axis=0)
    for e0 in range(0, E, BLOCK):
        ex = e0 + tl.arange(0, BLOCK)
        em = ex < E
        c = tl.load(counts_ptr + ex, mask=em, other=0)
        padded = (c + STEP - 1) // STEP * STEP
        end = tl.cumsum(padded, axis=0) + carry
        tl.store(offsets_ptr + ex, end, mask=em)
        tl.store(start_ptr + ex, end - padded, mask=em)
        carry += tl.sum(padded, axis=0)


@triton.jit
def _rows_kernel(
    idx_ptr,
    hist_ptr,
    rank_ptr,
    start_ptr,
    x_ptr,
    out_ptr,
    src_ptr,
    row_expert_ptr,
    nb,
    H,
    stride_xt,
    stride_xh,
    K: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Token i's k slots: src_map[i, :], row_expert[rows] (h block 0) and out[rows, h block] = x[i, h block]."""
    i = tl.program_id(0)
    ph = tl.program_id(1)
    j = tl.arange(0, K_PAD)
    jm = j < K
    s = i * K + j  # flat slot (int32: t * k < 2^31, checked by the launcher)
    e = tl.load(idx_ptr + s, mask=jm, other=-1).to(tl.int32)
    valid = jm & (e >= 0)
    ec = tl.maximum(e, 0)
    base = tl.load(hist_ptr + ec.to(tl.int64) * nb + s // BLOCK_S, mask=valid, other=0)
    rank = tl.load(rank_ptr + s, mask=valid, other=0)
    dest = tl.load(start_ptr + ec, mask=valid, other=0) + base + rank  # [K_PAD] row of each slot
    first = j * 0 + ph == 0  # h block 0 writes the maps (a tensor mask: the interpreter needs one)
    tl.store(src_ptr + s, tl.where(valid, dest, -1), mask=jm & first)
    tl.store(row_expert_ptr + dest, e, mask=valid & first)

    cols = ph * BLOCK_H + tl.arange(0, BLOCK_H)
    cm = cols < H
    v = tl.load(x_ptr + i.to(tl.int64) * stride_xt + cols.to(tl.int64) * stride_xh, mask=cm)
    vb = tl.broadcast_to(v[None, :], (K_PAD, BLOCK_H))
    tl.store(out_ptr + dest.to(tl.int64)[:, None] * H + cols[None, :], vb, mask=valid[:, None] & cm[None, :])


@triton.jit
def _pad_kernel(
    counts_ptr, start_ptr, offsets_ptr, out_ptr, row_expert_ptr, H, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr
):
    """Expert e's padding rows [start + count, offsets[e]): zero rows of out, row_expert -1."""
    e = tl.program_id(0)
    first = tl.load(start_ptr + e) + tl.load(counts_ptr + e)
    end = tl.load(offsets_ptr + e)
    rr = tl.arange(0, BLOCK_R)
    hh = tl.arange(0, BLOCK_H)
    zero = tl.zeros([BLOCK_R, BLOCK_H], dtype=out_ptr.dtype.element_ty)
    for r0 in range(first, end, BLOCK_R):
        r = r0 + rr
        rm = r < end
        tl.store(row_expert_ptr + r, tl.full([BLOCK_R], -1, tl.int32), mask=rm)
        for h0 in range(0, H, BLOCK_H):
            cols = h0 + hh
            tl.store(
                out_ptr + r.to(tl.int64)[:, None] * H + cols[None, :], zero, mask=rm[:, None] & (cols < H)[None, :]
            )


@triton.jit
def _unpermute_kernel(
    y_ptr,
    src_ptr,
    w_ptr,
    out_ptr,
    H,
    stride_yp,
    stride_yh,
    stride_st,
    stride_sk,
    stride_wt,
    stride_wk,
    K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """out[i, h block] = sum_j w[i, j] * y[src[i, j], h block], fp32, slot order from 0, one cast."""
    i = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cm = cols < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(K):  # unrolled: the k row loads are independent and can all be in flight
        r = tl.load(src_ptr + i * stride_st + j * stride_sk).to(tl.int64)
        ok = (cols * 0 + r) >= 0  # [BLOCK_H] (a tensor mask: the interpreter needs one)
        w = tl.load(w_ptr + i * stride_wt + j * stride_wk).to(tl.float32)  # in bounds; a masked slot's is dropped
        v = tl.load(y_ptr + tl.maximum(r, 0) * stride_yp + cols * stride_yh, mask=cm & ok, other=0.0)
        acc = acc + tl.where(ok, v.to(tl.float32) * w, 0.0)
    tl.store(out_ptr + i * H + cols, acc.to(out_ptr.dtype.element_ty), mask=cm)


def _empty_result(x: torch.Tensor, t: int, k: int, num_experts: int) -> tuple[torch.Tensor, ...]:
    """No slots: the reference's empty layout (all counts and offsets 0; masked slots map to -1)."""
    dev = x.device
    zeros = torch.zeros(num_experts, dtype=torch.int32, device=dev)
    return (
        x.new_zeros((0, x.shape[1])),
        zeros,
        zeros.clone(),
        torch.zeros(0, dtype=torch.int32, device=dev),
        torch.full((t, k), -1, dtype=torch.int32, device=dev),
    )


def _read_total_and_check(offsets: torch.Tensor, idx: torch.Tensor, num_experts: int) -> int:
    """P = offsets[-1], read back in one copy with min / max of idx [t, k] (int64: no wrap of a huge id); raises
    ValueError when an id is outside [-1, num_experts) (-1 = masked slot). One host sync for both."""
    lo, hi = torch.aminmax(idx.view(-1))
    total, lo_v, hi_v = torch.stack((offsets[-1].long(), lo.long(), hi.long())).tolist()
    if lo_v < -1 or hi_v >= num_experts:
        bad = hi_v if hi_v >= num_experts else lo_v
        raise ValueError(f"topk_idx values must be in [-1, {num_experts - 1}] (-1 = masked slot), got {bad}")
    return int(total)


def moe_permute_triton(
    x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int, block: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton `moe_permute`, same contract as `ref.moe.moe_permute`.

    x: [t, h] any dtype of 1, 2, 4 or 8 bytes (any strides); topk_idx: [t, k] int32/int64 in [-1, E).
    Returns (x_perm [P, h], expert_counts [E] int32, expert_offsets [E] int32, row_expert [P] int32,
    src_map [t, k] int32). One host sync: P (offsets[-1]) sizes x_perm and row_expert; the ids' min / max come
    back in the same copy (ValueError, as the API's check, when one is outside [-1, E)).
    """
    check_runnable(x, topk_idx)
    if x.dim() != 2 or topk_idx.dim() != 2 or topk_idx.shape[0] != x.shape[0]:
        raise ValueError(f"x must be [t, h] and topk_idx [t, k], got {tuple(x.shape)} and {tuple(topk_idx.shape)}")
    if x.element_size() not in _INT_OF_SIZE:
        raise TypeError(f"x must have an element size of 1, 2, 4 or 8 bytes, got {x.dtype}")
    t, k = topk_idx.shape
    h = x.shape[1]
    n_slots = t * k
    if n_slots >= 2**31 - BLOCK_S:
        raise ValueError(f"t * k must be < 2^31 - {BLOCK_S} (int32 slot indices), got {n_slots}")
    if n_slots == 0:
        return _empty_result(x, t, k, num_experts)
    dev = x.device
    step = 1 if block is None else int(block)
    idx = topk_idx.contiguous()
    nb = triton.cdiv(n_slots, BLOCK_S)
    hist = torch.empty((num_experts, nb), dtype=torch.int32, device=dev)
    rank = torch.empty(n_slots, dtype=torch.int32, device=dev)
    counts = torch.empty(num_experts, dtype=torch.int32, device=dev)
    offsets = torch.empty_like(counts)
    start = torch.empty_like(counts)
    _hist_kernel[(nb,)](idx, hist, rank, n_slots, nb, num_experts, BLOCK_S=BLOCK_S, BLOCK_E=HIST_BLOCK_E)
    _scan_kernel[(num_experts,)](hist, counts, nb, BLOCK=max(16, min(SCAN_BLOCK, triton.next_power_of_2(nb))))
    eb = max(16, min(SCAN_BLOCK, triton.next_power_of_2(num_experts)))
    _offsets_kernel[(1,)](counts, offsets, start, num_experts, STEP=step, BLOCK=eb)
    total = _read_total_and_check(offsets, idx, num_experts)  # the one host sync: P sizes the result
    xi = x.view(_INT_OF_SIZE[x.element_size()])  # a raw-bits copy: any dtype
    # at least one row allocated: an empty tensor's null data pointer never reaches a kernel
    out = torch.empty((max(total, 1), h), dtype=xi.dtype, device=dev)[:total]
    row_expert = torch.empty(max(total, 1), dtype=torch.int32, device=dev)[:total]
    src_map = torch.empty((t, k), dtype=torch.int32, device=dev)
    bh = max(16, min(triton.next_power_of_2(max(h, 1)), COPY_BYTES // x.element_size()))
    # every call, even with no valid slot: src_map is written here (-1 for masked slots)
    _rows_kernel[(t, max(1, triton.cdiv(h, bh)))](
        idx, hist, rank, start, xi, out, src_map, row_expert, nb, h, xi.stride(0), xi.stride(1),
        K=k, K_PAD=max(2, triton.next_power_of_2(k)), BLOCK_S=BLOCK_S, BLOCK_H=bh, num_warps=4,
    )  # fmt: skip
    if step > 1 and total > 0:
        pbh = max(16, min(triton.next_power_of_2(max(h, 1)), 2048 // x.element_size()))
        _pad_kernel[(num_experts,)](counts, start, offsets, out, row_expert, h, BLOCK_R=8, BLOCK_H=pbh, num_warps=4)
    return out.view(x.dtype), counts, offsets, row_expert, src_map


def moe_unpermute_triton(
    y: torch.Tensor, src_map: torch.Tensor, topk_weights: torch.Tensor, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Triton `moe_unpermute`, same contract as `ref.moe.moe_unpermute` (rows assumed in [-1, P): unchecked here;
    a row >= P reads out of bounds, so src_map must come from `moe_permute` of the same routing).

    y: [P, h] fp32/bf16/fp16 (any strides); src_map: [t, k] int32/int64; topk_weights: [t, k] float.
    Returns [t, h] out_dtype (default y.dtype; fp32/bf16/fp16). No host sync (CUDA-graph safe).
    """
    check_runnable(y, src_map, topk_weights)
    odt = y.dtype if out_dtype is None else out_dtype
    if odt not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES}, got {odt}")
    if y.dim() != 2 or src_map.dim() != 2 or topk_weights.shape != src_map.shape:
        raise ValueError(
            f"y must be [P, h], src_map and topk_weights [t, k], got {tuple(y.shape)}, {tuple(src_map.shape)}, "
            f"{tuple(topk_weights.shape)}"
        )
    t, k = src_map.shape
    h = y.shape[1]
    out = torch.empty((t, h), dtype=odt, device=y.device)
    if t == 0 or h == 0:
        return out
    if k == 0 or y.shape[0] == 0:  # no slot reads a row
        return out.zero_()
    if k > MAX_UNPERMUTE_K:
        raise ValueError(f"k must be <= {MAX_UNPERMUTE_K} (the slot loop is unrolled), got {k}")
    bh = min(UNPERM_BLOCK_H, triton.next_power_of_2(h))
    _unpermute_kernel[(t, triton.cdiv(h, bh))](
        y, src_map, topk_weights, out, h, y.stride(0), y.stride(1), src_map.stride(0), src_map.stride(1),
        topk_weights.stride(0), topk_weights.stride(1), K=k, BLOCK_H=bh, num_warps=4, enable_fp_fusion=False,
    )  # fmt: skip
    return out
