"""Triton softmax_pool (`backends/cuda/triton_pool.py`) and moe_route (`triton_route.py`) against `ref/`.

On CPU the kernels run in the Triton interpreter (TRITON_INTERPRET=1, set before the kernel modules load).
u = 2^-24 (fp32 unit roundoff). Both sides compute in fp32; they differ in exp / log / sqrt / division accuracy
(GPU: ex2.approx of a rounded x * log2(e), 2 ulp, so exp(x) is off by (2 + |x|) u relatively, and the rounding
of x - m adds |x - m| u) and in summation order (a sum of n positive terms: <= n u relatively).

* softmax_pool, per output: |d| <= 2 (6 + 2 R + 2 S) u * sum_s p_s |kv_s|, R = max_s |score_s - max| of the
  column, S = slots. Per side: p = e / sum(e) carries exp's (2 + 2R) u, the sum's S u and the division's 2u;
  the weighted sum adds u per product and S u for its order. Factor 2: both sides.
* moe_route scores (not returned, but they select and weight): per side relative (10 + 2|x|) u for
  sqrtsoftplus / sigmoid (exp, log or 1 + e and the division, sqrt halves), (10 + 2|x - max| + E) u for softmax;
  the selection value adds the bias with u |sel|. ids must equal the reference's wherever the reference's
  ordered selection values of the first topk + 1 are further apart than twice that bound; elsewhere (near-ties)
  the chosen values must match the reference's to within it. Weights (where ids match): a ratio of scores,
  relative 2 * max score error + (topk + 3) u.
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

from deepinfer.tile_kernels.ref.compressor import softmax_pool  # noqa: E402
from deepinfer.tile_kernels.ref.moe import moe_route, moe_scores  # noqa: E402


def _kernels(name: str):  # noqa: ANN202 (a module)
    mod = f"deepinfer.tile_kernels.backends.cuda.{name}"
    if not _CUDA and mod in sys.modules:
        importlib.reload(sys.modules[mod])
    return importlib.import_module(mod)


_POOL = _kernels("triton_pool")
softmax_pool_triton = _POOL.softmax_pool_triton
moe_route_triton = _kernels("triton_route").moe_route_triton

DEV = "cuda" if _CUDA else "cpu"
U = 2.0**-24
LOG2E = 1.0 / math.log(2.0)


def _randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(*shape, generator=g) * scale
    v = torch.where(v.abs() < 1e-3 * scale, torch.full_like(v, 1e-3 * scale), v)  # no exact zeros
    return v.to(dtype).to(DEV)


# ------------------------------------------------------------------------------------------------ softmax_pool


def _check_pool(got: torch.Tensor, kv: torch.Tensor, score: torch.Tensor) -> None:
    ref = softmax_pool(kv, score)
    assert got.dtype == torch.float32 and got.shape == ref.shape and got.is_contiguous()
    sc = score.float()
    p = torch.softmax(sc, dim=1)
    fin = torch.where(torch.isfinite(sc), sc, sc.amax(1, keepdim=True))
    r = (sc.amax(1) - fin.amin(1)).abs()
    bound = 2 * (6 + 2 * r + 2 * sc.shape[1]) * U * (p * kv.float().abs()).sum(1)
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan)
    err = (got - ref).abs()[~nan]
    assert (err <= bound[~nan]).all(), f"worst excess {(err - bound[~nan]).max().item():.3g}"


@pytest.mark.parametrize(("w", "s", "c"), [(3, 8, 64), (2, 128, 40), (5, 5, 33), (1, 1, 16)])
def test_pool_matches_reference(w: int, s: int, c: int) -> None:
    """V4's slot counts (8 with overlap, 128), an odd count and width, a single slot; scores ~N(0, 2^2)."""
    kv, score = _randn(w, s, c, seed=s), _randn(w, s, c, seed=s + 1, scale=2.0)
    out = torch.full((w, c), float("nan"), device=DEV)
    assert softmax_pool_triton(kv, score, out=out) is out
    _check_pool(out, kv, score)


