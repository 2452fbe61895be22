"""The fused Triton `mhc_pre` and `mhc_head` kernels against `ref.mhc.mhc_pre` / `ref.mhc.mhc_head`.

On a CPU-only machine the kernel runs under the Triton interpreter (TRITON_INTERPRET=1, set here before the
kernel module is imported); with CUDA it runs compiled. Inputs have the model's magnitudes: x ~ N(0, 1),
fn ~ N(0, 1/sqrt(hc*d)) so the mixing logits m are ~N(0, 1), base ~ N(0, .5), scale ~ N(0, .5).

Tolerances (all math in fp32 on both sides, only the summation order differs):
* logits m: a length-hc*d fp32 dot product of O(1) partial sums; reordering costs a few ulps per step, a random
  walk: ~1e-7 at hc*d <= 1024, a few 1e-6 at hc*d = 16384 (measured on an H200: the fp32 reference is itself
  2.7e-6 off a float64 oracle in post there). Times |scale| < ~2 and the gate slopes (sigmoid' <= 1/4,
  2*sigmoid' <= 1/2) this moves pre/post by about as much.
* comb: entries lie in [0, 1]; each of the 2*iters normalisations adds ~1 ulp (6e-8) of relative error and
  the logit error enters through exp (relative error = absolute logit error), so |delta comb| ~ 40 * 6e-8
  + |delta m| < 1e-5.
  Hence post and comb: 1e-5 absolute against the reference at the CPU sizes and against a float64 oracle at
  V4 width (GPU tests), where the fp32 reference gets 2e-5 (both sides carry the rounding above).
* x_in: 4-term fp32 sums weighted by pre, |delta pre| <= tol: tol * sum_i |x_i| (this dominates where the
  terms cancel) plus fp32 rtol 1e-5, or for bf16 output 1 bf16 ulp of the reference (a near-tie can round
  the other way).
* mhc_head: the same two kernels with hc fn rows; its weights are mhc_pre's pre gates, so its output gets
  x_in's bound.
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

from deepinfer.tile_kernels.ref.mhc import mhc_head, mhc_pre, sinkhorn  # noqa: E402

_MOD = "deepinfer.tile_kernels.backends.cuda.triton_mhc"
if not _CUDA and _MOD in sys.modules:  # imported earlier without the interpreter: re-decorate the kernel
    importlib.reload(sys.modules[_MOD])
_KERNELS = importlib.import_module(_MOD)
mhc_pre_triton = _KERNELS.mhc_pre_triton
mhc_head_triton = _KERNELS.mhc_head_triton

DEV = "cuda" if _CUDA else "cpu"
HC = 4
TOL = 1e-5


def _inputs(
    t: int, d: int, dtype: torch.dtype, seed: int, hc: int = HC
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [t, hc, d] dtype, fn [(2+hc)*hc, hc*d], scale [3], base [(2+hc)*hc] (fp32), model-like magnitudes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hc, d, generator=g).to(dtype)
    fn = torch.randn((2 + hc) * hc, hc * d, generator=g) / (hc * d) ** 0.5
    scale = torch.randn(3, generator=g) * 0.5
    base = torch.randn((2 + hc) * hc, generator=g) * 0.5
    return x.to(DEV), fn.to(DEV), scale.to(DEV), base.to(DEV)


def _poisoned(t: int, d: int, dtype: torch.dtype, hc: int = HC) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NaN-filled output buffers (x_in [t, d], post [t, hc], comb [t, hc, hc]) so unwritten entries show."""
    return (
        torch.full((t, d), float("nan"), dtype=dtype, device=DEV),
        torch.full((t, hc), float("nan"), device=DEV),
        torch.full((t, hc, hc), float("nan"), device=DEV),
    )


def _oracle64(
    x: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
    iters: int = 20,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's post [t, hc] and comb [t, hc, hc] computed in float64 (the exact answer for fp32 inputs)."""
    hc = x.shape[1]
    v = x.flatten(1).double()
    m = (v @ fn.double().t()) * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + rms_eps)
    s, b = scale.double(), base.double()
    post = 2 * torch.sigmoid(m[:, hc : 2 * hc] * s[1] + b[hc : 2 * hc])
    return post, sinkhorn((m[:, 2 * hc :] * s[2] + b[2 * hc :]).view(-1, hc, hc), iters, hc_eps)


def _check_mix(x_in: torch.Tensor, r_x: torch.Tensor, x: torch.Tensor, tol: float = TOL) -> None:
    """x_in (or the head's output) [t, d] vs the reference's: gates off by <= tol, then one rounding."""
    assert x_in.dtype == r_x.dtype and x_in.shape == r_x.shape and x_in.is_contiguous()
    assert torch.isfinite(x_in.float()).all(), "unwritten/non-finite entries"
    # |delta pre| <= tol (as for post) moves x_in by up to tol * sum_i |x_i|, which dominates where the 4 terms
    # cancel; on top: fp32 rtol 1e-5, or 1 bf16 ulp of the reference (a near-tie can round the other way)
    mag = r_x.float().abs()
    slack = tol * x.float().abs().sum(1)
    if x_in.dtype == torch.float32:
        bound = 1e-5 * mag + slack
    else:
        bound = (torch.nextafter(r_x.abs(), torch.full_like(r_x, float("inf"))) - r_x.abs()).float() + slack
    err = (x_in.float() - r_x.float()).abs()
    assert (err <= bound).all(), f"x_in off: worst excess {(err - bound).max().item()}"


