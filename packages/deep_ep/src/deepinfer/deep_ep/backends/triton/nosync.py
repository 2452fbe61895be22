"""Triton kernels of the no-host-sync normal dispatch / combine (`num_worst_tokens`, `_nosync.py`).

The count matrix M [R, R] (M[s][d] = rows rank s sends to rank d) never reaches the host: `plan` copies it
out of the exchanged count area into `mat` (a per-call device tensor the handle keeps), and every later
kernel derives its offsets from `mat` on the device (R <= 8: one masked vector load of a row or column):
  send_off(s, d) = sum_{d' < d} M[s][d'] (d's block in s's send order),
  recv_off(s, d) = sum_{q < s} M[q][d]   (s's block in d's receive order).
Grids are sized for the caller's bound W (num_worst_tokens) instead of the real counts, and every program
masks by the real counts read from `mat`; rows a receiver would get past W are dropped (and flagged).
`mat` layout: int64 [R * R + 2]: M row-major, then rows received by this rank, then an error bit set:
1 = ranks disagree on (payload, hidden, scales, k, W), 2 = an expert id outside [-1, E), 4 = a wrong
is_token_in_rank, 8 = some rank receives more than W rows. Nothing here raises (that would need the host):
`DispatchHandle.check()` reads the bits.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .rows import _combine_reduce_kernel

# rows per program of the movers: the tuned gather's shape on the GPU (as in fused.py); 32 under the
# interpreter, which runs programs one after another (a program costs ~0.1 s there, whatever its size)
BLOCK_T = 32 if os.environ.get("TRITON_INTERPRET") == "1" else 4
BLOCK_W = 1024  # words per program
ERR_SIG: tl.constexpr = tl.constexpr(1)  # error bits of mat[R * R + 1] (constexpr: @jit reads them)
ERR_IDS: tl.constexpr = tl.constexpr(2)
ERR_LAYOUT: tl.constexpr = tl.constexpr(4)
ERR_OVERFLOW: tl.constexpr = tl.constexpr(8)
ERRORS = {
    1: "ranks disagree on the payload dtype, hidden, k or num_worst_tokens",
    2: "an expert id outside [-1, E)",
    4: "is_token_in_rank does not match topk_idx",
    8: "some rank receives more rows than num_worst_tokens",
}


@triton.jit
def _plan_kernel(area, mat, counts, width, rank, per_rank, num_experts, align, cap,
                 R: tl.constexpr, RP: tl.constexpr, EP: tl.constexpr):  # fmt: skip
    """`plan`'s one program (the overlapped mode runs the same body with .cg loads, after its waits)."""
    _plan_area(area, width, mat, counts, rank, per_rank, num_experts, align, cap, R, RP, EP, "")


