"""Fused Triton kernels of the intranode dispatch: layout + offsets, the row push, the copy-out.

One normal dispatch on R ranks runs: `layout_row` (1 launch, grid (R,)), the count exchange, then one
`push_rows` per destination rank (every field of a token in one launch, straight into the peer's buffer or,
for our own block, into the outputs), a barrier and one `copy_rows` (every field of every peer block from
our buffer into the outputs). All of them only move bytes (plus the local-routing rewrite of the top-k
ids / weights), so the results are bit-identical to the reference's.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LAYOUT_BLOCK_T = 512  # tokens per step of the one scanning program (8 steps for 4096 tokens)
LAYOUT_BLOCK_TE = 256  # tokens per step of an expert-counting program
LAYOUT_BLOCK_E = 32  # experts per counting program (8 programs for 256 experts)
# rows per program of the payload movers: the tuned gather's shape on the GPU (323 GB/s over NVLink); 32 under
# the interpreter, which runs programs one after another (each costs about the same whatever its size)
PUSH_BLOCK_T = 32 if os.environ.get("TRITON_INTERPRET") == "1" else 4
PUSH_BLOCK_W = 1024
BIG: tl.constexpr = tl.constexpr(1 << 62)  # "no id seen" for the min / max of the ids


@triton.jit
def _layout_scan(
    idx, given, row, layout, pos, t, k, per_rank, num_experts, sig0, sig1, sig2, sig3, sig4,
    R: tl.constexpr, RP: tl.constexpr, HAS_GIVEN: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program 0: layout, positions (a running prefix sum per destination), rows per rank, id range, checks."""
    kk = tl.arange(0, BLOCK_K)
    lo = tl.full((BLOCK_K,), BIG, dtype=tl.int64)  # per top-k column (no 0-d loop-carried values)
    hi = tl.full((BLOCK_K,), -BIG, dtype=tl.int64)
    tail = R + num_experts
    rr = tl.arange(0, RP)
    running = tl.zeros((RP,), dtype=tl.int64)  # rows for each destination so far (registers, not memory)
    bad = tl.zeros((RP,), dtype=tl.int64)
    for start in range(0, t, BLOCK_T):
        toks = start + tl.arange(0, BLOCK_T)
        tm = toks < t
        m2 = tm[:, None] & (kk < k)[None, :]
        ids = tl.load(idx + toks.to(tl.int64)[:, None] * k + kk[None, :], mask=m2, other=-1).to(tl.int64)
        lo = tl.minimum(lo, tl.min(tl.where(m2, ids, BIG), axis=0))
        hi = tl.maximum(hi, tl.max(tl.where(m2, ids, -BIG), axis=0))
        ok = (ids >= 0) & (ids < num_experts)  # other ids count nowhere (they raise after the exchange)
        owner = tl.where(ok, ids.to(tl.int32) // per_rank, -1)
        for d in tl.static_range(R):
            in_rank = tl.where(tm, tl.max((owner == d).to(tl.int32), axis=1), 0)
            base = tl.sum(tl.where(rr == d, running, 0), axis=0)
            before = tl.cumsum(in_rank, axis=0) - in_rank  # exclusive prefix: place in d's send block
            tl.store(pos + d * t + toks, tl.where(in_rank > 0, base + before, -1), mask=tm)
            tl.store(layout + toks.to(tl.int64) * R + d, in_rank.to(tl.uint8), mask=tm)
            running += tl.where(rr == d, tl.sum(in_rank, axis=0).to(tl.int64), 0)
            if HAS_GIVEN:
                g = tl.load(given + toks.to(tl.int64) * R + d, mask=tm, other=0).to(tl.int32)
                miss = tl.max(tl.where(tm & (g != in_rank), 1, 0), axis=0).to(tl.int64)
                bad = tl.maximum(bad, tl.where(rr == d, miss, 0))
    tl.store(row + rr, running, mask=rr < R)
    tl.store(row + tail + 7 + rr, bad, mask=rr < R)
    # no .to() on the int arguments: Triton turns an int argument equal to 1 into a constexpr
    tl.store(row + tail + 0, sig0)
    tl.store(row + tail + 1, sig1)
    tl.store(row + tail + 2, sig2)
    tl.store(row + tail + 3, sig3)
    tl.store(row + tail + 4, sig4)
    tl.store(row + tail + 5, tl.min(lo, axis=0))
    tl.store(row + tail + 6, tl.max(hi, axis=0))


@triton.jit
def _layout_experts(idx, row, t, k, num_experts, first_e, R: tl.constexpr, BLOCK_T: tl.constexpr,
                    BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr):  # fmt: skip
    """Programs 1..: tokens per expert for BLOCK_E experts from first_e (a token counts once per expert)."""
    eids = first_e + tl.arange(0, BLOCK_E)
    count = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for start in range(0, t, BLOCK_T):
        toks = start + tl.arange(0, BLOCK_T)
        tm = toks < t
        hit = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.int32)
        for j in tl.static_range(BLOCK_K):  # unrolled: the k loads are independent
            ids = tl.load(idx + toks.to(tl.int64) * k + j, mask=tm & ((toks * 0 + j) < k), other=-1).to(tl.int64)
            hit = tl.maximum(hit, (ids[:, None] == eids[None, :]).to(tl.int32))
        count += tl.sum(hit, axis=0)
    tl.store(row + R + eids, count.to(tl.int64), mask=eids < num_experts)


