"""Triton kernels of the low-latency (decode) fast path: pushes into peers' buffers, epoch flags, no host sync.

Every rank's LL buffer is viewed as int32 words; `peers` are up to 8 such views (peer d's buffer, mapped
on this device: CUDA IPC / symmetric memory, or a shared-memory file on CPU). A kernel picks peer d with a
constexpr chain (`_store_peer`), so pointers keep their compile-time alignment (no int-to-pointer casts).

Synchronisation is graph-safe: `ctr` int32 [4] in local memory holds [dispatch epoch, combine epoch,
timeout flag, -]. A send kernel works on epoch ctr[which] + 1 (parity (epoch % 2) picks the staging half,
so a fast rank's next call cannot overwrite rows a slow peer is still reading), `signal` increments the
epoch and writes it into slot [which, rank] of every peer's flag row (release, system scope), and a
receive kernel spins (acquire) until every source's flag reaches the epoch. Flags only grow, so nothing
is reset between calls or graph replays. A spin that exceeds `spin_limit` sets ctr[2] = 1 and proceeds.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import triton
import triton.language as tl

MAX_PEERS = 8
# programs per local expert in the receive / combine-send kernels (each strides over that expert's rows);
# 1 under the interpreter, which runs programs one after another (fewer programs, less Python overhead)
NB_ROWS = 1 if os.environ.get("TRITON_INTERPRET") == "1" else 4
RECIP_448 = tl.constexpr(float(np.float32(1.0) / np.float32(448.0)))  # exactly an fp32 value
SPIN_NEVER = tl.constexpr(-7)  # compare value of the spinning CAS: never equal to a flag, so it never writes


@triton.jit
def _and(vec_mask, flag):
    """vec_mask & scalar flag, broadcast explicitly (the interpreter rejects a broadcast 0-d bool mask)."""
    return vec_mask & ((vec_mask.to(tl.int32) * 0 + flag.to(tl.int32)) != 0)


@triton.jit
def _store_peer(peers, dd: tl.constexpr, offs, val, mask):
    """tl.store(peers[dd] + offs, val, mask) for a constexpr dd (peers: a tuple of up to 8 pointers)."""
    p0, p1, p2, p3, p4, p5, p6, p7 = peers
    if dd == 0:
        tl.store(p0 + offs, val, mask=mask)
    elif dd == 1:
        tl.store(p1 + offs, val, mask=mask)
    elif dd == 2:
        tl.store(p2 + offs, val, mask=mask)
    elif dd == 3:
        tl.store(p3 + offs, val, mask=mask)
    elif dd == 4:
        tl.store(p4 + offs, val, mask=mask)
    elif dd == 5:
        tl.store(p5 + offs, val, mask=mask)
    elif dd == 6:
        tl.store(p6 + offs, val, mask=mask)
    else:
        tl.store(p7 + offs, val, mask=mask)


@triton.jit
def _flag_peer(peers, dd: tl.constexpr, off, val):
    """Release store (atomic exchange, system scope) of val at word `off` of peer dd's buffer."""
    p0, p1, p2, p3, p4, p5, p6, p7 = peers
    if dd == 0:
        tl.atomic_xchg(p0 + off, val, sem="release", scope="sys")
    elif dd == 1:
        tl.atomic_xchg(p1 + off, val, sem="release", scope="sys")
    elif dd == 2:
        tl.atomic_xchg(p2 + off, val, sem="release", scope="sys")
    elif dd == 3:
        tl.atomic_xchg(p3 + off, val, sem="release", scope="sys")
    elif dd == 4:
        tl.atomic_xchg(p4 + off, val, sem="release", scope="sys")
    elif dd == 5:
        tl.atomic_xchg(p5 + off, val, sem="release", scope="sys")
    elif dd == 6:
        tl.atomic_xchg(p6 + off, val, sem="release", scope="sys")
    else:
        tl.atomic_xchg(p7 + off, val, sem="release", scope="sys")


@triton.jit
def _wait_flags(me, ctr, which, off_flags, spin_limit, R: tl.constexpr):
    """Spin until every source's flag [which, s] in OUR buffer reaches ctr[which]; returns that epoch."""
    ep = tl.load(ctr + which)
    for s in tl.static_range(R):
        # a CAS that never matches: an acquire read that also works over shared memory on CPU (no write)
        v = tl.atomic_cas(me + off_flags + which * R + s, SPIN_NEVER, SPIN_NEVER, sem="acquire", scope="sys")
        n = tl.program_id(0) * 0  # an int32 tensor from the start (a loop-carried value keeps its type)
        while (v < ep) & (n < spin_limit):
            v = tl.atomic_cas(me + off_flags + which * R + s, SPIN_NEVER, SPIN_NEVER, sem="acquire", scope="sys")
            n += 1
        if n >= spin_limit:
            tl.store(ctr + 2, 1)
    return ep


