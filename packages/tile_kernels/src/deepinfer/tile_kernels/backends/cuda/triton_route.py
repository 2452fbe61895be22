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

`hash_route_triton` (`ref/moe.py::hash_route`): ids = tid2eid[token_ids] (exact), weights = scores at those ids
(renormalised, scaled). BLOCK_T tokens per program; sqrtsoftplus / sigmoid are elementwise, so only the topk
gathered logits of a token are read (~topk 32-byte sectors instead of the E-wide row); softmax reads the row.
Token ids are not bounds-checked on CUDA (a check would need a host sync): ids outside the table read garbage.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["MAX_EXPERTS", "MAX_TOPK", "SCORINGS", "hash_route_triton", "moe_route_triton"]

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


@triton.jit
def _route_rows_kernel(
    logits_ptr,
    bias_ptr,
    w_ptr,
    ids_ptr,
    T,
    E,
    stride_t,
    stride_e,
    stride_b,
    route_scale,
    HAS_BIAS: tl.constexpr,
    SCORING: tl.constexpr,
    RENORM: tl.constexpr,
    K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """`_route_kernel` for BLOCK_T tokens per program ([BLOCK_T, BLOCK_E] tiles, reductions along the experts):
    fewer, fuller programs. Same per-row math; the ids equal the one-token kernel's, the weights up to the
    order of the (renorm / softmax) sums."""
    tok = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tok < T
    ex = tl.arange(0, BLOCK_E)
    emask = ex < E
    m2 = tmask[:, None] & emask[None, :]
    x = tl.load(logits_ptr + tok[:, None] * stride_t + ex[None, :] * stride_e, mask=m2, other=0.0).to(tl.float32)
    if SCORING == 0:
        e = tl.exp(x)
        u = 1.0 + e
        lp = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))
        s = tl.sqrt(tl.where(x > 20.0, x, lp))
    elif SCORING == 1:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        xm = tl.where(emask[None, :], x, _NEG_INF)
        exm = tl.exp(xm - tl.max(xm, axis=1)[:, None])
        s = exm / tl.sum(exm, axis=1)[:, None]
    sel = s
    if HAS_BIAS:
        sel = sel + tl.load(bias_ptr + ex * stride_b, mask=emask, other=0.0).to(tl.float32)[None, :]
    sel = tl.where(emask[None, :], sel, _NEG_INF)
    kx = tl.arange(0, BLOCK_K)[None, :]
    wv = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    iv = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)
    for k in tl.static_range(K):
        best = tl.max(sel, axis=1)
        idx = tl.min(tl.where(sel == best[:, None], ex[None, :], BLOCK_E), axis=1)
        idx = tl.minimum(idx, E - 1)  # NaN rows: no lane equals the max; stay in range
        hit = ex[None, :] == idx[:, None]
        wk = tl.sum(tl.where(hit, s, 0.0), axis=1)
        wv = tl.where(kx == k, wk[:, None], wv)
        iv = tl.where(kx == k, idx[:, None], iv)
        sel = tl.where(hit, _NEG_INF, sel)
    kmask = kx < K
    if RENORM:
        wv = wv / tl.sum(tl.where(kmask, wv, 0.0), axis=1)[:, None]
    wv = wv * route_scale
    om = tmask[:, None] & kmask
    tl.store(w_ptr + tok[:, None] * K + kx, wv, mask=om)
    tl.store(ids_ptr + tok[:, None] * K + kx, iv.to(tl.int64), mask=om)


