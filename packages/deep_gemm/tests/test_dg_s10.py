"""Session 10: the 256x128x128 CUTLASS FP8 tile configs (opt-in; csrc/cuda/cutlass/fp8_gemm_coop_k_256*.cu and
fp8_grouped_coop_256*.cu), dense configs 6 / 7 and grouped configs 5 / 6.

CPU: the configs are registered consistently (Python tables, the C++ header's counts, the module's dispatch table),
take the knobs of their scheduler, and are never picked by the auto dispatch (the default is unchanged).
GPU (@pytest.mark.gpu): each new config against the fp32 reference (calc_diff < 1e-5, the bound of
test_dg_fp8_cutlass.py: rounding order plus one bf16 rounding; a layout bug gives ~1e-2..1) on m not a multiple of
the 256-row tile, m = 0, with C, empty experts and the masked layout; and bit-equal to the 128x128 kernel of the
same scale layout, where the math is identical: each warpgroup issues the same m64n128k32 wgmma per 128-deep k
block and promotes with the same sfa * sfb product, so only the tile walk differs (dense: data-parallel scheduling
on both sides, since a stream-K split changes the summation order; grouped: the API's default grouped config).
"""

from __future__ import annotations

import pathlib
import re

import pytest
import test_dg_fp8_cutlass as t_dense
import test_dg_fp8_grouped_cutlass as t_grouped
import torch

from deepinfer.deep_gemm.backends.cuda import cutlass_fp8 as cf
from deepinfer.deep_gemm.backends.cuda import cutlass_fp8_grouped as cg

DENSE_NEW = (6, 7)  # 256x128x128 cooperative, cluster 1x1 / 1x2, K-major A scales
GROUPED_NEW = (5, 6)  # 256x128x128 cooperative, cluster 1x1 / 1x2
DENSE_SAME_MATH = 2  # 128x128x128 cooperative, K-major A scales
CSRC = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda"


# ---------------------------------------------------------------- CPU: registration and dispatch


def _header_count(name: str) -> int:
    text = (CSRC / "cutlass" / "dg_cutlass_fp8.h").read_text()
    found = re.search(rf"constexpr int {name} = (\d+);", text)
    assert found, f"{name} not in dg_cutlass_fp8.h"
    return int(found.group(1))


def test_config_tables_match_the_header() -> None:
    assert _header_count("kCutlassFp8Configs") == len(cf.CONFIGS) == max(cf.CONFIGS) + 1
    assert _header_count("kCutlassFp8GroupedConfigs") == len(cg.CONFIGS) == max(cg.CONFIGS) + 1
    module = (CSRC / "dg_module.cpp").read_text()
    names = ("cutlass_fp8_gemm_coop_k_256", "cutlass_fp8_gemm_coop_k_256_1x2", "cutlass_fp8_grouped_gemm_coop_256",
             "cutlass_fp8_grouped_gemm_coop_256_1x2")  # fmt: skip
    for name in names:
        assert re.search(rf"\b{name}\b", module), f"dg_module.cpp's config tables lack {name}"


def test_new_configs_take_their_knobs() -> None:
    for cfg in DENSE_NEW:
        assert "256x128x128" in cf.CONFIGS[cfg]
        assert cfg in cf.K_MAJOR_SFA and cfg in cf.STREAM_K
        cf.check_knobs(cfg, 2, 4, 2, 3, len(cf.CONFIGS))  # split-K with 3 splits, raster along N, swizzle 4
    for cfg in GROUPED_NEW:
        assert cg.CONFIGS[cfg].startswith("coop_256")


def test_auto_dispatch_never_picks_the_new_configs() -> None:
    """Opt-in only: the defaults stay as measured in earlier sessions."""
    for m in (1, 16, 100, 256, 1000, 4096, 16384):
        for n, k in t_dense.DENSE_NK:
            assert cf.default_config(m, n, k) not in DENSE_NEW, (m, n, k)
    for rows in (1, 8, 64, 128, 256, 1024, 8192):
        assert cg.auto_config(rows) not in GROUPED_NEW, rows


# ---------------------------------------------------------------- GPU: the kernels

needs_dense = t_dense.needs_cutlass
needs_grouped = t_grouped.needs_kernel


@pytest.mark.gpu
def test_gpu_new_configs_built() -> None:
    assert torch.cuda.is_available(), "no CUDA device"
    built = (cf.built_configs(), cg.built_configs())
    source = (len(cf.CONFIGS), len(cg.CONFIGS))
    assert built == source, f"_C has {built} (dense, grouped) configs, the source {source}"


