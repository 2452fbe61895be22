"""Triton KV-compressor pooling (`ref/compressor.py::softmax_pool`): softmax over the slots, weighted sum.

Program (w, cb) holds window w's [slots, BLOCK_C] tiles of score and kv (slots padded to a power of two with
score -inf / kv 0) in registers: m = max over slots, e = exp(score - m), p = e / sum(e), out = sum(p * kv),
the reference's order of operations in fp32 (torch.softmax then (p * kv).sum). Each input is read once, the
output written once. Padding slots of the caller (score -inf, kv 0) get p = 0 as in the reference; a column
whose scores are all -inf gives NaN on both sides. No host sync (CUDA-graph safe); blocks from shapes only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["MAX_SLOTS", "softmax_pool_triton"]

MAX_SLOTS = 1024  # slots of one window held in registers (V4: 8 with overlap, 128)
TILE_ELEMS = 4096  # elements of one [slots, BLOCK_C] tile
# from this many windows up, at most 4 warps for every tile (a size rule, since after session 5's 14:30 run, H200,
# benchmarks/results/2026-11-30-s5r3-bench-tile_kernels-quant.json, CSA [W, 8, 512] fp32: the default tile with 4
# warps instead of 8 (`bc512_w4`) 1.06x at 1,024 windows, 1.08x at 4,096 (85.6 % of copy); 0.79x at 16 and 0.83x at
# 1, where a few programs must each move their tile fast, so small grids keep 8)
FEW_WARPS_WINDOWS = 1024
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _pool_kernel(
    kv_ptr,
    sc_ptr,
    out_ptr,
    S,
    C,
    skw,
    sks,
    skc,
    ssw,
    sss,
    ssc,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """kv, score [W, S, C] (strided) -> out [W, C] fp32 contiguous."""
    w = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    slots = tl.arange(0, BLOCK_S)  # [BS]
    cmask = cols < C
    mask = (slots < S)[:, None] & cmask[None, :]
    sc = tl.load(sc_ptr + w * ssw + slots[:, None] * sss + cols[None, :] * ssc, mask=mask, other=_NEG_INF)
    kv = tl.load(kv_ptr + w * skw + slots[:, None] * sks + cols[None, :] * skc, mask=mask, other=0.0)
    sc = sc.to(tl.float32)
    m = tl.max(sc, axis=0)  # [BC]
    e = tl.exp(sc - m[None, :])
    p = e / tl.sum(e, axis=0)[None, :]
    out = tl.sum(p * kv.to(tl.float32), axis=0)
    tl.store(out_ptr + w * C + cols, out, mask=cmask)


def _warps(bs: int, bc: int, windows: int = 1) -> int:
    """Default warps of a [bs, bc] tile over `windows` windows: one per 512 elements, at most 4 when the window has
    >= 64 slots (the slot softmax then reduces across fewer warps: H200 round 1, HCA [128 windows, 128 slots]: 4
    warps 1.10x over 8) or when there are >= FEW_WARPS_WINDOWS windows (CSA, see FEW_WARPS_WINDOWS), else at most
    8."""
    few = bs >= 64 or windows >= FEW_WARPS_WINDOWS
    return max(1, min(4 if few else 8, bs * bc // 512))


def softmax_pool_triton(
    kv: torch.Tensor,
    score: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    block_c: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """out[w, c] = sum_s softmax_s(score[w, :, c]) * kv[w, s, c], same contract as `ref.compressor.softmax_pool`.

    kv, score: [windows, slots, c], same shape, fp32/bf16/fp16 (fp32 in V4), any strides, slots <= MAX_SLOTS.
    Returns fp32 [windows, c] contiguous (into `out` when given: contiguous fp32 of that shape). No host sync.
    block_c / num_warps: benchmark configs (columns per program, a power of two >= 16; None: the default tile).
    """
    for name, t in (("kv", kv), ("score", score)):
        if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be a fp32/bf16/fp16 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be [windows, slots, c], got shape {tuple(t.shape)}")
    if kv.shape != score.shape:
        raise ValueError(f"kv and score must have the same shape, got {tuple(kv.shape)} and {tuple(score.shape)}")
    w, s, c = kv.shape
    if s > MAX_SLOTS:
        raise ValueError(f"slots must be <= {MAX_SLOTS} (held in registers), got {s}")
    check_runnable(kv, score)
    if out is None:
        out = torch.empty((w, c), dtype=torch.float32, device=kv.device)
    elif tuple(out.shape) != (w, c) or out.dtype != torch.float32 or out.device != kv.device or not out.is_contiguous():
        raise ValueError(f"out must be contiguous float32 {[w, c]} on {kv.device}, got {out.dtype} {list(out.shape)}")
    if out.numel() == 0:
        return out
    if s == 0:  # softmax over no slots: the reference's empty sum is 0
        return out.zero_()
    bs = triton.next_power_of_2(s)
    bc = block_c or max(16, min(triton.next_power_of_2(c), TILE_ELEMS // bs, 1024))
    _pool_kernel[(w, triton.cdiv(c, bc))](
        kv,
        score,
        out,
        s,
        c,
        kv.stride(0),
        kv.stride(1),
        kv.stride(2),
        score.stride(0),
        score.stride(1),
        score.stride(2),
        BLOCK_S=bs,
        BLOCK_C=bc,
        num_warps=num_warps or _warps(bs, bc, w),
    )
    return out
