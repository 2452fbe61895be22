"""Seeded, batch-invariant token sampling and logprobs.

A request's token depends only on its own logits row, its seed and its step (the number of tokens it has
generated so far), never on the other rows: every non-greedy row's noise is a counter-based hash of
(`row_seed(seed, step)`, token id) (`sample_noise.py`; the same bits on every device and in every batch), the
sampled rows are filtered together with exact operations only (per-row temperature division, top-k threshold,
min-p max and comparison: elementwise or order-free, so a row's result does not depend on the others), and the
one filter whose arithmetic rounds in a shape-dependent way (top-p: softmax, cumsum) runs on each row alone.
Greedy rows share one argmax over the batch, which does no rounding. The whole batch takes a fixed number of
launches (plus one top-p pass per top-p row), where session 7 launched ~8 kernels and a generator per row.

Sampling is exact: with s = logits / temperature (after filtering), the token is argmax(s - log E) with
E ~ Exp(1) i.i.d. per token (the exponential race argmax(p / E), written in log space so no softmax is needed).
The noise is drawn in float64 so that an E of exactly 0 (which would win regardless of p) has probability
~1e-16 per token instead of fp32's ~6e-8. Filters apply in the order temperature, top-k, top-p, min-p.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import sample_race
from .sample_noise import exponential_noise, row_keys
from .sampling_params import SamplingParams

_SEED_MULT = 1_000_003
_U64 = 1 << 64


@dataclass(frozen=True)
class TokenLogprobs:
    """Logprobs of one position under the raw model distribution (log_softmax of unprocessed logits).

    token_id / logprob / rank describe the chosen (or actual) token; top holds (token_id, logprob, rank) of the
    n most likely tokens, most likely first, ties broken towards the lower id. rank = 1 + number of tokens with
    a strictly larger logprob.
    """

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float, int], ...]


@dataclass(frozen=True)
class SamplerOutput:
    """token_ids[i] is row i's token; logprobs[i] is None unless params[i].logprobs is set."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def row_seed(seed: int, step: int) -> int:
    """The noise seed of a request's `step`-th token (`sample_noise`): (seed * 1_000_003 + step) mod 2**64."""
    return (seed * _SEED_MULT + step) % _U64


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], seeds: Sequence[int], steps: Sequence[int]
) -> SamplerOutput:
    """Pick one token per row.

    Args:
        logits: float32 [B, V] raw next-token logits, one row per request, any device.
        params: B sampling settings, one per row.
        seeds: B ints, each request's seed (its own or drawn for it once at admission).
        steps: B ints >= 0, the number of tokens each request has generated so far.

    Returns:
        SamplerOutput with B token ids in [0, V) and, for rows whose params ask for logprobs, the chosen token's
        logprob and rank plus the top-`params.logprobs` tokens.
    """
    _check_inputs(logits, params, seeds, steps)
    tokens = sample_tensor(logits, params, seeds, steps).tolist()
    logprobs = [
        None if p.logprobs is None else token_logprobs(logits[i], tokens[i], p.logprobs) for i, p in enumerate(params)
    ]
    return SamplerOutput(tokens, logprobs)