def test_pool_padding_strides_and_dtypes() -> None:
    """The overlap layout: the first half of the slots padded (score -inf, kv 0) for some windows, a column all
    -inf (NaN on both sides); strided inputs (a transpose); bf16 inputs."""
    kv, score = _randn(4, 8, 32, seed=3), _randn(4, 8, 32, seed=4, scale=3.0)
    score[0, :4] = float("-inf")
    kv[0, :4] = 0.0
    score[1, :, 5] = float("-inf")
    _check_pool(softmax_pool_triton(kv, score), kv, score)
    kv_t = _randn(4, 32, 8, seed=5).transpose(1, 2)
    sc_t = _randn(4, 32, 8, seed=6).transpose(1, 2)
    _check_pool(softmax_pool_triton(kv_t, sc_t), kv_t, sc_t)
    kv_b, sc_b = kv_t.to(torch.bfloat16), sc_t.to(torch.bfloat16)
    _check_pool(softmax_pool_triton(kv_b, sc_b), kv_b, sc_b)


def test_pool_bad_inputs() -> None:
    kv = _randn(2, 4, 8, seed=7)
    with pytest.raises(ValueError, match="same shape"):
        softmax_pool_triton(kv, kv[:, :2])
    with pytest.raises(ValueError, match="windows, slots, c"):
        softmax_pool_triton(kv[0], kv[0])
    with pytest.raises(TypeError, match="kv must be"):
        softmax_pool_triton(kv.double(), kv)
    with pytest.raises(ValueError, match="out must be"):
        softmax_pool_triton(kv, kv, out=torch.empty(2, 8, dtype=torch.bfloat16, device=DEV))
    assert softmax_pool_triton(kv[:0], kv[:0]).shape == (0, 8)
    assert torch.equal(softmax_pool_triton(kv[:, :0], kv[:, :0]), softmax_pool(kv[:, :0], kv[:, :0]))


# --------------------------------------------------------------------------------------------------- moe_route


