"""The warp-specialised W4A8 kernel (`cuda_ws2s4`, `cuda_ws2s3`, `cuda_wsp2s4`: csrc/cuda/dg_w4a8_ws.cuh).

CPU: names and routing, an sm_90a nvcc compile check of dg_w4a8_ws.cu (no spills, within the 384-thread register
ceiling). `gpu`: BIT-EQUAL to today's default `cuda_wg2s4` (same tiles, conversion, wgmmas and promotion order) on
partial tiles, empty groups, few CTAs, one k block per tile, adversarial scale spreads (the exact per-32 path), tiny
scales, a NaN scale byte, a slow row; CUDA-graph replay with new offs; the API's impl= choice. The float64 checks of
test_dg_w4a8_cuda.py run every variant, the ws ones included.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import torch
from dg_testing import calc_diff, gen
from test_dg_w4a8_cuda import _CSRC, _operands, _run_cuda

from deepinfer.deep_gemm import reference_w4a8 as ref
from deepinfer.deep_gemm.api_w4a8 import m_grouped_fp8_fp4_gemm_nt_offsets as gemm
from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_grouped as cw

WS = cw.WS_VARIANTS
BASE = (2, 4, 0)  # cuda_wg2s4: the same 128 x 128 tiles and numerics


def test_ws_names() -> None:
    assert [cw.variant_name(v) for v in WS] == ["cuda_ws2s4", "cuda_ws2s3", "cuda_wsp2s4"]
    assert cw.parse_variant("cuda_ws2s4") == (2, 4, 2)
    assert cw.parse_variant("cuda_wsp2s4") == (2, 4, 3)
    assert cw.DEFAULT_VARIANT == BASE  # the default is unchanged


def test_ws_sm90_compile() -> None:
    """nvcc 13 builds dg_w4a8_ws.cu for sm_90a: the ws kernels + the pre-pass, no spills / stack, <= 168 registers
    (65536 / 384 threads), no wgmma serialisation warning (skipped without nvcc)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    cmd = [nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c",
           str(_CSRC / "dg_w4a8_ws.cu"), "-o", os.devnull]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", res.stderr)]
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", res.stderr)]
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", res.stderr)]
    assert len(regs) == len(WS) + 1, res.stderr[-2000:]
    assert max(regs) <= 168 and max(frames) == 0 and max(spills) == 0, res.stderr[-3000:]
    assert "C7510" not in res.stderr and "C7508" not in res.stderr, res.stderr[-3000:]


# ---------------------------------------------------------------- GPU

needs_kernel = pytest.mark.skipif(not cw.available(), reason="_C built without the W4A8 CUDA kernel")


def _bit_equal(ops: tuple, counts: list[int], variant: tuple[int, int, int], what: str, ctas: int = 0) -> None:
    base = _run_cuda(ops, BASE, counts, ctas)
    got = _run_cuda(ops, variant, counts, ctas)
    rows = sum(counts)
    same = torch.equal(got[:rows].view(torch.int16), base[:rows].view(torch.int16))  # NaN-safe bit compare
    if not same:
        diff = (got[:rows].view(torch.int16) != base[:rows].view(torch.int16)).sum()
        d = calc_diff(got[:rows].double().nan_to_num(), base[:rows].double().nan_to_num())
        pytest.fail(f"{cw.variant_name(variant)} {what}: {int(diff)} of {got[:rows].numel()} outputs differ from "
                    f"cuda_wg2s4 (calc_diff {d:.3e})")  # fmt: skip
    assert got[rows:].isnan().all(), f"{cw.variant_name(variant)} {what}: rows past offs[-1] were written"


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", WS, ids=cw.variant_name)
@pytest.mark.parametrize(
    ("counts", "n", "k", "ctas"),
    [
        ([3, 0, 130, 64, 1], 256, 512, 0),  # empty group, partial tiles, 2 m tiles in one group
        ([200, 17], 192, 256, 3),  # n tail tile, few CTAs: several tiles each (the ring runs across tiles)
        ([0, 0, 40], 128, 1024, 0),  # leading empty groups
        ([5, 9, 140], 128, 128, 2),  # one k block per tile
        ([256] * 6, 512, 2048, 0),  # full tiles, many k blocks per tile
    ],
)
def test_gpu_ws_bit_equal(variant: tuple[int, int, int], counts: list[int], n: int, k: int, ctas: int) -> None:
    ops = _operands(counts, n, k, gen(sum(counts) + n + k + 1))
    _bit_equal(ops, counts, variant, f"counts={counts} n={n} k={k} ctas={ctas}", ctas)


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", WS, ids=cw.variant_name)
@pytest.mark.parametrize(
    "sb", [(113, 127), (110, 127), (30, 200), (1, 40)], ids=["spread14", "spread17", "adv", "tiny"]
)
def test_gpu_ws_bit_equal_scales(variant: tuple[int, int, int], sb: tuple[int, int]) -> None:
    """Scale spreads around the fast-path bound and far past it (the per-32 path), tiny (subnormal factors)."""
    counts = [70, 5, 131]
    ops = _operands(counts, 256, 512, gen(sb[1] + 7), sb)
    _bit_equal(ops, counts, variant, f"scales {sb}")


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", WS, ids=cw.variant_name)
def test_gpu_ws_nan_and_slow_row(variant: tuple[int, int, int]) -> None:
    """A NaN scale byte (NaN column, as the reference) and one slow row whose only codes sit in its small group."""
    counts = [33, 90]
    a, sfa, packed, scales, offs = _operands(counts, 256, 256, gen(21))
    scales[0, 5, 0:4] = torch.tensor([140, 120, 120, 120], dtype=torch.uint8)
    packed[0, 5, 0:16] = 0
    scales[1, 7, 3] = 255
    ops = (a, sfa, packed, scales, offs)
    _bit_equal(ops, counts, variant, "nan byte + slow row")
    out = _run_cuda(ops, variant, counts)
    assert out[33:123, 7].isnan().all() and not out[:33, 7].isnan().any()


@pytest.mark.gpu
@needs_kernel
@pytest.mark.parametrize("variant", WS, ids=cw.variant_name)
def test_gpu_ws_cuda_graph_replay(variant: tuple[int, int, int]) -> None:
    """Captured once, replayed with new offs (groups 0 and 2 empty): offs is read on the device only."""
    counts = [4, 4, 4, 4]
    a, sfa, packed, scales, offs = (t.cuda() for t in _operands(counts, 128, 256, gen(22), extra_rows=0))
    out = torch.full((16, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, out, variant)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, out, variant)
    offs.copy_(torch.tensor([0, 1, 1, 9], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = torch.empty_like(out)
    ref.m_grouped_fp8_fp4_gemm_nt_offsets(a, sfa, packed, scales, offs, want)
    d = calc_diff(out[:9], want[:9])
    assert d < 1e-5, f"{cw.variant_name(variant)} graph replay: calc_diff {d:.3e}"
    assert out[9:].isnan().all()


@pytest.mark.gpu
@needs_kernel
def test_gpu_ws_api_impl() -> None:
    """impl='cuda_ws2s4' through the API: bit-equal to the direct call."""
    counts = [50, 0, 77]
    a, sfa, packed, scales, offs = (t.cuda() for t in _operands(counts, 256, 512, gen(23)))
    direct = torch.empty(a.shape[0], 256, dtype=torch.bfloat16, device="cuda")
    cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(a, sfa, packed, scales, offs, direct, WS[0])
    got = gemm((a, sfa), (packed, scales), offs, impl="cuda_ws2s4")
    assert torch.equal(got[:127], direct[:127])
