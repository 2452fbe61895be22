"""FP8 sections of the deep_gemm benchmark (issue 6): grouped and dense, CUTLASS vs Triton vs torch._scaled_mm.

    python packages/deep_gemm/benchmarks/bench_fp8_dense.py --out RESULT.json   # H200, grouped + dense, < 200 s
    python packages/deep_gemm/benchmarks/bench_fp8_dense.py --section grouped --out RESULT.json  # grouped only
    python packages/deep_gemm/benchmarks/bench_fp8_dense.py --smoke             # tiny shape on CPU (interpreter)
    python packages/deep_gemm/benchmarks/bench_fp8_dense.py --table RESULT.json # markdown table

The same cases, timing and record format as `bench_deep_gemm.py` (whose run covers these last, after the W4A16
sweep, under a 90 s budget): this script runs only `bench_cases.dense_fp8_cases`, so the CUTLASS rows are
measured even when the full run's budget runs out first. It adds mid-size m (16, 256, 1024: where the auto
dispatch's thresholds sit) and checks every CUTLASS variant's output against the Triton kernel's
(record key diff_vs_triton, calc_diff; a wrong variant shows ~1e-2..1, a correct one < 1e-5).

Grouped FP8 (run first): m_grouped_fp8_gemm_nt_contiguous at 8 / 64 / 256 / 1024 tokens per expert over all 256
experts (gate+up 4096 x 4096 and down 4096 x 2048), plus m_grouped_fp8_gemm_nt_masked at 8 / 64: the API default
(`dg_fp8_grouped`), each CUTLASS config (`dg_fp8_grouped_cutlass[<name>]`, + scheduler knobs at >= 256), the
Triton kernel and the per-expert torch._scaled_mm loop; each dg output is checked against the Triton kernel's.
meta["grouped_best"] names the fastest correct kernel per case: the API default follows it (`_dispatch`
FP8_GROUPED_TRITON_MAX_ROWS, `cutlass_fp8_grouped.DEFAULT_CONFIG` / AUTO_CONFIG_BY_ROWS).
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
from kernelkit.numerics import calc_diff  # noqa: E402

MS = sorted(set(bc.DENSE_M) | {16, 256, 1024})
BUDGET_S = 170.0  # no new case past this (the run must finish in < 200 s)


def _sample_rows(t: torch.Tensor) -> torch.Tensor:
    """All rows of a small output, every 7th row of a large one (7 is coprime with the power-of-two tokens per
    expert, so every expert keeps rows in the sample): bounds the float64 copies calc_diff makes."""
    return t if t.numel() <= (1 << 27) else t[::7]


def _check_grouped(case: bc.Case, recs: list[dict]) -> None:
    """Run each dg grouped impl once more into case.out (NaN-filled first) and record calc_diff of its output vs
    the Triton grouped kernel's (record key diff_vs_triton; a wrong variant shows ~1e-2..1, a correct one < 1e-5)."""
    ref_name = "dg_fp8_grouped_triton"
    if ref_name not in case.impls or case.out is None:
        return
    try:
        case.impls[ref_name]()
        want = _sample_rows(case.out).clone()
    except Exception:  # noqa: BLE001 - its timing record already holds the error
        return
    for r in recs:
        if r["impl"].startswith("dg_fp8_grouped") and r["impl"] != ref_name and not r["error"]:
            try:
                case.out.fill_(float("nan"))
                case.impls[r["impl"]]()
                r["diff_vs_triton"] = float(calc_diff(_sample_rows(case.out), want))
            except Exception as exc:  # noqa: BLE001
                r["diff_vs_triton_error"] = f"{type(exc).__name__}: {exc}"[:300]


