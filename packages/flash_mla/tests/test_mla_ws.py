"""The warp-specialised sm_90a kernels (`csrc/cuda/fm_ws_decode.cu`: ws / ws2, `csrc/cuda/fm_ws3_decode.cu`: ws3;
`backends/cuda/cuda_ws_decode.py`). Every GPU test runs every variant (`VARIANTS`).

CPU: the source compiles for sm_90a without spills and without serialised wgmma (when nvcc is on PATH), the split plan,
clean errors without `_C` / a GPU, the probe's own check logic with stand-in kernels.
GPU: against `flash_mla.reference` (and the float64 oracle where the cache is small) on V4-Flash shapes and odd ones:
random index lists with holes of every kind and ragged valid counts, s_q 1..4, BF16 and FP8 caches (FP8 against the
dequantised reference), NaN in unused cache slots, NaN-poisoned outputs, large / small / no sinks, b = 1..256,
topk not a multiple of 32 or 64, forced split counts, CUDA-graph replay. Tolerances: the oracle's fp32 bound plus the
bf16 rounding of P before P @ V (as in test_mla_cuda.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import re
import shutil
import types
import zlib

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the @triton.jit decorators run
pytest.importorskip("triton")

import mla_checks as mc  # noqa: E402
from mla_checks import dense_oracle, poison_unused, ragged_indices  # noqa: E402
from test_mla_split import _check, _fp8  # noqa: E402
from test_mla_triton import _assert_close_to, _holes, _sink, _v4_inputs, _weight_abs  # noqa: E402

from deepinfer.flash_mla import reference  # noqa: E402

_WS = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_ws_decode")
_K = importlib.import_module("deepinfer.flash_mla.backends.cuda.triton_split_attn")
_SRC = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda"
SCALE = 512**-0.5
U32 = 2.0**-24
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
needs_ws = pytest.mark.skipif(not _WS.available(), reason="_C without sparse_decode_ws (test_ws_extension_built_gpu)")
VARIANTS = list(_WS.VARIANTS)  # every kernel variant runs every GPU test against the reference


def _probed(variant: str) -> None:
    """Skip an in-process kernel test when the variant's out-of-process probe failed (test_ws_probe_gpu reports it):
    a kernel that faults or hangs would otherwise take every later GPU test of this process with it."""
    ok, out = _WS.probe(variant=variant)
    if not ok:
        pytest.skip(f"warp-specialised kernel {variant} probe failed (see test_ws_probe_gpu): {out[-300:]}")


# ------------------------------------------------------------------------------------------------------ CPU


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_ws_source_compiles_for_sm90a_without_spills(tmp_path: pathlib.Path) -> None:
    """All 28 instances (BF16 / FP8 cache x ws / ws2 x 7 modes: the kernel + 6 timing ablations) assemble for sm_90a:
    no stack, no spills (setmaxnreg regions included), and ptxas does not serialise the wgmma pipeline (which would
    undo the overlap the kernel is built for)."""
    out, props, regs = mc.nvcc_sm90a(_SRC / "fm_ws_decode.cu", tmp_path / "ws.o")
    assert len(props) == 28 and len(regs) == 28, out[-2000:]
    assert all(p == ("0", "0", "0") for p in props), props
    assert all(r <= 168 for r in regs), regs  # 384 threads x 168 = the setmaxnreg budget (72 + 2 x 216 per lane)
    assert "serialized" not in out, "ptxas serialised the wgmma instructions"
    assert "C7508" not in out, "ptxas ignored setmaxnreg"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_ws3_source_compiles_for_sm90a_without_spills(tmp_path: pathlib.Path) -> None:
    """ws3's 26 instances (BF16 / FP8 cache x the kernel + 2 timing ablations, + the kernel with the extra cache,
    EXTRA, + the persistent ws3p kernel, + ws3p's session-6 option builds: BF16 opt 2 / 4 / 6 / 8 / 10, FP8 1 / 2 / 4 /
    7 / 8 / 10,
    the FP8 opt 1 / 7 builds with a 120 / 192 register split, + session 10's adaptive overlap builds BF16 106, FP8
    120 with 88 / 240 / 176 registers per warpgroup, + session 11's FP8 632 (12 producer rows in flight, 104 / 232 /
    168: spills a few bytes, checked below), + session 14's threshold builds BF16 1130, FP8 1658 (632's split, spills a
    few bytes too)) assemble for sm_90a: no stack, no spills (the
    producer's 88-register setmaxnreg region holds an FP8 batch of 48 registers across the stage wait), exactly 168
    registers at 384 threads, and ptxas neither serialises the wgmma pipeline nor ignores setmaxnreg."""
    out, props, regs = mc.nvcc_sm90a(_SRC / "fm_ws3_decode.cu", tmp_path / "ws3.o")
    assert len(props) == 26 and len(regs) == 26, out[-2000:]
    assert out.count("ELb1EEEv") == 4, "expected the 2 EXTRA instances (each named twice in the ptxas log)"
    assert out.count("ws3p_decode_kernel") == 36, "expected the 18 ws3p instances (each named twice in the ptxas log)"
    for name in ("ILb0ELi106E", "ILb1ELi120E", "ILb0ELi1130E", "ILb1ELi1658E"):  # the overlap / threshold builds
        assert out.count(name) == 2, name
    for name in ("ILb0ELi42E", "ILb0ELi234E", "ILb1ELi56E", "ILb1ELi248E"):  # session 10's removed overlap builds
        assert name not in out, name
    # every instance spill-free but the kOptVecWide builds (session 11's 632 and session 14's 1658 = 632 + lazy +
    # threshold: 12 FP8 rows in flight in the producer at 104 registers, a few per-item values spilled; 632 measured
    # 1.028-1.058x its twin anyway)
    spills = dict(re.findall(r"Function properties for (\S+)\n\s+\d+ bytes stack frame, (\d+) bytes spill stores", out))
    vw = ("ILb1ELi632E", "ILb1ELi1658E")
    assert len(spills) == 26 and all(v == "0" for k, v in spills.items() if not any(n in k for n in vw)), spills
    for n in vw:
        assert int(spills[next(k for k in spills if n in k)]) <= 64, spills
    # exactly 168: the .cu's static_assert (128 x 88 + 256 x 208 = 384 x 168) assumes the launch allocates 168, and
    # setmaxnreg.inc would wait forever for registers that .dec never freed if ptxas allocated fewer
    assert regs == [168] * 26, regs
    assert "serialized" not in out, "ptxas serialised the wgmma instructions"
    assert "C7508" not in out, "ptxas ignored setmaxnreg"


def test_ws_split_plan() -> None:
    """Auto: the serial kernel's 64-row plan in 32-row tiles (same splits); forced counts clamp to the 32-row tiles;
    no split is ever empty; topk = 0 is one split of nothing."""
    assert _WS.split_plan(1, 64, 640, 132, None) == (5, 4)  # plan_num_splits: 5 splits of 2 x 64 rows
    assert _WS.split_plan(256, 64, 640, 132, None) == (1, 20)
    assert _WS.split_plan(1, 64, 0, 132, None) == (1, 0)
    assert _WS.split_plan(1, 64, 640, 132, 7) == (7, 3)
    assert _WS.split_plan(1, 64, 33, 132, 50) == (2, 1)
    for topk in (1, 31, 32, 33, 63, 64, 65, 600, 640, 8320):
        for t in (1, 2, 4, 64, 300):
            for forced in (None, 1, 3, 1000):
                splits, per = _WS.split_plan(t, 64, topk, 132, forced)
                tiles = -(-topk // 32)
                assert per >= 1 and (splits - 1) * per < tiles <= splits * per, (topk, t, forced, splits, per)
                if forced is None:
                    assert splits == _K.plan_num_splits(t, 1, -(-topk // 64), 132), (topk, t)


def test_ws3_split_plan() -> None:
    """ws3 plans in its own 64-row tiles: the serial kernel's plan exactly (same splits, same tiles per split); forced
    counts clamp to the 64-row tiles; no split is empty; a tile size that does not divide 64 is refused."""
    rows = _WS.block_rows("ws3")
    assert rows == 64 and _WS.block_rows("ws2") == 32 and _WS.block_rows("ws") == 32
    assert _WS.split_plan(1, 64, 640, 132, None, rows) == (5, 2)
    assert _WS.split_plan(256, 64, 640, 132, None, rows) == (1, 10)
    assert _WS.split_plan(1, 64, 640, 132, 20, rows) == (10, 1)
    assert _WS.split_plan(1, 64, 0, 132, None, rows) == (1, 0)
    for topk in (1, 63, 64, 65, 600, 640, 8320):
        for t in (1, 4, 64, 300):
            for forced in (None, 1, 3, 1000):
                splits, per = _WS.split_plan(t, 64, topk, 132, forced, rows)
                tiles = -(-topk // 64)
                assert per >= 1 and (splits - 1) * per < tiles <= splits * per, (topk, t, forced, splits, per)
                if forced is None:
                    assert splits == _K.plan_num_splits(t, 1, tiles, 132) and per == -(-tiles // splits), (topk, t)
    with pytest.raises(ValueError, match="rows"):
        _WS.split_plan(1, 64, 640, 132, None, 48)


def test_ws3_bench_split_rows_and_wave_cases() -> None:
    """The benchmark's session-5 round-2 rows: ws3 forced splits 2 / 3 at decode b = 64 / 128 x s_q = 2 and
    b = 32 x s_q = 4 (where the default plan runs 1 split: 2 x 5 tiles and 4 + 4 + 2), named `cuda_ws3[_fp8]_s<n>`
    in 64-row tiles; the `decode_wave` cases (132 / 264 tokens = 1 / 2 full waves on 132 SMs) run only their rows."""
    bench = _bench_module()
    for b, s_q in ((64, 2), (128, 2), (32, 4)):
        assert bench._ws3_splits("decode", b, s_q) == (2, 3)
        assert _WS.split_plan(b * s_q, 64, 640, 132, None, 64) == (1, 10)
    assert bench._ws3_splits("decode", 256, 2) == () and bench._ws3_splits("decode_wave", 128, 2) == ()
    assert _WS.split_plan(256, 64, 640, 132, 2, 64) == (2, 5) and _WS.split_plan(256, 64, 640, 132, 3, 64) == (3, 4)
    bench._PROBE["ws3"] = None  # names only: no probe child process even where a GPU is present
    fns = bench._ws_impls(torch.zeros(1, 584, dtype=torch.uint8), (), (), ("ws3",), (2, 3))
    assert sorted(fns) == sorted(f"cuda_ws3{s}{f}" for s in ("", "_s2", "_s3") for f in ("", "_fp8")), sorted(fns)
    dec, _ = bench._cases(False)
    waves = [(b * s_q) / 132 for op, b, s_q, *_ in dec if op == "decode_wave"]
    assert waves == [1.0, 2.0], waves
    assert set(bench._WAVE_ROWS) <= {"cuda", "cuda_fp8", "cuda_ws3", "cuda_ws3_fp8", "cuda_ws3p", "cuda_ws3p_fp8",
                                     "reference"}  # fmt: skip


def _bench_module() -> types.ModuleType:
    """benchmarks/bench_flash_mla.py as a module (it is a script, not part of the package)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_flash_mla.py"
    spec = importlib.util.spec_from_file_location("bench_flash_mla_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ws_clean_errors_without_kernel() -> None:
    """Without _C (or a GPU) `supports` names the reason and `sparse_attn_ws` raises ValueError with it."""
    q = torch.randn(2, 64, 512).bfloat16()
    kv = torch.randn(100, 512).bfloat16()
    why = _WS.supports(q, kv)
    assert why is not None and ("_C" in why or "CUDA" in why), why
    with pytest.raises(ValueError, match="sparse_attn_ws"):
        _WS.sparse_attn_ws(q, kv, torch.zeros(2, 8, dtype=torch.int32), None, SCALE)
    if _WS.available():  # a CUDA build on a GPU-less machine still checks shapes
        assert "CUDA" in _WS.supports(q, kv)


def test_ws_variant_and_ablation_names_checked() -> None:
    """An unknown variant or ablation is a ValueError naming the choices (before any device check); the benchmark's
    rows and the binding's codes come from these two tables."""
    q = torch.randn(2, 64, 512).bfloat16()
    kv = torch.randn(100, 512).bfloat16()
    idx = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="'ws4'"):
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws4")
    with pytest.raises(ValueError, match="'qk'"):
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, ablation="qk")
    with pytest.raises(ValueError, match="'no_xchg'"):  # ws3 has the producer / consumer ablations only
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3", ablation="no_xchg")
    assert _WS.VARIANTS == {
        "ws": 1,
        "ws2": 2,
        "ws3": 3,
        "ws3p": 4,
        "ws3pw": 5,
        "ws3pl": 6,
        "ws3pe": 7,
        "ws3px": 8,
        "ws3p1": 9,
        "ws3p1l": 10,
    }
    assert _WS.ablations_of("ws3p") == ("full",) and _WS.block_rows("ws3p") == 64
    with pytest.raises(ValueError, match="'producer'"):  # ws3p: the kernel only
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3p", ablation="producer")
    with pytest.raises(ValueError, match="max_ctas"):  # the grid cap is ws3p's
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3", max_ctas=4)
    with pytest.raises(ValueError, match="max_ctas"):
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3p", max_ctas=0)
    assert sorted(_WS.ABLATIONS.values()) == list(range(7)) and _WS.ABLATIONS["full"] == 0
    assert _WS.ablations_of("ws3") == ("full", "producer", "consumer")
    assert _WS.ablations_of("ws2") == tuple(_WS.ABLATIONS)
    assert [_WS.ABLATIONS[a] for a in _WS.ablations_of("ws3")] == [0, 1, 2]  # fm_ws3_decode.cu Mode


