"""Row movers of the intranode fast path, in Triton and in plain torch (same results, bit for bit).

`gather_rows(src, idx, dst)`: dst[i] = src[idx[i]]; dst may be a slice of a PEER's buffer (the store then
crosses NVLink), so the gather and the transfer are one pass.
`combine_reduce(...)`: out[t] = sum over ranks d (ascending) of the row rank d returned for token t, in
float32, rounded once to out's dtype.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK_ROWS = 32 if os.environ.get("TRITON_INTERPRET") == "1" else 4  # the interpreter: fewer, bigger programs
BLOCK_WORDS = 1024


@triton.jit
def _gather_rows_kernel(src, idx, dst, n_rows, width, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    rmask = rows < n_rows
    s = tl.load(idx + rows, mask=rmask, other=0).to(tl.int64)
    mask = rmask[:, None] & (cols < width)[None, :]
    v = tl.load(src + s[:, None] * width + cols[None, :], mask=mask)
    tl.store(dst + rows.to(tl.int64)[:, None] * width + cols[None, :], v, mask=mask)


def gather_rows(src: torch.Tensor, idx: torch.Tensor, dst: torch.Tensor, impl: str) -> None:
    """dst[i, :] = src[idx[i], :] for i < len(idx).

    src [n, W] and dst [len(idx), W]: one integer dtype, contiguous rows (dst may live on a peer GPU);
    idx int64 [m]. impl: "triton" or "torch" (index_select into dst).
    """
    m, width = idx.shape[0], src.shape[1]
    if m == 0 or width == 0:
        return
    if impl == "torch":
        torch.index_select(src, 0, idx, out=dst)
        return
    grid = (triton.cdiv(m, BLOCK_ROWS), triton.cdiv(width, BLOCK_WORDS))
    _gather_rows_kernel[grid](src, idx, dst, m, width, BLOCK_R=BLOCK_ROWS, BLOCK_W=BLOCK_WORDS)


@triton.jit
def _combine_reduce_kernel(
    pos, back, y, out, num_tokens, width, self_lo, self_hi, shift,
    R: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BF16_BITS: tl.constexpr,
):  # fmt: skip
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    tmask = toks < num_tokens
    cmask = (cols < width)[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_W), dtype=tl.float32)
    for d in tl.static_range(R):  # ascending rank: the reference's summation order
        p = tl.load(pos + d * num_tokens + toks, mask=tmask, other=-1).to(tl.int64)
        mine = (p >= self_lo) & (p < self_hi)  # rows this rank returned to itself are still in y
        theirs = (p >= 0) & ~mine
        a = tl.load(back + p[:, None] * width + cols[None, :], mask=theirs[:, None] & cmask, other=0.0)
        b = tl.load(y + (p + shift)[:, None] * width + cols[None, :], mask=mine[:, None] & cmask, other=0.0)
        acc += tl.where(mine[:, None], b.to(tl.float32), a.to(tl.float32))
    offs = toks.to(tl.int64)[:, None] * width + cols[None, :]
    if BF16_BITS:  # out is an int16 view of bf16: round to nearest even by hand (the interpreter truncates)
        bits = acc.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(acc != acc, 0x7FC0, rounded)  # NaN stays NaN
        tl.store(out + offs, rounded.to(tl.int16), mask=tmask[:, None] & cmask)
    else:
        tl.store(out + offs, acc.to(out.dtype.element_ty), mask=tmask[:, None] & cmask)


def combine_reduce_triton(
    pos: torch.Tensor, back: torch.Tensor, y: torch.Tensor, out: torch.Tensor, self_range: tuple[int, int], shift: int
) -> None:
    """out[t] = sum_d row(pos[d, t]) in float32 (d ascending), one rounding to out.dtype.

    pos int64 [R, t]: send position of token t's row for rank d, -1 when t was not sent to d. A position
    p in [self_range) is this rank's own row, found at y[p + shift]; any other p is back[p].
    back [cap, h] / y [n, h] / out [t, h]: one float dtype, contiguous.
    """
    world, t = pos.shape
    width = out.shape[1]
    if t == 0 or width == 0:
        return
    block_w = min(512, triton.next_power_of_2(width))
    grid = (triton.cdiv(t, BLOCK_ROWS), triton.cdiv(width, block_w))
    bf16 = out.dtype == torch.bfloat16
    _combine_reduce_kernel[grid](
        pos, back, y, out.view(torch.int16) if bf16 else out, t, width, self_range[0], self_range[1], shift,
        R=world, BLOCK_T=BLOCK_ROWS, BLOCK_W=block_w, BF16_BITS=bf16,
    )  # fmt: skip
