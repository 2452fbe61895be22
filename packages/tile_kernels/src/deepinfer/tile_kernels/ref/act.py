"""SwiGLU with V4's clamp."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu_clamp(gate: torch.Tensor, up: torch.Tensor, limit: float | None = 10.0) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit), in fp32, result in gate.dtype. limit None: no clamp.

    gate, up: [..., n] same shape.
    """
    g, u = gate.float(), up.float()
    if limit is not None:
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
    return (F.silu(g) * u).to(gate.dtype)
