"""Intranode fast path of normal-mode dispatch / combine: ranks write rows straight into their peers' buffers.

Same contract and bit-identical outputs as `reference.py` (see `Buffer.dispatch` / `Buffer.combine`).
Per dispatch: one exchange of a small int64 row per rank (rows per destination, tokens per expert, and
a shape signature), one barrier and ONE host synchronisation (the count lists the API returns); then
each rank writes its rows for rank d directly into d's buffer at the offset the count matrix gives
(`_plan.Plan`), a barrier, and each rank copies its received rows out. Combine writes each returned
block into its source's buffer at the source's send offset (a contiguous copy), a barrier, and the
source sums the rows per token in rank order in float32 (a Triton kernel), reading its own rows from y
in place.

Two row movers (`DEEPINFER_DEEP_EP_IMPL`):
- "triton" (default): the fused kernels of `_fused.py` / `backends/triton/fused.py`: one launch computes
  the layout, every token's send position and the exchange row; one launch per destination moves every
  field (payload, scales, local top-k ids / weights, token index); one launch copies the peers' blocks
  out. The handle keeps the send positions, so combine's Triton reduction needs no index building.
  Cached dispatch needs no index work at all: it moves rows with index_select (`_move`) under both impls.
- "torch": torch ops only (layout, argsort, index_select, copy_, index_add_): the fallback when the
  Triton kernels fail their probe on some rank.

Buffers: see `_transport.py`. Each op starts with a barrier (or the count exchange, which ends in one)
before writing into a peer, so a peer has finished reading what the previous op left there.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._comm import pack_rows, unpack_rows
from ._plan import Plan, field_offsets, word_bytes
from ._transport import Transport, make_transport
from .handles import DispatchHandle
from .reference import XPayload, _local_routing, layout_nocheck

COUNTS_BYTES = 1 << 20  # head of the buffer: the exchanged count rows (R rows of R + E + SIG int64)
SIG = 8  # columns after the counts: payload code, hidden, scales width, k, t, idx min, idx max, bad layout


def _words(t: torch.Tensor) -> torch.Tensor:
    """[n, ...] contiguous -> [n, W] of the widest integer word dividing a row (int32 / int16 / uint8)."""
    n = t.shape[0]
    if n == 0:  # reshape(0, -1) is ambiguous
        b = torch.empty((0, _row_bytes(t)), dtype=torch.uint8, device=t.device)
    else:
        b = t.reshape(n, -1).view(torch.uint8)
    wb = word_bytes(b.shape[1])
    if b.storage_offset() % wb:  # a view starting mid-word (e.g. x[1:] of odd-width rows): realign
        b = b.clone()
    return b.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[wb])


def _row_bytes(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape[1:]:
        n *= s
    return n * t.dtype.itemsize


def _region(buf: torch.Tensor, off: int, rows: int, row_bytes: int) -> torch.Tensor:
    """Rows [rows, W words] of a field region that starts at byte `off` of a uint8 buffer."""
    wb = word_bytes(row_bytes)
    view = buf[off : off + rows * row_bytes]
    dtype = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[wb]
    return view.view(dtype).reshape(rows, row_bytes // wb)


class IntranodeNormal:
    """Normal-mode dispatch / combine of one process group over a `Transport`."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, num_nvl_bytes: int, impl: str) -> None:
        self.transport: Transport = make_transport(group, device, max(num_nvl_bytes, 2 * COUNTS_BYTES))
        self.rank, self.world, self.device, self.impl = self.transport.rank, self.transport.world, device, impl
        self.group, self._exchanges = group, 0
        self._pos_scratch: torch.Tensor | None = None  # the fused dispatch's position table (grow-only)
        self._pos_views: dict[int, tuple] = {}  # views of it per token count
        self._pinned: torch.Tensor | None = None  # host copy of the exchanged counts (CUDA, grow-only)
        self._pinned_ev = None
        self._views: dict[tuple, object] = {}  # views into the transport buffers, see `view`
        self.dispatch_cap = 0  # grow-only receive capacity (rows) of the fused dispatch: stable offsets, cached views
        if impl == "triton" and not _agree(group, device, self._probe()):
            # e.g. Triton refusing a peer pointer: the torch movers need nothing but copies and index_select
            import warnings

            warnings.warn("deep_ep: Triton row movers failed their probe on some rank; using torch", stacklevel=3)
            self.impl = "torch"

    def _probe(self) -> bool:
        """Run both Triton kernels once, across ranks: rows gathered into every peer, a local reduction.

        Every rank runs the same barriers whatever happens, so a failure on one rank cannot hang the others.
        """
        ok, dev, words = True, self.device, 64
        src = torch.arange(4 * words, dtype=torch.int32, device=dev).reshape(4, words) + 1000 * self.rank
        idx = torch.tensor([2, 0], dtype=torch.int64, device=dev)
        self.transport.barrier()
        try:
            for d in range(self.world):
                dst = _region(self.transport.buffer(d), COUNTS_BYTES + self.rank * 2 * words * 4, 2, words * 4)
                _gather(src, idx, dst, "triton")
        except Exception:  # noqa: BLE001 - reported through the agreement
            ok = False
        self.transport.barrier()
        try:
            mine = _region(self.transport.buffer(self.rank), COUNTS_BYTES, 2 * self.world, words * 4)
            want = torch.cat([src[idx] - 1000 * self.rank + 1000 * r for r in range(self.world)])
            ok = ok and torch.equal(mine, want) and _probe_reduce(dev)
            if ok and self.impl == "triton":  # the fused dispatch kernels too
                from ._fused import probe

                ok = probe(dev, self.world)
        except Exception:  # noqa: BLE001
            ok = False
        self.transport.barrier()  # everyone has read the probe rows before real traffic lands there
        return ok

    def view(self, key: tuple, make):
        """make() once per (key, buffer generation): views into the buffers cost host time on every call
        (a few us each on a GPU host, and a dispatch used ~40), so the fast path keeps them. The buffer
        size is in the key: it changes whenever the transport reallocates (grow-only), dropping old views."""
        key = (self.transport.nbytes, *key)
        got = self._views.get(key)
        if got is None:
            if len(self._views) > 512:  # many distinct shapes: start over rather than grow without bound
                self._views.clear()
            got = self._views[key] = make()
        return got

    # -- count exchange -------------------------------------------------------------------------------------
    def _exchange_slot(self, width: int) -> tuple[int, torch.Tensor]:
        """Byte offset of this exchange's row area, and our int64 [width] slot in OUR buffer's area."""
        half = COUNTS_BYTES // 2
        if self.world * width * 8 > half:
            raise ValueError(f"num_experts: too many for the fast path's count area ({width} columns)")
        # Alternate halves: a peer that left the previous exchange early (it raised on bad input, as we
        # did) may write this exchange's row while we still read the previous one.
        base = (self._exchanges % 2) * half
        self._exchanges += 1
        at = base + self.rank * width * 8
        mine = self.view(("slot", at, width), lambda: self.transport.buffer(self.rank)[at : at + width * 8])
        return base, mine.view(torch.int64)

    def _exchange(self, row: torch.Tensor, slot: tuple[int, torch.Tensor] | None = None) -> list[list[int]]:
        """Write our int64 row into slot `rank` of every rank's count area; barrier; return all rows.

        slot: from `_exchange_slot` when `row` already IS our slot (the fused layout kernel wrote it there).
        """
        return self._read_counts(self._share(row, slot))  # the one host synchronisation of a dispatch

    def _share(self, row: torch.Tensor, slot: tuple[int, torch.Tensor] | None = None) -> torch.Tensor:
        """`_exchange` without the host read: returns the int64 [R, width] area (our buffer) holding every
        rank's row once the GPU gets past the barrier (stream order; the no-sync dispatch reads it there)."""
        width = row.shape[0]
        base, mine = slot if slot is not None else self._exchange_slot(width)
        at = base + self.rank * width * 8
        if slot is None:
            mine.copy_(row)
        src = self.view(("slot", at, width), lambda: self.transport.buffer(self.rank)[at : at + width * 8])
        for r in _peers(self.rank, self.world):
            self.view(("slot-of", r, at, width), lambda r=r: self.transport.buffer(r)[at : at + width * 8]).copy_(src)
        self.transport.barrier()
        return self.view(("area", base, width), lambda: self._area(base, width))

    def _read_counts(self, area: torch.Tensor) -> list[list[int]]:
        """area.tolist(); on CUDA through a grow-only pinned buffer: an async copy + one event wait costs the
        host less than tolist's pageable copy (and allocates nothing per call)."""
        if self.device.type != "cuda":
            return area.tolist()
        n = area.numel()
        if self._pinned is None or self._pinned.numel() < n:
            self._pinned = torch.empty(max(n, 4096), dtype=torch.int64, pin_memory=True)
            self._pinned_ev = torch.cuda.Event()
        host = self._pinned[:n]
        host.copy_(area.view(-1), non_blocking=True)
        self._pinned_ev.record()
        self._pinned_ev.synchronize()
        return host.view(area.shape).tolist()

    def _area(self, base: int, width: int) -> torch.Tensor:
        """int64 [R, width]: every rank's exchanged row, in our buffer."""
        return (
            self.transport.buffer(self.rank)[base : base + self.world * width * 8]
            .view(torch.int64)
            .reshape(self.world, width)
        )

    def _exchange_row(self, per_rank, per_expert, sig: list[int], idx, mismatch) -> torch.Tensor:
        """[rows per rank (R) | tokens per expert (E) | sig (payload code, hidden, k, t) | idx min, max | bad]."""
        lo = idx.min().reshape(1) if idx.numel() else torch.zeros(1, dtype=torch.int64, device=idx.device)
        hi = idx.max().reshape(1) if idx.numel() else torch.full((1,), -1, dtype=torch.int64, device=idx.device)
        tail = torch.tensor(sig, dtype=torch.int64, device=idx.device)
        parts = [per_rank.to(torch.int64), per_expert.to(torch.int64), tail, lo.to(torch.int64), hi.to(torch.int64)]
        return torch.cat([*parts, mismatch.to(torch.int64).reshape(1)])

    # -- dispatch -------------------------------------------------------------------------------------------
    def dispatch(self, x, topk_idx, topk_weights, num_experts, is_token_in_rank, expert_alignment):
        """Fast `reference.dispatch` (same arguments and results)."""
        if self.impl == "triton":  # fused kernels: 1 layout launch, 1 push per rank, 1 copy-out
            from . import _fused

            return _fused.dispatch(self, x, topk_idx, topk_weights, num_experts, is_token_in_rank, expert_alignment)
        idx = topk_idx.to(torch.int64)
        t, world, rank = idx.shape[0], self.world, self.rank
        # Out-of-range ids become -1 for the layout (an index past E would fault on the GPU); the exchanged
        # min / max make every rank raise right after the exchange instead.
        safe = idx.masked_fill(idx >= num_experts, -1)
        per_rank, per_expert, layout = layout_nocheck(safe, num_experts, world)
        if is_token_in_rank is not None and t:
            mismatch = (is_token_in_rank != layout).any()
        else:
            mismatch = torch.zeros((), dtype=torch.bool, device=idx.device)
        fields = _payload(x)
        sig = [_payload_code(fields), *_payload_shape(fields), idx.shape[1], t]
        row = self._exchange_row(per_rank, per_expert, sig, idx, mismatch)
        # Queued before the host sync: the send order (by destination, then token) and the metadata rows.
        order = torch.argsort((~layout.T).reshape(-1).to(torch.int8), stable=True)
        meta = pack_rows([idx, topk_weights, torch.arange(t, device=idx.device)])
        counts = self._exchange(row)
        plan = _check_rows(counts, world, num_experts, rank)
        send_tok = order[: plan.send_total(rank)] % max(t, 1)
        all_fields = [*fields, meta]
        recv = self._move(all_fields, send_tok, plan)
        *recv_x, recv_meta = [unpack_rows(r.view(torch.uint8), _like(f))[0] for r, f in zip(recv, all_fields)]
        recv_idx, recv_w, recv_src = unpack_rows(recv_meta, _meta_like(idx.shape[1]))
        local_idx, local_w = _local_routing(recv_idx, recv_w, rank, num_experts // world)
        lists = _per_expert_lists(counts, world, num_experts, rank, expert_alignment)
        handle = DispatchHandle(
            t, num_experts, layout, send_tok, list(plan.matrix[rank]), [plan.matrix[s][rank] for s in range(world)],
            recv_src, lists, [list(r) for r in plan.matrix],
        )  # fmt: skip
        out_x = tuple(recv_x) if isinstance(x, tuple) else recv_x[0]
        return out_x, local_idx, local_w, lists, handle

    def cached_dispatch(self, x: XPayload, handle: DispatchHandle) -> XPayload:
        """Fast `reference.cached_dispatch`: x only, along the routing of `handle` (no count exchange)."""
        plan = Plan.of(handle.count_matrix)
        fields = _payload(x)
        self.transport.barrier()  # peers finished reading what the previous op left in their buffers
        recv = self._move(fields, handle.send_token_idx, plan)
        out = [unpack_rows(r.view(torch.uint8), _like(f))[0] for r, f in zip(recv, fields)]
        return tuple(out) if isinstance(x, tuple) else out[0]

    def _move(self, fields: list[torch.Tensor], send_tok: torch.Tensor, plan: Plan) -> list[torch.Tensor]:
        """Send rows send_tok[block d] of every field to rank d; return the received rows per field (words)."""
        rank, world = self.rank, self.world
        widths = [_row_bytes(f) for f in fields]
        offs, total = field_offsets(widths, plan.dispatch_cap())
        self.transport.ensure(COUNTS_BYTES + total)
        words = [_words(f.contiguous()) for f in fields]
        for d in _peers(rank, world):  # the transfer: gather straight into the peer's buffer
            n, so = plan.matrix[rank][d], plan.send_off(rank, d)
            if n == 0:
                continue
            buf, at = self.transport.buffer(d), plan.recv_off(rank, d)
            for w, off, rb in zip(words, offs, widths):
                dst = _region(buf, COUNTS_BYTES + off + at * rb, n, rb)
                # index_select, with either impl: over NVLink it moves rows as fast as the Triton gather (101
                # vs 102 us, 2026-11-30) and costs the host less to launch (cached dispatch: 210 vs 287 us)
                _gather(w, send_tok[so : so + n], dst, "torch")
        self.transport.barrier()
        return [self._copy_out(w, off, rb, send_tok, plan) for w, off, rb in zip(words, offs, widths)]

    def _copy_out(self, w: torch.Tensor, off: int, rb: int, send_tok: torch.Tensor, plan: Plan) -> torch.Tensor:
        """Received rows of one field in source-rank order: peers' blocks from our buffer, ours from w."""
        rank = self.rank
        n_recv = plan.recv_total(rank)
        out = torch.empty((n_recv, w.shape[1]), dtype=w.dtype, device=w.device)
        lo, n_self = plan.recv_off(rank, rank), plan.matrix[rank][rank]
        hi = lo + n_self
        region = _region(self.transport.buffer(rank), COUNTS_BYTES + off, n_recv, rb)
        if lo > 0:
            out[:lo].copy_(region[:lo])
        if hi < n_recv:
            out[hi:].copy_(region[hi:])
        so = plan.send_off(rank, rank)
        _gather(w, send_tok[so : so + n_self], out[lo:hi], "torch")  # local: index_select is as fast
        return out

    # -- combine --------------------------------------------------------------------------------------------
    def combine(self, y: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor | None):
        """Fast `reference.combine` (same results, bit for bit on CPU and for 2 ranks)."""
        plan, rank = Plan.of(handle.count_matrix), self.rank
        fields = [y.contiguous()] if topk_weights is None else [y.contiguous(), topk_weights.contiguous()]
        widths = [_row_bytes(f) for f in fields]
        offs, total = field_offsets(widths, plan.combine_cap())
        self.transport.ensure(COUNTS_BYTES + total)
        self.transport.barrier()  # sources finished reading what the previous op left in their buffers
        for s in _peers(rank, self.world):
            n, at, so = plan.matrix[s][rank], plan.recv_off(s, rank), plan.send_off(s, rank)
            if n == 0:
                continue
            for f, off, rb in zip(fields, offs, widths):
                dst = _region(self.transport.buffer(s), COUNTS_BYTES + off + so * rb, n, rb)
                dst.copy_(_words(f[at : at + n]))
        self.transport.barrier()
        parts = enumerate(zip(fields, offs, widths))
        out = [self._reduce(f, off, rb, handle, plan, i == 0) for i, (f, off, rb) in parts]
        return out[0], (out[1] if topk_weights is not None else None)

    def _reduce(self, f: torch.Tensor, off: int, rb: int, handle: DispatchHandle, plan: Plan, is_x: bool):
        """Sum the returned rows per token (rank order, float32, one rounding to f.dtype)."""
        rank, t = self.rank, handle.num_tokens
        n_back = plan.send_total(rank)
        raw = self.transport.buffer(rank)[COUNTS_BYTES + off : COUNTS_BYTES + off + n_back * rb]
        back = raw.view(f.dtype).reshape(n_back, *f.shape[1:])
        lo = plan.send_off(rank, rank)
        hi, shift = lo + plan.matrix[rank][rank], plan.recv_off(rank, rank) - lo
        out = torch.empty((t, *f.shape[1:]), dtype=f.dtype, device=f.device)
        if is_x and self.impl == "triton" and f.dim() == 2:
            from .backends.triton.rows import combine_reduce_triton

            pos = handle.send_pos if handle.send_pos is not None else _position_map(handle, plan, rank)
            combine_reduce_triton(pos, back, f, out, (lo, hi), shift)
            return out
        acc = torch.zeros((t, *f.shape[1:]), dtype=torch.float32, device=f.device)
        for d in range(self.world):  # ascending rank, as the reference's index_add_ over its send order
            n, so = plan.matrix[rank][d], plan.send_off(rank, d)
            if n:
                rows = f[so + shift : so + shift + n] if d == rank else back[so : so + n]
                acc.index_add_(0, handle.send_token_idx[so : so + n], rows.to(torch.float32))
        return out.copy_(acc)

    def destroy(self) -> None:
        extra = getattr(self, "_overlap_state", None)  # the overlapped variant's buffers, when it ran
        if extra is not None:
            extra.close()
        self._views.clear()  # the cached views hold the buffers: drop them with the transport's
        self._pos_views.clear()
        self.transport.close()


def _probe_reduce(device: torch.device) -> bool:
    """The Triton combine reduction on a tiny case equals the torch one (bf16, round to nearest even)."""
    from .backends.triton.rows import combine_reduce_triton

    g = torch.Generator().manual_seed(0)
    back, y = torch.randn(3, 40, generator=g).bfloat16().to(device), torch.randn(2, 40, generator=g).bfloat16()
    y = y.to(device)
    pos = torch.tensor([[0, -1, 1], [3, 2, -1]], device=device)  # 3..4 are ours: y[p - 3]
    out = torch.empty(3, 40, dtype=torch.bfloat16, device=device)
    combine_reduce_triton(pos, back, y, out, (2, 4), -2)
    want = torch.stack([back[0].float() + y[1].float(), y[0].float(), back[1].float()]).bfloat16()
    return torch.equal(out, want)


def _peers(rank: int, world: int) -> list[int]:
    """Other ranks, starting after ours (so ranks do not all write to rank 0 first)."""
    return [(rank + i) % world for i in range(1, world)]


def _gather(src: torch.Tensor, idx: torch.Tensor, dst: torch.Tensor, impl: str) -> None:
    if impl == "triton":
        from .backends.triton.rows import gather_rows

        gather_rows(src, idx, dst, "triton")
    elif idx.numel():
        torch.index_select(src, 0, idx, out=dst)


def _payload(x: XPayload) -> list[torch.Tensor]:
    return [p.contiguous() for p in (x if isinstance(x, tuple) else (x,))]


_CODES = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3, torch.float8_e4m3fn: 4, torch.float8_e8m0fnu: 5}