def _check_vs_triton(case: bc.Case, recs: list[dict]) -> None:
    """Run each CUTLASS variant once more and record calc_diff of its output (case.out) vs the Triton kernel's."""
    if "dg_fp8_triton" not in case.impls or case.out is None:
        return
    try:
        want = case.impls["dg_fp8_triton"]().float()
    except Exception:  # noqa: BLE001 - its timing record already holds the error
        return
    for r in recs:
        if r["impl"].startswith("dg_fp8_cutlass") and not r["error"]:
            try:
                case.out.fill_(float("nan"))
                case.impls[r["impl"]]()
                r["diff_vs_triton"] = float(calc_diff(case.out.float(), want))
            except Exception as exc:  # noqa: BLE001
                r["diff_vs_triton_error"] = f"{type(exc).__name__}: {exc}"[:300]


def run(out_path: str | None, smoke: bool, warmup: int, rep: int, section: str = "all") -> list[dict]:
    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    t0 = time.monotonic()
    ms, nks = ([3], [(64, 256)]) if smoke else (MS, bc.DENSE_NK)
    meta = {"package": "deep_gemm", "section": f"fp8_{section}", "smoke": smoke, "warmup": warmup, "rep": rep}
    records: list[dict] = []
    if section in ("all", "grouped"):  # first: the grouped sweep decides the API default (brief: part G)
        records += _run_grouped(dev, warmup, rep, t0, smoke)
        if out_path:
            write_results_json(out_path, records, meta)
    for n, k in nks if section in ("all", "dense") else []:  # one (n, k) at a time: one shape's weights alive
        if time.monotonic() - t0 > BUDGET_S:
            records.append({"op": "fp8_gemm_nt", "shape": {"n": n, "k": k}, "impl": None, "error": "skipped: budget"})
            continue
        try:
            cases = bc.dense_fp8_cases(dev, ms, [(n, k)])
        except Exception as exc:  # noqa: BLE001 - record and go on
            records.append({"op": "setup", "impl": None, "error": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        for case in cases:
            recs = full._time_case(case, warmup, rep)
            _check_vs_triton(case, recs)
            records += recs
            for r in recs:
                what = r["error"] or f"{r['median_us']:9.1f} us {r['tflops']:7.1f} TFLOPS"
                if "diff_vs_triton" in r:
                    what += f" diff {r['diff_vs_triton']:.1e}"
                full.log(f"[{time.monotonic() - t0:6.1f}s] {full._shape_str(case.shape)} {r['impl']}: {what}")
        if out_path:
            write_results_json(out_path, records, meta)
    meta["grouped_best"] = _best_grouped(records)
    meta["grouped_rule"] = _suggest_rule(records)
    meta["elapsed_s"] = time.monotonic() - t0
    if out_path:
        write_results_json(out_path, records, meta)
    full.log(f"done in {meta['elapsed_s']:.1f} s; fastest grouped impl per case: {meta['grouped_best']}")
    full.log(f"suggested API rule (contiguous, summed over gate+up and down): {meta['grouped_rule']}")
    return records


def _best_grouped(records: list[dict]) -> dict[str, str]:
    """Fastest correct dg grouped impl (API excluded) per (op, layout, weights): what the API default should run."""
    best: dict[str, tuple[float, str]] = {}
    for r in records:
        impl = r.get("impl") or ""
        ok = r.get("median_us") and r.get("diff_vs_triton", 0.0) < 1e-3 and "diff_vs_triton_error" not in r
        if r["op"].startswith("m_grouped_fp8") and impl.startswith("dg_fp8_grouped_") and ok:
            key = f"{r['op'].rsplit('_', 1)[-1]}/{r['shape']['layout']}/{r['shape']['weights']}"
            if key not in best or r["median_us"] < best[key][0]:
                best[key] = (r["median_us"], impl)
    return {k: f"{v[1]} {v[0]:.1f} us" for k, v in best.items()}


def _suggest_rule(records: list[dict]) -> dict:
    """The API settings this run supports, from the contiguous rows (times summed over the expert shapes):
    per tokens-per-expert the fastest plain CUTLASS config (the API cannot pass scheduler knobs) and whether Triton
    beats it; triton_max_rows = the largest tpe up to which Triton wins everywhere (-> _dispatch
    FP8_GROUPED_TRITON_MAX_ROWS), config_by_tpe -> cutlass_fp8_grouped.DEFAULT_CONFIG / AUTO_CONFIG_BY_ROWS."""
    tot: dict[int, dict[str, float]] = {}
    for r in records:
        impl, layout = r.get("impl") or "", (r.get("shape") or {}).get("layout", "")
        plain = impl == "dg_fp8_grouped_triton" or (impl.startswith("dg_fp8_grouped_cutlass[") and "," not in impl)
        ok = r.get("median_us") and r.get("diff_vs_triton", 0.0) < 1e-3
        if r["op"] == "m_grouped_fp8_gemm_nt_contiguous" and layout.startswith("tpe") and plain and ok:
            per = tot.setdefault(int(layout[3:]), {})
            per[impl] = per.get(impl, 0.0) + r["median_us"]
    rule: dict = {"config_by_tpe": {}, "triton_wins": {}, "triton_max_rows": 0}
    for tpe in sorted(tot):
        cut = {k: v for k, v in tot[tpe].items() if k != "dg_fp8_grouped_triton"}
        if not cut:
            continue
        best = min(cut, key=cut.get)
        rule["config_by_tpe"][tpe] = best[best.index("[") + 1 : -1]
        rule["triton_wins"][tpe] = tot[tpe].get("dg_fp8_grouped_triton", float("inf")) < cut[best]
    for tpe, wins in rule["triton_wins"].items():  # sorted by tpe
        if not wins:
            break
        rule["triton_max_rows"] = tpe
    return rule


def _run_grouped(dev: str, warmup: int, rep: int, t0: float, smoke: bool) -> list[dict]:
    """Time the grouped FP8 cases (contiguous at every tokens-per-expert, masked at the decode sizes; smoke: tiny)
    and cross-check every dg impl against the Triton kernel; an error becomes a record."""
    try:
        if smoke:
            cases = bc.fp8_grouped_cases(dev, [8], {"tiny": (64, 256)}, 3, masked_tpes=(8,))
        else:
            cases = bc.fp8_grouped_cases(dev, bc.FP8_GROUPED_TPE, bc.EXPERT_NK, bc.NUM_EXPERTS,
                                         masked_tpes=bc.FP8_GROUPED_MASKED_TPE)  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        return [{"op": "setup grouped", "impl": None, "error": f"{type(exc).__name__}: {exc}"[:500]}]
    records = []
    while cases:
        case = cases.pop(0)  # drop each case's operands once timed
        if time.monotonic() - t0 > BUDGET_S:
            records.append({"op": case.op, "shape": case.shape, "impl": None, "error": "skipped: time budget"})
            continue
        recs = full._time_case(case, warmup, rep)
        _check_grouped(case, recs)
        records += recs
        for r in recs:
            what = r["error"] or f"{r['median_us']:9.1f} us {r['tflops']:7.1f} TFLOPS"
            if "diff_vs_triton" in r:
                what += f" diff {r['diff_vs_triton']:.1e}"
            full.log(f"[{time.monotonic() - t0:6.1f}s] {case.op} {full._shape_str(case.shape)} {r['impl']}: {what}")
        del case
    return records


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the JSON results here")
    p.add_argument("--smoke", action="store_true", help="tiny shape on CPU (Triton interpreter)")
    p.add_argument("--table", metavar="JSON", help="print the markdown table of a saved run and exit")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rep", type=int, default=20)
    p.add_argument("--section", choices=("all", "grouped", "dense"), default="all", help="grouped FP8, dense or both")
    args = p.parse_args(argv)
    if args.table:
        print(full.table(args.table))
        return
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke for the CPU check")
    run(args.out, args.smoke, 1 if args.smoke else args.warmup, 2 if args.smoke else args.rep, args.section)


if __name__ == "__main__":
    main()
