"""The FP8 block-scaled GEMM with double-buffered promotion (`backends/cuda/cuda_fp8_db.py`, csrc/cuda/dg_fp8_db.cuh and
dg_fp8_tma.cuh).

CPU: argument validation (each bad argument raises naming it), the unbuilt-kernel error, an sm_90a nvcc compile check
(no spills, no wgmma serialisation warning). `gpu`: against a float64 oracle (calc_diff < 1e-5, the CUTLASS FP8 tests'
bound: rounding order + one bf16 rounding; a wrong scale or tile gives ~1e-2 .. 1) on fresh random data and scales:
m not a multiple of 128, empty groups, k = 128 (one block: only the drain), k = 7168, few CTAs (several tiles each);
rows past offs[-1] untouched; dense == one group (bit-equal); stages 4 == 5 (bit-equal); vs the API's output.
The TMA-producer variants (tma=1, `fp8_db_t5` / `fp8_db_t4`) run every oracle case and must be BIT-equal to
`fp8_db_s5` (same shared-memory bytes, same math), also at m % 128 != 0 (TMA zero-fills rows past m), m = 1, k = 128.
The 128 x 256 tile variants (wide=True, tma mode 2, `fp8_wide_t4` / `fp8_wide_t3`; these tests passed on the H200 in
session 12) must be BIT-equal to `fp8_db_t4` (same four wgmmas per element and k block, same promotion order)
on every n % 256 == 0 oracle case, and within the float64-oracle bound; CPU: their n % 256 validation and ptxas check.
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
NARROW = tuple(v for v in db.VARIANTS if v[2] != db.WIDE)  # 128 x 128 tiles
WIDE = tuple(v for v in db.VARIANTS if v[2] == db.WIDE)  # 128 x 256 tiles


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


@pytest.mark.parametrize("n", [128, 384])
def test_wide_validation(n: int) -> None:
    """wide=True needs n % 256 == 0 (one tile is 256 columns); the error names b."""
    args = _good(n=n)
    with pytest.raises(ValueError, match=re.escape("b: expected n % 256 == 0 with wide=True")):
        db.m_grouped_fp8_gemm_nt_offsets_db(**args, wide=True)
    a, sfa = args["a"], args["sfa"]
    with pytest.raises(ValueError, match=re.escape("b: expected n % 256 == 0")):
        db.fp8_gemm_nt_db(a, sfa, args["b"][0], args["sfb"][0], args["out"], wide=True)


@pytest.mark.parametrize(
    ("m", "n", "k", "want"),
    [
        (4096, 4096, 2048, True), (16384, 32768, 1024, True), (4096, 1024, 4096, True), (4096, 2048, 4096, True),
        (16384, 2048, 4096, False), (4096, 4096, 8192, False), (16384, 4096, 8192, False),  # CUTLASS measured faster
        (2048, 4096, 2048, False),  # m < WIDE_API_MIN_M: not measured against the API
        (4096, 4224, 2048, False),  # n % 256 != 0
    ],
)  # fmt: skip
def test_wide_rule(m: int, n: int, k: int, want: bool) -> None:
    """The API's auto rule for the 128 x 256 tile kernel (session 12's H200 runs; see wide_rule)."""
    assert db.wide_rule(m, n, k) is want


def test_dense_env_accepts_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """DEEPINFER_DEEP_GEMM_FP8_DENSE=wide parses (a CPU device falls back to "triton"); a bad value names the env."""
    from deepinfer.deep_gemm._dispatch import FP8_DENSE_ENV, fp8_dense_impl

    monkeypatch.setenv(FP8_DENSE_ENV, "wide")
    assert fp8_dense_impl(torch.device("cpu")) in ("wide", "triton")
    monkeypatch.setenv(FP8_DENSE_ENV, "widest")
    with pytest.raises(ValueError, match=FP8_DENSE_ENV):
        fp8_dense_impl(torch.device("cpu"))


def test_variant_names() -> None:
    assert db.variant_name(5, False, True) == "fp8_db_t5"
    assert [db.variant_name(s, bool(t), w) for s, t, w in WIDE] == ["fp8_wide_t4", "fp8_wide_t3"]
    assert db.DEFAULT_WIDE_STAGES in [v[0] for v in WIDE]


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
    """VARIANTS + W4A8_VARIANT (Python) list the (stages, stagger, tma) triples fp8_db_variants() returns (.cu)."""
    src = (_CSRC / "dg_fp8_db.cu").read_text()
    body = re.search(r"fp8_db_variants\(\) \{\s*return \{(.*?)\};\s*\}", src, re.S)
    assert body is not None
    triples = tuple(tuple(int(x) for x in t) for t in re.findall(r"\{(\d+), (\d+), (\d+)\}", body.group(1) + "}"))
    assert triples == (*db.VARIANTS, db.W4A8_VARIANT)


def test_valid_operands_reach_the_launch() -> None:
    """Valid CPU operands pass validation and stop at the launch: unbuilt kernel or not a CUDA tensor."""
    exc = ValueError if db.available() else RuntimeError
    with pytest.raises(exc, match="CUDA tensor|not built"):
        db.m_grouped_fp8_gemm_nt_offsets_db(**_good())
    with pytest.raises(exc, match="CUDA tensor|not built"):
        db.m_grouped_fp8_gemm_nt_offsets_db(**_good(n=256), wide=True)  # stages None: DEFAULT_WIDE_STAGES


def _ptxas_entries(stderr: str) -> dict[str, str]:
    """{mangled entry name: its ptxas -v lines} of one nvcc run."""
    parts = re.split(r"ptxas info\s*: Compiling entry function '(\w+)'", stderr)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def compile_fp8_db() -> subprocess.CompletedProcess:
    """nvcc -Xptxas -v of dg_fp8_db.cu for sm_90a (every fp8_db / fp8_wide / W4A8 wide kernel); skips without nvcc;
    asserts it compiled. Also used by test_dg_w4a8_wide.py."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    cmd = [nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c",
           str(_CSRC / "dg_fp8_db.cu"), "-o", os.devnull]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_fp8_db_sm90_compile() -> None:
    """nvcc 13 builds dg_fp8_db.cu for sm_90a: no spills / stack, no wgmma serialisation (C7508, C7510 .. C7520:
    the two temporaries must stay in flight), <= 168 registers at launch (65536 / 384; setmaxnreg moves the rest).
    Every kernel is checked on its own lines, the wide ones (fp8_wide_kernel: acc[128] + one temporary at setmaxnreg
    232, producer 40) included."""
    res = compile_fp8_db()
    entries = _ptxas_entries(res.stderr)
    kernels = {name: info for name, info in entries.items() if re.search(r"fp8_(?:db_(?:tma_)?|wide_)kernel", name)}
    assert len(kernels) == len(db.VARIANTS), res.stderr[-2000:]
    assert sum("fp8_wide_kernel" in name for name in kernels) == len(WIDE), list(kernels)
    for name, info in kernels.items():
        regs = int(re.search(r"Used (\d+) registers", info).group(1))
        frame = int(re.search(r"(\d+) bytes stack frame", info).group(1))
        spill = int(re.search(r"(\d+) bytes spill stores", info).group(1))
        assert regs <= 168 and frame == 0 and spill == 0, f"{name}: {info}"
    bad = re.findall(r"C75(?:0[89]|1\d|20)", res.stderr)
    assert not bad, res.stderr[-3000:]


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
@pytest.mark.parametrize(("stages", "stagger", "tma"), NARROW, ids=lambda v: str(v))
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
    want = (*db.VARIANTS, db.W4A8_VARIANT)
    assert db.compiled_variants() == want, f"rebuild _C: built {db.compiled_variants()}, source {want}"


