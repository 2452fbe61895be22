"""The no-sync normal mode with its stages overlapped (`dispatch(num_worst_tokens=W)`: the default since session
5, see `enabled`; `overlap=False` runs `_nosync.py`).

Same contract and results as `_nosync.py` (bit for bit: the received rows, padding, counts tensor, handle),
fewer stages in series (kernels in `backends/triton/overlap.py`):
  dispatch = `overlap.layout` (a multi-program scan: per-block counts, the offsets come later) + ONE
  `overlap.dispatch` launch in which every rank publishes its count row into every peer's buffer with an
  epoch flag (no separate count exchange, no barrier), pushes its rows into each peer's region of its own
  (a source's region has W rows, so no sender needs another rank's counts) with an arrival tag per row and
  column block, and copies each block of a source's rows out as soon as their tags arrive (the copy-out
  runs behind the pushes still in flight);
  combine = a 1-program epoch bump + ONE `overlap.combine` launch: rows back into their source's buffer at
  their send positions, with arrival tags; the source sums each token in rank order, waiting for the tags
  of a peer's rows just before reading them (fp32, one rounding: the reference's bits).
Graph-safe: epochs live on the device and only grow; count areas and row regions are doubled by epoch
parity. The variant has its own two symmetric buffers (dispatch, combine: R * W rows per field and parity,
allocated at its first call, grown only when a call needs more; a collective, so never inside a capture).

Eligible calls: payload rows of whole int32 words (bf16 / fp16 / fp32 with an even hidden, FP8 with fp32
scales or e8m0 scales of whole words), k <= 16, R <= 8; others run `_nosync` (same results). A cached
dispatch with an overlap handle runs `_nosync.cached_dispatch` (the handle has the same tables).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ._fused import _empty_words, _src_words, _typed_out
from ._nosync import _stage_marker
from ._plan import align_up, field_offsets, grown_size
from ._transport import Transport, make_transport
from .backends.triton import overlap as ov
from .backends.triton.fused import row_width
from .handles import DispatchHandle
from .intranode import IntranodeNormal, _payload, _payload_code, _payload_shape, _row_bytes
from .reference import XPayload

HEAD_BYTES = 4096  # int64 flags at the head of each buffer (count / row flags, or combine flags)
ENV = "DEEPINFER_DEEP_EP_OVERLAP"  # "0": num_worst_tokens calls that do not pass overlap take `_nosync`
# program order of the dispatch launch (`overlap.ORDERS`): "mixed" (the default since session 6: the copy-out
# programs launched first, pushes and own-block copies interleaved; session 5 round 3 on 2 H200s: dispatch bf16
# 136.7 vs 150.3 us from a CUDA graph, bit-exact; its 2-GPU test passed in session 6 run 1) or "serial"; read per call
ORDER_ENV = "DEEPINFER_DEEP_EP_OVERLAP_ORDER"
# the combine launch's config (`overlap.COMBINE_CONFIGS`): "base" (the default), "wide" / "wide4" (session 5: 2x /
# 4x the tokens per reduce program, so the reduction of the last rows to land takes fewer rounds; round 3 on 2
# H200s: 111.7 / 112.6 vs 113.2 us from a CUDA graph, 2-GPU test passed: 1.1-1.4 %, one run, so not the default)
# session 6 adds "fold", "wide_fold", "send2", "wide_fold_send2" (opt-in, see `overlap.COMBINE_CONFIGS`)
COMBINE_ENV = "DEEPINFER_DEEP_EP_OVERLAP_COMBINE"
# the dispatch launch's config (`overlap.DISPATCH_CONFIGS`): "early" (the default since session 6: the rows-per-rank
# part of the count row first with its own flag, which the copies wait for; session 6 run 3 on 2 H200s from a CUDA
# graph: bf16 122.9 vs 136.8 us for "base", FP8 78.0 vs 84.9, bit-exact, 2-GPU test passed), "base" (the session-5
# kernel) or "fused" (opt-in: "early" + the layout scan inside the dispatch launch; 2-GPU test passed, not yet
# timed from a graph); read per call
DISPATCH_ENV = "DEEPINFER_DEEP_EP_OVERLAP_DISPATCH"
# benchmark-only (`overlap.DIAGS`: the dispatch with some roles doing nothing, WRONG results): unset for real calls
DIAG_ENV = "DEEPINFER_DEEP_EP_OVERLAP_DIAG"
# polls before a wait gives up (sets the timeout flag): a peer's first call may still be compiling its
# kernels (tens of seconds) while ours already waits on the GPU
SPIN_LIMIT = {"cuda": 1 << 27, "cpu": 1 << 21}


def enabled(overlap: bool | None) -> bool:
    """The caller's choice, or the environment's: on unless DEEPINFER_DEEP_EP_OVERLAP=0.

    The default of the no-sync mode since session 5, from the 2-H200 run at V4-Flash shapes (4096 tokens per
    rank, hidden 4096, top-6 of 256; build/s5/r2, benchmarks/results/2026-11-30-s5-bench-deep_ep.json), every
    row bit-exact with the reference: from CUDA graphs dispatch bf16 150.0 us vs 219.2 us for `_nosync` (222
    vs 152 GB/s), FP8 88.8 vs 157.0 us, combine bf16 113.0 vs 126.1 us (292 vs 262 GB/s); GPU stages of a
    dispatch: layout 10.3 + one kernel 142.2 us vs `_nosync`'s 65.0 + 23.2 + 5.5 + 97.6 + 7.9 + 44.8 us. Eager
    calls (host-bound, so they time the host's launch work more than the GPU's): FP8 dispatch 324 vs 710 us
    and combine 135 vs 203 us win, bf16 dispatch loses (579 vs 457 us, not investigated); a CUDA graph is how
    the no-sync mode is meant to run. Round 3 (benchmarks/results/2026-11-30-s5r3-bench-deep_ep.json) repeated
    the graph rows (150.3 vs 219.9, 88.9 vs 157.8, 113.2 vs 126.0 us) while the eager ones flipped (dispatch bf16
    470 vs 615 us and FP8 595 vs 645 win, combine 191 vs 178 loses): host-bound noise. Cost: its own symmetric
    buffers (2 x R x W rows per field for dispatch and combine, about 540 MB per rank at those shapes)."""
    if overlap is not None:
        return bool(overlap)
    return os.environ.get(ENV, "1").strip() != "0"


def order() -> str:
    """The dispatch launch's program order from DEEPINFER_DEEP_EP_OVERLAP_ORDER (default "mixed")."""
    got = os.environ.get(ORDER_ENV, "mixed").strip() or "mixed"
    if got not in ov.ORDERS:
        raise ValueError(f"{ORDER_ENV}: expected one of {list(ov.ORDERS)}, got {got!r}")
    return got


