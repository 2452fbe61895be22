"""Handles returned by dispatch: what combine needs to send expert outputs back (opaque to callers).

Index tensors live on the device of the dispatched data; counts are Python lists (the CPU already knows
them after dispatch, as in DeepEP's normal mode).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DispatchHandle:
    """Normal-mode routing of one dispatch.

    Sender side: `send_token_idx` int64 [sum(send_counts)] lists our tokens in send order (grouped by
    destination rank, ascending token index within a rank); `send_counts[r]` rows went to rank r.
    Receiver side: `recv_counts[r]` rows came from rank r; received rows are grouped by source rank and
    `recv_src_idx` int64 [num_recv] gives each row's token index on its source rank.
    `is_token_in_rank` bool [num_tokens, world] is the layout used; `num_recv_tokens_per_expert_list`
    is what dispatch returned (so a cached dispatch can return it again).
    """

    num_tokens: int
    num_experts: int
    is_token_in_rank: torch.Tensor
    send_token_idx: torch.Tensor
    send_counts: list[int] | None
    recv_counts: list[int] | None
    recv_src_idx: torch.Tensor
    num_recv_tokens_per_expert_list: list[int] | None
    # Fast path only: M[s][d] = rows rank s sent to rank d (every rank's offsets derive from it); None
    # when the reference made the handle.
    count_matrix: list[list[int]] | None = None
    # Fused fast path only: int64 [world, num_tokens], the send position of token t's row for rank d (its
    # index into send_token_idx), -1 where t was not sent to d; combine's reduction reads it as is.
    send_pos: torch.Tensor | None = None
    # dispatch(num_worst_tokens=W): received tensors have W rows (the real ones first). With
    # `device_counts` (the no-sync fast path) the counts never reached the host: the list fields above are
    # None, send_token_idx has R * num_tokens entries (the first sum(send counts) valid), recv_src_idx is -1
    # past the received rows, and device_counts is int64 [R * R + 2] on the device: M row-major, rows
    # received here, error bits (`backends.triton.nosync.ERRORS`); `recv_expert_counts` int32 [E / R] is the
    # aligned per-expert count dispatch returned. Without it (a synced path padded to W) the lists are real.
    num_worst_tokens: int = 0
    device_counts: torch.Tensor | None = None
    recv_expert_counts: torch.Tensor | None = None
    # made by the overlapped variant (`dispatch(..., overlap=True)`): combine runs its kernels too
    overlap: bool = False

    @property
    def num_recv_tokens(self) -> int:
        """Rows combine expects: num_worst_tokens when dispatch was given one, else the rows received."""
        return self.num_worst_tokens if self.num_worst_tokens else sum(self.recv_counts)

    @property
    def num_real_recv_tokens(self) -> int:
        """Rows actually received (a host synchronisation for a no-sync handle)."""
        if self.device_counts is not None:
            return int(self.device_counts[-2].item())
        return sum(self.recv_counts)

    def host_counts(self) -> tuple[list[list[int]], list[int]]:
        """(count matrix M [R][R], tokens per local expert, aligned): the lists a synced dispatch returns;
        for a no-sync handle this reads them from the device (one host synchronisation, on request only)."""
        if self.device_counts is None:
            return [list(r) for r in self.count_matrix or []], list(self.num_recv_tokens_per_expert_list)
        flat = self.device_counts.tolist()
        world = self.is_token_in_rank.shape[1]
        matrix = [flat[s * world : (s + 1) * world] for s in range(world)]
        return matrix, self.recv_expert_counts.tolist()

    def check(self) -> None:
        """Raise ValueError if the no-sync dispatch of this handle saw bad input (a host synchronisation;
        a no-op for other handles, whose dispatch raised already). Every rank sees the same bits."""
        if self.device_counts is None:
            return
        bits = int(self.device_counts[-1].item())
        if bits:
            from .backends.triton.nosync import ERRORS

            why = "; ".join(msg for bit, msg in ERRORS.items() if bits & bit)
            raise ValueError(f"dispatch(num_worst_tokens={self.num_worst_tokens}): {why} (error bits {bits})")


@dataclass(frozen=True)
class LowLatencyHandle:
    """Low-latency-mode routing of one dispatch.

    Sender side: one row per (token, top-k slot) with a valid expert, in send order (ascending global
    expert id, then token): `send_token` / `send_slot` int64 [sum(send_counts)]; `send_counts[r]` rows went
    to rank r. `topk_idx` [num_tokens, k] is the routing dispatched (combine checks it gets the same).
    Receiver side, in arrival order (source rank, then local expert, then token): `recv_expert` /
    `recv_pos` int64 [sum(recv_counts)] say where each row was placed in recv_x (`recv_x[e, pos]`);
    `recv_src_rank` / `recv_src_token` int64 say where it came from.
    """

    num_tokens: int
    hidden: int
    num_experts: int
    num_max_dispatch_tokens_per_rank: int
    topk_idx: torch.Tensor
    send_token: torch.Tensor
    send_slot: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]
    recv_expert: torch.Tensor
    recv_pos: torch.Tensor
    recv_src_rank: torch.Tensor
    recv_src_token: torch.Tensor


@dataclass(frozen=True)
class LowLatencyFastHandle:
    """Low-latency routing kept by the intranode fast path (`lowlatency.py`); everything stays on the device.

    `recv_meta` int32 [E_local, max * R, 4]: for row i < recv_count[e] of expert e, (source rank, source
    token, top-k slot, -); `recv_count` int32 [E_local] is the count dispatch returned (filled by its
    receive kernel). Combine sends row (e, i) to [token, slot] of the source's combine area.
    """

    num_tokens: int
    hidden: int
    num_experts: int
    num_max_dispatch_tokens_per_rank: int
    k: int
    recv_meta: torch.Tensor
    recv_count: torch.Tensor