def _dense_run(m: int, n: int, k: int, seed: int, **kw: object) -> tuple[tuple, torch.Tensor]:
    """One-group operands (a, sfa, b [1, n, k], sfb [1, ...]) on the GPU and fp8_gemm_nt_db(a, sfa, b[0], sfb[0], out,
    **kw)'s out, synchronised."""
    a, sfa, b, sfb, _ = _ops([m], n, k, seed, "cuda", extra=0)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    db.fp8_gemm_nt_db(a, sfa, b[0], sfb[0], out, **kw)
    torch.cuda.synchronize()
    return (a, sfa, b, sfb), out


def _assert_dense_replay(ops: tuple, want: torch.Tensor, kw: dict, what: str) -> None:
    """fp8_gemm_nt_db(*ops, out, **kw) captured in a CUDA graph and replayed into a NaN-filled out == want, bit for bit
    (the tensor maps are kernel parameters: the capture keeps them)."""
    graph = torch.cuda.CUDAGraph()
    replay = torch.full_like(want, float("nan"))
    with torch.cuda.graph(graph):
        db.fp8_gemm_nt_db(*ops, replay, **kw)
    graph.replay()
    torch.cuda.synchronize()
    _assert_bits(replay, want, what)


@pytest.mark.gpu
@needs_kernel
def test_gpu_tma_dense_and_graph() -> None:
    """Dense entry point with tma=True (one group) and a CUDA-graph replay (the maps are kernel parameters)."""
    m, n, k = 333, 256, 512
    (a, sfa, b, sfb), out = _dense_run(m, n, k, 77, tma=True)
    _assert_bits(out, _run((a, sfa, b, sfb, torch.tensor([m], dtype=torch.int32, device="cuda"))), "dense tma")
    _assert_dense_replay((a, sfa, b[0], sfb[0]), out, {"tma": True}, "graph replay tma")


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


