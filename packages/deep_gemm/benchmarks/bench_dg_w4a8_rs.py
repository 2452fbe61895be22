"""W4A8 grouped GEMM, register-operand kernel (cuda_rs*) beside the ws kernel, today's default and the FP8 API.

Issue 6 goal: FP4 experts >= 0.85x the FP8-expert grouped API where compute-bound. Same cases and baseline rows as
bench_dg_w4a8_ws.py (imported from it): 256 experts, 64 / 256 / 1,024 tokens per expert, (n, k) = (4096, 4096)
gate+up and (4096, 2048) down; rows: the FP8 grouped API, `cuda_wg2s4` (today's default at these sizes),
`cuda_wg2s4r` (row-reference scales), `cuda_ws2s4` (the warp-specialised kernel) and the `cuda_rs*` variants
(csrc/cuda/dg_w4a8_rs.cuh), all through the W4A8 API's impl=. Every W4A8 row records bit_equal / calc_diff vs
cuda_wg2s4's output and x_ws2s4. (cuda_wg1s4 and cuda_rs2s6 were measured in session 8 round 1:
build/s8/dgrs_r2.json; the folded `..f` / `..fc` rows until session 8: removed in session 9 with their kernels; the
chunk-pipelined rs variants `..p` / `..pl` / `..pi` / `..pil` of session 9: removed, see bench_dg_w4a8_lat.py.)

    python packages/deep_gemm/benchmarks/bench_dg_w4a8_rs.py --out RESULT.json   # H200, ~80 s
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_rs.py --smoke             # CPU, tiny (reference path)
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_rs.py --table RESULT.json # markdown table
"""

from __future__ import annotations

import os
import sys

if "--smoke" in sys.argv:  # before triton is imported: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_dg_w4a8_ws as ws  # noqa: E402  (puts this checkout's src/ first on sys.path)

WS_ROW = "cuda_ws2s4"
RS_ROWS = ("cuda_rs2s4", "cuda_rs2s4n256", "cuda_rs2s3n256")
IMPLS = ("cuda_wg2s4", "cuda_wg2s4r", WS_ROW, *RS_ROWS)
BUDGET_S = 140.0  # no new case past this (7 rows a case; session 8 round 1: 8 rows, 81 s in all)
META = {"package": "deep_gemm", "bench": "w4a8_rs"}


def run_case(wname: str, n: int, k: int, tpe: int, g: int, dev: str, rep: int, fp8: tuple) -> list[dict]:
    """bench_dg_w4a8_ws.run_case with this script's rows (its IMPLS global), plus x_ws2s4 per row."""
    ws.IMPLS = IMPLS  # run_case / _calls read the module global at call time
    recs = ws.run_case(wname, n, k, tpe, g, dev, rep, fp8)
    times = {r["impl"]: r["median_us"] for r in recs if "median_us" in r}
    for r in recs:
        if r["impl"] in times and WS_ROW in times:
            r["x_ws2s4"] = times[WS_ROW] / times[r["impl"]]
    return recs


def main(argv: list[str] | None = None) -> None:
    cli = ws.parse_cli(__doc__, "bench_dg_w4a8_rs.json", ws.table, argv)
    if cli is None:
        return
    line = lambda r: ws._line(r) + (f" x_ws2s4={r['x_ws2s4']:.3f}" if "x_ws2s4" in r else "")  # noqa: E731
    ws.sweep(*cli, run_case, line, META, ws.TPES, BUDGET_S)


if __name__ == "__main__":
    main()
