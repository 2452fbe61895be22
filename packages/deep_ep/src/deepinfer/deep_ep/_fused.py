"""The intranode dispatch with fused Triton kernels (impl "triton"): few launches, one host sync.

Per normal dispatch on R ranks (GPU work in stream order):
  1. `layout_row`: ONE launch computes is_token_in_rank, every token's position in each send block
     (a prefix sum), the counts and the id range, and writes the exchange row straight into our slot
     of our buffer's count area;
  2. R - 1 copies of that row into the peers' count areas, a barrier, and the ONE host synchronisation
     (the count lists the API returns: DeepEP's normal mode does the same);
  3. per destination d, ONE `push_rows` launch writes every field of the tokens for d (payload, scales,
     local top-k ids / weights, token index) into d's buffer at its receive offset (ours: straight into
     the outputs) and fills the handle's send_token_idx / send_pos;
  4. a barrier and ONE `copy_rows` launch copies every peer block from our buffer into the outputs.
Scratch (the position table) is grow-only and kept; only the returned tensors are allocated per call.
Cached dispatch stays on `IntranodeNormal._move` (index_select into the peers: no index work to fuse,
and a torch launch is cheaper for the host than a Triton one).
"""

from __future__ import annotations

import torch

from ._plan import align_up, field_offsets, word_bytes
from .backends.triton.fused import copy_rows, layout_row, push_rows, row_width
from .handles import DispatchHandle
from .intranode import (
    COUNTS_BYTES,
    IntranodeNormal,
    _check_rows,
    _payload,
    _payload_code,
    _payload_shape,
    _peers,
    _per_expert_lists,
    _region,
    _row_bytes,
    _words,
)
from .reference import XPayload


def _scratch_pos(fast: IntranodeNormal, world: int, t: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """An int64 [world, t] position table in grow-only scratch kept on the fast path, and its rows (no
    per-call allocation; the views are cached with the scratch)."""
    have = fast._pos_scratch
    if have is None or have.numel() < world * t:
        have = torch.empty(max(world * t, 1024), dtype=torch.int64, device=fast.device)
        fast._pos_scratch, fast._pos_views = have, {}
    got = fast._pos_views.get(t)
    if got is None:
        table = have[: world * t].view(world, t)
        got = fast._pos_views[t] = (table, [table[d] for d in range(world)])
    return got


def _typed(buf: torch.Tensor, off: int, rows: int, dtype: torch.dtype, cols: int) -> torch.Tensor:
    """[rows, cols] of `dtype` at byte `off` of a uint8 buffer (offsets are 256-byte aligned)."""
    n = rows * cols * dtype.itemsize
    return buf[off : off + n].view(dtype).reshape(rows, cols)


def _as_words(b: torch.Tensor) -> torch.Tensor:
    """uint8 [n, B] -> its widest-word view [n, B / word] (the word `_words` / `_region` use for B)."""
    return b.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[word_bytes(b.shape[1])])