class _FakeC:
    """Stand-in for `_C` (CPU): records the sparse_decode_ws arguments; `old` drops ws3 (a _C built before ws3)."""

    def __init__(self, old: bool = False) -> None:
        self.calls: list[tuple] = []
        if not old:
            self.ws3_block_rows = lambda: 64

    def ws_block_rows(self) -> int:
        return 32

    def sparse_decode_ws(self, *args) -> None:  # noqa: ANN002
        self.calls.append(args)


def test_ws3_wrapper_passes_variant_3_and_64_row_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `sparse_attn_ws` hands the binding for ws3 (a stand-in `_C` on the CPU): variant code 3, the ablation's
    mode, the split plan in 64-row tiles (640 indices, 1 token: 5 splits of 2 tiles; 256 tokens: 1 split of 10); ws2
    still gets 32-row tiles. A `_C` without ws3 is a RuntimeError that says to rebuild, before any launch."""
    fake = _FakeC()
    monkeypatch.setattr(_WS, "_module", lambda: fake)
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None)
    monkeypatch.setattr(_WS, "combine_splits", lambda *a, **k: None)
    monkeypatch.setattr(_WS.torch.cuda, "current_stream", lambda dev=None: type("S", (), {"cuda_stream": 7})())
    kv = torch.randn(2048, 512).bfloat16()
    for t, variant, ablation, want in [
        (1, "ws3", "full", (5, 2)),
        (256, "ws3", "consumer", (1, 10)),
        (2, "ws3", "producer", (5, 2)),
        (1, "ws2", "full", (5, 4)),
    ]:
        q = torch.randn(t, 64, 512).bfloat16()
        idx = torch.randint(0, 2048, (t, 640), dtype=torch.int32)
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant=variant, ablation=ablation)
        args = fake.calls[-1]
        # (..., num_tokens, H, topk, num_splits, tiles_per_split, ..., fp8, variant, mode, stream)
        assert args[8:13] == (t, 64, 640) + want, (variant, t, args[8:13])
        assert args[-4:] == (False, _WS.VARIANTS[variant], _WS.ABLATIONS[ablation], 7), args[-4:]
    monkeypatch.setattr(_WS, "_module", lambda: _FakeC(old=True))
    n = len(fake.calls)
    with pytest.raises(RuntimeError, match="rebuild"):
        _WS.sparse_attn_ws(torch.randn(1, 64, 512).bfloat16(), kv, idx[:1], None, SCALE, variant="ws3")
    assert len(fake.calls) == n


def test_ws_self_check_logic_with_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's check passes correct results (a stand-in: the reference) and reports a wrong one (heads rolled, as
    a layout bug would) with its case and no other (one self_check run: the reference is the slow part on CPU)."""
    memo: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def stand_in(q, kv, idx, sink, scale, *, out, lse_out, num_splits=None, variant="ws"):  # noqa: ANN001, ANN202
        key = (kv.dtype, idx.shape[1])
        if key not in memo:
            memo[key] = reference.sparse_attn(q, kv, idx, sink, scale)
        out.copy_(memo[key][0])
        lse_out.copy_(memo[key][1])
        if num_splits == 7 and key == (torch.bfloat16, 600):
            out.copy_(out.roll(1, dims=1))

    monkeypatch.setattr(_WS, "sparse_attn_ws", stand_in)
    why = _WS.self_check(device="cpu", variant="ws2")
    assert why.startswith("topk=600 fp8=False splits=7: max |out - ref|") and ";" not in why, why


