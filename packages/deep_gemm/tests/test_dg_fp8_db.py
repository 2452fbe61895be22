"""The FP8 block-scaled GEMM with double-buffered promotion (`backends/cuda/cuda_fp8_db.py`, csrc/cuda/dg_fp8_db.cuh).

CPU: argument validation (each bad argument raises naming it), the unbuilt-kernel error, an sm_90a nvcc compile check
(no spills, no wgmma serialisation warning). `gpu`: against a float64 oracle (calc_diff < 1e-5, the CUTLASS FP8 tests'
bound: rounding order + one bf16 rounding; a wrong scale or tile gives ~1e-2 .. 1) on fresh random data and scales:
m not a multiple of 128, empty groups, k = 128 (one block: only the drain), k = 7168, few CTAs (several tiles each);
rows past offs[-1] untouched; dense == one group (bit-equal); stages 4 == 5 (bit-equal); vs the API's output.
The TMA-producer variants (tma=1, `fp8_db_t5` / `fp8_db_t4`) run every oracle case and must be BIT-equal to
`fp8_db_s5` (same shared-memory bytes, same math), also at m % 128 != 0 (TMA zero-fills rows past m), m = 1, k = 128.
The kernel's mbarrier waits trap after 2^30 polls (watchdog): a protocol bug fails a test instead of hanging. Run this
file in its own pytest process on the GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import torch
from dg_testing import act64, calc_diff, fp8_weight64, gen, rand_fp8, rand_scales
from test_dg_w4a8_cuda import _CSRC

from deepinfer.deep_gemm.backends.cuda import cuda_fp8_db as db

FP8 = torch.float8_e4m3fn
DIFF_LIMIT = 1e-5


def _ops(counts: list[int], n: int, k: int, seed: int, dev: str = "cpu", extra: int = 3) -> tuple:
    """Grouped operands: a e4m3 [m, k] (m = sum(counts) + extra rows past offs[-1]), sfa fp32 [m, k/128], b e4m3
    [g, n, k], sfb fp32 [g, n/128, k/128] (fresh random scales in [2^-4, 2^4), never zero), offs int32 [g]."""
    g_ = gen(seed)
    m, g = sum(counts) + extra, len(counts)
    a = rand_fp8((m, k), g_)
    sfa = rand_scales((m, k // 128), g_, e8m0=False)
    b = rand_fp8((g, n, k), g_)
    sfb = rand_scales((g, n // 128, k // 128), g_, e8m0=False)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    return tuple(t.to(dev) for t in (a, sfa, b, sfb, offs))


def _good(m: int = 5, n: int = 128, k: int = 256, g: int = 2) -> dict:
    return {
        "a": torch.zeros(m, k, dtype=FP8), "sfa": torch.ones(m, k // 128), "b": torch.zeros(g, n, k, dtype=FP8),
        "sfb": torch.ones(g, n // 128, k // 128), "offs": torch.tensor([2, m], dtype=torch.int32)[:g].contiguous(),
        "out": torch.empty(m, n, dtype=torch.bfloat16),
    }  # fmt: skip


# ---------------------------------------------------------------- CPU


@pytest.mark.parametrize(
    ("name", "bad", "exc", "words"),
    [
        ("a", torch.zeros(5, 256, dtype=torch.bfloat16), TypeError, "a: expected dtype"),
        ("a", torch.zeros(5, 200, dtype=FP8), ValueError, "k % 128"),
        ("b", torch.zeros(2, 100, 256, dtype=FP8), ValueError, "n % 128"),
        ("b", torch.zeros(2, 128, 384, dtype=FP8), ValueError, "b: expected k = 256"),
        ("b", torch.zeros(2, 256, 128, dtype=FP8).transpose(1, 2), ValueError, "b: expected a contiguous"),
        ("sfa", torch.ones(5, 3), ValueError, "sfa: expected shape (5, 2)"),
        ("sfa", torch.ones(5, 2, dtype=torch.float64), TypeError, "sfa: expected dtype"),
        ("sfb", torch.ones(2, 2, 2), ValueError, "sfb: expected shape (2, 1, 2)"),
        ("offs", torch.tensor([2, 5]), TypeError, "offs: expected dtype torch.int32"),
        ("offs", torch.tensor([5], dtype=torch.int32), ValueError, "offs: expected shape (2,)"),
        ("out", torch.empty(5, 128), TypeError, "out: expected dtype torch.bfloat16"),
        ("out", torch.empty(4, 128, dtype=torch.bfloat16), ValueError, "out: expected shape (5, 128)"),
    ],
)
def test_grouped_validation(name: str, bad: torch.Tensor, exc: type, words: str) -> None:
    args = _good()
    args[name] = bad
    with pytest.raises(exc, match=re.escape(words)):
        db.m_grouped_fp8_gemm_nt_offsets_db(**args)


def test_dense_validation() -> None:
    a, sfa = torch.zeros(5, 256, dtype=FP8), torch.ones(5, 2)
    out = torch.empty(5, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="b: expected 2 dimensions"):
        db.fp8_gemm_nt_db(a, sfa, torch.zeros(1, 128, 256, dtype=FP8), torch.ones(1, 2), out)
    with pytest.raises(ValueError, match=re.escape("sfb: expected shape (1, 1, 2)")):
        db.fp8_gemm_nt_db(a, sfa, torch.zeros(128, 256, dtype=FP8), torch.ones(2, 2), out)
    with pytest.raises(ValueError, match=re.escape("n % 128")):
        db.fp8_gemm_nt_db(a, sfa, torch.zeros(96, 256, dtype=FP8), torch.ones(1, 2), torch.empty(5, 96))


def test_variants_in_sync_with_the_source() -> None:
    """VARIANTS (Python) lists the (stages, stagger, tma) triples fp8_db_variants() returns in dg_fp8_db.cu."""
    src = (_CSRC / "dg_fp8_db.cu").read_text()
    body = re.search(r"fp8_db_variants\(\) \{\s*return \{(.*?)\};\s*\}", src, re.S)
    assert body is not None
    triples = tuple(tuple(int(x) for x in t) for t in re.findall(r"\{(\d+), (\d+), (\d+)\}", body.group(1) + "}"))
    assert triples == db.VARIANTS


def test_valid_operands_reach_the_launch() -> None:
    """Valid CPU operands pass validation and stop at the launch: unbuilt kernel or not a CUDA tensor."""
    exc = ValueError if db.available() else RuntimeError
    with pytest.raises(exc, match="CUDA tensor|not built"):
        db.m_grouped_fp8_gemm_nt_offsets_db(**_good())


def test_fp8_db_sm90_compile() -> None:
    """nvcc 13 builds dg_fp8_db.cu for sm_90a: no spills / stack, no wgmma serialisation (C7510 / C7512 / C7514:
    the two temporaries must stay in flight), <= 168 registers at launch (65536 / 384; setmaxnreg moves the rest)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    cmd = [nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c",
           str(_CSRC / "dg_fp8_db.cu"), "-o", os.devnull]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    kernels = re.findall(r"Compiling entry function '(\w*fp8_db_(?:tma_)?kernel\w*)'", res.stderr)
    assert len(kernels) == len(db.VARIANTS), res.stderr[-2000:]
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", res.stderr)]
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", res.stderr)]
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", res.stderr)]
    assert max(regs) <= 168 and max(frames) == 0 and max(spills) == 0, res.stderr[-3000:]
    for code in ("C7510", "C7512", "C7514", "C7508"):
        assert code not in res.stderr, res.stderr[-3000:]


