"""The one-launch mHC pre / head with every program busy (`impl="twopass_l2"`, `triton_mhc_twopass.py`) against
the reference.

Same math as the two-launch kernels (same dots, partials summed in split order), so the tolerances derived in
`test_mhc_triton.py` apply unchanged; its helpers are reused. On CPU the kernel runs in the Triton interpreter,
which runs programs one by one in grid order, so a finish unit always finds its block's splits done (as the
GPU does in the steady state, where they finished LAG blocks ago). The CPU sizes use the named configs (where the
lag is capped at the block count: every finish after every mix) and a small-lag config (4 token blocks, lag 1:
mix and finish units interleave as at V4 sizes), plus a poisoned out= buffer (an entry no finish unit wrote would
show as NaN).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from test_mhc_triton import _CUDA, _KERNELS, DEV, TOL, _check, _head_inputs, _inputs, _poisoned, mhc_pre_triton
from tk_mhc_checks import check_config_sinkhorn, check_head_strided, check_pre_poisoned, check_v4_head, check_v4_pre

from deepinfer.tile_kernels.ref.mhc import mhc_pre

_TP = importlib.import_module("deepinfer.tile_kernels.backends.cuda.triton_mhc_twopass")
mhc_head_triton = _KERNELS.mhc_head_triton
CONFIGS = tuple(_TP.TWOPASS_CONFIGS)
IMPL = "twopass_l2"


@pytest.mark.parametrize(
    ("t", "d", "dtype"), [(1, 64, torch.float32), (1, 64, torch.bfloat16), (33, 64, torch.float32)], ids=str
)
def test_twopass_pre_matches_reference(t: int, d: int, dtype: torch.dtype) -> None:
    check_pre_poisoned(IMPL, t, d, dtype, seed=37 * t + d)


def _cpu_configs() -> list[str]:
    """One config per distinct CPU-visible shape (tokens per block, splits, BLOCK_K, BLOCK_D, partials per step):
    the others differ only in lag (capped at the few CPU blocks), warps, eviction hints or register cap; the
    finish's prefetch is a code path of its own."""
    seen: dict[tuple, str] = {}
    for name, c in _TP.TWOPASS_CONFIGS.items():
        seen.setdefault((c.block_t, c.splits, c.block_k, c.block_d, c.block_s, c.prefetch), name)
    return list(seen.values())


@pytest.mark.parametrize("config", _cpu_configs())
def test_twopass_configs_and_sinkhorn_iters(config: str) -> None:
    """The configs' shapes (token blocks of 16-64: 40 tokens span one to three; d = 128), 3 Sinkhorn iterations,
    other eps; the head with the same config."""
    check_config_sinkhorn(IMPL, config, 40, 128, seed=7)


