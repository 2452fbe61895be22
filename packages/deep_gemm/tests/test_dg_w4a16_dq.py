"""The opt-in W4A16 "dequantise a chunk of experts, then CUTLASS grouped bf16 GEMM" path (session 5, not yet GPU-run):
`backends/cuda/cutlass_w4a16_dq.py` + `csrc/cuda/cutlass/w4a16_dq_*.{cuh,cu,h}`.

CPU: the dequantiser's e2m1 / E8M0 decoding (the header's own functions, compiled with g++) for every code and scale
byte vs the package's tables; the chunk size rule; argument checks; the API's routing with DEEPINFER_DG_W4A16_IMPL=
cutlass_dq (`_C` monkeypatched); the sm_90a compile of both configs (slow, skipped without nvcc / CUTLASS unless
DG_DQ_COMPILE=1). `gpu`: configs 0 / 1 vs the float64 oracle (empty experts, chunk boundaries, rows past offs[-1]
untouched), V4 shapes at 64 / 256 rows per expert vs the reference, the API with the impl env, m = 0 and all-empty,
CUDA-graph replay.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from dg_testing import calc_diff, gen  # noqa: E402
from test_dg_fp4_cuda import _check_vs_float64, _gpu, _operands  # noqa: E402

import deepinfer.deep_gemm as dg  # noqa: E402
from deepinfer.deep_gemm import api_w4a16  # noqa: E402
from deepinfer.deep_gemm import reference_w4a16 as ref  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cutlass_w4a16_dq as dq  # noqa: E402
from deepinfer.deep_gemm.dequant import FP4_E2M1_VALUES  # noqa: E402

NAN = float("nan")
CSRC = Path(__file__).resolve().parents[1] / "csrc" / "cuda" / "cutlass"
CUTLASS_INCLUDE = Path(os.environ.get("CUTLASS_INCLUDE_DIR", Path(__file__).resolve().parents[3] / "build" /
                                      "third_party" / "cutlass_include"))  # fmt: skip

# ---------------------------------------------------------------- CPU: decoding, chunks, checks, routing

_DECODE_DRIVER = r"""
#include <cstdio>
#include "w4a16_dq_decode.h"
int main() {  // one line per (scale byte, code): the float bits of e2m1(code) * 2^(byte - 127)
  for (unsigned s = 0; s < 256; ++s)
    for (unsigned c = 0; c < 16; ++c) {
      float v = dg::w4a16_dq::e2m1_to_float(c) * dg::w4a16_dq::e8m0_to_float(s);
      unsigned bits;
      __builtin_memcpy(&bits, &v, 4);
      std::printf("%u\n", bits);
    }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_decode_every_code_and_scale(tmp_path: Path) -> None:
    """The dequantiser's float product for all 16 codes x 256 scale bytes equals e2m1 * 2^(byte - 127) exactly
    where float32 holds it (byte 255: NaN), and its bf16 rounding is exact for every byte <= 252 (the kernel's
    promise, subnormal results of bytes 0 / 1 included)."""
    src, exe = tmp_path / "decode.cpp", tmp_path / "decode"
    src.write_text(_DECODE_DRIVER)
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{CSRC}", str(src), "-o", str(exe)], check=True)
    bits = torch.tensor([int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True,
                                                         text=True).stdout.split()], dtype=torch.int64)  # fmt: skip
    got = bits.to(torch.int32).view(torch.float32).view(256, 16)
    codes = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float64)
    want = codes[None, :] * torch.exp2(torch.arange(256, dtype=torch.float64) - 127)[:, None]
    assert got[255].isnan().all(), "scale byte 255 must decode to NaN"
    # exact where float32 holds it (bytes 253.. overflow to +-inf for the larger codes, as the rounding would)
    assert torch.equal(got[:255], want[:255].float()), "float product differs from e2m1 * 2^(byte - 127)"
    signs = torch.signbit(got[:255]) == torch.signbit(torch.tensor(FP4_E2M1_VALUES))[None, :]
    assert signs.all(), "the sign of -0 (code 8) is lost"
    assert torch.equal(got[:253].to(torch.bfloat16).double(), want[:253]), "bf16 rounding not exact below 253"


