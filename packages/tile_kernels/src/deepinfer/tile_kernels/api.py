"""Public tile_kernels API: validation, then the fastest available implementation.

Every function has a reference twin in `reference.py`. Fast paths (Triton / CUDA) are selected per call by
`deepinfer.tile_kernels.backend(device)`; today every op runs the reference (fast paths: issue 3).
"""

from __future__ import annotations

import os

import torch

from . import reference as _ref
from ._validate import check_last_dim, check_same_device, check_tensor

__all__ = [
    "apply_rope_interleaved",
    "hash_route",
    "mhc_head",
    "mhc_post",
    "mhc_pre",
    "moe_route",
    "rms_norm",
    "rope_cos_sin",
    "rope_inv_freq",
    "softmax_pool",
    "swiglu_clamp",
]


def _triton_ok(x: torch.Tensor) -> bool:
    """Triton kernels run for CUDA tensors unless DEEPINFER_TILE_KERNELS_BACKEND forces the reference."""
    return x.is_cuda and os.environ.get("DEEPINFER_TILE_KERNELS_BACKEND", "auto").strip().lower() != "reference"


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim in fp32. x: [..., d]; weight: [d] or None. Returns x.dtype [..., d]."""
    check_tensor("x", x, floating=True)
    if weight is not None:
        check_tensor("weight", weight, ndim=1)
        check_last_dim("weight", weight, x.shape[-1])
        check_same_device(x=x, weight=weight)
    return _ref.rms_norm(x, weight, eps)


rope_inv_freq = _ref.rope_inv_freq
rope_cos_sin = _ref.rope_cos_sin


def apply_rope_interleaved(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int, inverse: bool = False
) -> torch.Tensor:
    """Rotate the last `rope_dim` dims of x [t, ..., d] by interleaved pairs; cos/sin [t, rope_dim/2] fp32."""
    check_tensor("x", x, floating=True)
    if rope_dim % 2 or not 0 < rope_dim <= x.shape[-1]:
        raise ValueError(f"rope_dim must be even and in (0, {x.shape[-1]}], got {rope_dim}")
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, ndim=2)
        if tuple(t.shape) != (x.shape[0], rope_dim // 2):
            raise ValueError(f"{name} must have shape {(x.shape[0], rope_dim // 2)}, got {tuple(t.shape)}")
    return _ref.apply_rope_interleaved(x, cos, sin, rope_dim, inverse)


def _check_mhc(x: torch.Tensor, fn: torch.Tensor, rows: int) -> None:
    check_tensor("x", x, ndim=3, floating=True)
    check_tensor("fn", fn, ndim=2)
    want = (rows, x.shape[1] * x.shape[2])
    if tuple(fn.shape) != want:
        raise ValueError(f"fn must have shape {want} for x of shape {tuple(x.shape)}, got {tuple(fn.shape)}")


def mhc_pre(
    x: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
    sinkhorn_iters: int = 20,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mHC pre: x [t, hc, d] -> (x_in [t, d], post [t, hc] fp32, comb [t, hc, hc] fp32). See reference."""
    hc = x.shape[1] if x.dim() == 3 else 0
    _check_mhc(x, fn, (2 + hc) * hc)
    if sinkhorn_iters < 1:
        raise ValueError(f"sinkhorn_iters must be >= 1, got {sinkhorn_iters}")
    if _triton_ok(x) and hc >= 4 and hc & (hc - 1) == 0:
        from .backends.cuda.triton_mhc import mhc_pre_triton  # imports triton: only on this path

        return mhc_pre_triton(x, fn, scale, base, rms_eps, hc_eps, sinkhorn_iters)
    return _ref.mhc_pre(x, fn, scale, base, rms_eps, hc_eps, sinkhorn_iters)


def mhc_post(f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """mHC post: f [t, d], residual [t, hc, d], post [t, hc], comb [t, hc, hc] -> [t, hc, d]."""
    check_tensor("residual", residual, ndim=3, floating=True)
    t, hc, d = residual.shape
    if tuple(f.shape) != (t, d):
        raise ValueError(f"f must have shape {(t, d)}, got {tuple(f.shape)}")
    if tuple(post.shape) != (t, hc) or tuple(comb.shape) != (t, hc, hc):
        raise ValueError(f"post/comb must be {(t, hc)}/{(t, hc, hc)}, got {tuple(post.shape)}/{tuple(comb.shape)}")
    return _ref.mhc_post(f, residual, post, comb)


def mhc_head(
    x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
) -> torch.Tensor:
    """mHC head: x [t, hc, d] -> [t, d] (sigmoid-weighted stream sum, no Sinkhorn)."""
    _check_mhc(x, fn, x.shape[1] if x.dim() == 3 else 0)
    return _ref.mhc_head(x, fn, scale, base, rms_eps, hc_eps)


def swiglu_clamp(gate: torch.Tensor, up: torch.Tensor, limit: float | None = 10.0) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit); gate, up [..., n] same shape."""
    check_tensor("gate", gate, floating=True)
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have the same shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    return _ref.swiglu_clamp(gate, up, limit)


def softmax_pool(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """Compressor pooling: kv, score [windows, slots, c] -> [windows, c] fp32 (softmax over slots)."""
    check_tensor("kv", kv, ndim=3, floating=True)
    if kv.shape != score.shape:
        raise ValueError(f"kv and score must have the same shape, got {tuple(kv.shape)} and {tuple(score.shape)}")
    return _ref.softmax_pool(kv, score)


def moe_route(
    logits: torch.Tensor, bias: torch.Tensor | None, topk: int, scoring: str = "sqrtsoftplus",
    route_scale: float = 1.0, renorm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router: logits [t, E] (+ bias [E] for selection) -> (weights [t, topk] fp32, ids [t, topk] int64)."""
    check_tensor("logits", logits, ndim=2, floating=True)
    if not 1 <= topk <= logits.shape[1]:
        raise ValueError(f"topk must be in [1, {logits.shape[1]}], got {topk}")
    return _ref.moe_route(logits, bias, topk, scoring, route_scale, renorm)


def hash_route(
    logits: torch.Tensor, token_ids: torch.Tensor, tid2eid: torch.Tensor, scoring: str = "sqrtsoftplus",
    route_scale: float = 1.0, renorm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hash routing: experts tid2eid[token_ids] ([vocab, topk] table), weights from logits [t, E]."""
    check_tensor("logits", logits, ndim=2, floating=True)
    check_tensor("tid2eid", tid2eid, ndim=2)
    if token_ids.shape != (logits.shape[0],):
        raise ValueError(f"token_ids must have shape {(logits.shape[0],)}, got {tuple(token_ids.shape)}")
    return _ref.hash_route(logits, token_ids, tid2eid, scoring, route_scale, renorm)


from .api_quant import *  # noqa: E402,F401,F403  (quantisation ops join the public API)
from .api_quant import __all__ as _quant_all  # noqa: E402

__all__ += list(_quant_all)
