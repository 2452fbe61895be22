"""W4A8 grouped GEMM, latency round: the API's default from 256 rows per group (cuda_rs2s4n256) against the FP8 API.

Issue 6 goal: FP4 experts >= 0.85x the FP8-expert grouped API where compute-bound: each row records x_fp8_api (and
x_rs2s4n256; a new rs variant added to IMPLS also gets bit_equal / calc_diff vs cuda_rs2s4n256's output). Session 9's
chunk-pipelined n64 variants `cuda_rs2s4n256p` / `..pl` / `..pi` / `..pil` were measured here (results/
2026-12-01-s9-bench-dg_w4a8_lat.json: bit-equal, 0.93-0.98x cuda_rs2s4n256) and removed; `--table` still prints
that file. Cases (helpers of bench_dg_w4a8_ws.py): 256 experts, 256 / 1,024 tokens per expert, (n, k) =
(4096, 4096) gate+up and (4096, 2048) down.

    python packages/deep_gemm/benchmarks/bench_dg_w4a8_lat.py --out RESULT.json   # H200, < 90 s
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_lat.py --smoke             # CPU, tiny (reference path)
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_lat.py --table RESULT.json # markdown table
"""

from __future__ import annotations

import os
import sys

if "--smoke" in sys.argv:  # before triton is imported: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_dg_w4a8_ws as ws  # noqa: E402  (puts this checkout's src/ first on sys.path)

BASE = "cuda_rs2s4n256"  # today's API default from 256 rows per group
IMPLS = (BASE,)  # (+ any rs variant to compare with it)
TPES = (256, 1024)
BUDGET_S = 75.0  # no new case past this
META = {"package": "deep_gemm", "bench": "w4a8_lat"}


def run_case(wname: str, n: int, k: int, tpe: int, g: int, dev: str, rep: int, fp8: tuple) -> list[dict]:
    """bench_dg_w4a8_ws.run_case with this script's rows, bit-equality against cuda_rs2s4n256 and x_rs2s4n256."""
    ws.IMPLS, ws.BASE = IMPLS, BASE  # run_case / _calls read the module globals at call time
    recs = ws.run_case(wname, n, k, tpe, g, dev, rep, fp8)
    times = {r["impl"]: r["median_us"] for r in recs if "median_us" in r}
    for r in recs:
        r.pop("x_wg2s4", None)  # (ws names its base key after cuda_wg2s4: here it is cuda_rs2s4n256)
        if r["impl"] in times and BASE in times:
            r["x_rs2s4n256"] = times[BASE] / times[r["impl"]]
    return recs


def _line(r: dict) -> str:
    return ws._line(r, "x_rs2s4n256")


def table(path: str) -> str:
    """Markdown table of a saved run."""
    return ws.table(path, ("x_fp8_api", "x_rs2s4n256"), "rs2s4n256")


def main(argv: list[str] | None = None) -> None:
    cli = ws.parse_cli(__doc__, "bench_dg_w4a8_lat.json", table, argv)
    if cli is None:
        return
    ws.sweep(*cli, run_case, _line, META, TPES, BUDGET_S)


if __name__ == "__main__":
    main()
