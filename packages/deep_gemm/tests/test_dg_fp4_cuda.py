"""Compiled CUDA W4A16 grouped GEMM (kernel 4: `csrc/cuda/dg_fp4_grouped.cuh`, `backends/cuda/cuda_fp4_grouped.py`).

CPU: the kernel's own device code built with g++ against a CPU emulation of its PTX primitives (`fp4_emu/`: one
std::thread per CUDA thread, block / warp barriers, mma.sync fragment exchange, cp.async landing at issue or at
wait_group) vs the reference; the variant lists in sync; the config rule; the wrapper and the API without `_C`;
an sm_90a nvcc compile check (registers, spills) when nvcc is present. `gpu`: every compiled variant vs the
reference on ragged / empty / odd shapes and a V4 shape, bit-exact dequantisation, all-empty, CUDA-graph replay,
the API's impl choice. The same for kernel 5, the persistent variant (`csrc/cuda/dg_fp4_persistent.cuh`, called
through `cuda_fp4_grouped.m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_p`; the API's default since session 5: its
routing is tested in `test_dg_fp4_api.py`).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import re
import shutil
import subprocess

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import dg_testing as dgt  # noqa: E402
import pytest  # noqa: E402
from dg_testing import assert_gemm_close, calc_diff, fp4_weight64, gen  # noqa: E402

from deepinfer.deep_gemm import api_w4a16  # noqa: E402
from deepinfer.deep_gemm import reference_w4a16 as ref  # noqa: E402
from deepinfer.deep_gemm.api_w4a16 import m_grouped_bf16_fp4_gemm_nt_contiguous as gemm  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cuda_fp4_grouped as cu  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import w4a16_configs as cfgs  # noqa: E402

E8M0 = torch.float8_e8m0fnu
NAN = float("nan")
_operands = dgt.bf16_fp4_operands  # a bf16 [m, k], packed [G, n, k/2], E8M0 bytes [G, n, k/32], offs
_HERE = pathlib.Path(__file__).resolve().parent
_CSRC = _HERE.parent / "csrc/cuda"
_EMU = _HERE / "fp4_emu"
ALL_CUDA = [cfgs.W4A16Config(t, w * r * 16, 256, w, s, kernel=4) for t, w, r, s in cfgs.CUDA_VARIANTS]
ALL_CUDA_P = [cfgs.W4A16Config(t, w * r * 16, kt, w, s, kernel=5) for kt, t, w, r, s in cfgs.CUDA_P_VARIANTS]


def _cfg(tn: int, warps: int, rt: int, stages: int) -> cfgs.W4A16Config:
    """The kernel-4 config of one compiled variant."""
    return cfgs.W4A16Config(tn, warps * rt * 16, 256, warps, stages, kernel=4)


def _exact64(a, packed, scales, counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 value and magnitude (|a| @ |W|^T) of the grouped rows (dg_testing's independent dequant)."""
    return dgt.grouped_exact64(a.double(), packed, scales, counts)


def _check_vs_float64(out: torch.Tensor, a, packed, scales, counts: list[int], k: int, what: str = "") -> None:
    """Rows :sum(counts) of `out` (any device) within the fp32-accumulation + one RTNE bf16 rounding bound of the
    float64 oracle (the failure names `what` and calc_diff), rows past offs[-1] untouched (still NaN)."""
    rows = sum(counts)
    val, mag = _exact64(a, packed, scales, counts)
    try:
        assert_gemm_close(out[:rows].cpu(), val, mag, k)
    except AssertionError as exc:
        d = calc_diff(out[:rows].cpu(), val)
        raise AssertionError(f"{what}: calc_diff {d:.3e}; {exc}") from exc
    assert out[rows:].isnan().all(), f"{what}: rows past offs[-1] were written"


