"""Triton stable argsort of a short 1-D integer tensor by ranks (`api.stable_argsort`), one launch, no host sync.

Element i goes to position rank(i) = #{j : key[j] < key[i]} + #{j < i : key[j] == key[i]}, which is exactly where a
stable ascending sort puts it; ranks are a permutation of 0 .. P - 1, so every output slot is written once. Each
program ranks BLOCK_I elements against all P keys in BLOCK_J chunks: O(P^2) comparisons, cheaper than torch's radix
sort for the engine's decode-sized inputs (P = tokens x top-k, a few hundred: one ~1-wave launch instead of a
multi-pass sort); `MAX_P` bounds the quadratic cost, longer inputs take torch.argsort.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["MAX_P", "stable_argsort_triton"]

MAX_P = 4096  # above this the P^2 comparisons cost more than torch's sort
_BLOCK_I, _BLOCK_J = 32, 256


@triton.jit
def _rank_kernel(keys_ptr, order_ptr, P, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr):
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    mi = i < P
    ki = tl.load(keys_ptr + i, mask=mi, other=0)
    rank = tl.zeros([BLOCK_I], dtype=tl.int32)
    for j0 in range(0, P, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        kj = tl.load(keys_ptr + j, mask=j < P, other=0)
        less = kj[None, :] < ki[:, None]
        tie = (kj[None, :] == ki[:, None]) & (j[None, :] < i[:, None])
        before = (less | tie) & (j < P)[None, :]
        rank += tl.sum(before.to(tl.int32), axis=1)
    tl.store(order_ptr + rank, i.to(tl.int64), mask=mi)


def stable_argsort_triton(keys: torch.Tensor) -> torch.Tensor:
    """int64 [P]: torch.argsort(keys, stable=True) for int32 / int64 keys [P], P <= MAX_P (contiguous or not)."""
    check_runnable(keys)
    p = keys.numel()
    if keys.dim() != 1 or keys.dtype not in (torch.int32, torch.int64) or p > MAX_P:
        raise ValueError(f"keys: expected int32/int64 [P] with P <= {MAX_P}, got {keys.dtype} {tuple(keys.shape)}")
    order = torch.empty(p, dtype=torch.int64, device=keys.device)
    if p:
        _rank_kernel[(triton.cdiv(p, _BLOCK_I),)](keys.contiguous(), order, p, BLOCK_I=_BLOCK_I, BLOCK_J=_BLOCK_J)
    return order
