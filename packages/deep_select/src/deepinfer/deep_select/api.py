"""Public deep_select API: argument validation, then the fastest available implementation.

Every function has a reference twin in `reference.py`. On CUDA tensors `topk`, `topk_ragged` and the selection
step of `indexer_topk` run a radix select (`backends/cuda/`): the CUDA C++ kernel when `backend(device)` answers
"cuda" (the package was built with `_C`), the Triton kernels when it answers "triton" (and as the fallback of
the CUDA kernel); everything else, and every op on other devices, runs the reference. Validation looks at
shapes, dtypes and devices only, never at tensor values, so every function is safe to capture in a CUDA graph
(run each shape once before capturing, so Triton compiles outside the capture).

Selection order shared by all functions (fast paths must reproduce it exactly):

* scores compare numerically (bf16 / fp16 widen to fp32 exactly); -0.0 and +0.0 are equal;
* ties: among equal values the **lower column index wins**, so results are deterministic and independent of n;
* -inf is chosen only after every finite value; **NaN ranks below -inf**: a NaN is chosen only when a row has
  no other valid entry left (NaN counts as a valid entry, it is not padding);
* entries outside a row's valid range are never chosen; when a row has fewer than k valid entries its output
  is padded with index -1 (and value -inf).
"""

from __future__ import annotations

import importlib.util

import torch

from . import reference as _ref
from ._backend import backend
from ._packed import dequant_packed
from ._validate import (
    ACT_DTYPES,
    SCORE_DTYPES,
    check_index_vector,
    check_int,
    check_out,
    check_same_device,
    check_shape,
    check_tensor,
)

__all__ = ["indexer_scores", "indexer_topk", "topk", "topk_ragged"]

_TABLE_DTYPES = (torch.int32, torch.int64)  # the engine's slot ids are int64; tables are int32
TopkResult = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
# An indexer input: a bf16 / fp32 tensor, or a packed (values, scales) pair (`_packed.py`: FP8 e4m3 with fp32 /
# UE8M0 scales, or FP4 e2m1 with UE8M0 scales per 32), dequantised on entry.
IndexerInput = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def _fast_impl(t: torch.Tensor) -> str | None:
    """ "cuda" / "triton" when calls on t's device run a fast selection kernel, None for the reference.

    "triton" also covers CPU tensors with the interpreter forced. Empty inputs take the reference (nothing to
    read; it returns the all-padding result directly).
    """
    if t.numel() == 0:
        return None
    choice = backend(t.device)
    return choice if choice in ("cuda", "triton") else None


def _fused_ok(q: torch.Tensor) -> bool:
    """Whether the fused Triton indexer kernel can serve q [t, h, d]: Triton importable, h and d powers of two
    >= 16 (its dot tiles)."""
    _, h, d = q.shape
    pow2 = all(x >= 16 and x & (x - 1) == 0 for x in (h, d))
    return pow2 and importlib.util.find_spec("triton") is not None


