"""The no-sync dispatch / combine kernels (`backends/triton/nosync.py`) with R ranks simulated in one process.

Every rank's exchange row comes from `fused.layout_row`; `plan` must rebuild the count matrix, the received
rows, the aligned per-expert counts and the error bits from them; the pushes (`push_pair` + `push`) and
`copy_out` must place every rank's rows as the reference orders them (by source rank, then token), with -1 / 0
padding; `combine_send` + `reduce` must return the fp32 sum in rank order rounded once to bf16.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer.deep_ep.backends.triton import nosync
from deepinfer.deep_ep.backends.triton.fused import layout_row, row_width
from deepinfer.deep_ep.reference import _local_routing, layout_nocheck

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _rank_inputs(counts: list[int], num_experts: int, k: int, width: int, device: str, seed: int) -> list[dict]:
    """Per rank: ids [t, k] (distinct, -1 holes), weights, int32 payload words [t, width], layout, positions."""
    g = torch.Generator().manual_seed(seed)
    ranks = []
    for t in counts:
        idx = torch.rand(t, num_experts, generator=g).argsort(dim=1)[:, :k]
        idx[torch.rand(t, k, generator=g) < 0.25] = -1
        x = torch.randint(-(2**31), 2**31 - 1, (t, width), generator=g, dtype=torch.int64).to(torch.int32)
        w = torch.rand(t, k, generator=g)
        ranks.append({"idx": idx.contiguous().to(device), "w": w.to(device), "x": x.to(device), "t": t})
    return ranks


def _exchange_rows(ranks: list[dict], num_experts: int, cap: int, device: str) -> torch.Tensor:
    """The count area every rank would see: int64 [R, 2R + E + 7] (layout_row of every rank)."""
    world = len(ranks)
    rows = []
    for r in ranks:
        row = torch.empty(row_width(world, num_experts), dtype=torch.int64, device=device)
        r["layout"] = torch.empty((r["t"], world), dtype=torch.bool, device=device)
        r["pos"] = torch.empty((world, r["t"]), dtype=torch.int64, device=device)
        layout_row(r["idx"], None, row, r["layout"], r["pos"], num_experts, [1, 40, 0, r["idx"].shape[1], cap])
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("counts", [[37, 0], [20, 9, 33]])
def test_nosync_dispatch_and_combine_simulated(device: str, counts: list[int]) -> None:
    world, k, width, hidden, align = len(counts), 4, 40, 64, 3
    num_experts, per = 8 * world, 8
    ranks = _rank_inputs(counts, num_experts, k, width, device, seed=sum(counts))
    cap = sum(counts) + 2
    area = _exchange_rows(ranks, num_experts, cap, device)
    layouts = [layout_nocheck(r["idx"], num_experts, world)[2] for r in ranks]
    matrix = [[int(lay[:, d].sum()) for d in range(world)] for lay in layouts]
    for s, r in enumerate(ranks):  # plan: the matrix, rows received, no error, aligned per-expert counts
        r["mat"] = torch.empty(world * world + 2, dtype=torch.int64, device=device)
        r["counts"] = torch.empty(per, dtype=torch.int32, device=device)
        nosync.plan(area, r["mat"], r["counts"], s, num_experts, align, cap)
        recv = sum(matrix[q][s] for q in range(world))
        assert r["mat"].tolist() == [v for row in matrix for v in row] + [recv, 0]
        experts = torch.cat([q["idx"] for q in ranks]).flatten()
        want = [int((experts == s * per + e).sum()) for e in range(per)]
        assert r["counts"].tolist() == [-(-c // align) * align for c in want]
    # buffers and outputs of every rank, then the pushes (first peer + own block paired, then the others)
    z = {"dtype": torch.int32, "device": device}
    for r in ranks:
        r["buf"] = [torch.zeros((cap, width), **z), torch.zeros((cap, 2 * k), **z), torch.zeros((cap, k), **z),
                    torch.zeros((cap, 2), **z)]  # fmt: skip
        i64 = {"dtype": torch.int64, "device": device}
        r["out"] = [torch.full((cap, width), 7, **z), torch.zeros((cap, k), **i64),
                    torch.zeros((cap, k), device=device), torch.zeros((cap, 1), **i64)]  # fmt: skip
        r["send_pos"] = torch.empty((world, r["t"]), dtype=torch.int64, device=device)
        r["send_tok"] = torch.empty((world * r["t"],), dtype=torch.int64, device=device)
    for s, r in enumerate(ranks):
        handle = (r["send_pos"], r["send_tok"])
        for j in range(1, world):
            d = (s + j) % world
            b = ranks[d]["buf"]
            peer_meta = (b[1].view(torch.int64), b[2].view(torch.float32), b[3].view(torch.int64))
            if j == 1:
                meta = (r["idx"], r["w"], *peer_meta, *r["out"][1:], per)
                nosync.push_pair(r["pos"], r["mat"], s, d, cap, [(r["x"], b[0], r["out"][0])], meta, handle)
            else:
                meta = (r["idx"], r["w"], *peer_meta, d * per, per)
                nosync.push(r["pos"][d], r["mat"], s, d, cap, [(r["x"], b[0])], meta, (r["send_pos"][d], r["send_tok"]))
    for d, r in enumerate(ranks):
        o = r["out"]
        metas = list(zip(r["buf"][1:], [o[1].view(torch.int32), o[2].view(torch.int32), o[3].view(torch.int32)]))
        nosync.copy_out(r["mat"], d, cap, [(r["buf"][0], o[0])], metas)
        sent = [layouts[s][:, d].nonzero().flatten() for s in range(world)]
        n = sum(v.numel() for v in sent)
        want_x = torch.cat([ranks[s]["x"][sent[s]] for s in range(world)])
        loc = [_local_routing(ranks[s]["idx"][sent[s]], ranks[s]["w"][sent[s]], d, per) for s in range(world)]
        assert torch.equal(o[0][:n], want_x), f"rank {d}: payload rows"
        assert torch.equal(o[1][:n], torch.cat([a for a, _ in loc])), f"rank {d}: local ids"
        assert torch.equal(o[2][:n], torch.cat([b for _, b in loc])), f"rank {d}: local weights"
        assert torch.equal(o[3][:n, 0], torch.cat(sent)), f"rank {d}: source token index"
        assert bool((o[1][n:] == -1).all() and (o[2][n:] == 0).all() and (o[3][n:] == -1).all()), "padding"
        assert bool((o[0][n:] == 7).all()), "payload rows past the received ones are left alone"
    for s, r in enumerate(ranks):  # the handle's send positions: block d from send_off(s, d), tokens ascending
        for d in range(world):
            place = torch.full((r["t"],), -1, dtype=torch.int64, device=device)
            place[layouts[s][:, d]] = torch.arange(matrix[s][d], device=device) + sum(matrix[s][:d])
            assert torch.equal(r["send_pos"][d], place)
    # combine: every rank returns bf16 rows; sources sum them per token in rank order, one rounding
    g = torch.Generator().manual_seed(5)
    for r in ranks:
        r["y"] = torch.randn(cap, hidden, generator=g).bfloat16().to(device)
        r["back"] = torch.zeros((world * cap, hidden), dtype=torch.bfloat16, device=device)
    for d, r in enumerate(ranks):
        for j in range(1, world):
            s = (d + j) % world
            pair = [(r["y"].view(torch.int32), ranks[s]["back"].view(torch.int32))]
            nosync.combine_send(r["mat"], d, s, cap, pair, cap)
    for s, r in enumerate(ranks):
        out = torch.empty((r["t"], hidden), dtype=torch.bfloat16, device=device)
        nosync.reduce(r["send_pos"], r["mat"], s, r["back"], r["y"], out)
        acc = torch.zeros((r["t"], hidden), device=device)
        for d in range(world):
            toks = layouts[s][:, d].nonzero().flatten()
            at = sum(matrix[q][d] for q in range(s))  # our block in d's receive order
            acc[toks] += ranks[d]["y"][at : at + toks.numel()].float()
        assert torch.equal(out, acc.bfloat16()), f"rank {s}: combined rows"


@pytest.mark.parametrize("device", DEVICES)
def test_nosync_plan_error_bits(device: str) -> None:
    """A receive bound below what a rank gets, and ranks disagreeing on the signature, set their bits."""
    counts, num_experts = [30, 12], 16
    ranks = _rank_inputs(counts, num_experts, 3, 8, device, seed=4)
    area = _exchange_rows(ranks, num_experts, 5, device)
    mat = torch.empty(6, dtype=torch.int64, device=device)
    cnt = torch.empty(8, dtype=torch.int32, device=device)
    nosync.plan(area, mat, cnt, 0, num_experts, 1, 5)
    assert int(mat[-1]) == 8, "a bound of 5 rows is exceeded"
    area[1, 2 + num_experts + 1] += 1  # rank 1 sends another hidden
    nosync.plan(area, mat, cnt, 1, num_experts, 1, 100)
    assert int(mat[-1]) == 1, f"signature mismatch expected, got bits {int(mat[-1])}"
    area[1, 2 + num_experts + 1] -= 1
    area[0, 2 + num_experts + 6] = num_experts  # an id past E on rank 0
    nosync.plan(area, mat, cnt, 1, num_experts, 1, 100)
    assert int(mat[-1]) == 2