def _payload_code(fields: list[torch.Tensor]) -> int:
    """One int naming the payload's dtypes (every rank must send the same kind of x)."""
    code = 0
    for f in fields:
        code = code * 8 + _CODES[f.dtype]
    return code


def _payload_shape(fields: list[torch.Tensor]) -> list[int]:
    """hidden, and the scales' width (0 without scales)."""
    return [fields[0].shape[1], fields[1].shape[1] if len(fields) > 1 else 0]


def _like(f: torch.Tensor) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    return [(f.dtype, tuple(f.shape[1:]))]


def _meta_like(k: int) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    return [(torch.int64, (k,)), (torch.float32, (k,)), (torch.int64, ())]


def _check_rows(rows: list[list[int]], world: int, num_experts: int, rank: int) -> Plan:
    """Validate the exchanged rows identically on every rank (so every rank raises, none hangs)."""
    sigs = [r[world + num_experts : world + num_experts + 4] for r in rows]
    if any(s != sigs[0] for s in sigs):
        raise ValueError(f"x / topk_idx: every rank must dispatch the same dtype, hidden and k; got {sigs}")
    lo = min(r[world + num_experts + 5] for r in rows)
    hi = max(r[world + num_experts + 6] for r in rows)
    if lo < -1 or hi >= num_experts:
        raise ValueError(f"topk_idx: expected expert ids in [-1, {num_experts - 1}], got values in [{lo}, {hi}]")
    bad = [r for r, row in enumerate(rows) if any(row[world + num_experts + 7 :])]  # 1 (torch) or R flags
    if bad:  # raised on every rank: a rank that went on alone would wait for the others forever
        raise ValueError(f"is_token_in_rank: does not match the layout of topk_idx on rank(s) {bad}")
    return Plan.of([r[:world] for r in rows])