@triton.jit
def _signal_kernel(ctr, which, peers, rank, off_flags, R: tl.constexpr):
    ep = tl.load(ctr + which) + 1
    tl.store(ctr + which, ep)
    for dd in tl.static_range(R):
        _flag_peer(peers, dd, off_flags + which * R + rank, ep)


def signal(ctr: torch.Tensor, which: int, peers: list[torch.Tensor], rank: int, off_flags: int) -> None:
    """Advance epoch ctr[which] and publish it in slot [which, rank] of every rank's flag row (1 program)."""
    _signal_kernel[(1,)](ctr, which, _peers8(peers), rank, off_flags, R=len(peers))


@triton.jit
def _send_rows(
    x, s, idx, pid, peers, rank, per_rank, max_t, num_experts, xw, sw, off_x, off_s, off_meta, base,
    R: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, HAS_S: tl.constexpr,
    BLOCK_X: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """Token `pid`'s k rows go to staging row ((e_local * R + rank) * max_t + j) of expert e's owner."""
    tok = pid.to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    ids = tl.load(idx + tok * K + kk, mask=kk < K, other=-1)
    j = tl.zeros((BLOCK_K,), dtype=tl.int64)  # earlier tokens of ours that chose the same expert
    for start in range(0, pid, BLOCK_T):
        toks = start + tl.arange(0, BLOCK_T)
        for c in tl.static_range(K):
            col = tl.load(idx + toks.to(tl.int64) * K + c, mask=toks < pid, other=-1)
            j += tl.sum(((col[:, None] == ids[None, :]) & (col[:, None] >= 0)).to(tl.int64), axis=0)
    cx = tl.arange(0, BLOCK_X)
    xv = tl.load(x + tok * xw + cx, mask=cx < xw)
    cs = tl.arange(0, BLOCK_S)
    if HAS_S:  # constexpr: resolved at compile time, not a runtime branch
        sv = tl.load(s + tok * sw + cs, mask=cs < sw)
    cm = tl.arange(0, 2)
    for slot in tl.static_range(K):
        e = tl.sum(tl.where(kk == slot, ids, 0), axis=0)
        jj = tl.sum(tl.where(kk == slot, j, 0), axis=0)
        ok = (e >= 0) & (e < num_experts)
        d = tl.where(ok, e // per_rank, -1)
        row = ((e - d * per_rank) * R + rank) * max_t + jj
        meta = tl.where(cm == 0, pid, slot).to(tl.int32)
        for dd in tl.static_range(R):
            go = d == dd
            _store_peer(peers, dd, base + off_x + row * xw + cx, xv, _and(cx < xw, go))
            if HAS_S:
                _store_peer(peers, dd, base + off_s + row * sw + cs, sv, _and(cs < sw, go))
            _store_peer(peers, dd, base + off_meta + row * 2 + cm, meta, _and(cm < 2, go))


@triton.jit
def _send_counts(
    idx, q, t, peers, rank, per_rank, num_experts, off_cnt, base,
    R: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    """Count program q: our rows per expert of BLOCK_E experts, into each owner's count row [rank, :]."""
    eids = q * BLOCK_E + tl.arange(0, BLOCK_E)
    cnt = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for start in range(0, t, BLOCK_T):
        toks = start + tl.arange(0, BLOCK_T)
        for c in tl.static_range(K):
            col = tl.load(idx + toks.to(tl.int64) * K + c, mask=toks < t, other=-1)
            cnt += tl.sum((col[:, None] == eids[None, :]).to(tl.int32), axis=0)
    owner = eids // per_rank
    for dd in tl.static_range(R):
        at = base + off_cnt + rank * per_rank + (eids - owner * per_rank)
        _store_peer(peers, dd, at, cnt, (eids < num_experts) & (owner == dd))


@triton.jit(do_not_specialize=["t", "max_t"])  # one compile for every token count
def _ll_send_kernel(
    x, s, idx, t, ctr, peers, rank, per_rank, max_t, num_experts, xw, sw,
    off_cnt, off_x, off_s, off_meta, par_stride,
    R: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, HAS_S: tl.constexpr,
    BLOCK_X: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    # The runtime if/else below only calls helpers and assigns nothing: Triton (3.6 at least) rejects a
    # name assigned in both branches with different types, so the branches keep their names to themselves.
    pid = tl.program_id(0)
    base = ((tl.load(ctr) + 1) % 2).to(tl.int64) * par_stride
    if pid < t:
        _send_rows(
            x, s, idx, pid, peers, rank, per_rank, max_t, num_experts, xw, sw, off_x, off_s, off_meta, base,
            R, K, BLOCK_K, HAS_S, BLOCK_X, BLOCK_S, BLOCK_T,
        )  # fmt: skip
    else:
        _send_counts(idx, pid - t, t, peers, rank, per_rank, num_experts, off_cnt, base, R, K, BLOCK_T, BLOCK_E)


@triton.jit(do_not_specialize=["max_t"])
def _ll_recv_kernel(
    me, ctr, out_x, out_s, out_meta, recv_count, per_rank, max_t, xw, sw,
    off_flags, off_cnt, off_x, off_s, off_meta, par_stride, spin_limit,
    R: tl.constexpr, RP: tl.constexpr, HAS_S: tl.constexpr, NB: tl.constexpr,
    BLOCK_X: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    le = tl.program_id(0)
    sub = tl.program_id(1)
    ep = _wait_flags(me, ctr, 0, off_flags, spin_limit, R)
    base = (ep % 2).to(tl.int64) * par_stride
    rr = tl.arange(0, RP)
    # .cg (L2, not L1) for everything peers wrote: L2 is where their NVLink stores land
    cs = tl.load(me + base + off_cnt + rr * per_rank + le, mask=rr < R, other=0, cache_modifier=".cg")
    starts = tl.cumsum(cs, axis=0) - cs  # rows of an expert: by source rank, then token (the reference's order)
    if sub == 0:
        tl.store(recv_count + le, tl.sum(cs, axis=0))
    slots = max_t * R
    cx = tl.arange(0, BLOCK_X)
    cw = tl.arange(0, BLOCK_S)
    cm = tl.arange(0, 4)
    for src in tl.static_range(R):
        n = tl.sum(tl.where(rr == src, cs, 0), axis=0)
        st = tl.sum(tl.where(rr == src, starts, 0), axis=0)
        for jj in range(sub, n, NB):
            row = ((le * R + src) * max_t + jj).to(tl.int64)
            dst = (le * slots + st + jj).to(tl.int64)
            v = tl.load(me + base + off_x + row * xw + cx, mask=cx < xw, cache_modifier=".cg")
            tl.store(out_x + dst * xw + cx, v, mask=cx < xw)
            if HAS_S:
                v2 = tl.load(me + base + off_s + row * sw + cw, mask=cw < sw, cache_modifier=".cg")
                tl.store(out_s + dst * sw + cw, v2, mask=cw < sw)
            m = tl.load(
                me + base + off_meta + row * 2 + (cm - 1), mask=(cm >= 1) & (cm < 3), other=0, cache_modifier=".cg"
            )
            tl.store(out_meta + dst * 4 + cm, tl.where(cm == 0, src, m))


@triton.jit(do_not_specialize=["slots"])
def _ll_combine_send_kernel(
    y, meta, recv_count, ctr, peers, slots, yw, k, off_cmb, par_stride,
    R: tl.constexpr, NB: tl.constexpr, BLOCK_Y: tl.constexpr,
):  # fmt: skip
    le = tl.program_id(0)
    sub = tl.program_id(1)
    base = ((tl.load(ctr + 1) + 1) % 2).to(tl.int64) * par_stride
    n = tl.load(recv_count + le)
    cy = tl.arange(0, BLOCK_Y)
    for i in range(sub, n, NB):
        row = (le * slots + i).to(tl.int64)
        src = tl.load(meta + row * 4)
        tok = tl.load(meta + row * 4 + 1).to(tl.int64)
        slot = tl.load(meta + row * 4 + 2)
        v = tl.load(y + row * yw + cy, mask=cy < yw)
        at = base + off_cmb + (tok * k + slot) * yw + cy
        for dd in tl.static_range(R):
            _store_peer(peers, dd, at, v, _and(cy < yw, src == dd))


@triton.jit(do_not_specialize=["t"])
def _ll_combine_reduce_kernel(
    me_w, me_y, ctr, idx, wts, out, t, hidden, off_flags, off_cmb_y, par_stride_y, spin_limit,
    R: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BF16_BITS: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0).to(tl.int64)
    ep = _wait_flags(me_w, ctr, 1, off_flags, spin_limit, R)
    base = (ep % 2).to(tl.int64) * par_stride_y
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cm = cols < hidden
    tm = tok < t  # t == 0 still launches one program: every call waits for its flags
    kk = tl.arange(0, BLOCK_K)
    ids = tl.load(idx + tok * K + kk, mask=_and(kk < K, tm), other=-1)
    w = tl.load(wts + tok * K + kk, mask=_and(kk < K, tm), other=0.0)
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for slot in tl.static_range(K):  # fixed slot order: deterministic, replay == eager
        ws = tl.sum(tl.where(kk == slot, w, 0.0), axis=0)
        valid = tl.max(tl.where(kk == slot, ids, -1), axis=0) >= 0
        at = me_y + base + off_cmb_y + (tok * K + slot) * hidden + cols
        v = tl.load(at, mask=_and(cm, valid & tm), other=0.0, cache_modifier=".cg")
        acc += tl.where(valid, v.to(tl.float32) * ws, 0.0)
    offs = tok * hidden + cols
    if BF16_BITS:  # out is an int16 view of bf16: round to nearest even by hand (the interpreter truncates)
        bits = acc.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(acc != acc, 0x7FC0, rounded)
        tl.store(out + offs, rounded.to(tl.int16), mask=_and(cm, tm))
    else:
        tl.store(out + offs, acc.to(out.dtype.element_ty), mask=_and(cm, tm))


def _peers8(peers: list[torch.Tensor]) -> tuple:
    """Pad the peer views to 8 (unused slots repeat peer 0: never stored to, their masks are false)."""
    if not 1 <= len(peers) <= MAX_PEERS:
        raise ValueError(f"peers: expected 1..{MAX_PEERS} ranks, got {len(peers)}")
    return tuple(peers) + (peers[0],) * (MAX_PEERS - len(peers))


def _p2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 2))


def ll_send(x, s, idx, ctr, peers, rank, per_rank, max_t, num_experts, lay) -> None:
    """Push every (token, slot) row of x (+ scales s, + (token, slot)) and our per-expert counts to the owners.

    x int32 [t, xw] words, s int32 [t, sw] words or None, idx int64 [t, k]; lay: the `LLLayout` offsets.
    """
    t, k = idx.shape
    world = len(peers)
    block_e = 64
    grid = (t + triton.cdiv(num_experts, block_e),)
    sw = s.shape[1] if s is not None else 0
    _ll_send_kernel[grid](
        x, s if s is not None else x, idx, t, ctr, _peers8(peers), rank, per_rank, max_t, num_experts,
        x.shape[1], sw, lay.cnt, lay.x, lay.s, lay.meta, lay.par,
        R=world, K=k, BLOCK_K=_p2(k), HAS_S=s is not None, BLOCK_X=_p2(x.shape[1]), BLOCK_S=_p2(sw),
        BLOCK_T=64, BLOCK_E=block_e,
    )  # fmt: skip


def ll_recv(me, ctr, out_x, out_s, out_meta, recv_count, world, max_t, lay, spin_limit) -> None:
    """Wait for every source's dispatch flag, then pack the staged rows into the masked layout.

    out_x int32 [E_local, max_t * R, xw], out_s like it with sw words or None, out_meta int32 [E_local,
    max_t * R, 4] (source rank, token, slot, -), recv_count int32 [E_local].
    """
    per_rank, xw = out_x.shape[0], out_x.shape[2]
    sw = out_s.shape[2] if out_s is not None else 0
    _ll_recv_kernel[(per_rank, NB_ROWS)](
        me, ctr, out_x, out_s if out_s is not None else out_x, out_meta, recv_count, per_rank, max_t, xw, sw,
        lay.flags, lay.cnt, lay.x, lay.s, lay.meta, lay.par, spin_limit,
        R=world, RP=_p2(world), HAS_S=out_s is not None, NB=NB_ROWS, BLOCK_X=_p2(xw), BLOCK_S=_p2(sw),
    )  # fmt: skip


def ll_combine_send(y, meta, recv_count, ctr, peers, k, lay) -> None:
    """Push each valid row y[e, i] (int32 words [E_local, slots, yw]) to its source's [token, slot] row."""
    per_rank, slots, yw = y.shape
    _ll_combine_send_kernel[(per_rank, NB_ROWS)](
        y, meta, recv_count, ctr, _peers8(peers), slots, yw, k, lay.cmb, lay.par,
        R=len(peers), NB=NB_ROWS, BLOCK_Y=_p2(yw),
    )  # fmt: skip


def ll_combine_reduce(me, me_y, ctr, idx, wts, out, world, lay, spin_limit) -> None:
    """Wait for every rank's combine flag, then out[t] = sum_k w[t, k] * row(t, k) (fp32, slot order, one rounding).

    me: int32 view of our buffer; me_y: the same buffer viewed as out's dtype; out [t, hidden].
    """
    t, k = idx.shape
    hidden = out.shape[1]
    per_word = 4 // out.element_size()
    block_h = min(1024, _p2(hidden))
    bf16 = out.dtype == torch.bfloat16
    _ll_combine_reduce_kernel[(max(t, 1), triton.cdiv(hidden, block_h))](
        me, me_y, ctr, idx, wts, out.view(torch.int16) if bf16 else out, t, hidden, lay.flags,
        lay.cmb * per_word, lay.par * per_word, spin_limit,
        R=world, K=k, BLOCK_K=_p2(k), BLOCK_H=block_h, BF16_BITS=bf16,
    )  # fmt: skip


@triton.jit
def _e4m3_bits(q):
    """float32 q, |q| <= 448 -> e4m3fn code (int32 0..255), round to nearest even, by hand (the interpreter
    truncates in its own casts). Normals keep 3 mantissa bits; below 2^-6 the step is 2^-9."""
    bits = q.to(tl.uint32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.abs(q)
    ab = a.to(tl.uint32, bitcast=True)
    rounded = (ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20  # exp8 | mant3, rounded to nearest even
    normal = (rounded - ((127 - 7) << 3)).to(tl.int32)
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)  # RNE of a / 2^-9 (exact scaling)
    code = tl.where(a < 0.015625, sub, normal)
    return code | sign.to(tl.int32)


@triton.jit(do_not_specialize=["t"])
def _quant_kernel(
    x, vals, scales, t, hidden,
    NBLK: tl.constexpr, ROUND: tl.constexpr, UE8M0: tl.constexpr, RECIP: tl.constexpr,
):  # fmt: skip
    """One token per program: per 128-channel block, scale = max(amax, 1e-4) / 448 (rounded up to a power
    of two when ROUND), values = clamp(x / scale, +-448) as e4m3 bits; scales fp32 or e8m0 bytes."""
    tok = tl.program_id(0).to(tl.int64)
    b = tl.arange(0, NBLK)
    c = tl.arange(0, 128)
    offs = b[:, None] * 128 + c[None, :]
    m = (b < hidden // 128)[:, None] & (c < 128)[None, :]
    a = tl.load(x + tok * hidden + offs, mask=m, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(a), axis=1)
    if RECIP:  # torch on CUDA divides by a CPU scalar as a multiply by its fp32 reciprocal: same bits
        sc = tl.maximum(amax, 1e-4) * RECIP_448
    else:
        sc = tl.math.div_rn(tl.maximum(amax, 1e-4), tl.zeros_like(amax) + 448.0)
    if ROUND:  # 2^ceil(log2(sc)), exactly: a power of two stays, anything else goes to the next one up
        sb = sc.to(tl.int32, bitcast=True)
        up = tl.where((sb & 0x7FFFFF) != 0, (sb & 0x7F800000) + 0x800000, sb & 0x7F800000)
        sc = up.to(tl.float32, bitcast=True)
    q = tl.math.div_rn(a, sc[:, None] + tl.zeros_like(a))
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    code = _e4m3_bits(q).to(tl.int8)  # by hand on every device: no double rounding through fp16 either
    tl.store(vals + tok * hidden + offs, code, mask=m)
    bm = b < hidden // 128
    if UE8M0:
        e8 = (sc.to(tl.int32, bitcast=True) >> 23) & 0xFF
        tl.store(scales + tok * (hidden // 128) + b, e8.to(tl.uint8), mask=bm)
    else:
        tl.store(scales + tok * (hidden // 128) + b, sc, mask=bm)


def quant_fp8(x: torch.Tensor, round_scale: bool, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference_ll.per_token_cast_to_fp8` in one launch (x [t, h] contiguous, h % 128 == 0), same bits.

    The e4m3 cast is rounded by hand (nearest even; the interpreter's own cast truncates). The scale follows
    torch's arithmetic on the device: amax / 448 on CPU, amax * fp32(1 / 448) on CUDA (torch turns a division
    by a CPU scalar into a multiply there), so the bits match `per_token_cast_to_fp8` on both.
    """
    t, hidden = x.shape
    vals = torch.empty((t, hidden), dtype=torch.float8_e4m3fn, device=x.device)
    sdt = torch.float8_e8m0fnu if use_ue8m0 else torch.float32
    scales = torch.empty((t, hidden // 128), dtype=sdt, device=x.device)
    if t:
        _quant_kernel[(t,)](
            x, vals.view(torch.int8), scales.view(torch.uint8) if use_ue8m0 else scales, t, hidden,
            NBLK=_p2(hidden // 128), ROUND=round_scale, UE8M0=use_ue8m0, RECIP=x.device.type == "cuda",
        )  # fmt: skip
    return vals, scales
