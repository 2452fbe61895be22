"""Decode scheduling metadata: computed once per batch shape, reused by every layer's decode call."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_DECODE_S_Q = 8  # query tokens per request in one decode call (1 + speculative drafts)


@dataclass(frozen=True)
class DecodeMetadata:
    """Shapes a decode schedule was built for (plus, for fast paths, the schedule itself).

    The reference needs no schedule; it only checks that the call matches these shapes. Fast paths may
    add device tensors (split plans) here; those are computed from shapes alone, never from tensor values.
    """

    batch_size: int
    s_q: int
    num_heads: int
    topk: int
    extra_topk: int
    device: torch.device | None

    def check(self, q: torch.Tensor, indices: torch.Tensor, extra_indices: torch.Tensor | None) -> None:
        """Raise ValueError when a decode call's shapes differ from the ones this metadata was built for."""
        b, s_q, h, _ = q.shape
        got = (b, s_q, h, indices.shape[-1], 0 if extra_indices is None else extra_indices.shape[-1])
        want = (self.batch_size, self.s_q, self.num_heads, self.topk, self.extra_topk)
        if got != want:
            raise ValueError(
                "metadata was built for (batch_size, s_q, num_heads, topk, extra_topk)="
                f"{want}, got {got} from q / indices / extra_indices"
            )
