"""The fused dispatch kernels (layout + offsets, row push, copy-out) against plain torch on random routing."""

from __future__ import annotations

import pytest
import torch

from deepinfer.deep_ep.backends.triton.fused import copy_rows, layout_row, push_rows, row_width
from deepinfer.deep_ep.reference import _local_routing, layout_nocheck

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _routing(t: int, num_experts: int, k: int, seed: int) -> torch.Tensor:
    """Distinct top-k ids with -1 holes, a duplicated id and (when t > 3) one id past E."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(t, num_experts, generator=g).argsort(dim=1)[:, :k]  # a non-contiguous slice, as callers pass
    idx[torch.rand(t, k, generator=g) < 0.25] = -1
    if t > 3:
        idx[0, 1] = idx[0, 0] = 3  # a token choosing one expert twice counts once
        idx[3, k - 1] = num_experts + 2
    return idx


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t,num_experts,world,k", [(0, 8, 2, 2), (37, 16, 2, 4), (700, 24, 3, 6), (1100, 64, 8, 8)])
def test_layout_row_matches_torch(device: str, t: int, num_experts: int, world: int, k: int) -> None:
    idx = _routing(t, num_experts, k, seed=t + world).to(device)
    safe = idx.masked_fill(idx >= num_experts, -1)
    per_rank, per_expert, want = layout_nocheck(safe, num_experts, world)
    given = want.clone()
    if t:
        given[t // 2, world - 1] = ~given[t // 2, world - 1]  # a wrong is_token_in_rank, in column R-1 only
    row = torch.full((row_width(world, num_experts),), 12345, dtype=torch.int64, device=device)
    layout = torch.empty((t, world), dtype=torch.bool, device=device)
    pos = torch.empty((world, t), dtype=torch.int64, device=device)
    layout_row(idx, given, row, layout, pos, num_experts, [9, 8, 7, 6, 5])
    assert torch.equal(layout, want)
    r = row.tolist()
    assert r[:world] == per_rank.tolist() and r[world : world + num_experts] == per_expert.tolist()
    lo, hi = (int(idx.min()), int(idx.max())) if t else (1 << 62, -(1 << 62))
    assert r[world + num_experts :] == [9, 8, 7, 6, 5, lo, hi] + [0] * (world - 1) + [1 if t else 0]
    for d in range(world):  # position within d's block, tokens ascending
        sent = want[:, d].nonzero().flatten()
        expect = torch.full((t,), -1, dtype=torch.int64, device=device)
        expect[sent] = torch.arange(sent.numel(), device=device)
        assert torch.equal(pos[d], expect)


@pytest.mark.parametrize("device", DEVICES)
def test_push_rows_writes_rows_meta_and_handle(device: str) -> None:
    """Tokens for rank d land at row0 + their place; ids / weights become d's local view; handle filled."""
    t, num_experts, world, k, width, row0, send_off = 45, 32, 4, 6, 2100, 3, 11
    d, per = 2, 32 // 4
    idx = _routing(t, num_experts, k, seed=7)
    idx = idx.masked_fill(idx >= num_experts, -1).to(device)
    g = torch.Generator().manual_seed(8)
    w = torch.rand(t, k, generator=g).to(device)
    x = torch.randint(-(2**31), 2**31 - 1, (t, width), generator=g, dtype=torch.int64).to(torch.int32).to(device)
    sc = torch.randint(0, 2**15, (t, 5), generator=g).to(torch.int16).to(device)
    _, _, layout = layout_nocheck(idx, num_experts, world)
    sent = layout[:, d].nonzero().flatten()
    pos = torch.full((t,), -1, dtype=torch.int64, device=device)
    pos[sent] = torch.arange(sent.numel(), device=device)
    cap = row0 + sent.numel() + 2
    dx = torch.zeros((cap, width), dtype=torch.int32, device=device)
    dsc = torch.zeros((cap, 5), dtype=torch.int16, device=device)
    didx, dw = torch.zeros((cap, k), dtype=torch.int64, device=device), torch.zeros((cap, k), device=device)
    dsrc = torch.zeros((cap, 1), dtype=torch.int64, device=device)
    send_pos = torch.empty((t,), dtype=torch.int64, device=device)
    send_tok = torch.full((send_off + sent.numel(),), -7, dtype=torch.int64, device=device)
    meta = (idx, w, didx, dw, dsrc, d * per, per)
    push_rows(pos, 0, send_off, row0, [(x, dx), (sc, dsc)], meta, (send_pos, send_tok))
    rows = slice(row0, row0 + sent.numel())
    assert torch.equal(dx[rows], x[sent]) and torch.equal(dsc[rows], sc[sent]) and not dx[:row0].any()
    want_idx, want_w = _local_routing(idx[sent], w[sent], d, per)
    assert torch.equal(didx[rows], want_idx) and torch.equal(dw[rows], want_w)
    assert torch.equal(dsrc[rows, 0], sent)
    assert torch.equal(send_tok[send_off:], sent) and bool((send_tok[:send_off] == -7).all())
    assert torch.equal(send_pos, torch.where(pos >= 0, pos + send_off, -1))
    again = torch.zeros_like(dx)  # cached mode: the handle's send positions, biased by the block's offset
    push_rows(send_pos, send_off, send_off, row0, [(x, again)])
    assert torch.equal(again, dx)


@pytest.mark.parametrize("device", DEVICES)
def test_copy_rows_skips_own_block(device: str) -> None:
    g = torch.Generator().manual_seed(3)
    n, skip = 19, (6, 11)
    shapes = ((1500, torch.int32), (3, torch.int16), (1, torch.uint8), (8, torch.int64), (2, torch.int32))
    srcs = [torch.randint(-99, 99, (n + 4, w), generator=g).to(dt).to(device) for w, dt in shapes]
    dsts = [torch.zeros_like(s) for s in srcs]
    copy_rows(list(zip(srcs, dsts)), n, skip)
    keep = [i for i in range(n) if not skip[0] <= i < skip[1]]
    for s, o in zip(srcs, dsts):
        assert torch.equal(o[keep], s[keep]) and not o[skip[0] : skip[1]].any() and not o[n:].any()