def _one_hot_case(sb: tuple[int, int] = (2, 252)) -> tuple:
    """a = identity rows per group (out[start + j] = W_i[:, j]), scale bytes over `sb` (both ends present): the
    output is the dequantised weight itself, exactly. Range [2, 252]: every product stays a normal number."""
    k, n, g = 256, 64, 2
    gen_ = gen(3)
    packed = torch.randint(0, 256, (g, n, k // 2), generator=gen_, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(sb[0], sb[1] + 1, (g, n, k // 32), generator=gen_, dtype=torch.int32).to(torch.uint8)
    scales[0, 0, :2] = torch.tensor(sb, dtype=torch.uint8)
    if sb[1] > 128:
        scales[1, 5, 3:5] = torch.tensor([128, 129], dtype=torch.uint8)  # the two sides of the one-multiply limit
    a = torch.eye(k, dtype=torch.bfloat16).repeat(g, 1)
    offs = torch.tensor([k, 2 * k], dtype=torch.int32)
    w64 = fp4_weight64(packed.view(torch.int8), scales.view(E8M0))
    return a, packed, scales, offs, torch.cat([w64[0].T, w64[1].T])


# ---------------------------------------------------------------- CPU: the kernel's code in the emulation


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """g++ build of fp4_emu/emu_driver.cpp (+ the kernel header); skipped without a C++20 g++."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("needs g++ (C++20 <barrier>)")
    lib = tmp_path_factory.mktemp("fp4emu") / "emu.so"
    cmd = [gxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-Wno-unknown-pragmas", f"-I{_EMU}",
           f"-I{_CSRC}", str(_EMU / "emu_driver.cpp"), "-o", str(lib)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if res.returncode != 0 and "barrier" in res.stderr:
        pytest.skip(f"g++ lacks C++20 <barrier>: {res.stderr[:300]}")
    assert res.returncode == 0, res.stderr[:3000]
    return ctypes.CDLL(str(lib))


def _run_emu(lib: ctypes.CDLL, cfg: cfgs.W4A16Config, a, packed, scales, offs, out, late: bool) -> None:
    m, k = a.shape
    g, n, _ = packed.shape
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    rc = lib.emu_w4a16(*cfgs.cuda_variant(cfg), ptr(a), ptr(packed), ptr(scales), ptr(offs), ptr(out), m, n, k, g,
                       int(late))  # fmt: skip
    assert rc == 0, f"emulator has no variant {cfg.name}"


# (config, cp.async landing, counts): token blocks (counts > tn), empty groups, n not a multiple of the CTA's rows
# (48 or 160), k not a multiple of the 256-k stage (384)
EMU_CASES = [
    (_cfg(8, 4, 2, 4), False, [3, 0, 11, 5], 48, 384),
    (_cfg(8, 4, 2, 4), True, [0, 9, 1, 0, 2], 160, 512),
    (_cfg(8, 4, 1, 4), True, [4, 0, 7], 80, 256),
    (_cfg(16, 4, 2, 4), False, [0, 17, 2], 48, 384),
    (_cfg(16, 8, 1, 4), True, [5, 0, 17], 144, 256),
    (_cfg(32, 8, 1, 3), True, [33, 0, 5], 48, 128),
    (_cfg(64, 4, 2, 3), True, [0, 70, 1], 32, 256),
]


@pytest.mark.parametrize(("cfg", "late", "counts", "n", "k"), EMU_CASES, ids=lambda v: getattr(v, "name", None))
def test_emu_vs_float64(emu, cfg, late: bool, counts: list[int], n: int, k: int) -> None:
    a, packed, scales, offs = _operands(counts, n, k, gen(sum(counts) + n + k), sb=(100, 140))  # both multiply paths
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16)
    _run_emu(emu, cfg, a, packed, scales, offs, out, late)
    _check_vs_float64(out, a, packed, scales, counts, k, cfg.name)


def test_emu_dequant_bit_exact(emu) -> None:
    """One-hot rows pick single weights: the output is the dequantised weight, exactly, for scale bytes 2..252."""
    a, packed, scales, offs, want = _one_hot_case()
    out = torch.empty(a.shape[0], packed.shape[1], dtype=torch.bfloat16)
    _run_emu(emu, ALL_CUDA[0], a, packed, scales, offs, out, late=True)
    assert torch.equal(out.double(), want)


def test_emu_all_empty(emu) -> None:
    a, packed, scales, offs = _operands([0, 0, 0], 64, 256, gen(5), extra_rows=5)
    out = torch.full((5, 64), NAN, dtype=torch.bfloat16)
    _run_emu(emu, ALL_CUDA[0], a, packed, scales, offs, out, late=False)
    assert out.isnan().all()


# ---------------------------------------------------------------- CPU: lists, rule, wrapper and API without _C


def test_variant_lists_in_sync() -> None:
    """CUDA_VARIANTS == the .cu's kEntries == the emulator driver's cases (same order)."""
    _check_variant_lists("dg_fp4_grouped.cu", "VARIANT", "EMU_CASE", 4, cfgs.CUDA_VARIANTS)


def test_config_names_and_rule() -> None:
    for cfg in ALL_CUDA:
        assert cfgs.parse_config(cfg.name) == cfg and cfg.name in cfgs.CUDA_NAMES
    with pytest.raises(ValueError, match="kernel 4"):
        cfgs.W4A16Config(8, 64, 256, num_warps=2, num_stages=4, kernel=4)  # not compiled
    with pytest.raises(ValueError, match=">= 16"):
        cfgs.W4A16Config(8, 64, 128)  # 8-token blocks are the CUDA kernel's only
    assert cfgs.cuda_config(2048, 256).block_m == 8  # 8 rows per group
    assert cfgs.cuda_config(2048, 256, expected_m=9).block_m == 16
    assert cfgs.cuda_config(256 * 16, 256).block_m == 16
    assert cfgs.cuda_config(256 * (cfgs.CUDA_MAX_ROWS + 1), 256) is None  # above CUDA_MAX_ROWS: Triton


def test_wrapper_without_compiled_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `_C` (CI, CPU builds): not available, never applies, an explicit call says why."""
    monkeypatch.setattr(cu, "_module", lambda: None)
    a, packed, scales, offs = _operands([2, 1], 32, 256, gen(1))
    assert not cu.available() and cu.compiled_variants() == () and not cu.applies(a, packed, scales)
    out = torch.empty(a.shape[0], 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="DEEPINFER_DEVICE=cuda"):
        cu.m_grouped_bf16_fp4_gemm_nt_contiguous_cuda(a, packed, scales, offs, out, ALL_CUDA[0])


@pytest.mark.parametrize("impl", ["auto", "cuda", "triton"])
def test_api_impl_env_on_cpu_runs_reference(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(api_w4a16.IMPL_ENV, impl)
    monkeypatch.delenv("DEEPINFER_DEEP_GEMM_BACKEND", raising=False)
    a, packed, scales, offs = _operands([2, 0, 3], 32, 256, gen(5))
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.zeros(a.shape[0], 32).bfloat16())
    assert torch.equal(gemm(a, (packed, scales), offs, torch.zeros(a.shape[0], 32, dtype=torch.bfloat16)), want)


def test_api_bad_impl_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(api_w4a16.IMPL_ENV, "bogus")
    a, packed, scales, offs = _operands([1], 32, 128, gen(2))
    with pytest.raises(ValueError, match=api_w4a16.IMPL_ENV):
        gemm(a, (packed, scales), offs)


def test_api_kernel4_config_needs_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel-4 config on a fast path that is not CUDA (the interpreter) is an error, not a silent fallback."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1")
    monkeypatch.setenv("DEEPINFER_DEEP_GEMM_BACKEND", "triton")
    a, packed, scales, offs = _operands([1], 32, 128, gen(2))
    with pytest.raises((RuntimeError, ValueError)):
        gemm(a, (packed, scales), offs, config=ALL_CUDA[0])


def _check_sm90_compile(src: str, n_variants: int, n_first: int = 1) -> None:
    """nvcc 13 builds csrc/cuda/`src` for sm_90a: its first variant of each kernel (`n_first` kernels; all
    `n_variants` with DEEPINFER_DG_NVCC_ALL=1), one kernel each, no spills, <= 255 registers (skipped without nvcc)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    every = os.environ.get("DEEPINFER_DG_NVCC_ALL") == "1"
    cmd = [nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c",
           str(_CSRC / src), "-o", os.devnull, *([] if every else ["-DDG_FP4_ONLY_FIRST"])]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    kernels = re.findall(r"Compiling entry function '(\w+)'", res.stderr)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", res.stderr)]
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", res.stderr)]
    want = n_variants if every else n_first
    assert len(kernels) == want and len(regs) == len(kernels), res.stderr[-2000:]
    assert max(spills) == 0 and max(regs) <= 255, res.stderr[-3000:]


def _check_variant_lists(src: str, cu_macro: str, emu_macro: str, n_fields: int, variants) -> None:  # noqa: ANN001
    """The variant tuples of csrc/cuda/`src` (`cu_macro(...)` entries) == `variants` == the emulator driver's
    `emu_macro(...)` cases, in the same order."""
    pat = r"DG_FP4_{}\(" + r",\s*".join([r"(\d+)"] * n_fields) + r"\)"
    from_cu = [tuple(map(int, t)) for t in re.findall(pat.format(cu_macro), (_CSRC / src).read_text())]
    from_emu = [tuple(map(int, t)) for t in re.findall(pat.format(emu_macro), (_EMU / "emu_driver.cpp").read_text())]
    assert from_cu == list(variants) == from_emu


def test_sm90_compile() -> None:
    """The first variant (every variant with DEEPINFER_DG_NVCC_ALL=1) compiles for sm_90a with nvcc 13 without
    spills (skipped without nvcc)."""
    _check_sm90_compile("dg_fp4_grouped.cu", len(cfgs.CUDA_VARIANTS))


# ---------------------------------------------------------------- GPU

needs_kernel = pytest.mark.skipif(not cu.available(), reason="_C built without the FP4 CUDA kernel")


def _gpu(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.cuda() for t in ts)


@pytest.mark.gpu
def test_gpu_compiled_variants() -> None:
    """The built `_C` has exactly CUDA_VARIANTS (a stale build fails here first)."""
    assert cu.available(), "deep_gemm._C lacks fp4_w4a16_grouped: rebuild with DEEPINFER_DEVICE=cuda"
    assert cu.compiled_variants() == tuple(cfgs.CUDA_VARIANTS)


GPU_CASES = {
    "ragged": ([0, 3, 1, 0, 9, 2, 0, 8], 256, 512),  # empty experts, counts > 8 (two token blocks at tn 8)
    "odd": ([5, 0, 17, 1], 48, 384),  # n < rows per CTA, k % 256 != 0, m not a multiple of 8
    "tpe64": ([64, 0, 63, 65], 128, 1024),  # around tn 64
}


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("cfg", ALL_CUDA, ids=lambda c: c.name)
@pytest.mark.parametrize("case", list(GPU_CASES), ids=str)
def test_gpu_vs_float64(cfg: cfgs.W4A16Config, case: str) -> None:
    _check_gpu_case(lambda a, p, s, o, out: gemm(a, (p, s), o, out, config=cfg), cfg, case)


def _check_gpu_case(launch, cfg: cfgs.W4A16Config, case: str) -> None:  # noqa: ANN001
    """`launch(a, packed, scales, offs, out)` on GPU_CASES[case] (NaN-filled out, scale bytes 100..140: both multiply
    paths) vs the float64 oracle."""
    counts, n, k = GPU_CASES[case]
    a, packed, scales, offs = _operands(counts, n, k, gen(len(case) + n + k), sb=(100, 140))
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16, device="cuda")
    got = launch(*_gpu(a, packed, scales, offs), out)
    torch.cuda.synchronize()
    _check_vs_float64(got, a, packed, scales, counts, k, f"{cfg.name} {case}")


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("cfg", [_cfg(8, 4, 2, 4), _cfg(64, 4, 2, 3)], ids=lambda c: c.name)
@pytest.mark.parametrize("nk", [(4096, 4096), (4096, 2048)], ids=["gate_up", "down"])
def test_gpu_v4_shapes(cfg: cfgs.W4A16Config, nk: tuple[int, int]) -> None:
    """V4 expert shapes, 8 experts, ragged decode counts: vs the reference on the GPU (fp32)."""
    n, k = nk
    counts = [8, 0, 3, 1, 8, 5, 0, 2] if cfg.block_m == 8 else [64, 0, 40, 64, 1, 0, 17, 64]
    a, packed, scales, offs = _gpu(*_operands(counts, n, k, gen(n + k + cfg.block_m)))
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16, device="cuda")
    gemm(a, (packed, scales), offs, out, config=cfg)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    rows = sum(counts)
    d = calc_diff(out[:rows], want[:rows])
    assert d < 1e-5, f"{cfg.name} n={n} k={k}: calc_diff {d:.3e} vs the reference"
    assert out[rows:].isnan().all()


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("cfg", [_cfg(8, 4, 2, 4), _cfg(16, 8, 1, 4), _cfg(64, 8, 1, 3)], ids=lambda c: c.name)
def test_gpu_dequant_bit_exact(cfg: cfgs.W4A16Config) -> None:
    a, packed, scales, offs, want = _one_hot_case()
    out = gemm(*_gpu(a), _gpu(packed, scales), offs.cuda(), config=cfg)
    diff = (out.double().cpu() - want).abs()
    assert torch.equal(out.double().cpu(), want), f"{cfg.name}: {int((diff > 0).sum())} weights differ"


@pytest.mark.gpu
@needs_kernel
def test_gpu_all_empty_and_rows_past_offs() -> None:
    a, packed, scales, offs = _gpu(*_operands([0, 0, 0], 64, 256, gen(11), extra_rows=5))
    out = torch.full((5, 64), NAN, dtype=torch.bfloat16, device="cuda")
    gemm(a, (packed, scales), offs, out, config=ALL_CUDA[0])
    assert out.isnan().all()


@pytest.mark.gpu
@needs_kernel
def test_gpu_cuda_graph_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Captured once through the API (impl auto), replayed with new offs: no host read of offs."""
    monkeypatch.setenv(api_w4a16.IMPL_ENV, "auto")
    a, packed, scales, _ = _gpu(*_operands([4, 4, 4, 4], 256, 512, gen(23), extra_rows=0))
    out, offs = dgt.replay_with_new_offs(lambda a, p, s, o, out: gemm(a, (p, s), o, out), a, packed, scales)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    assert calc_diff(out[:9], want[:9]) < 1e-5
    assert out[9:].isnan().all()


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("impl", ["auto", "cuda"])
def test_gpu_api_impl_choice(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto = the CUDA kernel's rule config (bit-identical to calling it), cuda = also above 64 rows per group
    (64-token blocks); a misaligned `a` falls back to Triton and stays correct."""
    monkeypatch.setenv(api_w4a16.IMPL_ENV, impl)
    counts = [3, 0, 5, 2] if impl == "auto" else [130, 0, 70, 1]
    a, packed, scales, offs = _gpu(*_operands(counts, 128, 512, gen(31)))
    got = gemm(a, (packed, scales), offs)
    rows = sum(counts)
    if impl == "auto":
        cfg = cfgs.cuda_config(a.shape[0], len(counts))
        assert torch.equal(got[:rows], gemm(a, (packed, scales), offs, config=cfg)[:rows])
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(got))
    assert calc_diff(got[:rows], want[:rows]) < 1e-5
    flat = torch.empty(a.numel() + 1, dtype=torch.bfloat16, device="cuda")
    flat[1:] = a.flatten()
    a_odd = flat[1:].view(a.shape)
    assert not cu.applies(a_odd, packed, scales)
    got_odd = gemm(a_odd, (packed, scales), offs)
    assert calc_diff(got_odd[:rows], want[:rows]) < 1e-5


# ---------------------------------------------------------------- kernel 5 (persistent variant)


def _run_emu_p(lib: ctypes.CDLL, cfg: cfgs.W4A16Config, a, packed, scales, offs, out, late: bool, grid: int) -> None:
    m, k = a.shape
    g, n, _ = packed.shape
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    rc = lib.emu_w4a16_p(*cfgs.cuda_p_variant(cfg), ptr(a), ptr(packed), ptr(scales), ptr(offs), ptr(out), m, n, k,
                         g, int(late), grid)  # fmt: skip
    assert rc == 0, f"emulator has no persistent variant {cfg.name}"


def _cp(kt: int, tn: int, warps: int, rt: int, stages: int) -> cfgs.W4A16Config:
    """The kernel-5 config of one compiled persistent variant."""
    return cfgs.W4A16Config(tn, warps * rt * 16, kt, warps, stages, kernel=5)


# (config, cp.async landing, counts, n, k, CTAs): more work items than CTAs (each CTA strides), idle CTAs, empty
# experts first / last, token blocks (counts > tn), n not a multiple of the CTA's rows, k tails of both stage sizes
# (k = 128 is less than one 512-k stage)
EMU_P_CASES = [
    (_cp(256, 8, 4, 1, 4), True, [3, 0, 11, 5], 48, 384, 2),
    (_cp(512, 8, 4, 1, 2), False, [0, 9, 1, 0, 2], 160, 640, 3),
    (_cp(512, 8, 8, 1, 2), True, [4, 0, 7], 80, 128, 1),
    (_cp(256, 8, 4, 2, 3), True, [0, 17, 2], 144, 384, 2),
    (_cp(512, 8, 4, 2, 2), False, [5, 0, 3], 48, 512, 1),
    (_cp(256, 8, 4, 1, 3), True, [9, 0, 0, 1], 64, 256, 5),
    (_cp(256, 16, 4, 1, 4), True, [0, 33, 2], 48, 384, 2),
    (_cp(512, 16, 4, 1, 2), False, [17, 5, 0], 64, 1024, 1),
    (_cp(256, 32, 4, 1, 4), True, [0, 40, 3], 80, 384, 2),
    (_cp(256, 32, 4, 2, 3), False, [33, 0, 31], 144, 256, 2),
    (_cp(512, 32, 8, 1, 2), True, [65, 2], 160, 640, 1),
    (_cp(256, 64, 8, 1, 3), False, [70, 0, 64, 1], 48, 384, 3),
]


@pytest.mark.parametrize(("cfg", "late", "counts", "n", "k", "grid"), EMU_P_CASES,
                         ids=lambda v: getattr(v, "name", None))  # fmt: skip
def test_emu_p_vs_float64(emu, cfg, late: bool, counts: list[int], n: int, k: int, grid: int) -> None:
    a, packed, scales, offs = _operands(counts, n, k, gen(sum(counts) + n + k + 1), sb=(100, 140))  # both paths
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16)
    _run_emu_p(emu, cfg, a, packed, scales, offs, out, late, grid)
    _check_vs_float64(out, a, packed, scales, counts, k, cfg.name)


@pytest.mark.parametrize("sb", [(2, 252), (2, 128)], ids=["with_big_scales", "fast_path_only"])
@pytest.mark.parametrize("cfg", [_cp(256, 8, 4, 1, 4), _cp(256, 8, 4, 2, 3)], ids=lambda c: c.name)
def test_emu_p_dequant_bit_exact(emu, cfg: cfgs.W4A16Config, sb: tuple[int, int]) -> None:
    """One-hot rows: the output is the dequantised weight, exactly, on the warp-uniform fast path (every scale byte
    <= 128) and on the path with the second multiply."""
    a, packed, scales, offs, want = _one_hot_case(sb)
    out = torch.empty(a.shape[0], packed.shape[1], dtype=torch.bfloat16)
    _run_emu_p(emu, cfg, a, packed, scales, offs, out, late=True, grid=3)
    assert torch.equal(out.double(), want)


def test_emu_p_all_empty(emu) -> None:
    a, packed, scales, offs = _operands([0, 0, 0], 64, 256, gen(5), extra_rows=5)
    out = torch.full((5, 64), NAN, dtype=torch.bfloat16)
    _run_emu_p(emu, ALL_CUDA_P[0], a, packed, scales, offs, out, late=False, grid=2)
    assert out.isnan().all()


def test_p_variant_lists_in_sync() -> None:
    """CUDA_P_VARIANTS == the .cu's kPEntries == the emulator driver's persistent cases (same order)."""
    _check_variant_lists("dg_fp4_persistent.cu", "PVARIANT", "EMU_PCASE", 5, cfgs.CUDA_P_VARIANTS)


def test_p_config_names() -> None:
    for cfg in ALL_CUDA_P:
        assert cfgs.parse_config(cfg.name) == cfg and cfg.name.endswith("cp") and cfg.kernel == 5
    assert [c.name for tn in (8, 16, 32, 64) for c in cfgs.CUDA_P_SWEEP[tn]] == list(cfgs.CUDA_P_NAMES)
    with pytest.raises(ValueError, match="kernel 5"):
        cfgs.W4A16Config(8, 64, 512, num_warps=4, num_stages=4, kernel=5)  # not compiled
    assert cfgs.parse_config("m8n64k256w4s4cu").kernel == 4  # kernel 4's names are unchanged


@pytest.mark.parametrize("name", ["m8n128k512w4s2cs", "m16n64k512w4s2cs", "m8n128k512w4s2cx"])
def test_removed_kernel6_names_fail(name: str) -> None:
    """Kernel 6 (`...cs`) was removed in session 9: its names (and any other unknown CUDA suffix) raise a ValueError
    naming the known kernels from `parse_config` (what `config=` names and DEEPINFER_DG_W4A16_CONFIG go through)."""
    with pytest.raises(ValueError, match=r"unknown CUDA kernel suffix.*'\.\.\.cu'.*'\.\.\.cp'") as err:
        cfgs.parse_config(name)
    assert ("removed in session 9" in str(err.value)) == name.endswith("cs") and name in str(err.value)
    with pytest.raises(ValueError, match="kernel: expected 1, 2, 3, 4 or 5"):
        cfgs.W4A16Config(8, 128, 512, num_warps=4, num_stages=2, kernel=6)
    assert not hasattr(cu, "m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_s") and 6 not in cfgs.CUDA_KERNELS


def test_p_wrapper_without_compiled_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cu, "_module", lambda: None)
    a, packed, scales, offs = _operands([2, 1], 64, 256, gen(1))
    assert not cu.available_p() and cu.compiled_p_variants() == ()
    with pytest.raises(RuntimeError, match="DEEPINFER_DEVICE=cuda"):
        cu.m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_p(a, packed, scales, offs, None, ALL_CUDA_P[0])
    with pytest.raises(ValueError, match="kernel-5"):
        cu.m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_p(a, packed, scales, offs, None, ALL_CUDA[0])
    with pytest.raises(ValueError, match="offs"):
        cu.m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_p(a, packed, scales, offs.long(), None, ALL_CUDA_P[0])


def test_p_sm90_compile() -> None:
    """The first kernel-5 variant (every one with DEEPINFER_DG_NVCC_ALL=1) compiles for sm_90a with nvcc 13 without
    spills (skipped without nvcc)."""
    _check_sm90_compile("dg_fp4_persistent.cu", len(cfgs.CUDA_P_VARIANTS))


needs_p_kernel = pytest.mark.skipif(not cu.available_p(), reason="_C built without the persistent FP4 kernel")


def _p_gemm(a, packed, scales, offs, out, cfg: cfgs.W4A16Config) -> torch.Tensor:
    return cu.m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_p(a, packed, scales, offs, out, cfg)


@pytest.mark.gpu
def test_gpu_p_compiled_variants() -> None:
    """The built `_C` has exactly CUDA_P_VARIANTS (a stale build fails here first)."""
    assert cu.available_p(), "deep_gemm._C lacks fp4_w4a16_p_grouped: rebuild with DEEPINFER_DEVICE=cuda"
    assert cu.compiled_p_variants() == tuple(cfgs.CUDA_P_VARIANTS)


@pytest.mark.gpu
@needs_p_kernel
@pytest.mark.parametrize("cfg", ALL_CUDA_P, ids=lambda c: c.name)
@pytest.mark.parametrize("case", list(GPU_CASES), ids=str)
def test_gpu_p_vs_float64(cfg: cfgs.W4A16Config, case: str) -> None:
    _check_gpu_case(lambda a, p, s, o, out: _p_gemm(a, p, s, o, out, cfg), cfg, case)


@pytest.mark.gpu
@needs_p_kernel
@pytest.mark.parametrize("cfg", ALL_CUDA_P, ids=lambda c: c.name)
@pytest.mark.parametrize("nk", [(4096, 4096), (4096, 2048)], ids=["gate_up", "down"])
def test_gpu_p_v4_shapes(cfg: cfgs.W4A16Config, nk: tuple[int, int]) -> None:
    """V4 expert shapes over 64 experts, 12 of them with 1..2 x tn rows (random; the rest empty, and more work
    items than CTAs): vs the reference on the GPU (fp32) and close to kernel 4's default variant. Operands are
    drawn on the GPU (64 x 4096 x 2048 bytes of weights)."""
    n, k = nk
    g, active = 64, 12
    cpu = gen(n + k + cfg.block_m)
    counts = torch.zeros(g, dtype=torch.int64)
    counts[torch.randperm(g, generator=cpu)[:active]] = torch.randint(1, 2 * cfg.block_m + 1, (active,), generator=cpu)
    counts = counts.tolist()
    dev = torch.Generator(device="cuda").manual_seed(n + k)
    m = sum(counts) + 3
    a = torch.randn((m, k), generator=dev, device="cuda").to(torch.bfloat16)
    packed = torch.randint(0, 256, (g, n, k // 2), generator=dev, device="cuda", dtype=torch.uint8)
    scales = torch.randint(118, 131, (g, n, k // 32), generator=dev, device="cuda", dtype=torch.uint8)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    out = torch.full((m, n), NAN, dtype=torch.bfloat16, device="cuda")
    _p_gemm(a, packed, scales, offs, out, cfg)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    k4 = gemm(a, (packed, scales), offs, config=_cfg(8, 4, 1, 4))
    rows = sum(counts)
    d, d4 = calc_diff(out[:rows], want[:rows]), calc_diff(out[:rows], k4[:rows])
    assert d < 1e-5 and d4 < 1e-5, f"{cfg.name} n={n} k={k}: calc_diff {d:.3e} vs reference, {d4:.3e} vs kernel 4"
    assert out[rows:].isnan().all()


@pytest.mark.gpu
@needs_p_kernel
@pytest.mark.parametrize("sb", [(2, 252), (2, 128)], ids=["with_big_scales", "fast_path_only"])
@pytest.mark.parametrize("cfg", [_cp(256, 8, 4, 1, 4), _cp(512, 8, 4, 1, 2), _cp(256, 8, 4, 2, 3)],
                         ids=lambda c: c.name)  # fmt: skip
def test_gpu_p_dequant_bit_exact(cfg: cfgs.W4A16Config, sb: tuple[int, int]) -> None:
    a, packed, scales, offs, want = _one_hot_case(sb)
    out = _p_gemm(*_gpu(a, packed, scales, offs), None, cfg)
    diff = (out.double().cpu() - want).abs()
    assert torch.equal(out.double().cpu(), want), f"{cfg.name}: {int((diff > 0).sum())} weights differ"


@pytest.mark.gpu
@needs_p_kernel
def test_gpu_p_all_empty_and_graph_replay() -> None:
    """All-empty groups write nothing; a captured launch replayed with new offs follows them (no host read)."""
    cfg = ALL_CUDA_P[0]
    a, packed, scales, offs = _gpu(*_operands([0, 0, 0], 64, 256, gen(11), extra_rows=5))
    out = torch.full((5, 64), NAN, dtype=torch.bfloat16, device="cuda")
    _p_gemm(a, packed, scales, offs, out, cfg)
    torch.cuda.synchronize()
    assert out.isnan().all()
    a, packed, scales, _ = _gpu(*_operands([4, 4, 4, 4], 256, 512, gen(23), extra_rows=0))
    out, offs = dgt.replay_with_new_offs(lambda a, p, s, o, out: _p_gemm(a, p, s, o, out, cfg), a, packed, scales)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    assert calc_diff(out[:9], want[:9]) < 1e-5
    assert out[9:].isnan().all()
