"""Triton rms_norm / apply_rope_interleaved / swiglu_clamp(_fused) against the references in `ref/`.

On a CPU-only machine the kernels run under the Triton interpreter (TRITON_INTERPRET=1, set here before the
kernel modules are imported); with CUDA they run compiled. Inputs are random and never zero; every `out=`
buffer is NaN-poisoned first so an unwritten entry shows.

Tolerances. u = 2^-24 (fp32 unit roundoff, half an ulp, 6.0e-8). Both sides compute in fp32 in the same order
of operations; they differ in reduction order and in the accuracy of sqrt / exp / division (the compiled
kernels use sqrt.approx, ex2.approx and div.full, each <= 2 ulp = 4u; the interpreter uses numpy's correctly
rounded ones). So the fp32 bounds are relative, and 1e-6 = 17u:
* rms_norm, elementwise |d| <= 1e-6 |ref|. ms = sum(x^2)/d sums positive terms: a tree / pairwise order is off
  by <= log2(d) u relatively (d = 4096: 12u worst, a random walk of ~sqrt(log2 d) u ~ 2u in practice), then
  the division. r = 1/sqrt(ms + eps) halves ms's error and adds the sqrt and division roundings (<= 1u each in
  the interpreter and torch on the CPU, torch's CUDA rsqrtf <= 4u, the kernel's <= 8u on a GPU); y = w * (x * r)
  rounds the same products on both sides (+ <= 2u where the r differ).
  Typical total a few u; measured on the CPU <= 3.3e-7 (5.5u) for d <= 8192.
* RoPE, per pair: |d| <= 1e-6 * |(a, b)|. Each output a*c - b*s (or a*s + b*c) is two products and one sum,
  error <= u (|a c| + |b s|) + u |out| <= 2u |(a, b)| per side because c^2 + s^2 = 1 (Cauchy-Schwarz), so any
  evaluation order (an FMA included) is within delta = 4u |(a, b)| of the reference. The kernel is launched
  with fp fusion off, so it does the reference's three roundings (bit-identical: the interpreter measured 0,
  `test_gpu_rope_bitwise` asserts it on a GPU); the tolerance is the order-independent bound. Copied dims: exact.
  bf16 RoPE outputs: NOT "1 bf16 ulp of ref": where a*c and b*s cancel, |out| << |(a, b)| and delta exceeds a
  bf16 ulp of out (the H200 run at 4096 tokens, 16.7M pairs, hit this with the FMA-contracted kernel). Rounding
  is monotone, so two fp32 values delta apart round to bf16 values at most delta + one bf16 spacing apart,
  the spacing taken at |ref| + delta (rounded up to a bf16 value): bound = delta + spacing(|ref| + delta).
* swiglu, elementwise |d| <= 1e-6 |ref| (+ |g| u on a GPU). g / (1 + exp(-g)) * u: the exp's relative error
  passes to silu (times e/(1+e) <= 1), then an add, a division and a product: <= 2u + 3u on the CPU side
  (measured 3.2e-7 apart: numpy's exp vs Sleef's). On a GPU Triton's fp32 exp is ex2.approx(-g * log2 e):
  rounding the product moves the exponent by |g| log2(e) u, a relative error of |g| u in exp(-g) that
  reaches silu(g) for negative g; with ex2 / div.full (4u each) the kernel is <= 10u + |g| u off, torch's CUDA
  reference (expf <= 4u, IEEE division) <= 7u: the GPU tests allow 1e-6 + |g| u.
* bf16 results: within 1 bf16 ulp of the reference (fp32 values a few u apart can round to neighbours).
"""

from __future__ import annotations

import importlib
import math
import os
import sys

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the @triton.jit in the kernel modules
pytest.importorskip("triton")

from deepinfer.tile_kernels.ref.act import swiglu_clamp  # noqa: E402
from deepinfer.tile_kernels.ref.norm import rms_norm  # noqa: E402
from deepinfer.tile_kernels.ref.rope import apply_rope_interleaved, rope_cos_sin, rope_inv_freq  # noqa: E402


def _kernels(name: str):  # noqa: ANN202 (a module)
    """Import backends.cuda.<name>, re-decorating its kernels if it was imported before the interpreter was on."""
    mod = f"deepinfer.tile_kernels.backends.cuda.{name}"
    if not _CUDA and mod in sys.modules:
        importlib.reload(sys.modules[mod])
    return importlib.import_module(mod)