def combine_config() -> str:
    """The combine launch's config from DEEPINFER_DEEP_EP_OVERLAP_COMBINE (default "base")."""
    got = os.environ.get(COMBINE_ENV, "base").strip() or "base"
    if got not in ov.COMBINE_CONFIGS:
        raise ValueError(f"{COMBINE_ENV}: expected one of {list(ov.COMBINE_CONFIGS)}, got {got!r}")
    return got


def dispatch_config() -> str:
    """The dispatch launch's config from DEEPINFER_DEEP_EP_OVERLAP_DISPATCH (default "early" since session 6)."""
    got = os.environ.get(DISPATCH_ENV, "early").strip() or "early"
    if got not in ov.DISPATCH_CONFIGS:
        raise ValueError(f"{DISPATCH_ENV}: expected one of {list(ov.DISPATCH_CONFIGS)}, got {got!r}")
    return got


def tag_bytes(world: int, cap: int, row_bytes: list[int]) -> int:
    """Bytes of the arrival tags of one call: int64 [2 parities, R * W rows, column blocks of the push]."""
    return align_up(2 * world * cap * 8 * _ncb(row_bytes))


def _ncb(row_bytes: list[int]) -> int:
    """Column blocks (BLOCK_W int32 words) of the widest field: one arrival tag per row and block."""
    return -(-max(row_bytes) // (4 * ov.BLOCK_W))


@dataclass(frozen=True)
class DispatchLayout:
    """Offsets in a dispatch buffer, the same on every rank. Arrival tags (int64 index `tags` of parity 0,
    `tpar` further for parity 1: [R * W rows, ncb]) at a FIXED place right after the flags, in an extent
    `reserved` that only grows (and is zeroed when it does): a tag address never held other data, whose bits
    could pass for an epoch. Then the count area (int64 index `cnt`, rows of `rw`) and the field regions
    (int32 word offsets of parity 0; parity 1 is `par` words further); `nbytes` in all."""

    tags: int
    tpar: int
    ncb: int
    cnt: int
    rw: int
    par: int
    x0: int
    x1: int
    ids: int
    wts: int
    src: int
    nbytes: int

    @staticmethod
    def of(world: int, num_experts: int, cap: int, payload_bytes: list[int], k: int, reserved: int) -> DispatchLayout:
        """reserved: bytes kept for tags (>= tag_bytes of this call; the largest any call of the buffer used)."""
        ncb = _ncb(payload_bytes)
        rw = row_width(world, num_experts)
        cnt0 = align_up(HEAD_BYTES + reserved)
        rows0 = align_up(cnt0 + 2 * world * rw * 8)
        offs, total = field_offsets([*payload_bytes, 8 * k, 4 * k, 8], world * cap)
        w = [rows0 // 4 + o // 4 for o in offs]
        x1 = w[1] if len(payload_bytes) == 2 else w[0]
        tpar = world * cap * ncb
        return DispatchLayout(HEAD_BYTES // 8, tpar, ncb, cnt0 // 8, rw, total // 4, w[0], x1, w[-3], w[-2], w[-1],
                              rows0 + 2 * total)  # fmt: skip


@dataclass(frozen=True)
class CombineLayout:
    """Offsets in a combine buffer: arrival tags as in `DispatchLayout` (fixed place, grow-only extent), then
    the regions y0 / y1 [R * W rows] of parity 0 (int32 words), the parity stride `par`, `nbytes` in all."""

    tags: int
    tpar: int
    ncb: int
    par: int
    y0: int
    y1: int
    nbytes: int

    @staticmethod
    def of(world: int, cap: int, row_bytes: list[int], reserved: int) -> CombineLayout:
        ncb = _ncb(row_bytes)
        rows0 = align_up(HEAD_BYTES + reserved)
        offs, total = field_offsets(row_bytes, world * cap)
        w = [rows0 // 4 + o // 4 for o in offs]
        y1 = w[1] if len(row_bytes) == 2 else w[0]
        return CombineLayout(HEAD_BYTES // 8, world * cap * ncb, ncb, total // 4, w[0], y1, rows0 + 2 * total)


class _Side:
    """One symmetric buffer per rank with its device epochs ctr int64 [4] (dispatch, combine, timeout, -)
    and per-peer completion counters. The whole buffer (flags, tags) is zeroed, with the epochs, whenever it
    is (re)allocated, and the tag extent whenever it grows; each time on every rank, then a barrier (every
    rank passes the same sizes: the same call history)."""

    def __init__(self, fast: IntranodeNormal, nbytes: int) -> None:
        self.rank, self.world = fast.rank, fast.world
        self.transport: Transport = make_transport(fast.group, fast.device, grown_size(nbytes, 0))
        self.ctr = torch.zeros(4, dtype=torch.int64, device=fast.device)
        self.done = torch.zeros(8, dtype=torch.int32, device=fast.device)
        self.reserved = 0  # bytes of tags kept after the flags (grow-only)
        self._reset()

    def _reset(self) -> None:
        self.transport.buffer(self.rank).zero_()  # new memory: any stale bits could pass for a flag or tag
        self.ctr.zero_()
        self.done.zero_()
        self.bufs = [self.transport.buffer(r) for r in range(self.world)]
        self.transport.barrier()  # every rank's buffer is zero before any peer writes into it

    def reserve(self, tags: int) -> int:
        """The tag extent a call with `tags` bytes of tags lays out with (grow-only, the same on every rank)."""
        return max(self.reserved, tags)

    def prepare(self, nbytes: int, reserved: int) -> None:
        """Room for a call laid out with `reserved` tag bytes in `nbytes` (collective; never in a capture)."""
        if nbytes > self.transport.nbytes:
            self.transport.barrier()  # peers are done with the old buffers
            self.transport._alloc(grown_size(nbytes, self.transport.nbytes))
            self._reset()
        elif reserved > self.reserved:  # the tags now cover bytes that held other fields: zero them
            self.transport.buffer(self.rank)[HEAD_BYTES : HEAD_BYTES + reserved].zero_()
            self.transport.barrier()  # (peers finished the previous call's writes into us: see overlap.py)
        self.reserved = reserved

    def timed_out(self) -> bool:
        """Whether a wait of this side gave up (a host sync)."""
        return bool(self.ctr[2].item())


class OverlapState:
    """The variant's buffers and grow-only scratch, kept on the fast path (`fast._overlap_state`)."""

    def __init__(self, fast: IntranodeNormal) -> None:
        self.fast = fast
        self.disp: _Side | None = None
        self.cmb: _Side | None = None
        self._scratch: dict[str, torch.Tensor] = {}

    def side(self, which: str) -> _Side:
        """The dispatch ("disp") or combine ("cmb") buffer, created at its first use (a collective)."""
        got = getattr(self, which)
        if got is None:
            got = _Side(self.fast, HEAD_BYTES)
            setattr(self, which, got)
        return got

    def scratch(self, world: int, t: int, num_experts: int) -> dict[str, torch.Tensor]:
        """bcnt [R, nb], bstat [nb, 2 + R], bexp [nb, E] int64 and lpos [R, t] (views of grow-only tensors)."""
        nb = ov.num_blocks(t)
        sizes = {"bcnt": world * nb, "bstat": nb * (2 + world), "bexp": nb * num_experts, "lpos": world * t}
        out = {}
        for name, n in sizes.items():
            have = self._scratch.get(name)
            if have is None or have.numel() < n:
                have = self._scratch[name] = torch.empty(max(n, 1024), dtype=torch.int64, device=self.fast.device)
            out[name] = have[:n]
        out["lpos"] = out["lpos"].view(world, t)
        return out

    def close(self) -> None:
        """Drop both buffers (with the fast path's)."""
        for side in (self.disp, self.cmb):
            if side is not None:
                side.bufs = []
                side.transport.close()
        self.disp = self.cmb = None

    def timed_out(self) -> bool:
        """Whether any wait of this variant gave up (diagnostics; a host sync)."""
        return any(s is not None and s.timed_out() for s in (self.disp, self.cmb))


def state(fast: IntranodeNormal) -> OverlapState:
    got = getattr(fast, "_overlap_state", None)
    if got is None:
        got = fast._overlap_state = OverlapState(fast)
    return got


def eligible(fast: IntranodeNormal, fields: list[torch.Tensor], k: int) -> bool:
    """Rows of whole int32 words, k <= MAX_K, 2..8 ranks (see the module docstring)."""
    whole = all(f.dim() == 2 and _row_bytes(f) % 4 == 0 for f in fields)
    return whole and k <= ov.MAX_K and 2 <= fast.world <= 8


def dispatch(fast: IntranodeNormal, x: XPayload, topk_idx, topk_weights, num_experts, given, align, cap: int):
    """`_nosync.dispatch` with the overlapped kernels (same arguments, results bit for bit)."""
    world, rank, dev = fast.world, fast.rank, fast.device
    idx, w = topk_idx.to(torch.int64).contiguous(), topk_weights.contiguous()
    t, k = idx.shape
    fields = _payload(x)
    if not eligible(fast, fields, k):
        from . import _nosync

        return _nosync.dispatch(fast, x, idx, w, num_experts, given, align, cap)
    launch_order = order()  # before any GPU work: a bad value must not leave the epochs advanced on one rank
    config = dispatch_config()
    fused = ov.DISPATCH_CONFIGS[config][1]
    diag = os.environ.get(DIAG_ENV, "")
    if diag not in ov.DIAGS:
        raise ValueError(f"{DIAG_ENV}: expected one of {list(ov.DIAGS)}, got {diag!r}")
    mark = _stage_marker(dev)
    st = state(fast)
    rb = [_row_bytes(f) for f in fields]
    side = st.side("disp")
    reserved = side.reserve(tag_bytes(world, cap, rb))
    lay = DispatchLayout.of(world, num_experts, cap, rb, k, reserved)
    side.prepare(lay.nbytes, reserved)  # host-known sizes only: the same on every rank
    scratch = st.scratch(world, t, num_experts)
    layout = torch.empty((t, world), dtype=torch.bool, device=dev)
    if not fused:  # (a fused config runs the layout scan inside its one launch)
        ov.layout(idx, given if t else None, layout, scratch["lpos"], scratch, side.ctr, num_experts)
    mark("layout")
    per = num_experts // world
    outs = [_empty_words(cap, _row_bytes(f), dev) for f in fields]
    out_idx = torch.empty((cap, k), dtype=torch.int64, device=dev)
    out_w = torch.empty((cap, k), dtype=torch.float32, device=dev)
    out_src = torch.empty((cap, 1), dtype=torch.int64, device=dev)
    send_pos = torch.empty((world, t), dtype=torch.int64, device=dev)
    send_tok = torch.empty((world * t,), dtype=torch.int64, device=dev)
    mat = torch.empty((world * world + 2,), dtype=torch.int64, device=dev)
    counts = torch.empty((per,), dtype=torch.int32, device=dev)
    sig = [_payload_code(fields), *_payload_shape(fields), k, cap]
    words = [_src_words(f) for f in fields]
    ov.dispatch(side.bufs, rank, side.ctr, side.done, lay, cap, scratch["lpos"], scratch, words, idx, w,
                (send_pos, send_tok), outs, (out_idx, out_w, out_src), mat, counts, num_experts, align, sig,
                SPIN_LIMIT[dev.type], launch_order, config, given if t else None, layout, diag)  # fmt: skip
    mark("overlap")
    recv_x = [_typed_out(b, f) for b, f in zip(outs, fields)]
    handle = DispatchHandle(
        t, num_experts, layout, send_tok, None, None, out_src.view(-1), None, None, send_pos,
        num_worst_tokens=cap, device_counts=mat, recv_expert_counts=counts, overlap=True,
    )  # fmt: skip
    return (tuple(recv_x) if isinstance(x, tuple) else recv_x[0]), out_idx, out_w, counts, handle


def combine(fast: IntranodeNormal, y: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor | None):
    """`_nosync.combine` with the overlapped kernel (same results, bit for bit)."""
    world, rank, dev = fast.world, fast.rank, fast.device
    fields = [y.contiguous()] if topk_weights is None else [y.contiguous(), topk_weights.contiguous()]
    if not all(f.dim() == 2 and _row_bytes(f) % 4 == 0 for f in fields):
        from . import _nosync

        return _nosync.combine(fast, y, handle, topk_weights)
    config = combine_config()  # before any GPU work: a bad value must not leave the epochs advanced on one rank
    mark = _stage_marker(dev)
    cap, t = handle.num_worst_tokens, handle.num_tokens
    rb = [_row_bytes(f) for f in fields]
    side = state(fast).side("cmb")
    reserved = side.reserve(tag_bytes(world, cap, rb))
    lay = CombineLayout.of(world, cap, rb, reserved)
    side.prepare(lay.nbytes, reserved)
    if not ov.COMBINE_CONFIGS[config][2]:  # a folding config advances the epoch inside its one launch
        ov.bump(side.ctr, 1)
    outs = [torch.empty((t, f.shape[1]), dtype=f.dtype, device=dev) for f in fields]
    words = [f.view(torch.int32) for f in fields]
    ov.combine(side.bufs, rank, side.ctr, side.done, lay, cap, handle.send_pos, handle.device_counts, fields,
               words, outs, SPIN_LIMIT[dev.type], config)  # fmt: skip
    mark("overlap")
    return outs[0], (outs[1] if topk_weights is not None else None)
