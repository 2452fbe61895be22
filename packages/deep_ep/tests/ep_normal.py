"""Normal-mode scenario: layout, dispatch (exact routing), cached dispatch, expert compute, combine."""

from __future__ import annotations

import torch
from ep_cases import BF16_REL, K, World, assert_within, expected_recv, expert, fp8_dequant64, fp8_pair, moe_oracle

from deepinfer.deep_ep import Buffer

U32 = 2.0**-24


def _check_layout(buf: Buffer, idx: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    per_rank_cnt, per_expert_cnt, in_rank = buf.get_dispatch_layout(idx, num_experts)
    owner = torch.where(idx >= 0, idx // (num_experts // buf.group_size), -1)
    want_in_rank = torch.stack([(owner == r).any(dim=1) for r in range(buf.group_size)], dim=1)
    assert torch.equal(in_rank, want_in_rank.reshape(idx.shape[0], buf.group_size))
    assert per_rank_cnt.dtype == per_expert_cnt.dtype == torch.int32
    assert per_rank_cnt.tolist() == want_in_rank.sum(dim=0).tolist()
    assert per_expert_cnt.tolist() == [int((idx == e).any(dim=1).sum()) for e in range(num_experts)]
    return per_rank_cnt, per_expert_cnt, in_rank


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bitwise equality (float8 compared through its bytes)."""
    return got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def _inputs(w: World, use_fp8: bool) -> list:
    g = torch.Generator().manual_seed(4242)  # the same on every rank: all ranks see the same global inputs
    return [fp8_pair(x, g) for x in w.x] if use_fp8 else [x.bfloat16() for x in w.x]


def _expert_outputs(buf: Buffer, w: World, x64: torch.Tensor, idx: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    """What this rank returns per received token: sum over its local experts of w_k f_k(x), as bf16."""
    base = buf.rank * (w.num_experts // buf.group_size)
    y = torch.zeros(x64.shape, dtype=torch.float32)
    for j in range(x64.shape[0]):
        for k in range(K):
            if int(idx[j, k]) >= 0:
                y[j] += wt[j, k] * expert(w, base + int(idx[j, k]), x64[j].float())
    return y.bfloat16()


def check_normal(buf: Buffer, w: World, use_fp8: bool) -> None:
    """Dispatch this rank's tokens, play the experts, combine, and compare with the oracle."""
    rank, world = buf.rank, buf.group_size
    inputs = _inputs(w, use_fp8)
    idx, wt = w.topk_idx[rank], w.weights[rank]
    per_rank_cnt, per_expert_cnt, in_rank = _check_layout(buf, idx, w.num_experts)
    align = 4 if use_fp8 else 1
    recv_x, recv_idx, recv_w, counts, handle = buf.dispatch(
        inputs[rank], None, per_rank_cnt, in_rank, per_expert_cnt, idx, wt, expert_alignment=align
    )
    rows, local = expected_recv(w, rank, world)
    if use_fp8:
        for got, part in zip(recv_x, range(2)):
            want = torch.stack([inputs[s][part][t] for s, t in rows]) if rows else got[:0]
            assert _same(got, want), f"rank {rank}: fp8 recv_x[{part}] differs"
        x64 = fp8_dequant64(recv_x)
    else:
        want = torch.stack([inputs[s][t] for s, t in rows]) if rows else recv_x[:0]
        assert _same(recv_x, want), f"rank {rank}: recv_x differs"
        x64 = recv_x.double()
    assert torch.equal(recv_idx, local), f"rank {rank}: recv_topk_idx differs"
    want_w = [torch.where(local[j] >= 0, w.weights[s][t], 0.0) for j, (s, t) in enumerate(rows)]
    assert torch.equal(recv_w, torch.stack(want_w) if rows else recv_w[:0])
    assert counts == [-(-int((local == e).any(dim=1).sum()) // align) * align for e in range(w.num_experts // world)]
    y = _expert_outputs(buf, w, x64, recv_idx, recv_w)
    combined, comb_w = buf.combine(y, handle, topk_weights=recv_w)
    x_src = fp8_dequant64(inputs[rank]) if use_fp8 else inputs[rank].double()
    ref, mag = moe_oracle(w, x_src, idx, wt)
    # Each rank's partial sum is rounded to bf16 once, the total once more; fp32 adds a few K*u.
    assert_within(combined, ref, (2 * BF16_REL + BF16_REL**2 + 8 * K * U32) * mag, f"rank {rank}: combined")
    assert torch.equal(comb_w, torch.where(idx >= 0, wt, 0.0)), f"rank {rank}: combined weights"
    assert torch.equal(buf.combine(y, handle), combined)
    if not use_fp8:
        _check_cached(buf, handle, rows, [x.shape[0] for x in w.x])


def _check_cached(buf: Buffer, handle: object, rows: list[tuple[int, int]], counts: list[int]) -> None:
    """A second payload sent along the first dispatch's routing lands in the same rows."""
    g = torch.Generator().manual_seed(99)
    fresh = [torch.randn(n, 8, generator=g) for n in counts]  # float32 payload: passes through bit-exactly
    got, no_idx, no_w, _, _ = buf.dispatch(fresh[buf.rank], handle)
    assert no_idx is None and no_w is None
    want = torch.stack([fresh[s][t] for s, t in rows]) if rows else got[:0]
    assert torch.equal(got, want)
