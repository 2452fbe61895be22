"""Session 9, the serial kernel's fp8v FP8 tile path (`fp8_path="vec"`, kv_mode 2 of `csrc/cuda/fm_sparse_decode.cu`):
each thread loads its 7 e4m3 units + 2 RoPE chunks of a tile straight from global memory into registers, converts them
with ws3p kOptVec's dequant8v (`csrc/cuda/fm_fp8v.cuh`) and stores bf16 into the swizzled tile (no raw staging, no
shared -> shared pass). The math after the tile is the same code, and dequant8v is bit-identical to dequant_tile's
fp32 multiply (tests/test_mla_fp8v.py: CPU emulation over every code and scale byte), so on the GPU the new path
must be BIT-EQUAL to fp8_path="stage" (today's) in out, lse and the split partials, on V4 shapes: 1..16 tokens
(b 1 / 2 / 4 x s_q 1 / 2 / 4 flattened), holes of every kind, ragged counts, a token without any valid index, all-hole
tiles between valid ones (the skipped-tile path, which reloads the next tile's registers), 0xFF bytes (NaN data and
scale) in every unnamed slot, sinks large / small / none, 1 split (10 or 130 tiles per CTA: the next tile's loads
in flight behind the current one's math) and several, the extra-cache form. CPU: routing, argument errors, the
build (nvcc, when on PATH).
"""

from __future__ import annotations

import inspect
import pathlib
import shutil
import sys
import zlib

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

pytest.importorskip("triton")

import mla_checks as mc  # noqa: E402
from test_mla_cuda import _CU, SCALE, gpu, needs_c, probed  # noqa: E402, F401
from test_mla_small import _bit_equal, _hca_inputs  # noqa: E402
from test_mla_split import _call, _check  # noqa: E402
from test_mla_triton import _v4_inputs  # noqa: E402

_SRC = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda"

# ------------------------------------------------------------------------------------------------------ CPU


def test_fp8_paths_registered_default_vec() -> None:
    """Both paths are selectable by name; the default is "vec" since the session-9 H200 run (bit-equal, 1.05-1.08x)."""
    assert _CU.FP8_PATHS == ("stage", "vec")
    assert _CU.DEFAULT_OPTIONS["fp8_path"] == "vec"
    assert _CU._FP8_PATH_ABI["vec"] == 4


def test_kv_mode_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    """kv_mode: BF16 0 whatever the path; FP8 "stage" 1, "vec" 2; None = the default ("vec")."""
    monkeypatch.setattr(_CU, "_abi", lambda: 4)
    assert _CU.kv_mode(False, None) == 0 and _CU.kv_mode(False, "vec") == 0
    assert _CU.kv_mode(True, None) == 2 and _CU.kv_mode(True, "stage") == 1 and _CU.kv_mode(True, "vec") == 2
    monkeypatch.setitem(_CU.DEFAULT_OPTIONS, "fp8_path", "stage")
    assert _CU.kv_mode(True, None) == 1


def test_kv_mode_stale_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A _C older than ABI 4: "vec" named explicitly is a clean error naming the ABI; a "vec" default falls back to
    "stage" (a stale build keeps working)."""
    monkeypatch.setattr(_CU, "_abi", lambda: 3)
    with pytest.raises(ValueError, match="SPARSE_DECODE_ABI >= 4, got 3"):
        _CU.kv_mode(True, "vec")
    monkeypatch.setitem(_CU.DEFAULT_OPTIONS, "fp8_path", "vec")
    assert _CU.kv_mode(True, None) == 1


def test_unknown_fp8_path_is_a_clean_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad path name fails before any launch, naming the expected values (supports() stubbed: no GPU here), for
    either cache format."""
    monkeypatch.setattr(_CU, "supports", lambda q, kv, ex: None)
    q = torch.randn(1, 64, 512).bfloat16()
    idx = torch.zeros(1, 64, dtype=torch.int32)
    for kv in (torch.randn(64, 512).bfloat16(), torch.zeros(64, 584, dtype=torch.uint8)):
        with pytest.raises(ValueError, match="fp8_path: expected one of .*vec"):
            _CU.sparse_attn_cuda(q, kv, idx, None, SCALE, fp8_path="vector")


