"""W4A16 grouped GEMM, kernel 3 (`triton_fp4_grouped_v3.py`): the bit-trick dequantiser, fold, split-K.

CPU: a small PTX emulator runs the kernel's two inline-asm blocks (taken from the source file) on every byte
value and scale lane, so the asm's bit layout is checked without a GPU; the kernel runs in Triton's interpreter
(integer-op twin of the asm); the sm_90a compile check runs in a subprocess. GPU tests are marked `gpu`.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pathlib  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from dg_testing import assert_gemm_close, fp4_weight64, gen  # noqa: E402
from test_dg_w4a16 import _exact64, _one_hot_case, _operands, _rel_fro  # noqa: E402

from deepinfer.deep_gemm import reference_w4a16 as ref  # noqa: E402
from deepinfer.deep_gemm.api_w4a16 import m_grouped_bf16_fp4_gemm_nt_contiguous as gemm  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import w4a16_configs as cfgs  # noqa: E402

ENV = "DEEPINFER_DEEP_GEMM_BACKEND"
NAN = float("nan")
E8M0 = torch.float8_e8m0fnu
_HERE = pathlib.Path(__file__).resolve().parent
_V3_SRC = _HERE.parent / "src/deepinfer/deep_gemm/backends/cuda/triton_fp4_grouped_v3.py"
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
V3 = [c for c in cfgs.SWEEP["decode"] if c.kernel == 3]
interp_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


# --- the inline PTX, emulated -------------------------------------------------------------------------------


def _asm_blocks() -> list[str]:
    """The kernel file's inline-asm strings, in order: [fold, plain]."""
    return re.findall(r'inline_asm_elementwise\(\s*"""(.*?)"""', _V3_SRC.read_text(), re.S)


def _bf16x2_mul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """mul.rn.bf16x2 on uint32 words, for EXACT products (asserted): lanes widened to fp32 by << 16 (keeps
    subnormals), multiplied in float64, narrowed back by >> 16."""
    out = np.zeros_like(x)
    for sh in (0, 16):
        fx = ((x >> sh) & 0xFFFF).astype(np.uint32) << 16
        fy = ((y >> sh) & 0xFFFF).astype(np.uint32) << 16
        p = (fx.view(np.float32).astype(np.float64) * fy.view(np.float32).astype(np.float64)).astype(np.float32)
        bits = p.view(np.uint32)
        assert not (bits & 0xFFFF).any(), "product not exact in bf16"
        out |= (bits >> 16) << sh
    return out


def _lop3(a: np.ndarray, b: np.ndarray, c: np.ndarray, lut: int) -> np.ndarray:
    """PTX lop3: result bit = lut[(a << 2) | (b << 1) | c] per bit position."""
    r = np.zeros_like(a)
    for i in range(8):
        if lut >> i & 1:
            r |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
    return r


def _prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    """PTX prmt (default mode): output byte i = byte (sel >> 4i) & 7 of {b, a}; bit 3 of the nibble replicates
    that byte's sign."""
    r = np.zeros_like(a)
    for i in range(4):
        s = (sel >> 4 * i) & 0xF
        src = a if (s & 7) < 4 else b
        byte = (src >> (8 * (s & 3))) & 0xFF
        if s & 8:
            byte = np.where(byte & 0x80, 0xFF, 0).astype(np.uint32)
        r |= byte << (8 * i)
    return r


