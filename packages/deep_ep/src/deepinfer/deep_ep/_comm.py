"""Transport of the reference: one all-to-all of byte rows, over torch.distributed or within one process.

Every payload (bf16 / fp8 values, scales, int64 indices, fp32 weights) travels as rows of uint8 bytes:
gloo has no float8 types, and one byte-typed exchange per step keeps all fields of a token together.
`torch.distributed.all_to_all_single` with uneven splits works on gloo (CPU) and NCCL (CUDA); the
tensors must be on the device the group's backend serves.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


class Comm:
    """Rank, world size and all-to-all of one process group (None = a single process, world size 1)."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        if group is None:
            self.rank, self.world_size = 0, 1
        else:
            self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)

    def exchange_counts(self, send_counts: Sequence[int], device: torch.device) -> list[int]:
        """Tell every rank how many rows it gets from us; return how many we get from each rank."""
        if self.world_size == 1:
            return list(send_counts)
        send = torch.tensor(list(send_counts), dtype=torch.int64, device=device)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        return recv.tolist()

    def exchange_rows(self, rows: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]) -> torch.Tensor:
        """All-to-all of rows: rows [sum(send_counts), W] uint8, grouped by destination rank in rank order.

        Returns uint8 [sum(recv_counts), W], grouped by source rank in rank order (each group keeps the
        sender's row order).
        """
        if self.world_size == 1:
            return rows
        out = torch.empty((sum(recv_counts), rows.shape[1]), dtype=rows.dtype, device=rows.device)
        dist.all_to_all_single(out, rows, list(recv_counts), list(send_counts), group=self.group)
        return out


def pack_rows(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate per-row fields as bytes: each part [n, ...] of any dtype -> uint8 [n, total_bytes]."""
    n = parts[0].shape[0]
    if n == 0:  # empty tensors may carry strides that forbid a dtype view; no bytes to move anyway
        width = sum(p.dtype.itemsize * _numel(tuple(p.shape[1:])) for p in parts)
        return torch.empty((0, width), dtype=torch.uint8, device=parts[0].device)
    as_bytes = [p.contiguous().reshape(n, _numel(tuple(p.shape[1:]))).view(torch.uint8) for p in parts]
    return torch.cat(as_bytes, dim=1)


def unpack_rows(rows: torch.Tensor, like: Sequence[tuple[torch.dtype, tuple[int, ...]]]) -> list[torch.Tensor]:
    """Inverse of `pack_rows`: rows uint8 [n, W] and (dtype, per-row shape) of each field -> the fields [n, *shape]."""
    n, out, col = rows.shape[0], [], 0
    for dtype, shape in like:
        width = dtype.itemsize * _numel(shape)
        if n == 0:
            out.append(torch.empty((0, *shape), dtype=dtype, device=rows.device))
        else:
            out.append(rows[:, col : col + width].contiguous().view(dtype).reshape(n, *shape))
        col += width
    if col != rows.shape[1]:
        raise ValueError(f"rows: expected {col} bytes a row for the given fields, got {rows.shape[1]}")
    return out


def _numel(shape: tuple[int, ...]) -> int:
    size = 1
    for s in shape:
        size *= s
    return size
