"""Intranode fast path of low-latency (decode) dispatch / combine: no host sync, CUDA-graph safe.

Same layout and row order as `reference_ll.py` (rows of an expert: by source rank, then token), but:
- one LL buffer per rank (symmetric memory on CUDA, /dev/shm on CPU), sized for max_tokens and grown
  (a collective, never inside a graph) only when a call needs more; peer views resolved once;
- dispatch = `ll_send` (one program per token pushes its k rows, payload + scales + (token, slot), into
  the owners' staging rows [expert, source rank, j], j = earlier tokens of ours with that expert: fixed
  positions, so no cross-rank atomics are needed, which is what lets shared memory emulate it on CPU; plus
  our per-expert counts) + `signal` (epoch flag into every peer) + `ll_recv` (wait for every source's flag,
  then pack each expert's staged rows at the front of recv_x: the masked layout);
- combine = `ll_combine_send` (every valid row back to its source's [token, slot] row) + `signal` +
  `ll_combine_reduce` (wait, then sum_k w * y in fp32 in slot order, one rounding).
With `return_recv_hook=True` the call returns after the sends; the hook launches only the receive kernel.
FP8 quantisation: `ll.quant_fp8` (one launch, the same bits as `per_token_cast_to_fp8`: checked on the
device when the path starts, else the torch ops run; DEEPINFER_DEEP_EP_LL_QUANT=torch forces the latter).
Outputs of dispatch (recv_x, scales) live in buffers the fast path keeps: they stay valid until the next
low_latency_dispatch (DeepEP's contract too).
Not checked on this path (a check would need a host sync): distinct experts per row, ids < num_experts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ._plan import align_up
from ._transport import Transport, make_transport
from .backends.triton import ll
from .handles import LowLatencyFastHandle
from .reference_ll import per_token_cast_to_fp8

QUANT_ENV = "DEEPINFER_DEEP_EP_LL_QUANT"  # "triton" (default, when its probe passes) / "torch"
HEAD_WORDS = 64  # the flag rows [2, R] (R <= 8) at the start of every LL buffer
SPIN_LIMIT = {"cuda": 1 << 22, "cpu": 1 << 17}  # spins before a wait gives up and sets the timeout flag


def _al(n: int) -> int:
    return align_up(n, 64)  # words: 256-byte aligned regions


@dataclass(frozen=True)
class LLLayout:
    """Word offsets in an LL buffer. Parity p's regions start at offset + p * par (flags at 0 are shared).

    Per parity: counts int32 [R, E_local] (row s: rows source s sent per expert), staging x / scales /
    (token, slot) [E_local, R, max_t, words], combine area [max_t, k, hidden words (room for fp32)].
    """

    flags: int
    cnt: int
    x: int
    s: int
    meta: int
    cmb: int
    par: int

    @staticmethod
    def of(world: int, per_rank: int, max_t: int, k: int, xw: int, sw: int, hidden: int) -> LLLayout:
        rows = per_rank * world * max_t
        cnt = HEAD_WORDS
        x = cnt + _al(world * per_rank)
        s = x + _al(rows * xw)
        meta = s + _al(rows * sw)
        cmb = meta + _al(rows * 2)
        par = cmb + _al(max_t * k * hidden) - HEAD_WORDS
        return LLLayout(0, cnt, x, s, meta, cmb, par)

    @property
    def words(self) -> int:
        return HEAD_WORDS + 2 * self.par


def _words(t: torch.Tensor) -> torch.Tensor:
    """[n, ...] -> contiguous int32 words [n, bytes / 4] (callers made sure a row is whole words)."""
    t = t.contiguous()
    row_bytes = _row_bytes(t)
    return t.view(torch.uint8).reshape(t.shape[0], row_bytes).view(torch.int32)


def _row_bytes(t: torch.Tensor) -> int:
    n = t.element_size()
    for s in t.shape[1:]:
        n *= s
    return n


def fast_ok(hidden: int, x_dtype: torch.dtype, use_fp8: bool, use_ue8m0: bool, world: int) -> bool:
    """Whether rows of this call are whole int32 words and the group fits the kernels (same on every rank)."""
    if world > ll.MAX_PEERS:
        return False
    if use_fp8:
        return not use_ue8m0 or (hidden // 128) % 4 == 0
    return (hidden * x_dtype.itemsize) % 4 == 0


class IntranodeLowLatency:
    """Low-latency dispatch / combine of one process group over a `Transport` (see the module docstring)."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device) -> None:
        self.transport: Transport = make_transport(group, device, 1 << 20)
        self.rank, self.world, self.device = self.transport.rank, self.transport.world, device
        self.ctr = torch.zeros(4, dtype=torch.int32, device=device)  # epochs (dispatch, combine), timeout
        self.spin_limit = SPIN_LIMIT.get(device.type, 1 << 20)
        self._caps = (0,) * 6  # (per_rank, max_t, k, xw, sw, hidden) the layout is sized for
        self.layout = LLLayout.of(self.world, 0, 0, 0, 0, 0, 0)
        self._outs: dict[str, torch.Tensor] = {}
        self.quant = _pick_quant(device)  # "triton" (one launch) or "torch" (per_token_cast_to_fp8)
        self._reset_flags()

    def _reset_flags(self) -> None:
        """Zero our flag rows and the epochs (a fresh buffer), then wait until every rank did the same."""
        self.transport.buffer(self.rank)[: HEAD_WORDS * 4].zero_()
        self.ctr.zero_()
        self._peers = [self.transport.buffer(d).view(torch.int32) for d in range(self.world)]
        self.transport.barrier()

    def _ensure(self, per_rank: int, max_t: int, k: int, xw: int, sw: int, hidden: int) -> LLLayout:
        """Grow-only capacities; reallocates (a collective, same arguments on every rank) when bytes run out."""
        caps = tuple(max(a, b) for a, b in zip(self._caps, (per_rank, max_t, k, xw, sw, hidden)))
        if caps != self._caps:
            self._caps = caps
            self.layout = LLLayout.of(self.world, *caps)
            if self.layout.words * 4 > self.transport.nbytes:
                self.transport.ensure(self.layout.words * 4)
                self._reset_flags()
        return self.layout

    def _out(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """int32 [shape] view of a grow-only output buffer kept across calls."""
        n = 1
        for s in shape:
            n *= s
        have = self._outs.get(name)
        if have is None or have.numel() < n:
            have = torch.empty(max(n, 1), dtype=torch.int32, device=self.device)
            self._outs[name] = have
        return have[:n].view(shape)

    def probe(self) -> str | None:
        """One tiny dispatch + combine through every kernel (compiles them); None when the result is right.

        Token 0 of every rank goes to local expert 0 of every rank, with x = rank + 1 everywhere: expert 0
        must receive one row per source rank, in rank order, and combine (y = recv_x, weights 1) must return
        R * x. Every rank runs it (the kernels wait for each other), then `create_low_latency` agrees.
        """
        world, dev = self.world, self.device
        per, hidden = 2, 128
        x = torch.full((1, hidden), float(self.rank + 1), dtype=torch.bfloat16, device=dev)
        idx = torch.arange(world, device=dev).reshape(1, world) * per
        recv, count, handle, _ = self.dispatch(x, idx, 1, per * world, False, False, False, False)
        want = torch.arange(1, world + 1, dtype=torch.bfloat16, device=dev)[:, None].expand(world, hidden)
        out, _ = self.combine(recv, idx, torch.ones((1, world), device=dev), handle, None, False)
        if count.tolist() != [world] + [0] * (per - 1) or not torch.equal(recv[0, :world], want):
            return f"probe: dispatch placed wrong rows (counts {count.tolist()})"
        if not torch.equal(out, x * world) or self.timed_out():
            return "probe: combine returned wrong values" + (" (a wait timed out)" if self.timed_out() else "")
        return None

    def timed_out(self) -> bool:
        """Whether a wait ever gave up (a host sync: for tests and diagnostics only)."""
        return bool(self.ctr[2].item())

    def dispatch(self, x, idx, max_t, num_experts, use_fp8, round_scale, use_ue8m0, return_recv_hook):
        """`Buffer.low_latency_dispatch` (arguments already checked): (recv_x, recv_count, handle, hook)."""
        world, rank = self.world, self.rank
        t, hidden = x.shape
        k = idx.shape[1]
        per_rank, slots = num_experts // world, max_t * world
        quant = ll.quant_fp8 if self.quant == "triton" else per_token_cast_to_fp8
        fields = list(quant(x.contiguous(), round_scale, use_ue8m0)) if use_fp8 else [x]
        words = [_words(f) for f in fields]
        xw, sw = words[0].shape[1], (words[1].shape[1] if use_fp8 else 0)
        lay = self._ensure(per_rank, max_t, k, xw, sw, hidden)
        out_x = self._out("x", (per_rank, slots, xw))
        out_s = self._out("s", (per_rank, slots, sw)) if use_fp8 else None
        meta = torch.empty((per_rank, slots, 4), dtype=torch.int32, device=self.device)
        count = torch.empty((per_rank,), dtype=torch.int32, device=self.device)
        idx64 = idx.to(torch.int64).contiguous()
        s = words[1] if use_fp8 else None
        ll.ll_send(words[0], s, idx64, self.ctr, self._peers, rank, per_rank, max_t, num_experts, lay)
        ll.signal(self.ctr, 0, self._peers, rank, lay.flags)
        me = self._peers[rank]

        def recv() -> None:
            ll.ll_recv(me, self.ctr, out_x, out_s, meta, count, world, max_t, lay, self.spin_limit)

        hook = _deferred(recv, return_recv_hook)
        recv_x = _as(out_x, fields[0])
        if use_fp8:
            recv_x = (recv_x, _as(out_s, fields[1]))
        handle = LowLatencyFastHandle(t, hidden, num_experts, max_t, k, meta, count)
        return recv_x, count, handle, hook

    def combine(self, y, idx, w, handle: LowLatencyFastHandle, out, return_recv_hook):
        """`Buffer.low_latency_combine` (arguments already checked): (combined [t, hidden], hook)."""
        world, rank = self.world, self.rank
        per_rank, slots, hidden = y.shape
        lay = self._ensure(per_rank, handle.num_max_dispatch_tokens_per_rank, handle.k, 0, 0, hidden)
        yw = _words(y.reshape(per_rank * slots, hidden)).view(per_rank, slots, -1)
        if out is None:
            out = torch.empty((handle.num_tokens, hidden), dtype=y.dtype, device=y.device)
        ll.ll_combine_send(yw, handle.recv_meta, handle.recv_count, self.ctr, self._peers, handle.k, lay)
        ll.signal(self.ctr, 1, self._peers, rank, lay.flags)
        me, me_y = self._peers[rank], self.transport.buffer(rank).view(y.dtype)
        idx64, wc = idx.to(torch.int64).contiguous(), w.contiguous()
        # the reduction writes into out: a contiguous target (a strided `out` gets the result copied in)
        target = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)

        def reduce() -> None:
            ll.ll_combine_reduce(me, me_y, self.ctr, idx64, wc, target, world, lay, self.spin_limit)
            if target is not out:
                out.copy_(target)

        return out, _deferred(reduce, return_recv_hook)

    def destroy(self) -> None:
        self.transport.close()
        self._outs.clear()


