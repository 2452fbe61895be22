"""`Buffer`: DeepEP-style expert-parallel dispatch / combine (normal and low-latency modes).

Normal-mode dispatch / combine of a 2+ rank group on CUDA take the intranode fast path (`intranode.py`:
symmetric-memory buffers every rank writes directly, Triton row movers) when every rank can; low-latency
calls of a `low_latency_mode=True` Buffer take the LL fast path (`lowlatency.py`: no host sync, CUDA-graph
safe, optional receive hook); everything else runs the reference (`reference.py`, `reference_ll.py`),
which moves data with `torch.distributed.all_to_all_single` (gloo on CPU, NCCL on CUDA) or, for world
size 1, with a local permutation. The reference completes every transfer before returning: its `hook`
is a no-op and there are no events. Experts are split evenly and contiguously over ranks: rank r owns global
experts [r * E / R, (r + 1) * E / R); "local expert e" on rank r is global expert r * E / R + e.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, overload

import torch
import torch.distributed as dist

from . import reference as ref
from . import reference_ll as ref_ll
from ._backend import backend
from ._checks import FLOAT_X, check_int, check_num_experts, check_same_device, check_tensor, check_topk, check_x
from ._comm import Comm
from .handles import DispatchHandle, LowLatencyFastHandle, LowLatencyHandle
from .intranode import IntranodeNormal, create_intranode

if TYPE_CHECKING:  # lowlatency imports Triton: loaded only when the LL fast path is wanted and Triton runs
    from .lowlatency import IntranodeLowLatency

LL_ENV = "DEEPINFER_DEEP_EP_LL"  # "fast" / "reference": overrides Buffer(low_latency_mode=...)

XPayload = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def ll_wanted(low_latency_mode: bool) -> bool:
    """DEEPINFER_DEEP_EP_LL=fast / reference, else the Buffer's low_latency_mode flag."""
    env = os.environ.get(LL_ENV, "").strip().lower()
    if env in ("fast", "reference"):
        return env == "fast"
    if env:
        raise ValueError(f"{LL_ENV}: expected fast|reference, got {env!r}")
    return low_latency_mode


def _no_op_hook() -> None:
    """The reference completes transfers eagerly, so waiting for arrival has nothing to do."""


