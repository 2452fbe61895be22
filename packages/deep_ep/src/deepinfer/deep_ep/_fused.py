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

from ._plan import field_offsets, word_bytes
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


def _scratch_pos(fast: IntranodeNormal, world: int, t: int) -> torch.Tensor:
    """int64 [world, t] view of a grow-only scratch table kept on the fast path (no per-call allocation)."""
    have = fast._pos_scratch
    if have is None or have.numel() < world * t:
        have = torch.empty(max(world * t, 1024), dtype=torch.int64, device=fast.device)
        fast._pos_scratch = have
    return have[: world * t].view(world, t)


def _typed(buf: torch.Tensor, off: int, rows: int, dtype: torch.dtype, cols: int) -> torch.Tensor:
    """[rows, cols] of `dtype` at byte `off` of a uint8 buffer (offsets are 256-byte aligned)."""
    n = rows * cols * dtype.itemsize
    return buf[off : off + n].view(dtype).reshape(rows, cols)


def _as_words(b: torch.Tensor) -> torch.Tensor:
    """uint8 [n, B] -> its widest-word view [n, B / word] (the word `_words` / `_region` use for B)."""
    return b.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[word_bytes(b.shape[1])])


def dispatch(fast: IntranodeNormal, x: XPayload, topk_idx, topk_weights, num_experts, given, align):
    """`reference.dispatch` with the fused kernels (same arguments and results, bit for bit)."""
    world, rank, dev = fast.world, fast.rank, fast.device
    idx, w = topk_idx.to(torch.int64).contiguous(), topk_weights.contiguous()
    t, k = idx.shape
    fields = _payload(x)
    # 1-2: layout + positions + our exchange row (one launch), the exchange, the one host sync
    slot = fast._exchange_slot(row_width(world, num_experts))
    layout = torch.empty((t, world), dtype=torch.bool, device=dev)
    pos = _scratch_pos(fast, world, t)
    sig = [_payload_code(fields), *_payload_shape(fields), k, t]
    layout_row(idx, given if t else None, slot[1], layout, pos, num_experts, sig)
    counts = fast._exchange(slot[1], slot)
    plan = _check_rows(counts, world, num_experts, rank)
    # 3: one push per destination, peers first (the host work after them overlaps their NVLink transfers)
    widths = [_row_bytes(f) for f in fields] + [8 * k, 4 * k, 8]  # + local ids, weights, token index
    offs, total = field_offsets(widths, plan.dispatch_cap())
    fast.transport.ensure(COUNTS_BYTES + total)
    send_tok = torch.empty((plan.send_total(rank),), dtype=torch.int64, device=dev)
    send_pos = torch.empty((world, t), dtype=torch.int64, device=dev)
    src, per = [_words(f) for f in fields], num_experts // world
    for d in _peers(rank, world):
        dst = _peer_regions(fast.transport.buffer(d), offs, widths, plan.dispatch_cap(), k)
        xs, meta = list(zip(src, dst[: len(fields)])), (idx, w, *dst[len(fields) :], d * per, per)
        push_rows(pos[d], 0, plan.send_off(rank, d), plan.recv_off(rank, d), xs, meta, (send_pos[d], send_tok))
    n_recv = plan.recv_total(rank)
    outs = [torch.empty((n_recv, rb), dtype=torch.uint8, device=dev) for rb in widths[: len(fields)]]
    out_idx = torch.empty((n_recv, k), dtype=torch.int64, device=dev)
    out_w = torch.empty((n_recv, k), dtype=torch.float32, device=dev)
    out_src = torch.empty((n_recv,), dtype=torch.int64, device=dev)
    xs, meta = list(zip(src, map(_as_words, outs))), (idx, w, out_idx, out_w, out_src, rank * per, per)
    lo, so = plan.recv_off(rank, rank), plan.send_off(rank, rank)
    push_rows(pos[rank], 0, so, lo, xs, meta, (send_pos[rank], send_tok))  # our block: into the outputs
    # 4: the peers' blocks, from our buffer into the outputs
    fast.transport.barrier()
    mine = fast.transport.buffer(rank)
    dst = [*outs, out_idx.view(torch.uint8), out_w.view(torch.uint8), out_src.view(torch.uint8).reshape(n_recv, 8)]
    pairs = [(_region(mine, COUNTS_BYTES + o, n_recv, rb), _as_words(b)) for o, rb, b in zip(offs, widths, dst)]
    copy_rows(pairs, n_recv, (lo, lo + plan.matrix[rank][rank]))
    recv_x = [b.view(f.dtype).reshape(n_recv, *f.shape[1:]) for b, f in zip(outs, fields)]
    lists = _per_expert_lists(counts, world, num_experts, rank, align)
    handle = DispatchHandle(
        t, num_experts, layout, send_tok, list(plan.matrix[rank]), [plan.matrix[s][rank] for s in range(world)],
        out_src, lists, [list(r) for r in plan.matrix], send_pos,
    )  # fmt: skip
    return (tuple(recv_x) if isinstance(x, tuple) else recv_x[0]), out_idx, out_w, lists, handle


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
