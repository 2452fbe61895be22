"""FP8-activation x FP4-weight (W4A8) M-grouped contiguous GEMM: reference vs float64, the e2m1 -> e4m3 PTX
(emulated), the Triton kernel vs the reference in the CPU interpreter, API checks, sm_90a compile; `gpu` tests on
V4 decode / prefill shapes.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import dg_testing as dgt  # noqa: E402
import pytest  # noqa: E402
from dg_testing import act64, assert_gemm_close, calc_diff, fp4_weight64, gen  # noqa: E402
from test_dg_w4a16_v3 import _run_ptx  # noqa: E402  (the PTX-subset emulator)

from deepinfer.deep_gemm import reference_w4a8 as ref  # noqa: E402
from deepinfer.deep_gemm.api_w4a8 import m_grouped_fp8_fp4_gemm_nt_offsets as gemm  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import w4a8_configs as cfgs  # noqa: E402

ENV = "DEEPINFER_DEEP_GEMM_BACKEND"
E8M0 = torch.float8_e8m0fnu
FP8 = torch.float8_e4m3fn
NAN = float("nan")
_rel_fro = dgt.rel_fro
_HERE = pathlib.Path(__file__).resolve().parent
_SRC = _HERE.parent / "src/deepinfer/deep_gemm/backends/cuda/triton_fp4_fp8_grouped.py"
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
ALL_CFGS = [*cfgs.W4A8_SWEEP["decode"], *cfgs.W4A8_SWEEP["prefill"]]
interp_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


def _operands(counts: list[int], n: int, k: int, g: torch.Generator, extra_rows: int = 3, sb=(118, 130)) -> tuple:
    """a e4m3 [m, k] (|a| up to ~16), sfa fp32 [m, k/128], packed uint8 [G, n, k/2], E8M0 bytes [G, n, k/32],
    offs int32 [G]; m = sum(counts) + extra_rows."""
    m = sum(counts) + extra_rows
    a = (torch.randn((m, k), generator=g) * 4).to(FP8)
    sfa = torch.rand((m, k // 128), generator=g) + 0.5
    return (a, sfa, *dgt.fp4_group_weights(counts, n, k, g, sb))


def _exact64(a, sfa, packed, scales, counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 value and magnitude (|x| @ |W|^T) of the grouped rows, with dg_testing's independent dequant."""
    return dgt.grouped_exact64(act64(a, sfa), packed, scales, counts)


@pytest.mark.parametrize(("counts", "n", "k"), [([3, 0, 20, 5], 64, 256), ([0, 17, 1], 32, 128)])
def test_reference_vs_float64(counts: list[int], n: int, k: int) -> None:
    a, sfa, packed, scales, offs = _operands(counts, n, k, gen(sum(counts) + n))
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16)
    assert ref.m_grouped_fp8_fp4_gemm_nt_offsets(a, sfa, packed, scales.view(E8M0), offs, out) is out
    val, mag = _exact64(a, sfa, packed, scales, counts)
    assert_gemm_close(out[: sum(counts)], val, mag, k)
    assert out[sum(counts) :].isnan().all()