class Buffer:
    """Communication buffer of one expert-parallel group (DeepEP's `deep_ep.Buffer`).

    group: the process group of the EP ranks, or None for a single process (world size 1, no
    torch.distributed needed). num_nvl_bytes / num_rdma_bytes / low_latency_mode / num_qps_per_rank /
    explicitly_destroy size and configure the buffers: the intranode fast path allocates
    max(num_nvl_bytes, 2 MiB) per rank (symmetric memory) at the first normal-mode call and grows it when a
    call needs more; low_latency_mode=True turns on the low-latency fast path (its own buffer, sized at the
    first low-latency call); the other arguments are validated and kept.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        num_nvl_bytes: int = 0,
        num_rdma_bytes: int = 0,
        low_latency_mode: bool = False,
        num_qps_per_rank: int = 24,
        explicitly_destroy: bool = False,
    ) -> None:
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group: expected a torch.distributed.ProcessGroup or None, got {type(group).__name__}")
        self.num_nvl_bytes = check_int("num_nvl_bytes", num_nvl_bytes, 0)
        self.num_rdma_bytes = check_int("num_rdma_bytes", num_rdma_bytes, 0)
        self.num_qps_per_rank = check_int("num_qps_per_rank", num_qps_per_rank, 1)
        self.low_latency_mode = bool(low_latency_mode)
        self.explicitly_destroy = bool(explicitly_destroy)
        self.group = group
        self._comm = Comm(group)
        self.rank: int = self._comm.rank
        self.group_size: int = self._comm.world_size
        self._fast: IntranodeNormal | None | bool = None  # None: not decided yet; False: reference
        self._ll: IntranodeLowLatency | None | bool = None  # the same for low-latency mode

    def destroy(self) -> None:
        """Release the fast path's buffers (kept for DeepEP's explicit-destroy API; a no-op for the reference)."""
        if isinstance(self._fast, IntranodeNormal):
            self._fast.destroy()
        if self._ll not in (None, False):
            self._ll.destroy()
        self._fast = self._ll = None

    def _ll_path(self, device: torch.device) -> IntranodeLowLatency | None:
        """The low-latency fast path for tensors on `device`, or None (the reference runs).

        Decided at the first low-latency call (a collective): a 2..8 rank group, `backend(device) ==
        "triton"`, and `low_latency_mode=True` (or DEEPINFER_DEEP_EP_LL=fast; =reference forces it off).
        """
        if self.group is None or self.group_size == 1:
            return None
        if self._ll is None:
            use = ll_wanted(self.low_latency_mode) and backend(device) == "triton"
            if use:
                from .lowlatency import create_low_latency

                self._ll = create_low_latency(self.group, device)
            else:
                self._ll = False
        if self._ll not in (None, False) and self._ll.device == device:
            return self._ll
        return None

    def _fast_path(self, device: torch.device) -> IntranodeNormal | None:
        """The intranode fast path for tensors on `device`, or None (the reference runs).

        Decided at the first normal-mode call (a collective: every rank makes the same call): needs a
        process group of 2+ ranks and `backend(device) == "triton"` (CUDA with Triton, or forced with
        TRITON_INTERPRET=1 on CPU, where it runs over shared memory). Every rank agrees before using it.
        """
        if self.group is None or self.group_size == 1:
            return None
        if self._fast is None:
            use = backend(device) == "triton"
            self._fast = create_intranode(self.group, device, self.num_nvl_bytes) if use else False
        if isinstance(self._fast, IntranodeNormal) and self._fast.device == device:
            return self._fast
        return None

    def get_dispatch_layout(
        self, topk_idx: torch.Tensor, num_experts: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Count where tokens go.

        topk_idx: int64 (or int32) [t, k], global expert ids, -1 = masked slot. num_experts: E, a
        multiple of the world size R.
        Returns (num_tokens_per_rank int32 [R], num_tokens_per_expert int32 [E], is_token_in_rank bool
        [t, R]); a token counts once per rank and once per expert. (DeepEP also returns
        num_tokens_per_rdma_rank and an event; the reference has neither.)
        """
        idx, _ = check_topk(topk_idx, None, None)
        check_num_experts(num_experts, self.group_size)
        return ref.dispatch_layout(idx, num_experts, self.group_size)

    def dispatch(
        self,
        x: XPayload,
        handle: DispatchHandle | None = None,
        num_tokens_per_rank: torch.Tensor | None = None,
        is_token_in_rank: torch.Tensor | None = None,
        num_tokens_per_expert: torch.Tensor | None = None,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        expert_alignment: int = 1,
        num_experts: int | None = None,
        num_worst_tokens: int = 0,
        overlap: bool | None = None,
    ) -> tuple[XPayload, torch.Tensor | None, torch.Tensor | None, list[int] | torch.Tensor, DispatchHandle]:
        """Normal-mode dispatch: send each token ONCE to every rank owning one of its top-k experts.

        x: [t, hidden] bfloat16 (float16 / float32 also pass through bit-exactly), or an FP8 pair
           (float8_e4m3fn [t, hidden], scales float32 | float8_e8m0fnu [t, ceil(hidden/128)]).
        topk_idx: int64 (or int32) [t, k] global expert ids, -1 = masked; topk_weights: float32 [t, k].
        num_tokens_per_rank / is_token_in_rank / num_tokens_per_expert: optional outputs of
           `get_dispatch_layout` (shape-checked; is_token_in_rank must match topk_idx).
        expert_alignment: each entry of the returned count list is rounded up to a multiple of it.
        num_experts: E; needed only when num_tokens_per_expert (whose length is E, DeepEP's source) is not given.
        handle: pass a previous dispatch's handle (and no topk) to send new x along the same routing.
        num_worst_tokens: W > 0 (DeepEP's option; every rank passes the same W, a bound on the rows ANY rank
           receives, e.g. t * R): no host synchronisation. recv_x / recv_topk_idx / recv_topk_weights get W
           rows (the received ones first; past them ids are -1, weights 0, x unspecified), the per-expert
           counts come back as an int32 tensor [E / R] on the device instead of a list, and the handle keeps
           the counts on the device (`handle.host_counts()` reads them on request, `handle.check()` raises on
           bad input, which this mode cannot do itself); combine then takes x with W rows, and a cached
           dispatch with this handle returns W rows. On the fast path (impl "triton") the call, a cached
           dispatch and combine queue GPU work only, so they can be captured in a CUDA graph (after one eager
           call of the same shapes); elsewhere the synced path runs and its outputs are padded to W.
        overlap: with num_worst_tokens on the fast path, the overlapped variant (`_overlap.py`: a
           multi-program layout scan, the count exchange folded into the push, each source's rows copied out
           as soon as they land; its combine reduces each peer's rows as they land). Same results. None (the
           default): on, unless DEEPINFER_DEEP_EP_OVERLAP=0; False: the session-4 no-sync kernels
           (`_nosync.py`). Ignored without num_worst_tokens.

        Returns (recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle):
          recv_x: like x with num_recv rows, grouped by source rank (ascending), tokens in ascending index
             within a source; a token whose slots are all -1 goes nowhere.
          recv_topk_idx: int64 [num_recv, k] LOCAL expert ids, -1 where the slot's expert is on another
             rank (or was masked); recv_topk_weights: float32 [num_recv, k], 0 where recv_topk_idx is -1.
          num_recv_tokens_per_expert_list: per local expert, received tokens that chose it (aligned).
          With a cached handle, recv_topk_idx and recv_topk_weights are None.
        """
        t = check_x(x)
        if handle is not None:
            return self._cached_dispatch(x, t, handle, topk_idx, topk_weights)
        check_int("num_worst_tokens", num_worst_tokens, 0)
        if overlap is not None and not isinstance(overlap, bool):
            raise ValueError(f"overlap: expected a bool or None, got {overlap!r}")
        if topk_idx is None or topk_weights is None:
            raise ValueError("topk_idx and topk_weights: both are required when no handle is given")
        idx, w = check_topk(topk_idx, topk_weights, t)
        num_experts = self._num_experts(num_experts, num_tokens_per_expert, num_tokens_per_rank)
        check_int("expert_alignment", expert_alignment, 1)
        if is_token_in_rank is not None:
            check_tensor("is_token_in_rank", is_token_in_rank, (torch.bool,), [t, self.group_size])
        xt = x[0] if isinstance(x, tuple) else x
        check_same_device(x=xt, topk_idx=idx, topk_weights=w, is_token_in_rank=is_token_in_rank)
        fast = self._fast_path(xt.device)
        if num_worst_tokens and fast is not None and fast.impl == "triton":
            from . import _nosync, _overlap

            if _overlap.enabled(overlap):
                return _overlap.dispatch(fast, x, idx, w, num_experts, is_token_in_rank, expert_alignment,
                                         num_worst_tokens)  # fmt: skip

            return _nosync.dispatch(fast, x, idx, w, num_experts, is_token_in_rank, expert_alignment, num_worst_tokens)
        if fast is not None:
            out = fast.dispatch(x, idx, w, num_experts, is_token_in_rank, expert_alignment)
        else:
            out = ref.dispatch(self._comm, x, idx, w, num_experts, is_token_in_rank, expert_alignment)
        return _pad_worst(out, num_worst_tokens) if num_worst_tokens else out

    def _num_experts(
        self, num_experts: int | None, per_expert: torch.Tensor | None, per_rank: torch.Tensor | None
    ) -> int:
        """E from num_tokens_per_expert's length (DeepEP's way) or from num_experts; both must agree."""
        if per_rank is not None:
            check_tensor("num_tokens_per_rank", per_rank, (torch.int32, torch.int64), [self.group_size])
        if per_expert is not None:
            check_tensor("num_tokens_per_expert", per_expert, (torch.int32, torch.int64), [num_experts])
            return check_num_experts(per_expert.shape[0], self.group_size)
        if num_experts is None:
            raise ValueError("num_experts: required when num_tokens_per_expert is not given (and no handle)")
        return check_num_experts(num_experts, self.group_size)

    def _cached_dispatch(
        self, x: XPayload, t: int, handle: object, topk_idx: object, topk_weights: object
    ) -> tuple[XPayload, None, None, list[int], DispatchHandle]:
        if not isinstance(handle, DispatchHandle):
            raise TypeError(f"handle: expected a DispatchHandle from dispatch, got {type(handle).__name__}")
        if topk_idx is not None or topk_weights is not None:
            raise ValueError("topk_idx / topk_weights: must be None when dispatching with a cached handle")
        if t != handle.num_tokens:
            raise ValueError(f"x: expected {handle.num_tokens} tokens (the handle's), got {t}")
        if handle.device_counts is not None:  # a no-sync handle: no host sync here either
            from . import _nosync

            fast = self._fast_path(handle.send_token_idx.device)
            if fast is None or fast.impl != "triton":
                raise ValueError("handle: made by the no-sync fast path, which this Buffer no longer has")
            return _nosync.cached_dispatch(fast, x, handle), None, None, handle.recv_expert_counts, handle
        fast = self._fast_path(handle.send_token_idx.device) if handle.count_matrix is not None else None
        recv_x = fast.cached_dispatch(x, handle) if fast is not None else ref.cached_dispatch(self._comm, x, handle)
        lists = list(handle.num_recv_tokens_per_expert_list)
        if handle.num_worst_tokens:  # a synced dispatch padded to W: pad this one too
            return _pad_rows(recv_x, handle.num_worst_tokens), None, None, _counts_tensor(lists, recv_x), handle
        return recv_x, None, None, lists, handle

    @overload
    def combine(self, x: torch.Tensor, handle: DispatchHandle, topk_weights: None = None) -> torch.Tensor: ...

    @overload
    def combine(
        self, x: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def combine(
        self, x: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normal-mode combine: return each received row to its source and sum per original token.

        x: [num_recv, hidden] bfloat16 (or float16 / float32), row i answering row i of recv_x. The
           contract (DeepEP's): each rank returns, per received token, sum_k w_k * expert_k(token) over
           ITS local experts (w = recv_topk_weights, already 0 for other ranks' experts); combine adds no
           weights. handle: the DispatchHandle of the dispatch.
        Returns combined [t, hidden] of x.dtype: for each original token the sum, over the ranks it was
        sent to, of the rows they returned (float32 sum in rank order, one rounding; 0 for a token sent
        nowhere). When topk_weights float32 [num_recv, k] is given, returns (combined,
        combined_topk_weights float32 [t, k]) with the weights summed the same way — which rebuilds the
        original weights of all unmasked slots from recv_topk_weights.
        """
        if not isinstance(handle, DispatchHandle):
            raise TypeError(f"handle: expected a DispatchHandle from dispatch, got {type(handle).__name__}")
        check_tensor("x", x, FLOAT_X, [handle.num_recv_tokens, None])
        if topk_weights is not None:
            check_tensor("topk_weights", topk_weights, (torch.float32,), [handle.num_recv_tokens, None])
        check_same_device(x=x, topk_weights=topk_weights, handle=handle.send_token_idx)
        if handle.device_counts is not None:  # a no-sync handle
            from . import _nosync

            fast = self._fast_path(x.device)
            if fast is None or fast.impl != "triton":
                raise ValueError("handle: made by the no-sync fast path, which this Buffer no longer has")
            if handle.overlap:
                from . import _overlap

                combined, weights = _overlap.combine(fast, x, handle, topk_weights)
            else:
                combined, weights = _nosync.combine(fast, x, handle, topk_weights)
            return combined if weights is None else (combined, weights)
        if handle.num_worst_tokens:  # a synced dispatch padded to W: the rows past the received ones go nowhere
            real = sum(handle.recv_counts)
            x = x[:real]
            topk_weights = topk_weights[:real] if topk_weights is not None else None
        fast = self._fast_path(x.device) if handle.count_matrix is not None else None
        if fast is not None:
            combined, weights = fast.combine(x, handle, topk_weights)
        else:
            combined, weights = ref.combine(self._comm, x, handle, topk_weights)
        return combined if weights is None else (combined, weights)

    def low_latency_dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        num_max_dispatch_tokens_per_rank: int,
        num_experts: int,
        use_fp8: bool = True,
        round_scale: bool = False,
        use_ue8m0: bool = False,
        return_recv_hook: bool = False,
    ) -> tuple[XPayload, torch.Tensor, LowLatencyHandle | LowLatencyFastHandle, Callable[[], None]]:
        """Low-latency dispatch: one row per (token, expert) pair, in DeepGEMM's masked layout.

        x: [t, hidden] bfloat16 (float32 accepted), t <= num_max_dispatch_tokens_per_rank; hidden % 128 == 0
           when use_fp8. topk_idx: int64 (or int32) [t, k] global ids, -1 = masked, distinct per row.
        use_fp8: quantise per token per 128 channels (scale = max(amax, 1e-4) / 448; `round_scale` rounds
           it up to a power of two; `use_ue8m0` (needs round_scale) stores scales as float8_e8m0fnu).
        Returns (recv_x, recv_count, handle, hook):
          recv_x: [E_local, max * R, hidden] of x.dtype, or when use_fp8 a pair (float8_e4m3fn
             [E_local, max * R, hidden], scales float32 | float8_e8m0fnu [E_local, max * R, hidden/128],
             contiguous). Rows of expert e: 0..recv_count[e]-1, ordered by source rank then token;
             rows past recv_count[e] are zero in the reference (unspecified for fast paths).
          recv_count: int32 [E_local]. hook: call it before reading recv_x / recv_count (a no-op unless
             return_recv_hook=True on the fast path: DeepEP's semantics, the call then returns right after
             the sends and the hook launches only the receive, so compute can overlap the transfer).
        Fast path (`lowlatency.py`, Buffer(low_latency_mode=True) on a 2..8 GPU group): no host sync, usable
        inside a CUDA graph; recv_x lives in the Buffer and is overwritten by the next low-latency dispatch;
        rows past recv_count are stale; distinct experts per row and ids < num_experts are not checked.
        """
        check_tensor("x", x, (torch.bfloat16, torch.float32), [None, None])
        t, hidden = x.shape
        idx, _ = check_topk(topk_idx, None, t)
        check_same_device(x=x, topk_idx=idx)
        check_int("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank, max(t, 1))
        check_num_experts(num_experts, self.group_size)
        if use_fp8 and hidden % 128 != 0:
            raise ValueError(f"x: FP8 dispatch needs hidden % 128 == 0, got hidden={hidden}")
        if use_ue8m0 and not round_scale:
            raise ValueError("use_ue8m0: requires round_scale=True (E8M0 holds powers of two only)")
        fast = self._ll_path(x.device)
        if fast is not None and _ll_fast_ok(hidden, x.dtype, use_fp8, use_ue8m0, self.group_size):
            return fast.dispatch(
                x, idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8, round_scale, use_ue8m0, return_recv_hook
            )
        recv_x, count, handle = ref_ll.low_latency_dispatch(
            self._comm, x, idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8, round_scale, use_ue8m0
        )
        return recv_x, count, handle, _no_op_hook

    def low_latency_combine(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        handle: LowLatencyHandle | LowLatencyFastHandle,
        use_logfmt: bool = False,
        out: torch.Tensor | None = None,
        return_recv_hook: bool = False,
    ) -> tuple[torch.Tensor, Callable[[], None]]:
        """Low-latency combine: combined[t] = sum over unmasked k of topk_weights[t, k] * (expert output of (t, k)).

        x: [E_local, max * R, hidden] bfloat16 (or float32), x[e, i] the output for recv_x[e, i] (rows
           past recv_count are ignored). topk_idx / topk_weights: the [t, k] routing given to
           low_latency_dispatch and its float32 weights. handle: that dispatch's LowLatencyHandle.
        out: optional [t, hidden] buffer of x.dtype written in place. use_logfmt=True is not supported.
        Returns (combined [t, hidden] x.dtype, float32 reduction then one rounding; hook, a no-op unless
        return_recv_hook=True on the fast path, where it launches the wait + reduction). The reference adds
        in ascending global-expert order; the fast path in top-k slot order (deterministic) and does not
        check that topk_idx equals the dispatch's (that would need a host sync).
        """
        if not isinstance(handle, (LowLatencyHandle, LowLatencyFastHandle)):
            raise TypeError(
                f"handle: expected a LowLatencyHandle from low_latency_dispatch, got {type(handle).__name__}"
            )
        if use_logfmt:
            raise NotImplementedError("use_logfmt=True: the LogFMT combine format is not implemented")
        per_rank = handle.num_experts // self.group_size
        slots = handle.num_max_dispatch_tokens_per_rank * self.group_size
        check_tensor("x", x, (torch.bfloat16, torch.float32), [per_rank, slots, handle.hidden])
        idx, w = check_topk(topk_idx, topk_weights, handle.num_tokens)
        if out is not None:
            check_tensor("out", out, (x.dtype,), [handle.num_tokens, handle.hidden])
        check_same_device(x=x, topk_idx=idx, topk_weights=w, out=out)
        if isinstance(handle, LowLatencyFastHandle):
            fast = self._ll_path(x.device)
            if fast is None:
                raise ValueError("handle: made by the low-latency fast path, which this Buffer no longer has")
            if idx.shape[1] != handle.k:
                raise ValueError(f"topk_idx: expected {handle.k} columns (the dispatch's), got {idx.shape[1]}")
            return fast.combine(x, idx, w, handle, out, return_recv_hook)
        return ref_ll.low_latency_combine(self._comm, x, idx, w, handle, out), _no_op_hook


def _pad_rows(x: XPayload, rows: int, fill: float = 0) -> XPayload:
    """x (or each tensor of a pair) with `rows` rows: x's rows first, then `fill`."""
    if isinstance(x, tuple):
        return tuple(_pad_rows(p, rows, fill) for p in x)
    if x.shape[0] > rows:
        raise ValueError(f"num_worst_tokens: this rank received {x.shape[0]} rows, more than the bound {rows}")
    out = torch.empty((rows, *x.shape[1:]), dtype=x.dtype, device=x.device)
    out[: x.shape[0]] = x
    rest = out[x.shape[0] :]
    if fill == 0 and x.element_size() == 1:  # FP8 / e8m0: zero the bytes (fill_ need not support them)
        rest.view(torch.uint8).zero_()
    else:
        rest.fill_(fill)
    return out


def _counts_tensor(lists: list[int], like: XPayload) -> torch.Tensor:
    """The per-expert count list as an int32 tensor on the data's device."""
    dev = (like[0] if isinstance(like, tuple) else like).device
    return torch.tensor(lists, dtype=torch.int32, device=dev)


def _pad_worst(out: tuple, rows: int) -> tuple:
    """A synced dispatch's result in the num_worst_tokens form: W rows, counts as a tensor, the handle marked."""
    import dataclasses

    recv_x, idx, w, lists, handle = out
    padded = (_pad_rows(recv_x, rows), _pad_rows(idx, rows, -1), _pad_rows(w, rows))
    handle = dataclasses.replace(handle, num_worst_tokens=rows)
    return (*padded, _counts_tensor(lists, recv_x), handle)


def _ll_fast_ok(hidden: int, x_dtype: torch.dtype, use_fp8: bool, use_ue8m0: bool, world: int) -> bool:
    """`lowlatency.fast_ok`, imported only once the LL fast path exists (it imports Triton)."""
    from .lowlatency import fast_ok

    return fast_ok(hidden, x_dtype, use_fp8, use_ue8m0, world)
