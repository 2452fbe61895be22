"""Normal-mode dispatch / combine without a host synchronisation (`Buffer.dispatch(num_worst_tokens=W)`).

DeepEP's `num_worst_tokens` option on the intranode fast path (impl "triton"): the caller bounds the rows
any rank receives by W, so every output is allocated with W rows before the counts exist, the count matrix
stays on the device (the handle's `device_counts`; the per-expert counts come back as an int32 tensor) and
the whole call is queued without waiting: no `.item()`, no pinned copy, no host-side branch on a count. So
dispatch, cached dispatch and combine can be captured in a CUDA graph (after one eager call of the same
shapes, which sizes the buffers: growing them is a collective and never happens inside a capture).

Per dispatch on R ranks (GPU work in stream order): `fused.layout_row` (layout, send positions, our count
row, 1 launch); R - 1 row copies into the peers' count areas and a barrier; `nosync.plan` (the count
matrix, per-expert counts and error bits out of the exchanged area, 1 launch); `nosync.push_pair` (the
first peer's rows into its buffer and our own block straight into the outputs, side by side in one launch)
and one `nosync.push` per other peer (offsets computed on the device); a barrier; one `nosync.copy_out`
(peer blocks into the outputs, -1 / 0 padding of the metadata rows).
Combine: a barrier, one `nosync.combine_send` per source (our received rows back into its buffer at their
send positions), a barrier, one `nosync.reduce` per field (fp32 sum in rank order, one rounding).

Buffer regions (every rank derives the same layout from host-known numbers only, which the shared layout
needs): dispatch as the fused path with capacity W; combine with capacity R * W (any rank's send total is
at most what all ranks receive). Bad input cannot raise here: the layout kernel still computes the checks
and `nosync.plan` turns them into error bits; `DispatchHandle.check()` raises from them on request.
"""

from __future__ import annotations

import torch

from ._fused import _empty_words, _own_regions, _peer_regions, _scratch_pos, _src_words, _typed_out
from ._plan import field_offsets
from .backends.triton import nosync
from .backends.triton.fused import layout_row, row_width
from .handles import DispatchHandle
from .intranode import (
    COUNTS_BYTES,
    IntranodeNormal,
    _payload,
    _payload_code,
    _payload_shape,
    _peers,
    _region,
    _row_bytes,
)
from .reference import XPayload


