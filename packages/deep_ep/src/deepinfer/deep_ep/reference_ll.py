"""Pure PyTorch reference of low-latency (decode) dispatch / combine.

Low-latency dispatch sends one row per (token, top-k expert) pair, so a token that picked two experts of
one rank travels twice, and lays the rows out per local expert in DeepGEMM's masked layout
[local_experts, num_max_dispatch_tokens_per_rank * world, hidden]. Within an expert, rows are ordered by
source rank, then token index (deterministic; DeepEP's own order within an expert is arrival order).
Combine sends every row back and reduces sum_k w_k * y_k per token on its source rank.
"""

from __future__ import annotations

import torch

from ._comm import Comm, pack_rows, unpack_rows
from .handles import LowLatencyHandle
from .reference import check_topk_idx

__all__ = ["per_token_cast_to_fp8", "low_latency_dispatch", "low_latency_combine"]

FP8_MAX = 448.0  # largest finite float8_e4m3fn
AMAX_FLOOR = 1e-4  # keeps the scale of an all-zero block finite (V4's activation quantiser uses the same floor)


def per_token_cast_to_fp8(x: torch.Tensor, round_scale: bool, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise x [n, h] (h % 128 == 0) to e4m3 with one scale per token per 128 channels.

    scale = max(amax, 1e-4) / 448, rounded up to a power of two when `round_scale`. Returns
    (float8_e4m3fn [n, h], scales [n, h/128]: float32, or float8_e8m0fnu when `use_ue8m0`), with
    x ~= values * scale per block.
    """
    n, h = x.shape
    blocks = x.to(torch.float32).reshape(n, h // 128, 128)
    scale = blocks.abs().amax(dim=-1).clamp(min=AMAX_FLOOR) / FP8_MAX
    if round_scale:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    values = (blocks / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(n, h)
    return values, scale.to(torch.float8_e8m0fnu) if use_ue8m0 else scale


def _check_distinct(topk_idx: torch.Tensor) -> None:
    """Each row must name an expert at most once: a repeat would need more than max*world slots."""
    s = topk_idx.sort(dim=1).values
    if bool(((s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)).any()):
        raise ValueError("topk_idx: a row names the same expert twice (low-latency mode needs distinct experts)")


def _send_plan(topk_idx: torch.Tensor, num_experts: int, world: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(token, slot) of every valid pair in send order (ascending global expert, then token) and rows per rank."""
    tok, slot = torch.nonzero(topk_idx >= 0, as_tuple=True)
    expert = topk_idx[tok, slot]
    order = torch.argsort(expert * topk_idx.shape[0] + tok)
    tok, slot = tok[order], slot[order]
    dst = topk_idx[tok, slot] // (num_experts // world)
    return tok, slot, torch.bincount(dst, minlength=world).tolist()


def low_latency_dispatch(
    comm: Comm,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    num_max_dispatch_tokens_per_rank: int,
    num_experts: int,
    use_fp8: bool,
    round_scale: bool,
    use_ue8m0: bool,
) -> tuple[torch.Tensor | tuple[torch.Tensor, torch.Tensor], torch.Tensor, LowLatencyHandle]:
    """Route every (token, expert) pair to the expert's rank; see `Buffer.low_latency_dispatch`."""
    check_topk_idx(topk_idx, num_experts)
    idx = topk_idx.to(torch.int64)
    _check_distinct(idx)
    t, hidden = x.shape
    world, dev = comm.world_size, x.device
    tok, slot, send_counts = _send_plan(idx, num_experts, world)
    payload = list(per_token_cast_to_fp8(x, round_scale, use_ue8m0)) if use_fp8 else [x]
    # Index packed bytes, not the fields: float8_e8m0fnu has no indexing kernels.
    meta = torch.stack((idx[tok, slot], tok), dim=1)
    fields = [*payload, torch.zeros((t, 2), dtype=torch.int64, device=dev)]
    send = pack_rows(fields)[tok]
    send[:, -16:] = meta.view(torch.uint8).reshape(-1, 16)  # the trailing int64 pair of each row
    recv_counts = comm.exchange_counts(send_counts, dev)
    rows = comm.exchange_rows(send, send_counts, recv_counts)
    layout = [(f.dtype, tuple(f.shape[1:])) for f in fields]
    meta_r = unpack_rows(rows, layout)[-1]
    per_rank = num_experts // world
    local = meta_r[:, 0] - comm.rank * per_rank
    recv_count = torch.bincount(local, minlength=per_rank)
    # Position of a row inside its expert: stable order keeps (source rank, token) order within an expert.
    order = torch.argsort(local, stable=True)
    starts = torch.cumsum(recv_count, 0) - recv_count
    pos = torch.empty_like(local)
    pos[order] = torch.arange(local.numel(), device=dev) - starts[local[order]]
    slots = num_max_dispatch_tokens_per_rank * world
    placed = torch.zeros((per_rank * slots, rows.shape[1]), dtype=torch.uint8, device=dev)
    placed[local * slots + pos] = rows
    recv = [v.reshape(per_rank, slots, *v.shape[1:]) for v in unpack_rows(placed, layout)[:-1]]
    src_rank = torch.repeat_interleave(torch.arange(world, device=dev), torch.tensor(recv_counts, device=dev))
    handle = LowLatencyHandle(
        t, hidden, num_experts, num_max_dispatch_tokens_per_rank, idx.clone(), tok, slot, send_counts,
        recv_counts, local, pos, src_rank, meta_r[:, 1],
    )  # fmt: skip
    recv_x = (recv[0], recv[1]) if use_fp8 else recv[0]
    return recv_x, recv_count.to(torch.int32), handle


def low_latency_combine(
    comm: Comm,
    y: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    handle: LowLatencyHandle,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """combined[t] = sum over valid k of topk_weights[t, k] * y[expert, pos of (t, k)]; see the Buffer method.

    Reduction in float32 in ascending global-expert order, one rounding to y.dtype (or out.dtype).
    """
    if not torch.equal(topk_idx.to(torch.int64), handle.topk_idx):
        raise ValueError("topk_idx: differs from the topk_idx of the dispatch that produced `handle`")
    rows = y[handle.recv_expert, handle.recv_pos]
    back = comm.exchange_rows(pack_rows([rows]), handle.recv_counts, handle.send_counts)
    (got,) = unpack_rows(back, [(y.dtype, (y.shape[2],))])
    w = topk_weights[handle.send_token, handle.send_slot].to(torch.float32)
    acc = torch.zeros((handle.num_tokens, handle.hidden), dtype=torch.float32, device=y.device)
    acc.index_add_(0, handle.send_token, got.to(torch.float32) * w[:, None])
    if out is None:
        return acc.to(y.dtype)
    out.copy_(acc)
    return out