rms_norm_triton = _kernels("triton_norm").rms_norm_triton
_ROPE = _kernels("triton_rope")
apply_rope_interleaved_triton = _ROPE.apply_rope_interleaved_triton
_ACT = _kernels("triton_act")
swiglu_clamp_triton, swiglu_clamp_fused_triton = _ACT.swiglu_clamp_triton, _ACT.swiglu_clamp_fused_triton

DEV = "cuda" if _CUDA else "cpu"
U = 2.0**-24
REL = 1e-6
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def _randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random N(0, scale^2) values with no exact zeros, cast to dtype, on DEV."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(*shape, generator=g) * scale
    v = torch.where(v.abs() < 1e-3 * scale, torch.full_like(v, 1e-3 * scale), v)
    return v.to(dtype).to(DEV)


def _poison(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def _bf16_ulp(ref: torch.Tensor) -> torch.Tensor:
    """Spacing above |ref| in ref's dtype, as fp32."""
    a = ref.abs()
    return (torch.nextafter(a, torch.full_like(a, float("inf"))) - a).float()


def _spacing_at_or_above(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype` values just above fp32 magnitudes v (v rounded up to a `dtype` value first), fp32."""
    vb = v.to(dtype)
    inf = torch.full_like(vb, float("inf"))
    vb = torch.where(vb.float() < v, torch.nextafter(vb, inf), vb)
    return torch.nextafter(vb, inf).float() - vb.float()


def _check_close(
    got: torch.Tensor,
    ref: torch.Tensor,
    scale: torch.Tensor | None = None,
    rel: float = REL,
    fp32_delta: torch.Tensor | None = None,
) -> None:
    """fp32: |got - ref| <= rel * scale (scale = |ref| by default). bf16/fp16: within 1 ulp of ref, or, with
    `fp32_delta` (a bound on how far the two fp32 values before the cast may be apart), within
    fp32_delta + the spacing at |ref| + fp32_delta (module docstring, RoPE)."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert torch.isfinite(got.float()).all(), "unwritten / non-finite entries"
    err = (got.float() - ref.float()).abs()
    if got.dtype == torch.float32:
        bound = rel * (ref.abs() if scale is None else scale)
    elif fp32_delta is None:
        bound = _bf16_ulp(ref)
    else:
        bound = fp32_delta + _spacing_at_or_above(ref.float().abs() + fp32_delta, ref.dtype)
    assert (err <= bound).all(), f"worst excess {(err - bound).max().item():.3g}, max err {err.max().item():.3g}"


# ---------------------------------------------------------------------------------------------- rms_norm


@DTYPES
@pytest.mark.parametrize(
    ("shape", "weighted", "eps"),
    [
        ((1, 77), True, 1e-6),
        ((3, 300), False, 1e-6),
        ((2, 5, 64), True, 1e-2),
        ((2, 3, 2, 48), False, 1e-5),
        ((4, 1000), True, 1e-6),
    ],
)
def test_rms_norm_matches_reference(shape: tuple[int, ...], weighted: bool, eps: float, dtype: torch.dtype) -> None:
    """Odd and power-of-two widths, 2-4 dims, weighted or not, several eps; poisoned out= is filled and returned."""
    x = _randn(*shape, seed=sum(shape), dtype=dtype)
    w = _randn(shape[-1], seed=1, scale=0.5, dtype=dtype) + 1.0 if weighted else None
    out = _poison(shape, dtype)
    got = rms_norm_triton(x, w, eps, out=out)
    assert got is out
    _check_close(got, rms_norm(x, w, eps))


def test_rms_norm_strided_and_mixed_dtypes() -> None:
    """Row-strided x (a slice), unmergeable leading dims (a transpose), fp32 weight on bf16 x, strided weight."""
    base = _randn(6, 80, seed=2, dtype=torch.bfloat16)
    x = base[:, :72]  # row stride 80
    w = _randn(144, seed=3, dtype=torch.float32)[::2]  # stride 2
    _check_close(rms_norm_triton(x, w), rms_norm(x, w))
    xt = _randn(4, 3, 64, seed=4).transpose(0, 1)  # [3, 4, 64]: leading dims do not merge
    got = rms_norm_triton(xt, None, 1e-6)
    assert got.shape == (3, 4, 64) and got.is_contiguous()
    _check_close(got, rms_norm(xt, None, 1e-6))


def test_rms_norm_magnitudes_and_inplace() -> None:
    """Tiny rows (eps dominates), large rows, and out=x (each row is read whole before it is written)."""
    for scale in (1e-4, 1e3):
        x = _randn(3, 96, seed=5, scale=scale)
        _check_close(rms_norm_triton(x, None, 1e-6), rms_norm(x, None, 1e-6))
    x = _randn(3, 96, seed=6)
    want = rms_norm(x, None)
    assert rms_norm_triton(x, None, out=x) is x
    _check_close(x, want)


def test_rms_norm_bad_inputs() -> None:
    x = _randn(2, 64, seed=7)
    with pytest.raises(ValueError, match="weight must have shape"):
        rms_norm_triton(x, _randn(63, seed=8))
    with pytest.raises(TypeError, match="x must be"):
        rms_norm_triton(x.to(torch.int32))
    with pytest.raises(TypeError, match="x must be"):
        rms_norm_triton(x.double())
    with pytest.raises(ValueError, match="out must be"):
        rms_norm_triton(x, out=_poison((2, 64), torch.bfloat16))
    with pytest.raises(ValueError, match="out must be"):
        rms_norm_triton(x, out=_poison((2, 128), torch.float32)[:, :64])
    with pytest.raises(ValueError, match="d must be"):
        rms_norm_triton(torch.ones(1, 32768, device=DEV))
    assert rms_norm_triton(_randn(0, 64, seed=0)).shape == (0, 64)


# ---------------------------------------------------------------------------------------------------- RoPE


def _tables(t: int, rope_dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [t, rope_dim/2] fp32 for random positions up to 1M with V4's YaRN table."""
    pos = torch.randint(0, 1 << 20, (t,), generator=torch.Generator().manual_seed(seed))
    cos, sin = rope_cos_sin(pos, rope_inv_freq(rope_dim, 160000.0, 16.0, 65536))
    return cos.to(DEV), sin.to(DEV)


def _check_rope(
    got: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int, inverse: bool
) -> None:
    """Copied dims equal x exactly; rotated dims per the module docstring (fp32: 1e-6 of the pair's norm)."""
    ref = apply_rope_interleaved(x, cos, sin, rope_dim, inverse)
    assert got.shape == x.shape and got.dtype == x.dtype and got.is_contiguous()
    assert torch.equal(got[..., :-rope_dim], x[..., :-rope_dim])
    pair = x[..., -rope_dim:].float().unflatten(-1, (rope_dim // 2, 2)).norm(dim=-1).repeat_interleave(2, dim=-1)
    # 4u |(a, b)| (+ 2^-20 relative for the u^2 terms and c^2 + s^2 = 1 + O(u) of the fp32 tables)
    delta = 4 * U * (1 + 2.0**-20) * pair
    _check_close(got[..., -rope_dim:], ref[..., -rope_dim:], pair, fp32_delta=delta)


@DTYPES
@pytest.mark.parametrize("inverse", [False, True], ids=["fwd", "inv"])
@pytest.mark.parametrize(
    ("shape", "rope_dim"), [((1, 64), 64), ((3, 77), 20), ((2, 3, 40), 16), ((2, 2, 3, 24), 8), ((1, 5, 130), 64)]
)
def test_rope_matches_reference(shape: tuple[int, ...], rope_dim: int, inverse: bool, dtype: torch.dtype) -> None:
    """rope_dim == d, odd d (the rope region starts at an odd column), 0-2 middle dims, t = 1; poisoned out=."""
    x = _randn(*shape, seed=sum(shape) + rope_dim, dtype=dtype)
    cos, sin = _tables(shape[0], rope_dim, seed=rope_dim)
    out = _poison(shape, dtype)
    got = apply_rope_interleaved_triton(x, cos, sin, rope_dim, inverse, out=out)
    assert got is out
    _check_rope(got, x, cos, sin, rope_dim, inverse)


@pytest.mark.parametrize(("shape", "rope_dim"), [((5, 3, 48), 16), ((7, 40), 8), ((3, 2, 2, 24), 24)])
def test_rope_row_blocks(shape: tuple[int, ...], rope_dim: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several flattened rows per program, as on the GPU at large t (small inputs on CPU would get one): blocks
    that span tokens, a partial last block, a strided x (middle dims merged), rope_dim == d (nothing copied)."""
    monkeypatch.setattr(_ROPE, "TARGET_PROGRAMS", 1)
    monkeypatch.setattr(_ROPE, "SMALL_ELEMS", 0)  # no small-input cap
    monkeypatch.setattr(_ROPE, "TILE_ELEMS", 256)  # 4-8 rows per program: several programs
    rows = math.prod(shape[:-1])
    bm = _ROPE._blocks(rows, shape[-1], rope_dim)[0]
    assert 1 < bm < rows and rows % bm  # blocks that span tokens, a partial last one
    x = _randn(*shape[:-1], shape[-1] + 8, seed=rows, dtype=torch.bfloat16)[..., 8:]  # row stride d + 8
    cos, sin = _tables(shape[0], rope_dim, seed=rope_dim + 1)
    for inverse in (False, True):
        _check_rope(apply_rope_interleaved_triton(x, cos, sin, rope_dim, inverse), x, cos, sin, rope_dim, inverse)


def test_rope_default_blocks() -> None:
    """Round-2 defaults: kv [16384, 512] (8M elements) 2 rows / 2 warps per program, q [16384 * 64, 512] 8 / 8.
    Session-4 default: early rotate loads up to 16M elements (kv up to 32K tokens, q up to 512), late above."""
    assert _ROPE._blocks(16384, 512, 64) == (2, 512, 32, 2)
    assert _ROPE._blocks(16384 * 64, 512, 64) == (8, 512, 32, 8)
    assert _ROPE._early_rotate(16384, 512) and _ROPE._early_rotate(32768, 512) and _ROPE._early_rotate(512 * 64, 512)
    assert not _ROPE._early_rotate(32769, 512) and not _ROPE._early_rotate(4096 * 64, 512)


def test_rope_strided_inputs_and_roundtrip() -> None:
    """Strided x (a slice of wider rows; a transpose whose middle dims do not merge), strided cos/sin,
    and inverse(forward(x)) == x to fp32 rounding."""
    t, rope_dim = 3, 16
    cos, sin = _tables(t, rope_dim, seed=9)
    cos_s = torch.stack((cos, cos), -1)[..., 0]  # column stride 2
    assert cos_s.stride(1) == 2
    x = _randn(t, 4, 56, seed=10, dtype=torch.bfloat16)[..., :48]
    _check_rope(apply_rope_interleaved_triton(x, cos_s, sin, rope_dim), x, cos, sin, rope_dim, False)
    xt = _randn(t, 5, 2, 32, seed=11).transpose(1, 2)  # [t, 2, 5, 32]
    _check_rope(apply_rope_interleaved_triton(xt, cos, sin, rope_dim, True), xt, cos, sin, rope_dim, True)
    x = _randn(t, 4, 32, seed=12)
    back = apply_rope_interleaved_triton(
        apply_rope_interleaved_triton(x, cos, sin, rope_dim), cos, sin, rope_dim, inverse=True
    )
    torch.testing.assert_close(back, x, rtol=0, atol=4e-7 * x.abs().max().item())


def test_rope_bad_inputs() -> None:
    x = _randn(2, 4, 32, seed=13)
    cos, sin = _tables(2, 16, seed=14)
    for rd in (15, 0, 34, 16.0):
        with pytest.raises(ValueError, match="rope_dim"):
            apply_rope_interleaved_triton(x, cos, sin, rd)
    with pytest.raises(ValueError, match="cos must have shape"):
        apply_rope_interleaved_triton(x, cos[:1], sin, 16)
    with pytest.raises(ValueError, match="sin must have shape"):
        apply_rope_interleaved_triton(x, cos, sin[:, :4], 16)
    with pytest.raises(TypeError, match="cos must be"):
        apply_rope_interleaved_triton(x, cos.to(torch.int64), sin, 16)
    with pytest.raises(ValueError, match="2\\+ dims"):
        apply_rope_interleaved_triton(x[0, 0], cos, sin, 16)
    with pytest.raises(ValueError, match="out must be contiguous"):
        apply_rope_interleaved_triton(x, cos, sin, 16, out=_poison((2, 4, 32), torch.bfloat16))
    with pytest.raises(ValueError, match="share storage"):
        apply_rope_interleaved_triton(x, cos, sin, 16, out=x)
    assert apply_rope_interleaved_triton(x[:, :0], cos, sin, 16).shape == (2, 0, 32)


# -------------------------------------------------------------------------------------------------- SwiGLU


@DTYPES
@pytest.mark.parametrize("limit", [10.0, 1.5, None], ids=["lim10", "lim1.5", "nolim"])
@pytest.mark.parametrize("shape", [(1, 77), (3, 5, 64), (2, 3, 2, 16)])
def test_swiglu_matches_reference(shape: tuple[int, ...], limit: float | None, dtype: torch.dtype) -> None:
    """Inputs ~N(0, 4^2) so every clamp is active; two-tensor and fused launchers, poisoned out=."""
    gate = _randn(*shape, seed=sum(shape), scale=4.0, dtype=dtype)
    up = _randn(*shape, seed=sum(shape) + 1, scale=4.0, dtype=dtype)
    ref = swiglu_clamp(gate, up, limit)
    out = _poison(shape, dtype)
    assert swiglu_clamp_triton(gate, up, limit, out=out) is out
    _check_close(out, ref)
    h = torch.cat((gate, up), dim=-1)
    out = _poison(shape, dtype)
    assert swiglu_clamp_fused_triton(h, limit, out=out) is out
    _check_close(out, ref)


def test_swiglu_strided_mixed_and_inplace() -> None:
    """Strided gate/up views, fp32 up with bf16 gate (result bf16), a non-contiguous fused h, out=gate."""
    gate = _randn(4, 100, seed=20, scale=4.0, dtype=torch.bfloat16)[:, ::2]
    up = _randn(50, 4, seed=21, scale=4.0).t()
    got = swiglu_clamp_triton(gate, up, 10.0)
    assert got.dtype == torch.bfloat16 and got.is_contiguous()
    _check_close(got, swiglu_clamp(gate, up, 10.0))
    h = _randn(3, 2, 40, seed=22, scale=4.0).transpose(0, 1)  # [2, 3, 40], rows do not merge
    _check_close(swiglu_clamp_fused_triton(h, 7), swiglu_clamp(h[..., :20], h[..., 20:], 7))
    g2, u2 = _randn(3, 33, seed=23, scale=4.0), _randn(3, 33, seed=24, scale=4.0)
    want = swiglu_clamp(g2, u2, 10.0)
    assert swiglu_clamp_triton(g2, u2, 10.0, out=g2) is g2
    _check_close(g2, want)


def test_swiglu_bad_inputs() -> None:
    g = _randn(2, 8, seed=25)
    with pytest.raises(ValueError, match="same shape"):
        swiglu_clamp_triton(g, g[:, :4])
    with pytest.raises(TypeError, match="up must be"):
        swiglu_clamp_triton(g, g.to(torch.int32))
    with pytest.raises(TypeError, match="limit must be"):
        swiglu_clamp_triton(g, g, limit=torch.tensor(10.0))
    with pytest.raises(ValueError, match="even last dim"):
        swiglu_clamp_fused_triton(g[:, :7])
    with pytest.raises(ValueError, match="out must be contiguous"):
        swiglu_clamp_fused_triton(g, out=_poison((2, 8), torch.float32))
    assert swiglu_clamp_fused_triton(g[:0]).shape == (0, 4)


# --------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@DTYPES
@pytest.mark.parametrize("t", [1, 7, 128, 4096])
def test_gpu_v4_flash_shapes(t: int, dtype: torch.dtype) -> None:
    """V4-Flash: norms of 4096 / 1024 / 512 (weighted) and the per-head query norm [t, 64, 512]; RoPE of q
    [t, 64, 512], kv [t, 512], indexer q [t, 64, 128] and the inverse on the attention output; SwiGLU of the
    routed experts [t * 6, 2048] (two tensors and fused [t * 6, 4096])."""
    for d in (4096, 1024, 512):
        x, w = _randn(t, d, seed=d + t, dtype=dtype), _randn(d, seed=d, dtype=torch.bfloat16) + 1.0
        _check_close(rms_norm_triton(x, w), rms_norm(x, w))
    q = _randn(t, 64, 512, seed=t, dtype=dtype)
    _check_close(rms_norm_triton(q, None), rms_norm(q, None))
    cos, sin = _tables(t, 64, seed=t)
    for x, inv in (
        (q, False),
        (_randn(t, 512, seed=t + 1, dtype=dtype), False),
        (_randn(t, 64, 128, seed=t + 2, dtype=dtype), False),
        (q, True),
    ):
        _check_rope(apply_rope_interleaved_triton(x, cos, sin, 64, inv), x, cos, sin, 64, inv)
    h = _randn(t * 6, 4096, seed=t + 3, scale=3.0, dtype=dtype)
    gate, up = h[:, :2048], h[:, 2048:]
    ref = swiglu_clamp(gate, up, 10.0)
    scale = ref.abs() * (1 + gate.float().clamp(max=10).abs() * U / REL)  # + |g| u for the GPU's exp
    _check_close(swiglu_clamp_triton(gate, up, 10.0), ref, scale)
    _check_close(swiglu_clamp_fused_triton(h, 10.0), ref, scale)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("inverse", [False, True], ids=["fwd", "inv"])
def test_gpu_rope_bitwise(inverse: bool) -> None:
    """With fp fusion off the kernel performs the reference's roundings (a mul, a mul, an add, then RNE to bf16),
    so on the H200 it equals torch eager bit for bit (q [4096, 64, 512] bf16 and fp32)."""
    t = 4096
    cos, sin = _tables(t, 64, seed=50)
    for dtype in (torch.bfloat16, torch.float32):
        q = _randn(t, 64, 512, seed=51, dtype=dtype)
        got = apply_rope_interleaved_triton(q, cos, sin, 64, inverse)
        ref = apply_rope_interleaved(q, cos, sin, 64, inverse)
        assert torch.equal(got, ref), f"{dtype}: {(got != ref).sum().item()} of {got.numel()} differ"


def _rope_signed_zeros() -> None:
    """Position 0 (sin = 0, cos = 1) with +-0.0 inputs: the inverse's -sin must be -0.0 as torch's negate, so
    every output bit equals the reference's (torch.equal calls -0.0 == +0.0: compare the bits)."""
    t, rope_dim = 8, 64
    cos, sin = rope_cos_sin(torch.zeros(t, dtype=torch.int64), rope_inv_freq(rope_dim, 160000.0, 16.0, 65536))
    cos, sin = cos.to(DEV), sin.to(DEV)
    for dtype, itype in ((torch.bfloat16, torch.int16), (torch.float32, torch.int32)):
        x = _randn(t, 4, 128, seed=52, dtype=dtype)
        x[:, :, -rope_dim:] = torch.tensor([0.0, -0.0, -0.0, 0.0, 1.5, -0.0, -0.0, -2.0], dtype=dtype).repeat(8)
        for inverse in (False, True):
            got = apply_rope_interleaved_triton(x, cos, sin, rope_dim, inverse).view(itype)
            want = apply_rope_interleaved(x, cos, sin, rope_dim, inverse).view(itype)
            bad = (got != want).nonzero()
            assert bad.numel() == 0, f"{dtype} inverse={inverse}: {len(bad)} differ, first {bad[:1].tolist()}"


def test_rope_signed_zeros() -> None:
    _rope_signed_zeros()


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_rope_signed_zeros() -> None:
    _rope_signed_zeros()


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_cuda_graph_replay() -> None:
    """The launchers have no host sync: capture one call of each in a CUDA graph, change inputs, replay."""
    t = 16
    x, w = _randn(t, 4096, seed=30, dtype=torch.bfloat16), _randn(4096, seed=31, dtype=torch.bfloat16)
    q = _randn(t, 64, 512, seed=32, dtype=torch.bfloat16)
    cos, sin = _tables(t, 64, seed=33)
    h = _randn(t * 6, 4096, seed=34, scale=3.0, dtype=torch.bfloat16)
    y_out, q_out, a_out = _poison((t, 4096), torch.bfloat16), _poison((t, 64, 512), torch.bfloat16), None

    def step() -> torch.Tensor:
        rms_norm_triton(x, w, out=y_out)
        apply_rope_interleaved_triton(q, cos, sin, 64, out=q_out)
        return swiglu_clamp_fused_triton(h, 10.0)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a_out = step()
    x.copy_(_randn(t, 4096, seed=40, dtype=torch.bfloat16))
    q.copy_(_randn(t, 64, 512, seed=41, dtype=torch.bfloat16))
    h.copy_(_randn(t * 6, 4096, seed=42, scale=3.0, dtype=torch.bfloat16))
    new_cos, new_sin = _tables(t, 64, seed=43)
    cos.copy_(new_cos)
    sin.copy_(new_sin)
    graph.replay()
    torch.cuda.synchronize()
    _check_close(y_out, rms_norm(x, w))
    _check_rope(q_out, q, cos, sin, 64, False)
    _check_close(a_out, swiglu_clamp(h[:, :2048], h[:, 2048:], 10.0))
