"""Sampler: exact filtered distribution, reproducibility, batch invariance, logprobs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from deepinfer.engine.sampler import row_seed, sample, token_logprobs
from deepinfer.engine.sampling_params import SamplingParams

PROBS = [0.05, 0.4, 0.03, 0.25, 0.15, 0.12]  # not sorted, so filters must map back to token ids


def _expected(probs: list[float], p: SamplingParams) -> list[float]:
    """The documented target distribution, computed plainly in float64 (temperature, top-k, top-p, min-p)."""
    weights = [math.exp(math.log(q) / p.temperature) for q in probs]
    order = sorted(range(len(probs)), key=lambda i: (-weights[i], i))
    keep = set(order[: p.top_k] if p.top_k > 0 else order)
    if p.top_p < 1.0:
        total, mass, kept = sum(weights[i] for i in keep), 0.0, set()
        for i in (i for i in order if i in keep):
            if mass / total >= p.top_p:
                break
            kept.add(i)
            mass += weights[i]
        keep = kept
    top = max(weights[i] for i in keep)
    keep = {i for i in keep if weights[i] >= p.min_p * top}
    total = sum(weights[i] for i in keep)
    return [weights[i] / total if i in keep else 0.0 for i in range(len(probs))]


def _chi2(counts: list[int], expected: list[float]) -> tuple[float, int]:
    n = sum(counts)
    cells = [(c, e * n) for c, e in zip(counts, expected) if e > 0]
    return sum((c - m) ** 2 / m for c, m in cells), len(cells) - 1


def _chi2_limit(df: int, false_alarm: float = 1e-6) -> float:
    """x with P(chi2_df > x) = false_alarm (bisection on the regularised upper incomplete gamma)."""
    lo, hi = 0.0, 200.0
    for _ in range(60):
        mid = (lo + hi) / 2
        tail = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(mid / 2)))
        lo, hi = (mid, hi) if tail > false_alarm else (lo, mid)
    return hi


def _draw(p: SamplingParams, n: int, seed: int) -> list[int]:
    logits = torch.log(torch.tensor(PROBS)).expand(n, -1).contiguous()
    out = sample(logits, [p] * n, [seed] * n, list(range(n)))
    return torch.bincount(torch.tensor(out.token_ids), minlength=len(PROBS)).tolist()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=1.7, top_k=3),
        SamplingParams(top_p=0.7),
        SamplingParams(min_p=0.3),
        SamplingParams(temperature=0.8, top_k=5, top_p=0.85, min_p=0.1),
    ],
    ids=["plain", "temp", "topk", "topp", "minp", "all"],
)
def test_samples_follow_the_filtered_distribution(params):
    num = 20_000 if params == SamplingParams() else 10_000  # the filtered rows cost more; 10k keeps the power
    counts = _draw(params, num, seed=int(torch.randint(0, 2**31, ()).item()))
    expected = _expected(PROBS, params)
    stat, df = _chi2(counts, expected)
    assert stat < _chi2_limit(df), (counts, expected)
    assert all(c == 0 for c, e in zip(counts, expected) if e == 0), "a filtered-out token was sampled"
    # The same counts must be rejected for a twice as warm temperature (the check has power).
    warmer = dataclasses.replace(params, temperature=params.temperature * 2)
    wrong_stat, wrong_df = _chi2(counts, _expected(PROBS, warmer))
    assert wrong_stat > _chi2_limit(wrong_df)


def test_greedy_takes_the_argmax_with_ties_to_the_lowest_id():
    logits = torch.randn(3, 50)
    logits[1, 7] = logits[1, 31] = logits[1].max() + 1.0
    greedy = SamplingParams(temperature=0)
    out = sample(logits, [greedy] * 3, [1, 2, 3], [0, 5, 9])
    assert out.token_ids == logits.argmax(-1).tolist() and out.token_ids[1] == 7
    assert sample(logits, [greedy] * 3, [4, 5, 6], [1, 1, 1]).token_ids == out.token_ids


def test_reproducible_per_seed_and_step():
    logits = torch.randn(1, 1000).expand(64, -1).contiguous()
    p = SamplingParams(temperature=1.0)
    steps = list(range(64))
    first = sample(logits, [p] * 64, [11] * 64, steps).token_ids
    assert sample(logits, [p] * 64, [11] * 64, steps).token_ids == first
    assert len(set(first)) > 10, "each step must draw fresh noise"
    assert sample(logits, [p] * 64, [12] * 64, steps).token_ids != first
    assert row_seed(11, 3) == 11 * 1_000_003 + 3 and 0 <= row_seed(-5, 2) < 2**64


def test_batch_invariance():
    vocab = 300
    rows = torch.randn(6, vocab) * 3
    params = [
        SamplingParams(temperature=0.9, seed=1),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.3, top_k=20, logprobs=2),
        SamplingParams(top_p=0.6, min_p=0.01),
        SamplingParams(temperature=0.5, top_k=7, top_p=0.9),
        SamplingParams(min_p=0.2, logprobs=0),
    ]
    seeds, steps = [3, 1, 4, 1, 5, 9], [0, 2, 6, 5, 3, 5]
    alone = [sample(rows[i : i + 1], [params[i]], [seeds[i]], [steps[i]]) for i in range(6)]
    perm = torch.randperm(6).tolist()
    mixed = sample(
        torch.cat([rows[perm], torch.randn(4, vocab)]),
        [params[i] for i in perm] + [params[0]] * 4,
        [seeds[i] for i in perm] + [7] * 4,
        [steps[i] for i in perm] + [1] * 4,
    )
    for pos, i in enumerate(perm):
        assert mixed.token_ids[pos] == alone[i].token_ids[0]
        assert mixed.logprobs[pos] == alone[i].logprobs[0]


def test_logprobs_are_raw_with_ranks_and_id_ordered_ties():
    row = torch.randn(40)
    row[[5, 17, 30]] = row.max() + 2.0  # a three-way tie for the top
    lp = token_logprobs(row, 17, 4)
    ref = torch.log_softmax(row.double(), -1)
    assert lp.token_id == 17 and lp.rank == 1 and abs(lp.logprob - float(ref[17])) < 1e-6
    assert [t for t, _, _ in lp.top] == [5, 17, 30, int(ref.argsort(descending=True)[3])]
    assert [r for _, _, r in lp.top] == [1, 1, 1, 4]
    low = int(ref.argmin())
    assert token_logprobs(row, low, 0).rank == 40 and token_logprobs(row, low, 0).top == ()
    out = sample(row[None], [SamplingParams(temperature=2.0, logprobs=3)], [0], [0])
    assert out.logprobs[0].token_id == out.token_ids[0]
    assert abs(out.logprobs[0].logprob - float(ref[out.token_ids[0]])) < 1e-6  # not temperature-scaled


def test_bad_inputs_are_reported():
    p = SamplingParams()
    with pytest.raises(TypeError, match="float32"):
        sample(torch.randn(2, 5, dtype=torch.float64), [p, p], [0, 0], [0, 0])
    with pytest.raises(ValueError, match="one entry per logits row"):
        sample(torch.randn(2, 5), [p], [0], [0])
    with pytest.raises(ValueError, match="NaN"):
        sample(torch.tensor([[0.5, float("nan"), 1.0]]), [p], [0], [0])
    with pytest.raises(ValueError, match="steps must be >= 0"):
        sample(torch.randn(1, 5), [p], [0], [-1])
