"""Triton kernels of the overlapped no-sync normal mode (`_overlap.py`, `dispatch(num_worst_tokens=W, overlap=True)`).

Dispatch is two launches instead of the no-sync mode's 3 + (R - 1) + barriers:
  1. `layout`: a multi-program scan. Token block b (LAYOUT_BT tokens) writes its layout rows, every token's
     place within the block per destination (`lpos`), its rows per destination (`bcnt` [R, nb]), its id range
     and layout check (`bstat` [nb, 2 + R]); programs (b, expert block) count tokens per expert (`bexp` [nb,
     E]). Program 0 also advances the dispatch epoch ctr[0] (every later kernel reads it in stream order).
  2. `dispatch`: one launch, programs in roles ordered by program id (lower ids are dispatched first, so a
     role that waits never keeps a role it waits for off the GPU):
     A (1 program) reduces the block counts to our exchange row (fused.row_width's format) and writes it
       into every rank's count area (parity ep % 2), then sets our count flag there (release, system scope);
     B pushes our rows for each peer d into d's buffer, region of source `rank`, at the row's place in our
       send block for d (no offset from other ranks needed: a source's region has W rows), then sets each
       row's arrival tag ([row, column block] = ep, release) there;
     C copies our own block into the outputs once the lower ranks' counts are in (its offset);
     D (per peer q, persistent programs) waits for every count flag, then copies q's rows from our buffer
       into the outputs at recv_off(q, rank), each block of rows as soon as its tags say it landed (so the
       copy-out runs behind the peer's push instead of after a barrier);
     E pads rows past the received count (ids -1, weights 0, source -1) and its last program writes `mat`
       and the per-expert counts (as `nosync.plan` does).
     That is the "serial" launch order (this module's default; `_overlap` passes "mixed", the Buffer's default
     since session 6). `ORDERS` / `_role_pid`: "mixed" launches D's programs right after A on CUDA (they wait
     only on A and on peers' pushes, never on a program of their own launch behind them) and interleaves B and
     C per token block; the roles' code is the same either way.
Combine (`combine`): after a 1-program epoch bump (ctr[1]), one launch: S sends the rows we received from
each peer back into its combine region at their send positions (each block of rows followed by its tags;
the last program per peer also sets our combine flag there); R sums each token in fp32 in rank order (the
reference's order: bit for bit, one rounding), waiting for the tags of a peer's rows just before reading
them; the last program waits for every peer's combine flag.

Flags and tags are epochs that only grow (graph replays need no reset); count areas, row regions and tags
are doubled by epoch parity so a fast rank's next call cannot overwrite what a slow peer still reads: a
rank's call N + 1 always waits for every peer's count flag (dispatch) or combine flag (combine) of N + 1,
which that peer sets only after finishing call N, so no rank gets two calls ahead of a peer. A wait that
spins longer than `spin_limit` polls sets ctr[2] = 1 and proceeds (`timed_out`).
Session 6 (the same results): `DISPATCH_CONFIGS` ("early", the Buffer's default since session 6: the count column
flagged before the rest of the row; "fused", opt-in: + the layout scan inside the dispatch launch, the epoch advanced
in it), `COMBINE_CONFIGS` "fold" (opt-in: the epoch bump inside the combine launch) and "send2" (opt-in: 2x the send
programs); `DIAGS`: benchmark-only kernels.
Buffers: every rank's buffer viewed as int32 words (`peers32`, row data) and int64 (`peers64`, flags and
counts); a peer is picked with the constexpr chains of `ll._store_peer` (stores masked off for the others).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .ll import _and, _flag_peer, _peers8, _store_peer
from .nosync import _fill, _local_topk, _move, _offsets, _plan_area, _store_handle, _store_meta

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK_T = 32 if INTERPRET else 4  # rows per mover step (the tuned gather's shape on the GPU)
BLOCK_W = 1024  # words per mover step
LAYOUT_BT = 32 if INTERPRET else 128  # tokens per layout block program
LAYOUT_BE = 32  # experts per counting program
FUSED_BE = 32  # experts per counting program inside the fused dispatch launch (8: 4x the programs, 114 registers too)
# register cap of the fused dispatch launch (ptxas -v, Triton 3.6, sm_90a, R = 2 bf16: 114 registers uncapped, i.e.
# 4 programs per SM instead of the base kernel's 72 / 7; capped: 116 bytes of spill stores, 136 of loads)
FUSED_MAXNREG = 72
MAX_K = 16  # top-k slots a row (the copy-out moves a row's metadata as one 32-word block)
MAX_PERSIST = 2 if INTERPRET else 128  # persistent programs per peer (copy-out) / for the padding
NEVER = tl.constexpr(-7)  # compare value of the acquiring CAS: never equal to a flag, so it never writes
FLAG_CNT = tl.constexpr(0)  # int64 flags at the head of the dispatch buffer: [count flags (8)]
FLAG_EARLY = tl.constexpr(8)  # then [early count flags (8)]: only the rows-per-rank part of the row is in
LAYOUT_FLAG = tl.constexpr(3)  # ctr[3] of the dispatch side: the epoch whose layout programs (fused launch) are done
FLAG_FOLD = tl.constexpr(7)  # the combine side's `done` slot that counts the started programs of a folded launch
FLAG_CMB = tl.constexpr(0)  # the combine buffer: [combine flags (8)]
BIG: tl.constexpr = tl.constexpr(1 << 62)
# program orders of the dispatch launch (`dispatch(order=...)`, `_role_pid`): "serial" (session 4: A, B, C, D,
# E by program id, so every wait is on a role dispatched earlier: what the CPU interpreter, which runs the
# programs one after another, needs) or "mixed" (session 5; the Buffer's default since session 6, which `_overlap`
# passes: D's copy-out programs right after A on CUDA, then B and C interleaved per token block; on CPU only the
# interleave, D after them)
ORDERS = ("serial", "mixed")
# early (spinning) copy-out programs per launch, far below what the GPU holds at once: Triton 3.6 builds this
# kernel with 72-96 registers a thread at 4 warps and 1 KB of shared memory, i.e. >= 5 programs per SM, >= 660
# on 132 SMs (cuobjdump of the sm_90a cubins, R = 2 and 8), so the programs that make progress always get SMs
EARLY_MAX = 128
# combine configs (`combine(config=...)`, DEEPINFER_DEEP_EP_OVERLAP_COMBINE): tokens per reduce program.
# "base" (the default): BLOCK_T, the session-4 kernel. "wide" / "wide4" (session 5, opt-in): 2x / 4x. Why: the
# 128 persistent send programs move rows in waves of 128 * BLOCK_T rows (program j takes row blocks j, j + 128,
# ...), so the last wave (512 rows, ~4 MB) lands at the very end of the send and its 1024 reduce programs (4
# tokens x 512 columns each, a chain of dependent loads: positions, tags, rows) run after it in ~3 rounds of the
# ~400 that fit beside the senders (108 registers a thread at 4 warps: 4 programs per SM; ptxas -v of Triton 3.6's
# sm_90a PTX, R = 2, no weights: base and wide 108, wide4 167, i.e. 3 per SM). Twice the tokens per program halves
# the programs and keeps twice the bytes in flight per chain.
# Results are the same bits: each token is still summed over ranks in ascending order, in fp32, one rounding.
# Session 6 adds (opt-in): "fold" (the epoch bump folded into the combine launch: one launch instead of two; every
# program counts itself in a local counter right after reading the epoch, the last program, once every other one
# has started, stores the new epoch for the next call), "send2" (2x the persistent send programs per peer: twice
# the rows in flight per release fence), and their mixes with "wide".
# name -> (reduce rows per program in units of BLOCK_T, send programs per peer in units of MAX_PERSIST, fold)
COMBINE_CONFIGS = {
    "base": (1, 1, False),
    "wide": (2, 1, False),
    "wide4": (4, 1, False),
    "fold": (1, 1, True),
    "wide_fold": (2, 1, True),
    "send2": (1, 2, False),
    "wide_fold_send2": (2, 2, True),
}
# dispatch configs (`dispatch(config=...)`, DEEPINFER_DEEP_EP_OVERLAP_DISPATCH): "base" (this function's default,
# the session-5 kernel: the count flag once the whole exchange row is in every peer's buffer), "early" (session 6;
# the Buffer's default since session 6, which `_overlap.dispatch_config` passes: the rows-per-rank part first with
# its own flag, FLAG_EARLY, which the own-block copy, the copy-out and the padding wait for; the per-expert counts,
# summed over the layout blocks 8 at a time instead of one dependent load per block, follow with the full
# flag, which only the plan waits for). Why: rank r's own-block programs and every copy-out program spin until the
# flags of the (lower) ranks arrive, holding SM slots the pushes need; the full row's 32 block loads in series delay
# those flags), "fused" (session 6, opt-in: "early" + the layout scan's programs first in the same launch, no layout
# launch: the kernel boundary and the second launch's ramp go; see `_dispatch_kernel`). Same results, bit for bit.
DISPATCH_CONFIGS = {"base": (False, False), "early": (True, False), "fused": (True, True)}  # name -> (early, fused)
# Benchmark-only diagnostics (`dispatch(diag=...)`; WRONG results: never for real calls): the base kernel with the
# own-block copy (C) and / or the copy-out (D) programs doing nothing, to split its time beyond the push.
DIAGS = {"": 0, "no_self": 1, "no_copyout": 2, "push_only": 3}  # name -> bits: 1 skips C, 2 skips D


def _p2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 2))


# ------------------------------------------------------------------------------------------------- layout
@triton.jit
def _layout_block(blk, idx, given, layout, lpos, bcnt, bstat, ctr, t, k, per_rank, num_experts, nb,
                  R: tl.constexpr, RP: tl.constexpr, HAS_GIVEN: tl.constexpr, BT: tl.constexpr,
                  BK: tl.constexpr, BUMP: tl.constexpr):  # fmt: skip
    """Token block blk: layout, in-block places per destination, rows per destination, id range, checks."""
    toks = blk * BT + tl.arange(0, BT)
    tm = toks < t
    kk = tl.arange(0, BK)
    m2 = tm[:, None] & (kk < k)[None, :]
    ids = tl.load(idx + toks.to(tl.int64)[:, None] * k + kk[None, :], mask=m2, other=-1).to(tl.int64)
    ok = (ids >= 0) & (ids < num_experts)
    owner = tl.where(ok, ids.to(tl.int32) // per_rank, -1)
    rr = tl.arange(0, RP)
    bad = tl.zeros((RP,), dtype=tl.int64)
    for d in tl.static_range(R):
        in_rank = tl.where(tm, tl.max((owner == d).to(tl.int32), axis=1), 0)
        before = tl.cumsum(in_rank, axis=0) - in_rank
        tl.store(lpos + d * t + toks, tl.where(in_rank > 0, before, -1).to(tl.int64), mask=tm)
        tl.store(layout + toks.to(tl.int64) * R + d, in_rank.to(tl.uint8), mask=tm)
        tl.store(bcnt + d * nb + blk, tl.sum(in_rank, axis=0).to(tl.int64))
        if HAS_GIVEN:
            g = tl.load(given + toks.to(tl.int64) * R + d, mask=tm, other=0).to(tl.int32)
            miss = tl.max(tl.where(tm & (g != in_rank), 1, 0), axis=0).to(tl.int64)
            bad = tl.maximum(bad, tl.where(rr == d, miss, 0))
    lo = tl.min(tl.min(tl.where(m2, ids, BIG), axis=1), axis=0)
    hi = tl.max(tl.max(tl.where(m2, ids, -BIG), axis=1), axis=0)
    tl.store(bstat + blk * (2 + R), lo)
    tl.store(bstat + blk * (2 + R) + 1, hi)
    tl.store(bstat + blk * (2 + R) + 2 + rr, bad, mask=rr < R)
    if BUMP:  # (compile-time: the fused dispatch launch advances the epoch itself)
        if blk == 0:  # the epoch of this dispatch (read by the next launch, in stream order)
            tl.store(ctr, tl.load(ctr) + 1)


@triton.jit
def _layout_experts(q, idx, bexp, t, k, num_experts, neb, BT: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr):
    """Program (token block q // neb, expert block q % neb): tokens per expert of the block (once per token)."""
    blk = q // neb
    eids = (q % neb) * BE + tl.arange(0, BE)
    toks = blk * BT + tl.arange(0, BT)
    tm = toks < t
    hit = tl.zeros((BT, BE), dtype=tl.int32)
    for j in tl.static_range(BK):
        ids = tl.load(idx + toks.to(tl.int64) * k + j, mask=tm & ((toks * 0 + j) < k), other=-1).to(tl.int64)
        hit = tl.maximum(hit, (ids[:, None] == eids[None, :]).to(tl.int32))
    tl.store(bexp + blk * num_experts + eids, tl.sum(hit, axis=0).to(tl.int64), mask=eids < num_experts)


@triton.jit
def _layout_kernel(idx, given, layout, lpos, bcnt, bstat, bexp, ctr, t, k, per_rank, num_experts, nb, neb,
                   R: tl.constexpr, RP: tl.constexpr, HAS_GIVEN: tl.constexpr, BT: tl.constexpr,
                   BK: tl.constexpr, BE: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    if pid < nb:
        _layout_block(pid, idx, given, layout, lpos, bcnt, bstat, ctr, t, k, per_rank, num_experts, nb,
                      R, RP, HAS_GIVEN, BT, BK, True)  # fmt: skip
    else:
        _layout_experts(pid - nb, idx, bexp, t, k, num_experts, neb, BT, BK, BE)


def layout(idx: torch.Tensor, given: torch.Tensor | None, lay: torch.Tensor, lpos: torch.Tensor,
           scratch: dict[str, torch.Tensor], ctr: torch.Tensor, num_experts: int) -> None:  # fmt: skip
    """idx int64 [t, k] -> lay bool [t, R], lpos int64 [R, t] (place within the token's LAYOUT_BT block, -1:
    not sent), scratch["bcnt"] int64 [R, nb], ["bstat"] int64 [nb, 2 + R], ["bexp"] int64 [nb, E]; ctr[0] += 1.
    nb = `num_blocks(t)`; given: is_token_in_rank bool [t, R] to check, or None."""
    t, k = idx.shape
    world = lay.shape[1]
    nb, neb = num_blocks(t), triton.cdiv(num_experts, LAYOUT_BE)
    g = given.contiguous().view(torch.uint8) if given is not None else lay.view(torch.uint8)
    _layout_kernel[(nb + nb * neb,)](
        idx, g, lay.view(torch.uint8), lpos, scratch["bcnt"], scratch["bstat"], scratch["bexp"], ctr,
        t, k, num_experts // world, num_experts, nb, neb,
        R=world, RP=_p2(world), HAS_GIVEN=given is not None, BT=LAYOUT_BT, BK=_p2(k), BE=LAYOUT_BE,
    )  # fmt: skip


def num_blocks(t: int) -> int:
    """Layout blocks of t tokens (at least 1: an empty rank still publishes its zero counts)."""
    return max(1, triton.cdiv(t, LAYOUT_BT))


# ------------------------------------------------------------------------------------------------- waits
@triton.jit
def _wait(ptr, ep, ctr, spin_limit):
    """Spin until the int64 flag at ptr reaches ep (volatile polls: cheaper than atomics for thousands of
    waiting programs), then one acquiring CAS (system scope) orders our later reads after the flag."""
    v = tl.load(ptr, volatile=True)
    n = tl.program_id(0) * 0  # int32 from the start (a loop-carried value keeps its type)
    while (v < ep) & (n < spin_limit):
        v = tl.load(ptr, volatile=True)
        n += 1
    never = ep * 0 + NEVER
    tl.atomic_cas(ptr, never, never, sem="acquire", scope="sys")
    tl.debug_barrier()  # the other threads' reads come after the acquire
    if n >= spin_limit:
        tl.store(ctr + 2, 1)


@triton.jit
def _xchg_peer(peers, dd: tl.constexpr, offs, val, mask):
    """Release exchange (system scope) of val at offs of peer dd's buffer, element-wise under mask (peers: a
    tuple of 8 pointers, dd constexpr: the pick happens at compile time)."""
    tl.atomic_xchg(peers[dd] + offs, val, mask=mask, sem="release", scope="sys")


@triton.jit
def _wait_tags(me64, at, rows, rm, ncb, ep, ctr, spin_limit, NCBP: tl.constexpr):
    """Spin until the arrival tags [rows, column block] at int64 index `at` of our buffer reach ep (rows
    under rm), then acquire them all (a CAS that never writes) before the other threads read the rows."""
    cbs = tl.arange(0, NCBP)
    m2 = rm[:, None] & (cbs < ncb)[None, :]
    offs = tl.where(m2, at + rows[:, None] * ncb + cbs[None, :], at)  # masked-off lanes: a valid tag address
    tg = tl.where(m2, tl.load(me64 + offs, mask=m2, other=0, volatile=True), ep)
    n = tl.program_id(0) * 0
    while (tl.min(tl.min(tg, axis=1), axis=0) < ep) & (n < spin_limit):
        tg = tl.where(m2, tl.load(me64 + offs, mask=m2, other=0, volatile=True), ep)
        n += 1
    never = tg * 0 + NEVER
    tl.atomic_cas(me64 + offs, never, never, sem="acquire", scope="sys")
    tl.debug_barrier()
    if n >= spin_limit:
        tl.store(ctr + 2, 1)


@triton.jit
def _wait_all(me64, base, ep, ctr, spin_limit, R: tl.constexpr):
    """Wait for flags base + 0 .. base + R - 1 of our buffer."""
    for q in tl.static_range(R):
        _wait(me64 + base + q, ep, ctr, spin_limit)


@triton.jit
def _count_col(me64, cnt_at, rw, d, R: tl.constexpr, RP: tl.constexpr):
    """Column d of the count matrix in our count area: [RP] rows each source sends to d (0 past R)."""
    qq = tl.arange(0, RP)
    return tl.load(me64 + cnt_at + qq * rw + d, mask=qq < R, other=0, cache_modifier=".cg")


@triton.jit
def _done(done, j, n_prog, peers64, d, flag_at, ep, R: tl.constexpr):
    """A program of destination d's group finished its stores: the last one (a counter in local memory,
    reset for the next call) publishes flag `flag_at` = ep in d's buffer (release, system scope)."""
    tl.debug_barrier()  # every thread's stores precede the counter's release
    old = tl.atomic_add(done + j, 1, sem="acq_rel", scope="sys")
    if old == n_prog - 1:
        tl.atomic_xchg(done + j, 0)
        for dd in tl.static_range(R):
            if d == dd:
                _flag_peer(peers64, dd, flag_at, ep)


# ------------------------------------------------------------------------------------------------- dispatch
@triton.jit
def _role_publish(peers64, me64, bcnt, bstat, bexp, rank, nb, cnt_at, rw, num_experts,
                  sig0, sig1, sig2, sig3, sig4, ep,
                  R: tl.constexpr, RP: tl.constexpr, NBP: tl.constexpr, BE: tl.constexpr,
                  EARLY: tl.constexpr):  # fmt: skip
    """Our exchange row [rows per rank | tokens per expert | 5 signature words | id min | id max | bad per
    rank] into every rank's count area slot `rank`, then our count flag in every rank's buffer. EARLY: the rows
    per rank first, with our early flag (FLAG_EARLY) in every rank's buffer, and the expert sums 8 blocks a load."""
    rr = tl.arange(0, RP)
    bb = tl.arange(0, NBP)
    row = cnt_at + rank * rw
    tot = tl.zeros((RP,), dtype=tl.int64)
    lo = tl.full((NBP,), BIG, dtype=tl.int64)
    hi = tl.full((NBP,), -BIG, dtype=tl.int64)
    bad = tl.zeros((RP,), dtype=tl.int64)
    for b0 in range(0, nb, NBP):
        bm = (b0 + bb) < nb
        c = tl.load(bcnt + rr[:, None] * nb + (b0 + bb)[None, :], mask=(rr < R)[:, None] & bm[None, :], other=0)
        tot += tl.sum(c, axis=1)
        lo = tl.minimum(lo, tl.load(bstat + (b0 + bb) * (2 + R), mask=bm, other=BIG))
        hi = tl.maximum(hi, tl.load(bstat + (b0 + bb) * (2 + R) + 1, mask=bm, other=-BIG))
        s = tl.load(bstat + (b0 + bb)[None, :] * (2 + R) + 2 + rr[:, None], mask=(rr < R)[:, None] & bm[None, :],
                    other=0)  # fmt: skip
        bad = tl.maximum(bad, tl.max(s, axis=1))
    if EARLY:  # (compile-time) the part the copies need, flagged on its own
        for dd in tl.static_range(R):
            _store_peer(peers64, dd, row + rr, tot, rr < R)
        tl.debug_barrier()
        for dd in tl.static_range(R):
            _flag_peer(peers64, dd, FLAG_EARLY + rank, ep)
    tail = R + num_experts
    ee = tl.arange(0, BE)
    jj = tl.arange(0, 8)
    sig = tl.where(jj == 0, sig0, tl.where(jj == 1, sig1, tl.where(jj == 2, sig2, tl.where(jj == 3, sig3, sig4))))
    lo_v = tl.min(lo, axis=0)
    hi_v = tl.max(hi, axis=0)
    lo_v = tl.where(lo_v == BIG, 0, lo_v)  # no id at all (t == 0): a neutral range, as the fused path's
    hi_v = tl.where(hi_v == -BIG, -1, hi_v)
    sig = tl.where(jj == 5, lo_v, tl.where(jj == 6, hi_v, sig.to(tl.int64)))
    for dd in tl.static_range(R):
        _store_peer(peers64, dd, row + rr, tot, rr < R)
        _store_peer(peers64, dd, row + tail + jj, sig, jj < 7)
        _store_peer(peers64, dd, row + tail + 7 + rr, bad, rr < R)
    for e0 in range(0, num_experts, BE):
        em = (e0 + ee) < num_experts
        acc = tl.zeros((BE,), dtype=tl.int64)
        if EARLY:  # [8 blocks, BE] a load: 4 loads in series at 32 blocks instead of 32
            b8 = tl.arange(0, 8)
            for b0 in range(0, nb, 8):
                m8 = ((b0 + b8) < nb)[:, None] & em[None, :]
                v8 = tl.load(bexp + (b0 + b8)[:, None] * num_experts + e0 + ee[None, :], mask=m8, other=0)
                acc += tl.sum(v8, axis=0)
        else:
            for b in range(0, nb):
                acc += tl.load(bexp + b * num_experts + e0 + ee, mask=em, other=0)
        for dd in tl.static_range(R):
            _store_peer(peers64, dd, row + R + e0 + ee, acc, em)
    tl.debug_barrier()
    for dd in tl.static_range(R):
        _flag_peer(peers64, dd, FLAG_CNT + rank, ep)


@triton.jit
def _send_offsets(bcnt, nb, d, blk_l, R: tl.constexpr, RP: tl.constexpr, NBP: tl.constexpr):
    """(send_off(rank, d): rows we send to ranks < d, the offset of layout block blk_l in our block for d)."""
    rr = tl.arange(0, RP)
    bb = tl.arange(0, NBP)
    send_off = tl.sum(tl.zeros((RP,), dtype=tl.int64), axis=0)
    boff = send_off
    for b0 in range(0, nb, NBP):
        m = (rr < R)[:, None] & ((b0 + bb) < nb)[None, :]
        c = tl.load(bcnt + rr[:, None] * nb + (b0 + bb)[None, :], mask=m, other=0)
        send_off += tl.sum(tl.sum(tl.where((rr < d)[:, None], c, 0), axis=1), axis=0)
        pick = (rr == d)[:, None] & ((b0 + bb) < blk_l)[None, :]
        boff += tl.sum(tl.sum(tl.where(pick, c, 0), axis=1), axis=0)
    return send_off, boff


@triton.jit
def _send_block(lpos, bcnt, send_pos, send_tok, d, blk, cb, t, nb,
                R: tl.constexpr, RP: tl.constexpr, NBP: tl.constexpr, BT: tl.constexpr, LBT: tl.constexpr):  # fmt: skip
    """Token block blk for destination d: each token's place in our send block for d (`local`: its place in
    its layout block + that block's offset), and the handle's entries of those tokens (`_store_handle`: the
    programs of column block cb == 0). Returns (tokens int64 [BT], sent [BT], first [BT], local [BT])."""
    toks = blk * BT + tl.arange(0, BT)
    tm = toks < t
    send_off, boff = _send_offsets(bcnt, nb, d, (blk * BT) // LBT, R, RP, NBP)
    lp = tl.load(lpos + d * t + toks, mask=tm, other=-1)
    sent = tm & (lp >= 0)
    local = lp + boff
    first = (toks * 0 + cb) == 0
    t64 = toks.to(tl.int64)
    _store_handle(send_pos + d * t, send_tok, toks, t64, tm, sent, first, local, send_off)
    return t64, sent, first, local


@triton.jit
def _move_peer(peers32, d, src, at, w, src_rows, dst_rows, rm, cols, R: tl.constexpr):
    """Peer d's words at + dst_rows[:, None] * w + cols = src[src_rows, cols] (rows under rm, columns < w)."""
    m = rm[:, None] & (cols < w)[None, :]
    v = tl.load(src + src_rows[:, None] * w + cols[None, :], mask=m)
    for dd in tl.static_range(R):
        _store_peer(peers32, dd, at + dst_rows[:, None] * w + cols[None, :], v, _and(m, d == dd))


@triton.jit
def _meta_words(idx, wts, t64, tm, k, lo_e, per_rank, BK: tl.constexpr):
    """Top-k ids rewritten to d's local ids (-1 elsewhere) and weights (0 elsewhere) of tokens t64, as
    int32 words: ids [BT, 2 * BK] (low, high word of each int64), weights [BT, BK]."""
    kk = tl.arange(0, BK)
    m = tm[:, None] & (kk < k)[None, :]
    mine, loc, w = _local_topk(idx, wts, t64, m, kk, k, lo_e, per_rank)
    loc = tl.where(mine, loc, -1)
    w_bits = tl.where(mine, w, 0.0).to(tl.int32, bitcast=True)
    return (loc & 0xFFFFFFFF).to(tl.int32), (loc >> 32).to(tl.int32), w_bits


@triton.jit
def _role_push(q, peers32, peers64, lpos, bcnt, x0, x1, idx, wts, send_pos, send_tok, rank, t, k, nb,
               cap, per_rank, ep, par, ox0, ox1, oid, ow, osrc, otag, w0, w1, nbt, ncb,
               NX: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, NBP: tl.constexpr, BT: tl.constexpr,
               BW: tl.constexpr, BK: tl.constexpr, LBT: tl.constexpr):  # fmt: skip
    """B: one (peer, token block, column block) of our rows into the peer's region of source `rank`, then
    their arrival tags (epoch, release): the peer copies them out as soon as they are there."""
    per_dest = nbt * ncb
    j = q // per_dest
    blk = (q % per_dest) // ncb
    cb = q % ncb
    d = (rank + 1 + j) % R
    t64, sent, first, local = _send_block(lpos, bcnt, send_pos, send_tok, d, blk, cb, t, nb, R, RP, NBP, BT, LBT)
    valid = sent & (local < cap)  # rows past W are dropped (E flags the overflow)
    row = (rank * cap + local).to(tl.int64)  # our region (source `rank`) in d's buffer
    pb = (ep % 2) * par  # this parity's regions (int32 words)
    cols = cb * BW + tl.arange(0, BW)
    _move_peer(peers32, d, x0, ox0 + pb, w0, t64, row, valid, cols, R)
    if NX == 2:
        _move_peer(peers32, d, x1, ox1 + pb, w1, t64, row, valid, cols, R)
    lo_w, hi_w, w_bits = _meta_words(idx, wts, t64, valid & first, k, d * per_rank, per_rank, BK)
    kk = tl.arange(0, BK)
    mk = (valid & first)[:, None] & (kk < k)[None, :]
    ms = valid & first
    for dd in tl.static_range(R):
        go = d == dd
        _store_peer(peers32, dd, oid + pb + row[:, None] * (2 * k) + 2 * kk[None, :], lo_w, _and(mk, go))
        _store_peer(peers32, dd, oid + pb + row[:, None] * (2 * k) + 2 * kk[None, :] + 1, hi_w, _and(mk, go))
        _store_peer(peers32, dd, ow + pb + row[:, None] * k + kk[None, :], w_bits, _and(mk, go))
        _store_peer(peers32, dd, osrc + pb + row * 2, (t64 & 0xFFFFFFFF).to(tl.int32), _and(ms, go))
        _store_peer(peers32, dd, osrc + pb + row * 2 + 1, (t64 >> 32).to(tl.int32), _and(ms, go))
    tl.debug_barrier()  # every thread's row stores precede the tags' release
    tag = otag + row * ncb + cb  # int64 index: [row, column block] of this parity's tags
    for dd in tl.static_range(R):
        _xchg_peer(peers64, dd, tag, row * 0 + ep, _and(valid, d == dd))


@triton.jit
def _role_self(q, me64, ctr, lpos, bcnt, x0, x1, idx, wts, send_pos, send_tok, o0, o1, oidx, ow, osrc,
               rank, t, k, nb, cap, per_rank, ep, cnt_at, rw, w0, w1, ncb, spin_limit,
               NX: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, NBP: tl.constexpr, BT: tl.constexpr,
               BW: tl.constexpr, BK: tl.constexpr, LBT: tl.constexpr, FW: tl.constexpr):  # fmt: skip
    """C: one (token block, column block) of our own block into the outputs at recv_off(rank, rank), known
    once the lower ranks' counts are in (their flags at FW: FLAG_CNT, or FLAG_EARLY)."""
    blk = q // ncb
    cb = q % ncb
    for s in tl.static_range(R):
        if s < rank:
            _wait(me64 + FW + s, ep, ctr, spin_limit)
    col = _count_col(me64, cnt_at, rw, rank, R, RP)
    qq = tl.arange(0, RP)
    row0 = tl.sum(tl.where(qq < rank, col, 0), axis=0)
    t64, sent, first, local = _send_block(lpos, bcnt, send_pos, send_tok, rank, blk, cb, t, nb, R, RP, NBP, BT, LBT)
    r = (row0 + local).to(tl.int64)
    valid = sent & (r < cap)
    cols = cb * BW + tl.arange(0, BW)
    _move(x0, o0, w0, t64, r, valid, cols)
    if NX == 2:
        _move(x1, o1, w1, t64, r, valid, cols)
    _store_meta(idx, wts, oidx, ow, osrc, t64, r, valid & first, k, rank * per_rank, per_rank, BK)


@triton.jit
def _copy_words(src, dst, w, src_rows, dst_rows, rm, cols):
    m = rm[:, None] & (cols < w)[None, :]
    v = tl.load(src + src_rows[:, None] * w + cols[None, :], mask=m, cache_modifier=".cg")
    tl.store(dst + dst_rows[:, None] * w + cols[None, :], v, mask=m)


@triton.jit
def _role_recv(q, me32, me64, ctr, o0, o1, oid32, ow32, osrc32, rank, k, cap, ep, par, cnt_at, rw,
               ox0, ox1, oid, ow, osrc, otag, w0, w1, ncb, nper, spin_limit,
               NX: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr,
               BW: tl.constexpr, NCBP: tl.constexpr, FW: tl.constexpr):  # fmt: skip
    """D: persistent program `q % nper` of peer q // nper: once every count is in, copy that peer's rows
    from our buffer (its region, this parity) into the outputs at recv_off(src, rank), each block of rows
    as soon as its arrival tags say it landed (while the rest is still in flight)."""
    j = q // nper
    sub = q % nper
    src = (rank + 1 + j) % R
    _wait_all(me64, FW, ep, ctr, spin_limit, R)
    col = _count_col(me64, cnt_at, rw, rank, R, RP)
    qq = tl.arange(0, RP)
    row0 = tl.sum(tl.where(qq < src, col, 0), axis=0)
    n = tl.sum(tl.where(qq == src, col, 0), axis=0)
    base = (src * cap).to(tl.int64)  # its region in our buffer
    pb = (ep % 2) * par  # this parity's regions (int32 words)
    n_blk = ((n + BT - 1) // BT).to(tl.int32)
    for rb in range(sub, n_blk, nper):
        i = (rb * BT + tl.arange(0, BT)).to(tl.int64)
        rm = (i < n) & (row0 + i < cap)
        _wait_tags(me64, otag, base + i, rm, ncb, ep, ctr, spin_limit, NCBP)
        for cb in range(0, ncb):
            cols = cb * BW + tl.arange(0, BW)
            _copy_words(me32 + ox0 + pb, o0, w0, base + i, row0 + i, rm, cols)
            if NX == 2:
                _copy_words(me32 + ox1 + pb, o1, w1, base + i, row0 + i, rm, cols)
        c2 = tl.arange(0, 32)  # ids (2k words), weights (k) and source (2) of a row: k <= 16
        _copy_words(me32 + oid + pb, oid32, 2 * k, base + i, row0 + i, rm, c2)
        _copy_words(me32 + ow + pb, ow32, k, base + i, row0 + i, rm, c2)
        _copy_words(me32 + osrc + pb, osrc32, 2, base + i, row0 + i, rm, c2)


@triton.jit
def _role_pad(q, me64, ctr, oid32, ow32, osrc32, rank, k, cap, ep, cnt_at, rw, npad, spin_limit,
              R: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr, FW: tl.constexpr):  # fmt: skip
    """E (padding): rows from the received count to W: ids -1, weights 0, source -1 (int32 words)."""
    _wait_all(me64, FW, ep, ctr, spin_limit, R)
    col = _count_col(me64, cnt_at, rw, rank, R, RP)
    n = tl.minimum(tl.sum(col, axis=0), cap)
    c2 = tl.arange(0, 32)
    for rb in range(q, (cap + BT - 1) // BT, npad):
        rows = (rb * BT + tl.arange(0, BT)).to(tl.int64)
        rm = (rows >= n) & (rows < cap)
        _fill(oid32, 2 * k, rows, rm, c2, -1)
        _fill(ow32, k, rows, rm, c2, 0)
        _fill(osrc32, 2, rows, rm, c2, -1)


@triton.jit
def _role_plan(me64, ctr, mat, counts, rank, per_rank, num_experts, align, cap, ep, cnt_at, rw, spin_limit,
               R: tl.constexpr, RP: tl.constexpr, EP: tl.constexpr):  # fmt: skip
    """E (last program): nosync.plan from our count area: M into mat, rows received, error bits, counts."""
    _wait_all(me64, FLAG_CNT, ep, ctr, spin_limit, R)
    _plan_area(me64 + cnt_at, rw, mat, counts, rank, per_rank, num_experts, align, cap, R, RP, EP, ".cg")


@triton.jit
def _role_pid(pid, n_push, n_self, n_early, mix, R: tl.constexpr):
    """The program id of the serial order (A, B..., C..., D..., E...) that program `pid` plays.

    mix == 0 and n_early == 0: pid itself (the session-4 order). Otherwise (`ORDERS["mixed"]`): after A, the
    first n_early programs are copy-out programs D (they then sit on SMs waiting for tags, so the copy-out
    follows the peer's push from its start instead of getting SMs only once every push and own-block program
    was dispatched), then, with mix, the pushes and own-block copies interleaved per token block (R - 1 pushes,
    one per peer, then the block's own copy: NVLink-bound and HBM-bound work side by side), then the rest of D
    (n_recv - n_early programs), E unchanged. All int32 arithmetic (one type in every branch)."""
    u = pid - 1 - n_early  # place among the push / own-block programs
    g = u // R
    p = u % R
    mixed = tl.where(p < R - 1, 1 + p * n_self + g, 1 + n_push + g)
    mid = tl.where(mix != 0, mixed, 1 + u)
    v = tl.where((pid >= 1) & (pid < 1 + n_early), n_push + n_self + pid, mid)
    return tl.where((pid == 0) | (pid >= 1 + n_early + n_push + n_self), pid, v)


@triton.jit
def _dispatch_roles(
    raw, ep, n_prog,     peers32, peers64, me32, me64, ctr, done, lpos, bcnt, bstat, bexp,
    x0, x1, idx, wts, send_pos, send_tok, o0, o1, oidx, ow, osrc, oid32, ow32, osrc32, mat, counts,
    rank, t, k, nb, cap, per_rank, num_experts, align, cnt0, rw, par, ox0, ox1, oid, oww, osr, otag0, tpar, w0, w1,
    sig0, sig1, sig2, sig3, sig4, nbt, ncb, nper, npad, n_early, spin_limit,
    NX: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, NBP: tl.constexpr, BT: tl.constexpr,
    BW: tl.constexpr, BK: tl.constexpr, LBT: tl.constexpr, BE: tl.constexpr, EP: tl.constexpr, NCBP: tl.constexpr,
    MIXED: tl.constexpr, EARLY: tl.constexpr, FW: tl.constexpr, FUSED: tl.constexpr, DIAG: tl.constexpr,
):  # fmt: skip
    """The roles of the dispatch launch for program `raw` (in launch order) of epoch ep (see `_dispatch_kernel`)."""
    # Roles by program id (see the module docstring; `_role_pid` maps the launch order onto them); the runtime
    # if/else chain only calls helpers (Triton 3.6 rejects a name typed differently in two branches), each
    # helper derives its own indices.
    cnt_at = cnt0 + (ep % 2) * R * rw  # this parity's count area (int64 words)
    otag = otag0 + (ep % 2) * tpar  # this parity's arrival tags (int64 words)
    n_push = (R - 1) * nbt * ncb
    n_self = nbt * ncb
    n_recv = (R - 1) * nper
    if MIXED:  # compile-time: the serial order's code is the session-4 kernel's
        pid = _role_pid(raw, n_push, n_self, n_early, 1, R)
    else:
        pid = raw
    if FUSED:  # (compile-time) A, B and C read the layout programs' results: wait for all of them
        if pid < 1 + n_push + n_self:
            _wait(ctr + LAYOUT_FLAG, ep, ctr, spin_limit)
    if pid == 0:
        _role_publish(peers64, me64, bcnt, bstat, bexp, rank, nb, cnt_at, rw, num_experts,
                      sig0, sig1, sig2, sig3, sig4, ep, R, RP, NBP, BE, EARLY)  # fmt: skip
    elif pid < 1 + n_push:
        _role_push(pid - 1, peers32, peers64, lpos, bcnt, x0, x1, idx, wts, send_pos, send_tok, rank, t,
                   k, nb, cap, per_rank, ep, par, ox0, ox1, oid, oww, osr, otag, w0, w1, nbt, ncb,
                   NX, R, RP, NBP, BT, BW, BK, LBT)  # fmt: skip
    elif pid < 1 + n_push + n_self:
        if DIAG % 2 == 0:  # (compile-time; DIAGS: benchmark-only)
            _role_self(pid - 1 - n_push, me64, ctr, lpos, bcnt, x0, x1, idx, wts, send_pos, send_tok, o0, o1, oidx,
                       ow, osrc, rank, t, k, nb, cap, per_rank, ep, cnt_at, rw, w0, w1, ncb, spin_limit,
                       NX, R, RP, NBP, BT, BW, BK, LBT, FW)  # fmt: skip
    elif pid < 1 + n_push + n_self + n_recv:
        if DIAG < 2:  # (compile-time)
            _role_recv(pid - 1 - n_push - n_self, me32, me64, ctr, o0, o1, oid32, ow32, osrc32, rank, k, cap, ep,
                       par, cnt_at, rw, ox0, ox1, oid, oww, osr, otag, w0, w1, ncb, nper, spin_limit,
                       NX, R, RP, BT, BW, NCBP, FW)  # fmt: skip
    elif pid < 1 + n_push + n_self + n_recv + npad:
        _role_pad(pid - 1 - n_push - n_self - n_recv, me64, ctr, oid32, ow32, osrc32, rank, k, cap, ep,
                  cnt_at, rw, npad, spin_limit, R, RP, BT, FW)  # fmt: skip
    else:
        _role_plan(me64, ctr, mat, counts, rank, per_rank, num_experts, align, cap, ep, cnt_at, rw, spin_limit,
                   R, RP, EP)  # fmt: skip
        if FUSED:  # (compile-time) the last program: the epoch for the next call, once every program has read it
            _wait_started(done, n_prog - 1, ctr, spin_limit)
            tl.store(done, 0)
            tl.store(ctr, ep)


@triton.jit
def _dispatch_kernel(
    peers32, peers64, me32, me64, ctr, done, lpos, bcnt, bstat, bexp,
    x0, x1, idx, wts, send_pos, send_tok, o0, o1, oidx, ow, osrc, oid32, ow32, osrc32, mat, counts,
    rank, t, k, nb, cap, per_rank, num_experts, align, cnt0, rw, par, ox0, ox1, oid, oww, osr, otag0, tpar, w0, w1,
    sig0, sig1, sig2, sig3, sig4, nbt, ncb, nper, npad, n_early, spin_limit,
    NX: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, NBP: tl.constexpr, BT: tl.constexpr,
    BW: tl.constexpr, BK: tl.constexpr, LBT: tl.constexpr, BE: tl.constexpr, EP: tl.constexpr, NCBP: tl.constexpr,
    MIXED: tl.constexpr, EARLY: tl.constexpr, FW: tl.constexpr, FUSED: tl.constexpr,
    given, layout, n_layout, neb, HAS_GIVEN: tl.constexpr, LBE: tl.constexpr, DIAG: tl.constexpr,
):  # fmt: skip
    # FUSED (compile-time; "fused" in DISPATCH_CONFIGS): the layout scan's programs run first in this launch
    # (no layout launch before it); the epoch is ctr[0] + 1 here, every program but the last counts itself in
    # done[0] once it has read ctr[0] (the count depends on the value read), the last program stores the epoch;
    # the layout programs count themselves in done[2] as they finish, the last of them sets ctr[LAYOUT_FLAG] = ep
    # (release), which A, B and C wait for. Otherwise: the session-5 kernel (the layout launch advanced ctr[0]).
    if FUSED:
        raw = tl.program_id(0)
        n_prog = tl.num_programs(0)
        ep = tl.load(ctr).to(tl.int64) + 1
        if raw < n_prog - 1:
            tl.atomic_add(done, (ep >= 0).to(tl.int32), sem="relaxed")
        if raw < n_layout:
            _layout_prog(raw, idx, given, layout, lpos, bcnt, bstat, bexp, ctr, done, t, k, per_rank, num_experts,
                         nb, neb, n_layout, ep, R, RP, HAS_GIVEN, LBT, BK, LBE)  # fmt: skip
        else:
            _dispatch_roles(
                raw - n_layout, ep, n_prog, peers32, peers64, me32, me64, ctr, done, lpos, bcnt, bstat, bexp, x0, x1,
                idx, wts, send_pos, send_tok, o0, o1, oidx, ow, osrc, oid32, ow32, osrc32, mat, counts, rank, t, k,
                nb, cap, per_rank, num_experts, align, cnt0, rw, par, ox0, ox1, oid, oww, osr, otag0, tpar, w0, w1,
                sig0, sig1, sig2, sig3, sig4, nbt, ncb, nper, npad, n_early, spin_limit, NX, R, RP, NBP, BT, BW, BK,
                LBT, BE, EP, NCBP, MIXED, EARLY, FW, FUSED, DIAG
            )  # fmt: skip
    else:
        _dispatch_roles(
            tl.program_id(0), tl.load(ctr).to(tl.int64), 0, peers32, peers64, me32, me64, ctr, done, lpos, bcnt,
            bstat, bexp, x0, x1, idx, wts, send_pos, send_tok, o0, o1, oidx, ow, osrc, oid32, ow32, osrc32, mat,
            counts, rank, t, k, nb, cap, per_rank, num_experts, align, cnt0, rw, par, ox0, ox1, oid, oww, osr, otag0,
            tpar, w0, w1, sig0, sig1, sig2, sig3, sig4, nbt, ncb, nper, npad, n_early, spin_limit, NX, R, RP, NBP, BT,
            BW, BK, LBT, BE, EP, NCBP, MIXED, EARLY, FW, FUSED, DIAG
        )  # fmt: skip


@triton.jit
def _layout_prog(pid, idx, given, layout, lpos, bcnt, bstat, bexp, ctr, done, t, k, per_rank, num_experts, nb, neb,
                 n_layout, ep, R: tl.constexpr, RP: tl.constexpr, HAS_GIVEN: tl.constexpr, BT: tl.constexpr,
                 BK: tl.constexpr, BE: tl.constexpr):  # fmt: skip
    """A layout program inside the fused dispatch launch (`_layout_kernel`'s work, no epoch bump), then counted
    in done[2]; the last one to finish resets the count and sets ctr[LAYOUT_FLAG] = ep (release)."""
    if pid < nb:
        _layout_block(pid, idx, given, layout, lpos, bcnt, bstat, ctr, t, k, per_rank, num_experts, nb,
                      R, RP, HAS_GIVEN, BT, BK, False)  # fmt: skip
    else:
        _layout_experts(pid - nb, idx, bexp, t, k, num_experts, neb, BT, BK, BE)
    tl.debug_barrier()  # every thread's stores precede the count's release
    old = tl.atomic_add(done + 2, 1, sem="acq_rel")
    if old == n_layout - 1:
        tl.atomic_xchg(done + 2, 0)
        tl.atomic_xchg(ctr + LAYOUT_FLAG, ep, sem="release")


def dispatch(bufs: list[torch.Tensor], rank: int, ctr: torch.Tensor, done: torch.Tensor, lay, cap: int,
             lpos: torch.Tensor, scratch: dict[str, torch.Tensor], xs: list[torch.Tensor], idx: torch.Tensor,
             wts: torch.Tensor, handle: tuple[torch.Tensor, torch.Tensor], outs: list[torch.Tensor],
             meta_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor], mat: torch.Tensor, counts: torch.Tensor,
             num_experts: int, align: int, sig: list[int], spin_limit: int, order: str = "serial",
             config: str = "base", given: torch.Tensor | None = None,
             layout: torch.Tensor | None = None, diag: str = "") -> None:  # fmt: skip
    """The overlapped dispatch launch (roles A..E, see the module docstring), programs in `order` (`ORDERS`),
    built as `config` says (`DISPATCH_CONFIGS`; the same results either way). A "fused" config runs the layout
    scan itself (given: is_token_in_rank bool [t, R] to check or None, layout: bool [t, R] out, as `layout`
    takes them; the caller skips `layout`); the others need `layout` run first (it advances the epoch).

    bufs: every rank's uint8 buffer (this rank's included); lay: `_overlap.DispatchLayout`; xs: 1 or 2 payload
    fields as int32 words [t, w]; outs: the payload outputs int32 [W, w]; meta_out: (ids int64 [W, k],
    weights fp32 [W, k], source int64 [W, 1]); handle: (send_pos int64 [R, t], send_tok int64 [R * t]);
    mat int64 [R * R + 2], counts int32 [E / R] (out, as nosync.plan); idx int64 [t, k], wts fp32 [t, k].
    """
    world = len(bufs)
    t, k = idx.shape
    if k > MAX_K:
        raise ValueError(f"topk_idx: the overlapped dispatch moves at most {MAX_K} top-k slots a row, got k = {k}")
    peers32 = _peers8([b.view(torch.int32) for b in bufs])
    peers64 = _peers8([b.view(torch.int64) for b in bufs])
    x0, x1 = xs[0], xs[-1]
    o0, o1 = outs[0], outs[-1]
    width = max(x0.shape[1], x1.shape[1])
    nb, nbt, ncb = num_blocks(t), max(1, triton.cdiv(t, BLOCK_T)), triton.cdiv(width, BLOCK_W)
    if order not in ORDERS:
        raise ValueError(f"order: expected one of {sorted(ORDERS)}, got {order!r}")
    if config not in DISPATCH_CONFIGS:
        raise ValueError(f"config: expected one of {list(DISPATCH_CONFIGS)}, got {config!r}")
    early, fused = DISPATCH_CONFIGS[config]
    if diag not in DIAGS:
        raise ValueError(f"diag: expected one of {list(DIAGS)}, got {diag!r}")
    if fused and layout is None:
        raise ValueError(f"layout: the {config!r} dispatch writes the layout rows, expected a bool [t, R] tensor")
    nper = npad = max(1, min(MAX_PERSIST, triton.cdiv(cap, BLOCK_T)))
    n_early, mixed = 0, order == "mixed"
    if mixed and bufs[rank].device.type == "cuda":  # early copy-out programs: at most EARLY_MAX spinning ones
        nper = max(1, min(nper, EARLY_MAX // (world - 1)))
        n_early = (world - 1) * nper
    grid = 1 + (world - 1) * nbt * ncb + nbt * ncb + (world - 1) * nper + npad + 1
    neb = triton.cdiv(num_experts, FUSED_BE)
    n_layout = nb + nb * neb if fused else 0
    lay_u8 = layout.view(torch.uint8) if fused else counts  # (unused unless fused)
    given_u8 = given.contiguous().view(torch.uint8) if fused and given is not None else lay_u8
    oidx, ow, osrc = meta_out
    per_rank = num_experts // world
    cap_regs = {"maxnreg": FUSED_MAXNREG} if fused and not INTERPRET else {}
    _dispatch_kernel[(n_layout + grid,)](
        peers32, peers64, bufs[rank].view(torch.int32), bufs[rank].view(torch.int64), ctr, done, lpos,
        scratch["bcnt"], scratch["bstat"], scratch["bexp"], x0, x1, idx, wts, handle[0], handle[1], o0, o1,
        oidx, ow, osrc, oidx.view(torch.int32), ow.view(torch.int32), osrc.view(torch.int32), mat, counts,
        rank, t, k, nb, cap, per_rank, num_experts, align, lay.cnt, lay.rw, lay.par, lay.x0, lay.x1, lay.ids,
        lay.wts, lay.src, lay.tags, lay.tpar, x0.shape[1], x1.shape[1], *sig, nbt, ncb, nper, npad, n_early, spin_limit,
        NX=len(xs), R=world, RP=_p2(world), NBP=min(_p2(nb), 128), BT=BLOCK_T, BW=BLOCK_W, BK=_p2(k),
        LBT=LAYOUT_BT, BE=256, EP=_p2(per_rank), NCBP=_p2(ncb), MIXED=mixed, EARLY=early,
        FW=FLAG_EARLY.value if early else FLAG_CNT.value, FUSED=fused, given=given_u8, layout=lay_u8,
        n_layout=n_layout, neb=neb, HAS_GIVEN=fused and given is not None, LBE=FUSED_BE, DIAG=DIAGS[diag], **cap_regs,
    )  # fmt: skip
    if ncb != lay.ncb:
        raise ValueError(f"lay: laid out for {lay.ncb} column blocks of tags, the payload needs {ncb}")


# ------------------------------------------------------------------------------------------------- combine
@triton.jit
def _bump_kernel(ctr, which):
    tl.store(ctr + which, tl.load(ctr + which) + 1)


def bump(ctr: torch.Tensor, which: int) -> None:
    """ctr[which] += 1 on the device (one program): the epoch of the next combine."""
    _bump_kernel[(1,)](ctr, which)


@triton.jit
def _role_csend(q, peers32, peers64, done, mat, y0, y1, rank, cap, ep, par, oy0, oy1, otag, w0, w1, ncb, nper,
                NX: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr,
                BW: tl.constexpr, NCBP: tl.constexpr):  # fmt: skip
    """S: persistent program `q % nper` of peer q // nper: the rows we received from it (y rows recv_off ..)
    back into its combine region (this parity) at their send positions send_off .., each block of rows
    followed by its arrival tags (epoch, release); the group's last program then sets our combine flag there."""
    j = q // nper
    sub = q % nper
    src = (rank + 1 + j) % R
    send_off, recv_off, n = _offsets(mat, src, rank, R, RP)
    pb = (ep % 2) * par  # this parity's regions (int32 words)
    base = send_off
    for rb in range(sub, ((n + BT - 1) // BT).to(tl.int32), nper):
        i = (rb * BT + tl.arange(0, BT)).to(tl.int64)
        rm = (i < n) & (recv_off + i < cap)
        for cb in range(0, ncb):
            cols = cb * BW + tl.arange(0, BW)
            _move_peer(peers32, src, y0, oy0 + pb, w0, recv_off + i, base + i, rm, cols, R)
            if NX == 2:
                _move_peer(peers32, src, y1, oy1 + pb, w1, recv_off + i, base + i, rm, cols, R)
        tl.debug_barrier()  # the block's row stores precede its tags' release
        cbs = tl.arange(0, NCBP)
        tm = rm[:, None] & (cbs < ncb)[None, :]
        tag = otag + (base + i)[:, None] * ncb + cbs[None, :]
        for dd in tl.static_range(R):
            _xchg_peer(peers64, dd, tag, tag * 0 + ep, _and(tm, src == dd))
    _done(done, j, nper, peers64, src, FLAG_CMB + rank, ep, R)


@triton.jit
def _role_reduce(q, me64, ctr, pos, mat, back, y, out, rank, t, width, ep, par, par_e, off_e, otag, ncb, ncb_s,
                 spin_limit, R: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr, BW: tl.constexpr,
                 BF16_BITS: tl.constexpr, NCBP: tl.constexpr):  # fmt: skip
    """R: one (token block, column block) of a field: out[t] = sum over ranks d ascending of row(pos[d, t])
    in fp32, waiting for the arrival tags of d's rows just before reading them (ours are in y), one rounding.
    ncb_s: column blocks of the send (tags per row)."""
    self_lo, recv_lo, n_self = _offsets(mat, rank, rank, R, RP)
    self_hi = self_lo + n_self
    shift = recv_lo - self_lo
    base = off_e + (ep % 2) * par_e
    toks = (q // ncb) * BT + tl.arange(0, BT)
    cols = (q % ncb) * BW + tl.arange(0, BW)
    tmask = toks < t
    cmask = (cols < width)[None, :]
    acc = tl.zeros((BT, BW), dtype=tl.float32)
    for d in tl.static_range(R):  # ascending rank: the reference's summation order
        p = tl.load(pos + d * t + toks, mask=tmask, other=-1).to(tl.int64)
        mine = (p >= self_lo) & (p < self_hi)
        theirs = (p >= 0) & ~mine
        if d != rank:
            _wait_tags(me64, otag, p, theirs, ncb_s, ep, ctr, spin_limit, NCBP)
        a = tl.load(back + base + p[:, None] * width + cols[None, :], mask=theirs[:, None] & cmask, other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        b = tl.load(y + (p + shift)[:, None] * width + cols[None, :], mask=mine[:, None] & cmask, other=0.0)
        acc += tl.where(mine[:, None], b.to(tl.float32), a.to(tl.float32))
    offs = toks.to(tl.int64)[:, None] * width + cols[None, :]
    if BF16_BITS:  # out is an int16 view of bf16: round to nearest even by hand (the interpreter truncates)
        bits = acc.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(acc != acc, 0x7FC0, rounded)
        tl.store(out + offs, rounded.to(tl.int16), mask=tmask[:, None] & cmask)
    else:
        tl.store(out + offs, acc.to(out.dtype.element_ty), mask=tmask[:, None] & cmask)


@triton.jit
def _combine_kernel(
    peers32, peers64, me64, ctr, done, mat, pos, y0, y1, back0, back1, out0, out1, yv0, yv1,
    rank, t, cap, par, oy0, oy1, otag0, tpar, w0, w1, h0, h1, par_e0, par_e1, off_e0, off_e1, ncb, ncb0, ncb1, nper,
    nbt, n_red1, spin_limit,
    NX: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr, BW: tl.constexpr,
    BW0: tl.constexpr, BW1: tl.constexpr, BF16_0: tl.constexpr, NCBP: tl.constexpr, BTR: tl.constexpr,
    FOLD: tl.constexpr,
):  # fmt: skip
    # BT: rows per send step; BTR: tokens per reduce program (`COMBINE_CONFIGS`; nbt counts blocks of BTR)
    # FOLD: no bump launch before this one: the epoch is ctr[1] + 1 here, and every program but the last counts
    # itself in done[FLAG_FOLD] once it has read ctr[1] (the count depends on the value read, so it cannot land
    # before the read); the last program, once all the others have counted, stores the epoch into ctr[1]
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    if FOLD:
        ep = tl.load(ctr + 1).to(tl.int64) + 1
        if pid < n_prog - 1:
            tl.atomic_add(done + FLAG_FOLD, (ep >= 0).to(tl.int32), sem="relaxed")
    else:
        ep = tl.load(ctr + 1).to(tl.int64)
    otag = otag0 + (ep % 2) * tpar  # this parity's arrival tags (int64 words)
    n_send = (R - 1) * nper
    n_red0 = nbt * ncb0
    if pid < n_send:
        _role_csend(pid, peers32, peers64, done, mat, y0, y1, rank, cap, ep, par, oy0, oy1, otag, w0, w1, ncb,
                    nper, NX, R, RP, BT, BW, NCBP)  # fmt: skip
    elif pid < n_send + n_red0:
        _role_reduce(pid - n_send, me64, ctr, pos, mat, back0, yv0, out0, rank, t, h0, ep, par, par_e0, off_e0,
                     otag, ncb0, ncb, spin_limit, R, RP, BTR, BW0, BF16_0, NCBP)  # fmt: skip
    elif pid < n_send + n_red0 + n_red1:
        _role_reduce(pid - n_send - n_red0, me64, ctr, pos, mat, back1, yv1, out1, rank, t, h1, ep, par, par_e1,
                     off_e1, otag, ncb1, ncb, spin_limit, R, RP, BTR, BW1, False, NCBP)  # fmt: skip
    else:  # the last program: every peer's whole send is in (a rank that reads no peer row still waits here,
        # so no rank can run two calls ahead of a peer still reading its buffer)
        for d in tl.static_range(R):
            if d != rank:
                _wait(me64 + FLAG_CMB + d, ep, ctr, spin_limit)
        if FOLD:
            _wait_started(done + FLAG_FOLD, n_prog - 1, ctr, spin_limit)
            tl.store(done + FLAG_FOLD, 0)  # every other program has counted: reset for the next call
            tl.store(ctr + 1, ep)  # read by the next combine (stream order)


@triton.jit
def _wait_started(ptr, n, ctr, spin_limit):
    """Spin until the int32 counter at ptr reaches n (volatile polls; the value is all that is needed)."""
    v = tl.load(ptr, volatile=True)
    c = tl.program_id(0) * 0
    while (v < n) & (c < spin_limit):
        v = tl.load(ptr, volatile=True)
        c += 1
    if c >= spin_limit:
        tl.store(ctr + 2, 1)


def combine(bufs: list[torch.Tensor], rank: int, ctr: torch.Tensor, done: torch.Tensor, lay, cap: int,
            pos: torch.Tensor, mat: torch.Tensor, fields: list[torch.Tensor], words: list[torch.Tensor],
            outs: list[torch.Tensor], spin_limit: int, config: str = "base") -> None:  # fmt: skip
    """The overlapped combine launch (after `bump(ctr, 1)`): roles S and R (see the module docstring).

    fields: y [W, h] (bf16 / fp16 / fp32) and optionally the weights fp32 [W, k]; words: their int32 views;
    outs: [t, h] / [t, k] of the same dtypes (out); pos: the handle's send_pos int64 [R, t]; mat: its
    device_counts; lay: `_overlap.CombineLayout` (word offsets of the field regions, parity stride); config:
    a key of `COMBINE_CONFIGS` (tokens per reduce program, send programs, folded epoch bump: the same results,
    bit for bit). A config that does not fold needs `bump(ctr, 1)` first; one that folds must not have it.
    """
    if config not in COMBINE_CONFIGS:
        raise ValueError(f"config: expected one of {sorted(COMBINE_CONFIGS)}, got {config!r}")
    red, send, fold = COMBINE_CONFIGS[config]
    btr = BLOCK_T * red
    world, t = pos.shape
    y0, y1 = words[0], words[-1]
    f0, f1 = fields[0], fields[-1]
    o0, o1 = outs[0], outs[-1]
    h0, h1 = f0.shape[1], f1.shape[1]
    bw0, bw1 = min(512, _p2(h0)), min(512, _p2(h1))
    ncb, ncb0, ncb1 = triton.cdiv(max(y0.shape[1], y1.shape[1]), BLOCK_W), triton.cdiv(h0, bw0), triton.cdiv(h1, bw1)
    nbt = max(1, triton.cdiv(t, btr))  # >= 1 waiting program even with no tokens (see the docstring)
    nper = max(1, min(MAX_PERSIST * send, triton.cdiv(cap, BLOCK_T)))
    n_red1 = nbt * ncb1 if len(fields) == 2 else 0
    grid = (world - 1) * nper + nbt * ncb0 + n_red1 + 1
    if ncb != lay.ncb:
        raise ValueError(f"lay: laid out for {lay.ncb} column blocks of tags, the rows need {ncb}")
    me = bufs[rank]
    # our buffer viewed in each field's dtype: the reduction reads values (offsets in those elements)
    back0, back1 = me.view(f0.dtype), me.view(f1.dtype)
    e0, e1 = 4 // f0.element_size(), 4 // f1.element_size()  # elements per int32 word
    bf16 = f0.dtype == torch.bfloat16
    _combine_kernel[(grid,)](
        _peers8([b.view(torch.int32) for b in bufs]), _peers8([b.view(torch.int64) for b in bufs]),
        me.view(torch.int64), ctr, done, mat, pos, y0, y1, back0, back1,
        o0.view(torch.int16) if bf16 else o0, o1, f0, f1,
        rank, t, cap, lay.par, lay.y0, lay.y1, lay.tags, lay.tpar, y0.shape[1], y1.shape[1], h0, h1,
        lay.par * e0, lay.par * e1, lay.y0 * e0, lay.y1 * e1, ncb, ncb0, ncb1, nper, nbt, n_red1, spin_limit,
        NX=len(fields), R=world, RP=_p2(world), BT=BLOCK_T, BW=BLOCK_W, BW0=bw0, BW1=bw1, BF16_0=bf16,
        NCBP=_p2(ncb), BTR=btr, FOLD=fold,
    )  # fmt: skip
