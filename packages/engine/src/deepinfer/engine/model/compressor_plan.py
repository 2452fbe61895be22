"""Host-side index plan that lets the compressor pool every sequence of a prefill step in one pass.

Each chunk's buffer (the not-yet-pooled tail rows kept from earlier steps, then the chunk's new rows) lives
in one virtual tensor V = cat(tail rows of all chunks, new rows of all tokens). The plan holds, as int64
index tensors built on the host with CPU tensor ops (no device kernels, no host syncs):
which tail rows to read, the V rows of every closing window's pooling slots, and where the new tails go.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrefillPlan:
    tail_slot: torch.Tensor  # [n_old] slot of each tail row read into V
    tail_row: torch.Tensor  # [n_old] tail row (position % tail_rows)
    win_slot: torch.Tensor  # [w] slot (sequence) of each closing window
    win_j: torch.Tensor  # [w] entry id of each closing window
    win_vidx: torch.Tensor  # [w, span] V row of each pooling slot; -1: before position 0 (padding)
    upd_slot: torch.Tensor  # [u] tail rows to store after the step: slot,
    upd_row: torch.Tensor  # [u] row,
    upd_vidx: torch.Tensor  # [u] and the V row that holds it

    def to(self, device: torch.device) -> PrefillPlan:
        return PrefillPlan(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def plan_prefill(
    ratio: int, overlap: bool, tail_rows: int, starts: list[int], lens: list[int], cu: list[int], slots: list[int]
) -> PrefillPlan:
    """Index plan for chunks (start, len, token offset cu, slot) of one step. See the module docstring."""

    def tail_start(p: int) -> int:
        return max(0, ratio * (p // ratio - (1 if overlap else 0)))

    olds = [s - tail_start(s) for s in starts]
    n_old = sum(olds)
    span = (2 if overlap else 1) * ratio
    t_slot, t_row, w_slot, w_j, w_idx, u_slot, u_row, u_idx = ([] for _ in range(8))
    tail_off = 0
    for s, n, c, slot, old in zip(starts, lens, cu, slots, olds):
        base, end = s - old, s + n

        def vrow(p: torch.Tensor, base=base, old=old, tail_off=tail_off, c=c) -> torch.Tensor:
            i = p - base  # buffer position: tail rows first, then the chunk's rows
            return torch.where(i < old, tail_off + i, n_old + c + (i - old))

        old_pos = torch.arange(base, s)
        t_slot.append(torch.full_like(old_pos, slot))
        t_row.append(old_pos % tail_rows)
        j = torch.arange(s // ratio, end // ratio)
        pos = (j[:, None] + 1) * ratio - span + torch.arange(span)[None, :]
        w_slot.append(torch.full_like(j, slot))
        w_j.append(j)
        w_idx.append(torch.where(pos >= 0, vrow(pos), -1))
        keep = torch.arange(tail_start(end), end)
        u_slot.append(torch.full_like(keep, slot))
        u_row.append(keep % tail_rows)
        u_idx.append(vrow(keep))
        tail_off += old
    cat = torch.cat
    return PrefillPlan(
        cat(t_slot),
        cat(t_row),
        cat(w_slot),
        cat(w_j),
        cat(w_idx).reshape(-1, span),
        cat(u_slot),
        cat(u_row),
        cat(u_idx),
    )