def dispatch(fast: IntranodeNormal, x: XPayload, topk_idx, topk_weights, num_experts, given, align, cap: int):
    """`reference.dispatch` padded to `cap` rows, with no host sync: (recv_x [cap, ...], recv_topk_idx int64
    [cap, k] (-1 past the received rows), recv_topk_weights fp32 [cap, k] (0 there), tokens per local expert
    int32 [E / R] on the device, handle). The first received rows equal the reference's, bit for bit."""
    world, rank, dev = fast.world, fast.rank, fast.device
    mark = _stage_marker(dev)
    idx, w = topk_idx.to(torch.int64).contiguous(), topk_weights.contiguous()
    t, k = idx.shape
    fields = _payload(x)
    nf, per = len(fields), num_experts // world
    widths = [_row_bytes(f) for f in fields] + [8 * k, 4 * k, 8]  # + local ids, weights, token index
    offs, total = field_offsets(widths, cap)
    fast.transport.ensure(COUNTS_BYTES + total)  # host-known sizes only: the same on every rank
    # 1: layout + positions + our count row (one launch; W in the signature: every rank must pass the same)
    slot = fast._exchange_slot(row_width(world, num_experts))
    layout = torch.empty((t, world), dtype=torch.bool, device=dev)
    pos_table, pos = _scratch_pos(fast, world, t)
    sig = [_payload_code(fields), *_payload_shape(fields), k, cap]
    layout_row(idx, given if t else None, slot[1], layout, pos_table, num_experts, sig)
    mark("layout")
    # 2: the exchange (no host read), then the count matrix on the device
    area = fast._share(slot[1], slot)
    mark("exchange")
    mat = torch.empty((world * world + 2,), dtype=torch.int64, device=dev)
    counts = torch.empty((per,), dtype=torch.int32, device=dev)
    nosync.plan(area, mat, counts, rank, num_experts, align, cap)
    mark("plan")
    # 3: the pushes: the first peer and our own block in one launch (NVLink and local copy side by side),
    # then one launch per other peer
    send_pos = torch.empty((world, t), dtype=torch.int64, device=dev)
    send_tok = torch.empty((world * t,), dtype=torch.int64, device=dev)
    src = [_src_words(f) for f in fields]
    key = (tuple(offs), tuple(widths), cap, k)
    outs = [_empty_words(cap, rb, dev) for rb in widths[:nf]]
    out_idx = torch.empty((cap, k), dtype=torch.int64, device=dev)
    out_w = torch.empty((cap, k), dtype=torch.float32, device=dev)
    out_src = torch.empty((cap, 1), dtype=torch.int64, device=dev)
    peers = _peers(rank, world)
    for j, d in enumerate(peers):
        dst = fast.view(("peer", d, *key), lambda d=d: _peer_regions(fast.transport.buffer(d), offs, widths, cap, k))
        if j == 0:
            xs = list(zip(src, dst[:nf], outs))
            metas = (idx, w, *dst[nf:], out_idx, out_w, out_src, per)
            nosync.push_pair(pos_table, mat, rank, d, cap, xs, metas, (send_pos, send_tok))
        else:
            meta = (idx, w, *dst[nf:], d * per, per)
            nosync.push(pos[d], mat, rank, d, cap, list(zip(src, dst[:nf])), meta, (send_pos[d], send_tok))
    mark("push")
    # 4: the peers' blocks, from our buffer into the outputs
    fast.transport.barrier()
    mark("barrier")
    mine = fast.view(("mine", *key), lambda: _own_regions(fast.transport.buffer(rank), offs, widths, cap))
    metas = list(zip(mine[nf:], (out_idx.view(torch.int32), out_w.view(torch.int32), out_src.view(torch.int32))))
    nosync.copy_out(mat, rank, cap, list(zip(mine[:nf], outs)), metas)
    mark("copy_out")
    recv_x = [_typed_out(b, f) for b, f in zip(outs, fields)]
    handle = DispatchHandle(
        t, num_experts, layout, send_tok, None, None, out_src.view(-1), None, None, send_pos,
        num_worst_tokens=cap, device_counts=mat, recv_expert_counts=counts,
    )  # fmt: skip
    return (tuple(recv_x) if isinstance(x, tuple) else recv_x[0]), out_idx, out_w, counts, handle


def cached_dispatch(fast: IntranodeNormal, x: XPayload, handle: DispatchHandle) -> XPayload:
    """x along the routing of a no-sync handle: [num_worst_tokens, ...] (rows past the received ones are
    left as they are), no host sync."""
    world, rank, dev, cap = fast.world, fast.rank, fast.device, handle.num_worst_tokens
    mat = handle.device_counts
    fields = _payload(x)
    widths = [_row_bytes(f) for f in fields]
    offs, total = field_offsets(widths, cap)
    fast.transport.ensure(COUNTS_BYTES + total)
    key = ("cached", tuple(offs), tuple(widths), cap)
    src = [_src_words(f) for f in fields]
    fast.transport.barrier()  # peers finished reading what the previous op left in their buffers
    for d in _peers(rank, world):
        dst = fast.view((*key, d), lambda d=d: _regions(fast.transport.buffer(d), offs, widths, cap))
        nosync.push(handle.send_pos[d], mat, rank, d, cap, list(zip(src, dst)), from_send_pos=True)
    outs = [_empty_words(cap, rb, dev) for rb in widths]
    nosync.push(handle.send_pos[rank], mat, rank, rank, cap, list(zip(src, outs)), from_send_pos=True)
    fast.transport.barrier()
    mine = fast.view((*key, rank), lambda: _regions(fast.transport.buffer(rank), offs, widths, cap))
    nosync.copy_out(mat, rank, cap, list(zip(mine, outs)), None)
    out = [_typed_out(b, f) for b, f in zip(outs, fields)]
    return tuple(out) if isinstance(x, tuple) else out[0]


