"""mhc_pre / mhc_head with impl="split", config="finish_rev" (prepared in session 5, not yet GPU-run): the finish
launch takes the token blocks last-first (so that it re-reads first the x the mix launch read last, part of which
may still be in L2). Each finish program's work is unchanged, so the outputs must be the default's bit for bit:
checked in the interpreter over several token blocks and partial splits, and on the GPU at V4 shapes. Importing
`test_mhc_triton` first sets TRITON_INTERPRET on a CPU-only machine, before any kernel module is imported.
"""

from __future__ import annotations

import pytest
import torch
from test_mhc_triton import _CUDA, _KERNELS, _check, _head_inputs, _inputs, mhc_head_triton, mhc_pre_triton

from deepinfer.tile_kernels.ref.mhc import mhc_pre


def _same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], what: str) -> None:
    """Bitwise equality of each output (NaN never expected: the inputs are finite)."""
    for name, g, w in zip(("x_in", "post", "comb"), got, want):
        diff = g.view(torch.uint8) != w.view(torch.uint8)
        assert not diff.any(), f"{what} {name}: {int(diff.sum())} bytes differ, first at {diff.nonzero()[0].tolist()}"


def check_finish_rev(t: int, d: int, dtype: torch.dtype, seed: int) -> None:
    """finish_rev against the default (pre: x_in, post, comb; head: its output), bit for bit, and the pre
    against the reference at the module's tolerances."""
    x, fn, scale, base = _inputs(t, d, dtype, seed=seed)
    want = mhc_pre_triton(x, fn, scale, base)
    got = mhc_pre_triton(x, fn, scale, base, impl="split", config="finish_rev")
    _same(got, want, f"pre t={t} d={d}")
    _check(got, mhc_pre(x, fn, scale, base), x, tol=2e-5)
    xh, fnh, sh, bh = _head_inputs(t, d, dtype, seed=seed + 1)
    want_h = mhc_head_triton(xh, fnh, sh, bh)
    _same((mhc_head_triton(xh, fnh, sh, bh, config="finish_rev"),), (want_h,), f"head t={t} d={d}")


@pytest.mark.parametrize(("t", "d"), [(13, 128)])
def test_finish_rev_matches_default(t: int, d: int) -> None:
    """4 finish token blocks (4 tokens each, the last partial) in the interpreter."""
    check_finish_rev(t, d, torch.bfloat16, seed=t)


class _Recorder:
    """Stands in for the finish kernel: records the launch's grid and keyword arguments (no computation)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __getitem__(self, grid: tuple):  # noqa: ANN204
        return lambda *args, **kw: self.calls.append({"grid": grid, **kw})


def test_split_configs_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """impl="split" takes only its configs (a fused config name is an error there, not silently the default), and
    only finish_rev launches the finish kernel with REVERSE (the bit test above cannot tell whether it did)."""
    assert _KERNELS.SPLIT_CONFIGS == ("default", "finish_rev")
    x, fn, scale, base = _inputs(2, 64, torch.float32, seed=1)
    with pytest.raises(ValueError, match="finish_rev"):
        mhc_pre_triton(x, fn, scale, base, impl="split", config="spin_bt64")
    xh, fnh, sh, bh = _head_inputs(2, 64, torch.float32, seed=2)
    with pytest.raises(ValueError, match="finish_rev"):
        mhc_head_triton(xh, fnh, sh, bh, config="bt8")
    rec = _Recorder()
    monkeypatch.setattr(_KERNELS, "_mhc_finish_kernel", rec)
    for config in ("default", "finish_rev"):
        mhc_pre_triton(x, fn, scale, base, config=config)
        mhc_head_triton(xh, fnh, sh, bh, config=config)
    assert [c["REVERSE"] for c in rec.calls] == [False, False, True, True]


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 4096, 16384])
def test_gpu_finish_rev_bit_exact_v4(t: int) -> None:
    """V4-Flash (hc=4, d=4096, bf16): finish_rev gives the default's bits (pre and head)."""
    check_finish_rev(t, 4096, torch.bfloat16, seed=t)
