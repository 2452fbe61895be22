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
from test_mhc_triton import _CUDA, _KERNELS, DEV, TOL, _check, _head_inputs, _inputs, mhc_pre_triton
from tk_mhc_checks import check_config_sinkhorn, check_head_strided, check_pre_poisoned, check_v4_head, check_v4_pre

from deepinfer.tile_kernels.ref.mhc import mhc_pre

_KERNELS_FUSED = importlib.import_module("deepinfer.tile_kernels.backends.cuda.triton_mhc_fused")
mhc_head_triton = _KERNELS.mhc_head_triton
CONFIGS = (*_KERNELS_FUSED.FUSED_CONFIGS, *_KERNELS_FUSED.SPIN_CONFIGS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "d"), [(1, 64), (17, 64), (40, 128), (1, 1024)])
def test_fused_pre_matches_reference(t: int, d: int, dtype: torch.dtype) -> None:
    check_pre_poisoned("fused", t, d, dtype, seed=31 * t + d)


@pytest.mark.parametrize("config", CONFIGS)
def test_fused_configs_and_sinkhorn_iters(config: str) -> None:
    """Every named config (token blocks of 16-64: 70 tokens span several; d = 256: several finish programs of the
    spin configs), 3 Sinkhorn iterations, other eps."""
    check_config_sinkhorn("fused", config, 70, 256, seed=5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "d"), [(1, 64), (17, 256)])
def test_fused_head_matches_reference(t: int, d: int, dtype: torch.dtype) -> None:
    check_head_strided("fused", t, d, dtype, seed=13 * t + d)


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
    """V4-Flash (hc=4, d=4096, bf16): pre (twice, bit-identical) and head, as `tk_mhc_checks` says."""
    check_v4_pre("fused", config, t, seed=t + 100)
    check_v4_head("fused", config, t, seed=t + 200)


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