# ---------------------------------------------------------------- GPU: the 128 x 256 tile kernel (wide)

WIDE_CASES = [  # (counts, n, k, extra rows past offs[-1], ctas): the oracle / TMA cases with n % 256 == 0
    ([3, 0, 130, 64, 1], 256, 512, 3, 0),  # empty group, partial tiles, 2 m tiles in one group
    ([200, 17], 512, 128, 3, 3),  # k = 128: one block per tile; few CTAs, several tiles each
    ([0, 0, 40], 256, 7168, 3, 0),  # leading empty groups, k = 7168 (56 blocks: the ring wraps many times)
    ([300], 256, 1024, 0, 2),  # m % 128 != 0 (rows past m zero-filled by TMA), 2 CTAs
    ([256] * 6, 512, 2048, 3, 0),  # full tiles, many k blocks per tile
    ([5, 9, 140], 256, 384, 3, 1),  # one CTA walks every tile; rows past offs[-1] (< m) loaded, never stored
    ([70, 0, 129], 768, 128, 0, 0),  # ragged groups, 3 n tiles, k = 128
    ([1], 256, 128, 0, 0),  # m = 1, one block
    ([1], 512, 1024, 0, 0),  # m = 1, several blocks, 2 n tiles
]


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize(("stages", "stagger", "tma"), WIDE, ids=lambda v: str(v))
@pytest.mark.parametrize(("counts", "n", "k", "extra", "ctas"), WIDE_CASES)
def test_gpu_wide_bit_equal_t4(
    stages: int, stagger: int, tma: int, counts: list[int], n: int, k: int, extra: int, ctas: int
) -> None:
    """fp8_wide_t{stages} == fp8_db_t4 bit for bit (same wgmmas per element and k block, same promotion order),
    within the float64-oracle bound, rows past offs[-1] untouched."""
    ops = _ops(counts, n, k, 211 + sum(counts) + n + k + stages, "cuda", extra=extra)
    what = f"wide stages={stages} counts={counts} n={n} k={k} extra={extra} ctas={ctas}"
    a, sfa, b, sfb, offs = ops
    got = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
    db.m_grouped_fp8_gemm_nt_offsets_db(a, sfa, b, sfb, offs, got, stages=stages, ctas=ctas, wide=True)
    torch.cuda.synchronize()
    _assert_bits(got, _run(ops, 4, ctas=ctas, tma=True), what)
    _assert_close(got, _oracle(*ops[:4], counts), what)
    assert got[sum(counts) :].isnan().all(), f"{what}: rows past offs[-1] were written"


