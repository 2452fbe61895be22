"""Counter-based sampling noise (`sample_noise.py`): the int64 hash equals its plain-Python oracle bit for bit, the
draws are Exp(1), and a row's noise depends only on (seed, step, token id), on the CPU and on the GPU alike."""

from __future__ import annotations

import pytest
import torch

from deepinfer.engine.sample_noise import _GOLDEN, _MASK64, exponential_noise, splitmix64_py, uniform_bits
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
