"""Split-row top-k for a few long rows: each row is cut into S segments so that b * S programs fill the GPU.

With one program per row (v1-v3), b = 1 uses one SM of 132. Here:

1. stage 1, grid (b, S): segment s of row r (columns [s * seg, (s + 1) * seg) of the row's valid range) selects
   its own min(k, segment length) best columns with v3's row selection and writes their ids into a candidate
   row at offset s * min(k, seg); segments are full up to the last non-empty one, so row r's candidates are
   contiguous: count[r] = (len // seg) * min(k, seg) + min(k, len % seg).
2. stage 2: the candidates' values are gathered (count * itemsize bytes, small next to the row) and v3 selects
   min(k, len) of them; the ids map back through the candidate row.

Exactness: an entry in the row's top k is in its segment's top k (fewer than k entries of the segment outrank
it), so the union of the candidates holds the answer. Ties: candidates are in segment order, and inside one
segment entries with equal keys are written in column order by every v3 / v2 path (the fast path and the
single-pass picks write in column order; v2's fp32 bucket path writes the entries above the bucket first, but
those never equal a bucket entry), so "lowest candidate position" is "lowest column" among equal keys, which
is the rule stage 2 applies. Costs: the row is read once by stage 1; stage 2 reads S * k candidates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_filter import BLOCK as _BLOCK
from .triton_filter import CHUNK, SBLOCK, _v3_row, default_cap, default_sample, topk_triton_v3
from .triton_topk import _INF_BITS, _SCORE_DTYPES

__all__ = ["topk_triton_split", "choose_segments"]

NUM_WARPS = 8


def choose_segments(b: int, n: int, k: int, num_sms: int) -> int:
    """Segments per row: enough programs for ~2 per SM, each segment >= max(4k, 4,096) columns (so the
    candidates are at most a quarter of the row). 1 means: do not split."""
    if b * 2 >= num_sms or n < 16384:
        return 1
    return max(1, min(triton.cdiv(2 * num_sms, b), n // max(4 * k, 4096)))


@triton.jit(do_not_specialize=["n", "k", "cap", "seg", "ccap"])
def _segment_kernel(
    scores_ptr, lengths_ptr, cand_ptr, skey_ptr, scol_ptr,
    n, k, cap, seg, ccap, stride_b, stride_n,
    HAS_LENGTHS: tl.constexpr, BLOCK: tl.constexpr, SBLOCK: tl.constexpr, SAMPLE: tl.constexpr,
    CHUNK: tl.constexpr, IS_16BIT: tl.constexpr, INF_BITS: tl.constexpr,
):  # fmt: skip
    """Grid (b, S). cand int32 [b, ccap]: segment s writes its picks (row column ids) at s * min(k, seg)."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    length = n
    if HAS_LENGTHS:
        length = tl.minimum(tl.maximum(tl.load(lengths_ptr + row), 0), n)
    start = s * seg
    seg_len = tl.minimum(tl.maximum(length - start, 0), seg)
    kk = tl.minimum(seg_len, k)
    out_seg = cand_ptr + row * ccap + s * tl.minimum(seg, k)
    pid = row * tl.num_programs(1) + s
    _v3_row(
        scores_ptr + row * stride_b + start.to(tl.int64) * stride_n, stride_n, seg_len, kk, start, out_seg, 1, kk,
        skey_ptr + pid * cap, scol_ptr + pid * cap, cap, BLOCK, SBLOCK, SAMPLE, CHUNK, IS_16BIT, INF_BITS,
    )  # fmt: skip


def topk_triton_split(
    scores: torch.Tensor,
    k: int,
    segments: int,
    *,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    block: int = _BLOCK,
    cap: int | None = None,
    sample: int | None = None,
) -> torch.Tensor:
    """Exact row-wise top-k indices (unsorted, -1 padded) of scores [b, n] with each row cut into `segments`.

    Same contract as `topk_triton_v3` without the ragged form (lengths only). block / cap / sample are the
    segment selections' (tests shrink them); stage 2 uses v3's defaults. Never syncs with the host.
    """
    assert scores.dim() == 2 and scores.dtype in _SCORE_DTYPES, (tuple(scores.shape), scores.dtype)
    assert k >= 1 and segments >= 1
    b, n = scores.shape
    if out is None:
        out = torch.empty((b, k), dtype=torch.int32, device=scores.device)
    assert out.dtype == torch.int32 and tuple(out.shape) == (b, k)
    assert lengths is None or (lengths.dtype == torch.int32 and tuple(lengths.shape) == (b,))
    if b == 0:
        return out
    seg = max(1, triton.cdiv(n, segments))
    per = min(k, seg)
    ccap = segments * per
    sample = default_sample(seg) if sample is None else sample
    cap = default_cap(k, sample) if cap is None else cap
    is_16bit = scores.dtype != torch.float32
    raw = scores.view(torch.int16 if is_16bit else torch.int32)
    cand = torch.zeros((b, ccap), dtype=torch.int32, device=scores.device)  # zeros: the tail is gathered too
    skey = torch.empty((b * segments, cap), dtype=torch.int32, device=scores.device)
    scol = torch.empty((b * segments, cap), dtype=torch.int32, device=scores.device)
    lens = None if lengths is None else lengths.contiguous()
    _segment_kernel[(b, segments)](
        raw, lens if lens is not None else cand, cand, skey, scol,
        n, k, cap, seg, ccap, raw.stride(0), raw.stride(1),
        HAS_LENGTHS=lens is not None, BLOCK=block, SBLOCK=min(block, SBLOCK), SAMPLE=sample, CHUNK=min(CHUNK, sample),
        IS_16BIT=is_16bit, INF_BITS=_INF_BITS[scores.dtype], num_warps=NUM_WARPS,
    )  # fmt: skip
    length = torch.full((b,), n, dtype=torch.int64, device=scores.device) if lens is None else lens.clamp(0, n).long()
    count = (length // seg) * per + torch.clamp(length % seg, max=k)
    vals = torch.gather(scores, 1, cand.long())
    pos = topk_triton_v3(vals, k, lengths=count.to(torch.int32))
    out.copy_(torch.where(pos >= 0, torch.gather(cand, 1, pos.clamp_min(0).long()), -1))
    return out
