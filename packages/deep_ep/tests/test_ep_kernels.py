"""The Triton row movers against torch: gather_rows (any word dtype) and the rank-ordered combine reduction."""

from __future__ import annotations

import pytest
import torch

from deepinfer.deep_ep.backends.triton.rows import combine_reduce_triton, gather_rows

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,width", [(torch.int32, 2048 + 20), (torch.int16, 3), (torch.uint8, 1)])
def test_gather_rows(device: str, dtype: torch.dtype, width: int) -> None:
    g = torch.Generator().manual_seed(width)
    src = torch.randint(-100, 100, (37, width), generator=g).to(dtype).to(device)
    idx = torch.randint(0, 37, (23,), generator=g).to(device)
    dst = torch.full((25, width), 7, dtype=dtype, device=device)
    gather_rows(src, idx, dst[1:24], "triton")
    assert torch.equal(dst[1:24], src[idx]) and bool((dst[0] == 7).all()) and bool((dst[24] == 7).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_combine_reduce_matches_rank_ordered_sum(device: str, dtype: torch.dtype) -> None:
    """3 ranks, 9 tokens: some sent to no rank; rows of rank 1 (ours) come from y, the rest from back."""
    g = torch.Generator().manual_seed(5)
    t, h = 9, 300  # h not a power of two: masked columns
    back = (torch.randn(12, h, generator=g) * 10).to(dtype).to(device)
    y = torch.randn(6, h, generator=g).to(dtype).to(device)
    pos = torch.full((3, t), -1, dtype=torch.int64)
    pos[0, [0, 2, 3]] = torch.tensor([0, 1, 2])
    pos[1, [0, 1, 3, 8]] = torch.tensor([3, 4, 5, 6])  # our own block: send positions 3..6 -> y[p - 1]
    pos[2, [0, 3, 5, 6, 8]] = torch.tensor([7, 8, 9, 10, 11])
    out = torch.full((t, h), float("nan"), dtype=dtype, device=device)
    combine_reduce_triton(pos.to(device), back, y, out, (3, 7), -1)
    acc = torch.zeros(t, h, device=device)
    for d in range(3):  # the reference's order: ascending rank, float32, one rounding
        for tok in range(t):
            p = int(pos[d, tok])
            if p >= 0:
                acc[tok] += (y[p - 1] if 3 <= p < 7 else back[p]).float()
    want = acc.to(dtype)
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))
    assert not out[4].any() and not out[7].any()  # tokens sent nowhere: zeros