def test_twopass_steady_state_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 16 tokens, 4 splits, lag 1 over 5 blocks (d = 128: 2 finish units carry x_in, 2 only gates;
    prefetching): program (b, s) mixes block b and finishes block b - 1, as at V4 sizes."""
    monkeypatch.setitem(_TP.TWOPASS_CONFIGS, "test_lag1", _TP.TwopassConfig(16, 4, 1, 4, 1, 64, 64, 2, False, 0, True))
    x, fn, scale, base = _inputs(65, 128, torch.float32, seed=9)
    assert _TP._twopass_shape(65, 4, 128, x.device, "test_lag1")[1:3] == (5, 4)  # 5 blocks, 4 splits (lag < 5)
    got = mhc_pre_triton(x, fn, scale, base, out=_poisoned(65, 128, torch.float32), impl=IMPL, config="test_lag1")
    _check(got, mhc_pre(x, fn, scale, base), x)


@pytest.mark.parametrize("head", [False, True], ids=["pre", "head"])
def test_twopass_bit_identical_to_fused(head: bool) -> None:
    """The default config has impl="fused"'s default splits (32-token blocks, 16 slices of 64-column steps, partials
    summed 4 at a time in split order) and the same gate / stream-sum code: the results are bit-identical."""
    t, d = 70, 256
    x, fn, scale, base = (_head_inputs if head else _inputs)(t, d, torch.bfloat16, seed=21)
    run = mhc_head_triton if head else mhc_pre_triton
    got, fused = run(x, fn, scale, base, impl=IMPL), run(x, fn, scale, base, impl="fused")
    for a, b in zip(*(((got,), (fused,)) if head else (got, fused))):
        assert torch.equal(a, b), f"max diff {(a.float() - b.float()).abs().max().item()}"


def test_twopass_shapes() -> None:
    """Splits, finish widths and lag as the docstring of `_twopass_shape` says (V4: 16,384 tokens, d = 4096)."""
    dev = torch.device("cpu")
    bt, n_tb, ks, k_per_split, d_per_fin, lag, _bk, _bd = _TP._twopass_shape(16384, 4, 4096, dev, "default")
    assert (bt, n_tb, ks, k_per_split, d_per_fin, lag) == (32, 512, 16, 1024, 256, 16)
    assert ks * k_per_split == 4 * 4096 and ks * d_per_fin == 4096
    assert _TP._twopass_shape(16384, 4, 4096, dev, "self_bt16")[1:6] == (1024, 1, 4 * 4096, 4096, 0)
    for config in CONFIGS:  # lag >= 1 whenever S > 1, never more than the blocks; d covered by the finish units
        for t in (1, 17, 64, 65, 4096):
            _bt, n_tb, ks, _k, d_per_fin, lag, _bk, _bd = _TP._twopass_shape(t, 4, 4096, dev, config)
            assert (lag >= 1 or ks == 1) and lag <= n_tb and ks * d_per_fin >= 4096, (config, t)


def test_twopass_head_strided_and_bad_arguments() -> None:
    check_head_strided(IMPL, 17, 256, torch.bfloat16, seed=10)
    xp, fnp, sp, bp = _inputs(3, 64, torch.float32, seed=11)
    with pytest.raises(ValueError, match="config must be one of"):
        mhc_pre_triton(xp, fnp, sp, bp, impl=IMPL, config="spin")
    assert mhc_pre_triton(xp[:0], fnp, sp, bp, impl=IMPL)[0].shape == (0, 64)
    assert IMPL in _KERNELS.IMPLS and _KERNELS.DEFAULT_IMPL == "split"


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_gpu_twopass_v4_flash_shapes(t: int, config: str) -> None:
    """V4-Flash (hc=4, d=4096, bf16): pre and head against the reference (2 * TOL: its own logit rounding) and
    the float64 oracle (post / comb, first 4,096 tokens); twice, bit-identical (partials summed in split order).
    4,096 tokens are 64-256 blocks, more than any LAG: mix and finish units interleave as at 16,384."""
    (x, fn, scale, base), got = check_v4_pre(IMPL, config, t, seed=t + 300)
    if config == "default" and t > 64:  # impl="fused"'s default splits and summation order (see the CPU test)
        fused = mhc_pre_triton(x, fn, scale, base, impl="fused")
        diffs = [(a.float() - b.float()).abs().max().item() for a, b in zip(got, fused)]
        assert all(torch.equal(a, b) for a, b in zip(got, fused)), f"t={t}: not bit-identical to fused: {diffs}"
    del got
    check_v4_head(IMPL, config, t, seed=t + 400)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("config", ["default", "self_bt16"])
def test_gpu_twopass_large_t(config: str) -> None:
    """16,384 tokens (512 blocks of 32 / 1,024 of 16: the counters under load), the benchmark's largest size."""
    test_gpu_twopass_v4_flash_shapes(16384, config)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_twopass_graph_replay() -> None:
    """CUDA-graph capture and replay (the counters are zeroed inside the graph) at 64 and 4,096 tokens."""
    for t in (64, 4096):
        x, fn, scale, base = _inputs(t, 4096, torch.bfloat16, seed=t + 12)
        mhc_pre_triton(x, fn, scale, base, impl=IMPL)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = mhc_pre_triton(x, fn, scale, base, impl=IMPL)
        for seed in (13, 14):  # two replays: counters from the first must not leak into the second
            x.copy_(_inputs(t, 4096, torch.bfloat16, seed=t + seed)[0])
            graph.replay()
            torch.cuda.synchronize()
            _check(got, mhc_pre(x, fn, scale, base), x, tol=2 * TOL)
    assert DEV == "cuda"
