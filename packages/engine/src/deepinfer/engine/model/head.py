"""The fp32 LM head over a bf16 weight, on tensor cores.

V4 computes `logits = h @ W^T` in fp32 (h: the final-normed hidden state, fp32; W: `head.weight`, BF16 in the
checkpoint). Upcasting W to fp32 doubles the bytes read (2.1 GB for 129,280 x 4096) and forces a SIMT fp32
GEMM (on an H200: 1.4 ms at batch 32, 5.4 ms at batch 256). Instead h is split exactly into three bf16 terms,
h = h1 + h2 + h3 (each the bf16 rounding of what the previous ones left: 3 x 8 significant bits cover fp32's
24), and the three [n, d] blocks go through ONE bf16 GEMM of 3n rows with fp32 output. Every product
h_i[k] * W[v, k] of two bf16 numbers is exact in fp32 and the tensor cores accumulate in fp32, so the result is
an fp32 GEMM of the same operands up to the order of the additions.
"""

from __future__ import annotations

import torch

_MM_OUT_DTYPE: bool | None = None  # whether torch.mm(..., out_dtype=float32) works for bf16 on this build


def split_bf16x3(h: torch.Tensor) -> torch.Tensor:
    """fp32 [n, d] -> bf16 [3, n, d] with h == sum of the three (in fp32, exactly, for normal-range values)."""
    if h.dtype != torch.float32:
        raise TypeError(f"h must be float32, got {h.dtype}")
    h1 = h.to(torch.bfloat16)
    r = h - h1.float()  # exact: the rounding error of a round-to-nearest is representable
    h2 = r.to(torch.bfloat16)
    h3 = (r - h2.float()).to(torch.bfloat16)  # at most 8 significant bits remain: exact
    return torch.stack((h1, h2, h3))


def mm_fp32_out(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """a @ b for bf16 CUDA operands with an fp32 result, or None when this torch build cannot do it."""
    global _MM_OUT_DTYPE
    if _MM_OUT_DTYPE is False:
        return None
    try:
        out = torch.mm(a, b, out_dtype=torch.float32)
    except (TypeError, RuntimeError, NotImplementedError):
        _MM_OUT_DTYPE = False
        return None
    _MM_OUT_DTYPE = True
    return out


def head_logits_bf16w(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """fp32 logits [n, V] = h [n, d] fp32 @ w [V, d] bf16 ^T via the exact 3-way split; None if unsupported.

    Only on CUDA (the fp32-output bf16 GEMM is a CUDA kernel); the caller falls back to an fp32 GEMM.
    """
    if h.device.type != "cuda" or w.dtype != torch.bfloat16 or h.dim() != 2:
        return None
    n = h.shape[0]
    parts = split_bf16x3(h.float()).reshape(3 * n, h.shape[1])
    y = mm_fp32_out(parts, w.t())
    if y is None:
        return None
    return (y[:n] + y[n : 2 * n]) + y[2 * n :]
