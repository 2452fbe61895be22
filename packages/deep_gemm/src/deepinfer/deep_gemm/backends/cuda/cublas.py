"""cuBLAS path for the bf16 GEMMs on CUDA (bf16 operands, fp32 accumulation inside cuBLAS, bf16 out).

The reference upcasts both operands to fp32 on every call, which on a GPU moves each weight three times
(read bf16, write fp32, read fp32) and runs an fp32 GEMM. This path reads each operand once. It is the
baseline fast path until the Triton / CUDA kernels of issue 6 land.
"""

from __future__ import annotations

import torch


def applies(a: torch.Tensor, out: torch.Tensor, c: torch.Tensor | None) -> bool:
    """True for CUDA bf16 operands with a bf16 output and no accumulator input."""
    return a.is_cuda and a.dtype == torch.bfloat16 and out.dtype == torch.bfloat16 and c is None


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [m, n] = a [m, k] @ b [n, k]^T."""
    return torch.mm(a, b.t(), out=out)


def grouped_gemm_nt_bf16(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [t, g, n] = a [t, g, k] @ b [g, n, k]^T per group, as one batched GEMM over g."""
    out.copy_(torch.bmm(a.transpose(0, 1), b.transpose(1, 2)).transpose(0, 1))
    return out
