"""deep_select.indexer_scores / indexer_topk (reference path).

indexer_topk must equal indexer_scores + topk exactly. To make "exactly" meaningful regardless of summation
order, the equality tests use small-integer q / k and power-of-two weights: every dot product and weighted sum
is then exact in fp32, so ReLU produces many exact zeros and ties, and any tie-rule slip changes the result.
"""

from __future__ import annotations

import pytest
import torch
from ds_checks import check_topk

from deepinfer.deep_select import api

U32 = 2.0**-24  # fp32 unit roundoff


def _as_set(idx: torch.Tensor) -> torch.Tensor:
    """Row-wise sorted ids: equal iff the chosen sets (and the padding counts) are equal."""
    return torch.sort(idx, dim=1).values


def _exact_inputs(t: int, h: int, n: int, d: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """q >= 0 and half of the keys <= 0 (their scores are exact ReLU zeros); all sums exact in fp32."""
    q = torch.randint(0, 4, (t, h, d), generator=g).to(torch.bfloat16)
    k = torch.randint(-3, 4, (n, d), generator=g).float()
    k = torch.where(torch.rand(n, 1, generator=g) < 0.5, -k.abs(), k).to(torch.bfloat16)
    w = 2.0 ** torch.randint(-3, 3, (t, h), generator=g).float()
    return q, w, k


def test_indexer_scores_vs_float64() -> None:
    g = torch.Generator().manual_seed(10)
    t, h, n, d = 5, 8, 70, 128
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.randn(t, h, d, generator=g).to(dtype)
        k = torch.randn(n, d, generator=g).to(dtype)
        w = torch.randn(t, h, generator=g)
        got = api.indexer_scores(q, w, k)
        qd, kd, wd = q.double(), k.double(), w.double()
        want = torch.einsum("thn,th->tn", torch.relu(torch.einsum("thd,nd->thn", qd, kd)), wd)
        # fp32 error bound: a (d + h + 2)-term accumulation of |w| |q| |k| products.
        bound = (d + h + 2) * U32 * torch.einsum("th,thd,nd->tn", wd.abs(), qd.abs(), kd.abs())
        assert got.dtype == torch.float32 and got.shape == (t, n)
        assert bool(((got.double() - want).abs() <= bound).all())


def test_indexer_topk_flat_equals_scores_plus_topk() -> None:
    g = torch.Generator().manual_seed(11)
    t, h, n, d, k = 9, 4, 300, 64, 64
    q, w, keys = _exact_inputs(t, h, n, d, g)
    cache = torch.cat([keys, torch.full((20, d), float("nan"), dtype=keys.dtype)])  # rows past n: unused
    visible = torch.tensor([0, 1, 5, 63, 64, 65, 200, 300, 300], dtype=torch.int32)
    got = api.indexer_topk(q, w, cache, k, visible=visible)
    scores = api.indexer_scores(q, w, keys)
    assert (scores == 0).float().mean() > 0.3  # the case this test exists for: many exact ReLU zeros
    want = api.topk(scores, k, lengths=visible, sorted=True)
    assert torch.equal(_as_set(got), _as_set(want))  # indexer_topk's order is unspecified
    check_topk(scores, k, visible, got, None, False)


def _paged_layout(
    lens: list[int], rpb: int, num_blocks: int, g: torch.Generator
) -> tuple[torch.Tensor, list[list[int]]]:
    """A shuffled block table (int32 [seqs, max_blocks], garbage past each sequence's blocks)."""
    need = [-(-n // rpb) for n in lens]
    perm = torch.randperm(num_blocks, generator=g).tolist()
    max_blocks = max(need) + 2
    table = torch.full((len(lens), max_blocks), 2**30, dtype=torch.int32)  # never dereferenced
    owned, at = [], 0
    for s, nb in enumerate(need):
        blocks = perm[at : at + nb]
        at += nb
        table[s, :nb] = torch.tensor(blocks, dtype=torch.int32)
        owned.append(blocks)
    return table, owned


@pytest.mark.parametrize("flat_cache", [False, True])
def test_indexer_topk_paged(flat_cache: bool) -> None:
    g = torch.Generator().manual_seed(12 + flat_cache)
    h, d, rpb, k, num_blocks = 4, 64, 16, 32, 24
    lens = [70, 5, 33]
    table, owned = _paged_layout(lens, rpb, num_blocks, g)
    cache = torch.full((num_blocks, rpb, d), float("nan"), dtype=torch.bfloat16)
    seq_keys = []
    for s, n in enumerate(lens):
        _, _, keys = _exact_inputs(1, h, n, d, g)
        seq_keys.append(keys)
        for j in range(n):
            cache[owned[s][j // rpb], j % rpb] = keys[j]
    seq_rows = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2], dtype=torch.int64)
    visible = torch.tensor([0, 31, 70, 1, 5, 32, 33, 20], dtype=torch.int32)
    q, w, _ = _exact_inputs(len(seq_rows), h, 1, d, g)
    kc, rpb_arg = (cache.view(-1, d), rpb) if flat_cache else (cache, None)
    got = api.indexer_topk(q, w, kc, k, visible=visible, seq_rows=seq_rows, block_table=table, rows_per_block=rpb_arg)
    assert got.dtype == torch.int32 and got.shape == (len(seq_rows), k)
    for i, s in enumerate(seq_rows.tolist()):
        scores = api.indexer_scores(q[i : i + 1], w[i : i + 1], seq_keys[s])
        vis = visible[i : i + 1]
        assert torch.equal(_as_set(got[i : i + 1]), _as_set(api.topk(scores, k, lengths=vis, sorted=True)))


def test_indexer_topk_random_inputs_property() -> None:
    """Non-exact (normal) inputs: the chosen set is a valid top-k of the float64 scores up to the fp32 bound."""
    g = torch.Generator().manual_seed(14)
    t, h, n, d, k = 6, 8, 400, 128, 100
    q = torch.randn(t, h, d, generator=g).bfloat16()
    keys = torch.randn(n, d, generator=g).bfloat16()
    w = torch.rand(t, h, generator=g)
    visible = torch.tensor([400, 399, 100, 99, 7, 250], dtype=torch.int32)
    got = api.indexer_topk(q, w, keys, k, visible=visible)
    exact = torch.einsum("thn,th->tn", torch.relu(torch.einsum("thd,nd->thn", q.double(), keys.double())), w.double())
    bound = (d + h + 2) * U32 * torch.einsum("th,thd,nd->tn", w.double(), q.double().abs(), keys.double().abs())
    for r in range(t):
        vis = int(visible[r])
        chosen = got[r][got[r] >= 0].long()
        assert chosen.numel() == min(k, vis) and bool((chosen < vis).all())
        mask = torch.zeros(vis, dtype=torch.bool)
        mask[chosen] = True
        if (~mask).any():
            slack = 2 * bound[r, :vis].max()
            assert exact[r, :vis][mask].min() >= exact[r, :vis][~mask].max() - slack


_Q, _W, _K = torch.randn(3, 2, 8), torch.randn(3, 2), torch.randn(10, 8)
_V = torch.tensor([1, 2, 3], dtype=torch.int32)


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        (dict(q=torch.randn(3, 8)), ValueError, "q"),
        (dict(weights=torch.randn(3, 3)), ValueError, "weights"),
        (dict(weights=torch.randn(3, 2).bfloat16()), TypeError, "weights"),
        (dict(k_cache=torch.randn(10, 7)), ValueError, "k_cache"),
        (dict(visible=torch.tensor([1, 2], dtype=torch.int32)), ValueError, "visible"),
        (dict(block_table=torch.zeros(2, 3, dtype=torch.int32)), ValueError, "rows_per_block|seq_rows"),
        (dict(seq_rows=_V), ValueError, "block_table"),
        (dict(block_table=torch.zeros(1, 3, dtype=torch.int32), rows_per_block=0), ValueError, "rows_per_block"),
        (dict(block_table=torch.zeros(1, 3)), TypeError, "block_table"),
    ],
)
def test_indexer_topk_rejects_bad_arguments(kwargs: dict, exc: type, name: str) -> None:
    args = dict(q=_Q, weights=_W, k_cache=_K, k=4, visible=_V) | kwargs
    with pytest.raises(exc, match=name):
        api.indexer_topk(args.pop("q"), args.pop("weights"), args.pop("k_cache"), args.pop("k"), **args)


def test_indexer_scores_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="k must have last dim"):
        api.indexer_scores(_Q, _W, torch.randn(10, 9))
    with pytest.raises(TypeError, match="q"):
        api.indexer_scores(_Q.half(), _W, _K)