def _run_ptx(asm: str, regs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute the PTX subset the kernels use on uint32 numpy vectors; returns the register file."""
    regs = dict(regs)
    for stmt in asm.split(";"):
        stmt = stmt.replace("{", " ").replace("}", " ").strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, *args = stmt.replace(",", " ").split()
        v = [regs[t] if t in regs else np.uint32(int(t, 0)) for t in args[1:]]
        if op == "mov.b32":
            r = np.broadcast_to(v[0], regs["$4"].shape).astype(np.uint32)
        elif op == "and.b32":
            r = v[0] & v[1]
        elif op == "or.b32":
            r = v[0] | v[1]
        elif op == "shl.b32":
            r = (v[0] << v[1]).astype(np.uint32)
        elif op == "shr.b32":
            r = v[0] >> v[1]
        elif op == "lop3.b32":
            r = _lop3(v[0], v[1], np.broadcast_to(v[2], v[0].shape).astype(np.uint32), int(args[4], 0))
        elif op == "prmt.b32":
            r = _prmt(v[0], v[1], int(args[3], 0))
        elif op == "mul.rn.bf16x2":
            r = _bf16x2_mul(v[0], np.broadcast_to(v[1], v[0].shape).astype(np.uint32))
        else:
            raise AssertionError(f"emulator: unknown PTX op {op!r}")
        regs[args[0]] = np.asarray(r, dtype=np.uint32)
    return regs


def _lanes(words: np.ndarray) -> np.ndarray:
    """uint32 [N] bf16x2 words -> float64 [N, 2] (low lane first)."""
    f = np.stack([(words & 0xFFFF) << 16, words & 0xFFFF0000], axis=1).astype(np.uint32)
    return f.view(np.float32).astype(np.float64)


@pytest.mark.parametrize("fold", [True, False], ids=["fold", "plain"])
def test_asm_emulated_exact(fold: bool) -> None:
    """Every byte value in every byte position, a different scale per element (lanes must not mix): the asm's
    (even, odd) words equal e2m1 * 2^(s-127) exactly, code 1 = 0.5 included (a bf16 subnormal mid-way)."""
    asm = _asm_blocks()[0 if fold else 1]
    rng = np.random.default_rng(5)
    byte = np.arange(256, dtype=np.uint32)
    words = byte | (np.roll(byte, 1) << 8) | (np.roll(byte, 7) << 16) | (np.roll(byte, 100) << 24)
    words = np.tile(words, 4)
    hi = 128 if fold else 252  # FOLD's domain ends at scale 2 (s = 128): see the kernel docstring
    s = rng.integers(2, hi + 1, size=(words.size, 4)).astype(np.uint32)
    s[:8] = [[2, hi, 127, 3]] * 8  # the domain's ends
    field = s + 126 if fold else s
    mult = (field << 7) * 0x10001  # `_scale_mult`
    regs = _run_ptx(asm, {"$4": words, **{f"${5 + i}": mult[:, i].astype(np.uint32) for i in range(4)}})
    codes = np.array(E2M1)
    scale = np.exp2(s.astype(np.float64) - 127)
    b = [(words >> (8 * i)) & 0xFF for i in range(4)]
    for out_reg, (i, j), nib in (("$0", (0, 1), 0), ("$1", (2, 3), 0), ("$2", (0, 1), 4), ("$3", (2, 3), 4)):
        got = _lanes(regs[out_reg])
        for lane, e in enumerate((i, j)):
            want = codes[(b[e] >> nib) & 15] * scale[:, e]
            bad = np.flatnonzero(got[:, lane] != want)
            assert bad.size == 0, f"{out_reg} lane {lane}: word {words[bad[0]]:#x} s={s[bad[0]]} got {got[bad[0]]}"
    assert (_lanes(regs["$0"])[:, 0] == 0.5 * scale[:, 0])[(words & 15) == 1].all()  # code 1 -> 0.5, explicitly


def test_sm90_compile_no_spills() -> None:
    """Every kernel-3 config compiles for sm_90a (asm dequantiser; V3_DECODE also the integer one), without
    spills or .ftz multiplies (`dg_w4a16_sm90_compile.py --all` compiles every variant)."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(_HERE.parent / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(_HERE / "dg_w4a16_sm90_compile.py")], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    if "OK " not in out and ("ptxas" in out or "No module named" in out):
        pytest.skip(f"Triton's CUDA compiler is not usable here: {out[-300:]}")
    assert proc.returncode == 0, out[-4000:]
    assert len(re.findall(r"^OK v3 ", out, re.M)) == len(V3) + 1, out


# --- interpreter --------------------------------------------------------------------------------------------


def _sb(cfg: cfgs.W4A16Config) -> tuple[int, int]:
    """Scale-byte range for random operands: FOLD is exact only up to s = 128."""
    return (118, 128) if cfg.fold else (118, 132)


@interp_only
@pytest.mark.parametrize(
    "cfg",
    [
        cfgs.W4A16Config(16, 32, 128, 2, 2, kernel=3),
        cfgs.W4A16Config(16, 32, 128, 2, 2, kernel=3, fold=True),
        cfgs.W4A16Config(16, 16, 64, 2, 2, kernel=3, split_k=2),
        cfgs.W4A16Config(32, 16, 32, 4, 2, kernel=3, fold=True, split_k=4),
    ],
    ids=lambda c: c.name,
)
@pytest.mark.parametrize("even_n", [True, False], ids=["even_n", "n_tail"])
def test_v3_interpreter(cfg: cfgs.W4A16Config, even_n: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row tiles (a partial one), empty groups (leading too), n with or without a column tail, k of several
    steps per split: vs the reference and float64; rows past offs[-1] untouched."""
    monkeypatch.setenv(ENV, "triton")
    counts = [0, cfg.block_m + 3, 0, 2, 5]
    n = 2 * cfg.block_n if even_n else 2 * cfg.block_n + 16
    k = 2 * cfg.block_k * cfg.split_k
    a, packed, scales, offs = _operands(counts, n, k, gen(cfg.block_n + k + even_n), sb=_sb(cfg))
    rows = sum(counts)
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16)
    assert gemm(a, (packed, scales), offs, out, config=cfg) is out
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    # interpreter: fp32 dots, TRUNCATING bf16 cast (< 2^-7 relative); see test_dg_w4a16.test_triton_vs_reference
    err = _rel_fro(out[:rows], want[:rows])
    assert err < 1e-2, f"rel err {err:.3g} vs reference"
    val, _ = _exact64(a, packed, scales, counts)
    assert _rel_fro(out[:rows], val) < 1e-2
    assert out[rows:].isnan().all(), "rows past offs[-1] must stay untouched"


@interp_only
@pytest.mark.parametrize("fold", [False, True], ids=["plain", "fold"])
def test_v3_dequant_bit_exact_interpreter(fold: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """One-hot rows return the dequantised weights exactly (integer twin of the asm), over the config's scale
    domain, with code 1 (0.5) at the smallest scale: 2^-126, a bf16 that passes a subnormal on the way."""
    monkeypatch.setenv(ENV, "triton")
    a, packed, scales, offs, _ = _one_hot_case()
    if fold:
        scales.clamp_(max=128)
    packed[0, 0, 0] = 0x91  # codes 1 (0.5) and 9 (-0.5)
    scales[0, 0, 0] = 2
    want = fp4_weight64(packed.view(torch.int8), scales.view(E8M0))
    want = torch.cat([want[0].T, want[1].T])
    cfg = cfgs.W4A16Config(16, 32, 128, 2, 2, kernel=3, fold=fold)
    got = gemm(a, (packed, scales), offs, config=cfg).double()
    bad = (got != want).nonzero()
    assert bad.numel() == 0, (
        f"{bad.shape[0]} wrong, first at {bad[0].tolist()}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}"
    )
    assert got[0, 0] == 0.5 * 2.0**-125 and got[1, 0] == -0.5 * 2.0**-125


@interp_only
def test_v3_all_groups_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split-K with no rows at all: neither kernel writes anything."""
    monkeypatch.setenv(ENV, "triton")
    a, packed, scales, offs = _operands([0, 0, 0], 32, 256, gen(11), extra_rows=5)
    out = torch.full((5, 32), NAN, dtype=torch.bfloat16)
    gemm(a, (packed, scales), offs, out, config=cfgs.W4A16Config(16, 32, 128, 2, 2, kernel=3, split_k=2))
    assert out.isnan().all()


def test_v3_config_names_and_checks() -> None:
    c = cfgs.parse_config("m16n64k128w2s3v3fx2")
    assert (c.kernel, c.fold, c.split_k) == (3, True, 2) and c.name == "m16n64k128w2s3v3fx2"
    assert cfgs.parse_config("m16n64k128w2s3v3").name == "m16n64k128w2s3v3"
    for bad in ("m16n64k128w2s3f", "m16n64k128w2s3x2", "m16n64k128w2s3v2x2"):
        with pytest.raises(ValueError, match="kernel 3 only"):
            cfgs.parse_config(bad)
    with pytest.raises(ValueError, match="split_k"):
        cfgs.W4A16Config(16, 64, kernel=3, split_k=3)
    a, packed, scales, offs = _operands([2], 32, 128, gen(2))
    with pytest.raises(ValueError, match="split_k"):  # K = 128 < block_k * split_k
        gemm(a, (packed, scales), offs, config=cfgs.W4A16Config(16, 32, 128, kernel=3, split_k=2))


# --- GPU ------------------------------------------------------------------------------------------------------


def _cuda(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.cuda() for t in ts)


_GPU_SHAPES = {  # V4 expert k (4096 gate+up, 2048 down), n cut to 512 / 1024 to keep the float64 oracle cheap
    "decode_gate_up": ([0, 1, 0, 3, 8, 0, 2, 1] * 2, 512, 4096),
    "decode_down": ([1, 0, 0, 5, 0, 7, 1, 0] * 2, 512, 2048),
    "prefill_ragged": ([200, 0, 37, 129, 1], 1024, 2048),
}


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", V3, ids=lambda c: c.name)
@pytest.mark.parametrize("shape", list(_GPU_SHAPES), ids=str)
def test_gpu_v3_vs_reference(cfg: cfgs.W4A16Config, shape: str) -> None:
    """Every swept kernel-3 config on decode (1-8 rows, empty experts) and ragged prefill rows, asm path."""
    counts, n, k = _GPU_SHAPES[shape]
    a, packed, scales, offs = _cuda(*_operands(counts, n, k, gen(61 + n + k), sb=_sb(cfg)))
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16, device="cuda")
    gemm(a, (packed, scales), offs, out, config=cfg)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    rows = sum(counts)
    diff = (out[:rows].float() - want[:rows].float()).abs()
    err = _rel_fro(out[:rows], want[:rows])
    assert err < 4e-3, f"rel err {err:.3g}; max abs diff {diff.max():.3g} at {divmod(int(diff.argmax()), n)}"
    val, mag = _exact64(a.cpu(), packed.cpu(), scales.cpu(), counts)
    assert_gemm_close(out[:rows].cpu(), val, mag, k)
    assert out[rows:].isnan().all(), "rows past offs[-1] must stay untouched"


@pytest.mark.gpu
@pytest.mark.parametrize("use_asm", [True, False], ids=["asm", "int"])
@pytest.mark.parametrize("fold", [False, True], ids=["plain", "fold"])
def test_gpu_v3_dequant_bit_exact(use_asm: bool, fold: bool) -> None:
    """One-hot rows: exact dequantised weights on the GPU, code 1 = 0.5 at scale 2^-125 (no denormal flush)."""
    from deepinfer.deep_gemm.backends.cuda.triton_fp4_grouped import m_grouped_bf16_fp4_gemm_nt_contiguous_triton

    a, packed, scales, offs, _ = _one_hot_case()
    if fold:
        scales.clamp_(max=128)
    packed[0, 0, 0] = 0x91
    scales[0, 0, 0] = 2
    want = fp4_weight64(packed.view(torch.int8), scales.view(E8M0))
    want = torch.cat([want[0].T, want[1].T])
    a, packed, scales, offs = _cuda(a, packed, scales, offs)
    out = torch.empty(a.shape[0], packed.shape[1], dtype=torch.bfloat16, device="cuda")
    cfg = cfgs.W4A16Config(16, 32, 128, 2, 3, kernel=3, fold=fold)
    m_grouped_bf16_fp4_gemm_nt_contiguous_triton(a, packed, scales, offs, out, config=cfg, use_asm=use_asm)
    got = out.double().cpu()
    bad = (got != want).nonzero()
    assert bad.numel() == 0, (
        f"{bad.shape[0]} wrong, first at {bad[0].tolist()}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}"
    )


@pytest.mark.gpu
def test_gpu_v3_splitk_cuda_graph() -> None:
    """Split-K (workspace + reduce) captured in a CUDA graph, replayed with new offs (empty groups)."""
    cfg = cfgs.W4A16Config(16, 64, 128, 2, 3, kernel=3, split_k=2)
    a, packed, scales, _ = _cuda(*_operands([4, 4, 4, 4], 256, 1024, gen(67), extra_rows=0))
    offs = torch.tensor([4, 8, 12, 16], dtype=torch.int32, device="cuda")
    out = torch.full((16, 256), NAN, dtype=torch.bfloat16, device="cuda")
    gemm(a, (packed, scales), offs, out, config=cfg)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(a, (packed, scales), offs, out, config=cfg)
    offs.copy_(torch.tensor([0, 1, 1, 9], dtype=torch.int32))
    out.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize()
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    err = _rel_fro(out[:9], want[:9])
    assert err < 4e-3, f"rel err {err:.3g}"
    assert out[9:].isnan().all()