@triton.jit
def _layout_kernel(
    idx, given, row, layout, pos, t, k, num_experts, per_rank,
    sig0, sig1, sig2, sig3, sig4,
    R: tl.constexpr, RP: tl.constexpr, HAS_GIVEN: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_TE: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    # row = [rows per rank (R) | tokens per expert (E) | 5 signature words | id min | id max | bad per rank (R)]
    pid = tl.program_id(0)
    if pid == 0:
        _layout_scan(idx, given, row, layout, pos, t, k, per_rank, num_experts, sig0, sig1, sig2, sig3, sig4,
                     R, RP, HAS_GIVEN, BLOCK_T, BLOCK_K)  # fmt: skip
    else:
        _layout_experts(idx, row, t, k, num_experts, (pid - 1) * BLOCK_E, R, BLOCK_TE, BLOCK_K, BLOCK_E)


def row_width(world: int, num_experts: int) -> int:
    """int64 entries of one exchanged row of the fused path."""
    return 2 * world + num_experts + 7


def layout_row(
    idx: torch.Tensor,
    given: torch.Tensor | None,
    row: torch.Tensor,
    layout: torch.Tensor,
    pos: torch.Tensor,
    num_experts: int,
    sig: list[int],
) -> None:
    """One launch: the dispatch layout, every token's position in its send blocks, and the exchange row.

    idx int64 [t, k] (any values; ids outside [0, E) count nowhere but show in the min / max);
    given: bool [t, R] to compare with the layout (is_token_in_rank) or None; row int64 [2R + E + 7]
    (out: see `_layout_kernel`); layout bool [t, R] (out); pos int64 [R, t] (out): position of token t
    in the block it sends to rank d (tokens in ascending order), -1 when t does not go to d; sig: 5 ints.
    """
    idx = idx.contiguous()
    t, k = idx.shape
    world = layout.shape[1]
    per_rank = num_experts // world
    g = given.contiguous().view(torch.uint8) if given is not None else layout.view(torch.uint8)
    grid = (1 + triton.cdiv(num_experts, LAYOUT_BLOCK_E),)  # the scan, then the expert counters
    _layout_kernel[grid](
        idx, g, row, layout.view(torch.uint8), pos, t, k, num_experts, per_rank, *sig,
        R=world, RP=triton.next_power_of_2(world), HAS_GIVEN=given is not None, BLOCK_T=LAYOUT_BLOCK_T,
        BLOCK_TE=LAYOUT_BLOCK_TE, BLOCK_K=triton.next_power_of_2(max(k, 2)), BLOCK_E=LAYOUT_BLOCK_E, num_warps=8,
    )  # fmt: skip


@triton.jit
def _push_kernel(
    pos, bias, send_off, row0, t, send_pos, send_tok,
    x0, d0, w0, x1, d1, w1,
    idx, wts, didx, dwts, dsrc, k, lo_e, per_rank,
    NX: tl.constexpr, META: tl.constexpr, HANDLE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = toks < t
    first = (toks * 0 + tl.program_id(1)) == 0  # per-token (not per-column) stores: column block 0 only
    p = tl.load(pos + toks, mask=tm, other=-1)
    valid = tm & (p >= 0)
    local = p - bias  # the token's place in the block for this destination
    r = (row0 + local).to(tl.int64)  # its row in the destination region
    t64 = toks.to(tl.int64)
    if HANDLE:
        tl.store(send_pos + toks, tl.where(valid, local + send_off, -1), mask=tm & first)
        tl.store(send_tok + local + send_off, t64, mask=valid & first)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    m = valid[:, None] & (cols < w0)[None, :]
    v = tl.load(x0 + t64[:, None] * w0 + cols[None, :], mask=m)
    tl.store(d0 + r[:, None] * w0 + cols[None, :], v, mask=m)
    if NX == 2:
        m = valid[:, None] & (cols < w1)[None, :]
        v = tl.load(x1 + t64[:, None] * w1 + cols[None, :], mask=m)
        tl.store(d1 + r[:, None] * w1 + cols[None, :], v, mask=m)
    if META:  # top-k ids / weights rewritten for the receiver (local ids, -1 / 0 elsewhere) + the token index
        kk = tl.arange(0, BLOCK_K)
        mk = (valid & first)[:, None] & (kk < k)[None, :]
        ids = tl.load(idx + t64[:, None] * k + kk[None, :], mask=mk, other=-1)
        w = tl.load(wts + t64[:, None] * k + kk[None, :], mask=mk, other=0.0)
        loc = ids - lo_e
        mine = (ids >= 0) & (loc >= 0) & (loc < per_rank)
        tl.store(didx + r[:, None] * k + kk[None, :], tl.where(mine, loc, -1), mask=mk)
        tl.store(dwts + r[:, None] * k + kk[None, :], tl.where(mine, w, 0.0), mask=mk)
        tl.store(dsrc + r, t64, mask=valid & first)


def push_rows(
    pos: torch.Tensor,
    bias: int,
    send_off: int,
    row0: int,
    xs: list[tuple[torch.Tensor, torch.Tensor]],
    meta: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int] | None = None,
    handle: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Send every token of one destination d: one launch, all fields.

    pos int64 [t]: token t's position in d's send block plus `bias`, or -1 when t does not go to d.
    xs: 1 or 2 (source [t, W] words, destination [cap, W] words) pairs: row `row0 + pos - bias` of the
    destination gets source row t (the destination may be a peer's buffer: the stores cross NVLink).
    meta: (topk_idx int64 [t, k], topk_weights fp32 [t, k], dst idx int64 [cap, k], dst weights fp32
    [cap, k], dst source-token int64 [cap], d * E / R, E / R): ids become d's local ids (-1 elsewhere),
    weights 0 where the id is not local, and the token index is written along.
    handle: (send_pos int64 [t], send_tok int64 [sum sent]) to fill: send_pos = pos - bias + send_off
    (-1 where not sent), send_tok[send_pos] = t.
    """
    t = pos.shape[0]
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
    grid = (triton.cdiv(t, PUSH_BLOCK_T), triton.cdiv(width, PUSH_BLOCK_W))
    _push_kernel[grid](
        pos, bias, send_off, row0, t, send_pos, send_tok,
        x0, d0, x0.shape[1], x1, d1, x1.shape[1],
        idx, wts, didx, dwts, dsrc, k, lo_e, per_rank,
        NX=len(xs), META=meta is not None, HANDLE=handle is not None,
        BLOCK_T=PUSH_BLOCK_T, BLOCK_W=PUSH_BLOCK_W, BLOCK_K=triton.next_power_of_2(max(k, 2)),
    )  # fmt: skip


@triton.jit
def _copy_field(src, dst, w, rows, rm, cols):
    m = rm[:, None] & (cols < w)[None, :]
    v = tl.load(src + rows[:, None] * w + cols[None, :], mask=m)
    tl.store(dst + rows[:, None] * w + cols[None, :], v, mask=m)


@triton.jit
def _copy_rows_kernel(
    n, lo, hi, s0, d0, w0, s1, d1, w1, s2, d2, w2, s3, d3, w3, s4, d4, w4,
    NF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    rm = (rows < n) & ((rows < lo) | (rows >= hi))
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    _copy_field(s0, d0, w0, rows, rm, cols)
    if NF > 1:
        _copy_field(s1, d1, w1, rows, rm, cols)
    if NF > 2:
        _copy_field(s2, d2, w2, rows, rm, cols)
    if NF > 3:
        _copy_field(s3, d3, w3, rows, rm, cols)
    if NF > 4:
        _copy_field(s4, d4, w4, rows, rm, cols)


def copy_rows(pairs: list[tuple[torch.Tensor, torch.Tensor]], n: int, skip: tuple[int, int]) -> None:
    """dst[i] = src[i] for every (src, dst) pair and every row i < n outside [skip): one launch, 1..5 fields.

    src / dst: [>= n, W_f] contiguous, same dtype per pair (our buffer's regions -> the outputs).
    """
    if n == 0 or skip == (0, n):
        return
    if not 1 <= len(pairs) <= 5:
        raise ValueError(f"pairs: expected 1..5 fields, got {len(pairs)}")
    width = max(s.shape[1] for s, _ in pairs)
    flat: list[object] = []
    for i in range(5):
        s, d = pairs[min(i, len(pairs) - 1)]
        flat += [s, d, s.shape[1]]
    grid = (triton.cdiv(n, PUSH_BLOCK_T), triton.cdiv(width, PUSH_BLOCK_W))
    _copy_rows_kernel[grid](n, skip[0], skip[1], *flat, NF=len(pairs), BLOCK_T=PUSH_BLOCK_T, BLOCK_W=PUSH_BLOCK_W)
