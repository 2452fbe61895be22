"""pack_fp8_kv / unpack_fp8_kv: bytes against an independent quantiser, round-trip bounds from the format."""

from __future__ import annotations

import pytest
import torch

from deepinfer.flash_mla import api

NOPE, TILE, BYTES = 448, 64, 584


def _tile_scaled_input(n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """[n, 512] with every 64-dim tile at its own magnitude (2^-30 .. 2^30) plus random normal RoPE dims."""
    x = torch.randn(n, 512, generator=g)
    mags = 2.0 ** torch.randint(-30, 31, (n, 8), generator=g).float()
    return (x * mags.repeat_interleave(TILE, dim=1)).to(dtype)


def _scale_exponent(x: torch.Tensor) -> torch.Tensor:
    """ceil(log2(max(amax, 1e-4) * fp32(1/448))) per tile via frexp (not via IEEE bit fields). int64 [n, 7]."""
    amax = x.float()[:, :NOPE].reshape(-1, 7, TILE).abs().amax(-1).clamp_min(1e-4)
    prod = amax * torch.tensor(1 / 448, dtype=torch.float32)  # the fp32 product the format is defined on
    m, e = torch.frexp(prod)  # prod = m * 2^e with 0.5 <= m < 1
    return torch.where(m == 0.5, e - 1, e).long()


def _e4m3_codes(y: torch.Tensor) -> torch.Tensor:
    """Nearest e4m3 code of y (|y| <= 448), ties to the even code, found by searching the value grid."""
    grid = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()  # codes 0..126, ascending
    a = y.double().abs()
    hi = torch.searchsorted(grid, a).clamp(max=126)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    code = torch.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    return (code | (torch.signbit(y).long() << 7)).to(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pack_bytes_match_independent_quantiser(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(40 + (dtype == torch.float32))
    x = _tile_scaled_input(300, dtype, g)
    x[0, :TILE] = 1e-7 * torch.randn(TILE, generator=g)  # below the 1e-4 amax floor
    x[1, TILE : 2 * TILE] = 0.0  # an all-zero tile takes the floor too
    x[2, :NOPE] = 448 * 2.0 ** torch.randint(-3, 4, (1,), generator=g).float()  # amax exactly 448 * 2^k
    p = api.pack_fp8_kv(x)
    assert p.dtype == torch.uint8 and p.shape == (300, BYTES)
    e = _scale_exponent(x)
    assert torch.equal(p[:, 576:583].long(), e + 127)
    assert bool((p[:, 583] == 0).all())
    assert int(p[0, 576]) == 127 - 22  # ceil(log2(1e-4 / 448)) = -22
    y = x.float()[:, :NOPE].reshape(-1, 7, TILE) * torch.exp2(-e.double()).float()[..., None]
    assert torch.equal(p[:, :NOPE], _e4m3_codes(y.reshape(-1, NOPE)))
    assert torch.equal(p[:, NOPE:576], x[:, NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_roundtrip_error_bound(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(42 + (dtype == torch.float32))
    x = _tile_scaled_input(257, dtype, g)
    deq = api.unpack_fp8_kv(api.pack_fp8_kv(x), torch.float32).double()
    xd = x.double()
    scale = torch.exp2(_scale_exponent(x).double()).repeat_interleave(TILE, dim=1)
    err, ax = (deq[:, :NOPE] - xd[:, :NOPE]).abs(), xd[:, :NOPE].abs()
    normal = ax >= 2.0**-6 * scale  # e4m3 normal range: 4 significant bits, relative error <= 2^-4
    assert bool((err[normal] <= 2.0**-4 * ax[normal]).all())
    assert bool((err[~normal] <= 2.0**-10 * scale[~normal]).all())  # subnormal step 2^-9 * scale, half of it
    assert bool((deq[:, :NOPE].abs() <= 448 * scale).all())
    rope = x[:, NOPE:].to(torch.bfloat16).double()  # exact for bf16 input, one bf16 rounding for fp32
    assert torch.equal(deq[:, NOPE:], rope)
    assert (err > 0).any()  # the quantiser really quantised


def test_values_on_the_grid_roundtrip_exactly() -> None:
    """Dequantised values are a fixed point (the scale byte may drop by one when amax rounded down to 224*2^e)."""
    g = torch.Generator().manual_seed(44)
    x = _tile_scaled_input(64, torch.bfloat16, g)
    once = api.unpack_fp8_kv(api.pack_fp8_kv(x))
    assert once.dtype == torch.bfloat16
    twice_packed = api.pack_fp8_kv(once)
    assert torch.equal(api.unpack_fp8_kv(twice_packed), once)
    assert torch.equal(api.unpack_fp8_kv(twice_packed, torch.float32), once.float())


def test_nonfinite_tile_is_nan_only_there() -> None:
    g = torch.Generator().manual_seed(45)
    x = torch.randn(3, 512, generator=g)
    x[1, 70] = float("inf")
    x[2, 400] = float("nan")
    p = api.pack_fp8_kv(x)
    assert int(p[1, 576 + 1]) == 255 and int(p[2, 576 + 6]) == 255
    deq = api.unpack_fp8_kv(p, torch.float32)
    assert bool(deq[1, 64:128].isnan().all()) and bool(deq[2, 384:448].isnan().all())
    bad = torch.zeros(3, 512, dtype=torch.bool)
    bad[1, 64:128], bad[2, 384:448] = True, True
    assert bool(torch.isfinite(deq[~bad]).all())


def test_leading_dims_and_empty() -> None:
    g = torch.Generator().manual_seed(46)
    x = torch.randn(3, 5, 512, generator=g).bfloat16()
    p = api.pack_fp8_kv(x)
    assert p.shape == (3, 5, BYTES) and torch.equal(p.view(-1, BYTES), api.pack_fp8_kv(x.view(-1, 512)))
    assert api.unpack_fp8_kv(p).shape == (3, 5, 512)
    assert api.pack_fp8_kv(torch.zeros(0, 512)).shape == (0, BYTES)


def test_fp8_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="kv must have last dim 512"):
        api.pack_fp8_kv(torch.randn(4, 448))
    with pytest.raises(TypeError, match="kv"):
        api.pack_fp8_kv(torch.randn(4, 512).half())
    with pytest.raises(TypeError, match="packed"):
        api.unpack_fp8_kv(torch.zeros(4, 584, dtype=torch.int8))
    with pytest.raises(ValueError, match="packed must have last dim 584"):
        api.unpack_fp8_kv(torch.zeros(4, 576, dtype=torch.uint8))
    with pytest.raises(TypeError, match="dtype"):
        api.unpack_fp8_kv(torch.zeros(4, 584, dtype=torch.uint8), torch.float16)
