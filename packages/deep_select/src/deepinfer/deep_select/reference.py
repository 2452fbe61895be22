"""Pure PyTorch reference of every deep_select op (no validation: `api.py` checks arguments first).

Selection order (the contract every fast path must reproduce exactly):

* values compare numerically in fp32 (bf16 / fp16 widen exactly), so -0.0 == +0.0;
* equal values: the lower column index ranks higher (deterministic tie rule);
* -inf ranks below every finite value; NaN ranks below -inf (chosen only when nothing else valid is left);
* columns outside a row's valid range are never chosen; their output slots are -1 (values -inf).

The reference realises that order with one unique int64 key per entry (an order-preserving integer image of
the fp32 value in the high 32 bits, the reversed column index in the low 32 bits), so `torch.topk` never sees
a tie and its own tie behaviour cannot leak into the result.
"""

from __future__ import annotations

import torch

__all__ = ["indexer_scores", "indexer_topk", "indexer_topk_scores", "order_keys", "topk", "topk_ragged", "value_keys"]

_INF_BITS = 0x7F800000  # fp32 bit pattern of +inf
_NAN_KEY = -_INF_BITS - 1  # one below -inf
_INVALID_KEY = -_INF_BITS - 2  # below NaN: never chosen ahead of a valid entry
_LOW = 1 << 32
# Bound on elements of one [rows, heads, n] fp32 intermediate; keeps the reference's memory flat.
_CHUNK_ELEMS = 1 << 24