def _per_expert_lists(rows: list[list[int]], world: int, num_experts: int, rank: int, align: int) -> list[int]:
    """Tokens received per local expert (sum over sources of their tokens per expert), rounded up to align."""
    per_rank = num_experts // world
    lo = world + rank * per_rank
    counts = [sum(r[lo + e] for r in rows) for e in range(per_rank)]
    return [-(-c // align) * align for c in counts]


def _position_map(handle: DispatchHandle, plan: Plan, rank: int) -> torch.Tensor:
    """int64 [R, t]: send position of token t's block-d row, -1 where t was not sent to d."""
    t, dev = handle.num_tokens, handle.send_token_idx.device
    total = plan.send_total(rank)
    pos = torch.full((plan.world, t), -1, dtype=torch.int64, device=dev)
    if total:
        counts = torch.tensor(plan.matrix[rank], dtype=torch.int64, device=dev)
        dest = torch.repeat_interleave(torch.arange(plan.world, device=dev), counts, output_size=total)
        pos[dest, handle.send_token_idx] = torch.arange(total, device=dev)
    return pos


IMPLS = ("triton", "torch")
IMPL_ENV = "DEEPINFER_DEEP_EP_IMPL"


def _agree(group: dist.ProcessGroup, device: torch.device, ok: bool) -> bool:
    """True when `ok` holds on every rank of the group (an all-reduce of one int)."""
    on_cuda = device.type == "cuda" and "nccl" in str(dist.get_backend(group)).lower()
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device if on_cuda else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _local_problem(device: torch.device, impl: str) -> str | None:
    """Why this rank cannot run the fast path on `device` (None when it can)."""
    if impl not in IMPLS:
        return f"{IMPL_ENV}: expected one of {'|'.join(IMPLS)}, got {impl!r}"
    if device.type == "cuda":
        try:
            import torch.distributed._symmetric_memory  # noqa: F401
        except ImportError as exc:
            return f"torch symmetric memory is unavailable ({exc})"
    elif device.type != "cpu":
        return f"device {device.type!r} has no intranode fast path"
    if impl == "triton":
        try:
            import triton  # noqa: F401
        except ImportError as exc:
            return f"triton is unavailable ({exc})"
    return None


def create_intranode(group: dist.ProcessGroup, device: torch.device, num_nvl_bytes: int) -> IntranodeNormal | bool:
    """The fast path when every rank can build it, else False (with a warning: the reference runs).

    Row movers: `DEEPINFER_DEEP_EP_IMPL` = "triton" (default) or "torch" (index_select / copy_).
    Every rank checks its prerequisites, then all agree, then allocate, then agree again, so that no
    rank waits in a collective another rank skipped.
    """
    import os
    import socket
    import warnings

    impl = os.environ.get(IMPL_ENV, "triton").strip().lower() or "triton"
    problem = _local_problem(device, impl)
    hosts: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    if problem is None and len(set(hosts)) > 1:  # CUDA IPC mappings do not cross hosts
        problem = f"the group spans {len(set(hosts))} hosts (the fast path is intranode only)"
    if not _agree(group, device, problem is None):
        warnings.warn(f"deep_ep: intranode fast path off, reference runs ({problem or 'a peer cannot'})", stacklevel=3)
        return False
    fast, err = None, None
    try:
        fast = IntranodeNormal(group, device, num_nvl_bytes, impl)
    except Exception as exc:  # noqa: BLE001 - any failure means: use the reference, on every rank
        err = f"{type(exc).__name__}: {exc}"
    if not _agree(group, device, fast is not None):
        warnings.warn(f"deep_ep: intranode fast path off, reference runs ({err or 'a peer failed'})", stacklevel=3)
        return False
    return fast
