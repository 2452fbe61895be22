"""The overlapped variant's multi-program layout scan (`backends/triton/overlap.layout`) against the fused
one-program scan and the reference layout, on R ranks' worth of token counts; its buffer layouts; the launch
orders of the dispatch kernel (`_role_pid`); the default and the order from the environment.

(The dispatch / combine kernels wait for their peers, so they are tested across processes: the CPU test in
test_ep_dispatch_combine.py over shared memory, the 2-GPU test in test_ep_multigpu.py.)
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from deepinfer.deep_ep import _overlap
from deepinfer.deep_ep._overlap import HEAD_BYTES, CombineLayout, DispatchLayout, tag_bytes
from deepinfer.deep_ep.backends.triton import overlap as ov
from deepinfer.deep_ep.backends.triton.fused import layout_row, row_width
from deepinfer.deep_ep.backends.triton.overlap import _role_pid
from deepinfer.deep_ep.reference import layout_nocheck

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _scratch(world: int, t: int, num_experts: int, device: str) -> dict[str, torch.Tensor]:
    nb = ov.num_blocks(t)
    fill = lambda n: torch.full((n,), -99, dtype=torch.int64, device=device)  # noqa: E731 - stale values
    return {"bcnt": fill(world * nb), "bstat": fill(nb * (2 + world)), "bexp": fill(nb * num_experts)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("world", "t", "k"), [(2, 0, 4), (3, 75, 6), (8, 3 * ov.LAYOUT_BT + 5, 8)])
def test_layout_scan_matches_fused_and_reference(device: str, world: int, t: int, k: int) -> None:
    num_experts = 8 * world
    g = torch.Generator().manual_seed(world * 100 + t)
    idx = torch.rand(t, num_experts, generator=g).argsort(dim=1)[:, :k]
    idx[torch.rand(t, k, generator=g) < 0.3] = -1
    idx = idx.contiguous().to(device)
    scratch = _scratch(world, t, num_experts, device)
    lay = torch.empty((t, world), dtype=torch.bool, device=device)
    lpos = torch.full((world, t), -5, dtype=torch.int64, device=device)
    ctr = torch.tensor([41, 0, 0, 0], dtype=torch.int64, device=device)
    wrong = torch.zeros((t, world), dtype=torch.bool, device=device)
    given = None if t == 0 else wrong  # a wrong is_token_in_rank: every rank with a token flagged
    ov.layout(idx, given, lay, lpos, scratch, ctr, num_experts)
    per_rank, per_expert, want = layout_nocheck(idx, num_experts, world)
    assert torch.equal(lay, want)
    assert int(ctr[0]) == 42, "the epoch advances once per layout"
    nb = ov.num_blocks(t)
    bcnt = scratch["bcnt"].view(world, nb)
    assert bcnt.sum(dim=1).tolist() == per_rank.tolist()
    assert scratch["bexp"].view(nb, num_experts).sum(dim=0).tolist() == per_expert.tolist()
    # global place = in-block place + rows of earlier blocks: the fused scan's positions
    row = torch.empty(row_width(world, num_experts), dtype=torch.int64, device=device)
    pos = torch.empty((world, t), dtype=torch.int64, device=device)
    layout_row(idx, None, row, torch.empty_like(lay), pos, num_experts, [1, 2, 3, k, t])
    blk = torch.arange(t, device=device) // ov.LAYOUT_BT
    before = torch.cumsum(bcnt, dim=1) - bcnt  # [R, nb]: rows of earlier blocks
    got = torch.where(lpos >= 0, lpos + before[:, blk], -1)
    assert torch.equal(got, pos)
    stat = scratch["bstat"].view(nb, 2 + world)
    if t:
        assert int(stat[:, 0].min()) == int(idx.min()) and int(stat[:, 1].max()) == int(idx.max())
        assert stat[:, 2:].amax(dim=0).tolist() == [int(lay[:, d].any()) for d in range(world)]


@pytest.mark.parametrize("world", [2, 8])
def test_buffer_layouts_are_disjoint_and_aligned(world: int) -> None:
    """Tags first, at a fixed place, in their reserved extent; then the count area and the field regions of
    both parities: no overlaps, 256-byte aligned starts, all inside nbytes."""
    cap, k = 1000, 6
    rb = [8192, 128]
    need = tag_bytes(world, cap, rb)
    reserved = need + 4096  # an earlier call used more
    d = DispatchLayout.of(world, 256, cap, rb, k, reserved)
    assert d.ncb == 2 and 8 * d.tags == HEAD_BYTES  # 8192-byte rows: two 1024-word column blocks
    assert 8 * (d.tags + 2 * d.tpar) <= HEAD_BYTES + reserved and 2 * 8 * d.tpar <= need
    spans = [(HEAD_BYTES, HEAD_BYTES + reserved), (8 * d.cnt, 8 * (d.cnt + 2 * world * d.rw))]
    for p in (0, 1):
        for off, b in ((d.x0, 8192), (d.x1, 128), (d.ids, 8 * k), (d.wts, 4 * k), (d.src, 8)):
            start = 4 * (off + p * d.par)
            spans.append((start, start + world * cap * b))
    assert all(a % 256 == 0 for a, _ in spans) and max(b for _, b in spans) <= d.nbytes
    spans.sort()
    assert all(b <= c for (_, b), (c, _) in zip(spans, spans[1:]))
    crb = [8192, 4 * k]
    c = CombineLayout.of(world, cap, crb, tag_bytes(world, cap, crb))
    assert 8 * c.tags == HEAD_BYTES and 8 * (c.tags + 2 * c.tpar) <= 4 * c.y0
    assert 4 * c.y0 + world * cap * 8192 <= 4 * c.y1 and 4 * (c.y1 + c.par) + world * cap * 4 * k <= c.nbytes


@triton.jit
def _role_pid_probe(out, n_push, n_self, n_early, mix, R: tl.constexpr):
    pid = tl.program_id(0)
    tl.store(out + pid, _role_pid(pid, n_push, n_self, n_early, mix, R))


def _role_of(v: int, n_push: int, n_self: int, n_recv: int) -> str:
    """The role program v of the serial order plays (A, B, C, D, E)."""
    bounds = [(1, "A"), (1 + n_push, "B"), (1 + n_push + n_self, "C"), (1 + n_push + n_self + n_recv, "D")]
    return next((name for end, name in bounds if v < end), "E")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("world", "nbt", "ncb", "nper", "npad"), [(2, 5, 2, 3, 4), (3, 4, 1, 2, 1), (8, 2, 3, 1, 2)])
@pytest.mark.parametrize(("early", "mix"), [(False, False), (False, True), (True, True), (True, False)])
def test_role_pid_is_a_permutation_in_the_promised_order(
    device: str, world: int, nbt: int, ncb: int, nper: int, npad: int, early: bool, mix: bool
) -> None:
    """`_role_pid` maps the launch order onto the serial roles one to one; serial (no early copy-out, no mix)
    is the identity; mixed interleaves per token block R - 1 pushes (peers in order) and then the block's own
    copy; the early copy-out programs come right after A; every role that waits (C on lower ranks' counts, D,
    E) comes after A, and without early D every D after every push and own-block program (the interpreter)."""
    n_push, n_self, n_recv = (world - 1) * nbt * ncb, nbt * ncb, (world - 1) * nper
    grid = 1 + n_push + n_self + n_recv + npad + 1
    n_early = n_recv if early else 0
    out = torch.full((grid,), -1, dtype=torch.int32, device=device)
    _role_pid_probe[(grid,)](out, n_push, n_self, n_early, int(mix), R=world)
    got = out.tolist()
    assert sorted(got) == list(range(grid)), f"not a permutation: {got}"
    roles = [_role_of(v, n_push, n_self, n_recv) for v in got]
    if not early and not mix:
        assert got == list(range(grid))
    assert roles[0] == "A" and roles[-1 - npad :] == ["E"] * (npad + 1)
    assert roles[1 : 1 + n_early] == ["D"] * n_early
    mid = got[1 + n_early : 1 + n_early + n_push + n_self]
    if mix:  # per token block g: push to peer 0..R-2 (serial ids 1 + p * n_self + g), then own copy (1 + n_push + g)
        want = [1 + p * n_self + g if p < world - 1 else 1 + n_push + g for g in range(n_self) for p in range(world)]
        assert mid == want
    else:
        assert mid == list(range(1, 1 + n_push + n_self))


def test_overlap_default_and_order_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overlapped variant is the no-sync default (DEEPINFER_DEEP_EP_OVERLAP=0 or overlap=False turn it off);
    DEEPINFER_DEEP_EP_OVERLAP_ORDER picks the launch order, a bad value raises naming the variable."""
    monkeypatch.delenv(_overlap.ENV, raising=False)
    monkeypatch.delenv(_overlap.ORDER_ENV, raising=False)
    assert _overlap.enabled(None) and _overlap.enabled(True) and not _overlap.enabled(False)
    assert _overlap.order() == "mixed"
    monkeypatch.setenv(_overlap.ENV, "0")
    assert not _overlap.enabled(None) and _overlap.enabled(True)
    monkeypatch.setenv(_overlap.ENV, "1")
    assert _overlap.enabled(None) and not _overlap.enabled(False)
    monkeypatch.setenv(_overlap.ORDER_ENV, "serial")
    assert _overlap.order() == "serial"
    monkeypatch.setenv(_overlap.ORDER_ENV, "fast")
    with pytest.raises(ValueError, match=_overlap.ORDER_ENV):
        _overlap.order()


