"""Fused lightning-indexer scores + exact top-k in one Triton kernel: the [t, n] score matrix is never written.

`indexer_topk_fused(q, weights, k_cache, k, visible=..., seq_rows=..., block_table=..., rows_per_block=...)`
has the arguments and result of `api.indexer_topk` (int32 [t, k] local entry ids, -1 padded, any order).

A persistent grid of P programs (one per SM) walks the queries. For query t a program:

1. scores its visible entries j < visible[t], BLOCK_N at a time: gathers the keys through the block table
   ([BLOCK_N, d], one 256-byte row per entry for d = 128 bf16), one `tl.dot` of q[t] [h, d] by the keys^T
   (fp32 accumulation; h = 64 is the MMA's M), then I = sum_h w[t, h] relu(logit) -> [BLOCK_N] fp32;
2. writes those scores into its own slab row (P x n fp32 in all, not t x n: ~35 MB at n = 65,536, mostly
   L2-resident because the program reads it back at once);
3. selects from the slab row with v3's row selection (`triton_filter._v3_row`: sample, one filter pass, exact
   select over a small scratch; v2's passes when the guess fails). The selection never sees the keys again.

Compute is the dot: 2 h d FLOPs per (query, entry), 16,384 at V4's h = 64, d = 128; the keys of one sequence
(n x d x 2 bytes, 16 MB at n = 65,536) are re-read by every query of that sequence, from L2 when the programs
walk the same sequence together (they do: queries of one prefill chunk are adjacent).

Rounding: logits accumulate in fp32 in the MMA's order, not the reference's einsum order, so scores can differ
from `reference.indexer_scores` in the last bits (the selection is then exact for the kernel's own scores).
With inputs whose sums are exact in fp32 (the tests' small integers and power-of-two weights) both agree
bit for bit, so the selections are identical. fp32 q / keys use IEEE fp32 dots (no TF32); bf16 q and keys use
the bf16 MMA (fp32 accumulation) on the GPU, and fp32 dots in Triton's CPU interpreter (its bf16 tl.dot is
wrong), so the bf16 MMA itself is checked by the GPU tests only.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .triton_filter import CHUNK, SBLOCK, _v3_row, default_cap, default_sample
from .triton_select import _pad
from .triton_topk import PAD_BLOCK

__all__ = ["indexer_topk_fused"]

BLOCK_N = 64  # entries scored per dot (keys tile [BLOCK_N, d]: 16 KB in bf16 at d = 128)
BLOCK = 4096  # chunk of the selection's filter pass over the slab row
NUM_WARPS = 8


@triton.jit
def _score_row(
    q_ptr, w_ptr, kc_ptr, table_ptr, slab, t, seq, vis, rpb,
    stride_qt, stride_qh, stride_wt, stride_kc, stride_tb,
    H: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_TABLE: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    """Scores of query t over its entries 0 .. vis - 1 into slab[0:vis] as int32 bit patterns."""
    hh = tl.arange(0, H)
    dd = tl.arange(0, D)
    q = tl.load(q_ptr + t * stride_qt + hh[:, None] * stride_qh + dd[None, :])
    w = tl.load(w_ptr + t * stride_wt + hh)
    if IEEE:
        q = q.to(tl.float32)
    for j0 in range(0, vis, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        live = j < vis
        if HAS_TABLE:
            blk = tl.load(table_ptr + seq * stride_tb + j // rpb, mask=live, other=0)
            slot = blk.to(tl.int64) * rpb + j % rpb
        else:
            slot = j.to(tl.int64)
        kt = tl.load(kc_ptr + slot[None, :] * stride_kc + dd[:, None], mask=live[None, :], other=0.0)  # [D, BN]
        if IEEE:
            logits = tl.dot(q, kt.to(tl.float32), input_precision="ieee")
        else:
            logits = tl.dot(q, kt)
        s = tl.sum(tl.maximum(logits, 0.0) * w[:, None], axis=0)
        tl.store(slab + j, s.to(tl.int32, bitcast=True), mask=live)


@triton.jit(do_not_specialize=["T", "k", "cap", "n_cap", "rpb"])
def _indexer_fused_kernel(
    q_ptr, w_ptr, kc_ptr, vis_ptr, seq_ptr, table_ptr, out_ptr, slab_ptr, skey_ptr, scol_ptr,
    T, k, cap, n_cap, rpb,
    stride_qt, stride_qh, stride_wt, stride_kc, stride_tb, stride_ot, stride_ok,
    H: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_TABLE: tl.constexpr, HAS_SEQ: tl.constexpr,
    IEEE: tl.constexpr, BLOCK: tl.constexpr, SBLOCK: tl.constexpr, SAMPLE: tl.constexpr, CHUNK: tl.constexpr,
    PAD_BLOCK: tl.constexpr,
):  # fmt: skip
    """Persistent grid (P,): program p serves queries p, p + P, ...; slab int32 [P, n_cap]; skey / scol [P, cap]."""
    pid = tl.program_id(0)
    slab = slab_ptr + pid.to(tl.int64) * n_cap
    skey = skey_ptr + pid.to(tl.int64) * cap
    scol = scol_ptr + pid.to(tl.int64) * cap
    for t in range(pid, T, tl.num_programs(0)):
        t64 = t + tl.zeros([], dtype=tl.int64)  # the loop variable is a plain int in the interpreter
        vis = tl.minimum(tl.maximum(tl.load(vis_ptr + t64), 0), n_cap)
        seq = tl.zeros([], dtype=tl.int64)
        if HAS_SEQ:
            seq = tl.load(seq_ptr + t64).to(tl.int64)
        _score_row(
            q_ptr, w_ptr, kc_ptr, table_ptr, slab, t64, seq, vis, rpb,
            stride_qt, stride_qh, stride_wt, stride_kc, stride_tb, H, D, BLOCK_N, HAS_TABLE, IEEE,
        )  # fmt: skip
        tl.debug_barrier()  # the selection's threads read slab entries other threads wrote
        out_row = out_ptr + t64 * stride_ot
        kk = tl.minimum(vis, k)
        zero = tl.zeros([], dtype=tl.int32)
        _v3_row(
            slab, 1, vis, kk, zero, out_row, stride_ok, k, skey, scol, cap,
            BLOCK, SBLOCK, SAMPLE, CHUNK, False, 0x7F800000,
        )  # fmt: skip
        _pad(out_row, stride_ok, kk, k, PAD_BLOCK)
        tl.debug_barrier()  # the next query overwrites the slab and scratch this one's threads were reading


def _programs(t: int, device: torch.device) -> int:
    # One program per SM: the kernel needs ~250 registers per thread at 8 warps (ptxas for sm_90a, no spills),
    # so a second one would not be resident anyway.
    if device.type == "cuda":
        return min(t, torch.cuda.get_device_properties(device).multi_processor_count)
    return min(t, 3)  # the interpreter: a few programs still exercise the persistent loop


def indexer_topk_fused(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_cache: torch.Tensor,
    k: int,
    *,
    visible: torch.Tensor,
    seq_rows: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    rows_per_block: int | None = None,
    block_n: int = BLOCK_N,
    block: int = BLOCK,
    programs: int | None = None,
) -> torch.Tensor:
    """Fused `indexer_topk` (same arguments and result as the API's; arguments are assumed validated).

    Extra requirements: h and d powers of two >= 16 (the dot's tile sizes; V4: 64 and 128). block_n, block,
    programs: tile of entries per dot, selection chunk and persistent grid size (tests shrink them).

    Returns:
        int32 [t, k] local entry ids (any order), -1 padded where visible[t] < k.
    """
    t, h, d = q.shape
    if h < 16 or h & (h - 1) or d < 16 or d & (d - 1):
        raise ValueError(f"q: fused indexer needs heads and head dim powers of two >= 16, got shape {tuple(q.shape)}")
    k_flat = k_cache.reshape(-1, d)
    if k_flat.stride(1) != 1:
        k_flat = k_flat.contiguous()
    q = q if q.stride(2) == 1 else q.contiguous()
    weights = weights if weights.stride(1) == 1 else weights.contiguous()
    if block_table is not None:
        rpb = k_cache.shape[1] if k_cache.dim() == 3 else int(rows_per_block)
        n_cap = block_table.shape[1] * rpb
        table = block_table.contiguous()
    else:
        rpb, n_cap, table = 1, k_flat.shape[0], visible
    out = torch.empty((t, k), dtype=torch.int32, device=q.device)
    if t == 0:
        return out
    p = programs or _programs(t, q.device)
    sample = default_sample(n_cap)
    cap = default_cap(k, sample)
    slab = torch.empty((p, max(n_cap, 1)), dtype=torch.int32, device=q.device)
    skey = torch.empty((p, cap), dtype=torch.int32, device=q.device)
    scol = torch.empty((p, cap), dtype=torch.int32, device=q.device)
    seq = seq_rows.contiguous() if seq_rows is not None else visible
    # fp32 inputs: IEEE fp32 dots. Triton's CPU interpreter multiplies bf16 operands of tl.dot wrongly (it
    # sees their raw bits), so there the bf16 path casts to fp32 too (exact products, fp32 sums).
    ieee = q.dtype == torch.float32 or k_flat.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"
    _indexer_fused_kernel[(p,)](
        q, weights, k_flat, visible.contiguous(), seq, table, out, slab, skey, scol,
        t, k, cap, max(n_cap, 1), rpb,
        q.stride(0), q.stride(1), weights.stride(0), k_flat.stride(0), table.stride(0), out.stride(0), out.stride(1),
        H=h, D=d, BLOCK_N=block_n, HAS_TABLE=block_table is not None, HAS_SEQ=seq_rows is not None, IEEE=ieee,
        BLOCK=block, SBLOCK=min(block, SBLOCK), SAMPLE=sample, CHUNK=CHUNK, PAD_BLOCK=PAD_BLOCK,
        num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
