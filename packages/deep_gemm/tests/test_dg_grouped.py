"""M-grouped (contiguous / masked) MoE GEMMs and the grouped attention output projection vs float64."""

from __future__ import annotations

import pytest
import torch
from dg_testing import act64, assert_gemm_close, gen, rand_float, rand_fp4, rand_fp8, rand_scales, weight64

from deepinfer.deep_gemm import api

G, N, K = 4, 192, 256


def _weights(fp4: bool, e8m0: bool, g: torch.Generator, groups: int = G) -> tuple[torch.Tensor, torch.Tensor]:
    if fp4:
        return rand_fp4((groups, N, K // 2), g), rand_scales((groups, N, K // 32), g, True)
    return rand_fp8((groups, N, K), g), rand_scales((groups, -(-N // 128), K // 128), g, e8m0)


def _acts(lead: tuple[int, ...], e8m0: bool, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return rand_fp8((*lead, K), g), rand_scales((*lead, K // 128), g, e8m0)


@pytest.mark.parametrize("fp4", [False, True])
@pytest.mark.parametrize("e8m0", [False, True])
@pytest.mark.parametrize("m", [0, 1, 300])
def test_contiguous(fp4: bool, e8m0: bool, m: int) -> None:
    g = gen(m + 10 * fp4 + 20 * e8m0)
    a, sfa = _acts((m,), e8m0, g)
    b, sfb = _weights(fp4, e8m0, g)
    # Expert 2 gets no rows; about a fifth of the rows are padding (-1).
    ids = torch.tensor([0, 1, 3, -1, 0], dtype=torch.int32)[torch.randint(0, 5, (m,), generator=g)]
    out = torch.full((m, N), float("nan"), dtype=torch.bfloat16)
    assert api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), out, ids) is out
    a64, w64 = act64(a, sfa), weight64(b, sfb)
    ref = torch.zeros(m, N, dtype=torch.float64)
    mag = torch.zeros(m, N, dtype=torch.float64)
    for e in range(G):
        rows = ids == e
        ref[rows] = a64[rows] @ w64[e].T
        mag[rows] = a64[rows].abs() @ w64[e].abs().T
    assert_gemm_close(out, ref, mag, K, diff_limit=1e-3)
    assert torch.equal(out[ids == -1], torch.zeros_like(out[ids == -1]))  # padding rows are zeroed


def test_contiguous_alias_and_fp32_out() -> None:
    g = gen(77)
    a, sfa = _acts((50,), True, g)
    b, sfb = _weights(True, True, g)
    ids = torch.randint(0, G, (50,), generator=g, dtype=torch.int32)
    out = api.m_grouped_fp8_fp4_gemm_nt_contiguous((a, sfa), (b, sfb), torch.empty(50, N), ids)
    a64, w64 = act64(a, sfa), weight64(b, sfb)
    ref = torch.einsum("mk,mnk->mn", a64, w64[ids.long()])
    mag = torch.einsum("mk,mnk->mn", a64.abs(), w64[ids.long()].abs())
    assert_gemm_close(out, ref, mag, K, diff_limit=1e-3)


@pytest.mark.parametrize("fp4", [False, True])
@pytest.mark.parametrize("e8m0", [False, True])
def test_masked(fp4: bool, e8m0: bool) -> None:
    m_max = 40
    g = gen(200 + 10 * fp4 + e8m0)
    a, sfa = _acts((G, m_max), e8m0, g)
    b, sfb = _weights(fp4, e8m0, g)
    counts = [0, m_max, 17, 1]
    masked_m = torch.tensor(counts, dtype=torch.int32)
    sentinel = 7.0  # rows past masked_m must keep what the buffer held
    out = torch.full((G, m_max, N), sentinel, dtype=torch.bfloat16)
    assert api.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), out, masked_m, expected_m=16) is out
    a64, w64 = act64(a, sfa), weight64(b, sfb)
    for e, cnt in enumerate(counts):
        ref = a64[e, :cnt] @ w64[e].T
        assert_gemm_close(out[e, :cnt], ref, a64[e, :cnt].abs() @ w64[e].abs().T, K, diff_limit=1e-3)
        assert (out[e, cnt:] == sentinel).all()
    fresh = api.m_grouped_fp8_fp4_gemm_nt_masked((a, sfa), (b, sfb), None, masked_m, 16)
    valid = (torch.arange(m_max)[None, :] < masked_m[:, None])[..., None]
    assert torch.equal(fresh, torch.where(valid, out, torch.zeros_like(out)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t", [0, 1, 37])
def test_grouped_gemm_nt_bf16(dtype: torch.dtype, t: int) -> None:
    groups, n, k = 8, 64, 512  # V4-Flash's o projection shape scaled down: [t, 8, 4096] x [8, 1024, 4096]
    g = gen(300 + t)
    a, b = rand_float((t, groups, k), dtype, g), rand_float((groups, n, k), dtype, g)
    out = torch.full((t, groups, n), float("nan"), dtype=dtype)
    assert api.grouped_gemm_nt_bf16(a, b, out) is out
    ref = torch.einsum("tgk,gnk->tgn", a.double(), b.double())
    mag = torch.einsum("tgk,gnk->tgn", a.double().abs(), b.double().abs())
    assert_gemm_close(out, ref, mag, k)


@pytest.mark.parametrize("fp4", [False, True])
def test_grouped_gemm_nt_fp8(fp4: bool) -> None:
    g = gen(400 + fp4)
    a, sfa = _acts((9, G), True, g)
    b, sfb = _weights(fp4, True, g)
    out = api.grouped_gemm_nt_fp8((a, sfa), (b, sfb))
    assert out.dtype == torch.bfloat16
    a64, w64 = act64(a, sfa), weight64(b, sfb)
    ref = torch.einsum("tgk,gnk->tgn", a64, w64)
    assert_gemm_close(out, ref, torch.einsum("tgk,gnk->tgn", a64.abs(), w64.abs()), K, diff_limit=1e-3)


def test_grouped_bad_input() -> None:
    g = gen(500)
    a, sfa = _acts((6,), False, g)
    b, sfb = _weights(False, False, g)
    out = torch.full((6, N), 3.0, dtype=torch.bfloat16)
    for bad in ([0, 1, 4, 0, 0, 0], [0, -2, 1, 1, 1, 1]):
        with pytest.raises(ValueError, match="m_indices: expected group ids"):
            api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), out, torch.tensor(bad, dtype=torch.int32))
    assert (out == 3.0).all()  # nothing written before the error
    with pytest.raises(TypeError, match="m_indices: expected dtype"):
        api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), out, torch.zeros(6, dtype=torch.int64))
    with pytest.raises(ValueError, match="b scales: expected shape"):
        api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb[:2]), out, torch.zeros(6, dtype=torch.int32))
    with pytest.raises(ValueError, match="b: expected 3 dims"):
        api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b[0], sfb[0]), out, torch.zeros(6, dtype=torch.int32))
    am, sfam = _acts((G, 8), False, g)
    with pytest.raises(ValueError, match="masked_m: expected counts"):
        api.m_grouped_fp8_gemm_nt_masked((am, sfam), (b, sfb), None, torch.tensor([0, 9, 1, 1], dtype=torch.int32), 4)
    with pytest.raises(TypeError, match="expected_m: expected an int"):
        api.m_grouped_fp8_gemm_nt_masked((am, sfam), (b, sfb), None, torch.zeros(G, dtype=torch.int32), 4.0)
    with pytest.raises(ValueError, match=r"b: expected shape \[2, \*, \*\]"):  # groups of a and b differ
        api.m_grouped_fp8_gemm_nt_masked((am[:2], sfam[:2]), (b, sfb), None, torch.zeros(G, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="K mismatch"):
        api.grouped_gemm_nt_bf16(torch.randn(2, G, K), torch.randn(G, N, K + 1))
    with pytest.raises(ValueError, match="a: expected a contiguous"):
        api.grouped_gemm_nt_bf16(torch.randn(G, 2, K).transpose(0, 1), torch.randn(G, N, K))