def test_combine_config_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """DEEPINFER_DEEP_EP_OVERLAP_COMBINE picks the combine's reduce config ("base" unless set); a bad value raises
    naming the variable; the configs only widen the reduce programs (whole BLOCK_T multiples, base = 1)."""
    monkeypatch.delenv(_overlap.COMBINE_ENV, raising=False)
    assert _overlap.combine_config() == "base"
    for name in ov.COMBINE_CONFIGS:
        monkeypatch.setenv(_overlap.COMBINE_ENV, name)
        assert _overlap.combine_config() == name
    assert ov.COMBINE_CONFIGS["base"] == (1, 1, False)
    for red, send, fold in ov.COMBINE_CONFIGS.values():
        assert isinstance(red, int) and red >= 1 and isinstance(send, int) and send >= 1 and isinstance(fold, bool)
    monkeypatch.setenv(_overlap.COMBINE_ENV, "narrow")
    with pytest.raises(ValueError, match=_overlap.COMBINE_ENV):
        _overlap.combine_config()


def test_dispatch_config_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """DEEPINFER_DEEP_EP_OVERLAP_DISPATCH picks the dispatch launch's config ("base" unless set); a bad value raises
    naming the variable; "fused" implies "early"; the early flags sit in the head, clear of the count flags."""
    monkeypatch.delenv(_overlap.DISPATCH_ENV, raising=False)
    assert _overlap.dispatch_config() == "early" and ov.DISPATCH_CONFIGS["base"] == (False, False)
    for name, (early, fused) in ov.DISPATCH_CONFIGS.items():
        monkeypatch.setenv(_overlap.DISPATCH_ENV, name)
        assert _overlap.dispatch_config() == name and (early or not fused)
    assert ov.FLAG_CNT.value + 8 <= ov.FLAG_EARLY.value and 8 * (ov.FLAG_EARLY.value + 8) <= HEAD_BYTES
    monkeypatch.setenv(_overlap.DISPATCH_ENV, "late")
    with pytest.raises(ValueError, match=_overlap.DISPATCH_ENV):
        _overlap.dispatch_config()
