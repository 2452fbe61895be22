"""Tensor-pipe ceilings of the FP8 GEMM tile shapes on this GPU (issue 6: why the dense goal misses).

Runs `ceiling/wgmma_ceiling.cu` (compiled here with nvcc to a cubin, launched through CuPy): one persistent CTA per
SM, operands resident in shared memory, `iters` 128-deep k blocks of one output tile per CTA:

    ceil_n128         tile 128 x 128 (two m64n128 warpgroups), no promotion, no feed: the tensor pipe alone
    ceil_n256         tile 128 x 256 (two m64n256 warpgroups, a cuBLAS-style tile)
    ceil_n128_feed    + a producer writing one stage ((128 + n) x 128 B) per k block into shared memory with
    ceil_n256_feed      cp.async.bulk from an L2-resident buffer, coupled by full / empty barriers
    ceil_wide         tile 128 x 256 promoted in 232 registers: acc[128] + ONE temporary, the two n128 halves of
                        each k block issued, waited and promoted in turn (the fp8_wide design)
    ceil_wide_feed    the same with the bulk-copy feed: the fp8_wide consumers with an ideal producer
    ceil_db           fp8_db's own consumers (two temporaries, promotion, stage release; spin waits), bare producer
    ceil_db_feed      the same with the bulk-copy feed: fp8_db's consumer side with an ideal producer

and, in the same process, cuBLAS FP8 (`torch._scaled_mm`, row-wise scales) at 8192^3 as the baseline. TFLOPS count
2 * 128 * n * 128 per k block. The SM clock (nvidia-smi, sampled mid-run) gives the dense FP8 peak at that clock
(132 SMs x 8192 FLOP per clock).

    python packages/deep_gemm/benchmarks/bench_dg_ceiling.py --out RESULT.json   # H200 with nvcc + CuPy, ~30 s
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "ceiling", "wgmma_ceiling.cu")
KERNELS = (  # name, tile n, what it is
    ("ceil_n128", 128, "tensor pipe, 128x128 tile"),
    ("ceil_n256", 256, "tensor pipe, 128x256 tile"),
    ("ceil_n128_feed", 128, "+ bulk-copy feed, 128x128"),
    ("ceil_n256_feed", 256, "+ bulk-copy feed, 128x256"),
    ("ceil_wide", 256, "128x256 promoted, one temporary"),
    ("ceil_wide_feed", 256, "+ feed (the fp8_wide design)"),
    ("ceil_db", 128, "fp8_db consumers, no feed"),
    ("ceil_db_feed", 128, "fp8_db consumers + feed"),
)
FLOP_PER_SM_CLK = 8192  # dense FP8 wgmma: 4,096 FMA per SM per clock on sm_90


def build_cubin(tmp: str) -> str:
    """nvcc -> cubin of wgmma_ceiling.cu (sm_90a); returns its path."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    out = os.path.join(tmp, "ceil.cubin")
    cmd = [nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-o", out, SRC]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def sm_clock_sampler(result: dict, delay_s: float) -> threading.Thread:
    """A thread that reads the SM clock (MHz) and power (W) once after `delay_s` into result."""

    def run() -> None:
        time.sleep(delay_s)
        q = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True)  # fmt: skip
        parts = q.stdout.strip().splitlines()[0].split(",") if q.returncode == 0 and q.stdout.strip() else []
        result["sm_mhz"] = float(parts[0]) if parts else None
        result["power_w"] = float(parts[1]) if len(parts) > 1 else None

    t = threading.Thread(target=run)
    t.start()
    return t


def time_kernel(cp, fn, smem: int, sms: int, args: tuple, reps: int) -> tuple[float, dict]:
    """Median ms of `reps` launches (after 2 warm-ups) and a clock sample taken during a ~0.3 s burst."""
    launch = lambda: fn((sms,), (384,), args, shared_mem=smem)  # noqa: E731
    for _ in range(2):
        launch()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        launch()
        e1.record()
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1))
    med = sorted(times)[len(times) // 2]
    clock: dict = {}
    burst = max(1, int(300 / max(med, 1e-3)))
    t = sm_clock_sampler(clock, 0.15)
    for _ in range(burst):
        launch()
    cp.cuda.Device().synchronize()
    t.join()
    return med, clock


def cublas_baseline(reps: int = 20) -> dict:
    """torch._scaled_mm row-wise FP8 at 8192^3 (the ceilings file's cuBLAS row): TFLOPS, median of reps."""
    import torch

    m = n = k = 8192
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.rand(m, 1, device="cuda") + 0.5
    sb = torch.rand(1, n, device="cuda") + 0.5
    run = lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)  # noqa: E731
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        run()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    med = sorted(ts)[len(ts) // 2]
    return {"kernel": "torch_scaled_mm_rowwise_8192", "median_ms": med, "tflops": 2 * m * n * k / med / 1e9}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the records here (JSON)")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    import cupy as cp  # the GPU machine has CuPy; torch is only the cuBLAS baseline

    sys.path.insert(0, os.path.join(HERE, "..", "..", "kernelkit", "src"))
    with tempfile.TemporaryDirectory() as tmp:
        mod = cp.RawModule(path=build_cubin(tmp))
        sizes = cp.zeros(3, dtype=cp.int32)
        mod.get_function("ceil_sizes")((1,), (1,), (sizes,))
        smem_n128, smem_n256, smem_db = (int(v) for v in sizes.get())
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        src_bytes = 32 << 20  # L2-resident feed source (H200 L2: 50 MB)
        src = cp.random.randint(0, 256, size=src_bytes, dtype=cp.uint8)
        sink = cp.zeros(64, dtype=cp.float32)
        recs = []
        for name, n, what in KERNELS:
            fn = mod.get_function(name)
            smem = smem_db if name.startswith("ceil_db") else (smem_n128 if n == 128 else smem_n256)
            fn.max_dynamic_shared_size_bytes = smem
            iters = 40000 if n == 128 else 20000  # ~25 ms per launch (even: db_tile's block pairs)
            ms, clock = time_kernel(cp, fn, smem, sms, (src, cp.uint64(src_bytes), cp.int32(iters), sink), args.reps)
            flop = sms * iters * 2.0 * 128 * n * 128
            rec = {"kernel": name, "what": what, "tile_n": n, "iters": iters, "median_ms": ms,
                   "tflops": flop / ms / 1e9, **clock}  # fmt: skip
            if clock.get("sm_mhz"):
                rec["peak_at_clock_tflops"] = sms * FLOP_PER_SM_CLK * clock["sm_mhz"] * 1e6 / 1e12
                rec["pct_of_peak_at_clock"] = 100.0 * rec["tflops"] / rec["peak_at_clock_tflops"]
            print(f"{name:16s} {what:30s} {rec['tflops']:8.1f} TFLOPS  clock {clock.get('sm_mhz')} MHz "
                  f"power {clock.get('power_w')} W", flush=True)  # fmt: skip
            recs.append(rec)
    base = cublas_baseline()
    print(f"{base['kernel']:16s} {base['tflops']:8.1f} TFLOPS", flush=True)
    recs.append(base)
    for r in recs:
        r["x_cublas_8192"] = r["tflops"] / base["tflops"]
    if args.out:
        from kernelkit import write_results_json

        write_results_json(args.out, recs, {"package": "deep_gemm", "bench": "wgmma_ceiling", "sms": sms})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
