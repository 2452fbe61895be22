"""Low-latency scenario: masked-layout dispatch (exact placement), expert compute, weighted combine."""

from __future__ import annotations

import torch
from ep_cases import BF16_REL, HIDDEN, K, World, assert_within, expert, moe_oracle

from deepinfer.deep_ep import Buffer, per_token_cast_to_fp8

U32 = 2.0**-24
MAX_TOKENS = 16  # >= the largest per-rank token count of ep_cases.make_world


def scales64(sf: torch.Tensor) -> torch.Tensor:
    """float64 scales; e8m0 decoded from its exponent bits."""
    if sf.dtype == torch.float8_e8m0fnu:
        return torch.exp2(sf.view(torch.uint8).double() - 127)
    return sf.double()


def _dequant64(values: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    return values.double() * scales64(sf).repeat_interleave(128, dim=-1)


def _payloads(w: World, use_fp8: bool, round_scale: bool, ue8m0: bool) -> list:
    """What each rank sends per token: bf16 rows, or the (values, scales) its quantiser produces."""
    xs = [x.bfloat16() for x in w.x]
    return [per_token_cast_to_fp8(x, round_scale, ue8m0) for x in xs] if use_fp8 else xs


def _check_expert_rows(recv_x: object, e: int, rows: list, payloads: list, use_fp8: bool, fast: bool) -> None:
    parts = recv_x if use_fp8 else (recv_x,)
    for p, got in enumerate(parts):
        src = [payloads[s][p] if use_fp8 else payloads[s] for s, _ in rows]
        want = torch.stack([src[i][t] for i, (_, t) in enumerate(rows)]) if rows else got[e, :0]
        n = len(rows)
        assert torch.equal(got[e, :n].view(torch.uint8), want.view(torch.uint8)), f"expert {e} field {p}"
        if not fast:  # the reference zero-fills; the fast path leaves rows past the count stale
            assert not got[e, n:].view(torch.uint8).any(), f"expert {e}: rows past recv_count are not zero"


def check_low_latency(buf: Buffer, w: World, use_fp8: bool, round_scale: bool, ue8m0: bool, fast: bool = False) -> None:
    """Dispatch, check every expert's rows, run the experts on poisoned buffers, combine, compare.

    fast: the Buffer may run the low-latency fast path (rows past recv_count are then not checked)."""
    rank, world = buf.rank, buf.group_size
    per_rank, slots = w.num_experts // world, MAX_TOKENS * world
    payloads = _payloads(w, use_fp8, round_scale, ue8m0)
    idx, wt = w.topk_idx[rank], w.weights[rank]
    recv_x, recv_count, handle, hook = buf.low_latency_dispatch(
        w.x[rank].bfloat16(), idx, MAX_TOKENS, w.num_experts, use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=ue8m0
    )
    hook()
    assert recv_count.dtype == torch.int32 and recv_count.shape == (per_rank,)
    y = torch.full((per_rank, slots, HIDDEN), float("nan"), dtype=torch.bfloat16)  # unused rows stay NaN
    for e in range(per_rank):
        ge = rank * per_rank + e
        rows = [(s, t) for s in range(world) for t in range(w.x[s].shape[0]) if bool((w.topk_idx[s][t] == ge).any())]
        assert int(recv_count[e]) == len(rows), f"rank {rank} expert {e}: count"
        _check_expert_rows(recv_x, e, rows, payloads, use_fp8, fast)
        n = len(rows)
        v = _dequant64(recv_x[0][e, :n], recv_x[1][e, :n]) if use_fp8 else recv_x[e, :n].double()
        y[e, :n] = expert(w, ge, v.float()).bfloat16()
    combined, hook = buf.low_latency_combine(y, idx, wt, handle)
    hook()
    x_src = _dequant64(*payloads[rank]) if use_fp8 else payloads[rank].double()
    ref, mag = moe_oracle(w, x_src, idx, wt)
    # Each expert output is rounded to bf16, the weighted sum (fp32) once more.
    assert_within(combined, ref, (2 * BF16_REL + BF16_REL**2 + 8 * K * U32) * mag, f"rank {rank}: ll combined")