# ------------------------------------------------------------------------------------------------------ GPU


@gpu
@pytest.mark.gpu
def test_ws_extension_built_gpu() -> None:
    """The GPU install (DEEPINFER_DEVICE=cuda) built _C with sparse_decode_ws; its shared memory fits one CTA per SM."""
    from deepinfer.flash_mla import _backend

    assert _WS.available(), f"_C.sparse_decode_ws missing: {_backend._compiled_error()} / {_backend.build_info()}"
    mod = _WS._module()
    print("ws smem bytes", mod.ws_smem_bytes(False), mod.ws_smem_bytes(True), "block rows", mod.ws_block_rows())
    assert max(mod.ws_smem_bytes(False), mod.ws_smem_bytes(True)) <= 227 * 1024
    assert mod.ws_block_rows() == _WS.KERNEL_ROWS
    print("ws3 smem bytes", mod.ws3_smem_bytes(False), mod.ws3_smem_bytes(True), "threads", mod.ws3_threads(True))
    assert max(mod.ws3_smem_bytes(False), mod.ws3_smem_bytes(True)) <= 227 * 1024
    assert mod.ws3_block_rows() == _WS.WS3_ROWS and mod.ws3_threads(False) == mod.ws3_threads(True) == 384


@gpu
@needs_ws
@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_ws_probe_gpu(variant: str) -> None:
    """Small V4 cases in a child process (BF16 / FP8, topk 640 / 600, auto / 1 / 7 splits): no fault, no hang, close to
    the reference. Its output says what failed; the variant's other kernel tests skip when it fails."""
    ok, out = _WS.probe(variant=variant)
    print(out)
    assert ok, out


