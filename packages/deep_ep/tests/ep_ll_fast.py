"""The low-latency fast path (`lowlatency.py`) against `reference_ll` on the same inputs, on every rank.

CPU: gloo + shared memory + the Triton interpreter (DEEPINFER_DEEP_EP_BACKEND=triton, TRITON_INTERPRET=1);
CUDA: NCCL + symmetric memory. Dispatch must place the same rows (payload and scales bit for bit, counts
equal; rows past the count are not compared: the fast path leaves them stale); combine must be within
`combine_bound` of the reference (same fp32 products, another summation order: top-k slot vs expert).
"""

from __future__ import annotations

import torch
from ep_fast import buf_device, capture_graph, random_routing

from deepinfer.deep_ep import Buffer
from deepinfer.deep_ep import reference_ll as ref_ll
from deepinfer.deep_ep._comm import Comm
from deepinfer.deep_ep.handles import LowLatencyFastHandle
from deepinfer.deep_ep.lowlatency import IntranodeLowLatency

FP8_VARIANTS = ((False, False, False), (True, False, False), (True, True, True))


def _fields(recv_x: object) -> list[torch.Tensor]:
    return list(recv_x) if isinstance(recv_x, tuple) else [recv_x]


def first_bad(a: torch.Tensor, b: torch.Tensor) -> str:
    """Where two equal-shape tensors first differ (for failure messages)."""
    diff = (a.view(torch.uint8) != b.view(torch.uint8)).reshape(a.shape[0], -1).any(dim=1).nonzero()
    return f"first differing row {diff[0].item() if diff.numel() else None} of {a.shape[0]}"


def check_dispatch(got: tuple, want: tuple, rank: int, what: str) -> None:
    """Counts equal; for every expert the first count rows of every field equal the reference's bit for bit."""
    g_count, w_count = got[1].cpu(), want[1].cpu()
    assert torch.equal(g_count, w_count), f"rank {rank} {what}: counts {g_count.tolist()} != {w_count.tolist()}"
    for i, (g, w) in enumerate(zip(_fields(got[0]), _fields(want[0]))):
        assert g.dtype == w.dtype and g.shape == w.shape, (what, i, g.dtype, w.dtype, g.shape, w.shape)
        g, w = g.cpu(), w.cpu()
        for e in range(g.shape[0]):
            n = int(w_count[e])
            ok = torch.equal(g[e, :n].view(torch.uint8), w[e, :n].view(torch.uint8))
            assert ok, f"rank {rank} {what}: expert {e} field {i}: {first_bad(g[e, :n], w[e, :n])}"


def combine_bound(mag: torch.Tensor, k: int) -> torch.Tensor:
    """|fast - reference|: both add the same k fp32 products (an FMA may skip one product rounding) in another
    order, then round once to bf16: one bf16 ulp (2^-7 of the magnitude at most) plus 2k fp32 roundings."""
    return 2.0**-7 * mag + 2 * (k + 1) * 2.0**-24 * mag


def check_combine(got: torch.Tensor, want: torch.Tensor, mag: torch.Tensor, k: int, rank: int) -> None:
    err = (got.float() - want.float()).abs().cpu()
    bound = combine_bound(mag.float().cpu(), k)
    bad = (err > bound).nonzero()
    assert bad.numel() == 0, (
        f"rank {rank}: combine error {float(err.max()):.3e} exceeds the bound at {bad[0].tolist()} "
        f"(got {float(got.float().cpu()[tuple(bad[0])]):.6g}, want {float(want.float().cpu()[tuple(bad[0])]):.6g})"
    )


