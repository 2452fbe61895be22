"""Triton exact top-k, version 3: one full read of the row in the common case (sample, filter, select).

Same contract, ranking keys and ragged form as v2 (`triton_select.py`); output order unspecified.

Why: a 256-bin `tl.histogram` costs ~70 instructions per 32 elements (8 ballots, then 8 owned bins of AND /
POPC per lane), i.e. about two warp instructions per element, while an H200 SM issues ~4 warp instructions
per clock and must consume ~2.5 fp32 elements per clock to reach 60% of the 4.07 TB/s copy ceiling. A
full-row histogram pass is therefore compute bound well below that, and v2 makes two of them (v1 four). v3
streams the row once with only a compare and a prefix sum per element:

1. sample: SAMPLE keys (n / 64, 1,024 .. 4,096) in SAMPLE / CHUNK contiguous chunks spread evenly over the row
   (one load, in registers); two in-register radix digits give T0, the 16-bit floor of the sample's r-th
   largest key, with r = e + 4 sqrt(e) + 4 and e = kk * SAMPLE / length the expected sample count above the
   true threshold. So count(row >= T0) is about kk + (4 sqrt(e) + 4) length / SAMPLE, and >= kk unless the
   sample holds 4 sqrt(e) + 4 more top entries than expected (Poisson tail, < 1e-4 per row).
2. filter (the one full read): compact every (key, column) with key >= T0 into a per-row scratch of CAP
   entries, in column order (a prefix sum per chunk); count them all.
3. if kk <= count <= CAP: every top-kk entry is in the scratch (at least kk keys are >= T0, so the kk-th
   largest is too); an exact radix select over the scratch (4 digits fp32, 2 for 16-bit keys, ties to the
   first = lowest column) writes the ids. Bytes: the row once, plus a few passes over ~count * 8 bytes that
   stay in L2. Otherwise (unlucky sample, heavy ties, k near n), v2's selection runs for that row (3-5 reads).

Headline shape, fp32 b = 256, n = 65,536, k = 512: SAMPLE 1,024, e = 8, r = 23, count ~ 1,500 (12 KB of
scratch) against a 256 KB row. n = 262,144, k = 2,048: SAMPLE 4,096, e = 32, count ~ 4,000 (CAP 16,384).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_select import _choose, _load_keys, _pad, _row_range, _scratch_select, _v2_row
from .triton_topk import _INF_BITS, _SCORE_DTYPES, PAD_BLOCK, _digit

__all__ = ["topk_triton_v3", "BLOCK", "default_cap", "default_sample"]

BLOCK = 4096  # columns per chunk of the filter pass: 16 fp32 per thread at 8 warps (64 B of loads in flight)
SBLOCK = 1024  # chunk of the scratch passes (the scratch is small: fewer masked-off histogram slots)
SAMPLE_MIN, SAMPLE_MAX = 1024, 4096  # sampled keys per row: n / 64 within these (4 .. 16 per thread)
CHUNK = 32  # contiguous columns per sample chunk (128 B for fp32: whole sectors, no wasted bytes)
NUM_WARPS = 8


def default_sample(n: int) -> int:
    """Sampled keys per row: n / 64 (so e = kk * sample / n, the sample's expected count above the threshold,
    is k / 64 for any n), a power of two in [SAMPLE_MIN, SAMPLE_MAX]."""
    return min(max(triton.next_power_of_2(max(n // 64, 1)), SAMPLE_MIN), SAMPLE_MAX)


def default_cap(k: int, sample: int = SAMPLE_MAX) -> int:
    """Scratch entries per row, a power of two >= sample. The filter keeps about kk + (4 sqrt(e) + 4) n / sample
    keys (~1,500 at k = 512, ~4,000 at k = 2,048 with the default sample; CPU simulation of the normal rows of
    the benchmark: at most 2,745 and 5,342); 4k + 4,096 leaves room for that spread."""
    return max(sample, triton.next_power_of_2(4 * k + 4096))


@triton.jit
def _sample_threshold(
    row_ptr, stride_n, length, kk,
    SAMPLE: tl.constexpr, CHUNK: tl.constexpr, IS_16BIT: tl.constexpr, INF_BITS: tl.constexpr,
):  # fmt: skip
    """T0: a key with low 16 bits zero such that count(row keys >= T0) is a little above kk (see module doc).

    Rows up to SAMPLE columns are sampled whole (then T0 <= the kk-th largest key exactly)."""
    i = tl.arange(0, SAMPLE)
    step = tl.maximum(length // (SAMPLE // CHUNK), CHUNK)
    col = (i // CHUNK) * step + (i % CHUNK)
    inb = col < length
    key = _load_keys(row_ptr, col, stride_n, inb, True, IS_16BIT, INF_BITS)
    m = tl.sum(inb.to(tl.int32), axis=0)
    e = kk.to(tl.float32) * m.to(tl.float32) / tl.maximum(length, 1).to(tl.float32)
    r = (e + 4.0 * tl.sqrt(e) + 4.0).to(tl.int32)
    r = tl.maximum(tl.minimum(r, m), 1)
    bins = tl.arange(0, 256)
    prefix = tl.zeros([], dtype=tl.int32)
    hist = tl.histogram(tl.where(inb, _digit(key, 24), 0), 256) - tl.where(bins == 0, SAMPLE - m, 0)
    need, prefix, _ = _choose(hist, r, prefix, 24)
    cand = inb & ((key >> 24) == (prefix >> 24))
    n_out = SAMPLE - tl.sum(cand.to(tl.int32), axis=0)
    hist = tl.histogram(tl.where(cand, _digit(key, 16), 0), 256) - tl.where(bins == 0, n_out, 0)
    need, prefix, _ = _choose(hist, need, prefix, 16)
    return prefix


@triton.jit
def _filter_pass(
    row_ptr, stride_n, length, thr, skey, scol, cap,
    BLOCK: tl.constexpr, IS_16BIT: tl.constexpr, INF_BITS: tl.constexpr,
):  # fmt: skip
    """Compact (key, column) of every key >= thr into the scratch in column order (the first `cap` of them);
    returns how many there are in total (may exceed CAP)."""
    count = tl.zeros([], dtype=tl.int32)
    for start in range(0, length, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inb = cols < length
        key = _load_keys(row_ptr, cols, stride_n, inb, True, IS_16BIT, INF_BITS)
        keep = (inb & (key >= thr)).to(tl.int32)
        pos = count + tl.cumsum(keep, axis=0) - keep
        ok = (keep != 0) & (pos < cap)
        tl.store(skey + pos, key, mask=ok)
        tl.store(scol + pos, cols, mask=ok)
        count += tl.sum(keep, axis=0)
    return count


@triton.jit
def _v3_row(
    row_ptr, stride_n, length, kk, col_off, out_row, stride_ok, k, skey, scol, cap,
    BLOCK: tl.constexpr, SBLOCK: tl.constexpr, SAMPLE: tl.constexpr, CHUNK: tl.constexpr,
    IS_16BIT: tl.constexpr, INF_BITS: tl.constexpr,
):  # fmt: skip
    """v3's selection of one row (ids into slots 0 .. kk - 1, any order). Returns True when the one-read path
    served the row, False when v2's passes did."""
    thr = _sample_threshold(row_ptr, stride_n, length, kk, SAMPLE, CHUNK, IS_16BIT, INF_BITS)
    count = _filter_pass(row_ptr, stride_n, length, thr, skey, scol, cap, BLOCK, IS_16BIT, INF_BITS)
    tl.debug_barrier()  # other threads of this program read back the scratch the pass just wrote
    fast = (count >= kk) & (count <= cap)
    if fast:
        written = tl.zeros([], dtype=tl.int32)
        prefix = tl.zeros([], dtype=tl.int32)
        _scratch_select(
            skey, scol, count, kk, prefix, col_off, out_row, stride_ok, written, k, SBLOCK, IS_16BIT, INF_BITS, 24
        )
    else:  # the guess failed for this row: v2's selection (re-reads the row)
        _v2_row(
            row_ptr, stride_n, length, kk, col_off, out_row, stride_ok, k, skey, scol, cap, BLOCK, IS_16BIT, INF_BITS
        )
    return fast