_GROUP_DRIVER = r"""
#include <cstdio>
#include "w4a16_dq_decode.h"
int main() {  // scale byte s, group t (bytes 16t .. 16t+15: all 256 byte values over t = 0..15) -> 16 words
  for (unsigned s = 0; s < 256; ++s)
    for (unsigned t = 0; t < 16; ++t) {
      uint32_t words[4], out[16];
      for (int q = 0; q < 4; ++q) {
        words[q] = 0;
        for (int b = 0; b < 4; ++b) words[q] |= ((16u * t + 4u * q + b) & 0xFFu) << (8 * b);
      }
      dg::w4a16_dq::dequant_group32(words, s, out);
      for (int j = 0; j < 16; ++j) std::printf("%u\n", out[j]);
    }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_dequant_group_matches_package_dequant(tmp_path: Path) -> None:
    """The kernel's per-thread step (`dequant_group32`: nibble order, bf16 rounding, word packing) on every byte value
    x every scale byte equals the package's fp32 dequantisation rounded to bf16 (RTNE), bit for bit (NaN: NaN)."""
    from deepinfer.deep_gemm.dequant import dequant_fp4_weight

    src, exe = tmp_path / "group.cpp", tmp_path / "group"
    src.write_text(_GROUP_DRIVER)
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{CSRC}", str(src), "-o", str(exe)], check=True)
    words = torch.tensor([int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True,
                                                          text=True).stdout.split()], dtype=torch.int64)  # fmt: skip
    got = words.to(torch.int32).view(torch.int16).view(256, 256, 2)  # [scale byte, byte value, (lo, hi)]
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.int8).view(1, 256)  # [n = 1, k / 2]
    for sbyte in range(256):
        scales = torch.full((1, 16), sbyte, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        want = dequant_fp4_weight(packed, scales).to(torch.bfloat16).view(torch.int16).view(256, 2)
        g_s = got[sbyte]
        nan = want.view(torch.bfloat16).isnan()
        assert torch.equal(nan, g_s.view(torch.bfloat16).isnan()), f"scale byte {sbyte}: NaN positions differ"
        assert torch.equal(g_s[~nan], want[~nan]), f"scale byte {sbyte}: bf16 bits differ"


@pytest.mark.parametrize(
    ("g", "n", "k", "chunk", "budget", "want"),
    [
        (256, 4096, 4096, None, 1 << 30, 32),  # gate+up: 32 MiB of bf16 per expert
        (256, 4096, 2048, None, 1 << 30, 64),
        (4, 4096, 4096, None, 1 << 30, 4),  # never more than g
        (256, 4096, 4096, None, 1000, 1),  # at least 1
        (256, 4096, 4096, 7, 1 << 30, 7),  # explicit
    ],
)
def test_chunk_experts(g: int, n: int, k: int, chunk, budget: int, want: int, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv(dq.SCRATCH_ENV, str(budget))
    assert dq.chunk_experts(g, n, k, chunk) == want


def test_chunk_experts_rejects(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in (0, 9, True, 2.0):
        with pytest.raises(ValueError, match="chunk: expected an int in 1..8"):
            dq.chunk_experts(8, 64, 128, bad)
    monkeypatch.setenv(dq.SCRATCH_ENV, "lots")
    with pytest.raises(ValueError, match="DEEPINFER_DG_W4A16_DQ_BYTES: expected a positive integer"):
        dq.chunk_experts(8, 64, 128)
    monkeypatch.delenv(dq.SCRATCH_ENV)
    assert dq.chunk_experts(8, 64, 128) == 8  # default budget


def test_auto_config() -> None:
    assert dq.auto_config(64) == 1 and dq.auto_config(65) == 0 and dq.auto_config(1024) == 0
    assert set(dq.CONFIGS) == {0, 1}


def _args(counts=(3, 0, 5), n: int = 32, k: int = 256):  # noqa: ANN001, ANN202
    a, packed, scales, offs = _operands(list(counts), n, k, gen(5), extra_rows=1)
    return a, packed, scales, offs, torch.empty((a.shape[0], n), dtype=torch.bfloat16)


def test_check_args_accepts() -> None:
    a, packed, scales, offs, out = _args()
    assert dq.check_args(a, packed, scales, offs, out) == (9, 3, 32, 256)
    assert dq.check_args(a, packed.view(torch.int8), scales.view(torch.float8_e8m0fnu), offs, out) == (9, 3, 32, 256)


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        (lambda t: {**t, "a": t["a"].float()}, TypeError, "a: expected dtype"),
        (lambda t: {**t, "offs": t["offs"].long()}, TypeError, "offs: expected dtype"),
        (lambda t: {**t, "scales": t["scales"].float()}, TypeError, "scales: expected dtype"),
        (lambda t: {**t, "a": t["a"][:, :128]}, ValueError, "a: expected a contiguous 2-D"),
        (lambda t: {**t, "a": t["a"][:, :128].contiguous()}, ValueError, r"packed: expected \[g, n, 64\]"),
        (lambda t: {**t, "scales": t["scales"][:, :, :4].contiguous()}, ValueError, "scales: expected shape"),
        (lambda t: {**t, "offs": t["offs"][:2].contiguous()}, ValueError, r"offs: expected shape \(3,\)"),
        (lambda t: {**t, "out": t["out"][:, :16].contiguous()}, ValueError, "out: expected shape"),
        (lambda t: {**t, "a": t["a"].view(-1)[8:].view(-1)[: 9 * 256 - 8]}, ValueError, "a: expected a contiguous"),
    ],
)
def test_check_args_rejects(change, exc: type, match: str) -> None:  # noqa: ANN001
    a, packed, scales, offs, out = _args()
    t = change({"a": a, "packed": packed, "scales": scales, "offs": offs, "out": out})
    with pytest.raises(exc, match=match):
        dq.check_args(t["a"], t["packed"], t["scales"], t["offs"], t["out"])


def test_check_args_rejects_k_n_and_alignment() -> None:
    a, packed, scales, offs, out = _args(n=24)
    with pytest.raises(ValueError, match="n: expected a multiple of 16, got 24"):
        dq.check_args(a, packed, scales, offs, out)
    a, packed, scales, offs, out = _args(k=192)
    with pytest.raises(ValueError, match="k: expected a positive multiple of 128, got 192"):
        dq.check_args(a, packed, scales, offs, out)
    a, packed, scales, offs, out = _args()
    big = torch.empty(a.numel() + 8, dtype=torch.bfloat16)
    shifted = big[1 : 1 + a.numel()].view(a.shape)  # contiguous, 2-byte offset: not 16-byte aligned
    with pytest.raises(ValueError, match="a: expected a 16-byte aligned data pointer"):
        dq.check_args(shifted, packed, scales, offs, out)


def test_wrapper_needs_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dq, "available", lambda: False)
    with pytest.raises(RuntimeError, match="not built with the CUTLASS W4A16 dq GEMM"):
        dq.m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq(*_args())