def _check(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], x: torch.Tensor, tol: float = TOL) -> None:
    """Compare (x_in, post, comb) with the reference at the tolerances derived in the module docstring."""
    x_in, post, comb = got
    r_x, r_post, r_comb = want
    assert x_in.dtype == r_x.dtype and post.dtype == comb.dtype == torch.float32
    for name, a in (("x_in", x_in), ("post", post), ("comb", comb)):
        assert torch.isfinite(a.float()).all(), f"{name} has unwritten/non-finite entries"
    assert (post - r_post).abs().max().item() <= tol
    assert (comb - r_comb).abs().max().item() <= tol
    _check_mix(x_in, r_x, x, tol)
    # doubly stochastic: columns were normalised last (sum = s / (s + eps)); rows only to Sinkhorn convergence
    assert (comb.sum(-2) - 1).abs().max().item() <= TOL
    assert (comb.sum(-1) - 1).abs().max().item() <= 1e-2
    assert (comb.sum(-1) - r_comb.sum(-1)).abs().max().item() <= tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "d"), [(1, 64), (5, 64), (1, 256), (5, 256), (17, 64), (1, 4096)])
def test_matches_reference(t: int, d: int, dtype: torch.dtype) -> None:
    """Poisoned out= buffers, sizes inside one token block, across two blocks (17) and V4's width (4096)."""
    x, fn, scale, base = _inputs(t, d, dtype, seed=1000 * t + d)
    out = _poisoned(t, d, dtype)
    got = mhc_pre_triton(x, fn, scale, base, 1e-6, 1e-6, 20, out=out)
    assert all(g is o for g, o in zip(got, out))
    _check(got, mhc_pre(x, fn, scale, base, 1e-6, 1e-6, 20), x)
    post64, comb64 = _oracle64(x, fn, scale, base)
    assert (got[1].double() - post64).abs().max().item() <= TOL
    assert (got[2].double() - comb64).abs().max().item() <= TOL


@pytest.mark.parametrize("iters", [1, 3])
def test_sinkhorn_iters_and_eps(iters: int) -> None:
    """Other iteration counts (1: softmax + one column pass only) and non-default eps values."""
    x, fn, scale, base = _inputs(5, 64, torch.float32, seed=7)
    got = mhc_pre_triton(x, fn, scale, base, 1e-5, 1e-3, iters)
    want = mhc_pre(x, fn, scale, base, 1e-5, 1e-3, iters)
    assert (got[1] - want[1]).abs().max().item() <= TOL
    assert (got[2] - want[2]).abs().max().item() <= TOL
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_strided_x_allocates_outputs() -> None:
    """x as a non-contiguous view ([t, d, hc] storage transposed); outputs allocated by the launcher."""
    x, fn, scale, base = _inputs(5, 64, torch.bfloat16, seed=3)
    xs = x.transpose(1, 2).contiguous().transpose(1, 2)
    assert not xs.is_contiguous()
    got = mhc_pre_triton(xs, fn, scale, base)
    assert got[0].is_contiguous() and got[0].shape == (5, 64)
    _check(got, mhc_pre(x, fn, scale, base), x)


def test_empty_and_bad_shapes() -> None:
    """t = 0 launches nothing; wrong fn / hc / out buffers raise ValueError."""
    x, fn, scale, base = _inputs(0, 64, torch.float32, seed=0)
    x_in, post, comb = mhc_pre_triton(x, fn, scale, base)
    assert x_in.shape == (0, 64) and post.shape == (0, HC) and comb.shape == (0, HC, HC)
    x, fn, scale, base = _inputs(1, 64, torch.float32, seed=0)
    with pytest.raises(ValueError, match="fn must have shape"):
        mhc_pre_triton(x, fn[:, :-1], scale, base)
    with pytest.raises(ValueError, match="power of two"):
        mhc_pre_triton(*_inputs(1, 64, torch.float32, seed=0, hc=3))
    bad = _poisoned(1, 64, torch.bfloat16)  # x_in dtype must follow x (fp32)
    with pytest.raises(ValueError, match="out x_in"):
        mhc_pre_triton(x, fn, scale, base, out=bad)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 7, 128, 4096])
