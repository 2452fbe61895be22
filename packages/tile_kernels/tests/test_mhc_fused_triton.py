"""The one-launch mHC pre / head (`impl="fused"`, `backends/cuda/triton_mhc_fused.py`) against the reference.

Same math as the two-launch kernels (same dots, partials summed in split order), so the tolerances derived in
`test_mhc_triton.py` apply unchanged; its helpers are reused. On CPU the kernel runs in the Triton interpreter,
which runs programs one by one: the last split of each token block (arrival counter S - 1) does the finish, as on
the GPU. Sizes cover one and several token blocks, every named config and a poisoned out= buffer (an entry the
finisher never wrote would show as NaN).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from test_mhc_triton import (
    _CUDA,
    _KERNELS,
    DEV,
    TOL,
    _check,
    _check_mix,
    _head_inputs,
    _inputs,
    _oracle64,
    _poisoned,
)

from deepinfer.tile_kernels.ref.mhc import mhc_head, mhc_pre

_KERNELS_FUSED = importlib.import_module("deepinfer.tile_kernels.backends.cuda.triton_mhc_fused")
mhc_pre_triton = _KERNELS.mhc_pre_triton
mhc_head_triton = _KERNELS.mhc_head_triton
CONFIGS = (*_KERNELS_FUSED.FUSED_CONFIGS, *_KERNELS_FUSED.SPIN_CONFIGS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "d"), [(1, 64), (17, 64), (40, 128), (1, 1024)])
def test_fused_pre_matches_reference(t: int, d: int, dtype: torch.dtype) -> None:
    x, fn, scale, base = _inputs(t, d, dtype, seed=31 * t + d)
    out = _poisoned(t, d, dtype)
    got = mhc_pre_triton(x, fn, scale, base, 1e-6, 1e-6, 20, out=out, impl="fused")
    assert all(g is o for g, o in zip(got, out))
    _check(got, mhc_pre(x, fn, scale, base), x)
    post64, comb64 = _oracle64(x, fn, scale, base)
    assert (got[1].double() - post64).abs().max().item() <= TOL
    assert (got[2].double() - comb64).abs().max().item() <= TOL


@pytest.mark.parametrize("config", CONFIGS)
def test_fused_configs_and_sinkhorn_iters(config: str) -> None:
    """Every named config (token blocks of 16-64: 70 tokens span several; d = 256: several finish programs of the
    spin configs), 3 Sinkhorn iterations, other eps."""
    x, fn, scale, base = _inputs(70, 256, torch.bfloat16, seed=5)
    got = mhc_pre_triton(x, fn, scale, base, 1e-5, 1e-3, 3, impl="fused", config=config)
    want = mhc_pre(x, fn, scale, base, 1e-5, 1e-3, 3)
    assert (got[1] - want[1]).abs().max().item() <= TOL
    assert (got[2] - want[2]).abs().max().item() <= TOL
    _check_mix(got[0], want[0], x)
    xh, fnh, sh, bh = _head_inputs(70, 256, torch.bfloat16, seed=6)
    _check_mix(mhc_head_triton(xh, fnh, sh, bh, impl="fused", config=config), mhc_head(xh, fnh, sh, bh), xh)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "d"), [(1, 64), (17, 256)])
def test_fused_head_matches_reference(t: int, d: int, dtype: torch.dtype) -> None:
    x, fn, scale, base = _head_inputs(t, d, dtype, seed=13 * t + d)
    xs = x.transpose(1, 2).contiguous().transpose(1, 2)  # strided x
    _check_mix(mhc_head_triton(xs, fn, scale, base, impl="fused"), mhc_head(x, fn, scale, base), x)


def test_fused_bad_arguments_and_empty() -> None:
    x, fn, scale, base = _inputs(3, 64, torch.float32, seed=1)
    with pytest.raises(ValueError, match="impl must be one of"):
        mhc_pre_triton(x, fn, scale, base, impl="onepass")
    with pytest.raises(ValueError, match="config must be one of"):
        mhc_pre_triton(x, fn, scale, base, impl="fused", config="bt8")
    assert mhc_pre_triton(x[:0], fn, scale, base, impl="fused")[0].shape == (0, 64)
    xh, fnh, sh, bh = _head_inputs(3, 64, torch.float32, seed=2)
    with pytest.raises(ValueError, match="impl must be one of"):
        mhc_head_triton(xh, fnh, sh, bh, impl="x")
    assert _KERNELS.DEFAULT_IMPL in _KERNELS.IMPLS


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_gpu_fused_v4_flash_shapes(t: int, config: str) -> None:
    """V4-Flash (hc=4, d=4096, bf16): pre and head against the reference (2 * TOL: its own logit rounding) and
    the float64 oracle; twice, bit-identical (the finisher sums the partials in split order)."""
    x, fn, scale, base = _inputs(t, 4096, torch.bfloat16, seed=t + 100)
    got = mhc_pre_triton(x, fn, scale, base, impl="fused", config=config)
    again = mhc_pre_triton(x, fn, scale, base, impl="fused", config=config)
    _check(got, mhc_pre(x, fn, scale, base), x, tol=2 * TOL)
    post64, comb64 = _oracle64(x, fn, scale, base)
    err_post = (got[1].double() - post64).abs().max().item()
    err_comb = (got[2].double() - comb64).abs().max().item()
    assert err_post <= TOL and err_comb <= TOL, f"vs float64: post {err_post}, comb {err_comb}"
    assert all(torch.equal(a, b) for a, b in zip(got, again)), "two runs differ"
    xh, fnh, sh, bh = _head_inputs(t, 4096, torch.bfloat16, seed=t + 200)
    _check_mix(mhc_head_triton(xh, fnh, sh, bh, impl="fused", config=config), mhc_head(xh, fnh, sh, bh), xh, 2 * TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_fused_large_t_and_graph_replay() -> None:
    """16,384 tokens (512 token blocks: the arrival counters under load), then a CUDA-graph capture and replay."""
    x, fn, scale, base = _inputs(16384, 4096, torch.bfloat16, seed=9)
    got = mhc_pre_triton(x, fn, scale, base, impl="fused")
    want = mhc_pre(x, fn, scale, base)
    _check(got, want, x, tol=2 * TOL)
    del got, want
    x, fn, scale, base = _inputs(64, 4096, torch.bfloat16, seed=10)
    mhc_pre_triton(x, fn, scale, base, impl="fused")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = mhc_pre_triton(x, fn, scale, base, impl="fused")
    x.copy_(_inputs(64, 4096, torch.bfloat16, seed=11)[0])
    graph.replay()
    torch.cuda.synchronize()
    _check(got, mhc_pre(x, fn, scale, base), x, tol=2 * TOL)
    assert DEV == "cuda"
