"""Fused indexer scores + top-k (`backends/cuda/triton_indexer.py`) vs reference scores followed by topk.

On CPU the kernel runs in Triton's interpreter on tiny shapes (h = 16, d = 32; the kernel needs powers of two
>= 16); the `gpu` tests run V4's h = 64, d = 128. Inputs are small integers with power-of-two weights, so every
score is exact in fp32 whatever the summation order, ReLU makes many exact zeros (ties), and the kernel must
select exactly the reference's set. A random-input test checks the set against float64 scores up to the fp32
accumulation bound instead.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from test_ds_indexer import U32, _exact_inputs, _paged_layout  # noqa: E402

from deepinfer.deep_select import reference as ref  # noqa: E402
from deepinfer.deep_select.backends.cuda.triton_indexer import indexer_topk_fused  # noqa: E402

_DEV = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.gpu


def _as_set(idx: torch.Tensor) -> torch.Tensor:
    return torch.sort(idx.cpu(), dim=1).values


def _dev(*ts: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.to(_DEV) for t in ts]


def _check_flat(t: int, h: int, n: int, d: int, k: int, seed: int, **kw: int) -> None:
    g = torch.Generator().manual_seed(seed)
    q, w, keys = _exact_inputs(t, h, n, d, g)
    cache = torch.cat([keys, torch.full((7, d), float("nan"), dtype=keys.dtype)])  # slots past n: never read
    visible = torch.randint(0, n + 1, (t,), generator=g, dtype=torch.int32)
    visible[:3] = torch.tensor([0, n, n + 5], dtype=torch.int32)[:t]
    visible = visible.clamp(max=n)  # the cache's NaN rows must stay invisible
    got = indexer_topk_fused(*_dev(q, w, cache), k, visible=_dev(visible)[0], **kw)
    want = ref.indexer_topk(q, w, cache, k, visible, None, None, None)
    assert torch.equal(_as_set(got), _as_set(want))


def test_fused_flat_exact() -> None:
    _check_flat(7, 16, 300, 32, 40, seed=1, block_n=32, block=64, programs=3)


def test_fused_flat_k_larger_than_rows_and_fp32() -> None:
    g = torch.Generator().manual_seed(2)
    q, w, keys = _exact_inputs(4, 16, 50, 16, g)
    q, keys = q.float(), keys.float()
    visible = torch.tensor([50, 3, 0, 49], dtype=torch.int32)
    got = indexer_topk_fused(*_dev(q, w, keys), 64, visible=_dev(visible)[0], block_n=16, block=64, programs=2)
    want = ref.indexer_topk(q, w, keys, 64, visible, None, None, None)
    assert torch.equal(_as_set(got), _as_set(want))
    assert bool((got.cpu()[2] == -1).all()) and int((got.cpu()[1] >= 0).sum()) == 3


@pytest.mark.parametrize("flat_cache", [False, True])
def test_fused_paged(flat_cache: bool) -> None:
    g = torch.Generator().manual_seed(3 + flat_cache)
    h, d, rpb, k, num_blocks = 16, 32, 16, 24, 24
    lens = [70, 5, 33]
    table, owned = _paged_layout(lens, rpb, num_blocks, g)
    cache = torch.full((num_blocks, rpb, d), float("nan"), dtype=torch.bfloat16)
    for s, n in enumerate(lens):
        _, _, keys = _exact_inputs(1, h, n, d, g)
        for j in range(n):
            cache[owned[s][j // rpb], j % rpb] = keys[j]
    seq_rows = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2], dtype=torch.int64)
    visible = torch.tensor([0, 31, 70, 1, 5, 32, 33, 20], dtype=torch.int32)
    q, w, _ = _exact_inputs(len(seq_rows), h, 1, d, g)
    kc, rpb_arg = (cache.view(-1, d), rpb) if flat_cache else (cache, None)
    got = indexer_topk_fused(
        *_dev(q, w, kc), k, visible=_dev(visible)[0], seq_rows=_dev(seq_rows)[0], block_table=_dev(table)[0],
        rows_per_block=rpb_arg, block_n=16, block=32, programs=3,
    )  # fmt: skip
    want = ref.indexer_topk(q, w, kc, k, visible, seq_rows, table, rpb)
    assert torch.equal(_as_set(got), _as_set(want))


def _check_random(t: int, h: int, n: int, d: int, k: int, seed: int, **kw: int) -> None:
    """Normal inputs: a valid top-k of the float64 scores up to the fp32 accumulation bound."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, d, generator=g).bfloat16()
    keys = torch.randn(n, d, generator=g).bfloat16()
    w = torch.rand(t, h, generator=g)
    visible = torch.randint(1, n + 1, (t,), generator=g, dtype=torch.int32)
    got = indexer_topk_fused(*_dev(q, w, keys), k, visible=_dev(visible)[0], **kw).cpu()
    qd, kd, wd = q.double(), keys.double(), w.double()
    exact = torch.einsum("thn,th->tn", torch.relu(torch.einsum("thd,nd->thn", qd, kd)), wd)
    bound = (d + h + 2) * U32 * torch.einsum("th,thd,nd->tn", wd, qd.abs(), kd.abs())
    for r in range(t):
        vis = int(visible[r])
        chosen = got[r][got[r] >= 0].long()
        assert chosen.numel() == min(k, vis) and chosen.unique().numel() == chosen.numel()
        assert bool((chosen < vis).all())
        mask = torch.zeros(vis, dtype=torch.bool)
        mask[chosen] = True
        if (~mask).any():
            slack = 2 * bound[r, :vis].max()
            assert exact[r, :vis][mask].min() >= exact[r, :vis][~mask].max() - slack


