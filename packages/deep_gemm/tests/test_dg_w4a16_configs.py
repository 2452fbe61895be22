"""W4A16 grouped GEMM tile configurations: the metadata-only heuristic, the `expected_m` / `config` knobs, and
every configuration the benchmark sweeps, in Triton's CPU interpreter and (marked `gpu`) on the GPU.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from dg_testing import assert_gemm_close, gen  # noqa: E402
from test_dg_w4a16 import _exact64, _operands, _rel_fro  # noqa: E402

from deepinfer.deep_gemm import reference_w4a16 as ref  # noqa: E402
from deepinfer.deep_gemm.api_w4a16 import m_grouped_bf16_fp4_gemm_nt_contiguous as gemm  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import w4a16_configs as cfgs  # noqa: E402

ENV = "DEEPINFER_DEEP_GEMM_BACKEND"
NAN = float("nan")
ALL_SWEPT = [c for regime in cfgs.SWEEP.values() for c in regime]
interp_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


@pytest.mark.parametrize(
    ("m", "g", "hint", "want"),
    [
        (192, 256, None, cfgs.DECODE),  # decode batch 32, top-6: < 1 row per expert on average
        (1536, 256, None, cfgs.DECODE),  # decode batch 256: 6 rows per expert
        (49152, 256, None, cfgs.PREFILL_256),  # prefill 32 x 256 tokens: 192 rows per expert
        (128 * 256, 256, None, cfgs.PREFILL),  # 128 rows per expert: 128-row tiles
        (159, 1, None, cfgs.PREFILL),
        (160, 1, None, cfgs.PREFILL_256),
        (8192, 256, None, cfgs.MID),  # 32 rows per expert
        (49152, 256, 4, cfgs.DECODE),  # the caller's hint wins over ceil(m / g)
        (16, 1, 200, cfgs.PREFILL_256),
        (16, 1, 100, cfgs.PREFILL),
        (0, 0, None, cfgs.DECODE),
    ],
)
def test_default_config(m: int, g: int, hint: int | None, want: cfgs.W4A16Config) -> None:
    assert cfgs.default_config(m, g, hint) == want


def test_sweep_holds_defaults_and_names_round_trip() -> None:
    assert cfgs.DECODE in cfgs.SWEEP["decode"] and cfgs.PREFILL in cfgs.SWEEP["prefill"]
    assert cfgs.PREFILL_256 in cfgs.SWEEP["prefill"] and cfgs.MID in cfgs.SWEEP["prefill"]
    assert cfgs.MID in cfgs.SWEEP["prefill"]
    for c in ALL_SWEPT:
        assert cfgs.parse_config(c.name) == c
    assert len({c.name for c in ALL_SWEPT}) == len(ALL_SWEPT)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"block_m": 8, "block_n": 64}, "block_m"),
        ({"block_m": 16, "block_n": 48}, "block_n"),
        ({"block_m": 16, "block_n": 64, "block_k": 16}, "block_k"),
        ({"block_m": 16, "block_n": 64, "num_warps": 3}, "num_warps"),
        ({"block_m": 16, "block_n": 64, "num_stages": 0}, "num_stages"),
        ({"block_m": 16, "block_n": 64, "kernel": 4}, "kernel"),
        ({"block_m": 16, "block_n": 64, "fold": True}, "kernel 3 only"),
        ({"block_m": 16, "block_n": 64, "block_k": 256, "kernel": 2}, "block_k"),
    ],
)
def test_bad_config(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cfgs.W4A16Config(**kwargs)


def test_parse_config_rejects_junk() -> None:
    with pytest.raises(ValueError, match="m16n64k128w2s3"):
        cfgs.parse_config("16x64")


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        ({"expected_m": -1}, ValueError, "expected_m"),
        ({"expected_m": 2.5}, ValueError, "expected_m"),
        ({"config": (16, 64)}, TypeError, "config"),
        ({"config": cfgs.W4A16Config(16, 64, 256)}, ValueError, "block_k"),  # K = 128 here
    ],
)
def test_api_rejects_bad_knobs(kw: dict, exc: type[Exception], match: str) -> None:
    a, packed, scales, offs = _operands([2, 3], 32, 128, gen(2))
    with pytest.raises(exc, match=match):
        gemm(a, (packed, scales), offs, **kw)


def test_reference_ignores_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the reference path the hint and config change nothing."""
    monkeypatch.delenv(ENV, raising=False)
    a, packed, scales, offs = _operands([2, 0, 3], 32, 128, gen(5))
    want = gemm(a, (packed, scales), offs)
    got = gemm(a, (packed, scales), offs, expected_m=500, config=cfgs.PREFILL)
    assert torch.equal(got[:5], want[:5])  # rows past offs[-1] are uninitialised in both


