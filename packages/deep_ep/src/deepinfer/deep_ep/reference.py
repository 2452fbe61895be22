"""Pure PyTorch reference of normal-mode (throughput) dispatch / combine and of the dispatch layout.

Experts are split evenly and contiguously over ranks: rank r owns global experts
[r * E / R, (r + 1) * E / R). Operands arrive validated by `buffer.Buffer`; value checks (expert ids in
range, layout consistent with topk_idx) are done here. Every rank must call the same op in the same order
(they are collectives). The transfers complete before a function returns.
"""

from __future__ import annotations

import torch

from ._comm import Comm, pack_rows, unpack_rows
from .handles import DispatchHandle

__all__ = ["dispatch_layout", "layout_nocheck", "check_topk_idx", "dispatch", "cached_dispatch", "combine"]

XPayload = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def check_topk_idx(topk_idx: torch.Tensor, num_experts: int) -> None:
    """Raise ValueError unless every entry of topk_idx is -1 (masked) or an expert id in [0, num_experts)."""
    if topk_idx.numel() == 0:
        return
    lo, hi = int(topk_idx.min()), int(topk_idx.max())
    if lo < -1 or hi >= num_experts:
        raise ValueError(f"topk_idx: expected expert ids in [-1, {num_experts - 1}], got values in [{lo}, {hi}]")


def dispatch_layout(
    topk_idx: torch.Tensor, num_experts: int, world_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where each token goes: (tokens per rank int32 [R], tokens per expert int32 [E], is_token_in_rank bool [t, R]).

    A token counts once per rank and once per expert however many of its top-k slots point there.
    """
    check_topk_idx(topk_idx, num_experts)
    return layout_nocheck(topk_idx, num_experts, world_size)


def layout_nocheck(
    topk_idx: torch.Tensor, num_experts: int, world_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`dispatch_layout` without the value check (which synchronises with the host; the fast path checks
    the ids after its count exchange instead)."""
    t, dev = topk_idx.shape[0], topk_idx.device
    per_rank = num_experts // world_size
    idx = topk_idx.to(torch.int64)
    hit = torch.zeros((t, num_experts + 1), dtype=torch.bool, device=dev)
    hit.scatter_(1, torch.where(idx >= 0, idx, num_experts), True)  # masked slots land in a spare column
    chose_expert = hit[:, :num_experts]
    is_token_in_rank = chose_expert.reshape(t, world_size, per_rank).any(dim=2)
    per_rank_counts = is_token_in_rank.sum(dim=0, dtype=torch.int32)
    per_expert_counts = chose_expert.sum(dim=0, dtype=torch.int32)
    return per_rank_counts, per_expert_counts, is_token_in_rank


def _send_order(is_token_in_rank: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Token indices in send order (by destination rank, then token) and the row count for each rank."""
    dst, tok = torch.nonzero(is_token_in_rank.T, as_tuple=True)  # row-major over [R, t]: rank first
    counts = torch.bincount(dst, minlength=is_token_in_rank.shape[1]).tolist()
    return tok, counts


def _x_fields(x: XPayload) -> list[torch.Tensor]:
    return list(x) if isinstance(x, tuple) else [x]


def _layout_of(parts: list[torch.Tensor]) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    return [(p.dtype, tuple(p.shape[1:])) for p in parts]


def _local_routing(
    idx: torch.Tensor, weights: torch.Tensor, rank: int, per_rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global top-k ids -> local expert ids (-1 where the expert lives elsewhere) and weights (0 there)."""
    local = idx - rank * per_rank
    mine = (idx >= 0) & (local >= 0) & (local < per_rank)
    return torch.where(mine, local, -1), torch.where(mine, weights, 0.0)


def _count_per_expert(recv_idx: torch.Tensor, per_rank: int, alignment: int) -> list[int]:
    """Received tokens that chose each local expert (once per token), rounded up to `alignment`."""
    hit = torch.zeros((recv_idx.shape[0], per_rank + 1), dtype=torch.bool, device=recv_idx.device)
    hit.scatter_(1, torch.where(recv_idx >= 0, recv_idx, per_rank), True)  # column per_rank collects -1
    counts = hit[:, :per_rank].sum(dim=0).tolist()
    return [-(-c // alignment) * alignment for c in counts]


def dispatch(
    comm: Comm,
    x: XPayload,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    is_token_in_rank: torch.Tensor | None,
    expert_alignment: int,
) -> tuple[XPayload, torch.Tensor, torch.Tensor, list[int], DispatchHandle]:
    """Send each token (once) to every rank owning one of its top-k experts; see `Buffer.dispatch`."""
    _, _, layout = dispatch_layout(topk_idx, num_experts, comm.world_size)
    if is_token_in_rank is not None and not torch.equal(is_token_in_rank, layout):
        raise ValueError("is_token_in_rank: does not match the layout of topk_idx (from get_dispatch_layout)")
    send_tok, send_counts = _send_order(layout)
    fields = [*_x_fields(x), topk_idx.to(torch.int64), topk_weights, torch.arange(x_rows(x), device=layout.device)]
    recv_counts = comm.exchange_counts(send_counts, layout.device)
    # Index packed bytes, not the fields: float8_e8m0fnu has no indexing kernels.
    rows = comm.exchange_rows(pack_rows(fields)[send_tok], send_counts, recv_counts)
    *recv_x, recv_idx, recv_w, recv_src = unpack_rows(rows, _layout_of(fields))
    per_rank = num_experts // comm.world_size
    local_idx, local_w = _local_routing(recv_idx, recv_w, comm.rank, per_rank)
    counts = _count_per_expert(local_idx, per_rank, expert_alignment)
    handle = DispatchHandle(
        topk_idx.shape[0], num_experts, layout, send_tok, send_counts, recv_counts, recv_src, counts
    )
    out_x = tuple(recv_x) if isinstance(x, tuple) else recv_x[0]
    return out_x, local_idx, local_w, counts, handle


def x_rows(x: XPayload) -> int:
    """Number of tokens of a dispatch payload (a tensor or a (values, scales) pair)."""
    return _x_fields(x)[0].shape[0]


def cached_dispatch(comm: Comm, x: XPayload, handle: DispatchHandle) -> XPayload:
    """Dispatch x along the routing of an earlier dispatch (DeepEP's handle reuse); only x travels."""
    fields = _x_fields(x)
    rows = pack_rows(fields)[handle.send_token_idx]
    recv = unpack_rows(comm.exchange_rows(rows, handle.send_counts, handle.recv_counts), _layout_of(fields))
    return tuple(recv) if isinstance(x, tuple) else recv[0]


def combine(
    comm: Comm, y: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return y's rows to their source ranks and sum them per original token; see `Buffer.combine`.

    The sum runs in float32 in rank order (deterministic) and is cast to y.dtype once. Tokens sent
    nowhere (all top-k masked) get zeros.
    """
    fields = [y] if topk_weights is None else [y, topk_weights]
    back = comm.exchange_rows(pack_rows(fields), handle.recv_counts, handle.send_counts)
    got = unpack_rows(back, _layout_of(fields))
    idx = handle.send_token_idx
    out = torch.zeros((handle.num_tokens, y.shape[1]), dtype=torch.float32, device=y.device)
    out.index_add_(0, idx, got[0].to(torch.float32))
    if topk_weights is None:
        return out.to(y.dtype), None
    w = torch.zeros((handle.num_tokens, topk_weights.shape[1]), dtype=torch.float32, device=y.device)
    w.index_add_(0, idx, got[1].to(torch.float32))
    return out.to(y.dtype), w.to(topk_weights.dtype)