def combine(fast: IntranodeNormal, y: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor | None):
    """`reference.combine` for a no-sync handle: y [num_worst_tokens, ...] (rows past the received ones are
    ignored) -> (combined [t, ...] y.dtype, combined weights fp32 [t, k] or None); no host sync."""
    world, rank, dev = fast.world, fast.rank, fast.device
    mark = _stage_marker(dev)
    cap, mat, t = handle.num_worst_tokens, handle.device_counts, handle.num_tokens
    fields = [y.contiguous()] if topk_weights is None else [y.contiguous(), topk_weights.contiguous()]
    widths = [_row_bytes(f) for f in fields]
    cap_back = world * cap  # any rank's send total <= the rows all ranks receive
    offs, total = field_offsets(widths, cap_back)
    fast.transport.ensure(COUNTS_BYTES + total)
    key = ("combine", tuple(offs), tuple(widths), tuple(f.dtype for f in fields), cap_back)  # dtypes: typed views
    src = [_src_words(f) for f in fields]
    fast.transport.barrier()  # sources finished reading what the previous op left in their buffers
    mark("barrier0")
    for s in _peers(rank, world):
        dst = fast.view((*key, s), lambda s=s: _regions(fast.transport.buffer(s), offs, widths, cap_back))
        nosync.combine_send(mat, rank, s, cap, list(zip(src, dst)), cap)
    mark("send")
    fast.transport.barrier()
    mark("barrier1")
    backs = fast.view((*key, "back"), lambda: _typed_regions(fast.transport.buffer(rank), offs, fields, cap_back))
    out = []
    for f, back in zip(fields, backs):
        o = torch.empty((t, *f.shape[1:]), dtype=f.dtype, device=dev)
        nosync.reduce(handle.send_pos, mat, rank, back, f, o)
        out.append(o)
    mark("reduce")
    return out[0], (out[1] if topk_weights is not None else None)


# GPU stage times (diagnostics for the benchmark; off unless a list is installed here): per call a list of
# (stage, CUDA event recorded in stream order when the stage's work is queued), starting with "start".
STAGES: list[list[tuple[str, object]]] | None = None


def _stage_marker(dev: torch.device):
    """A callable recording a named CUDA event into a new STAGES entry, or a no-op (STAGES None, or CPU)."""
    if STAGES is None or dev.type != "cuda":
        return _no_stage
    entry: list[tuple[str, object]] = []
    STAGES.append(entry)

    def mark(name: str) -> None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        entry.append((name, ev))

    mark("start")
    return mark


def _no_stage(name: str) -> None:
    """Stage timing off."""


def _regions(buf: torch.Tensor, offs: list[int], widths: list[int], cap: int) -> list[torch.Tensor]:
    """Field regions [cap rows] of a buffer, as words."""
    return [_region(buf, COUNTS_BYTES + o, cap, rb) for o, rb in zip(offs, widths)]


def _typed_regions(buf: torch.Tensor, offs: list[int], fields: list[torch.Tensor], cap: int) -> list[torch.Tensor]:
    """Field regions [cap, *row shape] of a buffer in each field's dtype (the reduction reads values)."""
    out = []
    for o, f in zip(offs, fields):
        n = cap * _row_bytes(f)
        raw = buf[COUNTS_BYTES + o : COUNTS_BYTES + o + n]
        out.append(raw.view(f.dtype).reshape(cap, *f.shape[1:]))
    return out
