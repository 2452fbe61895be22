"""`moe_permute` / `moe_unpermute` (the token-to-expert permutation for grouped GEMMs and its weighted reduce).

Both run the PyTorch reference on every device (no kernel yet), so these CPU tests cover the whole op. The
permutation is compared field by field with a brute-force oracle built from Python loops (expert, then token,
then slot); it is a pure row copy, so the comparison is exact for every dtype. The un-permute is compared bit for
bit with an fp32 loop that adds the slot products in slot order, the documented rounding; against the float64
sum of w * x it is within fp32 rounding (k products and k - 1 additions, each <= 2^-24 relative, plus the final
cast to the output dtype).
"""

from __future__ import annotations

import pytest
import torch

from deepinfer import tile_kernels as tk
from deepinfer.tile_kernels import reference as ref


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _routing(t: int, k: int, e: int, seed: int, hole: float = 0.3, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Random expert ids [t, k] (repeats allowed) with a `hole` fraction of -1 slots."""
    g = _gen(seed)
    idx = torch.randint(0, e, (t, k), generator=g)
    idx[torch.rand(t, k, generator=g) < hole] = -1
    return idx.to(dtype)


def _oracle(x: torch.Tensor, idx: torch.Tensor, e: int, block: int | None) -> dict[str, torch.Tensor]:
    """The documented layout from Python loops."""
    t, k = idx.shape
    step = block or 1
    rows, row_expert, counts, offsets = [], [], [], []
    src = torch.full((t, k), -1, dtype=torch.int32)
    for ex in range(e):
        n = 0
        for i in range(t):
            for j in range(k):
                if int(idx[i, j]) == ex:
                    src[i, j] = len(rows)
                    rows.append(x[i])
                    row_expert.append(ex)
                    n += 1
        pad = -n % step
        rows += [x.new_zeros(x.shape[1])] * pad
        row_expert += [-1] * pad
        counts.append(n)
        offsets.append(len(rows))
    return {
        "x": torch.stack(rows) if rows else x.new_zeros(0, x.shape[1]),
        "expert_counts": torch.tensor(counts, dtype=torch.int32),
        "expert_offsets": torch.tensor(offsets, dtype=torch.int32),
        "row_expert": torch.tensor(row_expert, dtype=torch.int32),
        "src_map": src,
    }


def _check_permutation(x: torch.Tensor, idx: torch.Tensor, e: int, block: int | None) -> tk.MoePermutation:
    res = tk.moe_permute(x, idx, e, block=block)
    assert isinstance(res, tk.MoePermutation)
    want = _oracle(x, idx, e, block)
    for name, w in want.items():
        got = getattr(res, name)
        assert got.dtype == w.dtype and got.shape == w.shape, name
        assert torch.equal(got, w), name
    p = res.x.shape[0]
    assert int(res.expert_offsets[-1]) == p == res.row_expert.shape[0]
    if block is not None:
        assert bool((res.expert_offsets % block == 0).all())
    return res


def _unpermute_oracle(y: torch.Tensor, src: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32, slot order from 0, masked slots skipped (the documented rounding)."""
    t, k = src.shape
    out = torch.zeros(t, y.shape[1], dtype=torch.float32)
    for i in range(t):
        for j in range(k):
            r = int(src[i, j])
            if r >= 0:
                out[i] = out[i] + w[i, j].float() * y[r].float()
    return out


# ------------------------------------------------------------------------------------------------- moe_permute


@pytest.mark.parametrize("block", [None, 1, 16, 128])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_permute_matches_oracle(block: int | None, idx_dtype: torch.dtype, x_dtype: torch.dtype) -> None:
    t, k, e, h = 37, 6, 16, 24
    x = torch.randn(t, h, generator=_gen(1)).to(x_dtype)
    idx = _routing(t, k, e, seed=2, dtype=idx_dtype)
    idx[5] = -1  # a token with every slot masked
    idx[idx == 3] = 7  # expert 3 gets no tokens
    res = _check_permutation(x, idx, e, block)
    assert int(res.expert_counts[3]) == 0 and int(res.expert_counts.sum()) == int((idx >= 0).sum())
    assert bool((res.src_map[5] == -1).all())
    if block == 128:
        assert res.x.shape[0] == 128 * int((res.expert_counts > 0).sum())


def test_permute_block_none_equals_block_1() -> None:
    x = torch.randn(20, 8, generator=_gen(3))
    idx = _routing(20, 4, 9, seed=4)
    a, b = tk.moe_permute(x, idx, 9), tk.moe_permute(x, idx, 9, block=1)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    assert bool((a.row_expert >= 0).all())  # no padding rows without a block
    assert torch.equal(a.expert_offsets, torch.cumsum(a.expert_counts, 0).to(torch.int32))


def test_permute_matches_the_engines_order() -> None:
    """No masked slots: the rows are x[argsort(ids, stable) // k], as the engine's grouped MoE permutes today."""
    t, k, e = 31, 6, 8
    x = torch.randn(t, 16, generator=_gen(5))
    idx = _routing(t, k, e, seed=6, hole=0.0)
    order = torch.argsort(idx.reshape(-1), stable=True)
    res = tk.moe_permute(x, idx, e)
    assert torch.equal(res.x, x[order // k])
    assert torch.equal(res.expert_counts.long(), torch.bincount(idx.reshape(-1), minlength=e))


@pytest.mark.parametrize("block", [None, 16])
def test_permute_edge_shapes(block: int | None) -> None:
    x = torch.randn(6, 4, generator=_gen(7))
    # every slot masked: no rows at all
    res = _check_permutation(x, torch.full((6, 3), -1), 5, block)
    assert res.x.shape == (0, 4) and bool((res.expert_offsets == 0).all())
    # no tokens
    res = _check_permutation(x[:0], torch.zeros(0, 3, dtype=torch.int64), 5, block)
    assert res.x.shape == (0, 4) and res.src_map.shape == (0, 3)
    # k = 0 (no slots)
    assert tk.moe_permute(x, torch.zeros(6, 0, dtype=torch.int32), 5, block=block).x.shape == (0, 4)
    # one expert, every slot on it; more experts than tokens
    _check_permutation(x, torch.zeros(6, 2, dtype=torch.int64), 1, block)
    _check_permutation(x, _routing(6, 2, 300, seed=8), 300, block)


def test_permute_copies_any_dtype() -> None:
    """A row copy: FP8 codes and int tensors permute the same way as their activations."""
    x = torch.randn(9, 32, generator=_gen(9))
    idx = _routing(9, 3, 4, seed=10)
    q = x.to(torch.float8_e4m3fn)
    a = tk.moe_permute(x, idx, 4, block=16)
    b = tk.moe_permute(q, idx, 4, block=16)
    assert b.x.dtype == torch.float8_e4m3fn
    assert torch.equal(b.x.view(torch.uint8), a.x.to(torch.float8_e4m3fn).view(torch.uint8))
    tok = tk.moe_permute(torch.arange(9)[:, None], idx, 4, block=16)  # int64 token ids: the row -> token map
    valid = idx >= 0
    assert torch.equal(tok.x[tok.src_map[valid].long(), 0], torch.arange(9)[:, None].expand(9, 3)[valid])
    assert torch.equal(a.x[tok.src_map[valid].long()], x[tok.x[tok.src_map[valid].long(), 0]])


def test_permute_bad_inputs() -> None:
    x = torch.randn(4, 8)
    idx = torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        tk.moe_permute(x.tolist(), idx, 4)
    with pytest.raises(ValueError, match="x must have 2 dims"):
        tk.moe_permute(x[None], idx, 4)
    with pytest.raises(ValueError, match="topk_idx must have 2 dims"):
        tk.moe_permute(x, idx[:, 0], 4)
    with pytest.raises(TypeError, match="topk_idx must be int32 or int64"):
        tk.moe_permute(x, idx.float(), 4)
    with pytest.raises(ValueError, match="topk_idx must have 4 rows"):
        tk.moe_permute(x, idx[:3], 4)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_experts must be an int >= 1"):
            tk.moe_permute(x, idx, bad)
    for bad in (0, -16, 16.0):
        with pytest.raises(ValueError, match="block must be None or an int >= 1"):
            tk.moe_permute(x, idx, 4, block=bad)
    with pytest.raises(ValueError, match=r"topk_idx values must be in \[-1, 3\].*got 4"):
        tk.moe_permute(x, torch.tensor([[0, 1], [2, 4], [0, 0], [1, 1]]), 4)
    with pytest.raises(ValueError, match=r"topk_idx values must be in \[-1, 3\].*got -2"):
        tk.moe_permute(x, torch.tensor([[0, 1], [2, -2], [0, 0], [1, 1]], dtype=torch.int32), 4)
    with pytest.raises(TypeError):
        tk.moe_permute(x, idx, 4, 16)  # block is keyword-only


# ----------------------------------------------------------------------------------------------- moe_unpermute


@pytest.mark.parametrize("block", [None, 16, 128])
@pytest.mark.parametrize("map_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unpermute_matches_slot_order_oracle(block: int | None, map_dtype: torch.dtype, dtype: torch.dtype) -> None:
    t, k, e, h = 29, 6, 12, 40
    x = torch.randn(t, h, generator=_gen(11)).to(dtype)
    idx = _routing(t, k, e, seed=12)
    idx[3] = -1
    res = tk.moe_permute(x, idx, e, block=block)
    y = (torch.randn(res.x.shape, generator=_gen(13)) * 4).to(dtype)  # any expert outputs
    y[res.row_expert < 0] = float("nan")  # padding rows are never read
    w = torch.rand(t, k, generator=_gen(14))
    w[idx < 0] = float("nan")  # masked slots' weights are never read
    src = res.src_map.to(map_dtype)
    out = tk.moe_unpermute(y, src, w)
    want = _unpermute_oracle(y, res.src_map, w)
    assert out.dtype == dtype and out.shape == (t, h)
    assert torch.equal(out, want.to(dtype))
    assert bool((out[3] == 0).all())
    out32 = tk.moe_unpermute(y, src, w, out_dtype=torch.float32)
    assert out32.dtype == torch.float32 and torch.equal(out32, want)


@pytest.mark.parametrize("block", [None, 1, 16, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_identity_experts(block: int | None, dtype: torch.dtype) -> None:
    """unpermute(permute(x)) with identity experts = sum of the valid weights times x (within fp32 rounding)."""
    t, k, e, h = 33, 6, 10, 64
    x = torch.randn(t, h, generator=_gen(15)).to(dtype)
    idx = _routing(t, k, e, seed=16)
    idx[0] = -1
    w = torch.rand(t, k, generator=_gen(17))
    res = tk.moe_permute(x, idx, e, block=block)
    out = tk.moe_unpermute(res.x, res.src_map, w, out_dtype=torch.float32)
    wsum = torch.where(idx >= 0, w.double(), 0.0).sum(1, keepdim=True)
    exact = wsum * x.double()
    bound = 2 * k * 2.0**-24 * (torch.where(idx >= 0, w.double(), 0.0).sum(1, keepdim=True) * x.double().abs())
    assert bool(((out.double() - exact).abs() <= bound).all())
    assert bool((out[0] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [None, 128])
def test_round_trip_exact_with_unit_weights_and_one_slot(dtype: torch.dtype, block: int | None) -> None:
    t, e, h = 50, 7, 32
    x = (torch.randn(t, h, generator=_gen(18)) * 1e3).to(dtype)
    idx = torch.randint(0, e, (t, 1), generator=_gen(19))
    res = tk.moe_permute(x, idx, e, block=block)
    out = tk.moe_unpermute(res.x, res.src_map, torch.ones(t, 1))
    assert out.dtype == dtype and torch.equal(out, x)


def test_unpermute_edge_shapes() -> None:
    w = torch.ones(4, 2)
    # no rows: every slot masked
    out = tk.moe_unpermute(torch.zeros(0, 8, dtype=torch.bfloat16), torch.full((4, 2), -1), w)
    assert out.dtype == torch.bfloat16 and out.shape == (4, 8) and bool((out == 0).all())
    assert tk.moe_unpermute(torch.zeros(3, 8), torch.zeros(0, 2, dtype=torch.int32), w[:0]).shape == (0, 8)
    assert tk.moe_unpermute(torch.zeros(3, 8), torch.zeros(4, 0, dtype=torch.int32), w[:, :0]).shape == (4, 8)


def test_unpermute_bad_inputs() -> None:
    y = torch.randn(6, 8)
    src = torch.tensor([[0, 1], [2, -1], [-1, -1]], dtype=torch.int32)
    w = torch.ones(3, 2)
    with pytest.raises(ValueError, match="y must have 2 dims"):
        tk.moe_unpermute(y[None], src, w)
    with pytest.raises(TypeError, match="y must be a float tensor"):
        tk.moe_unpermute(y.long(), src, w)
    with pytest.raises(TypeError, match="src_map must be int32 or int64"):
        tk.moe_unpermute(y, src.float(), w)
    with pytest.raises(ValueError, match="src_map must have 2 dims"):
        tk.moe_unpermute(y, src[0], w)
    with pytest.raises(TypeError, match="topk_weights must be a float tensor"):
        tk.moe_unpermute(y, src, w.int())
    with pytest.raises(ValueError, match=r"topk_weights must have src_map's shape \(3, 2\)"):
        tk.moe_unpermute(y, src, w[:, :1])
    with pytest.raises(ValueError, match=r"src_map values must be in \[-1, 5\].*got 6"):
        tk.moe_unpermute(y, torch.where(src == 2, 6, src), w)
    with pytest.raises(ValueError, match=r"src_map values must be in \[-1, 5\].*got -3"):
        tk.moe_unpermute(y, torch.where(src < 0, -3, src), w)
    with pytest.raises(TypeError, match="out_dtype must be None or a float torch.dtype"):
        tk.moe_unpermute(y, src, w, out_dtype=torch.int32)
    with pytest.raises(TypeError, match="out_dtype must be None or a float torch.dtype"):
        tk.moe_unpermute(y, src, w, out_dtype="bf16")


def test_api_is_the_reference_on_cpu() -> None:
    x = torch.randn(12, 16, generator=_gen(20)).bfloat16()
    idx = _routing(12, 4, 6, seed=21, dtype=torch.int32)
    a, b = tk.moe_permute(x, idx, 6, block=16), ref.moe_permute(x, idx, 6, block=16)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    w = torch.rand(12, 4, generator=_gen(22))
    assert torch.equal(tk.moe_unpermute(a.x, a.src_map, w), ref.moe_unpermute(a.x, a.src_map, w))
    assert {"moe_permute", "moe_unpermute", "MoePermutation"} <= set(tk.__all__)
