"""Session 10: the 256x128x128 CUTLASS FP8 tile configs side by side with the API default, fp8_db_t4 and cuBLAS.

Dense (`fp8_gemm_nt`): m 4096 / 16384 x (n, k) in {(4096, 8192), (2048, 4096), (32768, 1024), (8192, 1024)}; rows:
`api` (dg.fp8_gemm_nt: CUTLASS config 0 at these m), `cutlass_c6` / `cutlass_c7` (256x128x128 cooperative, cluster
1x1 / 1x2, K-major A scales: csrc/cuda/cutlass/fp8_gemm_coop_k_256*.cu), `fp8_db_t4` (the TMA fp8_db kernel as one
group) and `torch_scaled_mm_rowwise` (cuBLAS, row-wise scales: another scaling, the throughput reference).
Grouped (`m_grouped_fp8_gemm_nt_contiguous`): 64 experts x 256 / 1024 tokens per expert x (n, k) = (4096, 4096) and
(4096, 2048); rows: `api` (CUTLASS grouped, auto config), `cutlass_g5` / `cutlass_g6` (256x128x128, cluster 1x1 / 1x2)
and `fp8_db_t4`. Every row: TFLOPS, % of the FP8 ceiling, x_api and x_cublas from the same run, calc_diff vs the fp32
reference (`diff_vs_ref`, every 7th row for outputs over 64 Mi elements) and `bits_eq_api`.
Then a second pass ("pass": "mc") over the same cases: `api`, `fp8_db_t4` and `fp8_db_m4` (fp8_db with B multicast
across 2-CTA clusters, csrc/cuda/dg_fp8_db_mc.cuh: a new mbarrier protocol, hence last: a watchdog trap there cannot
lose the first pass's records) with x_api, x_t4 and bits_eq_t4 (must be True). `--no-mc` skips it.

    python packages/deep_gemm/benchmarks/bench_dg_s10.py --out RESULT.json   # H200, < 90 s
    python packages/deep_gemm/benchmarks/bench_dg_s10.py --smoke             # CPU, tiny (API + reference)
    python packages/deep_gemm/benchmarks/bench_dg_s10.py --table RESULT.json # markdown table
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
import bench_dg_fp8_db as fdb  # noqa: E402  (puts this checkout's src/ first on sys.path)
import torch  # noqa: E402

from deepinfer import deep_gemm as dg  # noqa: E402
from deepinfer.deep_gemm import reference as ref  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cuda_fp8_db as db  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cutlass_fp8 as cf  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cutlass_fp8_grouped as cg  # noqa: E402
from kernelkit import bench_cuda, write_results_json  # noqa: E402
from kernelkit.numerics import calc_diff  # noqa: E402

DENSE_MS = (4096, 16384)
DENSE_NK = ((4096, 8192), (2048, 4096), (32768, 1024), (8192, 1024))
GROUPED = {"gate_up": (4096, 4096), "down": (4096, 2048)}
TPES = (256, 1024)
EXPERTS = 64
DENSE_NEW = {"cutlass_c6": 6, "cutlass_c7": 7}
GROUPED_NEW = {"cutlass_g5": 5, "cutlass_g6": 6}
API, CUBLAS, DB, MC = "api", fdb.CUBLAS, "fp8_db_t4", "fp8_db_m4"
BUDGET_S = 70.0  # first pass (seconds since start); then the mc pass until MC_BUDGET_S
MC_BUDGET_S = 105.0


def _db_t4(a, sfa, b3, sfb3, offs, m: int, n: int, dev: str, mc: bool = False) -> dict:  # noqa: ANN001
    """{"fp8_db_t4": (callable, out)} when `_C` has the TMA fp8_db with 4 stages (mc: also "fp8_db_m4", the B
    multicast kernel, when built), else {}."""
    impls = {}
    for name, key in ((DB, (4, 0, 1)), (MC, (4, 0, 2))) if mc else ((DB, (4, 0, 1)),):
        if dev != "cuda" or key not in db.compiled_variants():
            continue
        out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        impls[name] = (lambda o=out, c=key[2] == 2: db.m_grouped_fp8_gemm_nt_offsets_db(
            a, sfa, b3, sfb3, offs, o, stages=4, tma=True, multicast=c), out)  # fmt: skip
    return impls


def _time(case: dict, impls: dict, flops: float, want: torch.Tensor | None, rep: int) -> list[dict]:
    """Time every impl (errors recorded, not raised); then x_api / x_cublas, diff_vs_ref and bits_eq_api."""
    recs, times = [], {}
    for name, (fn, _) in impls.items():
        rec = {**case, "impl": name}
        try:
            t = bench_cuda(fn, rep=rep, warmup=3)
            times[name] = t["median_us"]
            rec.update(median_us=t["median_us"], p10=t["p10"], p90=t["p90"], timer=t["timer"],
                       tflops=flops / t["median_us"] * 1e-6)  # fmt: skip
            rec["pct_fp8_ceiling"] = 100.0 * rec["tflops"] / fdb.FP8_CEIL_TFLOPS
        except Exception as exc:  # noqa: BLE001 - record and go on
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        recs.append(rec)
    for rec in recs:
        if rec["impl"] in times:
            _compare(rec, impls, times, want)
    return recs


def _compare(rec: dict, impls: dict, times: dict, want: torch.Tensor | None) -> None:
    """x_api / x_cublas / x_t4 from the same run's times; diff_vs_ref; bits_eq_api (bits_eq_t4 for fp8_db_m4)."""
    name, out = rec["impl"], impls[rec["impl"]][1]
    for key, base in (("x_api", API), ("x_cublas", CUBLAS), ("x_t4", DB)):
        if base in times and (key != "x_t4" or name == MC):
            rec[key] = times[base] / times[name]
    if out is None:
        return
    rows = slice(None, None, 7) if out.numel() > (1 << 26) else slice(None)  # bound the float64 copies
    if want is not None:
        rec["diff_vs_ref"] = float(calc_diff(out[rows], want[rows]))
    for key, base in (("bits_eq_api", API), ("bits_eq_t4", DB)):
        if base in times and name != base and (key != "bits_eq_t4" or name == MC):
            rec[key] = bool(torch.equal(out.view(torch.int16), impls[base][1].view(torch.int16)))