def moe_route_triton(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    topk: int,
    scoring: str = "sqrtsoftplus",
    route_scale: float = 1.0,
    renorm: bool = True,
    block_t: int = 1,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router, same contract as `ref.moe.moe_route`: ids = top-k of score + bias (ties: lower id),
    weights = score[ids] (renormalised when `renorm`) * route_scale.

    logits: [t, E] fp32/bf16/fp16, any strides, E <= MAX_EXPERTS; bias: [E] float or None; 1 <= topk <=
    min(E, MAX_TOPK). Returns (weights fp32 [t, topk], ids int64 [t, topk]). No host sync.
    block_t / num_warps (benchmark configs): tokens per program (1: `_route_kernel`, the default; a power of two
    > 1: `_route_rows_kernel`) and warps (None: by E and block_t).
    """
    if block_t < 1 or block_t & (block_t - 1):
        raise ValueError(f"block_t must be a power of two >= 1, got {block_t}")
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
    if block_t > 1:
        _route_rows_kernel[(triton.cdiv(t, block_t),)](
            logits, bias if bias is not None else logits, weights, ids, t, e, logits.stride(0), logits.stride(1),
            bias.stride(0) if bias is not None else 0, float(route_scale), HAS_BIAS=bias is not None,
            SCORING=SCORINGS[scoring], RENORM=bool(renorm), K=topk, BLOCK_T=block_t, BLOCK_E=be,
            BLOCK_K=max(2, triton.next_power_of_2(topk)), num_warps=num_warps or max(1, min(8, block_t * be // 1024)),
        )  # fmt: skip
        return weights, ids
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
        num_warps=num_warps or max(1, min(8, be // 256)),
    )
    return weights, ids


@triton.jit
def _hash_route_kernel(
    logits_ptr,
    tok_ptr,
    tab_ptr,
    w_ptr,
    ids_ptr,
    T,
    E,
    stride_t,
    stride_e,
    stride_tok,
    stride_v,
    stride_k,
    route_scale,
    SCORING: tl.constexpr,
    RENORM: tl.constexpr,
    K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """token ids [T], table [vocab, K], logits [T, E] (all strided) -> weights fp32 [T, K], ids int64 [T, K]."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < T
    kx = tl.arange(0, BLOCK_K)
    m2 = tmask[:, None] & (kx < K)[None, :]
    tid = tl.load(tok_ptr + t * stride_tok, mask=tmask, other=0).to(tl.int64)
    ids = tl.load(tab_ptr + tid[:, None] * stride_v + kx[None, :] * stride_k, mask=m2, other=0).to(tl.int64)
    row = logits_ptr + t[:, None] * stride_t
    x = tl.load(row + ids * stride_e, mask=m2, other=0.0).to(tl.float32)  # [BT, BK] gathered logits
    if SCORING == 0:
        e = tl.exp(x)
        u = 1.0 + e
        lp = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))  # log1p(e), as `_scores`
        s = tl.sqrt(tl.where(x > 20.0, x, lp))
    elif SCORING == 1:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:  # softmax needs the whole row's max and sum
        ex = tl.arange(0, BLOCK_E)
        fm = tmask[:, None] & (ex < E)[None, :]
        xr = tl.load(row + ex[None, :] * stride_e, mask=fm, other=_NEG_INF).to(tl.float32)
        mx = tl.max(xr, axis=1)
        mx = tl.where(tmask, mx, 0.0)
        den = tl.where(tmask, tl.sum(tl.exp(xr - mx[:, None]), axis=1), 1.0)  # padding rows: no 0 / 0
        s = tl.exp(x - mx[:, None]) / den[:, None]
    s = tl.where(m2, s, 0.0)
    if RENORM:
        s = s / tl.where(tmask, tl.sum(s, axis=1), 1.0)[:, None]
    s = s * route_scale
    out = t[:, None] * K + kx[None, :]
    tl.store(w_ptr + out, s, mask=m2)
    tl.store(ids_ptr + out, ids, mask=m2)


_INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.uint8, torch.int8)


def hash_route_triton(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    tid2eid: torch.Tensor,
    scoring: str = "sqrtsoftplus",
    route_scale: float = 1.0,
    renorm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hash routing, same contract as `ref.moe.hash_route`: ids = tid2eid[token_ids], weights = score[ids]
    (renormalised when `renorm`) * route_scale.

    logits: [t, E] fp32/bf16/fp16, any strides, E <= MAX_EXPERTS; token_ids: [t] int (in [0, vocab): unchecked);
    tid2eid: [vocab, topk] int, topk <= MAX_TOPK, entries in [0, E) (unchecked). Returns (weights fp32 [t, topk],
    ids int64 [t, topk]). No host sync.
    """
    if not isinstance(logits, torch.Tensor) or logits.dtype not in _DTYPES or logits.dim() != 2:
        raise TypeError(f"logits must be a 2-D fp32/bf16/fp16 tensor, got {getattr(logits, 'dtype', logits)}")
    t, e = logits.shape
    if not 1 <= e <= MAX_EXPERTS:
        raise ValueError(f"logits' expert dim must be in [1, {MAX_EXPERTS}], got {e}")
    if not isinstance(token_ids, torch.Tensor) or token_ids.dtype not in _INT_DTYPES or token_ids.shape != (t,):
        raise ValueError(
            f"token_ids must be an int tensor of shape {(t,)}, got {getattr(token_ids, 'shape', token_ids)}"
        )
    if not isinstance(tid2eid, torch.Tensor) or tid2eid.dtype not in _INT_DTYPES or tid2eid.dim() != 2:
        raise ValueError(f"tid2eid must be a 2-D int tensor [vocab, topk], got {getattr(tid2eid, 'shape', tid2eid)}")
    topk = tid2eid.shape[1]
    if not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"tid2eid's topk dim must be in [1, {MAX_TOPK}], got {topk}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be 'sqrtsoftplus', 'sigmoid' or 'softmax', got {scoring!r}")
    check_runnable(logits, token_ids, tid2eid)
    weights = torch.empty((t, topk), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, topk), dtype=torch.int64, device=logits.device)
    if t == 0:
        return weights, ids
    softmax = scoring == "softmax"
    be = max(16, triton.next_power_of_2(e)) if softmax else 16
    bt = max(1, min(64 if not softmax else 4096 // be, triton.next_power_of_2(t)))
    _hash_route_kernel[(triton.cdiv(t, bt),)](
        logits,
        token_ids,
        tid2eid,
        weights,
        ids,
        t,
        e,
        logits.stride(0),
        logits.stride(1),
        token_ids.stride(0),
        tid2eid.stride(0),
        tid2eid.stride(1),
        float(route_scale),
        SCORING=SCORINGS[scoring],
        RENORM=bool(renorm),
        K=topk,
        BLOCK_T=bt,
        BLOCK_K=max(2, triton.next_power_of_2(topk)),
        BLOCK_E=be,
        num_warps=4,
    )
    return weights, ids