@pytest.mark.gpu
@needs_kernel
def test_gpu_wide_dense_and_graph() -> None:
    """Dense entry point with wide=True (default stages) == fp8_db_t4, and a CUDA-graph replay of it."""
    m, n, k = 333, 512, 512
    (a, sfa, b, sfb), out = _dense_run(m, n, k, 78, wide=True)
    want = torch.empty_like(out)
    db.fp8_gemm_nt_db(a, sfa, b[0], sfb[0], want, stages=4, tma=True)
    torch.cuda.synchronize()
    _assert_bits(out, want, "dense wide")
    _assert_dense_replay((a, sfa, b[0], sfb[0]), out, {"wide": True}, "graph replay wide")


@pytest.mark.gpu
@needs_kernel
def test_gpu_dense_offs_first_made_in_a_capture() -> None:
    """A dense call first seen inside a CUDA-graph capture makes its one-group offs there (not cached: it lives in
    the graph's pool); the replay is right, and a later eager call with the same m makes and caches its own."""
    m, n, k = 417, 256, 256
    a, sfa, b, sfb, _ = _ops([m], n, k, 91, "cuda", extra=0)
    assert (m, a.device) not in db._DENSE_OFFS
    graph, out = torch.cuda.CUDAGraph(), torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    with torch.cuda.graph(graph):
        db.fp8_gemm_nt_db(a, sfa, b[0], sfb[0], out, wide=True)
    assert (m, a.device) not in db._DENSE_OFFS
    graph.replay()
    eager = torch.empty_like(out)
    db.fp8_gemm_nt_db(a, sfa, b[0], sfb[0], eager, wide=True)
    torch.cuda.synchronize()
    assert (m, a.device) in db._DENSE_OFFS
    _assert_bits(out, eager, "graph-made offs vs cached offs")
    _assert_close(eager, _oracle(a, sfa, b, sfb, [m]), "dense m=417")


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("env", ["auto", "wide", "cutlass"])
def test_gpu_api_routes_wide(env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The public fp8_gemm_nt runs fp8_wide where the auto rule (or =wide) says, bit-equal to the direct call and
    within the float64-oracle bound; =cutlass never runs it. m 4096 x n 512 x k 1024 (a rule shape)."""
    from deepinfer import deep_gemm as dg
    from deepinfer.deep_gemm._dispatch import FP8_DENSE_ENV

    monkeypatch.setenv(FP8_DENSE_ENV, env)
    m, n, k = 4096, 512, 1024
    a, sfa, b, sfb, _ = _ops([m], n, k, 55, "cuda", extra=0)
    calls = []
    real = db.fp8_gemm_nt_db
    monkeypatch.setattr(db, "fp8_gemm_nt_db", lambda *args, **kw: calls.append(kw) or real(*args, **kw))
    got = dg.fp8_gemm_nt((a, sfa), (b[0], sfb[0]))
    torch.cuda.synchronize()
    assert bool(calls) is (env != "cutlass"), f"env={env}: fp8_wide calls {calls}"
    want = torch.empty_like(got)
    real(a, sfa, b[0], sfb[0], want, wide=True)
    torch.cuda.synchronize()
    if env != "cutlass":
        _assert_bits(got, want, f"API env={env}")
    _assert_close(got, _oracle(a, sfa, b, sfb, [m]), f"API env={env}")


@pytest.mark.skipif(not set(WIDE) <= set(db.compiled_variants()), reason="_C built without the wide kernel")
def test_wide_launcher_checks() -> None:
    """The C++ launcher rejects n % 256 != 0 for tma mode 2 before any CUDA call; the 4-stage ring fits at g = 4096."""
    mod = db._module()
    with pytest.raises(ValueError, match=re.escape("n % 256 == 0")):
        mod.fp8_db_grouped(4, 0, db.WIDE, 0, 0, 0, 0, 0, 0, 4, 384, 128, 1, 0, 0)
    assert 0 < mod.fp8_db_smem_bytes(4, db.MAX_GROUPS, db.WIDE) <= 227 * 1024
    assert mod.fp8_db_smem_bytes(5, 1, db.WIDE) == -1
