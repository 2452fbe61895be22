"""Dense FP8 section of the deep_gemm benchmark alone (issue 6): CUTLASS vs Triton vs torch._scaled_mm.

    python packages/deep_gemm/benchmarks/bench_fp8_dense.py --out RESULT.json   # H200, ~30-60 s
    python packages/deep_gemm/benchmarks/bench_fp8_dense.py --smoke             # tiny shape on CPU (interpreter)
    python packages/deep_gemm/benchmarks/bench_fp8_dense.py --table RESULT.json # markdown table

The same cases, timing and record format as `bench_deep_gemm.py` (whose run covers these last, after the W4A16
sweep, under a 90 s budget): this script runs only `bench_cases.dense_fp8_cases`, so the CUTLASS rows are
measured even when the full run's budget runs out first. It adds mid-size m (16, 256, 1024: where the auto
dispatch's thresholds sit) and checks every CUTLASS variant's output against the Triton kernel's
(record key diff_vs_triton, calc_diff; a wrong variant shows ~1e-2..1, a correct one < 1e-5).
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
# Grouped contiguous FP8 (issue 6 stretch goal: >= 1100 TFLOPS at 1024 tokens per expert): (tokens per expert,
# experts) x the expert (n, k) shapes.
GROUPED_TPE = [(1024, 8), (256, 32)]


def grouped_cases(dev: str, tpes: list[tuple[int, int]], nks: dict[str, tuple[int, int]]) -> list[bc.Case]:
    """m_grouped_fp8_gemm_nt_contiguous: CUTLASS grouped kernel vs the Triton grouped kernel vs a per-expert
    torch._scaled_mm loop (row-wise scales), uniform tokens per expert (128-aligned: no padding rows)."""
    from deepinfer.deep_gemm.backends.cuda import cutlass_fp8_grouped as cg

    cases = []
    for name, (n, k) in nks.items():
        for tpe, g in tpes:
            rows = tpe * g
            a = (torch.randn(rows, k, device=dev) * 4).to(bc.FP8)
            sfa = torch.rand(rows, k // 128, device=dev) + 0.5
            w = (torch.randn(g, n, k, device=dev) * 4).to(bc.FP8)
            sfb = torch.rand(g, -(-n // 128), k // 128, device=dev) + 0.5
            ids = torch.arange(g, device=dev, dtype=torch.int32).repeat_interleave(tpe)
            out = torch.empty(rows, n, device=dev, dtype=torch.bfloat16)
            impls = {}
            if dev == "cuda" and cg.available():
                impls["dg_fp8_grouped_cutlass"] = lambda a=a, s=sfa, w=w, sb=sfb, o=out, i=ids: (
                    cg.m_grouped_fp8_gemm_nt_contiguous_cutlass(a, s, w, sb, o, i)
                )
            if dev == "cuda":
                from deepinfer.deep_gemm.backends.cuda import triton_fp8_grouped as fg

                o2 = torch.empty_like(out)
                impls["dg_fp8_grouped_triton"] = lambda a=a, s=sfa, w=w, sb=sfb, o=o2, i=ids, t=tpe: (
                    fg.m_grouped_fp8_contiguous_triton(a, s, w, sb, o, i, expected_m=t)
                )
            sa_row, sw_row = torch.rand(rows, 1, device=dev) + 0.5, torch.rand(g, 1, n, device=dev) + 0.5
            impls["torch_scaled_mm_loop_fp8"] = bc._scaled_mm_loop(a, sa_row, w, sw_row, [tpe] * g)
            nbytes = rows * k + g * n * k + 2 * rows * n
            shape = {"layout": f"tpe{tpe}x{g}", "weights": name, "m": rows, "n": n, "k": k}
            cases.append(bc.Case("m_grouped_fp8_gemm_nt_contiguous", shape, impls, 2.0 * rows * n * k, nbytes,
                                 "fp8_tflops", compare_to=("dg_fp8_grouped_triton",)))  # fmt: skip
    return cases


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


def run(out_path: str | None, smoke: bool, warmup: int, rep: int) -> list[dict]:
    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    t0 = time.monotonic()
    ms, nks = ([3], [(64, 256)]) if smoke else (MS, bc.DENSE_NK)
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
            _check_vs_triton(case, recs)
            records += recs
            for r in recs:
                what = r["error"] or f"{r['median_us']:9.1f} us {r['tflops']:7.1f} TFLOPS"
                if "diff_vs_triton" in r:
                    what += f" diff {r['diff_vs_triton']:.1e}"
                full.log(f"[{time.monotonic() - t0:6.1f}s] {full._shape_str(case.shape)} {r['impl']}: {what}")
        if out_path:
            write_results_json(out_path, records, meta)
    records += _run_grouped(dev, warmup, rep, t0, smoke)
    meta["elapsed_s"] = time.monotonic() - t0
    if out_path:
        write_results_json(out_path, records, meta)
    full.log(f"done in {meta['elapsed_s']:.1f} s")
    return records


def _run_grouped(dev: str, warmup: int, rep: int, t0: float, smoke: bool) -> list[dict]:
    """Time the grouped contiguous cases (smoke: one tiny case); an error becomes a record."""
    try:
        cases = (
            grouped_cases(dev, [(128, 2)], {"tiny": (64, 256)})
            if smoke
            else grouped_cases(dev, GROUPED_TPE, bc.EXPERT_NK)
        )
    except Exception as exc:  # noqa: BLE001
        return [{"op": "setup grouped", "impl": None, "error": f"{type(exc).__name__}: {exc}"[:500]}]
    records = []
    for case in cases:
        recs = full._time_case(case, warmup, rep)
        records += recs
        for r in recs:
            what = r["error"] or f"{r['median_us']:9.1f} us {r['tflops']:7.1f} TFLOPS"
            full.log(f"[{time.monotonic() - t0:6.1f}s] {full._shape_str(case.shape)} {r['impl']}: {what}")
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
