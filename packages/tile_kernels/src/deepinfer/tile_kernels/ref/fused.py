"""References of the fused ops: exactly the composition of the single-op references, each rounding to the
activation dtype in between (as the engine's unfused code does)."""

from __future__ import annotations

import torch

from .act import swiglu_clamp
from .norm import rms_norm
from .quant import fp4_quant_dequant_ue8m0, fp8_quant_dequant_ue8m0, hadamard_transform, per_token_group_quant_fp8
from .rope import apply_rope_interleaved


def swiglu_clamp_fp8(
    gate: torch.Tensor, up: torch.Tensor, limit: float | None = 10.0, group_size: int = 128, scale_fmt: str = "ue8m0"
) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_group_quant_fp8(swiglu_clamp(gate, up, limit), group_size, scale_fmt): the SwiGLU output in
    gate.dtype, then quantised. gate, up [..., n] -> (q e4m3 [..., n], scales fp32 [..., n / group_size])."""
    return per_token_group_quant_fp8(swiglu_clamp(gate, up, limit), group_size, scale_fmt)


def hadamard_fp4_quant_dequant(x: torch.Tensor, scale: float | None = None, block: int = 32) -> torch.Tensor:
    """fp4_quant_dequant_ue8m0(hadamard_transform(x, scale), block): V4's indexer rotation then FP4 simulation,
    the transform rounded to x.dtype in between. x [..., n] -> x's shape and dtype."""
    return fp4_quant_dequant_ue8m0(hadamard_transform(x, scale), block)


def kv_norm_rope_quant(
    kv: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope_dim: int = 64,
    eps: float = 1e-6,
    quant_block: int | None = 64,
    out: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """V4's KV entry: y = rope(rms_norm(kv, weight, eps)) on the last rope_dim dims, then (quant_block not None)
    the FP8 quant-dequant of the other dims in blocks of quant_block; each step rounds to kv.dtype.

    kv [t, d]; weight [d]; cos/sin [t, rope_dim/2]. Without `out`: returns y [t, d] kv.dtype. With `out`
    [n, d] (a cache; any float dtype) and `rows` int [t]: out[rows[i]] = y[i] (cast to out.dtype) for rows[i] >= 0
    (negative rows are skipped; rows None means 0..t-1), returns out.
    """
    y = apply_rope_interleaved(rms_norm(kv, weight, eps), cos, sin, rope_dim)
    if quant_block is not None:
        nope = kv.shape[-1] - rope_dim
        y = torch.cat((fp8_quant_dequant_ue8m0(y[..., :nope], quant_block), y[..., nope:]), dim=-1)
    if out is None:
        return y
    idx = torch.arange(kv.shape[0], device=kv.device) if rows is None else rows.long()
    keep = idx >= 0
    out[idx[keep]] = y[keep].to(out.dtype)
    return out