def _pick_quant(device: torch.device) -> str:
    """The FP8 quantiser: the one-launch Triton kernel when it reproduces per_token_cast_to_fp8 bit for bit
    on this device (all three scale variants, zero rows and tiny values included), else the torch ops."""
    want = os.environ.get(QUANT_ENV, "triton").strip().lower() or "triton"
    if want not in ("triton", "torch"):
        raise ValueError(f"{QUANT_ENV}: expected triton|torch, got {want!r}")
    if want == "torch":
        return "torch"
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8, 512, generator=g) * torch.exp2(torch.randint(-30, 20, (8, 1), generator=g).float())
    x[3], x[4, :128] = 0.0, 1e-30
    x = x.bfloat16().to(device)
    try:
        for rs, ue in ((False, False), (True, False), (True, True)):
            got, want_ = ll.quant_fp8(x, rs, ue), per_token_cast_to_fp8(x, rs, ue)
            if not all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want_)):
                raise ValueError(f"differs from per_token_cast_to_fp8 (round_scale={rs}, use_ue8m0={ue})")
    except Exception as exc:  # noqa: BLE001 - the torch quantiser always works
        import warnings

        warnings.warn(f"deep_ep: Triton FP8 quantiser off, torch ops run ({exc})", stacklevel=3)
        return "torch"
    return "triton"