def test_gpu_v4_flash_shapes(t: int) -> None:
    """V4-Flash shapes (hc=4, d=4096, bf16, 20 iterations), compiled kernel (3xTF32 dot).

    At hc*d = 16384 the fp32 reference's own logit rounding (cuBLAS order) reaches ~1e-5, so post/comb are
    held to 1e-5 against the float64 oracle and to 2e-5 against the fp32 reference.
    """
    x, fn, scale, base = _inputs(t, 4096, torch.bfloat16, seed=t)
    got = mhc_pre_triton(x, fn, scale, base)
    _check(got, mhc_pre(x, fn, scale, base), x, tol=2 * TOL)
    post64, comb64 = _oracle64(x, fn, scale, base)
    assert (got[1].double() - post64).abs().max().item() <= TOL
    assert (got[2].double() - comb64).abs().max().item() <= TOL


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("prec", ["bf16x3", "tf32x3", "ieee"])
def test_gpu_dot_precisions(prec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every mix-dot variant meets the float64 oracle at V4 width (bf16x3 needs bf16 x; the others get fp32 x too)."""
    monkeypatch.setattr(_KERNELS, "DOT_PRECISION", prec)
    for dtype in [torch.bfloat16] if prec == "bf16x3" else [torch.bfloat16, torch.float32]:
        x, fn, scale, base = _inputs(256, 4096, dtype, seed=11)
        got = mhc_pre_triton(x, fn, scale, base)
        _check(got, mhc_pre(x, fn, scale, base), x, tol=2 * TOL)
        post64, comb64 = _oracle64(x, fn, scale, base)
        assert (got[1].double() - post64).abs().max().item() <= TOL
        assert (got[2].double() - comb64).abs().max().item() <= TOL


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_cuda_graph_replay() -> None:
    """The launcher has no host sync: capture it in a CUDA graph, change x in place, replay, compare."""
    x, fn, scale, base = _inputs(64, 4096, torch.bfloat16, seed=5)
    mhc_pre_triton(x, fn, scale, base)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = mhc_pre_triton(x, fn, scale, base)
    x.copy_(_inputs(64, 4096, torch.bfloat16, seed=6)[0])
    graph.replay()
    torch.cuda.synchronize()
    _check(got, mhc_pre(x, fn, scale, base), x, tol=2 * TOL)


def _head_inputs(
    t: int, d: int, dtype: torch.dtype, seed: int, hc: int = HC
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [t, hc, d], fn [hc, hc*d], scale [1], base [hc]: mhc_pre's inputs cut to the head's rows."""
    x, fn, scale, base = _inputs(t, d, dtype, seed, hc)
    return x, fn[:hc].contiguous(), scale[:1].contiguous(), base[:hc].contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "d"), [(1, 64), (5, 256), (17, 64), (1, 4096)])
def test_head_matches_reference(t: int, d: int, dtype: torch.dtype) -> None:
    """mhc_head: one token block, two blocks (17), V4's width (4096); non-default eps on one case."""
    x, fn, scale, base = _head_inputs(t, d, dtype, seed=77 * t + d)
    eps = (1e-5, 1e-3) if t == 5 else (1e-6, 1e-6)
    _check_mix(mhc_head_triton(x, fn, scale, base, *eps), mhc_head(x, fn, scale, base, *eps), x)


def test_head_strided_and_bad_shapes() -> None:
    """A non-contiguous x gives a contiguous result; t = 0 launches nothing; wrong fn / base / hc raise."""
    x, fn, scale, base = _head_inputs(5, 64, torch.bfloat16, seed=4)
    xs = x.transpose(1, 2).contiguous().transpose(1, 2)
    _check_mix(mhc_head_triton(xs, fn, scale, base), mhc_head(x, fn, scale, base), x)
    assert mhc_head_triton(x[:0], fn, scale, base).shape == (0, 64)
    with pytest.raises(ValueError, match="fn must have shape"):
        mhc_head_triton(x, fn[:, :-1], scale, base)
    with pytest.raises(ValueError, match="base"):
        mhc_head_triton(x, fn, scale, base[:-1])
    with pytest.raises(ValueError, match="power of two"):
        mhc_head_triton(*_head_inputs(1, 64, torch.float32, seed=0, hc=3))


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("t", [1, 7, 4096])
def test_gpu_head_v4_flash_shapes(t: int, dtype: torch.dtype) -> None:
    """V4-Flash head (hc=4, d=4096): against the fp32 reference at 2 * TOL (its own logit rounding, as for pre)."""
    x, fn, scale, base = _head_inputs(t, 4096, dtype, seed=t + 1)
    _check_mix(mhc_head_triton(x, fn, scale, base), mhc_head(x, fn, scale, base), x, tol=2 * TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_head_cuda_graph_replay() -> None:
    """The head launcher has no host sync either: capture, change x in place, replay, compare."""
    x, fn, scale, base = _head_inputs(64, 4096, torch.bfloat16, seed=8)
    mhc_head_triton(x, fn, scale, base)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = mhc_head_triton(x, fn, scale, base)
    x.copy_(_head_inputs(64, 4096, torch.bfloat16, seed=9)[0])
    graph.replay()
    torch.cuda.synchronize()
    _check_mix(got, mhc_head(x, fn, scale, base), x, tol=2 * TOL)
