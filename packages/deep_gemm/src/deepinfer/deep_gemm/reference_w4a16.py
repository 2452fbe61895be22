"""PyTorch reference of the bf16-activation x FP4-weight M-grouped GEMM (contiguous layout, `offs` group ends).

Dequantises each non-empty group's weight to float32 (`dequant.dequant_fp4_weight`), multiplies its rows in
float32 (bf16 x e2m1*2^e products are exact in float32) and rounds once to bf16. Used by tests, benchmarks and
as the CPU fallback of `api_w4a16.m_grouped_bf16_fp4_gemm_nt_contiguous`.
"""

from __future__ import annotations

import torch

from .dequant import dequant_fp4_weight

__all__ = ["m_grouped_bf16_fp4_gemm_nt_contiguous", "group_bounds"]


def group_bounds(offs: torch.Tensor, m: int) -> list[tuple[int, int]]:
    """[(start, end)] row range of each group from int32 offs [g] (cumulative ends); reads offs on the host.

    Raises ValueError unless 0 <= offs[0] <= offs[1] <= ... <= offs[g-1] <= m.
    """
    ends = [int(e) for e in offs.tolist()]
    bounds, start = [], 0
    for i, end in enumerate(ends):
        if end < start:
            where = "offs[0] is negative" if i == 0 else f"offs[{i}]={end} < offs[{i - 1}]={start}"
            raise ValueError(f"offs: expected non-decreasing cumulative group ends >= 0, but {where}")
        bounds.append((start, end))
        start = end
    if start > m:
        raise ValueError(f"offs: the last group ends at row {start}, past a's {m} rows")
    return bounds


def m_grouped_bf16_fp4_gemm_nt_contiguous(
    a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """out[r] = a[r] @ dequant(packed[i], scales[i])^T for the rows r of group i; rows past offs[-1] untouched.

    a: bf16 [m, k]; packed: int8 or uint8 [g, n, k/2] (low nibble = element 2j); scales: float8_e8m0fnu or
    uint8 (raw E8M0 byte, value 2^(byte-127)) [g, n, k/32]; offs: int32 [g] cumulative group ends;
    out: bf16 [m, n]. Returns out. offs is validated (see `group_bounds`) before anything is written.
    """
    bounds = group_bounds(offs, a.shape[0])
    sf = scales.view(torch.float8_e8m0fnu) if scales.dtype == torch.uint8 else scales
    for i, (start, end) in enumerate(bounds):
        if end > start:
            w = dequant_fp4_weight(packed[i], sf[i])  # float32 [n, k]
            out[start:end] = (a[start:end].to(torch.float32) @ w.T).to(out.dtype)
    return out
