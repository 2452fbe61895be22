"""RMSNorm references (fp32 math, result in the input dtype)."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """y = weight * x / sqrt(mean(x^2) + eps) over the last dim, computed in fp32.

    x: [..., d] any float dtype; weight: [d] or None (unweighted, as V4's per-head query norm).
    Returns [..., d] in x.dtype.
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = weight.float() * y
    return y.to(x.dtype)
