"""W4A8 rs kernel: the fast epilogue (`cuda_rs2s4n256e`, `cuda_rs2s4e`) side by side with its twins and the FP8 API.

Session 8 (issue 6): ablation F measured the rs kernel's per-element bf16 epilogue at ~46 % of its time. The `..e`
variants (csrc/cuda/dg_w4a8_rs.cuh, kEpi) stage each consumer's tile in shared memory with stmatrix.trans and write
whole token rows with 16-byte stores; the numerics are unchanged (bit-equal to the twin). Cases: 256 experts, 256 /
1,024 tokens per expert, (n, k) = (4096, 4096) gate+up and (4096, 2048) down (bench_dg_w4a8_ws.py's operands).
Rows: the FP8 grouped API (the goal's baseline), `cuda_rs2s4n256` (the API's choice from 256 rows per group) and
`cuda_rs2s4n256e`, `cuda_rs2s4` and `cuda_rs2s4e`, all through the W4A8 API's impl=. Each row records x_fp8_api,
x_twin (the twin's time / this row's: > 1 = the fast epilogue is faster), bit_equal_vs_base (vs cuda_rs2s4n256's
output: the rs variants are bit-equal to each other) and diff_vs_base.

    python packages/deep_gemm/benchmarks/bench_dg_w4a8_epi.py --out RESULT.json   # H200, ~40 s
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_epi.py --smoke             # CPU, tiny (reference path)
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_epi.py --table RESULT.json # markdown table
"""

from __future__ import annotations

import json
import os
import sys
import time

if "--smoke" in sys.argv:  # before triton is imported: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_dg_w4a8_ws as ws  # noqa: E402  (puts this checkout's src/ first on sys.path)
import torch  # noqa: E402

from kernelkit import write_results_json  # noqa: E402

BASE = "cuda_rs2s4n256"
TWINS = {"cuda_rs2s4n256e": "cuda_rs2s4n256", "cuda_rs2s4e": "cuda_rs2s4"}
IMPLS = ("cuda_rs2s4n256", "cuda_rs2s4n256e", "cuda_rs2s4", "cuda_rs2s4e")
TPES = (256, 1024)
BUDGET_S = 90.0  # no new case past this
META = {"package": "deep_gemm", "bench": "w4a8_epi"}


def run_case(wname: str, n: int, k: int, tpe: int, g: int, dev: str, rep: int, fp8: tuple) -> list[dict]:
    """bench_dg_w4a8_ws.run_case with this script's rows and base (its module globals), plus x_twin per row."""
    ws.IMPLS, ws.BASE = IMPLS, BASE  # run_case / _calls read the module globals at call time
    recs = ws.run_case(wname, n, k, tpe, g, dev, rep, fp8)
    times = {r["impl"]: r["median_us"] for r in recs if "median_us" in r}
    for r in recs:
        r.pop("x_wg2s4", None)  # (ws names its base ratio after cuda_wg2s4; here the base is cuda_rs2s4n256)
        r.pop("x_wg1s4", None)
        twin = TWINS.get(r["impl"])
        if twin in times and r["impl"] in times:
            r["twin"] = twin
            r["x_twin"] = times[twin] / times[r["impl"]]
    return recs


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['weights']} tpe={r['tpe']} {r['impl']}: ERROR {r['error']}"
    extra = f" bit_eq={r['bit_equal_vs_base']} diff={r['diff_vs_base']:.1e}" if "diff_vs_base" in r else ""
    twin = f" x_twin={r['x_twin']:.3f}" if "x_twin" in r else ""
    return (f"{r['weights']} tpe={r['tpe']} {r['impl']:>16}: {r['median_us']:9.1f} us {r['tflops']:7.1f} TFLOPS "
            f"x_fp8_api={r.get('x_fp8_api', 0):.3f}{twin}{extra}")  # fmt: skip


def table(path: str) -> str:
    """Markdown table of a saved run."""
    with open(path) as f:
        recs = json.load(f)["records"]
    rows = [
        "| weights | tpe | impl | us | TFLOPS | x FP8 API | x twin | bit-equal rs2s4n256 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        if "error" in r:
            rows.append(f"| {r['weights']} | {r['tpe']} | {r['impl']} | error: {r['error'][:60]} | | | | |")
            continue
        xs = " | ".join(f"{r[key]:.2f}" if key in r else "" for key in ("x_fp8_api", "x_twin"))
        head = f"| {r['weights']} | {r['tpe']} | {r['impl']} | {r['median_us']:.1f} | {r['tflops']:.1f}"
        rows.append(f"{head} | {xs} | {r.get('bit_equal_vs_base', '')} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    cli = ws.parse_cli(__doc__, "bench_dg_w4a8_epi.json", table, argv)
    if cli is None:
        return
    args, dev = cli
    shapes = {"smoke": (256, 256)} if args.smoke else ws.SHAPES
    tpes, g = ((3, 8) if args.smoke else TPES), (2 if args.smoke else ws.EXPERTS)
    start, recs = time.monotonic(), []
    for wname, (n, k) in shapes.items():
        fp8 = (ws._fp8_bytes((g, n, k), dev), torch.rand(g, n // 128, k // 128, device=dev) + 0.5)
        for tpe in tpes:
            if time.monotonic() - start > BUDGET_S:
                print(f"budget: skipping {wname} tpe={tpe}", flush=True)
                recs.append({"weights": wname, "tpe": tpe, "impl": "*", "error": "skipped: time budget"})
                continue
            rep = 3 if args.smoke else (20 if tpe >= 1024 else 40)
            try:
                case = run_case(wname, n, k, tpe, g, dev, rep, fp8)
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory: record and go on
                case = [{"weights": wname, "tpe": tpe, "impl": "*", "error": f"{type(exc).__name__}: {str(exc)[:300]}"}]
            for r in case:
                print(_line(r), flush=True)
                recs.append(r)
            write_results_json(args.out, recs, META)  # partial results
        del fp8
        if dev == "cuda":
            torch.cuda.empty_cache()
    write_results_json(args.out, recs, {**META, "seconds": time.monotonic() - start})
    print(f"wrote {args.out} ({len(recs)} records, {time.monotonic() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