def _interp_case(cfg: cfgs.W4A16Config) -> tuple[list[int], int, int]:
    """Counts spanning several row tiles of cfg (a partial last tile, an empty group), n with a column tail."""
    bm = cfg.block_m
    return [bm + 3, 0, 2, bm // 2 + 1], 2 * cfg.block_n - 16, max(256, cfg.block_k * cfg.split_k)


def _sb(cfg: cfgs.W4A16Config) -> tuple[int, int]:
    """Scale bytes of the random operands: kernel 3's fold is exact only up to 128 (scale 2)."""
    return (120, 128) if cfg.fold else (120, 130)


@interp_only
@pytest.mark.parametrize("cfg", ALL_SWEPT, ids=lambda c: c.name)
def test_swept_config_interpreter(cfg: cfgs.W4A16Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every benchmarked config vs the reference and float64 (interpreter: fp32 dots, truncating bf16 cast)."""
    monkeypatch.setenv(ENV, "triton")
    counts, n, k = _interp_case(cfg)
    a, packed, scales, offs = _operands(counts, n, k, gen(cfg.block_m + cfg.block_n + cfg.block_k), sb=_sb(cfg))
    rows = sum(counts)
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16)
    assert gemm(a, (packed, scales), offs, out, config=cfg) is out
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    assert _rel_fro(out[:rows], want[:rows]) < 1e-2  # bound: see test_dg_w4a16.test_triton_vs_reference
    val, _ = _exact64(a, packed, scales, counts)
    assert _rel_fro(out[:rows], val) < 1e-2
    assert out[rows:].isnan().all()


@interp_only
@pytest.mark.parametrize("cfg", [cfgs.W4A16Config(16, 32, 128, 2, 2, kernel=2), cfgs.W4A16Config(32, 16, 128, 4, 2, 2)])
def test_kernel2_even_n_interpreter(cfg: cfgs.W4A16Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernel 2 without column masks (n % block_n == 0), several row tiles, an empty group, k of 3 steps."""
    monkeypatch.setenv(ENV, "triton")
    counts, n, k = [cfg.block_m + 1, 0, 5], 2 * cfg.block_n, 384
    a, packed, scales, offs = _operands(counts, n, k, gen(cfg.block_m * 3 + 1))
    rows = sum(counts)
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16)
    gemm(a, (packed, scales), offs, out, config=cfg)
    val, _ = _exact64(a, packed, scales, counts)
    assert _rel_fro(out[:rows], val) < 1e-2  # bound: see test_dg_w4a16.test_triton_vs_reference
    assert out[rows:].isnan().all()


@interp_only
def test_expected_m_hint_picks_prefill_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hint reaches the kernel: a 128-row tile config on rows that span a tile boundary stays correct."""
    monkeypatch.setenv(ENV, "triton")
    counts = [130, 5]
    a, packed, scales, offs = _operands(counts, 32, 128, gen(31))
    out = gemm(a, (packed, scales), offs, expected_m=200)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    assert _rel_fro(out[:135], want[:135]) < 1e-2


# --- GPU: every swept config on decode- and prefill-like row counts (V4 widths scaled down in n) -------------

_GPU_COUNTS = {
    "decode": [0, 1, 2, 0, 1, 0, 0, 3, 6, 0, 1, 2],
    "prefill": [200, 0, 190, 17, 256, 1],
}


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", ALL_SWEPT, ids=lambda c: c.name)
@pytest.mark.parametrize("regime", ["decode", "prefill"])
def test_gpu_swept_config(cfg: cfgs.W4A16Config, regime: str) -> None:
    """Each config on both row-count regimes (a config must be correct everywhere, not only where it is fast)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    counts, n, k = _GPU_COUNTS[regime], 512, 2048
    a, packed, scales, offs = (t.cuda() for t in _operands(counts, n, k, gen(41 + cfg.block_m), sb=_sb(cfg)))
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16, device="cuda")
    gemm(a, (packed, scales), offs, out, config=cfg)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    rows = sum(counts)
    assert _rel_fro(out[:rows], want[:rows]) < 4e-3  # both round to nearest on the GPU: a few bf16 ulps
    val, mag = _exact64(a.cpu(), packed.cpu(), scales.cpu(), counts)
    assert_gemm_close(out[:rows].cpu(), val, mag, k)
    assert out[rows:].isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("use_asm", [True, False])
