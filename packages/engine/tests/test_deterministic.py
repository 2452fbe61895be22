"""DEEPINFER_DETERMINISTIC: the fixed-order MoE combine against index_add_ (CPU: bit-equal; GPU: run to run)."""

from __future__ import annotations

import pytest
import torch

from deepinfer.engine.model import moe_grouped
from deepinfer.engine.model.deterministic import add_rows, combine_rows, combine_weighted, deterministic_enabled


def _pairs(t: int, k: int, h: int, e: int, seed: int, device: str = "cpu"):
    """MoE-shaped pairs: each of t tokens picks k distinct experts of e; pairs sorted by expert (as MoE.forward)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.rand(t, e, generator=g).argsort(dim=1)[:, :k]
    order = torch.argsort(ids.flatten(), stable=True)
    tok = order // k
    src = torch.randn(t * k, h, generator=g) * torch.rand(t * k, 1, generator=g) * 8
    return tok.to(device), src.to(device)


@pytest.mark.parametrize("t,k,h", [(1, 1, 8), (5, 6, 64), (33, 8, 40)])
def test_combine_rows_bit_equal_to_cpu_index_add(t, k, h):
    tok, src = _pairs(t, k, h, e=16, seed=t * 100 + k)
    want = torch.zeros(t, h).index_add_(0, tok, src)
    got = combine_rows(t, tok, src)
    assert got.dtype == torch.float32 and got.shape == (t, h)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (got - want).abs().max()


def test_combine_rows_large_path_same_bits(monkeypatch):
    from deepinfer.engine.model import deterministic

    tok, src = _pairs(20, 6, 24, e=10, seed=11)
    small = combine_rows(20, tok, src)
    monkeypatch.setattr(deterministic, "_GATHER_ALL_MAX", 0)  # the column-at-a-time (prefill) path
    assert torch.equal(combine_rows(20, tok, src), small)


def test_combine_rows_run_to_run_and_bf16_src():
    tok, src = _pairs(17, 6, 32, e=12, seed=3)
    src = src.bfloat16()
    a, b = combine_rows(17, tok, src), combine_rows(17, tok, src)
    assert torch.equal(a, b)
    want = torch.zeros(17, 32).index_add_(0, tok, src.float())
    assert torch.equal(a, want)


def test_combine_rows_empty_and_bad_input():
    assert combine_rows(0, torch.zeros(0, dtype=torch.int64), torch.zeros(0, 4)).shape == (0, 4)
    with pytest.raises(ValueError, match="divisible"):
        combine_rows(3, torch.zeros(4, dtype=torch.int64), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="expected index"):
        combine_rows(2, torch.zeros(4, 1, dtype=torch.int64), torch.zeros(4, 2))


def test_add_rows_and_flag(monkeypatch):
    tok, src = _pairs(9, 4, 16, e=8, seed=7)
    base = torch.randn(9, 16)
    assert torch.equal(add_rows(base.clone(), tok, src), base.clone().index_add_(0, tok, src))
    monkeypatch.delenv("DEEPINFER_DETERMINISTIC", raising=False)
    assert deterministic_enabled()
    x = torch.randn(9, 16)
    y, w = src.bfloat16(), torch.rand(src.shape[0])
    on = moe_grouped._combine(x, tok, y, w)
    monkeypatch.setenv("DEEPINFER_DETERMINISTIC", "0")
    assert not deterministic_enabled()
    off = moe_grouped._combine(x, tok, y, w)
    assert torch.equal(on, off)  # CPU index_add_ is sequential: the same order, the same bits


def _weighted(t: int, k: int, h: int, seed: int):
    """MoE pairs with bf16 expert outputs y [P, h] and fp32 routing weights w [P] (fresh random, no zeros)."""
    tok, src = _pairs(t, k, h, e=16 if k <= 16 else 4 * k, seed=seed)
    w = torch.rand(t * k, generator=torch.Generator().manual_seed(seed + 1)) + 0.01
    return tok, src.bfloat16(), w


@pytest.mark.parametrize("t,k,h", [(1, 1, 8), (5, 6, 64), (33, 8, 40)])
def test_combine_weighted_bit_equal_to_combine_rows(t, k, h):
    """One sort + moe_unpermute gives the bits of the k-add combine of the fp32 products (= CPU index_add_)."""
    tok, y, w = _weighted(t, k, h, seed=t * 10 + k)
    yw = y.float() * w[:, None]
    want = torch.zeros(t, h).index_add_(0, tok, yw)
    got = combine_weighted(t, tok, y, w)
    assert got.dtype == torch.float32 and got.shape == (t, h)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (got - want).abs().max()
    assert torch.equal(got, combine_rows(t, tok, yw))


def test_combine_weighted_empty_and_bad_input():
    e = torch.zeros(0, dtype=torch.int64)
    assert combine_weighted(0, e, torch.zeros(0, 4), torch.zeros(0)).shape == (0, 4)
    with pytest.raises(ValueError, match="divisible"):
        combine_weighted(3, torch.zeros(4, dtype=torch.int64), torch.randn(4, 2), torch.rand(4))
    with pytest.raises(ValueError, match=r"expected index \[P\], y \[P, H\], w \[P\]"):
        combine_weighted(2, torch.zeros(4, dtype=torch.int64), torch.randn(4, 2), torch.rand(3))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_combine_rows_gpu_deterministic_and_matches_cpu():
    # Decode-sized (b=32, k=6) and prefill-sized (4096 tokens); H = V4-Flash hidden 4096.
    for t, k in ((32, 6), (4096, 6)):
        tok, src = _pairs(t, k, 4096, e=256, seed=t)
        want = torch.zeros(t, 4096).index_add_(0, tok, src)
        runs = [combine_rows(t, tok.cuda(), src.cuda()) for _ in range(3)]
        same = all(torch.equal(runs[0], r) for r in runs[1:])
        cpu_equal = torch.equal(runs[0].cpu(), want)
        atomic = [torch.zeros(t, 4096, device="cuda").index_add_(0, tok.cuda(), src.cuda()) for _ in range(5)]
        atomic_same = all(torch.equal(atomic[0], a) for a in atomic[1:])
        print(f"t={t} k={k}: fixed-order same={same} == cpu={cpu_equal}; atomic index_add_ same x5={atomic_same}")
        assert same and cpu_equal, f"t={t}: run-to-run same {same}, equal to CPU index_add_ {cpu_equal}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_combine_weighted_gpu_matches_cpu_and_is_faster():
    """The one-kernel combine on the GPU: the CPU index_add_ bits, run to run; timed against combine_rows."""
    for t, k in ((32, 6), (4096, 6)):
        tok, y, w = _weighted(t, k, 4096, seed=t)
        want = torch.zeros(t, 4096).index_add_(0, tok, y.float() * w[:, None])
        tc, yc, wc = tok.cuda(), y.cuda(), w.cuda()
        runs = [combine_weighted(t, tc, yc, wc) for _ in range(3)]
        same = all(torch.equal(runs[0], r) for r in runs[1:])
        cpu_equal = torch.equal(runs[0].cpu(), want)
        new_us, old_us = _time_combines(t, tc, yc, wc)
        print(f"t={t} k={k}: same={same} == cpu={cpu_equal}; weighted {new_us:.1f} us vs rows {old_us:.1f} us")
        assert same and cpu_equal, f"t={t}: run-to-run same {same}, equal to CPU index_add_ {cpu_equal}"


def _time_combines(t: int, tok: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[float, float]:
    """Median us of combine_weighted and of the session-7 path (fp32 products, then combine_rows)."""
    from kernelkit import bench_cuda

    new = bench_cuda(lambda: combine_weighted(t, tok, y, w))["median_us"]
    old = bench_cuda(lambda: combine_rows(t, tok, y.float() * w[:, None]))["median_us"]
    return float(new), float(old)
