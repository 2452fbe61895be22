"""Interleaved-pair (GPT-J style) rotary embedding references for V4, plain and YaRN tables."""

from __future__ import annotations

import math

import torch


def rope_inv_freq(
    rope_dim: int,
    theta: float,
    yarn_factor: float | None = None,
    yarn_original_max_pos: int | None = None,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> torch.Tensor:
    """Inverse frequencies [rope_dim / 2] fp32. With `yarn_factor`, YaRN-blend them (no mscale in V4).

    Pair k rotates by position * inv_freq[k]. YaRN keeps high-frequency pairs (few rotations over the
    original context) as they are and divides low-frequency pairs by the factor, with a linear ramp between
    the pair indices where beta_fast and beta_slow rotations fit into the original context.
    """
    idx = torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim
    pos_freqs = theta**idx
    inv_freq = 1.0 / pos_freqs
    if yarn_factor is None:
        return inv_freq
    orig = float(yarn_original_max_pos)

    def corr_dim(rotations: float) -> float:
        return rope_dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp  # 1 = extrapolate (keep the original frequency)
    return (1.0 / (yarn_factor * pos_freqs)) * (1 - keep) + inv_freq * keep


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [t, rope_dim / 2] fp32 for integer positions [t]."""
    ang = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device)[None, :]
    return torch.cos(ang), torch.sin(ang)


def apply_rope_interleaved(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int, inverse: bool = False
) -> torch.Tensor:
    """Rotate the last `rope_dim` dims of x as consecutive pairs (2k, 2k+1); the other dims pass through.

    x: [t, ..., d]; cos/sin: [t, rope_dim/2] (broadcast over the middle dims). `inverse` rotates by -angle
    (V4 applies it to the attention output). Math in fp32, result in x.dtype, a new tensor.
    """
    t = x.shape[0]
    mid = x.dim() - 2
    c = cos.reshape(t, *([1] * mid), -1)
    s = sin.reshape(t, *([1] * mid), -1)
    if inverse:
        s = -s
    rot = x[..., -rope_dim:].float().unflatten(-1, (rope_dim // 2, 2))
    a, b = rot[..., 0], rot[..., 1]
    out_rot = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rope_dim], out_rot.to(x.dtype)), dim=-1)