def test_split_attn_forwards_fp8_path() -> None:
    """sparse_attn_split_triton takes cuda_fp8_path (default None) and forwards it to the serial kernel."""
    from deepinfer.flash_mla.backends.cuda import triton_split_attn as tsa

    sig = inspect.signature(tsa.sparse_attn_split_triton)
    assert sig.parameters["cuda_fp8_path"].default is None
    assert "fp8_path=cuda_fp8_path" in inspect.getsource(tsa.sparse_attn_split_triton)


def test_fp8v_helpers_shared_not_copied() -> None:
    """dequant8v and its helpers live in fm_fp8v.cuh, included by both kernels' sources (one definition)."""
    head = (_SRC / "fm_fp8v.cuh").read_text()
    for name in ("bf16x2_scale", "ldg_unit_if", "sts128", "e4m3x4_to_f16x2x2", "dequant8v"):
        assert f" {name}(" in head, name
    for src in ("fm_ws3_decode.cu", "fm_sparse_decode.cu"):
        text = (_SRC / src).read_text()
        assert '#include "fm_fp8v.cuh"' in text, src
        assert "uint4 dequant8v(" not in text and "uint32_t bf16x2_scale(" not in text, src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_fp8v_instance_compiles_without_spills(tmp_path: pathlib.Path) -> None:
    """The fp8v instance (sparse_decode_kernel<true, true>) assembles for sm_90a: no stack frame, no spills, <= 255
    registers (the next tile's 7 units + 2 RoPE chunks stay in registers across the tile's math)."""
    out, props, regs = mc.nvcc_sm90a(_SRC / "fm_sparse_decode.cu", tmp_path / "fm.o")
    assert "sparse_decode_kernelILb1ELb1EE" in out, out[-2000:]
    assert all(p == ("0", "0", "0") for p in props), props
    assert all(r <= 255 for r in regs), regs


