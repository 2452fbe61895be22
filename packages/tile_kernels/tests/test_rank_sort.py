"""`stable_argsort` (the Triton rank sort, `backends/cuda/triton_rank_sort.py`) against torch.argsort(stable=True).

The result is a permutation with one right answer, so it must be equal exactly: property tests over random keys with
many ties (few distinct values: MoE expert ids, token rows), all-equal keys, already sorted / reversed input, negative
keys, int32 and int64, P from 0 to the kernel's limit. On a CPU-only machine the kernel runs under the Triton
interpreter (small P only: the interpreter is slow); on a GPU compiled, and the public call also takes it.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the @triton.jit in the kernel module
pytest.importorskip("triton")

from deepinfer import tile_kernels as tk  # noqa: E402

_MOD = "deepinfer.tile_kernels.backends.cuda.triton_rank_sort"
if not _CUDA and _MOD in sys.modules:  # imported earlier without the interpreter: re-decorate the kernel
    importlib.reload(sys.modules[_MOD])
_K = importlib.import_module(_MOD)
DEV = "cuda" if _CUDA else "cpu"


def _keys(p: int, distinct: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, distinct, (p,), generator=g) - distinct // 3).to(dtype)


def _check(keys: torch.Tensor) -> None:
    got = _K.stable_argsort_triton(keys.to(DEV)).cpu()
    want = torch.argsort(keys, stable=True)
    assert got.dtype == torch.int64
    assert torch.equal(got, want), f"first mismatch at {(got != want).nonzero()[:1].tolist()} of P={keys.numel()}"


@pytest.mark.parametrize("p", [0, 1, 7, 33, 192, 300])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_rank_sort_matches_stable_argsort(p: int, dtype: torch.dtype) -> None:
    for seed, distinct in enumerate((3, 256, 10**6)):
        _check(_keys(p, distinct, dtype, seed))


def test_rank_sort_edge_orders() -> None:
    base = _keys(97, 20, torch.int64, 5)
    for keys in (torch.zeros_like(base) + 4, base.sort().values, base.sort(descending=True).values, -base):
        _check(keys)


def test_rank_sort_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="keys"):
        _K.stable_argsort_triton(torch.zeros(2, 3, dtype=torch.int64, device=DEV))
    with pytest.raises(ValueError, match="keys"):
        _K.stable_argsort_triton(torch.zeros(3, dtype=torch.float32, device=DEV))
    with pytest.raises(TypeError, match="keys must be int32 or int64"):
        tk.stable_argsort(torch.zeros(3))
    with pytest.raises(ValueError, match="keys must have 1 dims"):
        tk.stable_argsort(torch.zeros(2, 2, dtype=torch.int64))


def test_public_call_on_cpu_is_torch_argsort() -> None:
    keys = _keys(50, 6, torch.int64, 9)
    assert torch.equal(tk.stable_argsort(keys), torch.argsort(keys, stable=True))


@pytest.mark.gpu
@pytest.mark.parametrize("p", [192, 1536, 4096, 5000])
def test_rank_sort_gpu_public_call(p: int) -> None:
    """The public call on the GPU (the Triton kernel up to 4,096, torch above), engine-like keys (256 experts)."""
    keys = _keys(p, 256, torch.int64, p).cuda()
    assert torch.equal(tk.stable_argsort(keys), torch.argsort(keys, stable=True))