def test_wrapper_rejects_bad_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dq, "available", lambda: True)
    for kw, match in (({"config": 2}, "config: expected one of"), ({"raster": 3}, "raster: expected"),
                      ({"swizzle": 3}, "swizzle: expected"), ({"chunk": 4}, "chunk: expected")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            dq.m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq(*_args(), **kw)


def _route(monkeypatch: pytest.MonkeyPatch, impl: str | None, counts: list[int], **kw) -> list[str]:  # noqa: ANN003
    """The public API on CPU operands with the fast path, a CUDA device and `_C` faked: which path ran (the stand-ins
    compute the reference, checked against it)."""
    from deepinfer.deep_gemm.backends.cuda import triton_fp4_grouped as tg

    for var in (api_w4a16.IMPL_ENV, "DEEPINFER_DG_W4A16_CONFIG", "DEEPINFER_DEEP_GEMM_BACKEND", dq.SCRATCH_ENV):
        monkeypatch.delenv(var, raising=False)
    if impl is not None:
        monkeypatch.setenv(api_w4a16.IMPL_ENV, impl)
    monkeypatch.setattr(api_w4a16, "use_triton", lambda device: True)
    monkeypatch.setattr(api_w4a16, "_on_cuda", lambda t: True)
    monkeypatch.setattr(dq, "available", lambda: True)
    ran: list[str] = []

    def stand_in(name: str):  # noqa: ANN202
        def run(a, packed, scales, offs, out, **_):  # noqa: ANN001, ANN003, ANN202
            ran.append(name)
            return ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, out)

        return run

    monkeypatch.setattr(dq, "m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq", stand_in("cutlass_dq"))
    monkeypatch.setattr(tg, "m_grouped_bf16_fp4_gemm_nt_contiguous_triton", stand_in("triton"))
    monkeypatch.setattr(api_w4a16, "_cuda_choice", lambda *args: None)  # the default route's CUDA kernels: not here
    a, packed, scales, offs = _operands(counts, 32, 256, gen(11), extra_rows=2)
    out = torch.full((a.shape[0], 32), NAN, dtype=torch.bfloat16)
    got = dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a, (packed, scales), offs, out, **kw)
    rows = sum(counts)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    assert got is out and torch.equal(out[:rows], want[:rows]) and out[rows:].isnan().all()
    return ran


