"""The low-latency Triton kernels in ONE process: two simulated ranks whose "peer buffers" are local tensors.

Rank 0 and rank 1 each send + signal, then each receives: the packed rows, counts and (source, token, slot)
must be what a direct computation gives; then combine. Runs on CPU (interpreter) and, marked gpu, on one
GPU, where it compiles every kernel variant the 2-GPU path uses without needing two GPUs.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer.deep_ep.backends.triton import ll
from deepinfer.deep_ep.lowlatency import LLLayout, _words

# (device, tokens of rank 0 / rank 1): one case on CPU (the interpreter is slow), an empty rank either side on GPU
CASES = [
    ("cpu", (4, 0)),
    pytest.param("cuda", (5, 3), marks=pytest.mark.gpu),
    pytest.param("cuda", (0, 4), marks=pytest.mark.gpu),
    pytest.param("cuda", (128, 77), marks=pytest.mark.gpu),
]


def _routing(t: int, e: int, k: int, g: torch.Generator) -> torch.Tensor:
    idx = torch.rand(t, e, generator=g).argsort(dim=1)[:, :k].contiguous()  # the kernels take contiguous ids
    idx[torch.rand(t, k, generator=g) < 0.25] = -1
    return idx


def _expected(idxs: list[torch.Tensor], r: int, per: int) -> list[list[tuple[int, int, int]]]:
    """Per local expert of rank r: (source rank, token, slot) of its rows in order (source, then token)."""
    rows: list[list[tuple[int, int, int]]] = [[] for _ in range(per)]
    for s, idx in enumerate(idxs):
        for t in range(idx.shape[0]):
            for slot in range(idx.shape[1]):
                e = int(idx[t, slot])
                if e >= 0 and e // per == r:
                    rows[e - r * per].append((s, t, slot))
    return rows


@pytest.mark.parametrize(("device", "counts"), CASES)
def test_ll_kernels_two_simulated_ranks(device: str, counts: tuple[int, int]) -> None:
    world, per, k, hidden, max_t = 2, 4, 3, 256, max(counts + (1,))
    g = torch.Generator().manual_seed(sum(counts))
    idxs = [_routing(t, per * world, k, g) for t in counts]
    xs = [torch.randn(t, hidden, generator=g).bfloat16() for t in counts]
    lay = LLLayout.of(world, per, max_t, k, hidden // 2, 0, hidden)
    bufs = [torch.zeros(lay.words, dtype=torch.int32, device=device) for _ in range(world)]
    ctrs = [torch.zeros(4, dtype=torch.int32, device=device) for _ in range(world)]
    slots = max_t * world
    outs = [torch.full((per, slots, hidden // 2), -1, dtype=torch.int32, device=device) for _ in range(world)]
    metas = [torch.empty((per, slots, 4), dtype=torch.int32, device=device) for _ in range(world)]
    cnts = [torch.empty((per,), dtype=torch.int32, device=device) for _ in range(world)]
    for _ in range(2):  # twice: the second call uses the other staging half and epoch 2
        for r in range(world):
            words = _words(xs[r].to(device))
            ll.ll_send(words, None, idxs[r].to(device), ctrs[r], bufs, r, per, max_t, per * world, lay)
            ll.signal(ctrs[r], 0, bufs, r, lay.flags)
        for r in range(world):
            ll.ll_recv(bufs[r], ctrs[r], outs[r], None, metas[r], cnts[r], world, max_t, lay, 1 << 10)
    for r in range(world):
        want = _expected(idxs, r, per)
        got_x = outs[r].cpu().view(torch.bfloat16)
        assert cnts[r].cpu().tolist() == [len(w) for w in want], f"rank {r}: counts"
        for e, rows in enumerate(want):
            for i, (s, t, slot) in enumerate(rows):
                assert torch.equal(got_x[e, i], xs[s][t]), f"rank {r} expert {e} row {i}: payload"
                assert metas[r][e, i, :3].cpu().tolist() == [s, t, slot], f"rank {r} expert {e} row {i}: meta"
        assert not bool(ctrs[r][2]), f"rank {r}: a wait timed out"
    # combine: y = 2 * recv_x (bf16 exact), weights random; out[t] = sum over valid slots of w * 2 * x[t]
    ws = [torch.rand(t, k, generator=g) for t in counts]
    ys = [(got.view(torch.bfloat16).float() * 2).bfloat16() for got in outs]
    combined = [torch.empty((t, hidden), dtype=torch.bfloat16, device=device) for t in counts]
    for r in range(world):
        ll.ll_combine_send(_words(ys[r].reshape(per * slots, hidden)).view(per, slots, -1), metas[r], cnts[r],
                           ctrs[r], bufs, k, lay)  # fmt: skip
        ll.signal(ctrs[r], 1, bufs, r, lay.flags)
    for r in range(world):
        me_y = bufs[r].view(torch.bfloat16)
        idx, w = idxs[r].to(device), ws[r].to(device)
        ll.ll_combine_reduce(bufs[r], me_y, ctrs[r], idx, w, combined[r], world, lay, 1 << 10)
        terms = (idxs[r] >= 0).float() * ws[r]  # [t, k]
        acc = torch.zeros(counts[r], hidden)
        for slot in range(k):  # the kernel's order: slot by slot, fp32
            acc += terms[:, slot : slot + 1] * (xs[r].float() * 2)
        want = acc.bfloat16()
        got = combined[r].cpu()
        # the products / sums match up to fp32 contraction (FMA on GPU): within one bf16 ulp
        err = (got.float() - want.float()).abs()
        assert bool((err <= 2.0**-7 * acc.abs() + 1e-6).all()), f"rank {r}: combine max error {float(err.max())}"
        assert not bool(ctrs[r][2]), f"rank {r}: a combine wait timed out"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(("round_scale", "use_ue8m0"), [(False, False), (True, False), (True, True)])
def test_quant_fp8_matches_per_token_cast(device: str, round_scale: bool, use_ue8m0: bool) -> None:
    """The one-launch FP8 quantiser gives per_token_cast_to_fp8's bits (values and scales), incl. a zero row,
    a block of tiny values (subnormal e4m3 codes) and magnitudes from 2^-30 to 2^20."""
    from deepinfer.deep_ep import per_token_cast_to_fp8

    g = torch.Generator().manual_seed(5 + round_scale + 2 * use_ue8m0)
    x = torch.randn(24, 1024, generator=g) * torch.exp2(torch.randint(-30, 20, (24, 1), generator=g).float())
    x[3], x[4, :128], x[5, :128] = 0.0, 1e-30, 3e-3  # zero row; floor-clamped blocks (subnormal codes)
    x = x.bfloat16().to(device)
    got = ll.quant_fp8(x, round_scale, use_ue8m0)
    want = per_token_cast_to_fp8(x, round_scale, use_ue8m0)
    for name, a, b in zip(("values", "scales"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype, a.shape, b.shape)
        bad = (a.view(torch.uint8) != b.view(torch.uint8)).nonzero()
        if bad.numel():  # say what differs (this runs once per round on a GPU): codes, input, the block's scale
            i, j = bad[0].tolist()
            blk = j // 128 if name == "values" else j
            sg, sw = got[1][i, blk].float().item(), want[1][i, blk].float().item()
            xv = x[i, j if name == "values" else blk * 128].item()
            raise AssertionError(
                f"{name}: {bad.shape[0]} codes differ, first at {[i, j]}: got {a.view(torch.uint8)[i, j].item()} "
                f"want {b.view(torch.uint8)[i, j].item()}; x {xv!r}; "
                f"scale got {sg!r} want {sw!r}"
            )
