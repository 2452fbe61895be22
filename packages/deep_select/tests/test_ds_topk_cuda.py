"""CUDA C++ radix top-k (`csrc/cuda/topk_radix.cu`, `backends/cuda/cuda_topk.py`) against the reference, exactly.

CPU: the kernel's own device code (`csrc/cuda/topk_radix_kernel.cuh`) built with g++ against a CPU emulation of
the CUDA features it uses (`cuda_emu/`: threads, barriers, warp shuffles / votes, shared atomics, cub::BlockScan)
and compared with the reference on every distribution; the dispatch's fallback when `_C` is absent.
GPU (`-m gpu`, needs a DEEPINFER_DEVICE=cuda build): the kernel itself, n from 1 to 262,144, k up to 2,048 and
k > n, lengths, ragged rows, tiny caps (extra row passes), scalar loads, unaligned rows, strided outputs,
CUDA-graph capture and the API's "cuda" backend.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import subprocess
import tempfile

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from ds_checks import DISTRIBUTIONS, check_topk  # noqa: E402
from test_ds_topk_triton import _scores, assert_matches_reference  # noqa: E402

from deepinfer.deep_select import api  # noqa: E402
from deepinfer.deep_select import reference as ref  # noqa: E402
from deepinfer.deep_select.backends.cuda import cuda_topk  # noqa: E402
from deepinfer.deep_select.backends.cuda.dispatch import select_indices  # noqa: E402

gpu = pytest.mark.gpu
_ALL_DISTS = (*DISTRIBUTIONS, "signed_zeros", "nan_inf")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def assert_same_sets(scores: torch.Tensor, k: int, got: torch.Tensor, want: torch.Tensor, note: str) -> None:
    """got (kernel, any order) vs want (reference) [b, k]: same chosen sets, padding exactly in the last slots.

    Compares on got's device (fast at 262,144 columns); the message names the first bad row and the ids that
    differ."""
    assert got.dtype == torch.int32 and tuple(got.shape) == tuple(want.shape), (note, got.dtype, tuple(got.shape))
    want = want.to(got.device)
    m = (want >= 0).sum(dim=1, keepdim=True)
    slot = torch.arange(k, device=got.device)[None, :]
    layout_bad = ((slot < m) & (got < 0)) | ((slot >= m) & (got != -1))
    g = torch.sort(got.long(), dim=1).values
    w = torch.sort(want.long(), dim=1).values
    bad = (g != w).any(dim=1) | layout_bad.any(dim=1)
    if bool(bad.any()):
        r = int(bad.nonzero()[0, 0])
        extra = sorted(set(got[r].tolist()) - set(want[r].tolist()))[:8]
        missing = sorted(set(want[r].tolist()) - set(got[r].tolist()))[:8]
        raise AssertionError(
            f"{note}: {int(bad.sum())} of {bad.numel()} rows differ; first row {r} (valid picks {int(m[r])}): "
            f"layout ok={not bool(layout_bad[r].any())}, extra ids {extra}, missing ids {missing}, "
            f"scores dtype {scores.dtype}"
        )


# ---- CPU: the kernel's own code in the CPU emulation (tests/cuda_emu/), and the dispatch without _C ----

_EMU_DIR = pathlib.Path(__file__).resolve().parent / "cuda_emu"
_CSRC = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda"
_EMU_THREADS = 64  # fewer threads than the GPU's 512 (the code is generic in it); 512 OS threads are slow here
_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@pytest.fixture(scope="module")
def emu() -> ctypes.CDLL:
    """topk_radix_kernel.cuh built for the CPU emulation (g++ -std=c++20), loaded through ctypes."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler for the CPU emulation of the CUDA kernel")
    lib = pathlib.Path(tempfile.mkdtemp(prefix="ds_emu_")) / "emu.so"
    cmd = [cxx, "-std=c++20", "-O0", "-pthread", "-shared", "-fPIC", f"-DDS_THREADS={_EMU_THREADS}"]
    cmd += [f"-I{_CSRC}", f"-I{_EMU_DIR}", str(_EMU_DIR / "emu_driver.cpp"), "-o", str(lib)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        if "barrier" in res.stderr and "No such file" in res.stderr:
            pytest.skip("the C++ compiler lacks C++20 <barrier>")
        raise AssertionError(f"emulation build failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")
    dll = ctypes.CDLL(str(lib))
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    dll.emu_topk_radix.argtypes = [p, i32, i64, i64, i64, p, p, p, i64, i64, i64, i32, i32, i32, p, i64]
    dll.emu_topk_radix.restype = i32
    return dll


def run_emu(
    dll: ctypes.CDLL,
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
    *,
    cap: int = 8192,
    vec: bool = True,
    one_read: bool = True,
    mode: str | None = None,
) -> torch.Tensor:
    """The kernel on CPU tensors (unit column stride; vec needs 16-byte aligned rows, as the launcher checks).

    mode: "fast" / "one_read" / "two_pass" (cuda_topk.MODES); None: "one_read" or "two_pass" by `one_read`."""
    b, n = scores.shape
    mode = ("one_read" if one_read else "two_pass") if mode is None else mode
    assert scores.stride(1) == 1 or n <= 1
    if vec:
        assert scores.data_ptr() % 16 == 0 and (scores.stride(0) * scores.element_size()) % 16 == 0
    out = torch.full((b, k), -7, dtype=torch.int32)  # every slot must be overwritten
    ptr = [0 if t is None else t.data_ptr() for t in (lengths, starts)]
    rc = dll.emu_topk_radix(
        scores.data_ptr(), _CODE[scores.dtype], b, n, scores.stride(0), ptr[0], ptr[1], out.data_ptr(), k,
        out.stride(0), out.stride(1), cap, int(vec) | (2 * cuda_topk.MODES[mode]), 1, None, 0,
    )  # fmt: skip
    assert rc == 0
    return out


def run_emu_split(
    dll: ctypes.CDLL, scores: torch.Tensor, k: int, segs: int, lengths: torch.Tensor | None = None, *, cap: int = 8192
) -> torch.Tensor:
    """`topk_cuda_split` on CPU tensors: the first stage (segs CTAs per row) then the gather merge, fast mode."""
    b, n = scores.shape
    lp = 0 if lengths is None else lengths.data_ptr()
    code = _CODE[scores.dtype]
    stage1 = torch.full((b * segs, k), -7, dtype=torch.int32)
    rc = dll.emu_topk_radix(
        scores.data_ptr(), code, b, n, scores.stride(0), lp, None, stage1.data_ptr(), k, k, 1, cap, 1 | 4, segs, None, 0
    )
    assert rc == 0
    cand = stage1.view(b, segs * k)
    out = torch.full((b, k), -7, dtype=torch.int32)
    m = segs * k
    rc = dll.emu_topk_radix(
        scores.data_ptr(), code, b, n, scores.stride(0), lp, None, out.data_ptr(), k, k, 1, cap, int(m % 4 == 0) | 4, 1,
        cand.data_ptr(), m,
    )  # fmt: skip
    assert rc == 0
    return out


@pytest.mark.parametrize("dist", _ALL_DISTS)
def test_emulated_kernel_matches_reference(emu: ctypes.CDLL, dist: str) -> None:
    """The CUDA kernel's code on CPU: one-read mode with the default cap, one-read with cap 2 and scalar loads
    (overflow -> two-pass fallback -> extra row passes over the column digits), two-pass mode; lengths
    0 / 1 / short / full, each dtype in turn."""
    dtype = _DTYPES[_ALL_DISTS.index(dist) % 3]
    g = torch.Generator().manual_seed(71)
    b, n = 4, 264  # n % 8 == 0: 16-byte aligned bf16 / fp16 rows
    scores = _scores(dist, b, n, dtype, g)
    lengths = torch.tensor([n, 1, 0, 203], dtype=torch.int32)
    cases = (
        (37, 8192, True, "one_read", lengths),
        (150, 2, False, "one_read", None),
        (37, 8192, False, "two_pass", lengths),
        (37, 8192, True, "fast", lengths),
        (150, 2, False, "fast", None),
        (37, 8192, True, "lean", lengths),
        (150, 2, False, "lean", None),
        (37, 8192, True, "lean_pf", lengths),
    )
    for k, cap, vec, mode, lens in cases:
        got = run_emu(emu, scores, k, lens, cap=cap, vec=vec, mode=mode)
        want, _ = ref.topk(scores, k, lens)
        assert_same_sets(scores, k, got, want, f"{dist} {dtype} k={k} cap={cap} vec={vec} mode={mode}")


def test_emulated_kernel_ragged_and_big_k(emu: ctypes.CDLL) -> None:
    """Ragged ranges (relative ids, rows off the 16-byte grid read by element), k > n, all-equal rows."""
    g = torch.Generator().manual_seed(74)
    scores = _scores("few_values", 5, 301, torch.float32, g)
    starts = torch.tensor([-3, 0, 17, 290, 100], dtype=torch.int32)
    ends = torch.tensor([200, 304, 16, 301, 301], dtype=torch.int32)
    got = run_emu(emu, scores, 40, ends, starts, vec=False)
    assert_same_sets(scores, 40, got, ref.topk_ragged(scores, 40, starts, ends)[0], "ragged")
    got = run_emu(emu, scores[:, :300], 400, vec=False)
    assert_same_sets(scores, 400, got, ref.topk(scores[:, :300], 400)[0], "k > n")
    flat = torch.full((1, 3000), 0.25)
    got = run_emu(emu, flat, 700, cap=64)
    assert_same_sets(flat, 700, got, ref.topk(flat, 700)[0], "all equal, cap 64")
    normal = _scores("normal", 2, 3000, torch.bfloat16, g)  # cap 200: the buffer is pruned between tiles
    got = run_emu(emu, normal, 40, cap=200)
    assert_same_sets(normal, 40, got, ref.topk(normal, 40)[0], "normal rows, pruned buffer")
    rising = torch.arange(3000, dtype=torch.float32)[None] * 0.5  # every tile beats the last: the buffer overflows
    for cap in (8192, 500):
        got = run_emu(emu, rising, 300, cap=cap)
        assert_same_sets(rising, 300, got, ref.topk(rising, 300)[0], f"ascending row, cap {cap}")


_FAST_CASES = [
    ("normal", torch.float32),
    ("few_values", torch.bfloat16),
    ("bits_tiny", torch.float16),
    ("nan_hot", torch.float32),
    ("inf", torch.bfloat16),
    ("all_equal", torch.float32),
]


@pytest.mark.parametrize(("dist", "dtype"), _FAST_CASES)
def test_emulated_fast_mode_many_tiles(emu: ctypes.CDLL, dist: str, dtype: torch.dtype) -> None:
    """The fast one-read pass over many tiles (tile = 64 emulated threads x 4 x 16 B): the filtered histogram,
    the refresh after tiles 0-3 then every 4th, the prefetched last tile, pruning, overflow, with lengths and
    (scalar loads) ragged ranges."""
    g = torch.Generator().manual_seed(75)
    n = 9_000  # fp32: 9 tiles of 1,024; 16-bit: 5 tiles of 2,048
    scores = _scores(dist, 2, n + 8, dtype, g)[:, :n]  # row stride n + 8 keeps 16-byte aligned rows
    lengths = torch.tensor([n, 8_191], dtype=torch.int32)
    for k, cap in ((1, 8192), (300, 1500), (300, 700)):  # cap 1500: pruned after tile 0; 700: overflow fallback
        got = run_emu(emu, scores, k, lengths, cap=cap, mode="fast")
        assert_same_sets(scores, k, got, ref.topk(scores, k, lengths)[0], f"{dist} {dtype} k={k} cap={cap}")
    starts = torch.tensor([5, 1_000], dtype=torch.int32)
    ends = torch.tensor([n, 7_777], dtype=torch.int32)
    got = run_emu(emu, scores, 200, ends, starts, vec=False, mode="fast")
    assert_same_sets(scores, 200, got, ref.topk_ragged(scores, 200, starts, ends)[0], f"{dist} {dtype} ragged")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_emulated_16bit_nan_picks(emu: ctypes.CDLL, dtype: torch.dtype) -> None:
    """16-bit rows whose picks run into the NaNs (ranked last, ties by column): the refine skips the u[9:0]
    digit of 16-bit values, which is 0 except for NaN's rank image (0x3FF)."""
    g = torch.Generator().manual_seed(78)
    row = torch.randn(2, 3000, generator=g)
    row[:, torch.randperm(3000, generator=g)[:2000]] = float("nan")
    row = row.to(dtype)
    for mode in ("fast", "lean", "two_pass"):
        for k in (1500, 1001):
            got = run_emu(emu, row, k, mode=mode)
            assert_same_sets(row, k, got, ref.topk(row, k)[0], f"NaN picks {dtype} k={k} mode={mode}")


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_emulated_fast_mode_ascending_and_descending(emu: ctypes.CDLL, mode: str) -> None:
    """Rows where every tile beats the last (the kept set overflows: two-pass fallback), the best come first
    (everything after tile 0 is filtered out), and ties across the filter's bucket boundary."""
    n = 5_000  # 5 tiles of 1,024
    rising = torch.arange(n, dtype=torch.float32)[None] * 0.25
    falling = rising.flip(1).contiguous()
    steps = (torch.arange(n) // 700).to(torch.float32)[None]  # 700-long runs of equal values, ascending
    for name, row in (("rising", rising), ("falling", falling), ("steps", steps)):
        for k, cap in ((700, 8192), (701, 1500), (5, 3)):
            got = run_emu(emu, row, k, cap=cap, mode=mode)
            assert_same_sets(row, k, got, ref.topk(row, k)[0], f"{name} k={k} cap={cap} mode={mode}")


_LEAN_CASES = [  # (dist, dtype, ks, caps): cap 1,500 prunes between tiles, 700 overflows (two-pass fallback)
    ("normal", torch.float32, (1, 300), (8192, 1500, 700)),  # float compare, interior and edge tiles
    ("bits_tiny", torch.bfloat16, (300,), (8192, 700)),  # denormal thresholds (float compare of bf16 << 16)
    ("nan_hot", torch.float16, (300,), (8192, 1500)),  # fp16: rank compare
    ("signed_zeros", torch.float32, (1500,), (8192,)),  # threshold bucket at +-0.0: -0.0 >= +0.0
    ("nan_inf", torch.float32, (2000, 4000), (8192,)),  # thresholds at -inf and below it (NaN): rank compare
    ("normal", torch.bfloat16, (1, 300), (8192, 1500)),
    ("bucket_edges", torch.float32, (300, 2500), (8192, 1500)),  # values on bucket lower bounds: the compare is >=
    ("bucket_edges", torch.bfloat16, (300,), (8192,)),
]


def _bucket_edges(b: int, n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Values drawn from lower bounds of the kernel's first-digit buckets (sign, exponent, 3 mantissa bits; the
    negatives' bounds are their magnitudes' upper ends), so the k-th value sits on a bucket edge."""
    edges = torch.tensor([3.0, 2.5, 2.0, 1.125, 1.0, 0.75, -0.5, -1.0, -2.25, -3.0e-39], dtype=torch.float32)
    return edges[torch.randint(0, len(edges), (b, n), generator=g)].to(dtype)


@pytest.mark.parametrize(("dist", "dtype", "ks", "caps"), _LEAN_CASES)
def test_emulated_lean_mode_many_tiles(emu: ctypes.CDLL, dist: str, dtype: torch.dtype, ks: tuple, caps: tuple) -> None:
    """Lean mode over many tiles (64 emulated threads x 4 x 16 B: 1,024 fp32 / 2,048 16-bit entries): tile 0
    counted then kept, the float / rank threshold compare, tiles inside the row (no validity math) and crossing
    its end or `lengths`, refreshes, pruning (cap 1,500) and overflow (cap 700); ragged rows with scalar loads."""
    g = torch.Generator().manual_seed(77)
    n = 9_000
    make = _bucket_edges if dist == "bucket_edges" else lambda *a: _scores(dist, *a)
    scores = make(2, n + 8, dtype, g)[:, :n]  # row stride n + 8 keeps 16-byte aligned rows
    lengths = torch.tensor([n, 6_001], dtype=torch.int32)
    for k in ks:
        for cap in caps:
            got = run_emu(emu, scores, k, lengths, cap=cap, mode="lean")
            want = ref.topk(scores, k, lengths)[0]
            assert_same_sets(scores, k, got, want, f"lean {dist} {dtype} k={k} cap={cap}")
    starts = torch.tensor([5, 1_003], dtype=torch.int32)
    ends = torch.tensor([n, 7_777], dtype=torch.int32)
    want = ref.topk_ragged(scores, ks[-1], starts, ends)[0]
    for vec in (False, True):  # 16-byte loads: starts off the vector grid (the first vector straddles lo)
        got = run_emu(emu, scores, ks[-1], ends, starts, vec=vec, mode="lean")
        assert_same_sets(scores, ks[-1], got, want, f"lean {dist} {dtype} ragged vec={vec}")


@pytest.mark.parametrize(("dist", "dtype"), [("normal", torch.float32), ("few_values", torch.bfloat16)])
def test_emulated_split(emu: ctypes.CDLL, dist: str, dtype: torch.dtype) -> None:
    """The split for few long rows: segments (the last one short or empty), per-segment top k as row ids, the
    gather merge with the row's tie rule; lengths inside and past segment ends; k > a segment; k > length; a
    small cap (the merge's pruning / overflow fallback)."""
    g = torch.Generator().manual_seed(76)
    n = 2_000
    scores = _scores(dist, 2, n + 8, dtype, g)[:, :n]
    lengths = torch.tensor([1_130, 5], dtype=torch.int32)
    for k, segs, lens, cap in ((40, 3, lengths, 8192), (700, 2, None, 8192), (64, 3, None, 50)):
        got = run_emu_split(emu, scores, k, segs, lens, cap=cap)
        want = ref.topk(scores, k, lens)[0]
        assert_same_sets(scores, k, got, want, f"split {dist} {dtype} k={k} segs={segs} cap={cap}")


def test_dispatch_without_compiled_module_uses_triton() -> None:
    """impl="cuda" on a build without _C (or on CPU tensors) runs the Triton chain, silently."""
    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    g = torch.Generator().manual_seed(73)
    scores = _scores("few_values", 2, 200, torch.float32, g)
    idx = select_indices(scores, 30, impl="cuda")
    assert_matches_reference(scores, 30, None, _ascending(idx))


def _ascending(idx: torch.Tensor) -> torch.Tensor:
    """Chosen ids ascending, then the -1 padding (the layout `assert_matches_reference` expects)."""
    key = torch.where(idx < 0, torch.full_like(idx, 2**30), idx)
    s = torch.sort(key, dim=1).values
    return torch.where(s == 2**30, torch.full_like(s, -1), s)


def test_choose_split_fill() -> None:
    """Fast segments (session 3's rule), SPLIT_FILL (CTAs per SM the split aims at): 2 splits only b <= SMs; 4 also
    splits b = 256 in 2."""
    assert cuda_topk.choose_split(256, 65536, 512, 132, fill=2, mode="fast") == 1
    assert cuda_topk.choose_split(256, 65536, 512, 132, fill=4, mode="fast") == 2
    assert cuda_topk.choose_split(64, 262144, 512, 132, fill=2, mode="fast") == 4
    assert cuda_topk.choose_split(64, 262144, 512, 132, fill=4, mode="fast") == 8
    assert cuda_topk.choose_split(1, 262144, 2048, 132, fill=2, mode="fast") == 11  # sqrt(n / k)
    for mode in cuda_topk.SPLIT_MODES:
        assert cuda_topk.choose_split(1, 8192, 16, 132, mode=mode) == 1  # short rows never split
        assert cuda_topk.choose_split(1, 262144, 40000, 132, mode=mode) == 1  # nor k > n / 8


# Session-4 H200 rows (fp32, us; JSON benchmarks/results/2026-11-30-s4-bench-deep_select.json): (b, n, k) -> the
# lean segments the API must pick = the fastest measured of one lean CTA per row (cuda_lean) and the lean split
# with S segments (cuda_lean_split at fast's S, cuda_lean_s{S}). Comments: S: time, ..., 1: time.
_LEAN_SPLIT_ROWS = {
    (1, 65536, 512): 1,  # 11: 29.2, 1: 26.9
    (1, 65536, 2048): 1,  # 5: 43.9, 1: 36.6
    (1, 262144, 512): 22,  # 22: 41.7, 44: 50.3, 1: 54.5
    (1, 262144, 2048): 6,  # 6: 60.6, 11: 65.9, 22: 86.7, 32: 105.6, 1: 81.8
    (64, 65536, 512): 1,  # 4: 34.6, 1: 29.9
    (64, 65536, 2048): 1,  # 4: 50.4, 1: 39.5
    (64, 262144, 512): 4,  # 4: 57.8, 8: 76.8, 16: 104.9, 1: 60.5
    (64, 262144, 2048): 1,  # 4: 88.0, 8: 123.3, 1: 86.5
    (1, 129280, 50): 50,  # sampler; 50: 24.4, 1: 26.4
    (1, 129280, 512): 15,  # sampler; 15: 35.2, 1: 37.4
    (64, 129280, 50): 1,  # sampler; 4: 36.0, 1: 30.9
    (64, 129280, 512): 1,  # sampler; 4: 44.6, 1: 41.1
    (256, 65536, 512): 1,  # 2: 74.2, 4: 98.0, 1: 43.9
    (256, 262144, 512): 1,  # 2: 131.0, 4: 178.5, 1: 91.4
    (256, 262144, 2048): 1,  # 2: 203.8, 1: 125.5
    (4096, 262144, 512): 1,  # 2: 1,799.9, 1: 1,258.9
}


@pytest.mark.parametrize("mode", ["lean", "lean_pf"])
def test_choose_split_lean_picks_the_measured_fastest(mode: str) -> None:
    """Lean segments: at every measured shape the rule picks the fastest option the H200 run measured."""
    for (b, n, k), want in _LEAN_SPLIT_ROWS.items():
        assert cuda_topk.choose_split(b, n, k, 132, mode=mode) == want, (b, n, k)


def test_choose_split_lean_limits() -> None:
    """Between the measured shapes: the lean rule never splits more than fast's, keeps the merge within
    LEAN_MERGE_CANDS, never splits b > SMs / 2 or n < LEAN_SPLIT_MIN_N, and follows DEFAULT_MODE by default."""
    g = torch.Generator().manual_seed(331)
    for _ in range(400):
        b = int(torch.randint(1, 300, (1,), generator=g))
        n = int(torch.randint(1000, 1_000_000, (1,), generator=g))
        k = int(torch.randint(1, 4096, (1,), generator=g))
        sms = int(torch.randint(16, 200, (1,), generator=g))
        lean, fast = (
            cuda_topk.choose_split(b, n, k, sms, mode="lean"),
            cuda_topk.choose_split(b, n, k, sms, mode="fast"),
        )
        assert 1 <= lean <= fast, (b, n, k, sms, lean, fast)
        if lean > 1:
            assert lean * k <= cuda_topk.LEAN_MERGE_CANDS and 2 * b <= sms and n >= cuda_topk.LEAN_SPLIT_MIN_N
    assert cuda_topk.choose_split(1, 98304, 512, 132, mode="lean") == 13  # just at the limit: splits
    assert cuda_topk.choose_split(1, 98303, 512, 132, mode="lean") == 1
    assert cuda_topk.choose_split(66, 262144, 512, 132, mode="lean") == 4  # few segments, long: splits
    assert cuda_topk.choose_split(67, 262144, 512, 132, mode="lean") == 1  # b > SMs / 2
    assert cuda_topk.choose_split(16, 262144, 2048, 132, mode="lean") == 6  # many segments: the merge limit


def test_choose_split_default_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """mode=None follows DEFAULT_MODE (fast for a mode the split cannot run); a bad mode names the argument."""
    for default, want in (("fast", 11), ("lean", 6), ("lean_pf", 6), ("one_read", 11), ("two_pass", 11)):
        monkeypatch.setattr(cuda_topk, "DEFAULT_MODE", default)
        assert cuda_topk.choose_split(1, 262144, 2048, 132) == want, default
    with pytest.raises(ValueError, match="mode: expected one of .*got 'quick'"):
        cuda_topk.choose_split(1, 262144, 2048, 132, mode="quick")


def test_topk_cuda_bad_default_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad DEEPINFER_DEEP_SELECT_CUDA_MODE (cuda_topk.DEFAULT_MODE) names the variable at the first call."""
    monkeypatch.setattr(cuda_topk, "DEFAULT_MODE", "quick")
    with pytest.raises(ValueError, match="DEEPINFER_DEEP_SELECT_CUDA_MODE.*'quick'"):
        cuda_topk.topk_cuda(torch.randn(2, 8), 3)


def test_topk_cuda_errors_without_module() -> None:
    if cuda_topk.available():
        pytest.skip("the compiled module is present")
    with pytest.raises(RuntimeError, match="DEEPINFER_DEVICE=cuda build"):
        cuda_topk.topk_cuda(torch.randn(2, 8), 3)


# ---- GPU: the kernel itself ----

_NEEDS_C = pytest.mark.skipif(not cuda_topk.available(), reason="deepinfer.deep_select._C not built")


def _run(scores: torch.Tensor, k: int, lengths=None, starts=None, **kw) -> torch.Tensor:
    dev = [None if t is None else t.cuda() for t in (lengths, starts)]
    out = cuda_topk.topk_cuda(scores.cuda(), k, lengths=dev[0], starts=dev[1], **kw)
    torch.cuda.synchronize()
    return out


@gpu
def test_gpu_compiled_module_present() -> None:
    """The GPU run must use a DEEPINFER_DEVICE=cuda build: without _C every other CUDA-kernel test skips."""
    from deepinfer.deep_select import build_info

    assert cuda_topk.available(), f"deepinfer.deep_select._C is missing; build_info() = {build_info()}"


@gpu
@_NEEDS_C
@pytest.mark.parametrize("dist", _ALL_DISTS)
@pytest.mark.parametrize("dtype", _DTYPES)
def test_gpu_cuda_distributions(dist: str, dtype: torch.dtype) -> None:
    """Every distribution, n from 1 to 65,536, k in {1, 64, 512, 1024, 2048} and k > n, with and without lengths,
    every mode (lean: with lengths)."""
    g = torch.Generator().manual_seed(81)
    for n in (1, 2, 7, 100, 1000, 4096, 65536):
        b = 16 if n < 65536 else 8
        scores = _scores(dist, b, n, dtype, g).cuda()
        lengths = torch.randint(0, n + 1, (b,), generator=g, dtype=torch.int32)
        lengths[:3] = torch.tensor([0, n, n + 7], dtype=torch.int32)[: min(3, b)]
        for k in (1, 64, 512, 1024, 2048):
            runs = ((None, "fast"), (lengths, "fast"), (lengths, "one_read"), (lengths, "two_pass"), (lengths, "lean"))
            runs += ((None, "lean_pf"),)
            for lens, mode in runs:
                got = _run(scores, k, lens, mode=mode)
                want, _ = ref.topk(scores, k, None if lens is None else lens.cuda())
                note = f"{dist} {dtype} n={n} k={k} lengths={lens is not None} mode={mode}"
                assert_same_sets(scores, k, got, want, note)


_LAUNCH_PROBE = """
import torch
from deepinfer.deep_select.backends.cuda import cuda_topk
for n in (4096, 6000, 8192):  # the first launch of every instantiation at n = 4096: 32 KB dynamic + 18 KB static
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(3, n, device="cuda").to(dtype)
        for mode in cuda_topk.MODES:
            for vec in (True, False):
                cuda_topk.topk_cuda(x, 5, mode=mode, vectorize=vec)
        for vec in (True, False):
            for mode in cuda_topk.SPLIT_MODES:
                cuda_topk.topk_cuda_split(x, 5, 2, vectorize=vec, mode=mode)
torch.cuda.synchronize()
print("ok")
"""


@gpu
@_NEEDS_C
def test_gpu_launch_mid_size_smem_first() -> None:
    """Round 1's launch failure: a process whose first call had a candidate buffer (8 B x min(n, 8192)) that
    with the 18 KB of static shared memory passes 48 KB, while the dynamic part alone stays under 48 KB, failed
    with cudaErrorInvalidValue (n = 4096: every bf16 / fp16 / fp32 distribution test). In a fresh process: every
    dtype, mode, load width and the split, first at n = 4096."""
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the same source tree and _C
    res = subprocess.run([sys.executable, "-c", _LAUNCH_PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, f"rc {res.returncode}\n{res.stderr[-3000:]}"


@gpu
@_NEEDS_C
def test_gpu_launch_error_message_names_the_variant() -> None:
    """A launch error says which step, variant, shared memory and grid (cap 9,000 passes 8,192)."""
    mod = cuda_topk._module()
    x = torch.randn(2, 100, device="cuda")
    out = torch.empty(2, 4, dtype=torch.int32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    with pytest.raises(RuntimeError, match=r"variant dtype=0 vec=1 mode=2, grid=2 x 512 threads.*cap 9000"):
        mod.topk_radix(x.data_ptr(), 0, 2, 100, 100, 0, 0, out.data_ptr(), 4, 4, 1, 9000, True, 2, 1, 0, 0, stream)


@gpu
@_NEEDS_C
@pytest.mark.parametrize("dist", ["normal", "normal_small", "few_values", "all_equal", "nan_hot", "bits_tiny", "inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_cuda_long_rows(dist: str, dtype: torch.dtype) -> None:
    """n = 129,280 and 262,144 with k up to 2,048: the shapes of the goals, tie-heavy rows included."""
    g = torch.Generator().manual_seed(82)
    for n in (129280, 262144):
        b = 6
        scores = _scores(dist, b, n, dtype, g).cuda()
        lengths = torch.tensor([n, n - 1, 3000, 2049, 2048, 1], dtype=torch.int32)
        for k in (50, 512, 2048):
            for lens, mode in (
                (None, "fast"),
                (lengths, "fast"),
                (lengths, "one_read"),
                (None, "two_pass"),
                (None, "lean"),
                (lengths, "lean"),
                (None, "lean_pf"),
            ):
                got = _run(scores, k, lens, mode=mode)
                want, _ = ref.topk(scores, k, None if lens is None else lens.cuda())
                note = f"{dist} {dtype} n={n} k={k} lengths={lens is not None} mode={mode}"
                assert_same_sets(scores, k, got, want, note)


@gpu
@_NEEDS_C
@pytest.mark.parametrize("cap", [1, 7, 64, 600])
@pytest.mark.parametrize("dist", ["few_values", "all_equal", "normal", "bits_tiny", "signed_zeros", "nan_inf"])
def test_gpu_cuda_small_cap_and_scalar_loads(cap: int, dist: str) -> None:
    """Tiny candidate buffers force the extra row passes (heavy ties); scalar loads take the unvectorised path."""
    g = torch.Generator().manual_seed(83)
    for dtype in _DTYPES:
        scores = _scores(dist, 8, 5000, dtype, g).cuda()
        for k in (1, 300, 2048):
            for vec, mode in (
                (True, "fast"),
                (False, "fast"),
                (False, "one_read"),
                (True, "two_pass"),
                (True, "lean"),
                (False, "lean"),
                (True, "lean_pf"),
            ):
                got = _run(scores, k, cap=cap, vectorize=vec, mode=mode)
                want, _ = ref.topk(scores, k, None)
                assert_same_sets(scores, k, got, want, f"{dist} {dtype} k={k} cap={cap} vec={vec} mode={mode}")


@gpu
@_NEEDS_C
@pytest.mark.parametrize("dtype", _DTYPES)
def test_gpu_cuda_ragged_unaligned_and_strided(dtype: torch.dtype) -> None:
    """Ragged ranges (relative ids), rows that start off a 16-byte boundary, strided rows and outputs."""
    g = torch.Generator().manual_seed(84)
    b, n, k = 12, 9000, 700
    full = _scores("few_values", b, n + 5, dtype, g).cuda()
    starts = torch.randint(-3, n + 3, (b,), generator=g, dtype=torch.int32)
    ends = starts + torch.randint(-2, n + 4, (b,), generator=g, dtype=torch.int32)
    for mode in cuda_topk.MODES:
        got = _run(full, k, ends, starts, mode=mode)
        want, _ = ref.topk_ragged(full, k, starts.cuda(), ends.cuda())
        assert_same_sets(full, k, got, want, f"ragged {dtype} mode={mode}")
    for off in (1, 3):  # row base off the 16-byte grid: the launcher must pick scalar loads
        view = full[:, off : off + n]
        got = _run(view, k)
        assert_same_sets(view, k, got, ref.topk(view, k)[0], f"offset {off} {dtype}")
    out = torch.full((k, b), 7, dtype=torch.int32, device="cuda").t()  # column-major output
    cuda_topk.topk_cuda(full[:, :n], k, out=out)
    assert_same_sets(full, k, out.contiguous(), ref.topk(full[:, :n], k)[0], f"strided out {dtype}")
    cols = full[:, :n].t().contiguous().t()  # column stride != 1: copied first
    assert_same_sets(cols, k, _run(cols, k), ref.topk(cols, k)[0], f"column-major scores {dtype}")


_BENCH_SHAPES = [(256, 65536, 512), (64, 262144, 2048), (1024, 129280, 50), (4096, 4096, 512), (1, 262144, 2048)]


@gpu
@_NEEDS_C
@pytest.mark.parametrize(("b", "n", "k"), _BENCH_SHAPES)
def test_gpu_cuda_benchmark_shapes(b: int, n: int, k: int) -> None:
    """The benchmark's own shapes (normal fp32), every row against the reference."""
    scores = torch.randn(b, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(85))
    want = ref.topk(scores, k)[0]
    for mode in cuda_topk.MODES:
        assert_same_sets(scores, k, _run(scores, k, mode=mode), want, f"b={b} n={n} k={k} mode={mode}")
    rising = torch.arange(n, device="cuda", dtype=torch.float32).repeat(min(b, 8), 1)  # one-read overflow fallback
    for mode in ("fast", "one_read", "lean", "lean_pf"):
        got = _run(rising, k, mode=mode)
        assert_same_sets(rising, k, got, ref.topk(rising, k)[0], f"ascending rows n={n} k={k} mode={mode}")


@gpu
@_NEEDS_C
@pytest.mark.parametrize("dist", ["normal", "few_values", "all_equal", "bits_tiny", "nan_inf", "signed_zeros"])
@pytest.mark.parametrize("dtype", _DTYPES)
def test_gpu_cuda_split(dist: str, dtype: torch.dtype) -> None:
    """The split for few long rows (`topk_cuda_split`, what the API runs when b x 2 < 2 x SMs and n >= 16,384):
    segs from 2 to 64, the last segment short, lengths inside / at / past segment ends, k up to 2,048, tiny caps."""
    g = torch.Generator().manual_seed(87)
    for n, segs in ((16384, 2), (65536, 7), (129280, 16), (262144, 64), (100003, 3)):
        b = 4
        scores = _scores(dist, b, n, dtype, g).cuda()
        lengths = torch.tensor([n, n - 5, 3000, 2047], dtype=torch.int32)
        for k in (1, 50, 512, 2048):
            for lens, mode in ((None, "fast"), (lengths, "fast"), (lengths, "lean"), (None, "lean_pf")):
                dl = None if lens is None else lens.cuda()
                got = cuda_topk.topk_cuda_split(scores, k, segs, lengths=dl, mode=mode)
                torch.cuda.synchronize()
                want, _ = ref.topk(scores, k, dl)
                note = f"split {dist} {dtype} n={n} segs={segs} k={k} lengths={lens is not None} mode={mode}"
                assert_same_sets(scores, k, got, want, note)
        got = cuda_topk.topk_cuda_split(scores, 300, 4, cap=100)  # the merge's pruning and overflow fallback
        assert_same_sets(scores, 300, got, ref.topk(scores, 300)[0], f"split {dist} {dtype} n={n} cap 100")


@gpu
@_NEEDS_C
@pytest.mark.parametrize(("b", "n", "k"), [(1, 262144, 512), (1, 65536, 2048), (8, 129280, 50), (64, 262144, 2048)])
def test_gpu_cuda_api_choice_matches_reference(b: int, n: int, k: int) -> None:
    """What the API runs for the few-long-rows shapes (split or not) against the reference, with a CUDA graph."""
    from deepinfer.deep_select.backends.cuda import dispatch

    scores = torch.randn(b, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(88))
    got = dispatch._select_cuda(scores, k, None, None, None)
    want = ref.topk(scores, k)[0]
    segs = cuda_topk.choose_split(b, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    assert_same_sets(scores, k, got, want, f"b={b} n={n} k={k} segs={segs}")
    out = torch.empty(b, k, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dispatch._select_cuda(scores, k, None, None, out)
    scores.copy_(torch.randn(b, n, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_same_sets(scores, k, out, ref.topk(scores, k)[0], f"graph replay b={b} n={n} k={k} segs={segs}")


@gpu
@_NEEDS_C
@pytest.mark.parametrize("dtype", _DTYPES)
def test_gpu_cuda_lean_bucket_edges(dtype: torch.dtype) -> None:
    """Lean mode (round 3) where its float threshold matters: values on the first digit's bucket edges (the
    compare is >= the bucket's lower bound), -0.0 / +0.0 thresholds, NaN / -inf thresholds, denormals, all-equal
    rows; n from 1,000 to 262,144 (tiles inside the row and crossing lengths), k up to 2,048; direct and split."""
    g = torch.Generator().manual_seed(89)
    for n in (1000, 4096, 65536, 262144):
        b = 4
        lengths = torch.tensor([n, n - 3, n // 2 + 1, 777], dtype=torch.int32).cuda()
        for dist in ("bucket_edges", "signed_zeros", "nan_inf", "bits_tiny", "all_equal"):
            make = _bucket_edges if dist == "bucket_edges" else lambda *a, d=dist: _scores(d, *a)
            scores = make(b, n, dtype, g).cuda()
            for k in (1, 512, 2048):
                for lens, mode in ((None, "lean"), (lengths, "lean"), (lengths, "lean_pf")):
                    got = _run(scores, k, lens, mode=mode)
                    want, _ = ref.topk(scores, k, lens)
                    note = f"{mode} {dist} {dtype} n={n} k={k} lengths={lens is not None}"
                    assert_same_sets(scores, k, got, want, note)
            if n >= 65536:
                got = cuda_topk.topk_cuda_split(scores, 512, 8, lengths=lengths, mode="lean")
                want, _ = ref.topk(scores, 512, lengths)
                assert_same_sets(scores, 512, got, want, f"lean split {dist} {dtype} n={n}")


@gpu
@_NEEDS_C
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_cuda_16bit_nan_picks(dtype: torch.dtype) -> None:
    """16-bit rows whose picks run into the NaNs (the refine's skipped u[9:0] digit is 0x3FF for NaN), every mode
    and the split, n up to 262,144."""
    g = torch.Generator().manual_seed(90)
    for n in (3000, 65536, 262144):
        row = torch.randn(3, n, generator=g)
        row[:, torch.randperm(n, generator=g)[: n - 1000]] = float("nan")
        row = row.to(dtype).cuda()
        for k in (1001, 2048):
            want = ref.topk(row, k)[0]
            for mode in cuda_topk.MODES:
                assert_same_sets(row, k, _run(row, k, mode=mode), want, f"NaN picks {dtype} n={n} k={k} {mode}")
            got = cuda_topk.topk_cuda_split(row, k, 4, mode="lean")
            assert_same_sets(row, k, got, want, f"NaN picks split {dtype} n={n} k={k}")


@gpu
@_NEEDS_C
def test_gpu_cuda_graph() -> None:
    b, n, k = 16, 8192, 256
    scores = torch.randn(b, n, device="cuda")
    out = torch.empty(b, k, dtype=torch.int32, device="cuda")
    cuda_topk.topk_cuda(scores, k, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cuda_topk.topk_cuda(scores, k, out=out)
    scores.copy_(torch.randn(b, n, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_same_sets(scores, k, out, ref.topk(scores, k)[0], "graph replay")


@gpu
@_NEEDS_C
@pytest.mark.parametrize("dist", ["normal", "few_values", "nan_hot", "bits_tiny"])
@pytest.mark.parametrize("dtype", _DTYPES)
def test_gpu_api_runs_cuda(dist: str, dtype: torch.dtype) -> None:
    """With _C built the API's backend is "cuda" and every contract property holds, sorted and unsorted."""
    assert api.backend("cuda") == "cuda"
    b, n, k = 6, 5000, 512
    g = torch.Generator().manual_seed(86)
    scores = _scores(dist, b, n, dtype, g)
    lengths = torch.tensor([n, 0, 100, 511, 513, n + 9], dtype=torch.int32)
    for is_sorted in (False, True):
        idx, vals = api.topk(scores.cuda(), k, lengths=lengths.cuda(), sorted=is_sorted, return_values=True)
        check_topk(scores, k, lengths, idx.cpu(), vals.cpu(), is_sorted)
    starts = torch.tensor([-3, 0, 17, 4000, 100, 5], dtype=torch.int32)
    ends = torch.tensor([600, n + 2, 16, 5000, 2000, 517], dtype=torch.int32)
    res = api.topk_ragged(scores.cuda(), k, starts=starts.cuda(), ends=ends.cuda(), sorted=True, return_values=True)
    want_idx, want_vals = ref.topk_ragged(scores, k, starts, ends, return_values=True)
    assert torch.equal(res[0].cpu(), want_idx), "ragged ids differ from the reference"
    assert torch.equal(res[1].cpu().nan_to_num(), want_vals.nan_to_num()), "ragged values differ"
    from deepinfer.deep_select.backends.cuda import dispatch

    assert "cuda" not in dispatch._FAILED, dispatch._FAILED