def value_keys(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """int64 numeric-order key of each value (equal values tie; NaN below -inf; invalid below NaN).

    scores: float [...]; valid: bool of the same shape (False = never chosen). Returns int64 [...].
    """
    bits = scores.float().contiguous().view(torch.int32).to(torch.int64)
    # Sign-magnitude -> two's-complement order; -0.0 and +0.0 both map to 0 so they tie.
    key = torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    key = torch.where(torch.isnan(scores), torch.full_like(key, _NAN_KEY), key)
    return torch.where(valid, key, torch.full_like(key, _INVALID_KEY))


def order_keys(scores: torch.Tensor, valid: torch.Tensor, cols: torch.Tensor | None = None) -> torch.Tensor:
    """Unique int64 ranking keys: a larger key ranks higher.

    scores: float [b, n]; valid: bool [b, n] (False = never chosen); cols: int [b, n] column of each entry
    (None: 0 .. n - 1). Returns int64 [b, n].
    """
    if cols is None:
        cols = torch.arange(scores.shape[-1], device=scores.device, dtype=torch.int64)
    return value_keys(scores, valid) * _LOW + (_LOW - 1 - cols.to(torch.int64))


def _select(
    scores: torch.Tensor, valid: torch.Tensor, k: int, return_values: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Top-k by `order_keys`, sorted descending; invalid picks and k > n padding become -1 / -inf."""
    b, n = scores.shape
    keys = order_keys(scores, valid)
    take = min(k, n)
    pos = torch.topk(keys, take, dim=-1, largest=True, sorted=True).indices
    ok = torch.gather(valid, 1, pos)
    idx = torch.full((b, k), -1, dtype=torch.int32, device=scores.device)
    idx[:, :take] = torch.where(ok, pos, -1).to(torch.int32)
    if not return_values:
        return idx, None
    vals = torch.full((b, k), float("-inf"), dtype=scores.dtype, device=scores.device)
    picked = torch.gather(scores, 1, pos)
    vals[:, :take] = torch.where(ok, picked, torch.full_like(picked, float("-inf")))
    return idx, vals


def topk(
    scores: torch.Tensor, k: int, lengths: torch.Tensor | None = None, return_values: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Row-wise top-k of scores [b, n]; lengths int32 [b] (clamped to [0, n]) or None = whole rows.

    Returns (indices int32 [b, k] sorted by rank, values [b, k] in scores.dtype or None).
    """
    b, n = scores.shape
    col = torch.arange(n, device=scores.device)
    if lengths is None:
        valid = torch.ones(b, n, dtype=torch.bool, device=scores.device)
    else:
        valid = col[None, :] < lengths.to(torch.int64)[:, None]
    return _select(scores, valid, k, return_values)


def topk_ragged(
    scores: torch.Tensor, k: int, starts: torch.Tensor, ends: torch.Tensor, return_values: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Top-k of row t over columns starts[t] <= c < ends[t]; returns c - starts[t] (-1 padded)."""
    n = scores.shape[1]
    col = torch.arange(n, device=scores.device)[None, :]
    s64, e64 = starts.to(torch.int64)[:, None], ends.to(torch.int64)[:, None]
    idx, vals = _select(scores, (col >= s64) & (col < e64), k, return_values)
    rel = torch.where(idx >= 0, idx.to(torch.int64) - s64, -1).to(torch.int32)
    return rel, vals


def _weighted_relu_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """sum_h w[t, h] * relu(q[t, h] . keys[..., j]) in fp32.

    q: [t, h, d]; weights: [t, h]; keys: [n, d] (shared) or [t, n, d] (per row). Returns fp32 [t, n].
    """
    qf, wf, kf = q.float(), weights.float(), keys.float()
    if kf.dim() == 2:
        logits = torch.einsum("thd,nd->thn", qf, kf)
    else:
        logits = torch.einsum("thd,tnd->thn", qf, kf)
    return torch.einsum("thn,th->tn", torch.relu(logits), wf)


def _row_chunk(t: int, per_row: int) -> int:
    """Rows per chunk so that one chunk's intermediate stays below _CHUNK_ELEMS elements."""
    return max(1, min(t, _CHUNK_ELEMS // max(per_row, 1)))


def indexer_scores(q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """I[t, j] = sum_h weights[t, h] * relu(q[t, h] . k[j]) in fp32.

    q: [t, h, d] bf16/fp32; weights: fp32 [t, h]; k: [n, d] bf16/fp32. Returns fp32 [t, n].
    """
    t, h, _ = q.shape
    n = k.shape[0]
    out = torch.empty(t, n, dtype=torch.float32, device=q.device)
    step = _row_chunk(t, h * n)
    for r in range(0, t, step):
        out[r : r + step] = _weighted_relu_scores(q[r : r + step], weights[r : r + step], k)
    return out


def _entry_slots(
    visible: torch.Tensor, seq_rows: torch.Tensor, block_table: torch.Tensor, rows_per_block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat cache slot of every (query, entry j) and whether j < visible. Returns int64 [t, m], bool [t, m]."""
    m = block_table.shape[1] * rows_per_block
    j = torch.arange(m, device=visible.device)
    live = j[None, :] < visible.to(torch.int64)[:, None]
    blocks = block_table.to(torch.int64)[seq_rows.to(torch.int64)][:, j // rows_per_block]
    # Table entries past a sequence's visible blocks may hold garbage; never dereference them.
    blocks = torch.where(live, blocks, 0)
    return blocks * rows_per_block + j % rows_per_block, live


def _paged_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_flat: torch.Tensor,
    slots: torch.Tensor,
    live: torch.Tensor,
) -> torch.Tensor:
    """Indexer scores of each query over its own sequence's entries; -inf where not live. fp32 [t, m]."""
    t, h, d = q.shape
    m = slots.shape[1]
    out = torch.empty(t, m, dtype=torch.float32, device=q.device)
    step = _row_chunk(t, m * max(h, d))
    for r in range(0, t, step):
        rows = k_flat[slots[r : r + step]]  # [chunk, m, d]
        sc = _weighted_relu_scores(q[r : r + step], weights[r : r + step], rows)
        out[r : r + step] = torch.where(live[r : r + step], sc, float("-inf"))
    return out


def indexer_topk_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_cache: torch.Tensor,
    visible: torch.Tensor,
    seq_rows: torch.Tensor | None,
    block_table: torch.Tensor | None,
    rows_per_block: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The score half of `indexer_topk`: (fp32 [t, m] scores over each query's own entries, int32 [t] lengths).

    Entry j of row t is valid iff j < lengths[t]; the selection step is `topk(scores, k, lengths)`.
    """
    d = k_cache.shape[-1]
    k_flat = k_cache.reshape(-1, d)
    if block_table is None:
        scores = indexer_scores(q, weights, k_flat)
        return scores, visible.clamp(0, k_flat.shape[0])
    if seq_rows is None:
        seq_rows = torch.zeros(q.shape[0], dtype=torch.int32, device=q.device)
    assert rows_per_block is not None
    slots, live = _entry_slots(visible, seq_rows, block_table, rows_per_block)
    scores = _paged_scores(q, weights, k_flat, slots, live)
    return scores, visible.clamp(0, scores.shape[1])


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_cache: torch.Tensor,
    k: int,
    visible: torch.Tensor,
    seq_rows: torch.Tensor | None,
    block_table: torch.Tensor | None,
    rows_per_block: int | None,
) -> torch.Tensor:
    """Paged lightning-indexer top-k (see `api.indexer_topk`). Returns local entry ids int32 [t, k], -1 padded."""
    scores, lengths = indexer_topk_scores(q, weights, k_cache, visible, seq_rows, block_table, rows_per_block)
    return topk(scores, k, lengths)[0]
