"""Random-input and property tests of the FP8/FP4 quantisers, the Hadamard transform and the weight formats.

Rounding is checked against brute-force nearest-grid oracles built in float64 from the format's value
tables, so torch's own casts are tested too (not only reused).
"""

from __future__ import annotations

import math

import pytest
import torch

from deepinfer.tile_kernels.api_quant import (
    dequant_fp8_block,
    fp4_pack,
    fp4_quant_dequant_ue8m0,
    fp4_quant_ue8m0,
    fp8_block_quant,
    fp8_quant_dequant_ue8m0,
    fp8_quant_ue8m0,
    hadamard_transform,
    per_token_group_quant_fp8,
    unpack_fp4,
)

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
E4M3 = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()  # all finite >= 0, ascending


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _blocky(shape: tuple[int, ...], block: int, seed: int) -> torch.Tensor:
    """Gaussian values whose blocks differ in size by up to 2^+-12, so each block picks its own scale."""
    g = _gen(seed)
    x = torch.randn(shape, generator=g)
    mag = torch.exp2(torch.randint(-12, 13, (*shape[:-1], shape[-1] // block, 1), generator=g).float())
    return (x.view(*shape[:-1], -1, block) * mag).view(shape)


def _nearest_even(y: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Round |y| (float64) to the ascending grid, ties to the even grid index, keep sign; saturate."""
    a = y.abs().clamp(max=grid[-1].item())
    hi = torch.searchsorted(grid, a).clamp(1, len(grid) - 1)
    lo = hi - 1
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    pick = torch.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    return torch.where(torch.signbit(y), -grid[pick], grid[pick])


def _oracle_exp(amax: torch.Tensor, fmt_max: float, floor: float) -> torch.Tensor:
    """Smallest e with amax_floored / 2^e <= fmt_max, in float64 (equal to the fp32-bits rule off ties)."""
    return torch.ceil(torch.log2(amax.double().clamp_min(floor) / fmt_max)).to(torch.int32)


def test_fp8_matches_nearest_even_oracle() -> None:
    x = _blocky((64, 256), 64, seed=1)
    q, e = fp8_quant_ue8m0(x, block=64)
    amax = x.view(64, 4, 64).abs().amax(-1)
    assert torch.equal(e, _oracle_exp(amax, 448.0, 1e-4))
    y = x.double().view(64, 4, 64) / torch.exp2(e.double()).unsqueeze(-1)
    assert torch.equal(q.double().view(64, 4, 64), _nearest_even(y, E4M3))
    deq = fp8_quant_dequant_ue8m0(x, block=64)
    assert torch.equal(deq.double().view(64, 4, 64), q.double().view(64, 4, 64) * torch.exp2(e.double()).unsqueeze(-1))


def test_fp4_matches_nearest_even_oracle() -> None:
    x = _blocky((48, 128), 32, seed=2)
    codes, e = fp4_quant_ue8m0(x, block=32)
    amax = x.view(48, 4, 32).abs().amax(-1)
    assert torch.equal(e, _oracle_exp(amax, 6.0, 6.0 * 2.0**-126))
    y = x.double().view(48, 4, 32) / torch.exp2(e.double()).unsqueeze(-1)
    want = _nearest_even(y, E2M1)
    sign = torch.where(codes >= 8, -1.0, 1.0).double()
    got = sign * E2M1[(codes & 7).long()]
    assert torch.equal(got.view(48, 4, 32), want)
    assert torch.equal(codes >= 8, torch.signbit(x))  # sign kept, also where the value rounds to zero


def test_exact_grid_ties_round_to_even() -> None:
    # In a block with amax 448 (scale 2^0) these are exact midpoints between e4m3 neighbours.
    ties = torch.tensor([448.0, 1.0625, 1.1875, 248.0, 2.0**-10, 3 * 2.0**-10, 5 * 2.0**-10, -1.0625])
    want = torch.tensor([448.0, 1.0, 1.25, 256.0, 0.0, 2.0**-8, 2.0**-8, -1.0])
    assert torch.equal(fp8_quant_dequant_ue8m0(ties, block=8), want)
    ties4 = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0])
    want4 = torch.tensor([6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -4.0])
    got4 = fp4_quant_dequant_ue8m0(ties4, block=10)
    assert torch.equal(got4, want4) and bool(torch.signbit(got4[8]))


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
def test_rounding_is_unbiased(fmt: str) -> None:
    n = 1 << 16
    g = _gen(3)
    # Values spread over the whole grid of one fixed scale: each block starts with its amax element.
    fmt_max, grid, block = (448.0, E4M3, 64) if fmt == "fp8" else (6.0, E2M1, 32)
    x = (
        torch.rand(n // block, block, generator=g, dtype=torch.float64).mul(fmt_max)
        * torch.where(torch.rand(n // block, block, generator=g) < 0.5, -1.0, 1.0).double()
    )
    x[:, 0] = fmt_max
    x = x.float()
    out = (fp8_quant_dequant_ue8m0 if fmt == "fp8" else fp4_quant_dequant_ue8m0)(x, block=block).double()
    a = x.double().abs()
    idx = torch.searchsorted(grid, a).clamp(1, len(grid) - 1)
    step = grid[idx] - grid[idx - 1]  # local grid spacing around each value
    err = (out - x.double()) * torch.sign(x.double()) / step
    assert err.abs().max() <= 0.5
    # Unbiased rounding: mean error ~ 0 within 6 standard errors (uniform error on [-.5, .5] has sd 0.29).
    assert abs(err.mean().item()) <= 6 * 0.29 / math.sqrt(n)


def test_zero_blocks_and_floors() -> None:
    x = torch.randn(2, 128, generator=_gen(4))
    x[0, 64:] = 0.0
    x[1, :32] = -0.0
    q, e = fp8_quant_ue8m0(x, block=64)
    # amax floor 1e-4: ceil(log2(1e-4 / 448)) = -22
    assert int(e[0, 1]) == -22 and bool((q[0, 64:].float() == 0).all())
    codes, e4 = fp4_quant_ue8m0(x, block=32)
    assert int(e4[1, 0]) == -126 and bool((codes[1, :32] == 8).all())  # -0 keeps its sign: code 8
    assert int(e4[0, 2]) == -126 and bool((codes[0, 64:96] == 0).all())
    tiny = torch.randn(64, generator=_gen(5)) * 1e-7  # below the FP8 floor: scale 2^-22, most values flush
    assert int(fp8_quant_ue8m0(tiny, block=64)[1][0]) == -22


@pytest.mark.parametrize("magnitude", [1e30, 1.0e38])
def test_huge_values_stay_finite(magnitude: float) -> None:
    # (Within ~15 % of fp32's max a value can round up to 2^128 = inf on dequantisation; documented.)
    x = (torch.rand(4, 64, generator=_gen(6)) * 2 - 1) * magnitude
    x[:, 0] = magnitude
    for fn, rel in ((fp8_quant_dequant_ue8m0, 2.0**-4), (fp4_quant_dequant_ue8m0, 0.5)):
        out = fn(x, block=32)
        assert bool(torch.isfinite(out).all())
        assert ((out.double() - x.double()).abs() <= rel * x.double().abs().amax(-1, keepdim=True)).all()


def test_nan_block_propagates_only_within_block() -> None:
    x = torch.randn(2, 128, generator=_gen(7))
    x[0, 5] = float("nan")
    x[1, 100] = float("inf")
    for fn, blk in ((fp8_quant_dequant_ue8m0, 64), (fp4_quant_dequant_ue8m0, 32)):
        out = fn(x, block=blk)
        bad = torch.zeros_like(x, dtype=torch.bool)
        bad[0, :blk] = True
        bad[1, 100 // blk * blk : (100 // blk + 1) * blk] = True
        assert torch.equal(torch.isnan(out), bad)
    assert int(fp8_quant_ue8m0(x, block=64)[1][0, 0]) == 128


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype: torch.dtype) -> None:
    x = torch.randn(3, 128, generator=_gen(8)).to(dtype)
    for fn in (fp8_quant_dequant_ue8m0, fp4_quant_dequant_ue8m0):
        out = fn(x)
        assert out.dtype == dtype and out.shape == x.shape
        assert torch.equal(out, fn(x.float()).to(dtype))


def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


@pytest.mark.parametrize("n", [1, 2, 16, 128])
def test_hadamard_matches_matrix(n: int) -> None:
    x = torch.randn(5, 3, n, generator=_gen(9))
    want = x.double() @ _sylvester(n).T / math.sqrt(n)
    got = hadamard_transform(x)
    tol = 4 * math.log2(max(n, 2)) * torch.finfo(torch.float32).eps * x.abs().amax().item() * math.sqrt(n)
    assert got.dtype == torch.float32 and (got.double() - want).abs().max() <= tol
    back = hadamard_transform(got)  # orthonormal and symmetric: H H = I
    assert (back - x).abs().max() <= 2 * tol
    scaled = hadamard_transform(x.to(torch.bfloat16), scale=1.0)
    assert scaled.dtype == torch.bfloat16
    ref = x.to(torch.bfloat16).double() @ _sylvester(n).T
    assert ((scaled.double() - ref).abs() <= 2.0**-8 * ref.abs() + 1e-6).all()


def test_per_token_group_quant_fp8() -> None:
    x = _blocky((16, 384), 128, seed=10)
    q, s = per_token_group_quant_fp8(x, group_size=128)
    q64, e = fp8_quant_ue8m0(x, block=128)
    assert s.dtype == torch.float32 and s.shape == (16, 3)
    assert torch.equal(s, torch.exp2(e.float())) and torch.equal(q.view(torch.uint8), q64.view(torch.uint8))
    qf, sf = per_token_group_quant_fp8(x, group_size=128, scale_fmt="fp32")
    amax = x.view(16, 3, 128).abs().amax(-1)
    assert torch.allclose(sf, amax / 448.0, rtol=torch.finfo(torch.float32).eps, atol=0)
    deq = qf.float().view(16, 3, 128) * sf.unsqueeze(-1)
    # e4m3 has 3 mantissa bits: half a step is at most 2^-4 relative (subnormals: 2^-10 of the scale).
    bound = torch.maximum(x.view(16, 3, 128).abs() * 2.0**-4, sf.unsqueeze(-1) * 2.0**-10) * (1 + 1e-6)
    assert ((deq - x.view(16, 3, 128)).abs() <= bound).all()
    assert torch.equal(qf.float().view(16, 3, 128).abs().amax(-1), torch.full((16, 3), 448.0))


@pytest.mark.parametrize("scale_fmt", ["ue8m0", "fp32"])
def test_fp8_block_quant_ragged(scale_fmt: str) -> None:
    g = _gen(11)
    w = torch.randn(200, 300, generator=g)
    w[128:, :] *= 64.0  # block rows differ, so a transposed scale grid is caught
    w[:, 256:] *= 2.0**-6
    q, scale = fp8_block_quant(w, block=(128, 128), scale_fmt=scale_fmt)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape and scale.shape == (2, 3)
    assert scale.dtype == (torch.float8_e8m0fnu if scale_fmt == "ue8m0" else torch.float32)
    for i in range(2):
        for j in range(3):
            blk = w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
            amax = blk.abs().amax()
            if scale_fmt == "ue8m0":
                assert scale[i, j].float() == 2.0 ** _oracle_exp(amax, 448.0, 1e-4).item()
            else:
                assert torch.allclose(scale[i, j], amax / 448.0, rtol=1e-7, atol=0)
    deq = dequant_fp8_block(q, scale, block=(128, 128))
    s_full = scale.float().repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :300]
    bound = torch.maximum(w.abs() * 2.0**-4, s_full * 2.0**-10) * (1 + 1e-6)
    assert deq.dtype == torch.float32 and ((deq - w).abs() <= bound).all()
    assert dequant_fp8_block(q, scale, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_fp4_pack_unpack_round_trip() -> None:
    g = _gen(12)
    n, k = 8, 128
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    codes[:, ::32] = 7  # each block holds +6, so re-quantising re-derives the same scale
    e = torch.randint(-20, 20, (n, k // 32), generator=g, dtype=torch.int32)
    vals = torch.cat((E2M1, -E2M1)).float()[codes.long()]
    w = (vals.view(n, -1, 32) * torch.exp2(e.float()).unsqueeze(-1)).view(n, k)
    packed, scale = fp4_pack(w)
    assert packed.dtype == torch.int8 and packed.shape == (n, k // 2) and scale.dtype == torch.float8_e8m0fnu
    assert torch.equal(packed.view(torch.uint8), codes[:, 0::2] | (codes[:, 1::2] << 4))  # low nibble = 2j
    assert torch.equal(scale.view(torch.uint8).int(), e + 127)
    out = unpack_fp4(packed, scale)
    assert torch.equal(out, w) and torch.equal(torch.signbit(out), torch.signbit(w))
    assert torch.equal(unpack_fp4(packed.view(torch.uint8), scale.float()), w)


def test_bad_arguments_raise_clear_errors() -> None:
    x = torch.randn(4, 96, generator=_gen(13))
    with pytest.raises(ValueError, match="block"):
        fp8_quant_ue8m0(x, block=64)
    with pytest.raises(TypeError, match="x"):
        fp4_quant_ue8m0(x.to(torch.int32))
    with pytest.raises(ValueError, match="power of two"):
        hadamard_transform(x)
    with pytest.raises(ValueError, match="scale_fmt"):
        per_token_group_quant_fp8(x, group_size=32, scale_fmt="e8m0")
    with pytest.raises(ValueError, match="finite"):
        fp8_block_quant(torch.full((4, 4), float("inf")))
    q, s = fp8_block_quant(x, block=(2, 32))
    with pytest.raises(ValueError, match="scale: expected shape"):
        dequant_fp8_block(q, s, block=(4, 32))
    with pytest.raises(ValueError, match="even"):
        fp4_pack(torch.randn(2, 3, generator=_gen(14)), block=3)
    with pytest.raises(ValueError, match="scale: expected shape"):
        unpack_fp4(torch.zeros(2, 16, dtype=torch.int8), torch.ones(2, 2))