@triton.jit(do_not_specialize=["n", "k", "cap"])
def _topk_v3_kernel(
    scores_ptr, lengths_ptr, starts_ptr, out_ptr, skey_ptr, scol_ptr, path_ptr,
    n, k, cap, stride_b, stride_n, stride_ob, stride_ok,
    HAS_LENGTHS: tl.constexpr, HAS_STARTS: tl.constexpr, HAS_PATH: tl.constexpr,
    BLOCK: tl.constexpr, SBLOCK: tl.constexpr, SAMPLE: tl.constexpr, CHUNK: tl.constexpr,
    PAD_BLOCK: tl.constexpr, IS_16BIT: tl.constexpr, INF_BITS: tl.constexpr,
):  # fmt: skip
    """Grid (b,). scores: raw bits [b, n]; lengths (or ends) / starts int32 [b]; out int32 [b, k];
    skey / scol int32 [b, cap] scratch (cap is a runtime value: one compiled kernel serves every k);
    path int32 [b] (if HAS_PATH): 1 = one-read path, 0 = v2 fallback."""
    row = tl.program_id(0).to(tl.int64)
    lo, length, col_off = _row_range(lengths_ptr, starts_ptr, row, n, HAS_LENGTHS, HAS_STARTS)
    row_ptr = scores_ptr + row * stride_b + lo.to(tl.int64) * stride_n
    out_row = out_ptr + row * stride_ob
    kk = tl.minimum(length, k)
    fast = _v3_row(
        row_ptr, stride_n, length, kk, col_off, out_row, stride_ok, k, skey_ptr + row * cap, scol_ptr + row * cap,
        cap, BLOCK, SBLOCK, SAMPLE, CHUNK, IS_16BIT, INF_BITS,
    )  # fmt: skip
    if HAS_PATH:
        tl.store(path_ptr + row, fast.to(tl.int32))
    _pad(out_row, stride_ok, kk, k, PAD_BLOCK)


