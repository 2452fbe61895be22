"""Roofline units and the measured ceilings of the H200 the benchmarks run on.

A kernel's floor time is the larger of FLOPs / peak and bytes / bandwidth; report achieved TFLOPS or
GB/s and the percentage of the matching ceiling below.
"""

from __future__ import annotations

import math

# Measured on the benchmark H200 (132 SMs, driver 580.159, torch 2.11 cu130), copied from
# /work/shared/reference/h200-ceilings.md (2026-11-30). Bandwidths in GB/s (1e9 B/s), compute in
# TFLOPS (1e12 FLOP/s); "datasheet" entries are NVIDIA's numbers, the others are measured.
H200_CEILINGS: dict[str, float] = {
    "hbm_copy_gbps": 4070.0,  # device-to-device copy of 1 GiB, bytes read + written
    "hbm_read_gbps": 4420.0,  # read-mostly stream (SDPA decode over a 4.3 GB KV)
    "hbm_datasheet_gbps": 4800.0,
    "bf16_tflops": 735.0,  # cuBLAS bf16 GEMM 8192^3
    "fp8_tflops": 1400.0,  # torch._scaled_mm row-wise, 4096x7168x16384, L2 flushed (best measured)
    "fp8_tflops_8192cube": 1269.0,  # torch._scaled_mm per-tensor 8192^3
    "fp8_datasheet_tflops": 1979.0,  # dense
    "nvlink_gbps_per_direction": 478.0,  # 18 links x 26.56 GB/s per GPU
    "nvlink_peer_copy_gbps": 393.0,  # GPU0 -> GPU1 copy of 1 GiB
    "nccl_all_to_all_gbps": 282.0,  # all_to_all_single, 2 GPUs, 256 MB per rank, crossing bytes
    "num_sms": 132.0,
}


def _positive(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}")
    return float(value)


def _non_negative(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return float(value)


def tflops(flops: float, us: float) -> float:
    """Achieved TFLOPS (1e12 FLOP/s) of ``flops`` floating-point operations done in ``us`` microseconds."""
    return _non_negative("flops", flops) / _positive("us", us) / 1e6


def gbps(nbytes: float, us: float) -> float:
    """Achieved GB/s (1e9 B/s) of ``nbytes`` bytes moved in ``us`` microseconds."""
    return _non_negative("nbytes", nbytes) / _positive("us", us) / 1e3


def pct_of(value: float, ceiling: float) -> float:
    """``value`` as a percentage of ``ceiling`` (same units, e.g. GB/s and H200_CEILINGS["hbm_copy_gbps"])."""
    return 100.0 * _non_negative("value", value) / _positive("ceiling", ceiling)


def floor_us(flops: float, nbytes: float, *, peak_tflops: float, peak_gbps: float) -> float:
    """Roofline floor in microseconds: max(flops / peak_tflops, nbytes / peak_gbps)."""
    compute = _non_negative("flops", flops) / (_positive("peak_tflops", peak_tflops) * 1e6)
    memory = _non_negative("nbytes", nbytes) / (_positive("peak_gbps", peak_gbps) * 1e3)
    return max(compute, memory)
