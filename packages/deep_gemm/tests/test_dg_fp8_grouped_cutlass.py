"""Tests of the CUTLASS M-grouped contiguous FP8 GEMM (backends/cuda/cutlass_fp8_grouped.py,
csrc/cuda/cutlass/fp8_grouped_contiguous.cu).

CPU: argument checks and the refusal without the extension. GPU (@pytest.mark.gpu): DeepGEMM's contiguous layout
(rows sorted by expert, 128-row aligned blocks ending in -1 padding rows, experts without rows) vs the fp32
reference, e8m0 scales, and CUDA-graph replay. Bound: as for the dense CUTLASS kernel (test_dg_fp8_cutlass.py):
calc_diff < 1e-5 against the fp32 reference (rounding order and one bf16 rounding); a wrong expert or scale gives
~1e-2..1, and padding rows must be exactly zero.
"""

from __future__ import annotations

import pytest
import torch
from dg_testing import calc_diff, gen, rand_fp8, rand_scales

from deepinfer.deep_gemm import reference as ref
from deepinfer.deep_gemm.backends.cuda import cutlass_fp8_grouped as cg

FP8 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
DIFF_LIMIT = 1e-5


def _layout(counts: list[int], device: str = "cpu") -> torch.Tensor:
    """m_indices of DeepGEMM's contiguous layout: expert e's counts[e] rows, padded with -1 to a multiple of 128."""
    ids = []
    for e, c in enumerate(counts):
        pad = -(-c // 128) * 128 - c
        ids += [e] * c + [-1] * pad
    return torch.tensor(ids, dtype=torch.int32, device=device)


def _operands(rows: int, g: int, n: int, k: int, seed: int, e8m0: bool = False) -> tuple[torch.Tensor, ...]:
    g_ = gen(seed)
    a, b = rand_fp8((rows, k), g_), rand_fp8((g * n, k), g_).view(g, n, k)
    sfa = rand_scales((rows, k // 128), g_, e8m0)
    sfb = rand_scales((g * -(-n // 128), k // 128), g_, e8m0).view(g, -(-n // 128), k // 128)
    return a, sfa, b, sfb


_BAD = [
    ("k % 128", {"k": 192}, ValueError, "k: expected a positive multiple of 128"),
    ("n % 8", {"n": 12}, ValueError, "n: expected a multiple of 8"),
    ("out dtype", {"out_dtype": torch.float32}, TypeError, "out: expected dtype torch.bfloat16"),
    ("ids dtype", {"ids_dtype": torch.int64}, TypeError, "m_indices: expected dtype torch.int32"),
    ("sfb shape", {"sfb_groups": 1}, ValueError, "sfb: expected shape"),
]


@pytest.mark.parametrize("case", _BAD, ids=[c[0] for c in _BAD])
def test_check_grouped_args(case: tuple) -> None:
    _, kw, exc, msg = case
    n, k = kw.get("n", 16), kw.get("k", 128)
    ids = _layout([3, 0, 5])
    a, sfa, b, sfb = _operands(ids.numel(), 3, n, k, seed=1)
    if "sfb_groups" in kw:
        sfb = sfb[: kw["sfb_groups"]]
    out = torch.empty(ids.numel(), n, dtype=kw.get("out_dtype", torch.bfloat16))
    with pytest.raises(exc, match=msg):
        cg.check_grouped_args(a, sfa, b, sfb, out, ids.to(kw.get("ids_dtype", torch.int32)))


def test_check_grouped_args_accepts_valid() -> None:
    ids = _layout([3, 0, 5])
    a, sfa, b, sfb = _operands(ids.numel(), 3, 24, 256, seed=2, e8m0=True)
    cg.check_grouped_args(a, sfa, b, sfb, torch.empty(ids.numel(), 24, dtype=torch.bfloat16), ids)


def test_refuses_without_extension() -> None:
    if cg.available():
        pytest.skip("_C with the CUTLASS grouped GEMM is present here (GPU build)")
    ids = _layout([2])
    a, sfa, b, sfb = _operands(ids.numel(), 1, 8, 128, seed=3)
    with pytest.raises(RuntimeError, match="not built with the CUTLASS grouped"):
        cg.m_grouped_fp8_gemm_nt_contiguous_cutlass(a, sfa, b, sfb, torch.empty(ids.numel(), 8,
                                                    dtype=torch.bfloat16), ids)  # fmt: skip


# ---------------------------------------------------------------- GPU

needs_kernel = pytest.mark.skipif(not (torch.cuda.is_available() and cg.available()), reason="needs the CUDA kernel")


def _run_and_check(counts: list[int], n: int, k: int, e8m0: bool, seed: int) -> None:
    ids = _layout(counts, "cuda")
    rows, g = ids.numel(), len(counts)
    a, sfa, b, sfb = (t.cuda() for t in _operands(rows, g, n, k, seed, e8m0))
    out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    cg.m_grouped_fp8_gemm_nt_contiguous_cutlass(a, sfa, b, sfb, out, ids)
    want = ref.m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, torch.empty(rows, n, device="cuda"), ids)
    torch.cuda.synchronize()
    pad = ids < 0
    assert torch.equal(out[pad], torch.zeros_like(out[pad])), "padding rows (m_indices -1) must be zero"
    bad = ~torch.isfinite(out)
    assert not bad.any(), f"non-finite output, first at {bad.nonzero()[0].tolist()} (of {int(bad.sum())})"
    diff = calc_diff(out, want)
    err = (out.float() - want).abs()
    worst = int(err.argmax())
    assert diff < DIFF_LIMIT, (
        f"counts={counts} n={n} k={k}: calc_diff {diff:.3e}; max |err| {err.max().item():.3e} at row "
        f"{worst // n} (expert {int(ids[worst // n])}) col {worst % n}"
    )


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize(
    ("counts", "n", "k"),
    [
        ([128], 256, 128),
        ([1, 0, 130, 77], 4096, 2048),
        ([256, 256, 0, 384], 4096, 4096),
        ([1024] * 8, 4096, 4096),
        ([5, 300, 0, 0, 129, 64, 1, 255], 2048, 7168),
        ([200] * 3, 136, 256),
    ],
)
def test_gpu_grouped_contiguous(counts: list[int], n: int, k: int) -> None:
    _run_and_check(counts, n, k, e8m0=False, seed=sum(counts) + n + k)


@pytest.mark.gpu
@needs_kernel
def test_gpu_grouped_e8m0() -> None:
    _run_and_check([100, 0, 260], 1024, 1024, e8m0=True, seed=5)


@pytest.mark.gpu
@needs_kernel
def test_gpu_grouped_cuda_graph_replay() -> None:
    """The row scan, setup and GEMM replay from a graph; new routing in place changes the result accordingly."""
    counts, n, k = [60, 128, 0, 200], 1024, 1024
    ids = _layout(counts, "cuda")
    rows, g = ids.numel(), len(counts)
    a, sfa, b, sfb = (t.cuda() for t in _operands(rows, g, n, k, seed=6))
    out = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
    cg.m_grouped_fp8_gemm_nt_contiguous_cutlass(a, sfa, b, sfb, out, ids)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cg.m_grouped_fp8_gemm_nt_contiguous_cutlass(a, sfa, b, sfb, out, ids)
    ids.copy_(_layout([128, 60, 200, 0], "cuda"))  # same total rows, other experts
    out.fill_(float("nan"))
    graph.replay()
    want = ref.m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, torch.empty(rows, n, device="cuda"), ids)
    torch.cuda.synchronize()
    assert calc_diff(out, want) < DIFF_LIMIT
