"""Checks of the one-launch mHC impl (`impl="fused"`, `test_mhc_fused_triton.py`).

Each runs `mhc_pre_triton` / `mhc_head_triton` with an `impl` (and its named `config`) on fresh random inputs
(`test_mhc_triton._inputs`, seeded) and compares with the reference at the tolerances derived in
`test_mhc_triton.py` (same math as the two-launch kernels). Importing `test_mhc_triton` first sets
TRITON_INTERPRET on a CPU-only machine, before any kernel module is imported.
"""

from __future__ import annotations

import torch
from test_mhc_triton import (
    TOL,
    _check,
    _check_mix,
    _head_inputs,
    _inputs,
    _oracle64,
    _poisoned,
    mhc_head_triton,
    mhc_pre_triton,
)

from deepinfer.tile_kernels.ref.mhc import mhc_head, mhc_pre


def check_pre_poisoned(impl: str, t: int, d: int, dtype: torch.dtype, seed: int) -> None:
    """Pre of x [t, 4, d] into NaN-filled out= buffers (an entry never written shows as NaN): the buffers come
    back, results within TOL of the reference and of the float64 oracle (post, comb)."""
    x, fn, scale, base = _inputs(t, d, dtype, seed=seed)
    out = _poisoned(t, d, dtype)
    got = mhc_pre_triton(x, fn, scale, base, 1e-6, 1e-6, 20, out=out, impl=impl)
    assert all(g is o for g, o in zip(got, out))
    _check(got, mhc_pre(x, fn, scale, base), x)
    post64, comb64 = _oracle64(x, fn, scale, base)
    assert (got[1].double() - post64).abs().max().item() <= TOL
    assert (got[2].double() - comb64).abs().max().item() <= TOL


def check_config_sinkhorn(impl: str, config: str, t: int, d: int, seed: int) -> None:
    """Pre with a named config, 3 Sinkhorn iterations and other eps (bf16 x [t, 4, d], seed), then the head with
    the same config (seed + 1)."""
    x, fn, scale, base = _inputs(t, d, torch.bfloat16, seed=seed)
    got = mhc_pre_triton(x, fn, scale, base, 1e-5, 1e-3, 3, impl=impl, config=config)
    want = mhc_pre(x, fn, scale, base, 1e-5, 1e-3, 3)
    assert (got[1] - want[1]).abs().max().item() <= TOL
    assert (got[2] - want[2]).abs().max().item() <= TOL
    _check_mix(got[0], want[0], x)
    xh, fnh, sh, bh = _head_inputs(t, d, torch.bfloat16, seed=seed + 1)
    _check_mix(mhc_head_triton(xh, fnh, sh, bh, impl=impl, config=config), mhc_head(xh, fnh, sh, bh), xh)


def check_head_strided(impl: str, t: int, d: int, dtype: torch.dtype, seed: int) -> None:
    """The head of a strided x [t, 4, d] (d the slowest axis in memory) against the reference."""
    x, fn, scale, base = _head_inputs(t, d, dtype, seed=seed)
    xs = x.transpose(1, 2).contiguous().transpose(1, 2)
    _check_mix(mhc_head_triton(xs, fn, scale, base, impl=impl), mhc_head(x, fn, scale, base), x)


def check_v4_pre(
    impl: str, config: str, t: int, seed: int, d: int = 4096
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """V4-Flash pre (hc=4, d=4096, bf16 x [t, 4, d]) with a named config: against the reference (2 * TOL: its own
    logit rounding) and the float64 oracle (post / comb of the first 4,096 tokens); twice, bit-identical (the
    partials are summed in split order). Returns ((x, fn, scale, base), (x_in, post, comb))."""
    x, fn, scale, base = _inputs(t, d, torch.bfloat16, seed=seed)
    got = mhc_pre_triton(x, fn, scale, base, impl=impl, config=config)
    again = mhc_pre_triton(x, fn, scale, base, impl=impl, config=config)
    _check(got, mhc_pre(x, fn, scale, base), x, tol=2 * TOL)
    n = min(t, 4096)
    post64, comb64 = _oracle64(x[:n], fn, scale, base)
    err_post = (got[1][:n].double() - post64).abs().max().item()
    err_comb = (got[2][:n].double() - comb64).abs().max().item()
    assert err_post <= TOL and err_comb <= TOL, f"{impl} {config} t={t} vs float64: post {err_post}, comb {err_comb}"
    assert all(torch.equal(a, b) for a, b in zip(got, again)), f"{impl} {config} t={t}: two runs differ"
    return (x, fn, scale, base), got


def check_v4_head(impl: str, config: str, t: int, seed: int, d: int = 4096) -> None:
    """V4-Flash head (bf16 x [t, 4, d]) with a named config against the reference (2 * TOL)."""
    xh, fnh, sh, bh = _head_inputs(t, d, torch.bfloat16, seed=seed)
    _check_mix(mhc_head_triton(xh, fnh, sh, bh, impl=impl, config=config), mhc_head(xh, fnh, sh, bh), xh, 2 * TOL)