def sample_tensor(
    logits: torch.Tensor, params: Sequence[SamplingParams], seeds: Sequence[int], steps: Sequence[int]
) -> torch.Tensor:
    """`sample`'s token ids without reading them: int64 [B] on logits' device (no host sync on CUDA).

    logits: float32 [B, V] (inputs checked by the caller). Greedy rows: the row's argmax. Sampled rows: argmax of
    s - log E, s the filtered scores (temperature, top-k, top-p, min-p in that order), E the row's noise.
    """
    if logits.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=logits.device)
    best = torch.argmax(logits, dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return best
    dev, vocab = logits.device, logits.shape[1]
    sub = [params[i] for i in rows]
    index = torch.tensor(rows, dtype=torch.int64, device=dev)
    scores = logits.index_select(0, index) / _column([p.temperature for p in sub], dev)
    kth = _kth(scores, [p.top_k if 0 < p.top_k < vocab else 0 for p in sub])
    for j, p in enumerate(sub):
        if p.top_p < 1.0:  # rounds (softmax, cumsum): on this row alone, so its shapes never depend on the batch;
            row = scores[j].masked_fill(scores[j] < kth[j], -math.inf)  # top-p renormalises over the top-k set
            scores[j] = _apply_top_p(row, p.top_p)
    # One threshold per row: top-k drops scores below the k-th largest, min-p those below s_max + log(min_p)
    # (p_i >= min_p * p_max, no normalisation needed); neither drops the row's largest score, so applying both as
    # one `scores >= thr` equals masking one after the other (and s_max is the same before and after top-k / top-p).
    thr = kth
    if any(p.min_p > 0.0 for p in sub):
        logs = _column([math.log(p.min_p) if p.min_p > 0.0 else -math.inf for p in sub], dev)
        thr = torch.maximum(thr, scores.amax(dim=-1, keepdim=True) + logs)
    row_seeds = [row_seed(seeds[i], steps[i]) for i in rows]
    if sample_race.available(scores):  # the race in one launch (same picks: tests/test_sample_noise.py)
        picked = sample_race.race_argmax(scores, thr.view(-1).contiguous(), row_keys(row_seeds, dev))
    else:
        scores = scores.masked_fill(scores < thr, -math.inf)
        noise = exponential_noise(row_seeds, vocab, dev)
        # Clamp so a masked token stays at -inf (-inf - log(0) would be NaN, which argmax would pick).
        race = scores.double() - noise.clamp_min(torch.finfo(torch.float64).tiny).log()
        picked = torch.argmax(race, dim=-1)
    return best.index_copy(0, index, picked)


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    """float32 [len(values), 1] on device: one per-row operand of the batched filters."""
    return torch.tensor(values, dtype=torch.float32, device=device)[:, None]


def _kth(scores: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """float32 [B, 1]: each row's ks[j]-th largest score, -inf where ks[j] = 0 (no top-k). Exact: topk selects."""
    k_max = max(ks)
    if k_max == 0:
        return torch.full((scores.shape[0], 1), -math.inf, dtype=scores.dtype, device=scores.device)
    top = torch.topk(scores, k_max, dim=-1).values  # [B, k_max], each row descending
    k = torch.tensor(ks, dtype=torch.int64, device=scores.device)[:, None]
    kth = top.gather(1, (k - 1).clamp_min(0))
    return torch.where(k > 0, kth, torch.full_like(kth, -math.inf))


def _check_inputs(
    logits: torch.Tensor, params: Sequence[SamplingParams], seeds: Sequence[int], steps: Sequence[int]
) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32:
        got = f"{logits.dtype} {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a float32 tensor [B, V], got {got}")
    rows = logits.shape[0]
    if not (len(params) == len(seeds) == len(steps) == rows):
        raise ValueError(
            f"params, seeds and steps must each have one entry per logits row ({rows}), "
            f"got {len(params)}, {len(seeds)}, {len(steps)}"
        )
    if any(s < 0 for s in steps):
        raise ValueError(f"steps must be >= 0, got {list(steps)}")
    if bool(torch.isnan(logits).any()):
        raise ValueError("logits contain NaN; the model produced invalid scores")


def _apply_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask (to -inf) all tokens outside the smallest most-likely set whose probability reaches top_p.

    A token is kept when the probability of the tokens sorted before it is < top_p, so the most likely token is
    always kept; equal probabilities are ordered by token id (stable sort).
    """
    probs = torch.softmax(scores, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop = torch.empty_like(mass_before, dtype=torch.bool).scatter_(0, order, mass_before >= top_p)
    return scores.masked_fill(drop, -math.inf)


def token_logprobs(row: torch.Tensor, token_id: int, num_top: int) -> TokenLogprobs:
    """Logprob and rank of `token_id` plus the top-`num_top` tokens of one raw logits row.

    Args:
        row: float32 [V] raw logits (not temperature-scaled or filtered).
        token_id: the chosen or actual token, in [0, V).
        num_top: n >= 0 most likely tokens to report (capped at V).
    """
    logp = torch.log_softmax(row.float(), dim=-1)
    chosen = logp[token_id]
    rank = int((logp > chosen).sum()) + 1
    return TokenLogprobs(token_id, float(chosen), rank, _top_logprobs(logp, num_top))


def _top_logprobs(logp: torch.Tensor, num_top: int) -> tuple[tuple[int, float, int], ...]:
    """(token_id, logprob, rank) of the num_top largest entries of `logp` [V], ties towards the lower id."""
    num_top = min(num_top, logp.shape[0])
    if num_top == 0:
        return ()
    threshold = torch.topk(logp, num_top).values[-1]
    # Every token tied with the n-th value is a candidate; a stable sort of the id-ordered candidates
    # makes the tie-break by id deterministic, which torch.topk alone does not promise.
    candidates = torch.nonzero(logp >= threshold).flatten()
    values, order = torch.sort(logp[candidates], descending=True, stable=True)
    ids = candidates[order][:num_top].tolist()
    vals = values[:num_top].tolist()
    top: list[tuple[int, float, int]] = []
    for pos, (tid, val) in enumerate(zip(ids, vals)):
        # Equal values are adjacent in the sorted list, so a tie shares the rank of its first member.
        rank = top[-1][2] if pos > 0 and val == vals[pos - 1] else pos + 1
        top.append((tid, val, rank))
    return tuple(top)