def test_gpu_kernel2_dequant_bit_exact(use_asm: bool) -> None:
    """One-hot rows (scale bytes over [2, 252]) give the dequantised weights exactly through kernel 2 too."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from test_dg_w4a16 import _one_hot_case

    from deepinfer.deep_gemm.backends.cuda.triton_fp4_grouped import m_grouped_bf16_fp4_gemm_nt_contiguous_triton

    a, packed, scales, offs, want = (t.cuda() for t in _one_hot_case())
    out = torch.empty(a.shape[0], packed.shape[1], dtype=torch.bfloat16, device="cuda")
    cfg = cfgs.W4A16Config(16, 32, 128, 4, 3, kernel=2)
    m_grouped_bf16_fp4_gemm_nt_contiguous_triton(a, packed, scales, offs, out, config=cfg, use_asm=use_asm)
    assert torch.equal(out.double(), want)


@pytest.mark.gpu
def test_gpu_prefill_default_and_graph() -> None:
    """Default config from the shapes (prefill tiles), captured in a CUDA graph and replayed with new offs."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    counts = [150, 150, 150, 150]  # 150 rows per group: PREFILL (PREFILL_256 starts at 160)
    a, packed, scales, offs = (t.cuda() for t in _operands(counts, 256, 1024, gen(43), extra_rows=0))
    assert cfgs.default_config(a.shape[0], len(counts)) == cfgs.PREFILL
    out = torch.full((600, 256), NAN, dtype=torch.bfloat16, device="cuda")
    gemm(a, (packed, scales), offs, out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(a, (packed, scales), offs, out)
    offs.copy_(torch.tensor([0, 300, 301, 590], dtype=torch.int32))
    out.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize()
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    assert _rel_fro(out[:590], want[:590]) < 4e-3
    assert out[590:].isnan().all()


@interp_only
def test_env_config_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """DEEPINFER_DG_W4A16_CONFIG replaces the heuristic (a malformed name raises; a valid one computes right)."""
    monkeypatch.setenv(ENV, "triton")
    a, packed, scales, offs = _operands([20, 3], 32, 256, gen(47))
    monkeypatch.setenv("DEEPINFER_DG_W4A16_CONFIG", "bogus")
    with pytest.raises(ValueError, match="m16n64k128w2s3"):
        gemm(a, (packed, scales), offs)
    monkeypatch.setenv("DEEPINFER_DG_W4A16_CONFIG", "m32n16k256w4s2")
    out = gemm(a, (packed, scales), offs)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    assert _rel_fro(out[:23], want[:23]) < 1e-2