def _score_tol(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """Per-element bound on |score_kernel - score_ref| (both sides' errors, module docstring)."""
    x = logits.float()
    s = moe_scores(x, scoring)
    if scoring == "softmax":
        rel = 10 + 2 * (x - x.amax(-1, keepdim=True)).abs() + x.shape[-1]
    else:
        rel = 10 + 2 * x.abs()
    return 2 * rel * U * s.abs()


def _check_route(
    logits: torch.Tensor, bias: torch.Tensor | None, topk: int, scoring: str, scale: float, renorm: bool
) -> None:
    w, ids = moe_route_triton(logits, bias, topk, scoring, scale, renorm)
    w_ref, ids_ref = moe_route(logits, bias, topk, scoring, scale, renorm)
    assert w.dtype == torch.float32 and ids.dtype == torch.int64 and ids.shape == ids_ref.shape
    s = moe_scores(logits, scoring)
    sel = s if bias is None else s + bias.float()
    tol = _score_tol(logits, scoring) + U * sel.abs()
    top = torch.sort(sel, dim=-1, descending=True, stable=True)
    v = top.values[:, : topk + 1]
    t_v = tol.gather(1, top.indices[:, : topk + 1])
    gap_ok = ((v[:, :-1] - v[:, 1:]) > t_v[:, :-1] + t_v[:, 1:]).all(-1)  # no near-tie among the first topk + 1
    assert torch.equal(ids[gap_ok], ids_ref[gap_ok]), "ids differ where the selection is clear"
    if (~gap_ok).any():  # near-ties: the chosen selection values must be the reference's, within tolerance
        got_v = sel.gather(1, ids)[~gap_ok]
        want_v = sel.gather(1, ids_ref)[~gap_ok]
        assert ((got_v - want_v).abs() <= 2 * tol.amax(-1, keepdim=True)[~gap_ok]).all()
    rel = (tol / s.abs().clamp_min(1e-30)).gather(1, ids_ref).amax(-1, keepdim=True)
    bound = (2 * rel + (topk + 3) * U) * w_ref.abs()
    assert ((w - w_ref).abs()[gap_ok] <= bound[gap_ok]).all(), f"max weight err {(w - w_ref).abs().max():.3g}"


@pytest.mark.parametrize("scoring", ["sqrtsoftplus", "sigmoid", "softmax"])
@pytest.mark.parametrize(("t", "e", "k", "renorm"), [(5, 256, 6, True), (3, 64, 8, False), (4, 20, 1, True)])
def test_route_matches_reference(t: int, e: int, k: int, renorm: bool, scoring: str) -> None:
    """V4 (256 experts, top-6, bias, scale 1.5), k = 8 without renorm, odd E and k = 1; logits ~N(0, 3^2)."""
    logits = _randn(t, e, seed=e + k, scale=3.0)
    bias = _randn(e, seed=e, scale=0.1) if e != 20 else None
    _check_route(logits, bias, k, scoring, 1.5, renorm)


def test_route_ties_extremes_and_strides() -> None:
    """Exact ties pick the lower id (all-equal row; a duplicated value); logits far out (softplus threshold 20,
    exp underflow at -100); a strided bf16 logits view."""
    logits = _randn(4, 32, seed=11, scale=2.0)
    logits[0] = 0.5
    logits[1, 7] = logits[1, 3] = logits[1].max() + 1
    logits[2, :8] = torch.tensor([25.0, 19.5, 20.5, -100.0, -30.0, 60.0, 0.0, -0.0])
    w, ids = moe_route_triton(logits, None, 4)
    assert ids[0].tolist() == [0, 1, 2, 3]
    assert ids[1, :2].tolist() == [3, 7]
    _check_route(logits, None, 4, "sqrtsoftplus", 1.0, True)
    lt = _randn(48, 3, seed=12, scale=3.0, dtype=torch.bfloat16).t()  # [3, 48], stride (1, 3)
    _check_route(lt, _randn(48, seed=13, scale=0.1, dtype=torch.bfloat16), 6, "sigmoid", 2.5, True)


def test_route_bad_inputs() -> None:
    logits = _randn(2, 16, seed=14)
    with pytest.raises(ValueError, match="topk"):
        moe_route_triton(logits, None, 17)
    with pytest.raises(ValueError, match="scoring"):
        moe_route_triton(logits, None, 2, "relu")
    with pytest.raises(ValueError, match="bias"):
        moe_route_triton(logits, logits[0, :8], 2)
    w, ids = moe_route_triton(logits[:0], None, 2)
    assert w.shape == (0, 2) and ids.shape == (0, 2)


# --------------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_gpu_v4_flash_shapes(t: int) -> None:
    """Pooling: CSA [t/4, 8, 512] with padded first halves (default and the benchmark config bc512_w4, a candidate
    default), HCA [t/128, 128, 512]; routing: [t, 256] logits in all three scorings with bias, top-6, scale 1.5."""
    w4 = max(1, t // 4)
    kv, score = _randn(w4, 8, 512, seed=t), _randn(w4, 8, 512, seed=t + 1, scale=2.0)
    score[::3, :4] = float("-inf")
    kv[::3, :4] = 0.0
    _check_pool(softmax_pool_triton(kv, score), kv, score)
    _check_pool(softmax_pool_triton(kv, score, block_c=512, num_warps=4), kv, score)
    w128 = max(1, t // 128)
    kv, score = _randn(w128, 128, 512, seed=t + 2), _randn(w128, 128, 512, seed=t + 3, scale=2.0)
    _check_pool(softmax_pool_triton(kv, score), kv, score)
    logits, bias = _randn(t, 256, seed=t + 4, scale=3.0), _randn(256, seed=t + 5, scale=0.1)
    for scoring in ("sqrtsoftplus", "sigmoid", "softmax"):
        _check_route(logits, bias, 6, scoring, 1.5, True)


def test_pool_default_warps() -> None:
    """Round-2 default: at most 4 warps for windows of >= 64 slots (H200 round 1, HCA: 4 warps 1.10x over 8)."""
    assert _POOL._warps(128, 32) == 4
    assert _POOL._warps(8, 512) == 8
    assert _POOL._warps(2, 16) == 1
    # session 5's size rule: CSA [W, 8, 512] at most 4 warps from FEW_WARPS_WINDOWS (1,024) windows up
    assert _POOL.FEW_WARPS_WINDOWS == 1024
    assert [_POOL._warps(8, 512, w) for w in (1, 16, 1023, 1024, 4096)] == [8, 8, 8, 4, 4]
    assert _POOL._warps(128, 32, 1) == 4 and _POOL._warps(2, 16, 4096) == 1
