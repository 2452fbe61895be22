"""MoE routing references: scoring with selection bias, top-k, renormalisation, hash routing, and the
token-to-expert permutation for grouped GEMMs with its weighted un-permute."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


def moe_scores(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """Router scores [t, E] fp32 from logits [t, E]: sqrtsoftplus | sigmoid | softmax."""
    lf = logits.float()
    if scoring == "sqrtsoftplus":
        return torch.sqrt(F.softplus(lf))
    if scoring == "sigmoid":
        return torch.sigmoid(lf)
    if scoring == "softmax":
        return torch.softmax(lf, dim=-1)
    raise ValueError(f"scoring must be 'sqrtsoftplus', 'sigmoid' or 'softmax', got {scoring!r}")


def _finish_weights(scores: torch.Tensor, ids: torch.Tensor, route_scale: float, renorm: bool) -> torch.Tensor:
    w = scores.gather(1, ids)
    if renorm:
        w = w / w.sum(dim=-1, keepdim=True)
    return w * route_scale


def moe_route(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    topk: int,
    scoring: str = "sqrtsoftplus",
    route_scale: float = 1.0,
    renorm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Select experts: ids = topk(score + bias), weights = score[ids] (renormalised, scaled).

    logits: [t, E] router logits (fp32 math); bias: [E] selection-only bias or None.
    Returns (weights [t, topk] fp32, ids [t, topk] int64). Ties pick the lower expert id.
    """
    scores = moe_scores(logits, scoring)
    sel = scores if bias is None else scores + bias.float()
    ids = torch.sort(sel, dim=-1, descending=True, stable=True).indices[:, :topk]
    return _finish_weights(scores, ids, route_scale, renorm), ids


def hash_route(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    tid2eid: torch.Tensor,
    scoring: str = "sqrtsoftplus",
    route_scale: float = 1.0,
    renorm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hash routing: experts fixed per token id (tid2eid [vocab, topk]), weights from the learned scores.

    logits: [t, E]; token_ids: [t] int. Returns (weights [t, topk] fp32, ids [t, topk] int64).
    """
    ids = tid2eid[token_ids.long()].long()
    return _finish_weights(moe_scores(logits, scoring), ids, route_scale, renorm), ids


class MoePermutation(NamedTuple):
    """Result of `moe_permute`: the routed rows grouped by expert, and the maps back to the tokens.

    P = the number of valid (expert id >= 0) slots, or with `block` the padded total sum(ceil(count / block) *
    block). Within each expert the rows are in token order, then slot order (a stable sort of the flattened
    [t, k] slots by expert id).

    x: [P, h] x.dtype, the permuted rows; padding rows are zero.
    expert_counts: [E] int32, valid rows of each expert (the masked layout's `masked_m`).
    expert_offsets: [E] int32, cumulative end row of each expert's (padded) segment in `x`: the `offs` of
        `torch._grouped_mm` and of deep_gemm's W4A16 / W4A8 grouped GEMMs; offsets[-1] == P.
    row_expert: [P] int32, the expert of each row of `x`, -1 on padding rows (DeepGEMM's `m_indices`).
    src_map: [t, k] int32, the row of `x` that holds slot (i, j), -1 for masked slots (`moe_unpermute` reads it).
    """

    x: torch.Tensor
    expert_counts: torch.Tensor
    expert_offsets: torch.Tensor
    row_expert: torch.Tensor
    src_map: torch.Tensor


def moe_permute(
    x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int, *, block: int | None = None
) -> MoePermutation:
    """Group the rows of x by the experts of their top-k slots (one row per valid slot), for a grouped GEMM.

    x: [t, h] (any dtype: a row copy); topk_idx: [t, k] int32/int64 expert ids in [0, num_experts), -1 = masked
    slot. block: None (segments back to back) or pad each expert's segment with zero rows to a multiple of
    `block` (an expert with no rows keeps an empty segment). Order: by expert, then token, then slot.
    Returns `MoePermutation` (shapes in its docstring). P depends on the routing: it is read back (host sync).
    """
    t, k = topk_idx.shape
    dev = x.device
    flat = topk_idx.reshape(-1).long()
    key = torch.where(flat >= 0, flat, num_experts)  # masked slots sort after every expert
    order = torch.sort(key, stable=True).indices  # flat slot index = token * k + slot: ties keep token, slot order
    sorted_key = key[order]
    experts = torch.arange(num_experts, device=dev)
    ends = torch.searchsorted(sorted_key, experts, right=True)  # valid-slot ends per expert, no atomics
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    step = 1 if block is None else block
    padded = (counts + step - 1) // step * step
    offsets = torch.cumsum(padded, 0)
    n_valid = int(ends[-1])  # host sync: sizes the outputs
    total = int(offsets[-1])
    slots = order[:n_valid]
    e = sorted_key[:n_valid]
    # row of the i-th valid sorted slot: its expert's padded start + its rank within the expert
    rank = torch.arange(n_valid, device=dev) - (ends - counts)[e]
    dest = (offsets - padded)[e] + rank
    out = torch.zeros(total, x.shape[1], dtype=x.dtype, device=dev)
    out[dest] = x[torch.div(slots, k, rounding_mode="floor")]
    row_expert = torch.full((total,), -1, dtype=torch.int32, device=dev)
    row_expert[dest] = e.to(torch.int32)
    src_map = torch.full((t * k,), -1, dtype=torch.int32, device=dev)
    src_map[slots] = dest.to(torch.int32)
    return MoePermutation(out, counts.to(torch.int32), offsets.to(torch.int32), row_expert, src_map.reshape(t, k))


def moe_unpermute(
    y: torch.Tensor,
    src_map: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Weighted reduce of the expert outputs back to the tokens: out[i] = sum_j w[i, j] * y[src_map[i, j]].

    y: [P, h] rows in `moe_permute`'s order; src_map: [t, k] int (-1 = masked slot: contributes nothing, its
    weight and y are not read); topk_weights: [t, k] float. fp32 products and sums, added in slot order j = 0, 1,
    ... from 0 (deterministic, no atomics), then cast once. Returns [t, h] out_dtype (default y.dtype).
    """
    t, k = src_map.shape
    acc = torch.zeros(t, y.shape[1], dtype=torch.float32, device=y.device)
    if y.shape[0] == 0:  # no rows: every slot is masked
        return acc.to(y.dtype if out_dtype is None else out_dtype)
    rows = src_map.long()
    w = topk_weights.float()
    for j in range(k):
        valid = rows[:, j] >= 0
        term = y[rows[:, j].clamp(min=0)].float() * w[:, j : j + 1]
        acc = acc + torch.where(valid[:, None], term, 0.0)
    return acc.to(y.dtype if out_dtype is None else out_dtype)


def stable_argsort(keys: torch.Tensor) -> torch.Tensor:
    """int64 [P]: the stable ascending argsort of integer keys [P] (equal keys keep their input order)."""
    return torch.argsort(keys, stable=True)
