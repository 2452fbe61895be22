"""The exponential race of the sampled rows in one Triton launch (session 8): noise, filter mask and argmax fused.

`sampler.sample_tensor` picks, per sampled row, argmax over tokens of s - log E with s the filtered scores (-inf
where a filter dropped the token) and E the row's counter-based Exp(1) noise (`sample_noise`). In torch that is ~20
launches over [B, V] int64 / float64 tensors (33 MB each at B = 32, V = 129,280). Here one program per row walks
the vocabulary in blocks: it hashes the noise of each token (the same splitmix64 bits as `sample_noise`, in uint64,
which wraps like the int64 torch code), keeps a token when s >= the row's threshold (top-k and min-p folded into
one number: both drop exactly the tokens below a value), and keeps the running maximum per lane with the lowest
token id on ties, as torch.argmax does. Same float64 operations in the same order as the torch path (u, -log u,
clamp to the smallest normal, log, subtraction), so the picks equal it (tested); the threshold form equals the
torch path's successive masks because neither top-k nor min-p can drop the row's largest score.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the engine runs without Triton (CPU); the torch path then serves every call
    triton = None

BLOCK = 2048


def available(scores: torch.Tensor) -> bool:
    """The sampler uses the fused kernel: Triton importable, the scores on CUDA, and not DEEPINFER_SAMPLE_RACE=torch.
    (On the CPU the torch path runs; tests call `race_argmax` under the Triton interpreter directly.)"""
    return triton is not None and scores.is_cuda and os.environ.get("DEEPINFER_SAMPLE_RACE", "triton") != "torch"


if triton is not None:

    @triton.jit
    def _mix(x):
        x = x + 0x9E3779B97F4A7C15
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB
        return x ^ (x >> 31)

    @triton.jit
    def _race_kernel(scores_ptr, stride, thr_ptr, key_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        key = tl.load(key_ptr + row).to(tl.uint64, bitcast=True)
        thr = tl.load(thr_ptr + row)
        lanes = tl.arange(0, BLOCK)
        best = tl.full([BLOCK], float("-inf"), tl.float64)
        best_id = tl.zeros([BLOCK], tl.int32)
        tiny = 2.2250738585072014e-308  # torch.finfo(float64).tiny
        for start in range(0, vocab, BLOCK):
            ids = start + lanes
            live = ids < vocab
            s = tl.load(scores_ptr + row * stride + ids, mask=live, other=float("-inf"))
            bits = _mix(key + (ids + 1).to(tl.uint64) * 0x9E3779B97F4A7C15) >> 11
            u = (bits + 1).to(tl.float64) * 1.1102230246251565e-16  # 2^-53, exact
            e = tl.maximum(-tl.log(u), tiny)
            race = s.to(tl.float64) - tl.log(e)
            race = tl.where(live & (s >= thr), race, float("-inf"))
            take = race > best  # strict: an earlier block keeps a tie (lower id)
            best = tl.where(take, race, best)
            best_id = tl.where(take, ids, best_id)
        top = tl.max(best, axis=0)
        pick = tl.min(tl.where(best == top, best_id, vocab), axis=0)
        tl.store(out_ptr + row, pick.to(tl.int64))


def race_argmax(scores: torch.Tensor, thr: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """int64 [B]: per row argmax over tokens t with scores[t] >= thr of scores[t] - log E_t (ties: lowest id).

    scores: float32 [B, V] (last stride 1; -inf marks tokens already dropped); thr: float32 [B] (-inf: no filter);
    keys: int64 [B] = splitmix64(row seed) as int64 bits (`sample_noise.row_keys`). No host sync.
    """
    if scores.dim() != 2 or scores.dtype != torch.float32 or scores.stride(1) != 1:
        raise ValueError(f"scores: expected float32 [B, V] with unit last stride, got {scores.dtype} {scores.shape}")
    b, vocab = scores.shape
    if thr.shape != (b,) or keys.shape != (b,) or thr.dtype != torch.float32 or keys.dtype != torch.int64:
        raise ValueError(f"thr / keys: expected float32 / int64 [{b}], got {thr.dtype} {thr.shape}, {keys.dtype}")
    out = torch.empty(b, dtype=torch.int64, device=scores.device)
    if b:
        block = min(BLOCK, triton.next_power_of_2(vocab))
        _race_kernel[(b,)](scores, scores.stride(0), thr, keys, out, vocab, BLOCK=block)
    return out
