"""All routed experts in two grouped GEMMs (CUDA, bf16) instead of a Python loop over experts.

FP4 experts run deep_gemm's FP4-weight grouped GEMM on the stored weights (`DEEPINFER_MOE_FP4`, default on);
other experts' weights are dequantised once into stacked bf16 tensors and run through `torch._grouped_mm` (SM90
grouped GEMM).
Token-expert pairs are sorted by expert; `offs` holds each expert's end row, so empty experts cost nothing.
"""

from __future__ import annotations

import os

import torch

from deepinfer import tile_kernels as tk

from .deterministic import combine_weighted, deterministic_enabled


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
        return _combine(x, tok, y, w)


def _combine(x: torch.Tensor, tok: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Sum each token's k weighted expert rows: fp32 [T, H]. y: [P, H] expert outputs, w: [P] fp32 routing
    weights, tok: [P] (each token k times).

    DEEPINFER_DETERMINISTIC on (default): fixed-order sum (`combine_weighted`: one sort + one moe_unpermute
    launch), the same bits every run. Off: the atomic index_add_ of the fp32 products (summation order, and so the
    low bits, vary run to run on CUDA)."""
    if deterministic_enabled():
        return combine_weighted(x.shape[0], tok, y, w)
    yw = y.float() * w[:, None]
    return torch.zeros(x.shape, dtype=torch.float32, device=x.device).index_add_(0, tok, yw)


def fp4_grouped_available(x: torch.Tensor, experts: list) -> bool:
    """The FP4-weight grouped GEMM applies: CUDA bf16 input, FP4 experts, not disabled by env."""
    return (
        x.is_cuda
        and x.dtype == torch.bfloat16
        and experts[0].w1.fmt == "fp4"
        and os.environ.get("DEEPINFER_MOE_FP4", "1") != "0"
    )


class GroupedExpertsFP4:
    """Experts kept in their stored FP4 format, stacked: w13 [E, 2I, H/2] int8 + [E, 2I, H/32] E8M0, w2 likewise.

    The per-expert weights are re-pointed at views of the stack, so the model holds one copy. Each GEMM reads
    only the packed weights of experts that got tokens (4.25 bits per weight instead of bf16's 16).
    """

    def __init__(self, experts: list) -> None:
        from deepinfer import deep_gemm

        self.gemm = deep_gemm.m_grouped_bf16_fp4_gemm_nt_contiguous
        self.w13 = torch.stack([torch.cat((e.w1.weight, e.w3.weight)) for e in experts])
        self.s13 = torch.stack([torch.cat((e.w1.scale, e.w3.scale)) for e in experts])
        self.w2 = torch.stack([e.w2.weight for e in experts])
        self.s2 = torch.stack([e.w2.scale for e in experts])
        inter = experts[0].w1.weight.shape[0]
        for i, e in enumerate(experts):  # drop the separate copies: views into the stack
            e.w1.weight, e.w3.weight = self.w13[i, :inter], self.w13[i, inter:]
            e.w1.scale, e.w3.scale = self.s13[i, :inter], self.s13[i, inter:]
            e.w2.weight, e.w2.scale = self.w2[i], self.s2[i]
            for q in (e.w1, e.w2, e.w3):
                q._cache.clear()
        self.inter, self.limit = inter, experts[0].limit

    def __call__(self, x: torch.Tensor, tok: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Same contract as `GroupedExperts.__call__`; returns fp32 [T, H]."""
        offs = torch.cumsum(counts, 0).to(torch.int32)
        h = self.gemm(x[tok].contiguous(), (self.w13, self.s13), offs)
        a = tk.swiglu_clamp(h[:, : self.inter], h[:, self.inter :], self.limit)
        y = self.gemm(a.contiguous(), (self.w2, self.s2), offs)
        return _combine(x, tok, y, w)
