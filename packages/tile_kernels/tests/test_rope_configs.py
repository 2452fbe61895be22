"""RoPE's session-6 benchmark configs give the default's bits: `cs_rt` (the default kernel compiled with the cos / sin
strides unspecialised: only the load layout changes) and `row*` (`_rope_row_kernel`: whole rows as one tile, the
pairs rotated in registers by the same fp32 operations, fp fusion off, the pass-through columns selected from the
loaded bits). Rotation is elementwise, so any tiling gives the same bits; checked bit for bit (NaN payloads and
-0.0 included) on bf16 / fp32 rows with a NaN, an inf and signed zeros, forward and inverse, contiguous and strided
x and cos / sin, in the interpreter and at the benchmark's V4-Flash shapes on the GPU.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import sys

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the @triton.jit in the kernel module
pytest.importorskip("triton")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from _cases import ROPE_KV_CONFIGS  # noqa: E402  (the benchmark's own configs)

from deepinfer.tile_kernels.ref.rope import apply_rope_interleaved as ref_rope  # noqa: E402

_MOD = "deepinfer.tile_kernels.backends.cuda.triton_rope"
if not _CUDA and _MOD in sys.modules:
    importlib.reload(sys.modules[_MOD])
_R = importlib.import_module(_MOD)
rope = _R.apply_rope_interleaved_triton
DEV = "cuda" if _CUDA else "cpu"
CONFIGS = {**ROPE_KV_CONFIGS, "row_bm2_w1": {"row_tile": True, "block_m": 2, "num_warps": 1}}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    diff = _bits(got) != _bits(want)
    if diff.any():
        at = diff.nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: {int(diff.sum())} of {diff.numel()} differ, first at {at}: "
            f"got {got[tuple(at)].item()!r} want {want[tuple(at)].item()!r}"
        )


def _inputs(shape: tuple[int, ...], rope_dim: int, dtype: torch.dtype, seed: int, dev: str = DEV):
    """x of `shape` (3 * N(0, 1), some specials), cos / sin [t, rope_dim / 2] fp32 of random angles."""
    g = torch.Generator(device=dev).manual_seed(seed)
    x = (torch.randn(shape, generator=g, device=dev) * 3.0).to(dtype)
    flat = x.view(-1, shape[-1])
    if flat.shape[0] >= 2:
        flat[0, 1] = float("nan")  # a pass-through column (raw bits kept)
        flat[0, -1] = float("inf")  # a rotated column
        flat[1, 0] = -0.0
        flat[1, -2:] = -0.0  # a rotated pair of zeros: the signs of 0 * c - 0 * s
    ang = torch.rand(shape[0], rope_dim // 2, generator=g, device=dev) * 6.28
    return x, ang.cos(), ang.sin()


def check_configs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int, what: str) -> None:
    for inverse in (False, True):
        want = rope(x, cos, sin, rope_dim, inverse, cs_rt=False)  # the specialised kernel (q's pre-session-6 default)
        for name, kw in CONFIGS.items():
            _same_bits(rope(x, cos, sin, rope_dim, inverse, **kw), want, f"{what} inverse={inverse} {name}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_kv_configs_match_default(dtype: torch.dtype) -> None:
    """kv-like rows [5, 512], rope 64 (5 rows: a partial last block for every config)."""
    x, cos, sin = _inputs((5, 512), 64, dtype, seed=1)
    check_configs(x, cos, sin, 64, f"kv {dtype}")


def test_strided_and_3d_configs_match_default() -> None:
    """q-like x [3, 4, 96] (rope 32, d not a power of two: masked tails), a strided x view and strided cos / sin."""
    x, cos, sin = _inputs((3, 4, 96), 32, torch.bfloat16, seed=2)
    check_configs(x, cos, sin, 32, "3d")
    wide = torch.randn(3, 2 * 96, device=DEV).bfloat16()[:, ::2]  # column stride 2
    cw = torch.randn(3, 32, device=DEV)[:, ::2]  # cos / sin with column stride 2: the cs_rt kernel's case
    check_configs(wide, cw.cos(), cw.sin(), 32, "strided")


def test_row_tile_limits() -> None:
    x, cos, sin = _inputs((2, 8192), 64, torch.bfloat16, seed=3)
    with pytest.raises(ValueError, match="row_tile"):
        rope(x, cos, sin, 64, row_tile=True)


def test_cs_rt_default_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """CS_RT_DEFAULT is what cs_rt=None takes for multi-head inputs (q-like [t, m > 1, d]); one row per token (kv)
    keeps the specialised kernel; an explicit cs_rt wins."""
    assert _R.CS_RT_DEFAULT is True  # the module's value since session 6 (before any patching here)
    launched: list[str] = []

    class _Rec:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: tuple):  # noqa: ANN204
            return lambda *a, **kw: launched.append(self.name)

    monkeypatch.setattr(_R, "_rope_kernel", _Rec("default"))
    monkeypatch.setattr(_R, "_rope_kernel_cs_rt", _Rec("cs_rt"))
    x, cos, sin = _inputs((2, 64), 16, torch.float32, seed=4)
    xq = _inputs((2, 3, 64), 16, torch.float32, seed=5)[0]
    for flag in (False, True):
        monkeypatch.setattr(_R, "CS_RT_DEFAULT", flag)
        rope(x, cos, sin, 16)
        rope(xq, cos, sin, 16)
        rope(x, cos, sin, 16, cs_rt=not flag)
    assert launched == ["default", "default", "cs_rt", "default", "cs_rt", "default"]


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 64, 4096, 16384])
def test_gpu_rope_configs_v4(t: int) -> None:
    """The benchmark's shapes: kv [t, 512] at every count, q [t, 64, 512] up to 4,096 tokens (rope 64, bf16); every
    config against the default bit for bit, and the default against the reference."""
    x, cos, sin = _inputs((t, 512), 64, torch.bfloat16, seed=t)
    check_configs(x, cos, sin, 64, f"kv t={t}")
    _same_bits(rope(x, cos, sin, 64), ref_rope(x, cos, sin, 64), f"kv t={t} default vs reference")
    if t <= 4096:
        q, cq, sq = _inputs((t, 64, 512), 64, torch.bfloat16, seed=t + 1)
        for inverse in (False, True):
            want = rope(q, cq, sq, 64, inverse, cs_rt=False)
            _same_bits(rope(q, cq, sq, 64, inverse, cs_rt=True), want, f"q t={t} inverse={inverse} cs_rt")
