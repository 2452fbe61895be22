"""The fp32 LM head over a bf16 weight via an exact 3-way bf16 split (model/head.py)."""

from __future__ import annotations

import pytest
import torch

from deepinfer.engine.model.head import head_logits_bf16w, split_bf16x3


def _h(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g) * torch.logspace(-3, 3, d)  # many exponents


def test_split_is_exact() -> None:
    h = _h(64, 512, 0)
    parts = split_bf16x3(h)
    assert parts.dtype == torch.bfloat16 and parts.shape == (3, 64, 512)
    assert torch.equal(parts[0].float() + parts[1].float() + parts[2].float(), h)
    assert torch.equal((parts[0].double() + parts[1].double()) + parts[2].double(), h.double())


def test_split_rejects_non_fp32() -> None:
    with pytest.raises(TypeError, match="float32"):
        split_bf16x3(torch.ones(2, 2, dtype=torch.bfloat16))


def test_split_products_match_fp32_gemm_on_cpu() -> None:
    """The three partial GEMMs (emulated in fp64, i.e. exact products) sum to the fp64 h @ W^T."""
    h, w = _h(8, 256, 1), torch.randn(100, 256, generator=torch.Generator().manual_seed(2)).bfloat16()
    parts = split_bf16x3(h).double()
    got = sum(p @ w.double().t() for p in parts)
    assert torch.allclose(got, h.double() @ w.double().t(), rtol=0, atol=1e-9)


def test_cpu_returns_none() -> None:
    assert head_logits_bf16w(torch.randn(2, 8), torch.randn(4, 8).bfloat16()) is None


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 32, 256])
def test_gpu_head_matches_fp32_gemm(n: int) -> None:
    d, v = 4096, 129280
    h = _h(n, d, 3).cuda()
    w = (torch.randn(v, d, generator=torch.Generator().manual_seed(4)) * 0.02).bfloat16().cuda()
    got = head_logits_bf16w(h, w)
    assert got is not None, "torch.mm(out_dtype=float32) is unavailable on this CUDA build"
    exact = h.double() @ w.double().t()
    # Both an fp32 GEMM and this one accumulate d products in fp32: error <= ~d * 2^-24 * sum|h_k w_vk|.
    bound = (h.double().abs() @ w.double().abs().t()) * (d * 2.0**-24)
    assert ((got.double() - exact).abs() <= bound).all()
    ref = h @ w.float().t()
    assert (got.double() - exact).abs().max() <= 4 * (ref.double() - exact).abs().max() + 1e-6


def _router(gate: torch.Tensor):  # noqa: ANN202
    from deepinfer.engine.model.moe import MoE

    return MoE(None, gate, None, None, [], None)  # type: ignore[arg-type]


def test_router_cpu_keeps_the_fp32_gemm() -> None:
    """On CPU (and for non-bf16 gates) the router logits are exactly the fp32 GEMM of the reference."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, 64, generator=g).bfloat16()
    gate = (torch.randn(16, 64, generator=g) * 0.05).bfloat16()
    assert torch.equal(_router(gate)._logits(x), x.float() @ gate.float().t())


def test_exact_bf16_and_linear_fp32_on_cpu() -> None:
    """`QWeight.exact_bf16`: bf16 weights and fp32 weights holding bf16 values qualify, others not; on CPU
    `linear_fp32` is the fp32 GEMM."""
    from deepinfer.engine.weights import QWeight, linear_fp32

    g = torch.Generator().manual_seed(8)
    w = torch.randn(12, 32, generator=g)
    assert QWeight(w).exact_bf16() is None
    assert torch.equal(QWeight(w.bfloat16().float()).exact_bf16(), w.bfloat16())
    assert torch.equal(QWeight(w.bfloat16()).exact_bf16(), w.bfloat16())
    x = torch.randn(3, 32, generator=g).bfloat16()
    assert torch.equal(linear_fp32(x, QWeight(w)), x.float() @ w.t())


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 32, 4096])
def test_gpu_router_bf16_gemm_matches_fp32(n: int) -> None:
    """The CUDA router (bf16 GEMM, fp32 accumulation / output) against the exact sum, within fp32 GEMM error."""
    g = torch.Generator().manual_seed(7)
    d, e = 4096, 256
    x = torch.randn(n, d, generator=g).bfloat16().cuda()
    gate = (torch.randn(e, d, generator=g) * 0.02).bfloat16().cuda()
    exact = x.double() @ gate.double().t()
    bound = (x.double().abs() @ gate.double().abs().t()) * (d * 2.0**-24)
    for w in (gate, gate.float()):  # a BF16 checkpoint gate, and one stored as fp32 holding bf16 values
        moe = _router(w)
        got = moe._logits(x)
        assert moe.gate_q.exact_bf16() is not None
        assert got.dtype == torch.float32 and got.shape == (n, e)
        assert ((got.double() - exact).abs() <= bound).all()
