"""Counter-based sampling noise (`sample_noise.py`): the int64 hash equals its plain-Python oracle bit for bit, the
draws are Exp(1), and a row's noise depends only on (seed, step, token id), on the CPU and on the GPU alike."""

from __future__ import annotations

import math

import pytest
import torch

from deepinfer.engine.sample_noise import (
    _GOLDEN,
    _M1,
    _M2,
    _MASK64,
    exponential_noise,
    row_keys,
    splitmix64_py,
    uniform_bits,
)
from deepinfer.engine.sampler import row_seed, sample_tensor
from deepinfer.engine.sampling_params import SamplingParams

EDGE_SEEDS = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, row_seed(-5, 2), row_seed(123456789, 10**6)]


def _oracle(r: int, vocab: int) -> list[int]:
    key = splitmix64_py(r & _MASK64)
    return [splitmix64_py((key + (i + 1) * _GOLDEN) & _MASK64) >> 11 for i in range(vocab)]


def test_hash_matches_the_python_oracle():
    """Wrap-around multiplies and logical shifts on int64 give splitmix64's unsigned bits (sign-bit seeds too)."""
    got = uniform_bits(EDGE_SEEDS, 37, torch.device("cpu"))
    assert got.dtype == torch.int64 and got.shape == (len(EDGE_SEEDS), 37)
    for row, r in zip(got.tolist(), EDGE_SEEDS):
        assert row == _oracle(r, 37)
    assert int(got.min()) >= 0 and int(got.max()) < 2**53
    # the Triton race kernel (sample_race._mix) spells the same constants as literals
    assert (_GOLDEN, _M1, _M2) == (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def test_noise_is_exponential_and_row_local():
    """Mean / variance / tail of 10^6 draws match Exp(1) within 6 sigma; a row's draws ignore the other rows."""
    seeds = [row_seed(7, s) for s in range(1000)]
    e = exponential_noise(seeds, 1000, torch.device("cpu"))
    n = e.numel()
    assert abs(float(e.mean()) - 1.0) < 6 / n**0.5
    assert abs(float(e.var()) - 1.0) < 6 * 8**0.5 / n**0.5  # Var of E^2 terms: 8 for Exp(1)
    tail = float((e > 3.0).double().mean())  # P(E > 3) = e^-3
    assert abs(tail - 0.049787) < 6 * (0.049787 * (1 - 0.049787) / n) ** 0.5
    alone = exponential_noise(seeds[5:6], 1000, torch.device("cpu"))
    assert torch.equal(alone[0], e[5])


def _batch(vocab: int, b: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, vocab, generator=g) * 2
    kinds = [
        SamplingParams(temperature=0.8, top_k=50),
        SamplingParams(temperature=0),
        SamplingParams(top_p=0.9),
        SamplingParams(temperature=1.2, min_p=0.05),
    ]
    params = [kinds[i % len(kinds)] for i in range(b)]
    return logits, params, list(range(100, 100 + b)), [i * 3 for i in range(b)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_draws_the_cpu_bits_and_tokens():
    """The same noise bits on CUDA as on the CPU, the same tokens for a mixed batch at the V4 vocabulary size, and
    the batched sampler's time at batch 32 (printed)."""
    from kernelkit import bench_cuda

    seeds = EDGE_SEEDS + [row_seed(s, 9) for s in range(25)]
    cpu = uniform_bits(seeds, 129280, torch.device("cpu"))
    gpu = uniform_bits(seeds, 129280, torch.device("cuda"))
    assert torch.equal(gpu.cpu(), cpu)
    logits, params, seeds, steps = _batch(129280, 32, 1)
    want = sample_tensor(logits, params, seeds, steps)
    got = sample_tensor(logits.cuda(), params, seeds, steps)
    assert got.cpu().tolist() == want.tolist()
    lc = logits.cuda()
    us = bench_cuda(lambda: sample_tensor(lc, params, seeds, steps), mode="events")["median_us"]
    print(f"sample_tensor b=32 V=129280 (8 top-k, 8 greedy, 8 top-p, 8 min-p rows): {us:.1f} us")


def _torch_race(scores: torch.Tensor, thr: torch.Tensor, seeds: list[int]) -> torch.Tensor:
    """The sampler's torch path of the race (mask below thr, float64 noise, argmax)."""
    masked = scores.masked_fill(scores < thr[:, None], -math.inf)
    noise = exponential_noise(seeds, scores.shape[1], scores.device)
    return torch.argmax(masked.double() - noise.clamp_min(torch.finfo(torch.float64).tiny).log(), dim=-1)


def test_fused_race_equals_the_torch_path(monkeypatch):
    """The Triton race (interpreter here) picks what the torch path picks: thresholds off / mid / at the max, holes
    (-inf scores), a vocabulary that is not a multiple of the block (several blocks), and ties in the scores."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from deepinfer.engine import sample_race

    monkeypatch.setattr(sample_race, "BLOCK", 64)  # several blocks per row at this vocabulary
    g = torch.Generator().manual_seed(5)
    b, vocab = 12, 300
    scores = torch.randn(b, vocab, generator=g) * 2
    scores[1, ::3] = -math.inf  # tokens already dropped (top-p)
    scores[2, :] = 0.5  # every score tied
    thr = torch.full((b,), -math.inf)
    thr[3:6] = scores[3:6].median(dim=-1).values
    thr[6] = scores[6].max()  # only the largest survives
    seeds = [row_seed(9, s) for s in range(b)]
    got = sample_race.race_argmax(scores, thr, row_keys(seeds, torch.device("cpu")))
    assert got.tolist() == _torch_race(scores, thr, seeds).tolist()
    assert int(got[6]) == int(scores[6].argmax())
    with pytest.raises(ValueError, match="scores"):
        sample_race.race_argmax(scores.double(), thr, row_keys(seeds, torch.device("cpu")))
