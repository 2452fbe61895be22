"""W4A8 grouped GEMM: the wide kernel on prepared FP4 weights (csrc/cuda/dg_w4a8_wide.cuh) beside today's default
register-operand kernel and the FP8 grouped API.

Issue 6 goal: FP4 experts >= 0.85x the FP8-expert grouped API where compute-bound. Cases as bench_dg_w4a8_ws.py:
256 experts, 64 / 256 / 1,024 tokens per expert, (n, k) = (4096, 4096) gate+up and (4096, 2048) down, random e2m1
codes with E8M0 bytes in [118, 128) (lossless for the wide format). Rows: `fp8_grouped_api` (the goal's baseline),
`cuda_rs2s4n256` / `cuda_wg1s4` (the W4A8 API's raw-weight defaults from 256 / for 64-255 rows), `w4a8_wide` (the
API with the prepared weight, impl="wide"), and `fp8_wide_t3_conv`: the FP8 wide kernel (same consumers, 3 stages)
on the e4m3 operand the wide kernel's producer writes, i.e. the same GEMM with the conversion and the FP4 copies
taken away (its ceiling). Per row: x_fp8_api, x_rs (vs cuda_rs2s4n256), x_wg1 (vs cuda_wg1s4), x_conv (vs
fp8_wide_t3_conv); w4a8_wide also bit_equal_vs_conv (must be True) and diff_vs_rs; per case the one-off preparation
time (prep_ms).

    python packages/deep_gemm/benchmarks/bench_dg_w4a8_wide.py --out RESULT.json   # H200
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_wide.py --smoke             # CPU, tiny (reference path)
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_wide.py --table RESULT.json # markdown table
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

from deepinfer.deep_gemm import api_w4a8  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cuda_fp8_db as db  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_wide as ww  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import w4a8_wide_pack as wp  # noqa: E402

RS, WG1, WIDE, CONV = "cuda_rs2s4n256", "cuda_wg1s4", "w4a8_wide", "fp8_wide_t3_conv"
BUDGET_S = 150.0
META = {"package": "deep_gemm", "bench": "w4a8_wide"}


def _prepare(op: dict, dev: str) -> tuple[wp.W4A8WideWeights, float]:
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    w = wp.prepare_w4a8_wide(op["packed"], op["scales"])
    if dev == "cuda":
        torch.cuda.synchronize()
    return w, (time.perf_counter() - t0) * 1e3


def _calls(op: dict, w: wp.W4A8WideWeights, b8: torch.Tensor | None, shape: tuple, dev: str, fp8: tuple) -> dict:
    """{row: (callable, its own output)}; shape = (n, k, g)."""
    n, k, g = shape
    ws.IMPLS = (RS, WG1)  # ws._calls: the FP8 API row + the raw-weight defaults (>= 256 / 64-255 rows) via the API
    calls = ws._calls(op, n, k, g, dev, *fp8)
    out_w = torch.empty(op["m"], n, device=dev, dtype=torch.bfloat16)
    calls[WIDE] = (lambda: api_w4a8.m_grouped_fp8_fp4_gemm_nt_offsets((op["a"], op["sfa"]), w, op["offs"], out_w,
                                                                     impl="wide"), out_w)  # fmt: skip
    if dev == "cuda":
        out_c = torch.empty(op["m"], n, device=dev, dtype=torch.bfloat16)
        calls[CONV] = (lambda: db.m_grouped_fp8_gemm_nt_offsets_db(op["a"], op["sfa"], b8, w.sfb, op["offs"], out_c,
                                                                   stages=3, wide=True), out_c)  # fmt: skip
    return calls


def run_case(wname: str, n: int, k: int, tpe: int, g: int, dev: str, rep: int, fp8: tuple) -> list[dict]:
    op = ws._operands(tpe, n, k, g, dev)
    w, prep_ms = _prepare(op, dev)
    b8 = wp.e4m3_operand(w) if dev == "cuda" else None
    calls = _calls(op, w, b8, (n, k, g), dev, fp8)
    flops = 2.0 * op["m"] * n * k
    recs, times = [], {}
    for name, (fn, _) in calls.items():
        rec = {"op": "m_grouped_fp8_fp4_gemm_nt_offsets", "weights": wname, "tpe": tpe, "groups": g, "m": op["m"],
               "n": n, "k": k, "impl": name}  # fmt: skip
        if name == WIDE:
            rec.update(prep_ms=prep_ms, lossless=w.lossless, kernel_ran=ww.applies(op["a"], w))
        ws.time_into(rec, fn, flops, rep, times)
        recs.append(rec)
    if dev == "cuda":
        torch.cuda.synchronize()
    for rec in recs:
        name = rec["impl"]
        for ref, key in ((ws.FP8_API, "x_fp8_api"), (RS, "x_rs"), (WG1, "x_wg1"), (CONV, "x_conv")):
            if name in times and ref in times:
                rec[key] = times[ref] / times[name]
        if name == WIDE and name in times:
            for ref, tag in ((CONV, "conv"), (RS, "rs")):
                if ref in times:
                    cmp = ws._compare(calls[name][1], calls[ref][1])
                    rec[f"bit_equal_vs_{tag}"], rec[f"diff_vs_{tag}"] = cmp["bit_equal_vs_base"], cmp["diff_vs_base"]
    return recs


def _line(r: dict) -> str:
    if "error" in r:
        return ws._line(r)
    extra = "".join(f" {key}={r[key]:.3f}" for key in ("x_rs", "x_wg1", "x_conv") if key in r)
    extra += "".join(f" {key}={r[key]}" for key in ("bit_equal_vs_conv", "kernel_ran") if key in r)
    extra += f" diff_vs_rs={r['diff_vs_rs']:.1e} prep_ms={r['prep_ms']:.0f}" if "diff_vs_rs" in r else ""
    return (f"{r['weights']} tpe={r['tpe']} {r['impl']:>17}: {r['median_us']:9.1f} us {r['tflops']:7.1f} TFLOPS "
            f"x_fp8_api={r.get('x_fp8_api', 0):.3f}{extra}")  # fmt: skip


def table(path: str) -> str:
    """Markdown table of a saved run."""
    recs = json.load(open(path))["records"]  # noqa: SIM115
    head = "| weights | tpe | impl | us | TFLOPS | x FP8 API | x rs | x wg1 | x conv | bit-equal conv |"
    rows = [head, "|---" * 10 + "|"]
    for r in recs:
        if "error" in r:
            rows.append(f"| {r['weights']} | {r['tpe']} | {r['impl']} | error: {r['error'][:60]} | | | | | | |")
            continue
        xs = " | ".join(f"{r[key]:.2f}" if key in r else "" for key in ("x_fp8_api", "x_rs", "x_wg1", "x_conv"))
        head = f"| {r['weights']} | {r['tpe']} | {r['impl']} | {r['median_us']:.1f} | {r['tflops']:.1f}"
        rows.append(f"{head} | {xs} | {r.get('bit_equal_vs_conv', '')} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    cli = ws.parse_cli(__doc__, "bench_dg_w4a8_wide.json", table, argv)
    if cli is None:
        return
    ws.sweep(*cli, run_case, _line, META, ws.TPES, BUDGET_S)


if __name__ == "__main__":
    main()