def test_asm_emulated_exact() -> None:
    """The e2m1 -> e4m3 PTX on every byte value in every byte position: (even, odd) e4m3 bytes == e2m1 * 2^-6
    exactly, code 1 (0.5 -> the e4m3 subnormal 2^-7) and code 8 (-0 -> 0x80) included."""
    (asm,) = re.findall(r'inline_asm_elementwise\(\s*"""(.*?)"""', _SRC.read_text(), re.S)
    byte = np.arange(256, dtype=np.uint32)
    words = byte | (np.roll(byte, 1) << 8) | (np.roll(byte, 7) << 16) | (np.roll(byte, 100) << 24)
    regs = _run_ptx(asm, {"$2": words, "$4": words})  # ("$4" only sizes the emulator's mov: unused here)
    fp8 = torch.tensor(range(256), dtype=torch.uint8).view(FP8).double().numpy()  # byte -> e4m3 value
    codes = np.array(E2M1) * 2.0**-6
    for out_reg, nib in (("$0", 0), ("$1", 4)):
        for i in range(4):
            got_bytes = (regs[out_reg] >> (8 * i)) & 0xFF
            want = codes[((words >> (8 * i)) >> nib) & 15]
            bad = np.flatnonzero(fp8[got_bytes] != want)
            assert bad.size == 0, f"{out_reg} byte {i}: word {words[bad[0]]:#x} -> {got_bytes[bad[0]]:#x}"
            neg_zero = (((words >> (8 * i)) >> nib) & 15) == 8
            assert (got_bytes[neg_zero] == 0x80).all(), "code 8 (-0) must map to e4m3 -0"
    assert fp8[0x04] == 2.0**-7  # the subnormal code 1 maps to


@interp_only
@pytest.mark.parametrize(
    ("counts", "n", "cfg"),
    [
        ([3, 0, 20, 5], 64, cfgs.W4A8Config(16, 32, 4, 2)),  # empty group; 20 rows = two row tiles
        ([0, 17, 1], 48, cfgs.W4A8Config(16, 32, 4, 2)),  # leading empty group; n % BLOCK_N != 0
        ([2, 0, 9, 0], 64, cfgs.W4A8Config(16, 64, 4, 2, split_k=2)),  # split-K with its reduce
        ([40, 0, 7], 64, cfgs.W4A8Config(32, 64, 4, 2)),  # prefill-style row tile, ragged
    ],
)
def test_triton_vs_reference(counts: list[int], n: int, cfg, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "triton")
    k = 256
    a, sfa, packed, scales, offs = _operands(counts, n, k, gen(11 * n + len(counts)))
    want = ref.m_grouped_fp8_fp4_gemm_nt_offsets(a, sfa, packed, scales, offs, torch.empty(a.shape[0], n).bfloat16())
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16)
    assert gemm((a, sfa), (packed.view(torch.int8), scales.view(E8M0)), offs, out, config=cfg) is out
    rows = sum(counts)
    # Same exact fp32 products in a different order; the interpreter TRUNCATES fp32 -> bf16 (< 2^-7 relative).
    assert _rel_fro(out[:rows], want[:rows]) < 1e-2
    val, _ = _exact64(a, sfa, packed, scales, counts)
    assert _rel_fro(out[:rows], val) < 1e-2
    assert out[rows:].isnan().all(), "rows past offs[-1] must stay untouched"


