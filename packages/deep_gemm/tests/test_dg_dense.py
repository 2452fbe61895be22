"""bf16_gemm_nt, fp8_gemm_nt / fp8_fp4_gemm_nt and the dequant helpers against a float64 oracle."""

from __future__ import annotations

import pytest
import torch
from dg_testing import (
    FP8,
    act64,
    assert_gemm_close,
    e2m1_64,
    gen,
    rand_float,
    rand_fp4,
    rand_fp8,
    rand_scales,
    weight64,
)

from deepinfer.deep_gemm import api, dequant


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m,n,k", [(0, 64, 128), (1, 96, 256), (77, 200, 160), (130, 64, 384)])
@pytest.mark.parametrize("with_c", [False, True])
def test_bf16_gemm_nt(dtype: torch.dtype, m: int, n: int, k: int, with_c: bool) -> None:
    g = gen(m * 7 + n + k + int(with_c))
    a, b = rand_float((m, k), dtype, g), rand_float((n, k), dtype, g)
    c = rand_float((m, n), torch.float32, g) if with_c else None
    out = torch.full((m, n), float("nan"), dtype=dtype)  # poisoned: every element must be written
    res = api.bf16_gemm_nt(a, b, out, c)
    assert res is out
    ref = a.double() @ b.double().T + (c.double() if c is not None else 0)
    assert_gemm_close(out, ref, a.double().abs() @ b.double().abs().T + (c.double().abs() if with_c else 0), k)


def test_bf16_gemm_nt_allocates_matching_dtype() -> None:
    g = gen(1)
    for dtype in (torch.bfloat16, torch.float32):
        a, b = rand_float((5, 64), dtype, g), rand_float((9, 64), dtype, g)
        assert api.bf16_gemm_nt(a, b).dtype == dtype
    a, b = rand_float((5, 64), torch.bfloat16, g), rand_float((9, 64), torch.bfloat16, g)
    out = api.bf16_gemm_nt(a, b, torch.empty(5, 9))  # bf16 in, float32 out is allowed
    assert_gemm_close(out, a.double() @ b.double().T, a.double().abs() @ b.double().abs().T, 64)


