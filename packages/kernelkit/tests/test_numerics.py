"""kernelkit.numerics: diff metrics, norm-relative asserts, poisoning and format-derived tolerances."""

from __future__ import annotations

import math
import secrets

import pytest
import torch

from kernelkit import (
    accum_tol,
    assert_close_rel,
    calc_diff,
    format_eps,
    poison_,
    poison_like,
    poisoned_mask,
    rel_err,
    rounding_tol,
    unit_roundoff,
)


@pytest.fixture
def gen() -> torch.Generator:
    """A fresh seed per test (printed, so a failure can be replayed)."""
    seed = secrets.randbits(63)
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


def test_calc_diff_equals_squared_distance_ratio(gen: torch.Generator) -> None:
    # 1 - 2<x,y>/(|x|^2+|y|^2) == |x-y|^2/(|x|^2+|y|^2): an independent form of the same quantity.
    x = torch.randn(64, 48, generator=gen, dtype=torch.float64)
    y = x + 1e-2 * torch.randn(64, 48, generator=gen, dtype=torch.float64)
    expect = float(((x - y) ** 2).sum() / ((x * x).sum() + (y * y).sum()))
    # The 1 - (...) form cancels: absolute error ~ 1e-16, relative ~ 1e-16 / expect.
    assert calc_diff(x, y) == pytest.approx(expect, rel=1e-9)
    assert calc_diff(x, x) == pytest.approx(0.0, abs=1e-15)


def test_calc_diff_accumulates_in_float64(gen: torch.Generator) -> None:
    x = torch.randn(4096, generator=gen).to(torch.bfloat16)
    y = (x.double() * (1 + 2**-9 * torch.randn(4096, generator=gen, dtype=torch.float64))).to(torch.bfloat16)
    xd, yd = x.double(), y.double()
    expect = float(((xd - yd) ** 2).sum() / ((xd * xd).sum() + (yd * yd).sum()))
    assert expect > 0
    assert calc_diff(x, y) == pytest.approx(expect, rel=1e-8)


def test_calc_diff_bad_input() -> None:
    with pytest.raises(ValueError, match="y: expected shape"):
        calc_diff(torch.ones(3), torch.ones(4))
    with pytest.raises(TypeError, match="x: expected torch.Tensor"):
        calc_diff([1.0], torch.ones(1))  # type: ignore[arg-type]
    assert calc_diff(torch.zeros(5), torch.zeros(5)) == 0.0


def test_bf16_rounding_is_within_bf16_tolerance_not_fp16(gen: torch.Generator) -> None:
    ref = torch.randn(256, 64, generator=gen)
    out = ref.to(torch.bfloat16)
    err = assert_close_rel(out, ref, rounding_tol("bf16", safety=1.0))
    assert 0 < err <= unit_roundoff("bf16")
    with pytest.raises(AssertionError, match="relative error"):
        assert_close_rel(out, ref, rounding_tol("fp16", safety=1.0))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_assert_close_rel_rejects_non_finite(gen: torch.Generator, bad: float) -> None:
    ref = torch.randn(32, generator=gen)
    out = ref.clone()
    out[int(torch.randint(0, 32, (), generator=gen))] = bad
    with pytest.raises(AssertionError, match="non-finite values in out"):
        assert_close_rel(out, ref, 1e6)
    with pytest.raises(AssertionError, match="non-finite values in ref"):
        assert_close_rel(ref, out, 1e6)


def test_assert_close_rel_reports_location_and_bad_args(gen: torch.Generator) -> None:
    ref = torch.randn(8, 16, generator=gen)
    out = ref.clone()
    out[3, 5] += 100.0
    with pytest.raises(AssertionError, match=r"at \(3, 5\)"):
        assert_close_rel(out, ref, 1e-3, name="attn_out")
    with pytest.raises(AssertionError, match="shape"):
        assert_close_rel(ref[:4], ref, 1e-3)
    for rtol in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="rtol_norm"):
            assert_close_rel(ref, ref, rtol)
    assert rel_err(torch.ones(3), torch.zeros(3)) == math.inf


def test_fp32_dot_products_within_accum_tol(gen: torch.Generator) -> None:
    k = 2048
    a = torch.randn(32, k, generator=gen, dtype=torch.float64)
    b = torch.randn(k, 16, generator=gen, dtype=torch.float64)
    ref = a @ b
    out = a.float() @ b.float()  # inputs rounded to fp32 once (2u) plus fp32 accumulation
    assert rel_err(out, ref) <= accum_tol(k, "fp32") + 2 * rounding_tol("fp32")


def test_format_eps_matches_finfo() -> None:
    for name, dtype in [
        ("bf16", torch.bfloat16),
        ("fp16", torch.float16),
        ("fp32", torch.float32),
        ("e4m3", torch.float8_e4m3fn),
        ("e5m2", torch.float8_e5m2),
    ]:
        assert format_eps(name) == torch.finfo(dtype).eps
        assert format_eps(dtype) == torch.finfo(dtype).eps
    assert format_eps("fp8") == format_eps("e4m3")
    assert format_eps("fp4") == 0.5  # e2m1: 1.0 -> 1.5
    with pytest.raises(ValueError, match="fmt: expected one of"):
        format_eps("int8")
    with pytest.raises(ValueError, match="roundings"):
        rounding_tol("bf16", roundings=0)
    with pytest.raises(ValueError, match="k: expected"):
        accum_tol(0)


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu],
)
def test_poison_floats_are_nan(gen: torch.Generator, dtype: torch.dtype) -> None:
    t = torch.randn(6, 10, generator=gen).abs().add(0.5).to(dtype)
    p = poison_like(t)
    assert p.shape == t.shape and p.dtype == dtype
    assert torch.isnan(p.float()).all()
    assert poisoned_mask(p).all()
    assert not poisoned_mask(t).any()


@pytest.mark.parametrize(
    ("dtype", "fill"), [(torch.int32, -1), (torch.int64, -1), (torch.uint8, 255), (torch.int8, -1), (torch.bool, True)]
)
def test_poison_integers_are_all_ones(dtype: torch.dtype, fill: int) -> None:
    p = poison_like(torch.empty(7, 3, dtype=dtype))
    assert (p == fill).all()
    assert poisoned_mask(p).all()


def test_poison_in_place_on_a_strided_view(gen: torch.Generator) -> None:
    base = torch.randn(8, 6, generator=gen)
    view = base.t()[:, ::2]
    assert poison_(view) is view
    assert torch.isnan(base[::2]).all() and not torch.isnan(base[1::2]).any()
    with pytest.raises(TypeError, match="t: expected torch.Tensor"):
        poison_like(3.0)  # type: ignore[arg-type]
