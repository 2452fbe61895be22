"""mHC (manifold-constrained hyper-connections) references: pre, post, head. All math in fp32."""

from __future__ import annotations

import torch


def _mix_logits(x: torch.Tensor, fn: torch.Tensor, rms_eps: float) -> torch.Tensor:
    """(flatten(x) @ fn^T) * rsqrt(mean(flatten(x)^2) + eps): x [t, hc, d], fn [m, hc*d] -> [t, m] fp32."""
    v = x.flatten(1).float()
    r = torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + rms_eps)
    return (v @ fn.float().t()) * r


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Doubly-stochastic projection of exp(logits) [..., n, n]: softmax rows, then alternate col/row sums."""
    m = torch.softmax(logits, dim=-1) + eps
    m = m / (m.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(dim=-1, keepdim=True) + eps)
        m = m / (m.sum(dim=-2, keepdim=True) + eps)
    return m


def mhc_pre(
    x: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
    sinkhorn_iters: int = 20,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mix the hc residual streams into one layer input.

    x: [t, hc, d] residual streams; fn: [(2 + hc) * hc, hc * d] fp32; scale: [3]; base: [(2 + hc) * hc].
    Returns x_in [t, d] (x.dtype), post [t, hc] fp32, comb [t, hc, hc] fp32 (comb[i][j]: stream i -> j).
    """
    hc = x.shape[1]
    m = _mix_logits(x, fn, rms_eps)
    scale, base = scale.float(), base.float()
    pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * torch.sigmoid(m[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    comb_logits = (m[:, 2 * hc :] * scale[2] + base[2 * hc :]).view(-1, hc, hc)
    comb = sinkhorn(comb_logits, sinkhorn_iters, hc_eps)
    x_in = torch.einsum("ti,tid->td", pre, x.float())
    return x_in.to(x.dtype), post, comb


def mhc_post(f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """new[:, j] = post[:, j] * f + sum_i comb[:, i, j] * residual[:, i].

    f: [t, d] sublayer output; residual: [t, hc, d]; post: [t, hc]; comb: [t, hc, hc]. Returns [t, hc, d]
    in residual.dtype.
    """
    mixed = torch.einsum("tij,tid->tjd", comb, residual.float())
    return (mixed + post[:, :, None] * f.float()[:, None, :]).to(residual.dtype)


def mhc_head_weights(
    x: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
) -> torch.Tensor:
    """The head's stream weights: x [t, hc, d], fn [hc, hc*d], scale [1], base [hc] -> fp32 [t, hc]."""
    m = _mix_logits(x, fn, rms_eps)
    return torch.sigmoid(m * scale.float()[0] + base.float()) + hc_eps


def mhc_head(
    x: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
) -> torch.Tensor:
    """Collapse the streams for the output head: x [t, hc, d], fn [hc, hc*d], scale [1], base [hc] -> [t, d]."""
    pre = mhc_head_weights(x, fn, scale, base, rms_eps, hc_eps)
    return torch.einsum("ti,tid->td", pre, x.float()).to(x.dtype)