def _as(words: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """int32 words [E, slots, w] -> like's dtype [E, slots, like's row shape]."""
    e, slots, _ = words.shape
    return words.view(torch.uint8).view(like.dtype).reshape(e, slots, *like.shape[1:])


def _no_op() -> None:
    """The receive already ran."""


def _deferred(fn: Callable[[], None], defer: bool) -> Callable[[], None]:
    """Run fn now and return a no-op, or return fn itself as the hook (DeepEP's return_recv_hook)."""
    if defer:
        return fn
    fn()
    return _no_op


def create_low_latency(group: dist.ProcessGroup, device: torch.device) -> IntranodeLowLatency | bool:
    """The LL fast path when every rank can build it, else False (with a warning: the reference runs)."""
    import socket
    import warnings

    from .intranode import _agree, _local_problem

    problem = _local_problem(device, "triton")
    hosts: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    if problem is None and len(set(hosts)) > 1:
        problem = f"the group spans {len(set(hosts))} hosts (the fast path is intranode only)"
    if problem is None and dist.get_world_size(group) > ll.MAX_PEERS:
        problem = f"more than {ll.MAX_PEERS} ranks"
    if not _agree(group, device, problem is None):
        why = problem or "a peer cannot"
        warnings.warn(f"deep_ep: low-latency fast path off, reference runs ({why})", stacklevel=3)
        return False
    fast, err = None, None
    try:
        fast = IntranodeLowLatency(group, device)
        err = fast.probe()
    except Exception as exc:  # noqa: BLE001 - any failure means: use the reference, on every rank
        err = f"{type(exc).__name__}: {exc}"
    if not _agree(group, device, fast is not None and err is None):
        warnings.warn(f"deep_ep: low-latency fast path off, reference runs ({err or 'a peer failed'})", stacklevel=3)
        return False
    return fast
