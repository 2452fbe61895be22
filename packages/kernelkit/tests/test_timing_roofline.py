"""kernelkit.timing and kernelkit.roofline on CPU (the CUDA-event path is exercised on the GPU machine)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

import pytest
import torch

import kernelkit.timing as timing
from kernelkit import H200_CEILINGS, bench_cuda, floor_us, gbps, pct_of, tflops


def test_bench_cpu_counts_calls_and_orders_percentiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    calls = []
    sleep_s = random.uniform(0.001, 0.002)

    def fn() -> None:
        calls.append(1)
        time.sleep(sleep_s)

    res = bench_cuda(fn, warmup=2, rep=7, flush_bytes=1 << 16)
    assert len(calls) == 9
    assert res["timer"] == "perf_counter" and res["rep"] == 7
    assert sleep_s * 1e6 <= res["min_us"] <= res["p10"] <= res["median_us"] <= res["p90"]
    assert res["median_us"] < sleep_s * 1e6 + 50_000  # a sleep overshoots, but not by 50 ms


def test_bench_flushes_before_every_timed_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    seen: list[bool] = []
    real_time_cpu = timing._time_cpu

    def spy(fn: Callable[[], object], rep: int, flush: torch.Tensor | None) -> list[float]:
        seen.append(flush is not None and flush.numel() * 4 == 4096)
        return real_time_cpu(fn, rep, flush)

    monkeypatch.setattr(timing, "_time_cpu", spy)
    bench_cuda(lambda: None, warmup=0, rep=3, flush_bytes=4096)
    bench_cuda(lambda: None, warmup=0, rep=3, flush_l2=False, flush_bytes=4096)
    assert seen == [True, False]


def test_bench_bad_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TypeError, match="fn: expected a callable"):
        bench_cuda(42, warmup=0, rep=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rep: expected an int >= 1"):
        bench_cuda(lambda: None, warmup=0, rep=0)
    with pytest.raises(ValueError, match="warmup"):
        bench_cuda(lambda: None, warmup=-1, rep=1)
    with pytest.raises(RuntimeError, match="use_cuda=True"):
        bench_cuda(lambda: None, warmup=0, rep=1, use_cuda=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_cuda_events_time_a_matmul() -> None:
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    floor = floor_us(2 * 2048**3, 0, peak_tflops=990.0, peak_gbps=1.0)  # cannot beat the datasheet
    for mode, timer in (("events", "cuda_events"), ("graph", "cuda_graph"), ("auto", "cuda_graph")):
        res = bench_cuda(lambda: a @ a, warmup=3, rep=10, mode=mode)
        assert res["timer"] == timer
        assert res["median_us"] >= floor


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_cuda_auto_falls_back_when_capture_fails() -> None:
    a = torch.randn(256, device="cuda")
    res = bench_cuda(lambda: (a * 2).sum().item(), warmup=1, rep=3)  # .item() syncs: not capturable
    assert res["timer"] == "cuda_events" and "graph_error" in res
    with pytest.raises(Exception):  # noqa: B017 - whatever the capture raises
        bench_cuda(lambda: (a * 2).sum().item(), warmup=1, rep=3, mode="graph")


def test_bench_cuda_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode"):
        bench_cuda(lambda: None, warmup=0, rep=1, mode="fast")


def test_units_invert() -> None:
    flops, nbytes, us = random.uniform(1e9, 1e13), random.uniform(1e6, 1e10), random.uniform(1.0, 1e4)
    assert tflops(flops, us) * 1e12 * us * 1e-6 == pytest.approx(flops, rel=1e-12)
    assert gbps(nbytes, us) * 1e9 * us * 1e-6 == pytest.approx(nbytes, rel=1e-12)
    ceiling = random.uniform(1.0, 5000.0)
    assert pct_of(ceiling / 4, ceiling) == pytest.approx(25.0, rel=1e-12)


def test_floor_picks_the_binding_limit() -> None:
    peak_t, peak_g = H200_CEILINGS["bf16_tflops"], H200_CEILINGS["hbm_copy_gbps"]
    # 8192^3 GEMM: compute-bound; 1 GiB copy: memory-bound.
    gemm = floor_us(2 * 8192**3, 3 * 2 * 8192**2, peak_tflops=peak_t, peak_gbps=peak_g)
    assert gemm == pytest.approx(2 * 8192**3 / (peak_t * 1e6))
    copy = floor_us(0, 2 * 2**30, peak_tflops=peak_t, peak_gbps=peak_g)
    assert copy == pytest.approx(2 * 2**30 / (peak_g * 1e3))


def test_ceilings_agree_with_the_documented_ridge_points() -> None:
    # h200-ceilings.md: "bf16 about 180 FLOP/byte, FP8 about 310 FLOP/byte (measured ceilings)".
    hbm = H200_CEILINGS["hbm_copy_gbps"] * 1e9
    assert H200_CEILINGS["bf16_tflops"] * 1e12 / hbm == pytest.approx(180, rel=0.03)
    assert H200_CEILINGS["fp8_tflops_8192cube"] * 1e12 / hbm == pytest.approx(310, rel=0.03)
    assert H200_CEILINGS["hbm_copy_gbps"] < H200_CEILINGS["hbm_read_gbps"] < H200_CEILINGS["hbm_datasheet_gbps"]


@pytest.mark.parametrize("us", [0.0, -1.0, math.nan, math.inf])
def test_units_reject_bad_time(us: float) -> None:
    with pytest.raises(ValueError, match="us: expected a positive finite number"):
        tflops(1e9, us)
    with pytest.raises(ValueError, match="us: expected"):
        gbps(1e9, us)
    with pytest.raises(ValueError, match="ceiling"):
        pct_of(1.0, us)