@pytest.mark.parametrize(
    ("impl", "counts", "kw", "want"),
    [
        ("cutlass_dq", [64, 0, 64, 64], {}, ["triton"]),  # estimate ceil(192 / 4) = 48 < MIN_ROWS
        ("cutlass_dq", [64, 64, 64, 64], {}, ["cutlass_dq"]),
        ("cutlass_dq", [60, 60, 60, 60], {}, ["triton"]),  # ceil((240 + 2) / 4) = 61 < MIN_ROWS: the auto route
        ("cutlass_dq", [8, 8, 8, 8], {"expected_m": 64}, ["cutlass_dq"]),  # the hint decides
        ("cutlass_dq", [64] * 4, {"expected_m": 16}, ["triton"]),
        ("cutlass_dq", [64] * 4, {"config": api_w4a16.cfgs.MID}, ["triton"]),  # an explicit config wins
        ("auto", [64] * 4, {}, ["triton"]),  # opt-in only: the default never takes it
        (None, [256] * 4, {}, ["triton"]),
        ("triton", [256] * 4, {}, ["triton"]),
    ],
)
def test_api_routing(impl: str | None, counts: list[int], kw: dict, want: list[str], monkeypatch) -> None:  # noqa: ANN001
    assert _route(monkeypatch, impl, counts, **kw) == want