def _cutlass_dense(a, sfa, b, sfb, m: int, n: int, dev: str) -> dict:  # noqa: ANN001
    if dev != "cuda" or cf.built_configs() < len(cf.CONFIGS):
        return {}
    impls = {}
    for name, cfg in DENSE_NEW.items():
        out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        impls[name] = (lambda o=out, c=cfg: cf.fp8_gemm_nt_cutlass(a, sfa, b, sfb, o, config=c), out)
    return impls


def dense_case(m: int, n: int, k: int, dev: str, rep: int, mc: bool = False) -> list[dict]:
    """First pass: API, the new CUTLASS configs, fp8_db_t4, cuBLAS (+ the reference); mc: API, t4, m4."""
    a, sfa = fdb._fp8((m, k), dev), torch.rand(m, k // 128, device=dev) + 0.5
    b, sfb = fdb._fp8((n, k), dev), torch.rand(n // 128, k // 128, device=dev) + 0.5
    api_out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    impls = {API: (lambda: dg.fp8_gemm_nt((a, sfa), (b, sfb), api_out), api_out)}
    offs = torch.full((1,), m, dtype=torch.int32, device=dev)
    if mc:
        impls.update(_db_t4(a, sfa, b[None], sfb[None], offs, m, n, dev, mc=True))
        return _time({"op": "fp8_gemm_nt", "m": m, "n": n, "k": k, "pass": "mc"}, impls, 2.0 * m * n * k, None, rep)
    impls.update(_cutlass_dense(a, sfa, b, sfb, m, n, dev))
    impls.update(_db_t4(a, sfa, b[None], sfb[None], offs, m, n, dev))
    if dev == "cuda":
        sa_row, sb_row = torch.rand(m, 1, device=dev) + 0.5, torch.rand(1, n, device=dev) + 0.5
        impls[CUBLAS] = (lambda: torch._scaled_mm(a, b.t(), scale_a=sa_row, scale_b=sb_row,
                                                  out_dtype=torch.bfloat16), None)  # fmt: skip
    want = ref.fp8_gemm_nt(a, sfa, b, sfb, torch.empty(m, n, device=dev))
    recs = _time({"op": "fp8_gemm_nt", "m": m, "n": n, "k": k}, impls, 2.0 * m * n * k, want, rep)
    del want
    return recs


def grouped_case(wname: str, n: int, k: int, tpe: int, g: int, w: tuple, dev: str, rep: int, mc: bool = False):
    """First pass: API, the new CUTLASS grouped configs, fp8_db_t4 (+ the reference); mc: API, t4, m4."""
    m = tpe * g
    counts = torch.full((g,), tpe, dtype=torch.int64)
    a, sfa = fdb._fp8((m, k), dev), torch.rand(m, k // 128, device=dev) + 0.5
    offs = counts.cumsum(0).to(torch.int32).to(dev)
    ids = torch.arange(g, dtype=torch.int32).repeat_interleave(counts).to(dev)
    api_out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    impls = {API: (lambda: dg.m_grouped_fp8_gemm_nt_contiguous((a, sfa), w, api_out, ids), api_out)}
    case = {"op": "m_grouped_fp8_gemm_nt", "weights": wname, "tpe": tpe, "groups": g, "m": m, "n": n, "k": k}
    if mc:
        impls.update(_db_t4(a, sfa, w[0], w[1], offs, m, n, dev, mc=True))
        return _time({**case, "pass": "mc"}, impls, 2.0 * m * n * k, None, rep)
    if dev == "cuda" and cg.built_configs() >= len(cg.CONFIGS):
        for name, cfg in GROUPED_NEW.items():
            out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            run = lambda o=out, c=cfg: cg.m_grouped_fp8_gemm_nt_contiguous_cutlass(a, sfa, *w, o, ids, config=c)  # noqa: E731
            impls[name] = (run, out)
    impls.update(_db_t4(a, sfa, w[0], w[1], offs, m, n, dev))
    want = ref.m_grouped_fp8_gemm_nt_contiguous(a, sfa, w[0], w[1], torch.empty(m, n, device=dev), ids)
    recs = _time(case, impls, 2.0 * m * n * k, want, rep)
    del want
    return recs


def _line(r: dict) -> str:
    shape = f"m={r.get('m')} n={r.get('n')} k={r.get('k')}" + (f" tpe={r['tpe']}" if "tpe" in r else "")
    if "error" in r:
        return f"{r.get('op')} {shape} {_impl(r)}: ERROR {r['error']}"
    xs = " ".join(f"{key}={r[key]:.2f}" for key in ("x_api", "x_cublas", "x_t4") if key in r)
    diff = f" diff_vs_ref={r['diff_vs_ref']:.1e}" if "diff_vs_ref" in r else ""
    diff += "".join(f" {key}={r[key]}" for key in ("bits_eq_api", "bits_eq_t4") if key in r)
    return f"{r['op']} {shape} {_impl(r)}: {r['median_us']:.1f} us {r['tflops']:.0f} TFLOPS {xs}{diff}"


def _impl(r: dict) -> str:
    return r["impl"] + (" (mc pass)" if r.get("pass") == "mc" else "")


def table(path: str) -> str:
    recs = json.load(open(path))["records"]  # noqa: SIM115
    rows = ["| op | m | n | k | tpe | impl | us | TFLOPS | % FP8 ceiling | x API | x cuBLAS | x t4 | calc_diff vs ref "
            "| bits = API | bits = t4 |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in recs:
        head = f"| {r.get('op', '')} | {r.get('m', '')} | {r.get('n', '')} | {r.get('k', '')} | {r.get('tpe', '')}"
        if "error" in r:
            rows.append(f"{head} | {_impl(r)} | error: {r['error'][:60]} | | | | | | | | |")
            continue
        xs = " | ".join(f"{r[key]:.2f}" if key in r else "" for key in ("x_api", "x_cublas", "x_t4"))
        diff = f"{r['diff_vs_ref']:.1e}" if "diff_vs_ref" in r else ""
        rows.append(f"{head} | {_impl(r)} | {r['median_us']:.1f} | {r['tflops']:.1f} | {r['pct_fp8_ceiling']:.0f} | "
                    f"{xs} | {diff} | {r.get('bits_eq_api', '')} | {r.get('bits_eq_t4', '')} |")  # fmt: skip
    return "\n".join(rows)


def _save(path: str, recs: list[dict], start: float, done: bool) -> None:
    meta = {"package": "deep_gemm", "bench": "dg_s10", "seconds": time.monotonic() - start, "complete": done}
    write_results_json(path, recs, meta)


def _run_all(args: argparse.Namespace, dev: str) -> None:
    dense = [(8, 128, 256)] if args.smoke else [(m, n, k) for n, k in DENSE_NK for m in DENSE_MS]
    grouped = {"smoke": (128, 256)} if args.smoke else GROUPED
    tpes, g, rep = ((4,) if args.smoke else TPES), (2 if args.smoke else EXPERTS), (3 if args.smoke else 20)
    start, recs = time.monotonic(), []

    def emit(rs: list[dict]) -> None:
        for r in rs:
            print(_line(r), flush=True)
            recs.append(r)
        _save(args.out, recs, start, False)

    for mc, budget in ((False, BUDGET_S), (True, MC_BUDGET_S))[: 1 if args.no_mc else 2]:
        for m, n, k in dense:
            if time.monotonic() - start > budget:
                emit([{"op": "fp8_gemm_nt", "m": m, "n": n, "k": k, "impl": "*", "error": "skipped: time budget"}])
                continue
            emit(dense_case(m, n, k, dev, rep, mc))
        for wname, (n, k) in grouped.items():
            w = (fdb._fp8((g, n, k), dev), torch.rand(g, n // 128, k // 128, device=dev) + 0.5)
            for tpe in tpes:
                if time.monotonic() - start > budget:
                    emit([{"op": "m_grouped_fp8_gemm_nt", "weights": wname, "tpe": tpe, "impl": "*",
                           "error": "skipped: time budget"}])  # fmt: skip
                    continue
                emit(grouped_case(wname, n, k, tpe, g, w, dev, rep, mc))
            del w
            if dev == "cuda":
                torch.cuda.empty_cache()
    _save(args.out, recs, start, True)
    print(f"wrote {args.out} ({len(recs)} records, {time.monotonic() - start:.0f} s)", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_dg_s10.json", help="result JSON")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (the API's reference / Triton path)")
    p.add_argument("--table", metavar="JSON", help="print the markdown table of a saved run and exit")
    p.add_argument("--no-mc", action="store_true", help="skip the second pass (fp8_db_m4, the multicast kernel)")
    args = p.parse_args(argv)
    if args.table:
        print(table(args.table))
        return
    dev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if dev == "cpu" and not args.smoke:
        sys.exit("no CUDA device: run with --smoke for the CPU check")
    _run_all(args, dev)


if __name__ == "__main__":
    main()