def check_ll_fast(buf: Buffer, seed: int, hidden: int, num_experts: int, k: int, counts: list[int], max_t: int) -> None:
    """Every FP8 variant, with and without the receive hook: fast dispatch + combine vs the reference."""
    rank, world, dev = buf.rank, buf.group_size, buf_device(buf)
    comm = Comm(buf.group)
    xs, idxs, ws = random_routing(counts, num_experts, k, hidden, seed, dev)
    x, idx, w = xs[rank], idxs[rank], ws[rank]
    per_rank = num_experts // world
    for i, (fp8, rs, ue) in enumerate(FP8_VARIANTS):
        hook_mode = i % 2 == 1
        got = buf.low_latency_dispatch(x, idx, max_t, num_experts, fp8, rs, ue, return_recv_hook=hook_mode)
        assert isinstance(buf._ll, IntranodeLowLatency), "the low-latency fast path did not run"
        assert isinstance(got[2], LowLatencyFastHandle)
        got[3]()  # the hook: launches the receive when hook_mode, else a no-op
        want = ref_ll.low_latency_dispatch(comm, x, idx, max_t, num_experts, fp8, rs, ue)
        what = f"dispatch fp8={fp8} round={rs} ue8m0={ue} hook={hook_mode}"
        check_dispatch(got, want, rank, what)
        g = torch.Generator().manual_seed(seed + 100 * i + rank)
        y = torch.randn(per_rank, max_t * world, hidden, generator=g).bfloat16().to(dev)
        combined, hook = buf.low_latency_combine(y, idx, w, got[2], return_recv_hook=hook_mode)
        hook()
        ref_out = ref_ll.low_latency_combine(comm, y, idx, w, want[2], None)
        mag = ref_ll.low_latency_combine(comm, y.float().abs(), idx, w.abs(), want[2], None)
        check_combine(combined, ref_out, mag, k, rank)
    # two dispatches in a row (the second one's staging half differs), then combine of the second
    for _ in range(2):
        got = buf.low_latency_dispatch(x, idx, max_t, num_experts, use_fp8=False)
    check_dispatch(got, want_bf16(comm, x, idx, max_t, num_experts), rank, "dispatch twice")
    assert not buf._ll.timed_out(), f"rank {rank}: a wait timed out"


def want_bf16(comm: Comm, x, idx, max_t, num_experts) -> tuple:
    return ref_ll.low_latency_dispatch(comm, x, idx, max_t, num_experts, False, False, False)


def ll_graph_equals_eager(buf: Buffer, seed: int, hidden: int, num_experts: int, k: int, t: int, max_t: int) -> None:
    """CUDA only: dispatch (FP8) + combine captured in one CUDA graph, replayed 3 times, equal eager bit for bit."""
    rank, world, dev = buf.rank, buf.group_size, buf_device(buf)
    xs, idxs, ws = random_routing([t] * world, num_experts, k, hidden, seed, dev)
    x, idx, w = xs[rank], idxs[rank], ws[rank]
    per_rank = num_experts // world
    y = torch.randn(per_rank, max_t * world, hidden, generator=torch.Generator().manual_seed(seed)).bfloat16().to(dev)

    def step() -> tuple[torch.Tensor, ...]:
        recv, count, handle, _ = buf.low_latency_dispatch(x, idx, max_t, num_experts, use_fp8=True)
        out, _ = buf.low_latency_combine(y, idx, w, handle)
        return recv[0], recv[1], count, out

    eager = [v.clone() for v in step()]  # first call: allocates / grows the buffers outside the graph
    eager_rows = _valid_rows(eager)
    graph, static = capture_graph(step)
    for r in range(3):
        graph.replay()
        torch.cuda.synchronize()
        got_rows = _valid_rows(static)
        for name, a, b in zip(("values", "scales", "count", "combined"), got_rows, eager_rows):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"rank {rank} replay {r}: {name} differs"
    assert not buf._ll.timed_out(), f"rank {rank}: a wait timed out"


def _valid_rows(vals: list[torch.Tensor]) -> list[torch.Tensor]:
    """The rows dispatch defines (first count rows per expert) and the other outputs, on the CPU."""
    values, scales, count, out = (v.cpu() for v in vals)
    keep = torch.arange(values.shape[1])[None, :] < count[:, None]
    return [values[keep], scales[keep], count, out]