_WORD = {4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _src_words(f: torch.Tensor) -> torch.Tensor:
    """`_words(f)` in one view for the usual payload (2-D contiguous, rows of whole words): fewer host ops."""
    if f.dim() == 2 and f.is_contiguous() and f.element_size() <= 4 and f.shape[0] > 0:
        wb = word_bytes(_row_bytes(f))
        if wb >= f.element_size() and f.storage_offset() * f.element_size() % wb == 0:
            return f.view(_WORD[wb])
    return _words(f)


def _empty_words(n: int, row_bytes: int, dev: torch.device) -> torch.Tensor:
    """A fresh [n, row_bytes / word] output in the widest word dividing a row (what the kernels move)."""
    wb = word_bytes(row_bytes)
    return torch.empty((n, row_bytes // wb), dtype=_WORD[wb], device=dev)


def _grow_cap(fast: IntranodeNormal, need: int) -> int:
    """Receive capacity (rows) of the fused dispatch's regions: grow-only, in steps of 1/8 (>= 256 rows), so
    that the region offsets, hence the cached views, stay the same from call to call. Every rank computes
    the same value (same count matrix, same history of calls), which the shared layout needs."""
    if need > fast.dispatch_cap:
        fast.dispatch_cap = align_up(max(need, fast.dispatch_cap + fast.dispatch_cap // 8), 256)
    return fast.dispatch_cap


def dispatch(fast: IntranodeNormal, x: XPayload, topk_idx, topk_weights, num_experts, given, align):
    """`reference.dispatch` with the fused kernels (same arguments and results, bit for bit).

    Host work is ordered around the one synchronisation: everything that does not need the counts (word
    views of the inputs, the handle's send_pos / send_tok, the position table) is queued before it, so it
    overlaps the layout kernel and the exchange; after it, the peer pushes launch first (their regions are
    cached views), then the outputs are allocated and our own block and the copy-out are queued.
    """
    mark = _phase_marker()
    world, rank, dev = fast.world, fast.rank, fast.device
    idx, w = topk_idx.to(torch.int64).contiguous(), topk_weights.contiguous()
    t, k = idx.shape
    fields = _payload(x)
    # 1-2: layout + positions + our exchange row (one launch), the exchange, the one host sync
    slot = fast._exchange_slot(row_width(world, num_experts))
    layout = torch.empty((t, world), dtype=torch.bool, device=dev)
    pos_table, pos = _scratch_pos(fast, world, t)
    sig = [_payload_code(fields), *_payload_shape(fields), k, t]
    layout_row(idx, given if t else None, slot[1], layout, pos_table, num_experts, sig)
    # not count-dependent: queued while the GPU computes the layout (the handle's tables: send_tok is sized
    # for every token to every rank and sliced below; a view costs less than waiting to allocate it)
    send_pos = torch.empty((world, t), dtype=torch.int64, device=dev)
    send_tok_all = torch.empty((world * t,), dtype=torch.int64, device=dev)
    src, per = [_src_words(f) for f in fields], num_experts // world
    widths = [_row_bytes(f) for f in fields] + [8 * k, 4 * k, 8]  # + local ids, weights, token index
    mark("queued")
    counts = fast._exchange(slot[1], slot)
    mark("synced")
    plan = _check_rows(counts, world, num_experts, rank)
    # 3: one push per destination, peers first (the host work after them overlaps their NVLink transfers)
    cap = _grow_cap(fast, plan.dispatch_cap())
    offs, total = field_offsets(widths, cap)
    fast.transport.ensure(COUNTS_BYTES + total)
    send_tok = send_tok_all[: plan.send_total(rank)]
    key = (tuple(offs), tuple(widths), cap, k)
    for d in _peers(rank, world):
        dst = fast.view(("peer", d, *key), lambda d=d: _peer_regions(fast.transport.buffer(d), offs, widths, cap, k))
        xs, meta = list(zip(src, dst[: len(fields)])), (idx, w, *dst[len(fields) :], d * per, per)
        push_rows(pos[d], 0, plan.send_off(rank, d), plan.recv_off(rank, d), xs, meta, (send_pos[d], send_tok))
    mark("pushed")
    n_recv = plan.recv_total(rank)
    outs = [_empty_words(n_recv, rb, dev) for rb in widths[: len(fields)]]
    out_idx = torch.empty((n_recv, k), dtype=torch.int64, device=dev)
    out_w = torch.empty((n_recv, k), dtype=torch.float32, device=dev)
    out_src = torch.empty((n_recv, 1), dtype=torch.int64, device=dev)
    xs, meta = list(zip(src, outs)), (idx, w, out_idx, out_w, out_src, rank * per, per)
    lo, so = plan.recv_off(rank, rank), plan.send_off(rank, rank)
    push_rows(pos[rank], 0, so, lo, xs, meta, (send_pos[rank], send_tok))  # our block: into the outputs
    # 4: the peers' blocks, from our buffer into the outputs
    fast.transport.barrier()
    mine = fast.view(("mine", *key), lambda: _own_regions(fast.transport.buffer(rank), offs, widths, cap))
    dst = [*outs, out_idx.view(torch.int32), out_w.view(torch.int32), out_src.view(torch.int32)]
    copy_rows(list(zip(mine, dst)), n_recv, (lo, lo + plan.matrix[rank][rank]))
    recv_x = [_typed_out(b, f) for b, f in zip(outs, fields)]
    lists = _per_expert_lists(counts, world, num_experts, rank, align)
    handle = DispatchHandle(
        t, num_experts, layout, send_tok, list(plan.matrix[rank]), [plan.matrix[s][rank] for s in range(world)],
        out_src.view(-1), lists, [list(r) for r in plan.matrix], send_pos,
    )  # fmt: skip
    mark("returned")
    return (tuple(recv_x) if isinstance(x, tuple) else recv_x[0]), out_idx, out_w, lists, handle


# Host-side phase times of dispatch (diagnostics for the benchmark; off unless a list is installed here):
# per call a dict of perf_counter stamps: queued (layout + pre-sync work launched), synced (counts read),
# pushed (peer pushes launched), returned.
PHASES: list[dict[str, float]] | None = None


def _phase_marker():
    """A callable stamping phase names into a new PHASES entry, or a no-op when PHASES is None."""
    if PHASES is None:
        return _no_mark
    import time

    entry: dict[str, float] = {"start": time.perf_counter()}
    PHASES.append(entry)
    return lambda name: entry.__setitem__(name, time.perf_counter())


def _no_mark(name: str) -> None:
    """Phase timing off."""


def _typed_out(b: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Output words [n, W] -> f's dtype and row shape (one view for 2-D payloads)."""
    v = b.view(f.dtype)
    return v if f.dim() == 2 and v.shape[1] == f.shape[1] else v.reshape(b.shape[0], *f.shape[1:])


def _own_regions(buf: torch.Tensor, offs: list[int], widths: list[int], cap: int) -> list[torch.Tensor]:
    """Our buffer's receive regions [cap rows] of every field, as words (the copy-out's sources)."""
    return [_region(buf, COUNTS_BYTES + o, cap, rb) for o, rb in zip(offs, widths)]


def _peer_regions(buf: torch.Tensor, offs: list[int], widths: list[int], cap: int, k: int) -> list[torch.Tensor]:
    """A peer's receive regions [cap rows]: payload fields as words, then ids int64 [cap, k], weights fp32
    [cap, k] and token index int64 [cap, 1] (the layout `field_offsets` gave every rank)."""
    n_x = len(widths) - 3
    xs = [_region(buf, COUNTS_BYTES + o, cap, rb) for o, rb in zip(offs[:n_x], widths[:n_x])]
    m_off = [COUNTS_BYTES + o for o in offs[n_x:]]
    return [
        *xs, _typed(buf, m_off[0], cap, torch.int64, k), _typed(buf, m_off[1], cap, torch.float32, k),
        _typed(buf, m_off[2], cap, torch.int64, 1),
    ]  # fmt: skip


def probe(device: torch.device, world: int) -> bool:
    """The fused kernels, in the variants dispatch runs (R = world, meta, two payload fields, five copied
    fields), on a tiny local case equal plain torch. Run once, when the fast path starts."""
    from .reference import _local_routing, layout_nocheck

    t, k, num_experts, d = 6, 3, 4 * world, world - 1
    g = torch.Generator().manual_seed(0)
    idx = torch.rand(t, num_experts, generator=g).argsort(dim=1)[:, :k].contiguous()
    idx[1] = -1
    idx = idx.to(device)
    row = torch.empty(row_width(world, num_experts), dtype=torch.int64, device=device)
    layout = torch.empty((t, world), dtype=torch.bool, device=device)
    pos = torch.empty((world, t), dtype=torch.int64, device=device)
    per_rank, per_expert, want = layout_nocheck(idx, num_experts, world)
    layout_row(idx, None, row, layout, pos, num_experts, [1, 2, 3, k, t])  # no is_token_in_rank: the usual call
    ok = torch.equal(layout, want) and row[: world + num_experts].tolist() == [*per_rank.tolist(), *per_expert.tolist()]
    ok = ok and not row[world + num_experts + 7 :].any()
    sent = want[:, d].nonzero().flatten()
    n, x = sent.numel(), torch.randint(0, 1000, (t, 40), generator=g, dtype=torch.int32).to(device)
    w = torch.rand(t, k, generator=g).to(device)
    outs = [torch.zeros((n, c), dtype=dt, device=device) for c, dt in ((40, torch.int32), (3, torch.int32))]
    o_idx = torch.zeros((n, k), dtype=torch.int64, device=device)
    o_w = torch.zeros((n, k), device=device)
    o_src = torch.zeros((n,), dtype=torch.int64, device=device)
    send_pos = torch.empty((t,), dtype=torch.int64, device=device)
    send_tok = torch.empty((n,), dtype=torch.int64, device=device)
    meta = (idx, w, o_idx, o_w, o_src, d * 4, 4)
    push_rows(pos[d], 0, 0, 0, [(x, outs[0]), (x[:, :3].contiguous(), outs[1])], meta, (send_pos, send_tok))
    want_idx, want_w = _local_routing(idx[sent], w[sent], d, 4)
    ok = ok and torch.equal(outs[0], x[sent]) and torch.equal(outs[1], x[sent, :3]) and torch.equal(send_tok, sent)
    ok = ok and torch.equal(o_idx, want_idx) and torch.equal(o_w, want_w) and torch.equal(o_src, sent)
    srcs = [outs[0], outs[1], o_idx, o_w, o_src.view(n, 1)]
    again = [torch.zeros_like(v) for v in srcs]
    copy_rows(list(zip(srcs, again)), n, (1, 2))  # every row but row 1
    keep = [i for i in range(n) if i != 1]
    return ok and all(torch.equal(a[keep], v[keep]) and not a[1:2].any() for a, v in zip(again, srcs))
