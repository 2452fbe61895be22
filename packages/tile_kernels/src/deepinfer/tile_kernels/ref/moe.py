"""MoE routing references: scoring with selection bias, top-k, renormalisation, hash routing."""

from __future__ import annotations

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
