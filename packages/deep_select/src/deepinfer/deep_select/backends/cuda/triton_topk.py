"""Triton exact row-wise top-k by radix select (the `deep_select.topk` contract, indices only, unsorted).

Contract (see `api.py` / `reference.py`): scores [b, n] fp32 / bf16 / fp16; row r considers columns
c < clamp(lengths[r], 0, n); ties go to the lower column index; -inf ranks below every finite value; NaN ranks
below -inf but is still a valid entry; -0.0 == +0.0; rows with fewer than k valid entries are padded with -1.
The order of the k outputs is unspecified (sorted=False): chosen entries fill slots 0 .. min(k, len) - 1 in
ascending column order (all entries above the threshold value and the lowest-index entries equal to it,
interleaved by column), padding fills the rest.

Algorithm, one program per row:

* every score becomes a signed int32 ranking key from its raw bits (no float op, so no denormal flushing):
  fp32 bits as is, bf16 / fp16 bits shifted into the high half (for bf16 that is exactly the fp32 image; for
  fp16 it is a different but equally ordered layout, fp16 -> fp32 being monotone and injective), then
  sign-magnitude -> two's complement (key = bits if bits >= 0 else -(bits & 0x7FFFFFFF)), so -0.0 and +0.0
  both map to 0; NaN (any payload, either sign) maps to NAN_KEY = -0x7F800001, below -inf. For fp32 / bf16
  this is the reference's `order_keys` high word. A larger key ranks higher.
  Columns past the row's length are masked out, never keyed.
* radix select over 4 digits of 8 bits, most significant first (the top digit has its sign bit flipped so the
  unsigned digit order matches the signed key order). Pass p streams the row in BLOCK chunks, histograms digit
  p of the candidates (valid entries whose higher digits equal the prefix chosen so far) into 256 bins, and picks
  the bin where the count of candidates from the top reaches `need` (the number still to choose among the
  candidates); candidates in higher bins are taken for sure, so `need` drops by their count.
  After 4 passes the prefix is the full threshold key T (the value of the k-th best valid entry) and `need` is
  how many entries equal to T are taken (the lowest-index ones).
* a final pass in column order writes every valid column with key > T, and the equal ones while their running
  count (exclusive prefix sum per chunk plus the count of earlier chunks) is below `need`; output slots come
  from the running count of chosen columns. Slots min(k, len) .. k - 1 get -1.

`tl.histogram` is called without its `mask` argument (not in every Triton version): non-candidates are binned
at digit 0 and their count is subtracted from bin 0 afterwards.
Cost: 5 reads of the row (4 histogram passes + 1 write pass); no host sync (CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["topk_triton", "BLOCK", "NUM_WARPS"]

BLOCK = 1024  # columns per chunk of a pass
PAD_BLOCK = 256  # output slots per store of the -1 padding loop
NUM_WARPS = 8
_SCORE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Bit pattern of +inf with the value's bits in the high end of an int32 (fp32 as is, 16-bit types << 16).
_INF_BITS = {torch.float32: 0x7F800000, torch.bfloat16: 0x7F800000, torch.float16: 0x7C00 << 16}


@triton.jit
def _order_key(raw, IS_16BIT: tl.constexpr, INF_BITS: tl.constexpr):
    """Raw score bits (int32, or int16 for bf16 / fp16) -> int32 ranking keys of the same shape.

    16-bit bits are placed in the high half (bf16 then is exactly its fp32 image; fp16 keeps its own,
    equally ordered, bit layout with INF_BITS = 0x7C00 << 16). No float op touches the value, so
    denormals can never be flushed.
    """
    bits = raw.to(tl.int32)
    if IS_16BIT:
        bits = bits << 16
    mag = bits & 0x7FFFFFFF
    key = tl.where(bits < 0, -mag, bits)
    return tl.where(mag > INF_BITS, -0x7F800001, key)


@triton.jit
def _digit(key, SHIFT: tl.constexpr):
    """8-bit radix digit of int32 keys at bit SHIFT, in unsigned key order (top digit's sign bit flipped)."""
    d = (key >> SHIFT) & 0xFF
    if SHIFT == 24:
        d = d ^ 0x80
    return d


@triton.jit
def _radix_pass(
    row_ptr, stride_n, length, need, prefix,
    SHIFT: tl.constexpr, BLOCK: tl.constexpr, IS_16BIT: tl.constexpr, INF_BITS: tl.constexpr,
):  # fmt: skip
    """One radix pass: returns (need, prefix) narrowed by the digit at SHIFT (both int32 scalars)."""
    bins = tl.arange(0, 256)
    hist = tl.zeros([256], dtype=tl.int32)
    for start in range(0, length, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inb = cols < length
        key = _order_key(tl.load(row_ptr + cols.to(tl.int64) * stride_n, mask=inb, other=0), IS_16BIT, INF_BITS)
        if SHIFT == 24:
            cand = inb
        else:
            cand = inb & ((key >> (SHIFT + 8)) == (prefix >> (SHIFT + 8)))
        dig = tl.where(cand, _digit(key, SHIFT), 0)
        n_out = BLOCK - tl.sum(cand.to(tl.int32), axis=0)
        hist += tl.histogram(dig, 256)
        hist -= tl.where(bins == 0, n_out, 0)
    # ge[d] = candidates with digit >= d (non-increasing in d; ge[0] = all candidates >= need).
    total = tl.sum(hist, axis=0)
    ge = total - tl.cumsum(hist, axis=0) + hist
    d = tl.sum((ge >= need).to(tl.int32), axis=0) - 1
    above = tl.sum(tl.where(bins > d, hist, 0), axis=0)
    if SHIFT == 24:
        d = d ^ 0x80
    return need - above, prefix | (d << SHIFT)


@triton.jit(do_not_specialize=["n", "k"])
def _topk_radix_kernel(
    scores_ptr, lengths_ptr, out_ptr,
    n, k, stride_b, stride_n, stride_ob, stride_ok,
    HAS_LENGTHS: tl.constexpr, BLOCK: tl.constexpr, PAD_BLOCK: tl.constexpr,
    IS_16BIT: tl.constexpr, INF_BITS: tl.constexpr,
):  # fmt: skip
    """Grid (b,). scores: raw bits (int32 / int16 view) [b, n] at strides (stride_b, stride_n); lengths int32 [b]
    (read only if HAS_LENGTHS); out int32 [b, k] at strides (stride_ob, stride_ok)."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = scores_ptr + row * stride_b
    out_row = out_ptr + row * stride_ob
    length = n
    if HAS_LENGTHS:
        length = tl.minimum(tl.maximum(tl.load(lengths_ptr + row), 0), n)
    kk = tl.minimum(length, k)  # slots that receive a chosen column

    need = kk
    prefix = tl.zeros([], dtype=tl.int32)
    need, prefix = _radix_pass(row_ptr, stride_n, length, need, prefix, 24, BLOCK, IS_16BIT, INF_BITS)
    need, prefix = _radix_pass(row_ptr, stride_n, length, need, prefix, 16, BLOCK, IS_16BIT, INF_BITS)
    need, prefix = _radix_pass(row_ptr, stride_n, length, need, prefix, 8, BLOCK, IS_16BIT, INF_BITS)
    need, prefix = _radix_pass(row_ptr, stride_n, length, need, prefix, 0, BLOCK, IS_16BIT, INF_BITS)

    # Final pass in column order: key > T always, key == T while fewer than `need` equals were taken.
    written = tl.zeros([], dtype=tl.int32)
    eq_seen = tl.zeros([], dtype=tl.int32)
    for start in range(0, length, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inb = cols < length
        key = _order_key(tl.load(row_ptr + cols.to(tl.int64) * stride_n, mask=inb, other=0), IS_16BIT, INF_BITS)
        eq = (inb & (key == prefix)).to(tl.int32)
        eq_rank = eq_seen + tl.cumsum(eq, axis=0) - eq
        sel = (inb & (key > prefix)) | ((eq != 0) & (eq_rank < need))
        sel_i = sel.to(tl.int32)
        slot = written + tl.cumsum(sel_i, axis=0) - sel_i
        tl.store(out_row + slot.to(tl.int64) * stride_ok, cols, mask=sel & (slot < k))  # slot < k: belt and braces
        written += tl.sum(sel_i, axis=0)
        eq_seen += tl.sum(eq, axis=0)

    for start in range(kk, k, PAD_BLOCK):
        slots = start + tl.arange(0, PAD_BLOCK)
        fill = tl.full([PAD_BLOCK], -1, dtype=tl.int32)
        tl.store(out_row + slots.to(tl.int64) * stride_ok, fill, mask=slots < k)


def topk_triton(
    scores: torch.Tensor,
    k: int,
    *,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    block: int = BLOCK,
) -> torch.Tensor:
    """Exact row-wise top-k indices (unsorted) with the deep_select tie / NaN / -inf / length rules.

    Args:
        scores: [b, n] fp32 / bf16 / fp16, any strides, on CUDA (or CPU under TRITON_INTERPRET=1). Read only.
        k: >= 1; k > n is allowed (extra slots are -1).
        lengths: int32 [b] or None; row r considers columns c < clamp(lengths[r], 0, n).
        out: optional int32 [b, k] buffer (any strides) that receives the result; every slot is written.
        block: columns per chunk (power of two >= 16; tests use small ones to cross chunk boundaries).

    Returns:
        int32 [b, k]: chosen column ids in ascending column order, then -1 padding (out itself when given).
    Does no argument checking beyond asserts (api.py validates); never syncs with the host.
    """
    assert scores.dim() == 2 and scores.dtype in _SCORE_DTYPES, (tuple(scores.shape), scores.dtype)
    assert k >= 1
    b, n = scores.shape
    if out is None:
        out = torch.empty((b, k), dtype=torch.int32, device=scores.device)
    assert out.dtype == torch.int32 and tuple(out.shape) == (b, k)
    if lengths is not None:
        assert lengths.dtype == torch.int32 and lengths.shape == (b,)
        lengths = lengths.contiguous()
    if b == 0:
        return out
    assert block >= 16 and block & (block - 1) == 0
    assert n < 2**31 - block and k < 2**31 - PAD_BLOCK
    is_16bit = scores.dtype != torch.float32
    raw = scores.view(torch.int16 if is_16bit else torch.int32)  # same element size: a view at any strides
    inf_bits = _INF_BITS[scores.dtype]
    _topk_radix_kernel[(b,)](
        raw, lengths if lengths is not None else out, out,
        n, k, raw.stride(0), raw.stride(1), out.stride(0), out.stride(1),
        HAS_LENGTHS=lengths is not None, BLOCK=block, PAD_BLOCK=PAD_BLOCK,
        IS_16BIT=is_16bit, INF_BITS=inf_bits, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
