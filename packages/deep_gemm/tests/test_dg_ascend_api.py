"""The public API routes to the Ascend mapping when the backend choice is "ascend" (no NPU here: the mapping
falls back to the reference, so results must equal the reference exactly). No NPU run was made."""

from __future__ import annotations

import pytest
import torch

from deepinfer import deep_gemm as dg
from deepinfer.deep_gemm import _dispatch
from deepinfer.deep_gemm.backends import ascend


@pytest.fixture
def ascend_choice(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = ascend.dispatch

    def spy(name: str):
        seen.append(name)
        return real(name)

    monkeypatch.setattr(_dispatch, "backend", lambda device: "ascend")
    monkeypatch.setattr(ascend, "dispatch", spy)
    return seen


def test_bf16_and_grouped_route_to_ascend(ascend_choice: list[str]) -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 64, generator=g), torch.randn(5, 64, generator=g)
    assert torch.allclose(dg.bf16_gemm_nt(a, b), a @ b.t(), rtol=1e-5, atol=1e-5)
    ga, gb = torch.randn(3, 2, 64, generator=g), torch.randn(2, 5, 64, generator=g)
    got = dg.grouped_gemm_nt_bf16(ga, gb)
    assert torch.allclose(got, torch.einsum("tgk,gnk->tgn", ga, gb), rtol=1e-5, atol=1e-5)
    assert ascend_choice[:1] == ["bf16_gemm_nt"] and "grouped_gemm_nt_bf16" in ascend_choice
