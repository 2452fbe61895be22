"""The `lean` quantiser epilogue (session 6, `triton_quant.quant_tile_store_lean`, benchmark configs `lean*`; also
`kv_norm_rope_quant(..., lean=True)`, its quant-dequant) gives the default's bytes, bit for bit.

The lean epilogue does the default's per-group math (the same fp32 multiply or IEEE division, the same exponent
bits) with fewer instructions: the group's amax is a NaN-propagating max (no separate NaN flag), and on the GPU
the clamp to +-448 and the NaN byte select are left to the e4m3 conversion itself (cvt.rn.satfinite: finite
values beyond 448 saturate to +-448, which is what clamp-then-round gives; a non-finite group is a positive quiet
NaN, byte 0x7F). So q, exponents, 2^e scales and dequantised values must equal the default's bytes exactly; only
the NaN payload of an amax / 448 scale (a NaN group, `fp32` mode) may differ, NaN on both sides. Inputs: the
extreme groups of test_quant_triton (zero, subnormal, near fp32's max, NaN, -inf, exact 448 * 2^k, e4m3 ties)
and groups in the top e4m3 binade with amax at, 1 fp32 ulp above and 2^-8 above 448 * 2^k (where the clamp could
act: fp32(1/448) is above 1/448, so amax * fp32(1/448) never rounds below 2^k and a scaled value never exceeds
448 in the 2^e modes; with amax / 448 scales it can by an ulp, which rounds to 448 either way). In the
interpreter the lean path keeps the clamps and the integer-step rounding (HW_CAST is off), so the CPU tests check
the reduction and the wiring; the GPU tests check the hardware conversion (rounding, saturation, NaN byte).
"""

from __future__ import annotations

import importlib
import pathlib
import sys

import pytest
import torch
from test_kv_rows_exact import kv_inputs  # sets TRITON_INTERPRET on a CPU-only machine first (both do)
from test_quant_triton import _CUDA, DEV, _inputs

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from _cases import KVQ_CONFIGS, PTGQ_CONFIGS, SWIGLU_FP8_CONFIGS  # noqa: E402  (the benchmark's own configs)

from deepinfer.tile_kernels.api_quant import PTGQ_TILE_ELEMS  # noqa: E402
from deepinfer.tile_kernels.ref import quant as ref_quant  # noqa: E402


def _mod(name: str):  # noqa: ANN202 (a module)
    mod = f"deepinfer.tile_kernels.backends.cuda.{name}"
    if not _CUDA and mod in sys.modules:
        importlib.reload(sys.modules[mod])
    return importlib.import_module(mod)


_Q = _mod("triton_quant")
_F = _mod("triton_fused")
LEAN_PTGQ = {k: v for k, v in PTGQ_CONFIGS.items() if v.get("lean")}
LEAN_KVQ = {k: v for k, v in KVQ_CONFIGS.items() if v.get("lean")}
LEAN_SWIGLU = {k: v for k, v in SWIGLU_FP8_CONFIGS.items() if v.get("lean")}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes / words of t (fp8 as uint8, 2-byte floats as int16, fp32 as int32)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _same_bits(got: tuple, want: tuple, what: str, nan_payload_ok: tuple[int, ...] = ()) -> None:
    """Bitwise equality of each output (None skipped); for the outputs at nan_payload_ok, NaN == NaN (payload)."""
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:
            assert g is None, f"{what} output {i}: got a tensor, want None"
            continue
        assert g.dtype == w.dtype and g.shape == w.shape, (what, i, g.dtype, w.dtype, g.shape, w.shape)
        diff = _bits(g) != _bits(w)
        if i in nan_payload_ok:
            diff &= ~(torch.isnan(g.float()) & torch.isnan(w.float()))
        if diff.any():
            at = diff.nonzero()[0].tolist()
            raise AssertionError(
                f"{what} output {i}: {int(diff.sum())} of {diff.numel()} differ, first at {at}: "
                f"got {g[tuple(at)].item()!r} want {w[tuple(at)].item()!r}"
            )