@gpu
@needs_ws
@pytest.mark.gpu
def test_ws_ablations_run_gpu() -> None:
    """Every timing-only ablation of every variant (both caches, split and unsplit plans) finishes in a child process:
    no fault, no hang (the benchmark times them). Their numbers are wrong by design and not checked."""
    ok, out = _WS.probe_ablations()
    print(out)
    assert ok, out


def _ws_call(q, cache, idx, sink, fp8: bool, variant: str, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel into NaN-poisoned buffers on the GPU (every element must be written); inputs on the CPU."""
    used = (_fp8(cache) if fp8 else cache).cuda()
    t, h, d = q.shape
    out = torch.full((t, h, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((t, h), float("nan"), device="cuda")
    sd = sink.cuda() if sink is not None else None
    o, s = _WS.sparse_attn_ws(q.cuda(), used, idx.cuda(), sd, SCALE, out=out, lse_out=lse, variant=variant, **kw)
    assert o is out and s is lse
    torch.cuda.synchronize()
    return o, s


@gpu
@needs_ws
@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("t", [1, 4, 64])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("sink_mode", ["random", "large", "small", "none"])
def test_ws_v4_shapes_gpu(t: int, fp8: bool, sink_mode: str, variant: str) -> None:
    """640 indices in one list over a paged cache with NaN in unused slots, ragged holes (token 1 has none valid),
    auto split plan (t = 1 / 4: 5 splits, t = 64: 2 splits): reference and float64 oracle."""
    _probed(variant)
    q, caches, lists, sink = _v4_inputs(False, sink_mode, zlib.crc32(f"ws{t}{fp8}{sink_mode}".encode()))
    q, lists = q[:t], [i[:t] for i in lists]
    got = _ws_call(q, caches[0], lists[0], sink, fp8, variant)
    _check(got, q, caches[:1], lists[:1], sink, SCALE, (fp8,), gpu_p=True)
    if t > 1:  # token 1: no valid index -> zeros and lse = sink (-inf without one), exactly
        mc.assert_empty_token(got, sink)


@gpu
@needs_ws
@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("splits", [1, 3, 7, 20])
@pytest.mark.parametrize("fp8", [False, True])
def test_ws_split_counts_gpu(splits: int, fp8: bool, variant: str) -> None:
    """Forced split counts over 20 tiles of 32 rows (ws3: 10 of 64, 20 clamps to 10): 1 (out / lse by the kernel), 3
    (7 + 7 + 6), 7 (uneven), 20 (one tile each: the ring never fills)."""
    _probed(variant)
    q, caches, lists, sink = _v4_inputs(False, "random", 901 + splits + 7 * fp8)
    q, lists = q[:8], [i[:8] for i in lists]
    got = _ws_call(q, caches[0], lists[0], sink, fp8, variant, num_splits=splits)
    _check(got, q, caches[:1], lists[:1], sink, SCALE, (fp8,), gpu_p=True)


@gpu
@needs_ws
@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("topk", [1, 31, 33, 100, 600, 1000])
@pytest.mark.parametrize("fp8", [False, True])
def test_ws_odd_topk_gpu(topk: int, fp8: bool, variant: str) -> None:
    """topk not a multiple of 32 / 64 (a partial last tile), ragged valid counts including 0, 1 and all, holes of every
    kind (-1, negative, one past the end, INT32_MAX), s_q = 3 tokens per request of b = 3, a small sink."""
    _probed(variant)
    g = torch.Generator().manual_seed(topk * 2 + fp8)
    t, n = 9, topk + 200
    q = (3 * torch.randn(t, 64, 512, generator=g)).bfloat16()
    counts = [topk, 0, 1, *torch.randint(0, topk + 1, (t - 3,), generator=g).tolist()]
    idx = _holes(ragged_indices(t, topk, torch.arange(n - 4), g, counts), n, g)
    cache = poison_unused(torch.randn(n, 512, generator=g).bfloat16(), [idx])
    sink = _sink("small", 64, g)
    got = _ws_call(q, cache, idx, sink, fp8, variant)
    _check(got, q, [cache], [idx], sink, SCALE, (fp8,), gpu_p=True)


def _gather_bounds(q, dense, idx, sink, ref_out) -> tuple[torch.Tensor, torch.Tensor]:
    """(out_tol [t, h, 1], lse_tol [t, h]) against the fp32 reference without a dense oracle over a large cache: twice
    the oracle's fp32 bound (from the gathered rows: logit error Ez, weights), the bf16 rounding of P (2^-9 relative per
    weight) and of both outputs (2^-9 |out| each)."""
    d = q.shape[-1]
    rows, valid = reference.gather_kv(dense.reshape(-1, d), idx)  # fp32, zero at holes
    dots = torch.einsum("thd,tkd->thk", q.double().abs(), rows.double().abs()).masked_fill(~valid[:, None, :], 0.0)
    ez = (d + 2) * U32 * SCALE * dots.amax(-1, keepdim=True)
    w = _weight_abs(q, [dense], [idx], sink, SCALE)
    k = idx.shape[1]
    out_tol = 2 * ((4 * ez + (k + 8) * U32) * w) + 2 * 2.0**-9 * w + 2 * 2.0**-9 * ref_out.double().abs().amax(-1, True)
    lse_tol = 2 * (2 * ez[..., 0] + (k + 8) * U32) + 1e-6
    return out_tol, lse_tol


@gpu
@needs_ws
@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("b,s_q", [(1, 1), (1, 4), (2, 2), (3, 3), (64, 2), (128, 2), (256, 1), (256, 2)])
@pytest.mark.parametrize("fp8", [False, True])
def test_ws_batch_sizes_gpu(b: int, s_q: int, fp8: bool, variant: str) -> None:
    """Decode batches b = 1..256 x s_q (split and unsplit plans, up to four waves of CTAs): 128 window rows + 512 random
    rows of each request's 2,048-row region of one cache (~3 % holes, NaN in every unused slot); against the reference
    and the serial CUDA kernel (when built). Built and checked on the GPU (the cache has up to 512K rows)."""
    _probed(variant)
    _check_decode_batch(b, s_q, fp8, variant, None, 1000 * b + s_q + 7 * fp8)


@gpu
@needs_ws
@pytest.mark.gpu
@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("b,s_q", [(64, 2), (128, 2), (32, 4)])
@pytest.mark.parametrize("fp8", [False, True])
def test_ws3_forced_splits_bench_shapes_gpu(b: int, s_q: int, splits: int, fp8: bool) -> None:
    """ws3 with the benchmark's forced split counts (rows `cuda_ws3[_fp8]_s2` / `_s3`, session 5 round 2) at its decode
    shapes, where the default plan runs one split: 2 splits of 5 tiles, 3 of 4 + 4 + 2 (a short last split), merged by
    the Triton combine; same inputs and bounds as test_ws_batch_sizes_gpu."""
    _probed("ws3")
    _check_decode_batch(b, s_q, fp8, "ws3", splits, 5000 * b + 10 * s_q + splits + 7 * fp8)


def _check_decode_batch(b: int, s_q: int, fp8: bool, variant: str, num_splits: int | None, seed: int) -> None:
    """One decode batch (V4 index lists, NaN in unused slots, NaN-poisoned outputs) through `sparse_attn_ws`, checked
    against the reference within `_gather_bounds` and against the serial CUDA kernel when built."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    region, t = 2048, b * s_q
    base = (torch.arange(b, device="cuda") * region).repeat_interleave(s_q)[:, None]
    comp = torch.rand(t, region - 128, generator=g, device="cuda").topk(512, dim=-1).indices + 128
    idx = torch.cat([torch.arange(128, device="cuda").expand(t, 128), comp], 1) + base
    idx = idx.gather(1, torch.rand(t, 640, generator=g, device="cuda").argsort(1)).to(torch.int32)
    idx = torch.where(torch.rand(t, 640, generator=g, device="cuda") < 0.03, torch.full_like(idx, -1), idx)
    cache = torch.randn(b * region, 512, generator=g, device="cuda").bfloat16()
    named = torch.zeros(cache.shape[0], dtype=torch.bool, device="cuda")
    named[idx[idx >= 0].long()] = True
    cache[~named] = float("nan")
    q = torch.randn(t, 64, 512, generator=g, device="cuda").bfloat16()
    sink = torch.randn(64, generator=g, device="cuda")
    used = _fp8(cache) if fp8 else cache
    out = torch.full((t, 64, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((t, 64), float("nan"), device="cuda")
    _WS.sparse_attn_ws(q, used, idx, sink, SCALE, out=out, lse_out=lse, num_splits=num_splits, variant=variant)
    ref = reference.sparse_attn(q, used, idx, sink, SCALE)
    dense = reference.unpack_fp8_kv_ref(used, torch.float32) if fp8 else cache
    out_tol, lse_tol = _gather_bounds(q, dense, idx, sink, ref[0])
    got_c, ref_c = (out.cpu(), lse.cpu()), (ref[0].cpu(), ref[1].cpu())
    _assert_close_to(got_c, ref_c, out_tol.cpu(), lse_tol.cpu())
    from deepinfer.flash_mla.backends.cuda import cuda_sparse_decode as cu

    if cu.available():  # the serial kernel: same bf16 P rounding, so within the same bound
        ser = _K.sparse_attn_split_triton(q, used, idx, sink, SCALE, kernel="cuda")
        _assert_close_to(got_c, (ser[0].cpu(), ser[1].cpu()), out_tol.cpu(), lse_tol.cpu())


@gpu
@needs_ws
@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_ws_prefill_and_strided_gpu(variant: str) -> None:
    """Prefill-sized grid (1,024 tokens, one split each) with q / out / lse as strided views of larger buffers: every
    element written, nothing outside touched, same values as the reference within the bound."""
    _probed(variant)
    q, caches, lists, sink = _v4_inputs(False, "random", 4242)
    rep = 16
    q = q.repeat(rep, 1, 1)
    idx = lists[0].repeat(rep, 1)
    qd, ob, lb = mc.strided_io(q)
    o, lse = _WS.sparse_attn_ws(
        qd[..., :512],
        caches[0].cuda(),
        idx.cuda(),
        sink.cuda(),
        SCALE,
        out=ob[..., :512],
        lse_out=lb[..., 0],
        variant=variant,
    )
    torch.cuda.synchronize()
    assert o.data_ptr() == ob.data_ptr()
    mc.assert_pad_untouched(ob, lb)
    want = dense_oracle(q[:64], caches[:1], [idx[:64]], sink, SCALE, torch.bfloat16)
    bf16_p = 2 * 2.0**-9 * _weight_abs(q[:64], caches[:1], [idx[:64]], sink, SCALE)
    for r in range(rep):  # every repeat of the 64 tokens gives the same answer
        sl = slice(64 * r, 64 * (r + 1))
        _assert_close_to((o[sl].cpu(), lse[sl].cpu()), (want[0], want[1]), want[2] + bf16_p, want[3])


@gpu
@needs_ws
@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fp8", [False, True])
def test_ws_graph_replay_gpu(fp8: bool, variant: str) -> None:
    """Captured once (b = 2, s_q = 2: split path + combine), replayed on new q / indices in the same buffers."""
    _probed(variant)

    def launch(q, kv, idx, sink, out, lse) -> None:  # noqa: ANN001
        _WS.sparse_attn_ws(q, kv, idx, sink, SCALE, out=out, lse_out=lse, variant=variant)

    mc.check_graph_replay(launch, fp8, 707 + fp8, [708], SCALE)
