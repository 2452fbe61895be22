"""KV compressor pooling reference: softmax-gated pooling over the slots of each window."""

from __future__ import annotations

import torch


def softmax_pool(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """out[w, c] = sum_s softmax_s(score[w, :, c]) * kv[w, s, c].

    kv, score: [windows, slots, c] fp32 (padding slots carry score -inf and kv 0). Returns [windows, c] fp32.
    """
    p = torch.softmax(score.float(), dim=1)
    return (p * kv.float()).sum(dim=1)