def test_bench_fm_b2_smoke_and_table(tmp_path: pathlib.Path) -> None:
    """bench_fm_b2.py: --smoke builds the 11 rows (stage / vec pairs, BF16 floors) and --table prints a result file
    with an error row and the same-run ratios (in process: a child interpreter would double the cost)."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("bench_fm_b2", _SRC.parents[1] / "benchmarks" / "bench_fm_b2.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.smoke()
    recs = [
        {"impl": "cuda_pdl_wide_fp8", "median_us": 15.5},
        {"impl": "cuda_pdl_wide_vec_fp8", "median_us": 15.0},
        {"impl": "cuda_pdl_wide_bf16", "median_us": 13.75},
        {"impl": "api_vec_fp8", "error": "RuntimeError: x"},
    ]
    bench._ratios(recs)
    assert recs[1]["x_vs_stage"] == pytest.approx(15.5 / 15.0) and recs[1]["x_vs_bf16"] == pytest.approx(13.75 / 15.0)
    assert "x_vs_stage" not in recs[0] and recs[0]["x_vs_bf16"] == pytest.approx(13.75 / 15.5)
    for r in recs[:3]:
        r.update(round_medians_us=[r["median_us"]], tflops=1.0)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"records": recs}))
    text = bench.table(str(path))
    assert "| cuda_pdl_wide_vec_fp8 | 15.00 |" in text and "error: RuntimeError" in text, text


# ------------------------------------------------------------------------------------------------------ GPU


def _run(q, caches, lists, sink, splits, merge, path, fp8=(True,)):
    """The serial kernel on FP8 caches (0xFF in unnamed slots) with the named FP8 path, NaN-poisoned outputs."""
    return _call(q, caches, lists, sink, SCALE, fp8, kernel="cuda", num_splits=splits, cuda_merge=merge,
                 cuda_fp8_path=path)  # fmt: skip


def _partials(monkeypatch: pytest.MonkeyPatch, *args) -> tuple[torch.Tensor, torch.Tensor]:
    """The split partials (part_o, part_lse) of one merge="triton" call, captured at the Triton combine."""
    seen = []
    orig = _CU.combine_splits

    def spy(part_o, part_lse, *rest, **kw):
        seen.append((part_o.clone(), part_lse.clone()))
        return orig(part_o, part_lse, *rest, **kw)

    monkeypatch.setattr(_CU, "combine_splits", spy)
    _run(*args)
    monkeypatch.setattr(_CU, "combine_splits", orig)
    assert len(seen) == 1, "expected one Triton combine (num_splits > 1)"
    return seen[0]


def _same_both_paths(monkeypatch, q, caches, lists, sink, splits, fp8=(True,)) -> tuple[torch.Tensor, torch.Tensor]:
    """vec vs stage bit for bit: out / lse under the default merge, and (splits > 1) the partials."""
    base = _run(q, caches, lists, sink, splits, None, "stage", fp8)
    got = _run(q, caches, lists, sink, splits, None, "vec", fp8)
    _bit_equal(got, base, f"splits={splits}")
    if splits != 1:
        po0, pl0 = _partials(monkeypatch, q, caches, lists, sink, splits, "triton", "stage", fp8)
        po1, pl1 = _partials(monkeypatch, q, caches, lists, sink, splits, "triton", "vec", fp8)
        _bit_equal((po1, pl1), (po0, pl0), f"partials splits={splits}")
    return got


def _hole_tiles(lists: list[torch.Tensor], tokens: int) -> list[torch.Tensor]:
    """Token 0 (and 2, when present) with whole 64-entry tiles of holes between valid ones (tiles 1-2 and 5)."""
    idx = lists[0].clone()
    for t in (0, 2)[: 1 if tokens < 3 else 2]:
        idx[t, 64:192] = -1
        idx[t, 320:384] = 2**31 - 1
    return [idx, *lists[1:]]


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("t", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("sink_mode", ["large", "small", "none"])
def test_fp8v_bit_equal_v4_gpu(monkeypatch: pytest.MonkeyPatch, t: int, sink_mode: str) -> None:
    """640 indices in one list (b x s_q = t tokens; token 1 empty, ragged, holes, all-hole tiles in tokens 0 / 2):
    auto plan (10 one-tile splits: b = 2's case), 1 split (10 tiles per CTA), 3 splits (4 + 4 + 2)."""
    q, caches, lists, sink = _v4_inputs(False, sink_mode, zlib.crc32(f"fp8v{t}{sink_mode}".encode()))
    q, lists = q[:t], _hole_tiles([lists[0][:t]], t)
    for splits in (None, 1, 3):
        got = _same_both_paths(monkeypatch, q, caches, lists, sink, splits)
        if t > 1:
            mc.assert_empty_token(got, sink)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("sink_mode", ["random", "large", "none"])
def test_fp8v_extra_cache_gpu(monkeypatch: pytest.MonkeyPatch, sink_mode: str) -> None:
    """The engine's form: 512 main + 128 extra indices (two FP8 caches; a tile holds rows of both), 4 tokens."""
    q, caches, lists, sink = _v4_inputs(True, sink_mode, zlib.crc32(f"fp8vx{sink_mode}".encode()))
    q, lists = q[:4], _hole_tiles([x[:4] for x in lists], 4)
    for splits in (None, 1, 3):
        _same_both_paths(monkeypatch, q, caches, lists, sink, splits, fp8=(True, True))


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
@pytest.mark.parametrize("splits", [1, 9, 130])
def test_fp8v_long_list_gpu(monkeypatch: pytest.MonkeyPatch, splits: int) -> None:
    """130 tiles per token (HCA-like): 130 / 15 / 1 tiles per CTA (the register prefetch of the next tile, many
    times); bit-equal, and the vec path within tolerance of the reference."""
    q, caches, lists, sink = _hca_inputs(zlib.crc32(f"fp8vhca{splits}".encode()), 130, "small")
    got = _same_both_paths(monkeypatch, q, caches, lists, sink, splits)
    _check(got, q, caches, lists, sink, SCALE, (True,), gpu_p=True)


@gpu
@needs_c
@pytest.mark.gpu
@pytest.mark.usefixtures("probed")
def test_fp8v_reference_and_public_call_gpu() -> None:
    """b = 2 x s_q = 2 through sparse_attn_split_triton with the vec path: within tolerance of the reference, and the
    default call (whatever DEFAULT_OPTIONS picks) bit-equal to it."""
    q, caches, lists, sink = _v4_inputs(False, "random", zlib.crc32(b"fp8vref"))
    q, lists = q[:4], [lists[0][:4]]
    got = _run(q, caches, lists, sink, None, None, "vec")
    _check(got, q, caches, lists, sink, SCALE, (True,), gpu_p=True)
    _bit_equal(_run(q, caches, lists, sink, None, None, None), got, "default path")