@pytest.mark.parametrize("m,n,k", [(0, 128, 256), (1, 200, 320), (130, 256, 256), (200, 72, 130)])
@pytest.mark.parametrize("e8m0", [False, True])
def test_fp8_gemm_nt(m: int, n: int, k: int, e8m0: bool) -> None:
    g = gen(m + n * 3 + k + int(e8m0))
    a, sfa = rand_fp8((m, k), g), rand_scales((m, -(-k // 128)), g, e8m0)
    b, sfb = rand_fp8((n, k), g), rand_scales((-(-n // 128), -(-k // 128)), g, e8m0)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    assert api.fp8_gemm_nt((a, sfa), (b, sfb), out) is out
    a64, b64 = act64(a, sfa), weight64(b, sfb)
    assert_gemm_close(out, a64 @ b64.T, a64.abs() @ b64.abs().T, k, diff_limit=1e-3)


@pytest.mark.parametrize("m", [0, 3, 131])
def test_fp8_fp4_gemm_nt_with_c(m: int) -> None:
    n, k = 96, 256
    g = gen(100 + m)
    a, sfa = rand_fp8((m, k), g), rand_scales((m, k // 128), g, True)
    b, sfb = rand_fp4((n, k // 2), g), rand_scales((n, k // 32), g, True)
    c = rand_float((m, n), torch.float32, g)
    out = api.fp8_fp4_gemm_nt((a, sfa), (b, sfb), torch.full((m, n), float("nan")), c)
    a64, b64 = act64(a, sfa), weight64(b, sfb)
    ref = a64 @ b64.T + c.double()
    assert_gemm_close(out, ref, a64.abs() @ b64.abs().T + c.double().abs(), k, diff_limit=1e-3)


def test_c_may_alias_out() -> None:
    g = gen(5)
    a, sfa = rand_fp8((33, 128), g), rand_scales((33, 1), g, False)
    b, sfb = rand_fp8((40, 128), g), rand_scales((1, 1), g, False)
    c = rand_float((33, 40), torch.float32, g)
    c0 = c.double()
    api.fp8_gemm_nt((a, sfa), (b, sfb), c, c)
    a64, b64 = act64(a, sfa), weight64(b, sfb)
    assert_gemm_close(c, a64 @ b64.T + c0, a64.abs() @ b64.abs().T + c0.abs(), 128)


def test_unpack_fp4_all_bytes() -> None:
    packed = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8)
    u = packed.view(torch.uint8).long()
    want = torch.stack((e2m1_64(u & 15), e2m1_64(u >> 4)), dim=-1).flatten()
    got = dequant.unpack_fp4(packed)
    assert got.dtype == torch.float32 and torch.equal(got.double(), want)


def test_dequant_scales_e8m0_exact() -> None:
    g = gen(9)
    sf = rand_scales((4, 3), g, True)
    b = rand_fp8((300, 300), g)
    assert torch.equal(dequant.dequant_fp8_weight(b, sf).double(), weight64(b, sf))


def _ok_fp8(m: int = 4, n: int = 8, k: int = 128) -> tuple[tuple, tuple]:
    g = gen(3)
    a = (rand_fp8((m, k), g), rand_scales((m, -(-k // 128)), g, False))
    b = (rand_fp8((n, k), g), rand_scales((-(-n // 128), -(-k // 128)), g, False))
    return a, b


def test_bf16_gemm_nt_bad_input() -> None:
    g = gen(4)
    a, b = rand_float((4, 64), torch.bfloat16, g), rand_float((8, 64), torch.bfloat16, g)
    with pytest.raises(TypeError, match="a: expected dtype"):
        api.bf16_gemm_nt(a.half(), b)
    with pytest.raises(TypeError, match="share a dtype"):
        api.bf16_gemm_nt(a, b.float())
    with pytest.raises(ValueError, match="K mismatch"):
        api.bf16_gemm_nt(a, b[:, :32].contiguous())
    with pytest.raises(ValueError, match="b: expected a contiguous"):
        api.bf16_gemm_nt(a, rand_float((64, 8), torch.bfloat16, g).T)
    with pytest.raises(ValueError, match="out: expected shape"):
        api.bf16_gemm_nt(a, b, torch.empty(4, 9, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="out: expected dtype"):
        api.bf16_gemm_nt(a.float(), b.float(), torch.empty(4, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="one device"):
        api.bf16_gemm_nt(a, b.to("meta"))


def test_fp8_gemm_nt_bad_input() -> None:
    a, b = _ok_fp8()
    with pytest.raises(TypeError, match="a: expected a"):
        api.fp8_gemm_nt(a[0], b)
    with pytest.raises(TypeError, match="a: expected dtype"):
        api.fp8_gemm_nt((a[0].float(), a[1]), b)
    with pytest.raises(ValueError, match="a scales: expected shape"):
        api.fp8_gemm_nt((a[0], a[1][:, :0]), b)
    with pytest.raises(TypeError, match="b scales: expected dtype"):
        api.fp8_gemm_nt(a, (b[0], b[1].half()))
    with pytest.raises(ValueError, match="K mismatch"):
        api.fp8_gemm_nt(a, _ok_fp8(k=256)[1])
    with pytest.raises(ValueError, match="FP4 weights need K % 32"):
        api.fp8_gemm_nt(a, (torch.zeros(8, 24, dtype=torch.int8), torch.ones(8, 1)))
    with pytest.raises(ValueError, match="b scales: expected shape"):
        api.fp8_gemm_nt(a, (torch.zeros(8, 64, dtype=torch.int8), torch.ones(1, 1)))
    with pytest.raises(ValueError, match="c: expected shape"):
        api.fp8_gemm_nt(a, b, None, torch.zeros(4, 7))
    assert a[0].dtype == FP8  # the happy path still works with the same operands
    assert api.fp8_gemm_nt(a, b).shape == (4, 8)