def _fast_select(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None,
    starts: torch.Tensor | None,
    sorted: bool,
    return_values: bool,
    impl: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kernel top-k ids (relative to starts when given), then the optional value gather and rank sort.

    impl: "cuda" or "triton" (`_fast_impl`). The kernel returns ids unsorted with -1 padding; sorting happens
    on the k picks only (tiny next to n).
    """
    from .backends.cuda.dispatch import select_indices  # may import triton: only on the fast path

    idx = select_indices(scores, k, lengths=lengths, starts=starts, impl=impl)
    if not (sorted or return_values):
        return idx, None
    pad = idx < 0
    cols = idx.to(torch.int64)
    if starts is not None:
        cols = cols + starts.to(torch.int64)[:, None]
    cols = torch.where(pad, 0, cols)
    vals = torch.gather(scores, 1, cols)
    vals = torch.where(pad, torch.full_like(vals, float("-inf")), vals)
    if sorted:
        order = torch.argsort(_ref.order_keys(vals, ~pad, cols), dim=1, descending=True)
        idx, vals = torch.gather(idx, 1, order), torch.gather(vals, 1, order)
    return idx, vals if return_values else None


def _finish(idx: torch.Tensor, vals: torch.Tensor | None, out: torch.Tensor | None, return_values: bool) -> TopkResult:
    """Copy indices into the caller's buffer when one was given; attach values when asked."""
    if out is not None:
        out.copy_(idx)
        idx = out
    if return_values:
        assert vals is not None
        return idx, vals
    return idx


def topk(
    scores: torch.Tensor,
    k: int,
    *,
    lengths: torch.Tensor | None = None,
    sorted: bool = False,
    return_values: bool = False,
    out: torch.Tensor | None = None,
) -> TopkResult:
    """Row-wise top-k (largest first) with the deterministic order described in the module docstring.

    Args:
        scores: [b, n] fp32 / bf16 / fp16, any strides. Read only.
        k: >= 1; k > n is allowed (the extra slots are padding).
        lengths: int32 [b] or None. Row i considers columns 0 <= c < lengths[i] only; values are clamped to
            [0, n] (a negative length means an empty row). None means every column is valid.
        sorted: True gives descending value order (ties by ascending index) with padding last; False allows
            any order of the chosen entries (padding may then sit anywhere in the row).
        return_values: also return the chosen values.
        out: optional int32 [b, k] buffer on scores' device that receives the indices (every slot is written).

    Returns:
        indices int32 [b, k] (column ids, -1 = padding), or (indices, values [b, k] in scores.dtype, equal to
        scores at the indices bit for bit, -inf at padding) when return_values.
    """
    check_tensor("scores", scores, ndim=2, dtypes=SCORE_DTYPES)
    check_int("k", k, minimum=1)
    b = scores.shape[0]
    if lengths is not None:
        check_index_vector("lengths", lengths, b)
    check_same_device(scores=scores, lengths=lengths)
    if out is not None:
        check_out(out, (b, k), torch.int32, scores.device)
    impl = _fast_impl(scores)
    if impl is not None:
        idx, vals = _fast_select(scores, k, lengths, None, sorted, return_values, impl)
    else:  # the reference always sorts, which satisfies sorted=False too
        idx, vals = _ref.topk(scores, k, lengths, return_values)
    return _finish(idx, vals, out, return_values)


def topk_ragged(
    scores: torch.Tensor,
    k: int,
    *,
    starts: torch.Tensor,
    ends: torch.Tensor,
    sorted: bool = False,
    return_values: bool = False,
    out: torch.Tensor | None = None,
) -> TopkResult:
    """Ragged (prefill) top-k: row t considers only columns starts[t] <= c < ends[t] (and 0 <= c < n).

    Typical use: scores [t, n] of a flat batch of prefill tokens against every sequence's entries laid out
    back to back; [starts[t], ends[t]) is the part token t may see (causal visibility).

    Args:
        scores: [t, n] fp32 / bf16 / fp16.
        k: >= 1 (k larger than a row's range pads with -1).
        starts, ends: int32 [t]; an empty or inverted range selects nothing.
        sorted, return_values, out: as in `topk`.

    Returns:
        indices int32 [t, k] **relative to starts[t]** (c - starts[t], i.e. the entry id inside the row's
        range; -1 = padding), plus values [t, k] when return_values.
    """
    check_tensor("scores", scores, ndim=2, dtypes=SCORE_DTYPES)
    check_int("k", k, minimum=1)
    t = scores.shape[0]
    check_index_vector("starts", starts, t)
    check_index_vector("ends", ends, t)
    check_same_device(scores=scores, starts=starts, ends=ends)
    if out is not None:
        check_out(out, (t, k), torch.int32, scores.device)
    impl = _fast_impl(scores)
    if impl is not None:
        idx, vals = _fast_select(scores, k, ends, starts, sorted, return_values, impl)
    else:
        idx, vals = _ref.topk_ragged(scores, k, starts, ends, return_values)
    return _finish(idx, vals, out, return_values)


def _check_indexer_qw(q: torch.Tensor, weights: torch.Tensor) -> None:
    check_tensor("q", q, ndim=3, dtypes=ACT_DTYPES)
    check_tensor("weights", weights, ndim=2, dtypes=(torch.float32,))
    check_shape("weights", weights, tuple(q.shape[:2]))


def indexer_scores(q: IndexerInput, weights: torch.Tensor, k: IndexerInput) -> torch.Tensor:
    """Lightning-indexer scores I[t, j] = sum_h weights[t, h] * relu(q[t, h] . k[j]), all in fp32.

    Args:
        q: [t, h, d] bf16 / fp32 indexer queries (V4: h = 64, d = 128), or packed as the model stores them:
            (float8_e4m3fn [t, h, d], scales [t, h, d / block] fp32 or UE8M0) or (uint8 [t, h, d / 2] e2m1 low
            nibble first, UE8M0 scales [t, h, d / 32]). Packed inputs are dequantised on entry (`_packed.py`;
            exact with UE8M0 scales), not fused.
        weights: fp32 [t, h] per-head weights (the model folds its scale factors in here).
        k: [n, d] bf16 / fp32 indexer keys, or packed like q ([n, d] / [n, d / 2] values).

    Returns:
        fp32 [t, n]. Exact zeros are common (every head's ReLU clipped), so expect ties.
    """
    q, k = dequant_packed("q", q), dequant_packed("k", k)
    _check_indexer_qw(q, weights)
    check_tensor("k", k, ndim=2, dtypes=ACT_DTYPES)
    if k.shape[1] != q.shape[2]:
        raise ValueError(f"k must have last dim {q.shape[2]} (q's head dim), got shape {tuple(k.shape)}")
    check_same_device(q=q, weights=weights, k=k)
    return _ref.indexer_scores(q, weights, k)


def _check_paging(
    k_cache: torch.Tensor,
    t: int,
    seq_rows: torch.Tensor | None,
    block_table: torch.Tensor | None,
    rows_per_block: int | None,
) -> int | None:
    """Validate the paging arguments; returns the rows per block to use (None when not paged)."""
    if block_table is None:
        if seq_rows is not None or rows_per_block is not None:
            raise ValueError("seq_rows and rows_per_block need block_table, got block_table=None")
        return None
    check_tensor("block_table", block_table, ndim=2, dtypes=_TABLE_DTYPES)
    if seq_rows is None:
        if block_table.shape[0] != 1:
            raise ValueError(f"seq_rows=None needs a one-row block_table, got shape {tuple(block_table.shape)}")
    else:
        check_index_vector("seq_rows", seq_rows, t, _TABLE_DTYPES)
    if k_cache.dim() == 3:
        if rows_per_block is not None and rows_per_block != k_cache.shape[1]:
            raise ValueError(f"rows_per_block must equal k_cache.shape[1]={k_cache.shape[1]}, got {rows_per_block}")
        return k_cache.shape[1]
    if rows_per_block is None:
        raise ValueError("rows_per_block is required when k_cache is flat [num_slots, d] and block_table is given")
    return check_int("rows_per_block", rows_per_block, minimum=1)


def indexer_topk(
    q: IndexerInput,
    weights: torch.Tensor,
    k_cache: IndexerInput,
    k: int,
    *,
    visible: torch.Tensor,
    seq_rows: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    rows_per_block: int | None = None,
    fused: bool = False,
) -> torch.Tensor:
    """Paged lightning-indexer top-k: `topk(indexer_scores(...), k)` over each query's own sequence.

    Args:
        q: [t, h, d] bf16 / fp32, or packed FP8 / FP4 (as in `indexer_scores`); weights: fp32 [t, h].
        k_cache: [num_slots, d] (flat) or [blocks, rows_per_block, d], bf16 / fp32; slot s is row s of
            k_cache.view(-1, d). Slots no query can see may hold anything (NaN included). Or packed like q
            (values [..., d] FP8 / [..., d / 2] FP4 with the same leading dims, scales [..., groups]): the whole
            cache is dequantised on entry (a dense copy of it, every call), not fused.
        k: >= 1 entries to select per query.
        visible: int32 [t]; query t sees its sequence's entries 0 <= j < visible[t] (clamped at 0 and at the
            sequence's capacity).
        seq_rows: int32 / int64 [t] row of block_table holding query t's sequence; None = every query uses row 0
            (block_table must then have one row).
        block_table: int32 / int64 [num_seqs, max_blocks] or None. Entry j of a sequence lives in flat slot
            block_table[seq, j // rows_per_block] * rows_per_block + j % rows_per_block; table entries past
            the visible blocks are never read. None: entry j is k_cache row j (one sequence).
        rows_per_block: entries per block; taken from k_cache.shape[1] when k_cache is 3-D, required otherwise.
        fused: on CUDA (with Triton installed; h and d powers of two >= 16, as V4's 64 x 128), run the fused
            Triton kernel (`backends/cuda/triton_indexer.py`: scores and selection in one kernel, the [t, n]
            score matrix is never written; 1.43-1.47x GEMM + torch.topk on the H200 at t = 4,096, n = 65,536).
            Caveat: its fp32 sums run in a different order than `indexer_scores`, so entries whose scores differ
            only by rounding (near-ties at the k-th place) may be chosen differently from `topk(indexer_scores)`;
            inputs whose sums are exact select identically. Other devices / shapes ignore the flag.

    Returns:
        int32 [t, k] local entry ids j (not slots), -1 padded when visible[t] < k; order unspecified.
    """
    q, k_cache = dequant_packed("q", q), dequant_packed("k_cache", k_cache)
    _check_indexer_qw(q, weights)
    check_tensor("k_cache", k_cache, ndim=(2, 3), dtypes=ACT_DTYPES)
    if k_cache.shape[-1] != q.shape[2]:
        raise ValueError(f"k_cache must have last dim {q.shape[2]} (q's head dim), got shape {tuple(k_cache.shape)}")
    check_int("k", k, minimum=1)
    t = q.shape[0]
    check_index_vector("visible", visible, t)
    rpb = _check_paging(k_cache, t, seq_rows, block_table, rows_per_block)
    check_same_device(
        q=q, weights=weights, k_cache=k_cache, visible=visible, seq_rows=seq_rows, block_table=block_table
    )
    impl = _fast_impl(q)
    if impl is None:
        return _ref.indexer_topk(q, weights, k_cache, k, visible, seq_rows, block_table, rpb)
    if fused and _fused_ok(q):
        from .backends.cuda.triton_indexer import indexer_topk_fused

        return indexer_topk_fused(
            q, weights, k_cache, k, visible=visible, seq_rows=seq_rows, block_table=block_table, rows_per_block=rpb
        )
    # Scores by the reference (materialised [t, m] fp32), selection by the CUDA / Triton kernel.
    scores, lengths = _ref.indexer_topk_scores(q, weights, k_cache, visible, seq_rows, block_table, rpb)
    return _fast_select(scores, k, lengths, None, False, False, impl)[0]
