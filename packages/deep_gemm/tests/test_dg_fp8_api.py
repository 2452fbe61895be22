"""`fp8_gemm_nt` dispatch: the Triton block-scaled FP8 kernel where it applies (CUDA, or forced `triton` under
TRITON_INTERPRET=1), the reference for FP4 weights, k % 16 != 0, CPU and DEEPINFER_DEEP_GEMM_BACKEND=reference.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from dg_testing import calc_diff, gen, rand_fp4, rand_fp8, rand_scales  # noqa: E402

from deepinfer.deep_gemm import api  # noqa: E402
from deepinfer.deep_gemm import reference as ref  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import triton_fp8_gemm  # noqa: E402

ENV = "DEEPINFER_DEEP_GEMM_BACKEND"
interp_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


def _fp8(m: int, n: int, k: int, seed: int, device: str = "cpu") -> tuple:
    g = gen(seed)
    kb = -(-k // 128)
    a = (rand_fp8((m, k), g), rand_scales((m, kb), g, e8m0=False))
    b = (rand_fp8((n, k), g), rand_scales((-(-n // 128), kb), g, e8m0=True))
    return tuple(t.to(device) for t in a), tuple(t.to(device) for t in b)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of the Triton launcher that `api.fp8_gemm_nt` imports lazily."""
    calls: list[int] = []
    real = triton_fp8_gemm.fp8_gemm_nt_triton

    def wrapped(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(triton_fp8_gemm, "fp8_gemm_nt_triton", wrapped)
    return calls


@interp_only
@pytest.mark.parametrize(("m", "n", "k"), [(3, 64, 256), (20, 130, 144)])
def test_forced_triton_runs_kernel(m: int, n: int, k: int, spy: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "triton")
    a, b = _fp8(m, n, k, seed=m + n + k)
    c = torch.randn(m, n, generator=gen(1))
    out = api.fp8_gemm_nt(a, b, torch.empty(m, n), c)
    assert spy == [1]
    want = ref.fp8_gemm_nt(*a, *b, torch.empty(m, n), c)
    assert calc_diff(out, want) < 1e-6  # fp32 out: rounding-order differences only (test_dg_fp8_triton)


@interp_only
def test_fp4_weights_and_odd_k_use_reference(spy: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "triton")
    a, _ = _fp8(4, 64, 256, seed=3)
    b4 = (rand_fp4((64, 128), gen(4)), rand_scales((64, 8), gen(5), e8m0=True))
    api.fp8_gemm_nt(a, b4)
    a8, b8 = _fp8(4, 64, 136, seed=6)  # k % 16 != 0
    api.fp8_gemm_nt(a8, b8)
    assert spy == []


def test_cpu_default_is_reference(spy: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    a, b = _fp8(4, 64, 256, seed=8)
    api.fp8_gemm_nt(a, b)
    assert spy == []


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(1, 1024, 4096), (128, 4096, 2048), (4096, 2048, 4096), (77, 512, 4096)])
def test_gpu_api_uses_triton(m: int, n: int, k: int, spy: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA with DEEPINFER_DEEP_GEMM_FP8_DENSE=triton the public API runs the Triton kernel (auto picks CUTLASS
    for some of these shapes: test_dg_fp8_cutlass.test_gpu_api_auto); bf16 out vs the reference (1e-5: see
    test_dg_fp8_triton)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("DEEPINFER_DEEP_GEMM_FP8_DENSE", "triton")
    a, b = _fp8(m, n, k, seed=m + n, device="cuda")
    out = api.fp8_gemm_nt(a, b)
    assert spy == [1]
    want = ref.fp8_gemm_nt(*a, *b, torch.empty_like(out))
    assert torch.isfinite(out).all()
    assert calc_diff(out, want) < 1e-5
    monkeypatch.setenv(ENV, "reference")
    assert calc_diff(api.fp8_gemm_nt(a, b), want) < 1e-10  # the reference path again (same cuBLAS calls)
    assert spy == [1]
