"""PyTorch reference of the FP8-activation x FP4-weight M-grouped GEMM (contiguous layout, `offs` group ends).

Dequantises the activations (e4m3 x fp32 per-128 scales) and each non-empty group's weight (e2m1 x E8M0 per-32
scales) to float32, multiplies in float32 and rounds once to bf16. Used by tests, benchmarks and as the CPU
fallback of `api_w4a8.m_grouped_fp8_fp4_gemm_nt_offsets`.
"""

from __future__ import annotations

import torch

from .dequant import dequant_fp4_weight, dequant_fp8_act
from .reference_w4a16 import group_bounds

__all__ = ["m_grouped_fp8_fp4_gemm_nt_offsets"]


def m_grouped_fp8_fp4_gemm_nt_offsets(
    a: torch.Tensor, sfa: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """out[r] = dequant(a[r], sfa[r]) @ dequant(packed[i], scales[i])^T for the rows r of group i.

    a: float8_e4m3fn [m, k]; sfa: float32 [m, k/128]; packed: int8/uint8 [g, n, k/2] (low nibble = element 2j);
    scales: float8_e8m0fnu or uint8 (raw E8M0 byte) [g, n, k/32]; offs: int32 [g] cumulative group ends;
    out: bf16 [m, n]. Rows past offs[-1] are untouched. offs is validated (`group_bounds`) before any write.
    """
    bounds = group_bounds(offs, a.shape[0])
    sf = scales.view(torch.float8_e8m0fnu) if scales.dtype == torch.uint8 else scales
    for i, (start, end) in enumerate(bounds):
        if end > start:
            x = dequant_fp8_act(a[start:end], sfa[start:end])  # float32 [rows, k]
            w = dequant_fp4_weight(packed[i], sf[i])  # float32 [n, k]
            out[start:end] = (x @ w.T).to(out.dtype)
    return out
