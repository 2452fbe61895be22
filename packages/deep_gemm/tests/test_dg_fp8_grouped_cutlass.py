"""Tests of the CUTLASS M-grouped FP8 GEMM, contiguous and masked (backends/cuda/cutlass_fp8_grouped.py,
csrc/cuda/cutlass/fp8_grouped_*.cu).

CPU: argument checks, the auto config table and the refusal without the extension. GPU (@pytest.mark.gpu): every
config on DeepGEMM's contiguous layout (rows sorted by expert, 128-row aligned blocks ending in -1 padding rows,
experts without rows) and on the masked layout (counts 0 .. m_max) vs the fp32 reference, e8m0 scales, ids >= g,
non-contiguous experts (NaN), scheduler knobs and CUDA-graph replay. Bound: as for the dense CUTLASS kernel
(test_dg_fp8_cutlass.py): calc_diff < 1e-5 against the fp32 reference (rounding order and one bf16 rounding);
a wrong expert or scale gives ~1e-2..1, and padding rows must be exactly zero.
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


_BAD_MASKED = [
    ("a 2-D", {"flat": True}, ValueError, "a: expected a contiguous 3-D tensor"),
    ("groups", {"groups_b": 2}, ValueError, "a: expected leading dims|a: expected 2 groups"),
    ("counts dtype", {"cnt_dtype": torch.int64}, TypeError, "masked_m: expected dtype torch.int32"),
    ("counts shape", {"cnt_len": 2}, ValueError, "masked_m: expected contiguous"),
    ("out shape", {"out_rows": 7}, ValueError, "out: expected shape"),
]


@pytest.mark.parametrize("case", _BAD_MASKED, ids=[c[0] for c in _BAD_MASKED])
def test_check_masked_args(case: tuple) -> None:
    _, kw, exc, msg = case
    g, m_max, n, k = 3, 8, 16, 256
    a, sfa, b, sfb = _operands(g * m_max, g, n, k, seed=7)
    a, sfa = a.view(g, m_max, k), sfa.view(g, m_max, k // 128)
    if kw.get("flat"):
        a = a.view(g * m_max, k)
    if "groups_b" in kw:
        b, sfb = b[: kw["groups_b"]], sfb[: kw["groups_b"]]
    out = torch.empty(g, kw.get("out_rows", m_max), n, dtype=torch.bfloat16)
    cnt = torch.zeros(kw.get("cnt_len", g), dtype=kw.get("cnt_dtype", torch.int32))
    with pytest.raises(exc, match=msg):
        cg.check_masked_args(a, sfa, b, sfb, out, cnt)


def test_check_masked_args_accepts_valid() -> None:
    g, m_max, n, k = 2, 5, 24, 128
    a, sfa, b, sfb = _operands(g * m_max, g, n, k, seed=8, e8m0=True)
    out = torch.empty(g, m_max, n, dtype=torch.bfloat16)
    cg.check_masked_args(a.view(g, m_max, k), sfa.view(g, m_max, 1), b, sfb, out, torch.zeros(g, dtype=torch.int32))


def test_auto_config_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cg, "AUTO_CONFIG_BY_ROWS", ())
    assert cg.auto_config(8) == cg.auto_config(4096) == cg.DEFAULT_CONFIG  # no table: the default everywhere
    monkeypatch.setattr(cg, "AUTO_CONFIG_BY_ROWS", ((64, 2), (512, 1)))
    assert [cg.auto_config(r) for r in (1, 64, 65, 512, 513)] == [2, 2, 1, 1, cg.DEFAULT_CONFIG]
    assert set(cg.CONFIGS) == set(range(len(cg.CONFIGS)))


# ---------------------------------------------------------------- GPU

needs_kernel = pytest.mark.skipif(not (torch.cuda.is_available() and cg.available()), reason="needs the CUDA kernel")


def _run_and_check(counts: list[int], n: int, k: int, e8m0: bool, seed: int, config: int = 0, **knobs) -> None:
    ids = _layout(counts, "cuda")
    rows, g = ids.numel(), len(counts)
    a, sfa, b, sfb = (t.cuda() for t in _operands(rows, g, n, k, seed, e8m0))
    out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    cg.m_grouped_fp8_gemm_nt_contiguous_cutlass(a, sfa, b, sfb, out, ids, config=config, **knobs)
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
        f"config {config} {knobs} counts={counts} n={n} k={k}: calc_diff {diff:.3e}; max |err| "
        f"{err.max().item():.3e} at row {worst // n} (expert {int(ids[worst // n])}) col {worst % n}"
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
@pytest.mark.parametrize("config", sorted(cg.CONFIGS))
def test_gpu_grouped_contiguous(counts: list[int], n: int, k: int, config: int) -> None:
    _run_and_check(counts, n, k, e8m0=False, seed=sum(counts) + n + k, config=config)


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize(("raster", "swizzle"), [(2, 1), (1, 2), (2, 4)])
def test_gpu_grouped_scheduler_knobs(raster: int, swizzle: int) -> None:
    _run_and_check([300, 0, 1, 512], 2048, 1024, e8m0=False, seed=40 + swizzle, config=0, raster=raster,
                   swizzle=swizzle)  # fmt: skip


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


def _masked_operands(counts: list[int], m_max: int, n: int, k: int, seed: int, e8m0: bool = False):
    g = len(counts)
    a, sfa, b, sfb = (t.cuda() for t in _operands(g * m_max, g, n, k, seed, e8m0))
    cnt = torch.tensor(counts, dtype=torch.int32, device="cuda")
    return a.view(g, m_max, k), sfa.view(g, m_max, k // 128), b, sfb, cnt


def _check_masked(out: torch.Tensor, a, sfa, b, sfb, counts: list[int], sentinel: float, what: str) -> None:
    g, m_max, n = out.shape
    want = ref.m_grouped_fp8_gemm_nt_masked(a, sfa, b, sfb, torch.zeros(g, m_max, n, device="cuda"),
                                            torch.tensor([min(max(c, 0), m_max) for c in counts],
                                                         dtype=torch.int32, device="cuda"))  # fmt: skip
    torch.cuda.synchronize()
    for e, c in enumerate(counts):
        c = min(max(c, 0), m_max)
        assert (out[e, c:] == sentinel).all(), f"{what}: expert {e} rows >= {c} were written"
        if c:
            diff = calc_diff(out[e, :c], want[e, :c])
            assert diff < DIFF_LIMIT, f"{what}: expert {e} ({c} rows): calc_diff {diff:.3e}"


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize(
    ("counts", "m_max", "n", "k"),
    [([0, 64, 17, 1], 64, 4096, 2048), ([200, 0, 256, 129], 256, 2048, 7168), ([3] * 8, 16, 136, 256)],
)
@pytest.mark.parametrize("config", sorted(cg.CONFIGS))
def test_gpu_grouped_masked(counts: list[int], m_max: int, n: int, k: int, config: int) -> None:
    a, sfa, b, sfb, cnt = _masked_operands(counts, m_max, n, k, seed=sum(counts) + k)
    out = torch.full((len(counts), m_max, n), 7.0, dtype=torch.bfloat16, device="cuda")
    cg.m_grouped_fp8_gemm_nt_masked_cutlass(a, sfa, b, sfb, out, cnt, m_max, config=config)
    _check_masked(out, a, sfa, b, sfb, counts, 7.0, f"config {config}")


@pytest.mark.gpu
@needs_kernel
def test_gpu_grouped_masked_clamps_counts_and_graph() -> None:
    """Counts < 0 or > m_max are clamped (no host validation); replay with new counts in place."""
    counts, m_max, n, k = [-3, 40, 99, 5], 40, 1024, 1024
    a, sfa, b, sfb, cnt = _masked_operands(counts, m_max, n, k, seed=9, e8m0=True)
    out = torch.full((4, m_max, n), 7.0, dtype=torch.bfloat16, device="cuda")
    cg.m_grouped_fp8_gemm_nt_masked_cutlass(a, sfa, b, sfb, out, cnt, 32)
    _check_masked(out, a, sfa, b, sfb, counts, 7.0, "clamped counts")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cg.m_grouped_fp8_gemm_nt_masked_cutlass(a, sfa, b, sfb, out, cnt, 32)
    new = [12, 0, 40, 1]
    cnt.copy_(torch.tensor(new, dtype=torch.int32))
    out.fill_(7.0)
    graph.replay()
    _check_masked(out, a, sfa, b, sfb, new, 7.0, "graph replay")


@pytest.mark.gpu
@needs_kernel
def test_gpu_grouped_ids_out_of_range_zeroed() -> None:
    """ids >= g are not validated on this path (no host sync): their rows are zeroed like padding."""
    ids = _layout([130, 40], "cuda")
    ids[135:150] = 7  # expert 7 of 2: a block inside expert 0's padding
    rows, n, k = ids.numel(), 512, 512
    a, sfa, b, sfb = (t.cuda() for t in _operands(rows, 2, n, k, seed=10))
    out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    cg.m_grouped_fp8_gemm_nt_contiguous_cutlass(a, sfa, b, sfb, out, ids)
    valid = (ids >= 0) & (ids < 2)
    want = ref.m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, torch.empty(rows, n, device="cuda"),
                                                torch.where(valid, ids, -1))  # fmt: skip
    torch.cuda.synchronize()
    assert torch.equal(out[~valid], torch.zeros_like(out[~valid]))
    assert calc_diff(out[valid], want[valid]) < DIFF_LIMIT


@pytest.mark.gpu
@needs_kernel
def test_gpu_grouped_noncontiguous_expert_is_nan() -> None:
    """An expert whose rows form two runs is not computed: its rows read NaN; the other experts are exact."""
    ids = torch.tensor([0] * 100 + [1] * 60 + [0] * 20 + [2] * 70, dtype=torch.int32, device="cuda")
    rows, n, k = ids.numel(), 256, 256
    a, sfa, b, sfb = (t.cuda() for t in _operands(rows, 3, n, k, seed=11))
    out = torch.zeros(rows, n, dtype=torch.bfloat16, device="cuda")
    cg.m_grouped_fp8_gemm_nt_contiguous_cutlass(a, sfa, b, sfb, out, ids)
    want = ref.m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, torch.empty(rows, n, device="cuda"), ids)
    torch.cuda.synchronize()
    assert torch.isnan(out[ids == 0]).all(), "the non-contiguous expert's rows must be NaN"
    good = ids != 0
    assert calc_diff(out[good], want[good]) < DIFF_LIMIT