def test_api_routing_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forced config name or DEEPINFER_DEEP_GEMM_BACKEND=triton keeps cutlass_dq off; `_C` without the kernel
    too; a bad impl name is an error naming the choices."""
    monkeypatch.setenv("DEEPINFER_DG_W4A16_CONFIG", "m64n128k128w4s3")
    a, packed, scales, offs, out = _args(counts=(64, 64))
    monkeypatch.setenv(api_w4a16.IMPL_ENV, "cutlass_dq")
    monkeypatch.setattr(api_w4a16, "_on_cuda", lambda t: True)
    monkeypatch.setattr(dq, "available", lambda: True)
    assert not api_w4a16._use_cutlass_dq(a, packed, scales, offs, out, 2, None)
    monkeypatch.delenv("DEEPINFER_DG_W4A16_CONFIG")
    assert api_w4a16._use_cutlass_dq(a, packed, scales, offs, out, 2, None)
    monkeypatch.setenv("DEEPINFER_DEEP_GEMM_BACKEND", "triton")
    assert not api_w4a16._use_cutlass_dq(a, packed, scales, offs, out, 2, None)
    monkeypatch.delenv("DEEPINFER_DEEP_GEMM_BACKEND")
    monkeypatch.setattr(dq, "available", lambda: False)
    assert not api_w4a16._use_cutlass_dq(a, packed, scales, offs, out, 2, None)
    monkeypatch.setattr(dq, "available", lambda: True)
    assert not api_w4a16._use_cutlass_dq(a, packed, scales, offs, out[:, :16].contiguous(), 2, None)  # bad out
    monkeypatch.setattr(api_w4a16, "_on_cuda", lambda t: False)
    assert not api_w4a16._use_cutlass_dq(a, packed, scales, offs, out, 2, None)
    monkeypatch.setenv(api_w4a16.IMPL_ENV, "dq")
    with pytest.raises(ValueError, match="auto|triton|cuda|cutlass_dq"):
        dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a, (packed, scales), offs, out)


@pytest.mark.skipif(os.environ.get("DG_DQ_COMPILE") != "1" or shutil.which("nvcc") is None
                    or not CUTLASS_INCLUDE.is_dir(), reason="sm_90a compile check: set DG_DQ_COMPILE=1 (~95 s for "
                    "both configs on 2 cores), needs nvcc and the CUTLASS headers")  # fmt: skip
@pytest.mark.parametrize("name", ["coop", "pingpong"])
def test_sm90_compile(name: str, tmp_path: Path) -> None:
    """Both configs compile for sm_90a without spills (the build's flags)."""
    res = subprocess.run(["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
                          "--expt-relaxed-constexpr", "-DNDEBUG", "-c", str(CSRC / f"w4a16_dq_{name}.cu"), "-o",
                          str(tmp_path / "x.o"), f"-I{CUTLASS_INCLUDE}", f"-I{CSRC}"],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    spills = [ln for ln in res.stderr.splitlines() if "spill stores" in ln]
    assert spills and all(" 0 bytes spill stores, 0 bytes spill loads" in ln for ln in spills), spills


# ---------------------------------------------------------------- GPU

needs_dq = pytest.mark.skipif(not dq.available(), reason="_C built without the CUTLASS W4A16 dq GEMM")
GPU_CASES = {
    "ragged": ([0, 3, 1, 0, 9, 200, 0, 8], 256, 512),  # empty experts (first and inside), > 1 M tile, tiny ones
    "odd": ([5, 0, 17, 1], 48, 384),  # n not a multiple of the 256-wide tile, k % 64 tail-free but not % 256
    "tpe64": ([64, 0, 63, 65], 128, 1024),
}


@pytest.mark.gpu
def test_gpu_dq_built() -> None:
    """A CUTLASS build of this tree has the dq GEMM with both configs (a stale `_C` fails here, not as skips)."""
    from deepinfer.deep_gemm.backends.cuda import cutlass_fp8 as cf
    from deepinfer.deep_gemm.backends.cuda import cutlass_fp8_grouped as cg

    if not cg.available():
        pytest.skip("_C built without CUTLASS")
    assert dq.available(), "_C has the CUTLASS FP8 GEMMs but not the W4A16 dq GEMM: rebuild _C from this tree"
    assert cf._module().cutlass_w4a16_dq_configs == len(dq.CONFIGS)


@pytest.mark.gpu
@needs_dq
@pytest.mark.parametrize("chunk", [1, 3, None], ids=["chunk1", "chunk3", "auto"])
@pytest.mark.parametrize("config", sorted(dq.CONFIGS), ids=lambda c: dq.CONFIGS[c])
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_vs_float64(case: str, config: int, chunk: int | None) -> None:
    """Each config and chunk size (chunks split the experts: 1 expert, 3 = a partial last chunk, all) vs the
    float64 oracle within the fp32-accumulation + one bf16 rounding bound; rows past offs[-1] stay NaN."""
    counts, n, k = GPU_CASES[case]
    a, packed, scales, offs = _operands(counts, n, k, gen(len(case) + n + k), sb=(100, 140))
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16, device="cuda")
    got = dq.m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq(*_gpu(a, packed, scales, offs), out, config=config,
                                                               chunk=chunk)  # fmt: skip
    torch.cuda.synchronize()
    _check_vs_float64(got, a, packed, scales, counts, k, f"cutlass_dq {dq.CONFIGS[config]} chunk={chunk} {case}")


@pytest.mark.gpu
@needs_dq
@pytest.mark.parametrize("rows", [64, 256])
@pytest.mark.parametrize("nk", [(4096, 4096), (4096, 2048)], ids=["gate_up", "down"])
def test_gpu_api_v4_shapes(rows: int, nk: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The public API with DEEPINFER_DG_W4A16_IMPL=cutlass_dq on V4 expert shapes (8 experts, two empty, ragged):
    close to the reference, bit-identical to the direct call of its config."""
    monkeypatch.setenv(api_w4a16.IMPL_ENV, "cutlass_dq")
    monkeypatch.delenv("DEEPINFER_DG_W4A16_CONFIG", raising=False)
    monkeypatch.delenv("DEEPINFER_DEEP_GEMM_BACKEND", raising=False)
    n, k = nk
    counts = [rows, 0, rows, 1, 0, rows, rows, rows - 1]
    a, packed, scales, offs = _gpu(*_operands(counts, n, k, gen(n + k + rows)))
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16, device="cuda")
    got = dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a, (packed, scales), offs, out, expected_m=rows)
    cfg = dq.auto_config(rows)
    direct = dq.m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq(a, packed, scales, offs, torch.empty_like(out),
                                                                  config=cfg)  # fmt: skip
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    total = sum(counts)
    d = calc_diff(got[:total], want[:total])
    same = torch.equal(got[:total], direct[:total])
    assert got is out and d < 1e-5 and same, f"rows={rows} n={n} k={k} config {cfg}: calc_diff {d:.3e}, same {same}"
    assert out[total:].isnan().all(), "rows past offs[-1] were written"


@pytest.mark.gpu
@needs_dq
def test_gpu_m0_and_all_empty() -> None:
    """m = 0 is a no-op; all-empty experts (rows present past offs[-1]) write nothing."""
    n, k = 256, 512
    packed = torch.randint(0, 256, (4, n, k // 2), dtype=torch.uint8, device="cuda")
    scales = torch.randint(118, 131, (4, n, k // 32), dtype=torch.uint8, device="cuda")
    offs0 = torch.zeros(4, dtype=torch.int32, device="cuda")
    a0 = torch.empty((0, k), dtype=torch.bfloat16, device="cuda")
    out0 = torch.empty((0, n), dtype=torch.bfloat16, device="cuda")
    assert dq.m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq(a0, packed, scales, offs0, out0) is out0
    a = torch.randn((5, k), dtype=torch.bfloat16, device="cuda")
    out = torch.full((5, n), NAN, dtype=torch.bfloat16, device="cuda")
    dq.m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq(a, packed, scales, offs0, out, chunk=2)
    torch.cuda.synchronize()
    assert out.isnan().all(), f"{int((~out.isnan()).sum())} outputs written with every expert empty"


@pytest.mark.gpu
@needs_dq
def test_gpu_cuda_graph_replay() -> None:
    """Captured once, replayed with new offs and activations (no host sync inside): matches the eager call."""
    n, k = 256, 512
    counts = [70, 0, 64, 3, 130, 0]
    a, packed, scales, offs = _gpu(*_operands(counts, n, k, gen(99)))
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16, device="cuda")
    run = lambda: dq.m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq(a, packed, scales, offs, out, chunk=4)  # noqa: E731
    run()  # warm-up outside the capture (workspace sizes, TMA setup)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    new_counts = [0, 100, 64, 3, 70, 30]
    offs.copy_(torch.tensor(new_counts, device="cuda").cumsum(0).to(torch.int32))
    a.copy_(torch.randn(a.shape, device="cuda").to(torch.bfloat16))
    out.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize()
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    rows = sum(new_counts)
    d = calc_diff(out[:rows], want[:rows])
    assert d < 1e-5 and out[rows:].isnan().all(), f"graph replay: calc_diff {d:.3e}"