def _one_hot_case() -> tuple:
    """a = e4m3 identity rows per group (sfa = 1, so out[start + j] = W_i[:, j]); all 256 byte values in the
    weights (codes 1 = 0.5 and 8 = -0 among them), scale bytes over [2, 252]. Returns operands + W^T float64."""
    k, n, g = 128, 32, 2
    gen_ = gen(5)
    packed = (torch.arange(g * n * k // 2) % 256).reshape(g, n, k // 2).to(torch.uint8)
    packed = packed[:, torch.randperm(n, generator=gen_)]
    scales = torch.randint(2, 253, (g, n, k // 32), generator=gen_, dtype=torch.int32).to(torch.uint8)
    scales[0, 0, :2] = torch.tensor([2, 252], dtype=torch.uint8)  # the domain's ends
    packed[0, 0, :16] = 0x81  # codes 1 (0.5) and 8 (-0) at the smallest scale 2^-125
    a = torch.eye(k).to(FP8).repeat(g, 1)
    sfa = torch.ones(g * k, 1)
    offs = torch.tensor([k, 2 * k], dtype=torch.int32)
    w64 = fp4_weight64(packed.view(torch.int8), scales.view(E8M0))
    return a, sfa, packed, scales, offs, torch.cat([w64[0].T, w64[1].T])


@interp_only
def test_triton_one_hot_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """One-hot rows pick single weights: the output is the dequantised weight, exactly (incl. 0.5 * 2^-125)."""
    monkeypatch.setenv(ENV, "triton")
    a, sfa, packed, scales, offs, want = _one_hot_case()
    got = gemm((a, sfa), (packed, scales), offs, config=cfgs.W4A8Config(16, 32, 4, 2)).double()
    bad = (got != want).nonzero()
    first = bad[0].tolist() if bad.numel() else None
    assert bad.numel() == 0, f"first bad index {first}: got {got[tuple(first)]} want {want[tuple(first)]}"


def test_api_checks_and_empty() -> None:
    a, sfa, packed, scales, offs = _operands([2, 1], 32, 128, gen(3), extra_rows=0)
    with pytest.raises(TypeError, match="a\\[0\\]"):
        gemm((a.float(), sfa), (packed, scales), offs)
    with pytest.raises(ValueError, match="a\\[1\\]"):
        gemm((a, sfa[:, :0]), (packed, scales), offs)
    with pytest.raises(ValueError, match="K mismatch"):
        gemm((a, sfa), (packed[..., :32].contiguous(), scales), offs)
    with pytest.raises(TypeError, match="config"):
        gemm((a, sfa), (packed, scales), offs, config="a8m16n64w4s4")
    with pytest.raises(ValueError, match="split_k"):
        gemm((a, sfa), (packed, scales), offs, config=cfgs.W4A8Config(16, 32, split_k=2))
    out = gemm((a[:0], sfa[:0]), (packed, scales), torch.zeros(2, dtype=torch.int32))
    assert out.shape == (0, 32)


def test_config_names_round_trip() -> None:
    for cfg in ALL_CFGS:
        assert cfgs.parse_w4a8_config(cfg.name) == cfg
    assert cfgs.default_w4a8_config(1536, 256) == cfgs.W4A8_DECODE
    assert cfgs.default_w4a8_config(49152, 256) == cfgs.W4A8_PREFILL
    assert cfgs.default_w4a8_config(49152, 256, expected_m=4) == cfgs.W4A8_DECODE
    for bad in ("m16n64w4s4", "a8m16n64w4s4x3", "a8m12n64w4s4"):
        with pytest.raises(ValueError):
            cfgs.parse_w4a8_config(bad)


def test_sm90_compile_no_spills() -> None:
    """The W4A8 defaults compile for sm_90a (asm; the decode default also with the integer dequant) to wgmma, without
    .ftz, the decode default without spills (`dg_w4a8_sm90_compile.py --all`: every swept config)."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(_HERE.parent / "src"), str(_HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(_HERE / "dg_w4a8_sm90_compile.py")], env=env, capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    if "OK " not in out and ("ptxas" in out or "No module named" in out):
        pytest.skip(f"no sm_90a toolchain here: {out[-300:]}")
    assert proc.returncode == 0, out[-3000:]
    assert out.count("OK ") == 3 and "wgmma=0" not in out, out[-3000:]


# --- GPU ---------------------------------------------------------------------------------------------------

_GPU_SHAPES = {  # V4 expert k (4096 gate+up, 2048 down); n cut to 512 / 1024 to keep the float64 oracle cheap
    "decode_gate_up": ([0, 1, 0, 3, 8, 0, 2, 1] * 2, 512, 4096),
    "decode_down": ([1, 0, 0, 5, 0, 7, 1, 0] * 2, 512, 2048),
    "prefill_ragged": ([200, 0, 37, 129, 1], 1024, 2048),
}


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [None, *ALL_CFGS], ids=lambda c: "default" if c is None else c.name)
@pytest.mark.parametrize("shape", list(_GPU_SHAPES), ids=str)
def test_gpu_vs_reference(cfg, shape: str) -> None:
    """Every swept config (and the default) on decode (1-8 rows, empty experts) and ragged prefill rows."""
    counts, n, k = _GPU_SHAPES[shape]
    a, sfa, packed, scales, offs = (t.cuda() for t in _operands(counts, n, k, gen(61 + n + k)))
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16, device="cuda")
    gemm((a, sfa), (packed, scales), offs, out, config=cfg)
    want = ref.m_grouped_fp8_fp4_gemm_nt_offsets(a, sfa, packed, scales, offs, torch.empty_like(out))
    rows = sum(counts)
    diff = (out[:rows].float() - want[:rows].float()).abs()
    cd = calc_diff(out[:rows].float(), want[:rows].float())
    where = divmod(int(diff.argmax()), n)
    assert cd < 1e-3, f"calc_diff {cd:.3g}; max abs diff {diff.max():.3g} at {where}"
    assert _rel_fro(out[:rows], want[:rows]) < 4e-3, f"max abs diff {diff.max():.3g} at {where}"
    val, mag = _exact64(a.cpu(), sfa.cpu(), packed.cpu(), scales.cpu(), counts)
    # Element bound: one bf16 rounding (2^-8 relative) + the FP8 tensor cores' accumulation inside each 32-deep dot
    # (Hopper keeps ~14 significant bits there: <= ~2^-13 of the summed magnitudes) + fp32 promotion.
    err = (out[:rows].cpu().double() - val).abs()
    excess = err - (2.0**-8 * val.abs() + 2.0**-11 * mag)
    worst = int(excess.argmax()) if excess.numel() else 0
    assert excess.numel() == 0 or float(excess.max()) <= 0, (
        f"element bound exceeded by {float(excess.max()):.3g} at {divmod(worst, n)}: got "
        f"{float(out[:rows].flatten()[worst])}, want {float(val.flatten()[worst])}, mag {float(mag.flatten()[worst])}"
    )
    assert out[rows:].isnan().all(), "rows past offs[-1] must stay untouched"


@pytest.mark.gpu
@pytest.mark.parametrize("use_asm", [True, False], ids=["asm", "int"])
def test_gpu_one_hot_exact(use_asm: bool) -> None:
    """One-hot rows on the GPU: exact dequantised weights, code 1 = 0.5 at scale 2^-125 (no subnormal flush)."""
    from deepinfer.deep_gemm.backends.cuda.triton_fp4_fp8_grouped import m_grouped_fp8_fp4_gemm_nt_offsets_triton

    a, sfa, packed, scales, offs, want = _one_hot_case()
    a, sfa, packed, scales, offs = (t.cuda() for t in (a, sfa, packed, scales, offs))
    out = torch.empty(a.shape[0], packed.shape[1], dtype=torch.bfloat16, device="cuda")
    m_grouped_fp8_fp4_gemm_nt_offsets_triton(a, sfa, packed, scales, offs, out, use_asm=use_asm)
    got = out.cpu().double()
    bad = (got != want).nonzero()
    first = bad[0].tolist() if bad.numel() else None
    assert bad.numel() == 0, f"{bad.shape[0]} bad; first {first}: got {got[tuple(first)]} want {want[tuple(first)]}"


@pytest.mark.gpu
def test_gpu_cuda_graph_and_empty_experts() -> None:
    """Default decode config in a CUDA graph, replayed with new offs (all experts but two empty)."""
    counts = [1, 2, 0, 0, 6, 0, 3, 0]
    a, sfa, packed, scales, offs = (t.cuda() for t in _operands(counts, 256, 1024, gen(9), extra_rows=0))
    out = torch.full((a.shape[0], 256), NAN, dtype=torch.bfloat16, device="cuda")
    gemm((a, sfa), (packed, scales), offs, out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm((a, sfa), (packed, scales), offs, out)
    offs.copy_(torch.tensor([0, 0, 0, 5, 5, 5, 12, 12], dtype=torch.int32))
    out.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize()
    want = ref.m_grouped_fp8_fp4_gemm_nt_offsets(a, sfa, packed, scales, offs, torch.empty_like(out))
    assert calc_diff(out[:12].float(), want[:12].float()) < 1e-3