@pytest.mark.gpu
@needs_dense
@pytest.mark.parametrize("config", DENSE_NEW)
@pytest.mark.parametrize(("m", "n", "k"), [(0, 4096, 2048), (77, 2048, 4096), (300, 8192, 1024), (4133, 4096, 2048)])
def test_gpu_dense_256_vs_reference(m: int, n: int, k: int, config: int) -> None:
    t_dense._run_and_check(m, n, k, config, e8m0=False, with_c=(m % 2 == 1))


@pytest.mark.gpu
@needs_dense
@pytest.mark.parametrize("config", DENSE_NEW)
def test_gpu_dense_256_e8m0_alias(config: int) -> None:
    t_dense._run_and_check(517, 1024, 4096, config, e8m0=True, with_c=True)
    t_dense._run_and_check(517, 1024, 4096, config, e8m0=False, with_c=True, alias=True)


@pytest.mark.gpu
@needs_dense
@pytest.mark.parametrize("config", DENSE_NEW)
@pytest.mark.parametrize(("m", "n", "k"), [(4133, 4096, 2048), (1000, 2048, 7168)])
def test_gpu_dense_256_bit_equal_128(m: int, n: int, k: int, config: int) -> None:
    """Same per-element math as config 2 (data-parallel on both: no stream-K split of k)."""
    a, sfa, b, sfb, _ = t_dense._operands_gpu(m, n, k, False, seed=m + k + config)
    outs = []
    for cfg in (DENSE_SAME_MATH, config):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        outs.append(cf.fp8_gemm_nt_cutlass(a, sfa, b, sfb, out, config=cfg, decomposition=1))
    torch.cuda.synchronize()
    same = outs[0].view(torch.int16) == outs[1].view(torch.int16)
    if not bool(same.all()):
        bad = (~same).nonzero()
        err = (outs[0].float() - outs[1].float()).abs().max().item()
        pytest.fail(f"config {config} vs {DENSE_SAME_MATH} m={m} n={n} k={k}: {bad.shape[0]} elements differ, "
                    f"first at {bad[0].tolist()}, max |diff| {err:.3e}")  # fmt: skip


_GROUPED_CASES = [
    ([1, 0, 130, 77], 4096, 2048),  # experts smaller than a tile, an empty one
    ([256, 256, 0, 384], 4096, 4096),
    ([1024] * 8, 4096, 4096),
    ([5, 300, 0, 0, 129, 64, 1, 255], 2048, 7168),
    ([200] * 3, 136, 256),  # n not a multiple of 128
]


@pytest.mark.gpu
@needs_grouped
@pytest.mark.parametrize(("counts", "n", "k"), _GROUPED_CASES)
@pytest.mark.parametrize("config", GROUPED_NEW)
def test_gpu_grouped_256_vs_reference(counts: list[int], n: int, k: int, config: int) -> None:
    t_grouped._run_and_check(counts, n, k, e8m0=False, seed=sum(counts) + n + k + config, config=config)


@pytest.mark.gpu
@needs_grouped
@pytest.mark.parametrize("config", GROUPED_NEW)
def test_gpu_grouped_256_masked(config: int) -> None:
    counts, m_max, n, k = [200, 0, 256, 129], 256, 2048, 7168
    a, sfa, b, sfb, cnt = t_grouped._masked_operands(counts, m_max, n, k, seed=sum(counts) + k)
    out = torch.full((len(counts), m_max, n), 7.0, dtype=torch.bfloat16, device="cuda")
    cg.m_grouped_fp8_gemm_nt_masked_cutlass(a, sfa, b, sfb, out, cnt, m_max, config=config)
    t_grouped._check_masked(out, a, sfa, b, sfb, counts, 7.0, f"config {config}")


@pytest.mark.gpu
@needs_grouped
@pytest.mark.parametrize("config", GROUPED_NEW)
def test_gpu_grouped_256_bit_equal_default(config: int) -> None:
    """Same per-element math as the API's grouped default (128x128 tiles)."""
    counts, n, k = [1024, 0, 77, 300, 512], 4096, 2048
    ids = t_grouped._layout(counts, "cuda")
    a, sfa, b, sfb = (t.cuda() for t in t_grouped._operands(ids.numel(), len(counts), n, k, seed=11 + config))
    outs = []
    for cfg in (cg.DEFAULT_CONFIG, config):
        out = torch.full((ids.numel(), n), float("nan"), dtype=torch.bfloat16, device="cuda")
        outs.append(cg.m_grouped_fp8_gemm_nt_contiguous_cutlass(a, sfa, b, sfb, out, ids, config=cfg))
    torch.cuda.synchronize()
    same = outs[0].view(torch.int16) == outs[1].view(torch.int16)
    if not bool(same.all()):
        bad = (~same).nonzero()
        pytest.fail(f"grouped config {config} vs {cg.DEFAULT_CONFIG}: {bad.shape[0]} elements differ, first at "
                    f"{bad[0].tolist()} (expert {int(ids[bad[0][0]])})")  # fmt: skip
