"""W4A8 grouped GEMM, warp-specialised kernel (cuda_ws*) side by side with today's CUDA kernels and the FP8 API.

Issue 6 goal: FP4 experts >= 0.85x the FP8-expert grouped API where compute-bound. Cases: 256 experts, 64 / 256 /
1,024 tokens per expert (uniform), (n, k) = (4096, 4096) gate+up and (4096, 2048) down. Rows per case: the FP8
grouped API (`m_grouped_fp8_gemm_nt_contiguous` on FP8 weights: the goal's baseline), `cuda_wg2s4` / `cuda_wg1s4`
(the session-6 default by rows per group) and every warp-specialised variant, all through the W4A8 API's impl=.
Every W4A8 row records bit_equal / calc_diff vs cuda_wg2s4's output (the ws kernels have the same numerics).

    python packages/deep_gemm/benchmarks/bench_dg_w4a8_ws.py --out RESULT.json   # H200, < 120 s
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_ws.py --smoke             # CPU, tiny (reference path)
    python packages/deep_gemm/benchmarks/bench_dg_w4a8_ws.py --table RESULT.json # markdown table
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--smoke" in sys.argv:  # before triton is imported: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_deep_gemm as full  # noqa: E402,F401  (puts this checkout's src/ first on sys.path)
import torch  # noqa: E402

from deepinfer import deep_gemm as dg  # noqa: E402
from deepinfer.deep_gemm import api_w4a8  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_grouped as cw  # noqa: E402
from kernelkit import bench_cuda, write_results_json  # noqa: E402
from kernelkit.numerics import calc_diff  # noqa: E402

FP8 = torch.float8_e4m3fn
SHAPES = {"gate_up": (4096, 4096), "down": (4096, 2048)}
TPES = (64, 256, 1024)
EXPERTS = 256
FP8_API = "fp8_grouped_api"
BASE = "cuda_wg2s4"  # today's default from 256 rows per group (cuda_wg1s4 below)
IMPLS = ("cuda_wg2s4", "cuda_wg1s4", *(cw.variant_name(v) for v in cw.WS_VARIANTS))
FP8_CEIL_TFLOPS = 1260.0  # ../shared/reference/h200-ceilings.md (FP8 dense, lower bound)
BUDGET_S = 100.0  # no new case past this


def _fp8_bytes(shape: tuple[int, ...], dev: str) -> torch.Tensor:
    """Random finite e4m3 values (|x| <= 240: bit 4 of every byte cleared, so never the NaN byte 0x7f / 0xff)."""
    return (torch.randint(0, 256, shape, device=dev, dtype=torch.uint8) & 0xEF).view(FP8)


def _operands(tpe: int, n: int, k: int, g: int, dev: str) -> dict:
    m = tpe * g
    counts = torch.full((g,), tpe, dtype=torch.int64)
    return {
        "a": _fp8_bytes((m, k), dev),
        "sfa": torch.rand(m, k // 128, device=dev) + 0.5,
        "packed": torch.randint(0, 256, (g, n, k // 2), device=dev, dtype=torch.uint8),
        "scales": torch.randint(118, 128, (g, n, k // 32), device=dev, dtype=torch.uint8),
        "offs": counts.cumsum(0).to(torch.int32).to(dev),
        "ids": torch.arange(g, dtype=torch.int32).repeat_interleave(counts).to(dev),
        "m": m,
    }


def _calls(op: dict, n: int, k: int, g: int, dev: str, fp8_w: torch.Tensor, fp8_sfb: torch.Tensor) -> dict:
    """{row name: (callable, output tensor)}; the W4A8 rows each own an output (compared after timing)."""
    gemm = api_w4a8.m_grouped_fp8_fp4_gemm_nt_offsets
    calls = {}
    out8 = torch.empty(op["m"], n, device=dev, dtype=torch.bfloat16)
    calls[FP8_API] = (lambda: dg.m_grouped_fp8_gemm_nt_contiguous((op["a"], op["sfa"]), (fp8_w, fp8_sfb), out8,
                                                                  op["ids"]), out8)  # fmt: skip
    for name in IMPLS:
        out = torch.empty(op["m"], n, device=dev, dtype=torch.bfloat16)

        def run(name: str = name, out: torch.Tensor = out) -> object:
            return gemm((op["a"], op["sfa"]), (op["packed"], op["scales"]), op["offs"], out, impl=name)

        calls[name] = (run, out)
    return calls


def _compare(out: torch.Tensor, base: torch.Tensor | None) -> dict:
    if base is None:
        return {}
    rows = slice(None, None, 7) if out.numel() > (1 << 27) else slice(None)  # bound calc_diff's float64 copies
    return {"bit_equal_vs_base": bool(torch.equal(out.view(torch.int16), base.view(torch.int16))),
            "diff_vs_base": float(calc_diff(out[rows].double(), base[rows].double()))}  # fmt: skip


def time_into(rec: dict, fn, flops: float, rep: int, times: dict) -> None:  # noqa: ANN001
    """Time fn into rec (median / p10 / p90 us, TFLOPS, % of the FP8 ceiling) and times[rec["impl"]], or record the
    error and go on (one failing impl must not lose the others). Shared by the W4A8 and fp8_db benchmarks."""
    try:
        t = bench_cuda(fn, rep=rep, warmup=3)
        times[rec["impl"]] = t["median_us"]
        rec.update(median_us=t["median_us"], p10=t["p10"], p90=t["p90"], timer=t["timer"],
                   tflops=flops / t["median_us"] * 1e-6)  # fmt: skip
        rec["pct_fp8_ceiling"] = 100.0 * rec["tflops"] / FP8_CEIL_TFLOPS
    except Exception as exc:  # noqa: BLE001 - record and go on
        rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"


def run_case(wname: str, n: int, k: int, tpe: int, g: int, dev: str, rep: int, fp8: tuple) -> list[dict]:
    op = _operands(tpe, n, k, g, dev)
    flops = 2.0 * op["m"] * n * k
    built = {cw.variant_name(v) for v in cw.compiled_variants()}
    recs, times = [], {}
    calls = _calls(op, n, k, g, dev, *fp8)
    for name, (fn, _) in calls.items():
        rec = {"op": "m_grouped_fp8_fp4_gemm_nt_offsets", "weights": wname, "tpe": tpe, "groups": g, "m": op["m"],
               "n": n, "k": k, "impl": name}  # fmt: skip
        if name != FP8_API and name not in built:
            rec["note"] = "not built: the API ran Triton"
        time_into(rec, fn, flops, rep, times)
        recs.append(rec)
    outs = {}  # each W4A8 row's own output (written by its timed calls); compared with cuda_wg2s4's
    for name in IMPLS:
        if name in times:
            outs[name] = calls[name][1]
    if dev == "cuda":
        torch.cuda.synchronize()
    for rec in recs:
        name = rec["impl"]
        if name in times:
            for ref_name, key in ((FP8_API, "x_fp8_api"), (BASE, "x_wg2s4"), ("cuda_wg1s4", "x_wg1s4")):
                if ref_name in times:
                    rec[key] = times[ref_name] / times[name]
        if name in outs:
            rec.update(_compare(outs[name], outs.get(BASE)))
    return recs


def _line(r: dict, base_key: str = "x_wg2s4") -> str:
    """One printed record: time, TFLOPS, x the FP8 API, x the base row (base_key), bit-equality with the base."""
    if "error" in r:
        return f"{r['weights']} tpe={r['tpe']} {r['impl']}: ERROR {r['error']}"
    extra = f" bit_eq={r['bit_equal_vs_base']} diff={r['diff_vs_base']:.1e}" if "diff_vs_base" in r else ""
    return (f"{r['weights']} tpe={r['tpe']} {r['impl']:>17}: {r['median_us']:9.1f} us {r['tflops']:7.1f} TFLOPS "
            f"x_fp8_api={r.get('x_fp8_api', 0):.3f} {base_key}={r.get(base_key, 0):.3f}{extra}")  # fmt: skip


def table(path: str, keys: tuple[str, ...] = ("x_fp8_api", "x_wg2s4", "x_wg1s4"), base: str = "wg2s4") -> str:
    """Markdown table of a saved run: one column per ratio key, then bit-equality with the base row."""
    recs = json.load(open(path))["records"]  # noqa: SIM115
    heads = " | ".join("x FP8 API" if key == "x_fp8_api" else key.replace("_", " ") for key in keys)
    rows = [f"| weights | tpe | impl | us | TFLOPS | {heads} | bit-equal {base} |", "|---" * (len(keys) + 6) + "|"]
    for r in recs:
        if "error" in r:
            rows.append(
                f"| {r['weights']} | {r['tpe']} | {r['impl']} | error: {r['error'][:60]} |" + " |" * (len(keys) + 2)
            )
            continue
        xs = " | ".join(f"{r[key]:.2f}" if key in r else "" for key in keys)
        head = f"| {r['weights']} | {r['tpe']} | {r['impl']} | {r['median_us']:.1f} | {r['tflops']:.1f}"
        rows.append(f"{head} | {xs} | {r.get('bit_equal_vs_base', '')} |")
    return "\n".join(rows)


def parse_cli(doc: str, out: str, table_fn, argv: list[str] | None,  # noqa: ANN001
              smoke_help: str = "tiny shapes on CPU (the API's reference path)") -> tuple | None:  # fmt: skip
    """The W4A8 benchmarks' command line (--out / --smoke / --table): None after printing a table, else (args, device);
    exits when there is no CUDA device and no --smoke."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", default=out, help="result JSON")
    p.add_argument("--smoke", action="store_true", help=smoke_help)
    p.add_argument("--table", metavar="JSON", help="print the markdown table of a saved run and exit")
    args = p.parse_args(argv)
    if args.table:
        print(table_fn(args.table))
        return None
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke for the CPU check")
    return args, "cpu" if args.smoke else "cuda"