# ---------------------------------------------------------------- GPU

needs_kernel = pytest.mark.skipif(not db.available(), reason="_C built without the fp8_db kernel")


def _oracle(a, sfa, b, sfb, counts: list[int]) -> torch.Tensor:
    """float64 [sum(counts), n]: each group's rows of dequant(a) @ dequant(b[i])^T (dg_testing's own dequant)."""
    x = act64(a, sfa)
    rows = sum(counts)
    want = torch.zeros(rows, b.shape[1], dtype=torch.float64, device=a.device)
    start = 0
    for i, c in enumerate(counts):
        if c:
            want[start : start + c] = x[start : start + c] @ fp8_weight64(b[i], sfb[i]).T
        start += c
    return want


def _run(
    ops: tuple, stages: int = db.DEFAULT_STAGES, stagger: bool = False, ctas: int = 0, tma: bool = False
) -> torch.Tensor:
    a, sfa, b, sfb, offs = ops
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.bfloat16, device=a.device)
    db.m_grouped_fp8_gemm_nt_offsets_db(a, sfa, b, sfb, offs, out, stages=stages, stagger=stagger, ctas=ctas, tma=tma)
    torch.cuda.synchronize()
    return out


def _assert_close(out: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got = out[: want.shape[0]].double()
    bad = ~torch.isfinite(got)
    assert not bad.any(), f"{what}: non-finite output, first at {bad.nonzero()[0].tolist()} (of {int(bad.sum())})"
    diff = calc_diff(got, want)
    err = (got - want).abs()
    where = divmod(int(err.argmax()), err.shape[1]) if err.numel() else None
    assert diff < DIFF_LIMIT, f"{what}: calc_diff {diff:.3e}; max |err| {float(err.max()):.3e} at {where}"


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize(("stages", "stagger", "tma"), db.VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize(
    ("counts", "n", "k", "ctas"),
    [
        ([3, 0, 130, 64, 1], 256, 512, 0),  # empty group, partial tiles, 2 m tiles in one group
        ([200, 17], 384, 128, 3),  # k = 128: one block per tile (drain only); few CTAs, several tiles each
        ([0, 0, 40], 128, 7168, 0),  # leading empty groups, k = 7168 (56 blocks: the ring wraps many times)
        ([300], 256, 1024, 2),  # one group, m not a multiple of 128, 2 CTAs
        ([256] * 6, 512, 2048, 0),  # full tiles, many k blocks per tile
        ([5, 9, 140], 128, 384, 1),  # one CTA walks every tile (odd block count: the loop's odd tail)
    ],
)
def test_gpu_grouped_vs_oracle(
    stages: int, stagger: int, tma: int, counts: list[int], n: int, k: int, ctas: int
) -> None:
    ops = _ops(counts, n, k, sum(counts) + n + k + stages, "cuda")
    out = _run(ops, stages, bool(stagger), ctas, bool(tma))
    what = f"stages={stages} stagger={stagger} tma={tma} counts={counts} n={n} k={k} ctas={ctas}"
    _assert_close(out, _oracle(*ops[:4], counts), what)
    assert out[sum(counts) :].isnan().all(), f"{what}: rows past offs[-1] were written"


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("ctas", [0, 3])
def test_gpu_variants_bit_equal(ctas: int) -> None:
    """Ring depth and the staggered start change only the schedule: same products, same promotion order."""
    ops = _ops([77, 0, 190, 256], 256, 1024, 5 + ctas, "cuda")
    base = _run(ops, 5, ctas=ctas).view(torch.int16)
    assert torch.equal(_run(ops, 4, ctas=ctas).view(torch.int16), base), "stages 4 != stages 5"
    assert torch.equal(_run(ops, 5, True, ctas).view(torch.int16), base), "stagger != stages 5"
    for stages in (5, 4):
        got = _run(ops, stages, ctas=ctas, tma=True).view(torch.int16)
        assert torch.equal(got, base), f"tma stages {stages} != stages 5: {int((got != base).sum())} values differ"


def _assert_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit equality of two bf16 outputs; on failure the count and the first differing (row, col) and values."""
    diff = got.view(torch.int16) != want.view(torch.int16)
    if diff.any():
        r, c = diff.nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: {int(diff.sum())} values differ; first at ({r}, {c}): {float(got[r, c])} vs {float(want[r, c])}"
        )


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("stages", [5, 4])
@pytest.mark.parametrize(
    ("counts", "n", "k", "extra", "ctas"),
    [
        ([1], 128, 128, 0, 0),  # m = 1: one row, the A box is 127 rows of TMA zero fill; k = 128: one block
        ([1], 256, 1024, 0, 0),  # m = 1, several blocks
        ([300], 384, 1536, 0, 2),  # m % 128 != 0: the last tile's rows past m zero-filled by TMA
        ([70, 0, 129], 256, 128, 0, 0),  # k = 128, ragged groups: rows past a group end load the NEXT group's bytes
        ([5, 9, 140], 128, 384, 3, 1),  # rows past offs[-1] (< m): loaded, never stored
    ],
)
def test_gpu_tma_bit_equal(stages: int, counts: list[int], n: int, k: int, extra: int, ctas: int) -> None:
    """The TMA producer writes the cp.async path's shared-memory bytes (rows of other groups aside, never stored)."""
    ops = _ops(counts, n, k, 101 + sum(counts) + k + stages, "cuda", extra=extra)
    what = f"tma stages={stages} counts={counts} n={n} k={k} extra={extra} ctas={ctas}"
    got = _run(ops, stages, ctas=ctas, tma=True)
    _assert_bits(got, _run(ops, 5, ctas=ctas), what)
    _assert_close(got, _oracle(*ops[:4], counts), what)
    assert got[sum(counts) :].isnan().all(), f"{what}: rows past offs[-1] were written"


@pytest.mark.gpu
@needs_kernel
def test_gpu_built_variants() -> None:
    """The `_C` under test was built from this source (a stale build lacks the TMA variants)."""
    assert db.compiled_variants() == db.VARIANTS, f"rebuild _C: built {db.compiled_variants()}, source {db.VARIANTS}"


@pytest.mark.gpu
@needs_kernel
def test_gpu_tma_dense_and_graph() -> None:
    """Dense entry point with tma=True (one group) and a CUDA-graph replay (the maps are kernel parameters)."""
    m, n, k = 333, 256, 512
    a, sfa, b, sfb, _ = _ops([m], n, k, 77, "cuda", extra=0)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    db.fp8_gemm_nt_db(a, sfa, b[0], sfb[0], out, tma=True)
    torch.cuda.synchronize()
    _assert_bits(out, _run((a, sfa, b, sfb, torch.tensor([m], dtype=torch.int32, device="cuda"))), "dense tma")
    graph = torch.cuda.CUDAGraph()
    replay = torch.full_like(out, float("nan"))
    with torch.cuda.graph(graph):
        db.fp8_gemm_nt_db(a, sfa, b[0], sfb[0], replay, tma=True)
    graph.replay()
    torch.cuda.synchronize()
    _assert_bits(replay, out, "graph replay tma")


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize(("m", "n", "k"), [(300, 256, 7168), (128, 128, 128), (1000, 512, 1536)])
def test_gpu_dense_vs_oracle_and_one_group(m: int, n: int, k: int) -> None:
    a, sfa, b, sfb, _ = _ops([m], n, k, m + n + k, "cuda", extra=0)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    db.fp8_gemm_nt_db(a, sfa, b[0], sfb[0], out)
    torch.cuda.synchronize()
    _assert_close(out, _oracle(a, sfa, b, sfb, [m]), f"dense m={m} n={n} k={k}")
    grouped = _run((a, sfa, b, sfb, torch.tensor([m], dtype=torch.int32, device="cuda")))
    assert torch.equal(out.view(torch.int16), grouped.view(torch.int16)), "dense != one-group grouped"


@pytest.mark.gpu
@needs_kernel
def test_gpu_vs_api() -> None:
    """Against the package API's FP8 GEMM (CUTLASS on the H200): the same math, another summation order."""
    from deepinfer import deep_gemm as dg

    m, n, k = 520, 512, 2048
    a, sfa, b, sfb, _ = _ops([m], n, k, 11, "cuda", extra=0)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    db.fp8_gemm_nt_db(a, sfa, b[0], sfb[0], out)
    api = torch.empty_like(out)
    dg.fp8_gemm_nt((a, sfa), (b[0], sfb[0]), api)
    torch.cuda.synchronize()
    diff = calc_diff(out.double(), api.double())
    assert diff < DIFF_LIMIT, f"calc_diff vs the API {diff:.3e}"


@pytest.mark.gpu
@needs_kernel
def test_gpu_cuda_graph_new_offs() -> None:
    """offs is read on the device only: a captured launch follows new offs on replay."""
    counts = [40, 40, 40, 40]
    a, sfa, b, sfb, offs = _ops(counts, 256, 512, 3, "cuda", extra=0)
    out = torch.full((160, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
    db.m_grouped_fp8_gemm_nt_offsets_db(a, sfa, b, sfb, offs, out)  # warm-up (opt-in) outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        db.m_grouped_fp8_gemm_nt_offsets_db(a, sfa, b, sfb, offs, out)
    offs.copy_(torch.tensor([0, 70, 70, 100], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _assert_close(out, _oracle(a, sfa, b, sfb, [0, 70, 0, 30]), "graph replay with new offs")
    assert out[100:].isnan().all()
