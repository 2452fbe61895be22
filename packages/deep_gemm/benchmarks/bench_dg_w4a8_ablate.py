"""W4A8 rs kernel DIAGNOSTIC ablations: where does `cuda_rs2s4n256`'s time go? (issue 6; timing only)

Session 8: `cuda_rs2s4n256` runs ~0.55x the FP8 grouped API at 1,024 tokens per expert, and cutting ~25 % of the
consumers' instructions gained 0-1 % (not issue-bound). Each ablation build (backends/cuda/cuda_w4a8_rs_ablate.py,
csrc/cuda/dg_w4a8_rs.cuh kAblate) removes one part of the consumers' work; their outputs are WRONG and not compared.
Rows per case (256 experts x 1,024 tokens, gate+up (n, k) = (4096, 4096) and down (4096, 2048)): the FP8 grouped
API (the goal's baseline), `cuda_rs2s4n256` through the W4A8 API and launched directly (rs2s4n256_direct), then
abl_A_noconv (no FP4 -> e4m3 conversion), abl_B_nopromo (no promotion), abl_C_nowgmma (no wgmma), abl_D_prodonly
(the producer's feed alone), abl_E_mmafeed (A + B: wgmma + feed only), abl_F_nostore (no epilogue stores),
abl_G_noffma (no promotion FFMAs but tmp and the per-half waits kept: B - G = the drain between the halves).
Every row: TFLOPS-equivalent (the GEMM's FLOP count / time), x_fp8_api, x_rs2s4n256.

    python packages/deep_gemm/benchmarks/bench_dg_w4a8_ablate.py --out RESULT.json   # H200, < 60 s
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_ablate.py --smoke             # CPU, tiny (no ablation rows)
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_ablate.py --table RESULT.json # markdown table
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

from deepinfer import deep_gemm as dg  # noqa: E402
from deepinfer.deep_gemm import api_w4a8  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_grouped as cw  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_rs_ablate as abl  # noqa: E402
from kernelkit import bench_cuda, write_results_json  # noqa: E402

BASE = "cuda_rs2s4n256"
DIRECT = "rs2s4n256_direct"
FP8_API = ws.FP8_API
TPE = 1024
META = {"package": "deep_gemm", "bench": "w4a8_rs_ablate"}


def _calls(op: dict, n: int, fp8_w: torch.Tensor, fp8_sfb: torch.Tensor, dev: str) -> dict:
    """{row: callable}: the FP8 API, BASE through the W4A8 API, every ablation (one shared, wrong output)."""
    out8 = torch.empty(op["m"], n, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(out8)
    calls = {
        FP8_API: lambda: dg.m_grouped_fp8_gemm_nt_contiguous((op["a"], op["sfa"]), (fp8_w, fp8_sfb), out8, op["ids"]),
        BASE: lambda: api_w4a8.m_grouped_fp8_fp4_gemm_nt_offsets(
            (op["a"], op["sfa"]), (op["packed"], op["scales"]), op["offs"], out, impl=BASE
        ),
    }
    if dev == "cuda":  # the same kernel launched as the ablations are (no API layer): rules out a call-path difference
        calls[DIRECT] = lambda: cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(
            op["a"], op["sfa"], op["packed"], op["scales"], op["offs"], out, cw.parse_variant(BASE)
        )
    for name in abl.ABLATIONS:

        def run(name: str = name) -> object:
            return abl.run_ablation(name, op["a"], op["sfa"], op["packed"], op["scales"], op["offs"], out)

        calls[name] = run
    return calls


def run_case(wname: str, n: int, k: int, tpe: int, g: int, dev: str, rep: int) -> list[dict]:
    """Time every row on one set of operands; x_* = the reference row's time / this row's time."""
    op = ws._operands(tpe, n, k, g, dev)
    fp8 = (ws._fp8_bytes((g, n, k), dev), torch.rand(g, n // 128, k // 128, device=dev) + 0.5)
    flops = 2.0 * op["m"] * n * k
    recs, times = [], {}
    for name, fn in _calls(op, n, *fp8, dev).items():
        rec = {"op": "w4a8_rs_ablate", "weights": wname, "tpe": tpe, "groups": g, "m": op["m"], "n": n, "k": k,
               "impl": name, "ablation_mask": abl.ABLATIONS.get(name, 0)}  # fmt: skip
        if name == BASE and cw.parse_variant(BASE) not in cw.compiled_variants():
            rec["note"] = "not built: the API ran Triton"
        if name in abl.ABLATIONS and not abl.available():
            rec["error"] = "ablation builds not compiled (DEEPINFER_DEVICE=cuda build of this tree needed)"
            recs.append(rec)
            continue
        try:
            t = bench_cuda(fn, rep=rep, warmup=3)
            times[name] = t["median_us"]
            rec.update(median_us=t["median_us"], p10=t["p10"], p90=t["p90"], timer=t["timer"],
                       tflops_equiv=flops / t["median_us"] * 1e-6)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - record and go on
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        recs.append(rec)
    for rec in recs:
        if rec["impl"] in times:
            for ref, key in ((FP8_API, "x_fp8_api"), (BASE, "x_rs2s4n256")):
                if ref in times:
                    rec[key] = times[ref] / times[rec["impl"]]
    return recs


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['weights']} tpe={r['tpe']} {r['impl']}: ERROR {r['error']}"
    return (f"{r['weights']} tpe={r['tpe']} {r['impl']:>16}: {r['median_us']:9.1f} us {r['tflops_equiv']:7.1f} "
            f"TFLOPS-eq x_fp8_api={r.get('x_fp8_api', 0):.3f} x_rs2s4n256={r.get('x_rs2s4n256', 0):.3f}")  # fmt: skip


def table(path: str) -> str:
    recs = json.load(open(path))["records"]  # noqa: SIM115
    rows = ["| weights | tpe | row | us | TFLOPS-eq | x FP8 API | x rs2s4n256 |", "|---|---|---|---|---|---|---|"]
    for r in recs:
        if "error" in r:
            rows.append(f"| {r['weights']} | {r['tpe']} | {r['impl']} | error: {r['error'][:60]} | | | |")
            continue
        xs = " | ".join(f"{r[key]:.2f}" if key in r else "" for key in ("x_fp8_api", "x_rs2s4n256"))
        rows.append(
            f"| {r['weights']} | {r['tpe']} | {r['impl']} | {r['median_us']:.1f} | {r['tflops_equiv']:.1f} | {xs} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    cli = ws.parse_cli(
        __doc__,
        "bench_dg_w4a8_ablate.json",
        table,
        argv,
        smoke_help="tiny shapes on CPU (reference path; ablation rows: error)",
    )
    if cli is None:
        return
    args, dev = cli
    shapes = {"smoke": (256, 256)} if args.smoke else ws.SHAPES
    tpe, g, rep = (8, 2, 3) if args.smoke else (TPE, ws.EXPERTS, 20)
    start, recs = time.monotonic(), []
    for wname, (n, k) in shapes.items():
        try:
            case = run_case(wname, n, k, tpe, g, dev, rep)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: record and go on
            case = [{"weights": wname, "tpe": tpe, "impl": "*", "error": f"{type(exc).__name__}: {str(exc)[:300]}"}]
        for r in case:
            print(_line(r), flush=True)
            recs.append(r)
        write_results_json(args.out, recs, META)  # partial results
        if dev == "cuda":
            torch.cuda.empty_cache()
    write_results_json(args.out, recs, {**META, "seconds": time.monotonic() - start})
    print(f"wrote {args.out} ({len(recs)} records, {time.monotonic() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
