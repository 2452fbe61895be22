"""Triton mhc_post / mhc_head weighted sum vs the reference (CPU interpreter on small shapes; H200 on V4 shapes)."""

from __future__ import annotations

import os

import pytest
import torch

_INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
_CUDA = torch.cuda.is_available()
if not (_INTERP or _CUDA):
    pytest.skip("needs TRITON_INTERPRET=1 or a CUDA device", allow_module_level=True)

from deepinfer.tile_kernels.backends.cuda.triton_mhc_post import (  # noqa: E402
    mhc_post_triton,
    mhc_weighted_sum_triton,
)
from deepinfer.tile_kernels.ref import mhc as ref  # noqa: E402

DEV = "cuda" if _CUDA and not _INTERP else "cpu"


def _inputs(t: int, hc: int, d: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(t, d, generator=g).to(dtype).to(DEV)
    r = torch.randn(t, hc, d, generator=g).to(dtype).to(DEV)
    post = (torch.rand(t, hc, generator=g) * 2).to(DEV)
    comb = torch.softmax(torch.randn(t, hc, hc, generator=g), -1).to(DEV)
    return f, r, post, comb


def _ulps_ok(got: torch.Tensor, ref_out: torch.Tensor, exact: torch.Tensor) -> None:
    """Output within one rounding of the dtype (plus fp32 sum-order noise) of the fp64 value."""
    assert got.dtype == ref_out.dtype and got.shape == ref_out.shape
    assert torch.isfinite(got.float()).all()
    rel = {torch.float32: 2.0**-22, torch.bfloat16: 2.0**-7}[got.dtype]  # interpreter truncates bf16 casts
    err = (got.double() - exact).abs()
    assert (err <= rel * exact.abs() + 1e-6).all(), f"max err {err.max().item():.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "d"), [(3, 64), (5, 700)])
def test_mhc_post_matches_reference(t: int, d: int, dtype: torch.dtype) -> None:
    f, r, post, comb = _inputs(t, 4, d, dtype, seed=t * d)
    got = mhc_post_triton(f, r, post, comb)
    exact = torch.einsum("tij,tid->tjd", comb.double(), r.double()) + post.double()[:, :, None] * f.double()[:, None]
    _ulps_ok(got, ref.mhc_post(f, r, post, comb), exact)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_weighted_sum_matches_reference(dtype: torch.dtype) -> None:
    _, r, post, _ = _inputs(4, 4, 300, dtype, seed=9)
    got = mhc_weighted_sum_triton(r, post)
    exact = torch.einsum("ti,tid->td", post.double(), r.double())
    _ulps_ok(got, torch.einsum("ti,tid->td", post, r.float()).to(dtype), exact)


def test_rejects_non_power_of_two_streams() -> None:
    f, r, post, comb = _inputs(2, 3, 64, torch.float32, seed=1)
    with pytest.raises(ValueError, match="power of two"):
        mhc_post_triton(f, r, post, comb)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_gpu_mhc_post_v4_flash(t: int) -> None:
    f, r, post, comb = _inputs(t, 4, 4096, torch.bfloat16, seed=t)
    got = mhc_post_triton(f, r, post, comb)
    want = ref.mhc_post(f, r, post, comb)
    # Both evaluate the same 5 fp32 products and sums, in different orders and with or without fused
    # multiply-adds: they differ by at most ~6 fp32 roundings of the terms' magnitudes (which, where terms cancel,
    # can exceed an ulp of the result), and then each rounds once to bf16 (one bf16 ulp).
    mag = torch.einsum("tij,tid->tjd", comb.abs(), r.float().abs()) + post.abs()[:, :, None] * f.float().abs()[:, None]
    a = want.abs()
    ulp = torch.nextafter(a, torch.full_like(a, float("inf"))).float() - a.float()  # bf16 spacing above |want|
    assert ((got.float() - want.float()).abs() <= ulp + 8 * 2.0**-24 * mag).all()


@pytest.mark.gpu
def test_gpu_api_mhc_post_and_head_run_triton_and_match() -> None:
    from deepinfer import tile_kernels as tk

    f, r, post, comb = _inputs(64, 4, 4096, torch.bfloat16, seed=5)
    got = tk.mhc_post(f, r, post, comb)
    exact = torch.einsum("tij,tid->tjd", comb.double(), r.double()) + post.double()[:, :, None] * f.double()[:, None]
    assert ((got.double() - exact).abs() <= 2.0**-8 * exact.abs() + 1e-6).all()
    g = torch.Generator().manual_seed(6)
    fn = (torch.randn(4, 4 * 4096, generator=g) * 0.01).cuda()
    scale, base = torch.rand(1, generator=g).cuda(), torch.randn(4, generator=g).cuda()
    head = tk.mhc_head(r, fn, scale, base)  # hc = 4: triton_mhc's head kernels (own logits, ~fp32 exact)
    w = ref.mhc_head_weights(r, fn, scale, base).double()
    exact = torch.einsum("ti,tid->td", w, r.double())
    # the kernel's weights differ from the fp32 reference's by ~1e-6 (logit rounding, see test_mhc_triton):
    # 2e-5 * sum_i |x_i| covers that where the terms cancel
    slack = 2e-5 * r.double().abs().sum(1)
    assert ((head.double() - exact).abs() <= 2.0**-8 * exact.abs() + 1e-6 + slack).all()