@triton.jit
def _plan_area(area, width, mat, counts, rank, per_rank, num_experts, align, cap,
               R: tl.constexpr, RP: tl.constexpr, EP: tl.constexpr, CACHE: tl.constexpr):  # fmt: skip
    """One program: M into mat, rows received, error bits, tokens per local expert (aligned) into counts.

    area: the exchanged rows (R rows of `width` int64 words); CACHE: the loads' cache modifier ("" or ".cg")."""
    ss = tl.arange(0, RP)
    dd = tl.arange(0, RP)
    sm = ss < R
    m2 = sm[:, None] & (dd < R)[None, :]
    m = tl.load(area + ss[:, None] * width + dd[None, :], mask=m2, other=0, cache_modifier=CACHE)
    tl.store(mat + ss[:, None] * R + dd[None, :], m, mask=m2)
    recv = tl.sum(m, axis=0)  # [RP]: rows each rank receives
    tl.store(mat + R * R, tl.sum(tl.where(dd == rank, recv, 0), axis=0))
    tail = R + num_experts
    jj = tl.arange(0, 8)
    sig = tl.load(area + ss[:, None] * width + tail + jj[None, :], mask=sm[:, None] & (jj < 5)[None, :], other=0,
                  cache_modifier=CACHE)  # fmt: skip
    sig0 = tl.sum(tl.where(ss[:, None] == 0, sig, 0), axis=0)  # rank 0's signature [8]
    err = tl.max(tl.max(tl.where(sm[:, None] & (sig != sig0[None, :]), ERR_SIG, 0), axis=1), axis=0)
    lo = tl.min(tl.load(area + ss * width + tail + 5, mask=sm, other=0, cache_modifier=CACHE), axis=0)
    hi = tl.max(tl.load(area + ss * width + tail + 6, mask=sm, other=-1, cache_modifier=CACHE), axis=0)
    err = err | tl.where((lo < -1) | (hi >= num_experts), ERR_IDS, 0)
    bad = tl.load(area + ss[:, None] * width + tail + 7 + dd[None, :], mask=m2, other=0, cache_modifier=CACHE)
    err = err | tl.where(tl.max(tl.max(bad, axis=1), axis=0) != 0, ERR_LAYOUT, 0)
    err = err | tl.where(tl.max(recv, axis=0) > cap, ERR_OVERFLOW, 0)
    tl.store(mat + R * R + 1, err.to(tl.int64))
    ee = tl.arange(0, EP)
    em = ee < per_rank
    cols = R + rank * per_rank + ee
    per = tl.load(area + ss[:, None] * width + cols[None, :], mask=sm[:, None] & em[None, :], other=0,
                  cache_modifier=CACHE)  # fmt: skip
    c = tl.sum(per, axis=0)
    tl.store(counts + ee, ((c + align - 1) // align * align).to(tl.int32), mask=em)


def plan(area: torch.Tensor, mat: torch.Tensor, counts: torch.Tensor, rank: int, num_experts: int, align: int,
         cap: int) -> None:  # fmt: skip
    """area int64 [R, 2R + E + 7] (the exchanged rows, fused.row_width) -> mat int64 [R * R + 2] and counts
    int32 [E / R] (received tokens per local expert, rounded up to `align`). cap: the receive bound W."""
    world = area.shape[0]
    per_rank = num_experts // world
    _plan_kernel[(1,)](
        area, mat, counts, area.shape[1], rank, per_rank, num_experts, align, cap,
        R=world, RP=triton.next_power_of_2(world), EP=triton.next_power_of_2(max(per_rank, 2)),
    )  # fmt: skip


@triton.jit
def _offsets(mat, s, d, R: tl.constexpr, RP: tl.constexpr):
    """(send_off(s, d), recv_off(s, d), M[s][d]) from mat (see the module docstring)."""
    qq = tl.arange(0, RP)
    row = tl.load(mat + s * R + qq, mask=qq < R, other=0)
    col = tl.load(mat + qq * R + d, mask=qq < R, other=0)
    send_off = tl.sum(tl.where(qq < d, row, 0), axis=0)
    recv_off = tl.sum(tl.where(qq < s, col, 0), axis=0)
    n = tl.sum(tl.where(qq == d, row, 0), axis=0)
    return send_off, recv_off, n


@triton.jit
def _push_kernel(
    pos, mat, rank, dst_rank, cap, t, send_pos, send_tok,
    x0, d0, w0, x1, d1, w1,
    idx, wts, didx, dwts, dsrc, k, lo_e, per_rank,
    NX: tl.constexpr, META: tl.constexpr, HANDLE: tl.constexpr, FROM_SEND_POS: tl.constexpr, R: tl.constexpr,
    RP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    _push_body(tl.program_id(0), pos, mat, rank, dst_rank, cap, t, send_pos, send_tok, x0, d0, w0, x1, d1, w1,
               idx, wts, didx, dwts, dsrc, k, lo_e, per_rank,
               NX, META, HANDLE, FROM_SEND_POS, R, RP, BLOCK_T, BLOCK_W, BLOCK_K)  # fmt: skip


@triton.jit
def _push_pair_kernel(
    pos, mat, rank, peer, cap, t, send_pos, send_tok,
    x0, pd0, sd0, w0, x1, pd1, sd1, w1,
    idx, wts, pdidx, pdwts, pdsrc, sdidx, sdwts, sdsrc, k, per_rank,
    NX: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Two destinations in one launch: even programs of axis 0 push to `peer` (its buffer, over NVLink), odd
    ones our own block (local outputs); interleaved, so that the GPU runs both side by side and the local copy
    uses the HBM bandwidth the NVLink-bound peer push leaves idle."""
    blk = tl.program_id(0) // 2
    if tl.program_id(0) % 2 == 0:
        _push_body(blk, pos + peer * t, mat, rank, peer, cap, t, send_pos + peer * t, send_tok,
                   x0, pd0, w0, x1, pd1, w1, idx, wts, pdidx, pdwts, pdsrc, k, peer * per_rank, per_rank,
                   NX, True, True, False, R, RP, BLOCK_T, BLOCK_W, BLOCK_K)  # fmt: skip
    else:
        _push_body(blk, pos + rank * t, mat, rank, rank, cap, t, send_pos + rank * t, send_tok,
                   x0, sd0, w0, x1, sd1, w1, idx, wts, sdidx, sdwts, sdsrc, k, rank * per_rank, per_rank,
                   NX, True, True, False, R, RP, BLOCK_T, BLOCK_W, BLOCK_K)  # fmt: skip


@triton.jit
def _push_body(
    blk, pos, mat, rank, dst_rank, cap, t, send_pos, send_tok,
    x0, d0, w0, x1, d1, w1,
    idx, wts, didx, dwts, dsrc, k, lo_e, per_rank,
    NX: tl.constexpr, META: tl.constexpr, HANDLE: tl.constexpr, FROM_SEND_POS: tl.constexpr, R: tl.constexpr,
    RP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Rows of tokens block `blk` for dst_rank into its receive rows (fused._push_kernel, device offsets)."""
    send_off, row0, _n = _offsets(mat, rank, dst_rank, R, RP)
    toks = blk * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = toks < t
    first = (toks * 0 + tl.program_id(1)) == 0  # per-token (not per-column) stores: column block 0 only
    p = tl.load(pos + toks, mask=tm, other=-1)  # place in dst_rank's send block (or send position), -1: not sent
    if FROM_SEND_POS:  # a handle's send_pos (cached dispatch): the place is p - send_off
        local = tl.where(p >= 0, p - send_off, -1)
    else:
        local = p
    sent = tm & (local >= 0)
    r = row0 + local  # the row in the destination (a peer's region or our outputs)
    valid = sent & (r < cap)  # rows past the receive bound W are dropped (flagged by plan)
    t64 = toks.to(tl.int64)
    if HANDLE:
        _store_handle(send_pos, send_tok, toks, t64, tm, sent, first, local, send_off)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    _move(x0, d0, w0, t64, r, valid, cols)
    if NX == 2:
        _move(x1, d1, w1, t64, r, valid, cols)
    if META:  # top-k ids / weights rewritten for the receiver (local ids, -1 / 0 elsewhere) + the token index
        _store_meta(idx, wts, didx, dwts, dsrc, t64, r, valid & first, k, lo_e, per_rank, BLOCK_K)


@triton.jit
def _store_handle(send_pos, send_tok, toks, t64, tm, sent, first, local, send_off):
    """The handle of tokens toks [BT] (t64: the same as int64): send_pos[toks] = local + send_off (-1 where
    not sent), send_tok[local + send_off] = the token. Only the programs of column block 0 store (`first`)."""
    tl.store(send_pos + toks, tl.where(sent, local + send_off, -1), mask=tm & first)
    tl.store(send_tok + local + send_off, t64, mask=sent & first)


@triton.jit
def _local_topk(idx, wts, t64, mk, kk, k, lo_e, per_rank):
    """Top-k slots kk [BK] of tokens t64 [BT] (under mk [BT, BK]): (mine: the id is one of the experts lo_e ..
    lo_e + per_rank - 1, the id made local (loc = id - lo_e), the weight), three [BT, BK] blocks. Receivers
    get tl.where(mine, loc, -1) and tl.where(mine, w, 0.0)."""
    ids = tl.load(idx + t64[:, None] * k + kk[None, :], mask=mk, other=-1)
    w = tl.load(wts + t64[:, None] * k + kk[None, :], mask=mk, other=0.0)
    loc = ids - lo_e
    mine = (ids >= 0) & (loc >= 0) & (loc < per_rank)
    return mine, loc, w


@triton.jit
def _store_meta(idx, wts, didx, dwts, dsrc, t64, r, rm, k, lo_e, per_rank, BLOCK_K: tl.constexpr):
    """Rows r [BT] (under rm) of the receiver's ids / weights [cap, k] (`_local_topk` of tokens t64) and
    source index [cap] (t64)."""
    kk = tl.arange(0, BLOCK_K)
    mk = rm[:, None] & (kk < k)[None, :]
    mine, loc, w = _local_topk(idx, wts, t64, mk, kk, k, lo_e, per_rank)
    tl.store(didx + r[:, None] * k + kk[None, :], tl.where(mine, loc, -1), mask=mk)
    tl.store(dwts + r[:, None] * k + kk[None, :], tl.where(mine, w, 0.0), mask=mk)
    tl.store(dsrc + r, t64, mask=rm)


def push(
    pos: torch.Tensor,
    mat: torch.Tensor,
    rank: int,
    dst_rank: int,
    cap: int,
    xs: list[tuple[torch.Tensor, torch.Tensor]],
    meta: tuple | None = None,
    handle: tuple[torch.Tensor, torch.Tensor] | None = None,
    from_send_pos: bool = False,
) -> None:
    """Send every token of ours to dst_rank in one launch (all fields), offsets read from mat on the device.

    pos int64 [t]: token t's place in dst_rank's send block, -1 when not sent there (from_send_pos: the
    handle's send position of that row instead, i.e. the place + send_off(rank, dst_rank)). xs: 1 or 2 (source
    [t, W] words, destination [cap, W] words) pairs; destination row recv_off(rank, dst_rank) + pos gets
    source row t (dropped when >= cap). meta / handle: as `fused.push_rows` (send_pos = pos + send_off).
    """
    t, world = pos.shape[0], _world(mat)
    if t == 0:
        return
    (x0, d0), (x1, d1) = xs[0], xs[-1]
    width = max(x0.shape[1], x1.shape[1])
    if meta is None:
        k, lo_e, per_rank, idx, wts, didx, dwts, dsrc = 1, 0, 0, x0, x0, d0, d0, d0
    else:
        idx, wts, didx, dwts, dsrc, lo_e, per_rank = meta
        k = idx.shape[1]
    send_pos, send_tok = handle if handle is not None else (pos, pos)
    grid = (triton.cdiv(t, BLOCK_T), triton.cdiv(width, BLOCK_W))
    _push_kernel[grid](
        pos, mat, rank, dst_rank, cap, t, send_pos, send_tok,
        x0, d0, x0.shape[1], x1, d1, x1.shape[1],
        idx, wts, didx, dwts, dsrc, k, lo_e, per_rank,
        NX=len(xs), META=meta is not None, HANDLE=handle is not None, FROM_SEND_POS=from_send_pos, R=world,
        RP=triton.next_power_of_2(world), BLOCK_T=BLOCK_T, BLOCK_W=BLOCK_W, BLOCK_K=triton.next_power_of_2(max(k, 2)),
    )  # fmt: skip


def push_pair(
    pos: torch.Tensor,
    mat: torch.Tensor,
    rank: int,
    peer: int,
    cap: int,
    xs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    meta: tuple,
    handle: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """`push` to `peer` and to ourselves in one launch (the two run side by side on the GPU).

    pos int64 [R, t] (every destination's places); xs: 1 or 2 (source [t, W], peer's region [cap, W], our
    output [cap, W]) word triples; meta: (topk_idx [t, k], topk_weights [t, k], the peer's ids / weights /
    token-index regions, our three outputs, E / R); handle: (send_pos int64 [R, t], send_tok [R * t]).
    """
    world, t = pos.shape
    if t == 0:
        return
    (x0, p0, s0), (x1, p1, s1) = xs[0], xs[-1]
    idx, wts, pidx, pw, psrc, sidx, sw, ssrc, per_rank = meta
    width = max(x0.shape[1], x1.shape[1])
    k = idx.shape[1]
    grid = (2 * triton.cdiv(t, BLOCK_T), triton.cdiv(width, BLOCK_W))
    _push_pair_kernel[grid](
        pos, mat, rank, peer, cap, t, handle[0], handle[1],
        x0, p0, s0, x0.shape[1], x1, p1, s1, x1.shape[1],
        idx, wts, pidx, pw, psrc, sidx, sw, ssrc, k, per_rank,
        NX=len(xs), R=world, RP=triton.next_power_of_2(world),
        BLOCK_T=BLOCK_T, BLOCK_W=BLOCK_W, BLOCK_K=triton.next_power_of_2(max(k, 2)),
    )  # fmt: skip


def _world(mat: torch.Tensor) -> int:
    """R from mat's length R * R + 2."""
    n = mat.shape[0] - 2
    r = int(round(n**0.5))
    if r * r != n:
        raise ValueError(f"mat: expected R * R + 2 entries, got {mat.shape[0]}")
    return r


@triton.jit
def _move(src, dst, w, src_rows, dst_rows, rm, cols):
    """dst[dst_rows, cols] = src[src_rows, cols] (rows under rm, columns < w; both [*, w] contiguous)."""
    m = rm[:, None] & (cols < w)[None, :]
    v = tl.load(src + src_rows[:, None] * w + cols[None, :], mask=m)
    tl.store(dst + dst_rows[:, None] * w + cols[None, :], v, mask=m)


@triton.jit
def _fill(dst, w, rows, rm, cols, value):
    m = rm[:, None] & (cols < w)[None, :]
    full = (rows[:, None] * 0 + cols[None, :] * 0 + value).to(dst.dtype.element_ty)
    tl.store(dst + rows[:, None] * w + cols[None, :], full, mask=m)


@triton.jit
def _copy_out_kernel(
    mat, rank, cap, s0, d0, w0, s1, d1, w1, si, di, wi, sw, dw, ww, ss, ds, ws,
    NX: tl.constexpr, META: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """Peers' blocks from our buffer into the outputs; rows past the received count: ids / source -1,
    weights 0 (payload rows there are left as they are)."""
    _so, lo, n_self = _offsets(mat, rank, rank, R, RP)
    n = tl.minimum(tl.load(mat + R * R), cap)
    hi = lo + n_self
    rows = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    rm = (rows < n) & ((rows < lo) | (rows >= hi))
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    _move(s0, d0, w0, rows, rows, rm, cols)
    if NX == 2:
        _move(s1, d1, w1, rows, rows, rm, cols)
    if META:
        _move(si, di, wi, rows, rows, rm, cols)
        _move(sw, dw, ww, rows, rows, rm, cols)
        _move(ss, ds, ws, rows, rows, rm, cols)
        pad = (rows >= n) & (rows < cap)
        _fill(di, wi, rows, pad, cols, -1)
        _fill(dw, ww, rows, pad, cols, 0)
        _fill(ds, ws, rows, pad, cols, -1)


def copy_out(mat: torch.Tensor, rank: int, cap: int, xs: list[tuple[torch.Tensor, torch.Tensor]],
             meta: list[tuple[torch.Tensor, torch.Tensor]] | None) -> None:  # fmt: skip
    """dst[i] = src[i] for rows i < received (capped at cap) outside our own block, every field, one launch.

    xs: 1 or 2 payload (our buffer's region [cap, W] words, output [cap, W] words) pairs; meta: None or the
    (region, output) int32-word pairs of ids, weights and source index, whose rows >= received are filled.
    """
    world = _world(mat)
    (s0, d0), (s1, d1) = xs[0], xs[-1]
    m = meta if meta is not None else [xs[0]] * 3
    width = max(s0.shape[1], s1.shape[1])
    flat = [v for s, d in m for v in (s, d, s.shape[1])]
    grid = (triton.cdiv(cap, BLOCK_T), triton.cdiv(width, BLOCK_W))
    _copy_out_kernel[grid](
        mat, rank, cap, s0, d0, s0.shape[1], s1, d1, s1.shape[1], *flat,
        NX=len(xs), META=meta is not None, R=world, RP=triton.next_power_of_2(world), BLOCK_T=BLOCK_T, BLOCK_W=BLOCK_W,
    )  # fmt: skip


@triton.jit
def _combine_send_kernel(
    mat, rank, src_rank, cap, x0, d0, w0, x1, d1, w1,
    NX: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """Rows we received from src_rank (y rows recv_off(src, rank) ..) back into src_rank's region at their
    send positions send_off(src, rank) .. (a contiguous block: row for row)."""
    send_off, recv_off, n = _offsets(mat, src_rank, rank, R, RP)
    i = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)  # row within the block
    rm = (i < n) & (recv_off + i < cap)
    src_rows = recv_off + i
    dst_rows = send_off + i
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    _move(x0, d0, w0, src_rows, dst_rows, rm, cols)
    if NX == 2:
        _move(x1, d1, w1, src_rows, dst_rows, rm, cols)


def combine_send(mat: torch.Tensor, rank: int, src_rank: int, cap: int, xs: list[tuple[torch.Tensor, torch.Tensor]],
                 max_rows: int) -> None:  # fmt: skip
    """xs: 1 or 2 (our y [cap, W] words, src_rank's combine region [>= its send total, W] words) pairs.
    max_rows: a bound on M[src_rank][rank] (the grid; rows past the real count are masked)."""
    if max_rows == 0:
        return
    world = _world(mat)
    (x0, d0), (x1, d1) = xs[0], xs[-1]
    width = max(x0.shape[1], x1.shape[1])
    grid = (triton.cdiv(max_rows, BLOCK_T), triton.cdiv(width, BLOCK_W))
    _combine_send_kernel[grid](
        mat, rank, src_rank, cap, x0, d0, x0.shape[1], x1, d1, x1.shape[1],
        NX=len(xs), R=world, RP=triton.next_power_of_2(world), BLOCK_T=BLOCK_T, BLOCK_W=BLOCK_W,
    )  # fmt: skip


@triton.jit
def _reduce_kernel(
    pos, mat, rank, back, y, out, num_tokens, width,
    R: tl.constexpr, RP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BF16_BITS: tl.constexpr,
):  # fmt: skip
    """rows.combine_reduce_triton with our own block's range and shift read from mat."""
    self_lo, recv_lo, n_self = _offsets(mat, rank, rank, R, RP)
    self_hi = self_lo + n_self
    shift = recv_lo - self_lo
    _combine_reduce_kernel(pos, back, y, out, num_tokens, width, self_lo, self_hi, shift, R, BLOCK_T, BLOCK_W,
                           BF16_BITS)  # fmt: skip


def reduce(pos: torch.Tensor, mat: torch.Tensor, rank: int, back: torch.Tensor, y: torch.Tensor,
           out: torch.Tensor) -> None:  # fmt: skip
    """out[t] = sum_d row(pos[d, t]) in float32 (d ascending), one rounding to out.dtype.

    pos int64 [R, t] (the handle's send_pos); a position in our own block is row p + shift of y (the rows we
    kept), any other p is back[p] (returned by a peer). back / y / out: one float dtype, [*, h] contiguous.
    """
    world, t = pos.shape
    width = out.shape[1] if out.dim() == 2 else 1
    if t == 0 or width == 0:
        return
    block_w = min(512, triton.next_power_of_2(width))
    bf16 = out.dtype == torch.bfloat16
    grid = (triton.cdiv(t, BLOCK_T), triton.cdiv(width, block_w))
    _reduce_kernel[grid](
        pos, mat, rank, back, y, out.view(torch.int16) if bf16 else out, t, width,
        R=world, RP=triton.next_power_of_2(world), BLOCK_T=BLOCK_T, BLOCK_W=block_w, BF16_BITS=bf16,
    )  # fmt: skip
