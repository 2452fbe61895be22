"""Triton per-group FP8 quantisation (`backends/cuda/triton_quant.py`) against `ref/quant.py`: bit for bit.

Every step of the quantiser is an exact or a single correctly rounded fp32 operation done the same way on both
sides (see the kernel's docstring), so q, exponents, scales and dequantised values must be identical (NaN where
the reference has NaN). Inputs: random normals over many magnitudes per group, plus extreme groups: all
zero (amax floored at 1e-4), tiny (subnormal) values, values near fp32's max, a NaN, an inf, exact powers of two
times 448 (the exponent boundary) and ties of e4m3 rounding. On CPU the kernel runs in the Triton interpreter.
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

from deepinfer.tile_kernels.ref import quant as ref  # noqa: E402

_MOD = "deepinfer.tile_kernels.backends.cuda.triton_quant"
if not _CUDA and _MOD in sys.modules:
    importlib.reload(sys.modules[_MOD])
fp8_group_quant_triton = importlib.import_module(_MOD).fp8_group_quant_triton

DEV = "cuda" if _CUDA else "cpu"


def _inputs(rows: int, n: int, group: int, seed: int, dtype: torch.dtype, extremes: bool = True) -> torch.Tensor:
    """x [rows, n]: N(0, 1) times a per-group magnitude 2^U(-20, 20); with `extremes`, the special groups of the
    module docstring replace the first groups (rows * n / group must be >= 8)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n // group, group, generator=g)
    x = x * torch.exp2(torch.randint(-20, 21, (rows, n // group, 1), generator=g).float())
    flat = x.view(-1, group)
    if extremes:
        flat[0] = 0.0
        flat[1] = torch.randn(group, generator=g) * 1e-39  # subnormal fp32 (bf16 keeps some)
        flat[2] = torch.randn(group, generator=g) * 3e37
        flat[3, 1] = float("nan")
        flat[4, 2] = float("-inf")
        flat[5] = 448.0 * 2.0 ** torch.randint(-8, 8, (group,), generator=g).float()  # amax exactly 448 * 2^k
        flat[6] = (torch.randint(0, 64, (group,), generator=g).float() + 0.5) * 2.0**-3 * 17  # e4m3 ties
        flat[6, 0] = 448.0
        flat[7] = -flat[7].abs()
    return x.reshape(rows, n).to(dtype).to(DEV)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bitwise equality, NaN == NaN (the bytes may differ in the NaN payload only)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    g, w = got.float(), want.float()
    nan = torch.isnan(w)
    assert torch.equal(torch.isnan(g), nan), f"NaN pattern differs at {(torch.isnan(g) != nan).sum().item()}"
    diff = (g != w) & ~nan
    assert not diff.any(), f"{diff.sum().item()} differ, e.g. got {g[diff][:4].tolist()} want {w[diff][:4].tolist()}"


GROUPS = pytest.mark.parametrize("group", [64, 128])
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@GROUPS
@DTYPES
def test_quant_exp_and_dequant(group: int, dtype: torch.dtype) -> None:
    """fp8_quant_ue8m0 (q, int32 exponents) and fp8_quant_dequant_ue8m0, including the extreme groups."""
    x = _inputs(3, 4 * group, group, seed=group, dtype=dtype)
    q, e = fp8_group_quant_triton(x, group, "exp")
    q_ref, e_ref = ref.fp8_quant_ue8m0(x, group)
    _same(q, q_ref)
    assert torch.equal(e, e_ref)
    d, none = fp8_group_quant_triton(x, group, "dequant")
    assert none is None
    _same(d, ref.fp8_quant_dequant_ue8m0(x, group))


@GROUPS
@pytest.mark.parametrize("fmt", ["ue8m0", "fp32"])
def test_per_token_group_scales(group: int, fmt: str) -> None:
    """per_token_group_quant_fp8: 2^e scales (inf for non-finite groups) or amax/448 (IEEE division)."""
    x = _inputs(4, 2 * group, group, seed=group + 1, dtype=torch.bfloat16)
    q, s = fp8_group_quant_triton(x, group, "pow2" if fmt == "ue8m0" else "fp32")
    q_ref, s_ref = ref.per_token_group_quant_fp8(x, group, fmt)
    _same(q, q_ref)
    _same(s, s_ref)


def test_strided_kv_slice_3d_and_out() -> None:
    """The engine's KV call: dims 0..447 of [t, 512] rows (row stride 512), block 64; a 3-D input; out=."""
    kv = _inputs(5, 512, 64, seed=7, dtype=torch.bfloat16)
    view = kv[:, :448]
    out = torch.full((5, 448), float("nan"), dtype=torch.bfloat16, device=DEV)
    got, _ = fp8_group_quant_triton(view, 64, "dequant", out=out)
    assert got is out
    _same(got, ref.fp8_quant_dequant_ue8m0(view, 64))
    x3 = _inputs(6, 256, 128, seed=8, dtype=torch.float16, extremes=False).view(2, 3, 256)
    q, e = fp8_group_quant_triton(x3, 128, "exp")
    assert q.shape == (2, 3, 256) and e.shape == (2, 3, 2)
    q_ref, e_ref = ref.fp8_quant_ue8m0(x3, 128)
    _same(q, q_ref)
    assert torch.equal(e, e_ref)


def test_bad_inputs() -> None:
    x = _inputs(2, 128, 64, seed=9, dtype=torch.float32, extremes=False)
    with pytest.raises(ValueError, match="mode"):
        fp8_group_quant_triton(x, 64, "int8")
    with pytest.raises(ValueError, match="group"):
        fp8_group_quant_triton(x, 48)
    with pytest.raises(ValueError, match="multiple of group"):
        fp8_group_quant_triton(x[:, :96], 64)
    with pytest.raises(TypeError, match="x must be"):
        fp8_group_quant_triton(x.double(), 64)
    with pytest.raises(ValueError, match="out must be"):
        fp8_group_quant_triton(x, 64, out=torch.empty(2, 128, device=DEV))
    q, e = fp8_group_quant_triton(x[:0], 64)
    assert q.shape == (0, 128) and e.shape == (0, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_gpu_v4_flash_shapes(t: int) -> None:
    """Activations [t, 4096] at groups 128 (both scale formats) and 64, the KV slice [t, 512][:, :448] at 64."""
    x = _inputs(t, 4096, 128, seed=t, dtype=torch.bfloat16, extremes=t >= 2)
    for group in (128, 64):
        q, e = fp8_group_quant_triton(x, group, "exp")
        q_ref, e_ref = ref.fp8_quant_ue8m0(x, group)
        _same(q, q_ref)
        assert torch.equal(e, e_ref)
    for fmt, mode in (("ue8m0", "pow2"), ("fp32", "fp32")):
        q, s = fp8_group_quant_triton(x, 128, mode)
        q_ref, s_ref = ref.per_token_group_quant_fp8(x, 128, fmt)
        _same(q, q_ref)
        _same(s, s_ref)
    kv = _inputs(t, 512, 64, seed=t + 1, dtype=torch.bfloat16, extremes=t >= 2)[:, :448]
    _same(fp8_group_quant_triton(kv, 64, "dequant")[0], ref.fp8_quant_dequant_ue8m0(kv, 64))
