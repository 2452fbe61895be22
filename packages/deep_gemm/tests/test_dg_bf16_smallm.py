"""Small-m bf16 GEMM (Triton, split-K): vs a float64 oracle, in the CPU interpreter and on the GPU."""

from __future__ import annotations

import os

import pytest
import torch
from dg_testing import gen

_INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
_CUDA = torch.cuda.is_available()
if not (_INTERP or _CUDA):
    pytest.skip("needs TRITON_INTERPRET=1 or a CUDA device", allow_module_level=True)

from deepinfer.deep_gemm.backends.cuda.triton_bf16_smallm import (  # noqa: E402
    MAX_M,
    bf16_gemm_nt_smallm,
    plan_split,
)

DEV = "cuda" if _CUDA and not _INTERP else "cpu"


def _operands(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    a = torch.randn(m, k, generator=g).bfloat16().to(DEV)
    b = (torch.randn(n, k, generator=g) / k**0.5).bfloat16().to(DEV)
    return a, b


# The last step rounds fp32 to bf16: half an ulp (2^-8 relative) on a GPU; Triton's CPU interpreter truncates
# that cast instead (checked: 1 + 2^-8 + 2^-12 becomes 1.0), so there a whole ulp (2^-7).
_BF16_OUT_REL = 2.0**-7 if DEV == "cpu" else 2.0**-8


def _check(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """fp32 accumulation of k exact bf16 products, then one bf16 rounding of the result."""
    exact = a.double() @ b.double().t()
    k = a.shape[1]
    bound = (a.double().abs() @ b.double().abs().t()) * (k * 2.0**-24) + exact.abs() * _BF16_OUT_REL
    err = (out.double() - exact).abs()
    assert torch.isfinite(out.float()).all()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3g}"


def test_plan_split() -> None:
    assert plan_split(32768, 1024) == 1  # 512 column blocks: no split
    assert plan_split(1024, 4096) == 16
    assert plan_split(512, 4096) == 32  # capped by the 32 k-blocks
    assert plan_split(4096, 128) == 1  # one k-block: cannot split


@pytest.mark.parametrize(
    ("m", "n", "k", "split"),
    [(1, 96, 256, None), (5, 64, 384, 2), (17, 130, 256, 4), (64, 64, 128, 1), (3, 200, 512, 8)],
)
def test_interpreter_matches_oracle(m: int, n: int, k: int, split: int | None) -> None:
    a, b = _operands(m, n, k, seed=m * 1000 + n)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
    _check(bf16_gemm_nt_smallm(a, b, out, split=split), a, b)


def test_rows_do_not_depend_on_batch() -> None:
    a, b = _operands(8, 128, 512, seed=7)
    full = bf16_gemm_nt_smallm(a, b, torch.empty(8, 128, dtype=torch.bfloat16, device=DEV))
    one = bf16_gemm_nt_smallm(a[3:4], b, torch.empty(1, 128, dtype=torch.bfloat16, device=DEV))
    assert torch.equal(full[3:4], one)


def test_rejects_too_many_rows_and_bad_split() -> None:
    a, b = _operands(MAX_M + 1, 64, 128, seed=1)
    with pytest.raises(ValueError, match="rows"):
        bf16_gemm_nt_smallm(a, b, torch.empty(MAX_M + 1, 64, dtype=torch.bfloat16, device=DEV))
    with pytest.raises(ValueError, match="split"):
        bf16_gemm_nt_smallm(a[:2], b, torch.empty(2, 64, dtype=torch.bfloat16, device=DEV), split=3)


V4_SHAPES = [(1024, 4096), (512, 4096), (32768, 1024), (4096, 8192), (2048, 4096), (4096, 2048), (8192, 1024)]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32, 64])
@pytest.mark.parametrize(("n", "k"), V4_SHAPES)
def test_gpu_v4_shapes(m: int, n: int, k: int) -> None:
    a, b = _operands(m, n, k, seed=m + n + k)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    _check(bf16_gemm_nt_smallm(a, b, out), a, b)


@pytest.mark.gpu
def test_gpu_graph_capture() -> None:
    a, b = _operands(32, 1024, 4096, seed=3)
    out = torch.empty(32, 1024, dtype=torch.bfloat16, device="cuda")
    bf16_gemm_nt_smallm(a, b, out)  # compile outside the capture
    ref = out.clone()
    out.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bf16_gemm_nt_smallm(a, b, out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


def _grouped(m: int, g: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gg = gen(seed)
    a = torch.randn(m, g, k, generator=gg).bfloat16().to(DEV)
    b = (torch.randn(g, n, k, generator=gg) / k**0.5).bfloat16().to(DEV)
    return a, b


@pytest.mark.parametrize(("m", "g", "n", "k", "split"), [(3, 2, 64, 256, 2), (9, 3, 80, 128, 1)])
def test_interpreter_grouped(m: int, g: int, n: int, k: int, split: int) -> None:
    a, b = _grouped(m, g, n, k, seed=m + g)
    out = torch.full((m, g, n), float("nan"), dtype=torch.bfloat16, device=DEV)
    bf16_gemm_nt_smallm(a, b, out, split=split)
    for i in range(g):
        _check(out[:, i], a[:, i], b[i])


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 32, 64])
def test_gpu_grouped_v4_wo_a(m: int) -> None:
    a, b = _grouped(m, 8, 1024, 4096, seed=m)
    out = torch.full((m, 8, 1024), float("nan"), dtype=torch.bfloat16, device="cuda")
    bf16_gemm_nt_smallm(a, b, out)
    for i in range(8):
        _check(out[:, i], a[:, i], b[i])
