"""All routed experts in two grouped GEMMs (CUDA, bf16) instead of a Python loop over experts.

Interim fast path until deep_gemm's FP8/FP4 grouped kernels land (issue 6): the experts' weights are
dequantised once into stacked bf16 tensors and run through `torch._grouped_mm` (SM90 grouped GEMM).
Token-expert pairs are sorted by expert; `offs` holds each expert's end row, so empty experts cost nothing.
"""

from __future__ import annotations

import os

import torch

from deepinfer import tile_kernels as tk


def grouped_available(x: torch.Tensor) -> bool:
    """True when the grouped path applies: CUDA bf16 input, torch has _grouped_mm, not disabled by env."""
    return (
        x.is_cuda
        and x.dtype == torch.bfloat16
        and hasattr(torch, "_grouped_mm")
        and os.environ.get("DEEPINFER_MOE_GROUPED", "1") != "0"
    )


class GroupedExperts:
    """Stacked expert weights: w13 [E, 2I, H] (w1 rows then w3 rows) and w2 [E, H, I], bf16."""

    def __init__(self, experts: list, dtype: torch.dtype) -> None:
        w13, w2 = [], []
        for e in experts:
            w13.append(torch.cat((e.w1.dequant(dtype), e.w3.dequant(dtype))))
            w2.append(e.w2.dequant(dtype))
            for q in (e.w1, e.w2, e.w3):  # the stacked copy replaces the per-expert caches
                q._cache.clear()
        self.w13, self.w2 = torch.stack(w13), torch.stack(w2)
        self.inter = self.w2.shape[-1]
        self.limit = experts[0].limit

    def __call__(self, x: torch.Tensor, tok: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x: [T, H]; tok: [P] token of each expert-sorted pair; w: [P] fp32 weights; counts: [E] pairs per expert.

        Returns sum over pairs of w * expert(x[tok]) as fp32 [T, H].
        """
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xs = x[tok]
        h = torch._grouped_mm(xs, self.w13.transpose(-2, -1), offs=offs)
        a = tk.swiglu_clamp(h[:, : self.inter], h[:, self.inter :], self.limit)
        y = torch._grouped_mm(a.contiguous(), self.w2.transpose(-2, -1), offs=offs)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        out.index_add_(0, tok, y.float() * w[:, None])
        return out