def _saturating(x: torch.Tensor, group: int, seed: int) -> torch.Tensor:
    """x with groups 8.. (while there are any) whose values sit just above and below 448 * 2^k: the amax * (1/448)
    product rounds so that the scaled amax lands near 448, and others are e4m3 ties in the top binade."""
    flat = x.view(-1, group)
    g = torch.Generator().manual_seed(seed)
    for i in range(8, min(flat.shape[0], 12)):
        k = float(2 ** int(torch.randint(-6, 7, (1,), generator=g)))
        vals = (416.0 + 32.0 * torch.rand(group, generator=g)) * k  # 416..448 * 2^k: the top e4m3 binade
        vals[0] = 448.0 * k * (1 + 2.0**-8)  # amax a little above 448 * 2^k (bf16 keeps 8 bits)
        vals[1] = 464.0 * k  # the tie between 448 and 480
        vals[2] = torch.nextafter(torch.tensor(448.0 * k), torch.tensor(float("inf")))  # 1 fp32 ulp above
        flat[i] = (vals * torch.where(torch.rand(group, generator=g) < 0.5, -1.0, 1.0)).to(flat.device, flat.dtype)
    return x


def _quant_inputs(rows: int, n: int, group: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    return _saturating(_inputs(rows, n, group, seed, dtype), group, seed)


def _epilogues(configs: dict, every: bool) -> dict:
    """All configs (every, the GPU tests) or only those that differ in the epilogue, not in the grid (the CPU
    tests: the interpreter's time goes to the tiling, which the persistent test and test_configs_triton cover)."""
    return configs if every else {k: v for k, v in configs.items() if k in ("lean", "leanx", "lean_ex2")}


def check_quant(x: torch.Tensor, kv: torch.Tensor, what: str, every: bool = True) -> None:
    """Every lean config of per_token_group_quant_fp8 (all three scale modes, groups 128) and of the kv
    quant-dequant (blocks of 64, a strided view) against the pre-session-6 epilogue (lean=False), bit for bit."""
    for mode in ("pow2", "exp", "fp32"):
        want = _Q.fp8_group_quant_triton(x, 128, mode, tile_elems=PTGQ_TILE_ELEMS, lean=False)  # the old epilogue
        for name, kw in _epilogues(LEAN_PTGQ, every).items():
            got = _Q.fp8_group_quant_triton(x, 128, mode, **{"tile_elems": PTGQ_TILE_ELEMS, **kw})
            _same_bits(got, want, f"{what} ptgq {mode} {name}", nan_payload_ok=(1,) if mode == "fp32" else ())
    want = _Q.fp8_group_quant_triton(kv, 64, "dequant", lean=False)
    for name, kw in _epilogues(LEAN_KVQ, every).items():
        _same_bits(_Q.fp8_group_quant_triton(kv, 64, "dequant", **kw), want, f"{what} kv dequant {name}")


def check_swiglu(gate: torch.Tensor, up: torch.Tensor, what: str, every: bool = True) -> None:
    """Every lean config of swiglu_clamp_fp8 (2^e and amax / 448 scales) against the pre-session-6 kernel (lean=False,
    ftz_exp=False)."""
    for fmt in ("ue8m0", "fp32"):
        want = _F.swiglu_clamp_fp8_triton(gate, up, 10.0, 128, fmt, lean=False, ftz_exp=False)
        for name, kw in _epilogues(LEAN_SWIGLU, every).items():
            got = _F.swiglu_clamp_fp8_triton(gate, up, 10.0, 128, fmt, **kw)
            _same_bits(got, want, f"{what} swiglu_fp8 {fmt} {name}", nan_payload_ok=(1,) if fmt == "fp32" else ())


def _swiglu_inputs(rows: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gate / up [rows, n] bf16 (3 * N(0, 1), the benchmark's scale) with a NaN and an inf in some groups."""
    g = torch.Generator().manual_seed(seed)
    gate, up = (torch.randn(2, rows, n, generator=g) * 3.0).bfloat16()
    if rows * n >= 4 * 128:
        gate.view(-1)[5] = float("nan")
        up.view(-1)[128 + 7] = float("inf")
        gate.view(-1)[256 + 3] = float("-inf")
    return gate.to(DEV), up.to(DEV)


def test_lean_configs_exist() -> None:
    """The benchmark times lean configs of all three quantiser ops, and the launchers route lean to LEAN."""
    assert LEAN_PTGQ and LEAN_KVQ and LEAN_SWIGLU


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_lean_quant_matches_default(dtype: torch.dtype) -> None:
    """Interpreter: x [3, 512] in groups of 128 (12 groups: the extremes and the saturating ones), kv [4, 512]
    [:, :448] in blocks of 64."""
    x = _quant_inputs(3, 512, 128, seed=1, dtype=dtype)
    kv = _quant_inputs(4, 512, 64, seed=2, dtype=dtype)[:, :448]
    check_quant(x, kv, f"cpu {dtype}", every=False)


def test_lean_swiglu_matches_default() -> None:
    gate, up = _swiglu_inputs(3, 256, seed=3)
    check_swiglu(gate, up, "cpu", every=False)


def test_persistent_strides_over_every_tile() -> None:
    """persistent=1 in the interpreter (4 programs) with 2-group tiles (tile_elems 256): x [3, 512] in groups of
    128 is 6 tiles (in blocks of 64: 12), so programs 0 and 1 take a second tile through the loop's next-tile load;
    SwiGLU likewise."""
    x = _inputs(3, 512, 128, seed=7, dtype=torch.bfloat16)
    for mode in ("pow2", "dequant"):
        g = 128 if mode == "pow2" else 64
        want = _Q.fp8_group_quant_triton(x, g, mode)
        for kw in ({"persistent": 1}, {"persistent": 1, "lean": True}):
            got = _Q.fp8_group_quant_triton(x, g, mode, tile_elems=256, **kw)
            _same_bits(got, want, f"persistent {mode} {kw}")
    gate, up = _swiglu_inputs(3, 512, seed=8)
    want = _F.swiglu_clamp_fp8_triton(gate, up, 10.0, 128)
    got = _F.swiglu_clamp_fp8_triton(gate, up, 10.0, 128, tile_elems=256, persistent=1, lean=True)
    _same_bits(got, want, "persistent swiglu")
    with pytest.raises(ValueError, match="exclude"):
        _Q.fp8_group_quant_triton(x, 128, persistent=2, tiles_per_program=2)
    with pytest.raises(ValueError, match="persistent"):
        _F.swiglu_clamp_fp8_triton(gate, up, persistent=-1)


def check_kv_lean(t: int, dtype: torch.dtype, seed: int) -> None:
    """kv_norm_rope_quant with lean=True against lean=False: the API's tiling (the rows rule) and one token per
    program, a new tensor and a cache written at shuffled rows (every fifth skipped), on the six row kinds of
    test_kv_rows_exact (wide dynamic range, a spike, tiny, huge with overflowing squares, bf16 extremes)."""
    run = _F.kv_norm_rope_quant_triton
    kv, w, cos, sin = kv_inputs(t, seed, dtype)
    for rule in (None, False):
        want = run(kv, w, cos, sin, 64, 1e-6, 64, row_rule=rule, lean=False)
        _same_bits((run(kv, w, cos, sin, 64, 1e-6, 64, row_rule=rule, lean=True),), (want,), f"kv t={t} {rule}")
    perm = torch.randperm(t, generator=torch.Generator().manual_seed(seed))
    rows = torch.where(perm % 5 == 3, -1, perm).to(DEV)
    cache0 = torch.randn(t, 512, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(DEV)
    want = run(kv, w, cos, sin, 64, 1e-6, 64, out=cache0.clone(), rows=rows, lean=False)
    got = run(kv, w, cos, sin, 64, 1e-6, 64, out=cache0.clone(), rows=rows, lean=True)
    _same_bits((got,), (want,), f"kv t={t} cache")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_kv_lean_matches_default(dtype: torch.dtype) -> None:
    check_kv_lean(6, dtype, seed=9)


class _Recorder:
    """Stands in for a @triton.jit kernel: records the launch's keyword arguments (no computation)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __getitem__(self, grid: tuple):  # noqa: ANN204
        return lambda *args, **kw: self.calls.append(kw)


def test_lean_default_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """triton_quant.LEAN_DEFAULT is what lean=None takes in both launchers (the default switch is that constant);
    an explicit lean wins."""
    rec, rec_f = _Recorder(), _Recorder()
    monkeypatch.setattr(_Q, "_fp8_group_tiles_kernel", rec)
    monkeypatch.setattr(_F, "_swiglu_fp8_tiles_kernel", rec_f)
    x = torch.randn(2, 256, device=DEV)
    for flag in (False, True):
        monkeypatch.setattr(_Q, "LEAN_DEFAULT", flag)
        _Q.fp8_group_quant_triton(x, 128, "pow2")
        _Q.fp8_group_quant_triton(x, 128, "pow2", lean=not flag)
        _F.swiglu_clamp_fp8_triton(x, x, 10.0, 128)
    assert [c["LEAN"] for c in rec.calls] == [False, True, True, False]
    assert [c["LEAN"] for c in rec_f.calls] == [False, True]


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_lean_extremes() -> None:
    """The extreme and saturating groups on the GPU (the hardware conversion's saturation and NaN byte), bf16 and
    fp32, and the lean bytes against the reference too."""
    for dtype in (torch.bfloat16, torch.float32):
        x = _quant_inputs(16, 1024, 128, seed=4, dtype=dtype)
        kv = _quant_inputs(16, 512, 64, seed=5, dtype=dtype)[:, :448]
        check_quant(x, kv, f"gpu {dtype}")
        for name, kw in LEAN_PTGQ.items():
            q, s = _Q.fp8_group_quant_triton(x, 128, "pow2", **{"tile_elems": PTGQ_TILE_ELEMS, **kw})
            q_ref, s_ref = ref_quant.per_token_group_quant_fp8(x, 128, "ue8m0")
            _same_bits((q, s), (q_ref, s_ref), f"gpu {dtype} ptgq {name} vs reference", nan_payload_ok=(0,))
    gate, up = _swiglu_inputs(64, 2048, seed=6)
    check_swiglu(gate, up, "gpu")
    # no clamp (limit None) and gates up to +-200: exp(-g) overflows / is subnormal, where lean_ex2's ftz exp differs
    big = (gate.float() * 40.0).bfloat16()
    for name, kw in LEAN_SWIGLU.items():
        want = _F.swiglu_clamp_fp8_triton(big, up, None, 128, lean=False, ftz_exp=False)
        _same_bits(_F.swiglu_clamp_fp8_triton(big, up, None, 128, **kw), want, f"gpu swiglu_fp8 no limit {name}")


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 64, 4096, 16384])
def test_gpu_lean_v4_shapes(t: int) -> None:
    """The benchmark's V4-Flash shapes (x [t, 4096], kv [t, 512][:, :448], SwiGLU halves of h [6t, 4096]), drawn on
    the GPU: every lean config against the default, bit for bit."""

    def dev_randn(*shape: int, seed: int) -> torch.Tensor:  # drawn on the GPU (a CPU draw of h takes seconds)
        return (torch.randn(*shape, generator=torch.Generator(DEV).manual_seed(seed), device=DEV) * 3.0).bfloat16()

    x, kv, h = dev_randn(t, 4096, seed=31), dev_randn(t, 512, seed=32)[:, :448], dev_randn(6 * t, 4096, seed=33)
    check_quant(x, kv, f"t={t}")
    check_swiglu(h[:, :2048], h[:, 2048:], f"t={t}")
    del x, kv, h
    for dtype in (torch.bfloat16, torch.float32):  # kv_norm_rope_quant's lean config (its own row kinds)
        check_kv_lean(t, dtype, seed=t)