def sweep(args, dev: str, run_case, line, meta: dict, tpes: tuple[int, ...], budget_s: float) -> list[dict]:  # noqa: ANN001
    """The W4A8 benchmarks' case loop: every (weights, tokens per expert) case of SHAPES x tpes (tiny ones with
    --smoke) through run_case(wname, n, k, tpe, g, dev, rep, fp8), each record printed with line(r) and the JSON
    rewritten after every case; a case that raises (e.g. out of memory) or starts past budget_s is an error record."""
    shapes = {"smoke": (256, 256)} if args.smoke else SHAPES
    tpes, g = ((3, 8) if args.smoke else tpes), (2 if args.smoke else EXPERTS)
    start, recs = time.monotonic(), []
    for wname, (n, k) in shapes.items():
        fp8 = (_fp8_bytes((g, n, k), dev), torch.rand(g, n // 128, k // 128, device=dev) + 0.5)
        for tpe in tpes:
            if time.monotonic() - start > budget_s:
                print(f"budget: skipping {wname} tpe={tpe}", flush=True)
                recs.append({"weights": wname, "tpe": tpe, "impl": "*", "error": "skipped: time budget"})
                continue
            rep = 3 if args.smoke else (20 if tpe >= 1024 else 40)
            try:
                case = run_case(wname, n, k, tpe, g, dev, rep, fp8)
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory: record and go on
                case = [{"weights": wname, "tpe": tpe, "impl": "*", "error": f"{type(exc).__name__}: {str(exc)[:300]}"}]
            for r in case:
                print(line(r), flush=True)
                recs.append(r)
            write_results_json(args.out, recs, meta)  # partial results
        del fp8
        if dev == "cuda":
            torch.cuda.empty_cache()
    write_results_json(args.out, recs, {**meta, "seconds": time.monotonic() - start})
    print(f"wrote {args.out} ({len(recs)} records, {time.monotonic() - start:.0f} s)", flush=True)
    return recs


def main(argv: list[str] | None = None) -> None:
    cli = parse_cli(__doc__, "bench_dg_w4a8_ws.json", table, argv)
    if cli is None:
        return
    args, dev = cli
    sweep(args, dev, run_case, _line, {"package": "deep_gemm", "bench": "w4a8_ws"}, TPES, BUDGET_S)


if __name__ == "__main__":
    main()