def test_fused_random_inputs_property() -> None:
    _check_random(5, 16, 200, 32, 30, seed=5, block_n=32, block=64, programs=2)


# ---- GPU only: V4's indexer shape (h = 64, d = 128, bf16 MMA) ----


@gpu
def test_fused_gpu_v4_shape_exact() -> None:
    _check_flat(64, 64, 8192, 128, 512, seed=11)


@gpu
def test_fused_gpu_v4_shape_random() -> None:
    _check_random(32, 64, 20000, 128, 512, seed=12)


@gpu
def test_fused_gpu_paged_long() -> None:
    g = torch.Generator().manual_seed(13)
    h, d, rpb, k, n = 64, 128, 64, 512, 65536
    num_blocks = n // rpb + 8
    table = torch.randperm(num_blocks, generator=g)[: n // rpb].to(torch.int32)[None, :]
    q, w, _ = _exact_inputs(16, h, 1, d, g)
    cache = torch.randint(-3, 4, (num_blocks, rpb, d), generator=g).to(torch.bfloat16)
    visible = torch.randint(0, n + 1, (16,), generator=g, dtype=torch.int32)
    got = indexer_topk_fused(*_dev(q, w, cache), k, visible=_dev(visible)[0], block_table=_dev(table)[0])
    want = ref.indexer_topk(q, w, cache, k, visible, None, table, rpb)
    assert torch.equal(_as_set(got), _as_set(want))


def test_api_fused_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """api.indexer_topk(fused=True) runs the fused kernel (Triton backend; the interpreter on CPU) and selects the
    reference's set on exact-sum inputs; shapes the kernel cannot take (h = 12) quietly use the unfused path."""
    from deepinfer.deep_select import api
    from deepinfer.deep_select.backends.cuda import triton_indexer

    if not torch.cuda.is_available():
        monkeypatch.setenv("DEEPINFER_DEEP_SELECT_BACKEND", "triton")
    calls = []
    fused_fn = triton_indexer.indexer_topk_fused
    monkeypatch.setattr(triton_indexer, "indexer_topk_fused", lambda *a, **kw: calls.append(1) or fused_fn(*a, **kw))
    g = torch.Generator().manual_seed(5)
    for h, want_calls in ((16, 1), (12, 1)):
        q, w, keys = _exact_inputs(3, h, 64, 16, g)
        visible = torch.tensor([64, 10, 0], dtype=torch.int32)
        got = api.indexer_topk(*_dev(q, w, keys), 20, visible=_dev(visible)[0], fused=True)
        want = ref.indexer_topk(q, w, keys, 20, visible, None, None, None)
        assert torch.equal(_as_set(got), _as_set(want)), f"h={h}"
        assert len(calls) == want_calls, f"h={h}: fused kernel called {len(calls)} times"
