"""Triton MoE router (`ref/moe.py::moe_route`): scoring, selection bias, top-k, renormalisation, scale.

One program per token holds its E logits in registers (E <= MAX_EXPERTS, padded to a power of two):
* scores in fp32: sqrtsoftplus = sqrt(softplus(x)) with torch's softplus (x for x > 20, else log1p(exp(x)),
  log1p by Kahan's log(u) * e / (u - 1), u = 1 + e, accurate where e is tiny); sigmoid = 1 / (1 + exp(-x));
  softmax = exp(x - max) / sum.
* top-k of score + bias by K rounds of "largest value, lowest id among equals" (the reference's stable
  descending sort), each round masking the winner out; K <= MAX_TOPK.
* weights = scores at the ids, divided by their sum when renorm, times route_scale (the reference's order).
Kernel and reference agree to a few fp32 ulps in the scores (exp / log / sqrt roundings), so an id can differ
from the reference's only where two candidates' selection values are that close (a near-tie). NaN logits give
unspecified (but in-range) ids. No host sync (CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["MAX_EXPERTS", "MAX_TOPK", "SCORINGS", "moe_route_triton"]

MAX_EXPERTS = 4096
MAX_TOPK = 16
SCORINGS = {"sqrtsoftplus": 0, "sigmoid": 1, "softmax": 2}
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _scores(x, emask, SCORING: tl.constexpr):
    """fp32 logits [BE] -> scores [BE] (padding lanes: anything; the caller masks them)."""
    if SCORING == 0:
        e = tl.exp(x)
        u = 1.0 + e
        lp = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))  # log1p(e)
        s = tl.sqrt(tl.where(x > 20.0, x, lp))
    elif SCORING == 1:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        xm = tl.where(emask, x, _NEG_INF)
        ex = tl.exp(xm - tl.max(xm, axis=0))
        s = ex / tl.sum(ex, axis=0)
    return s


@triton.jit
def _route_kernel(
    logits_ptr,
    bias_ptr,
    w_ptr,
    ids_ptr,
    E,
    stride_t,
    stride_e,
    stride_b,
    route_scale,
    HAS_BIAS: tl.constexpr,
    SCORING: tl.constexpr,
    RENORM: tl.constexpr,
    K: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """logits [T, E] (strided), bias [E] -> weights fp32 [T, K], ids int64 [T, K] (contiguous)."""
    tok = tl.program_id(0).to(tl.int64)
    ex = tl.arange(0, BLOCK_E)
    emask = ex < E
    x = tl.load(logits_ptr + tok * stride_t + ex * stride_e, mask=emask, other=0.0).to(tl.float32)
    s = _scores(x, emask, SCORING)
    sel = s
    if HAS_BIAS:
        sel = sel + tl.load(bias_ptr + ex * stride_b, mask=emask, other=0.0).to(tl.float32)
    sel = tl.where(emask, sel, _NEG_INF)
    kx = tl.arange(0, BLOCK_K)
    wv = tl.zeros([BLOCK_K], dtype=tl.float32)
    iv = tl.zeros([BLOCK_K], dtype=tl.int32)
    for k in tl.static_range(K):
        best = tl.max(sel, axis=0)
        idx = tl.min(tl.where(sel == best, ex, BLOCK_E), axis=0)
        idx = tl.minimum(idx, E - 1)  # NaN rows: no lane equals the max; stay in range
        wk = tl.sum(tl.where(ex == idx, s, 0.0), axis=0)
        wv = tl.where(kx == k, wk, wv)
        iv = tl.where(kx == k, idx, iv)
        sel = tl.where(ex == idx, _NEG_INF, sel)
    kmask = kx < K
    if RENORM:
        wv = wv / tl.sum(tl.where(kmask, wv, 0.0), axis=0)
    wv = wv * route_scale
    tl.store(w_ptr + tok * K + kx, wv, mask=kmask)
    tl.store(ids_ptr + tok * K + kx, iv.to(tl.int64), mask=kmask)


def moe_route_triton(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    topk: int,
    scoring: str = "sqrtsoftplus",
    route_scale: float = 1.0,
    renorm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router, same contract as `ref.moe.moe_route`: ids = top-k of score + bias (ties: lower id),
    weights = score[ids] (renormalised when `renorm`) * route_scale.

    logits: [t, E] fp32/bf16/fp16, any strides, E <= MAX_EXPERTS; bias: [E] float or None; 1 <= topk <=
    min(E, MAX_TOPK). Returns (weights fp32 [t, topk], ids int64 [t, topk]). No host sync.
    """
    if not isinstance(logits, torch.Tensor) or logits.dtype not in _DTYPES or logits.dim() != 2:
        raise TypeError(f"logits must be a 2-D fp32/bf16/fp16 tensor, got {getattr(logits, 'dtype', logits)}")
    t, e = logits.shape
    if not 1 <= e <= MAX_EXPERTS:
        raise ValueError(f"logits' expert dim must be in [1, {MAX_EXPERTS}], got {e}")
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= min(e, MAX_TOPK):
        raise ValueError(f"topk must be an int in [1, {min(e, MAX_TOPK)}], got {topk!r}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be 'sqrtsoftplus', 'sigmoid' or 'softmax', got {scoring!r}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dtype not in _DTYPES or tuple(bias.shape) != (e,):
            raise ValueError(f"bias must be a float tensor of shape {(e,)} or None, got {getattr(bias, 'shape', bias)}")
        check_runnable(logits, bias)
    else:
        check_runnable(logits)
    weights = torch.empty((t, topk), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, topk), dtype=torch.int64, device=logits.device)
    if t == 0:
        return weights, ids
    be = max(16, triton.next_power_of_2(e))
    _route_kernel[(t,)](
        logits,
        bias if bias is not None else logits,
        weights,
        ids,
        e,
        logits.stride(0),
        logits.stride(1),
        bias.stride(0) if bias is not None else 0,
        float(route_scale),
        HAS_BIAS=bias is not None,
        SCORING=SCORINGS[scoring],
        RENORM=bool(renorm),
        K=topk,
        BLOCK_E=be,
        BLOCK_K=max(2, triton.next_power_of_2(topk)),
        num_warps=max(1, min(8, be // 256)),
    )
    return weights, ids