def topk_triton_v3(
    scores: torch.Tensor,
    k: int,
    *,
    lengths: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    block: int = BLOCK,
    cap: int | None = None,
    sample: int | None = None,
    path: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact row-wise top-k indices (unsorted), same arguments and result as `topk_triton_v2`.

    Args:
        scores: [b, n] fp32 / bf16 / fp16, any strides, on CUDA (or CPU under TRITON_INTERPRET=1). Read only.
        k: >= 1; lengths / starts: int32 [b] or None (ragged form: ids relative to starts[r]).
        out: optional int32 [b, k] buffer (any strides); every slot is written.
        block: filter chunk (power of two >= 32); cap: scratch entries per row (power of two >= sample;
            default `default_cap(k, sample)`); sample: sampled keys per row (power of two >= 32; default
            `default_sample(n)`). Tests shrink them.
        path: optional int32 [b] that receives 1 per row served by the one-read path, 0 per v2 fallback.

    Returns:
        int32 [b, k]: the chosen ids in slots 0 .. min(k, len) - 1 (in no particular order), then -1.
    Does no argument checking beyond asserts (api.py validates); never syncs with the host.
    """
    assert scores.dim() == 2 and scores.dtype in _SCORE_DTYPES, (tuple(scores.shape), scores.dtype)
    assert k >= 1
    b, n = scores.shape
    if out is None:
        out = torch.empty((b, k), dtype=torch.int32, device=scores.device)
    assert out.dtype == torch.int32 and tuple(out.shape) == (b, k)
    for name, v in (("lengths", lengths), ("starts", starts), ("path", path)):
        assert v is None or (v.dtype == torch.int32 and tuple(v.shape) == (b,)), (name, v.dtype, tuple(v.shape))
    lengths = None if lengths is None else lengths.contiguous()
    starts = None if starts is None else starts.contiguous()
    if b == 0:
        return out
    sample = default_sample(n) if sample is None else sample
    cap = default_cap(k, sample) if cap is None else cap
    assert block >= 32 and block & (block - 1) == 0 and block < 2**15
    assert sample >= 32 and sample & (sample - 1) == 0
    assert cap >= sample and cap & (cap - 1) == 0
    assert n < 2**31 - block and k < 2**31 - PAD_BLOCK
    is_16bit = scores.dtype != torch.float32
    raw = scores.view(torch.int16 if is_16bit else torch.int32)
    skey = torch.empty((b, cap), dtype=torch.int32, device=scores.device)
    scol = torch.empty((b, cap), dtype=torch.int32, device=scores.device)
    _topk_v3_kernel[(b,)](
        raw, lengths if lengths is not None else out, starts if starts is not None else out, out, skey, scol,
        path if path is not None else out, n, k, cap, raw.stride(0), raw.stride(1), out.stride(0), out.stride(1),
        HAS_LENGTHS=lengths is not None, HAS_STARTS=starts is not None, HAS_PATH=path is not None,
        BLOCK=block, SBLOCK=min(block, SBLOCK),
        SAMPLE=sample, CHUNK=min(CHUNK, sample), PAD_BLOCK=PAD_BLOCK, IS_16BIT=is_16bit,
        INF_BITS=_INF_BITS[scores.dtype], num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
