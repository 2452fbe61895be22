"""Dense FP8 section of the deep_gemm benchmark alone (issue 6): CUTLASS vs Triton vs torch._scaled_mm.

    python packages/deep_gemm/benchmarks/bench_fp8_dense.py --out RESULT.json   # H200, ~30-60 s
    python packages/deep_gemm/benchmarks/bench_fp8_dense.py --smoke             # tiny shape on CPU (interpreter)
    python packages/deep_gemm/benchmarks/bench_fp8_dense.py --table RESULT.json # markdown table

The same cases, timing and record format as `bench_deep_gemm.py` (whose run covers these last, after the W4A16
sweep, under a 90 s budget): this script runs only `bench_cases.dense_fp8_cases`, so the CUTLASS rows are
measured even when the full run's budget runs out first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if "--smoke" in sys.argv:  # before triton is imported: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("DEEPINFER_DEEP_GEMM_BACKEND", "triton")

import bench_deep_gemm as full  # noqa: E402  (puts this checkout's src/ first on sys.path)
import torch  # noqa: E402

bc = full.bc
from kernelkit import write_results_json  # noqa: E402


def run(out_path: str | None, smoke: bool, warmup: int, rep: int) -> list[dict]:
    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    t0 = time.monotonic()
    ms, nks = ([3], [(64, 256)]) if smoke else (bc.DENSE_M, bc.DENSE_NK)
    meta = {"package": "deep_gemm", "section": "fp8_dense", "smoke": smoke, "warmup": warmup, "rep": rep}
    records: list[dict] = []
    for n, k in nks:  # one (n, k) at a time: the weights of one shape only are alive
        try:
            cases = bc.dense_fp8_cases(dev, ms, [(n, k)])
        except Exception as exc:  # noqa: BLE001 - record and go on
            records.append({"op": "setup", "impl": None, "error": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        for case in cases:
            recs = full._time_case(case, warmup, rep)
            records += recs
            for r in recs:
                what = r["error"] or f"{r['median_us']:9.1f} us {r['tflops']:7.1f} TFLOPS"
                full.log(f"[{time.monotonic() - t0:6.1f}s] {full._shape_str(case.shape)} {r['impl']}: {what}")
        if out_path:
            write_results_json(out_path, records, meta)
    meta["elapsed_s"] = time.monotonic() - t0
    if out_path:
        write_results_json(out_path, records, meta)
    full.log(f"done in {meta['elapsed_s']:.1f} s")
    return records


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the JSON results here")
    p.add_argument("--smoke", action="store_true", help="tiny shape on CPU (Triton interpreter)")
    p.add_argument("--table", metavar="JSON", help="print the markdown table of a saved run and exit")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rep", type=int, default=20)
    args = p.parse_args(argv)
    if args.table:
        print(full.table(args.table))
        return
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke for the CPU check")
    run(args.out, args.smoke, 1 if args.smoke else args.warmup, 2 if args.smoke else args.rep)


if __name__ == "__main__":
    main()
