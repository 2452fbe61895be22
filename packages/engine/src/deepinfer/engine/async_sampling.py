"""Sampling on the device, read back one step behind (on by default since session 6; DEEPINFER_ASYNC_SAMPLING=0 off).

Session 6 (2 H200s, benchmarks/results/2026-11-30-s6-profile_decode_b32_h200.json, 4-layer V4-Flash shape, batch 32,
LLM.generate): 7,759 vs 5,942 decode tok/s greedy (1.31x), 1,439 vs 1,205 seeded (1.19x); the GPU test
`test_tiny_model_same_tokens_on_cuda_graphs` passed.

The synchronous decode loop waits for every step: `sample` reads the NaN check, the greedy argmax and each
seeded row's token on the host, and only then can the host schedule and launch the next step, so host work
(stop rules, detokenising, scheduling, the next launch) runs while the GPU idles. With the flag on, `LLM`
instead
1. samples the step on the device (`sample_on_device`: the same ops as `sampler.sample`, so the same tokens bit
   for bit, but nothing is read), and queues the copy of the token ids to pinned host memory (`TokenReadback`);
2. when the next step is predictable (every running sequence decodes one token, no admission can happen, no
   length limit is reached), reserves its cache rows and launches it at once with the sampled ids as its input
   (`ModelRunner.forward_decode`: a device-to-device copy into the CUDA graph's token input);
3. only then waits for the token ids and applies the stop rules; if the next `schedule()` equals the launched
   step it is used as is, otherwise (an EOS or stop string ended a sequence) it is dropped and the scheduled
   step runs as usual. A dropped step only wrote cache rows at positions that the step which replaces it writes
   again before reading them (every cache write is indexed by position), and slots freed meanwhile are
   prefilled from position 0 after it in stream order, so results equal the flag-off loop's.
Rows asking for logprobs take the synchronous path (their logprobs are computed on the host anyway).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from .sampler import _check_inputs, sample_tensor
from .sampling_params import SamplingParams

ENV = "DEEPINFER_ASYNC_SAMPLING"


def async_sampling_enabled() -> bool:
    """True unless DEEPINFER_ASYNC_SAMPLING=0 (read when an LLM or a CachePool is built)."""
    value = os.environ.get(ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{ENV} must be '0' or '1', got {value!r}")
    return value == "1"


def device_sampling_ok(params: Sequence[SamplingParams]) -> bool:
    """Rows can be sampled on the device when none asks for logprobs (those are built on the host)."""
    return all(p.logprobs is None for p in params)


def sample_on_device(
    logits: torch.Tensor, params: Sequence[SamplingParams], seeds: Sequence[int], steps: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sampler.sample` without host reads: (token ids int64 [B], NaN flag bool []) on logits' device.

    logits: float32 [B, V]. The sync path's own `sampler.sample_tensor` (the same tokens bit for bit), without
    reading them; the NaN check is returned as a flag instead of raised. No row may ask for logprobs.
    """
    if not device_sampling_ok(params):
        raise ValueError("sample_on_device: rows asking for logprobs must use sampler.sample")
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32:
        _check_inputs(logits, params, seeds, steps)  # raises the usual TypeError
    if not (len(params) == len(seeds) == len(steps) == logits.shape[0]) or any(s < 0 for s in steps):
        _check_inputs(logits, params, seeds, steps)  # raises the usual ValueError
    return sample_tensor(logits, params, seeds, steps), torch.isnan(logits).any()


class PendingTokens:
    """Token ids on their way to the host: `wait()` returns them (raising if the logits held a NaN)."""

    def __init__(self, host: torch.Tensor, count: int, event: torch.cuda.Event | None) -> None:
        self._host, self._count, self._event = host, count, event

    def wait(self) -> list[int]:
        if self._event is not None:
            self._event.synchronize()
        values = self._host[: self._count + 1].tolist()
        if values[-1]:
            raise ValueError("logits contain NaN; the model produced invalid scores")
        return values[:-1]


class TokenReadback:
    """Copies sampled ids (and the NaN flag) into pinned host buffers, two per size used alternately.

    A buffer is written again two steps later, after its `wait()` has read it (the loop waits for every step)."""

    def __init__(self) -> None:
        self._buffers: dict[int, list[torch.Tensor]] = {}
        self._turn = 0

    def start(self, tokens: torch.Tensor, nan: torch.Tensor) -> PendingTokens:
        """tokens: int64 [B]; nan: bool []. Queues the copy on the current stream; returns without waiting."""
        packed = torch.cat((tokens, nan.to(torch.int64).reshape(1)))
        if not packed.is_cuda:
            return PendingTokens(packed, tokens.shape[0], None)
        size = packed.shape[0]
        if size not in self._buffers:
            self._buffers[size] = [torch.empty(size, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self._turn ^= 1
        host = self._buffers[size][self._turn]
        host.copy_(packed, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return PendingTokens(host, tokens.shape[0], event)
