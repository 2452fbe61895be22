"""FP8 block-scaled GEMM with double-buffered promotion (fp8_db) side by side with the FP8 API and cuBLAS (issue 6).

Dense: m 4096 / 16384 x (n, k) in the issue's set with n % 128 == 0; rows: the API's `fp8_gemm_nt` (since session 12
fp8_wide on the shapes `cuda_fp8_db.wide_rule` names, CUTLASS elsewhere), `api_cutlass` (the API forced to its
CUTLASS kernel, DEEPINFER_DEEP_GEMM_FP8_DENSE=cutlass: the pre-session-12 default; x_api_cutlass), `fp8_db_s5` / `fp8_db_s4` / `fp8_db_s5_stagger` (backends/cuda/cuda_fp8_db.py: ring depth
5 / 4; consumer warpgroup 1 started ~1 us late), `fp8_db_t5` / `fp8_db_t4` (the TMA producer, tma=True; session 9,
first GPU run), `fp8_wide_t4` / `fp8_wide_t3` (128 x 256 tiles, wide=True; session 12: n % 256 == 0 cases only) and `torch._scaled_mm` with row-wise scales (cuBLAS; another scaling, the throughput reference).
Grouped: 256 experts x 256 / 1,024 tokens per expert, (n, k) = (4096, 4096) gate+up and (4096, 2048) down; rows:
the API's `m_grouped_fp8_gemm_nt_contiguous` (CUTLASS grouped) and fp8_db on the same operands (offs form). Every
fp8_db / fp8_wide row records calc_diff vs the API's output of the same case, x_s5 (vs fp8_db_s5), x_t4 (vs
fp8_db_t4) and bits_eq_s5 (the TMA and wide rows must be True); the wide rows also bits_eq_t4 (must be True); x_api /
x_cublas come from the same run.

    python packages/deep_gemm/benchmarks/bench_dg_fp8_db.py --out RESULT.json   # H200, < 90 s
    python packages/deep_gemm/benchmarks/bench_dg_fp8_db.py --smoke             # CPU, tiny (validation + API)
    python packages/deep_gemm/benchmarks/bench_dg_fp8_db.py --table RESULT.json # markdown table
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
import bench_dg_w4a8_ws as ws  # noqa: E402  (time_into: the timing and error record shared with the W4A8 benches)
import torch  # noqa: E402

from deepinfer import deep_gemm as dg  # noqa: E402
from deepinfer.deep_gemm._dispatch import FP8_DENSE_ENV  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cuda_fp8_db as db  # noqa: E402
from kernelkit import write_results_json  # noqa: E402
from kernelkit.numerics import calc_diff  # noqa: E402

FP8 = torch.float8_e4m3fn
DENSE_MS = (4096, 16384)
DENSE_NK = ((4096, 8192), (2048, 4096), (4096, 2048), (32768, 1024), (8192, 1024), (1024, 4096))
GROUPED = {"gate_up": (4096, 4096), "down": (4096, 2048)}
TPES = (256, 1024)
EXPERTS = 256
API, CUBLAS, S5, T4 = "api", "torch_scaled_mm_rowwise", "fp8_db_s5", "fp8_db_t4"
API_CUTLASS = "api_cutlass"  # the API with DEEPINFER_DEEP_GEMM_FP8_DENSE=cutlass (its pre-session-12 dense kernel)
BUDGET_S = 80.0


def _with_env(name: str, value: str, fn, *args):  # noqa: ANN001, ANN202
    """fn(*args) with os.environ[name] = value (the API reads its kernel choice per call), restored after."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        return fn(*args)
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _fp8(shape: tuple[int, ...], dev: str) -> torch.Tensor:
    """Random finite e4m3 bytes (every code but the NaNs and -448), made on the device without a float copy."""
    r = torch.randint(0, 254, shape, dtype=torch.uint8, device=dev)
    return (r + (r >= 127).to(torch.uint8)).view(FP8)


def _db_impls(a, sfa, b, sfb, offs, out_shape, dev) -> dict:  # noqa: ANN001
    """{name: (callable, out)} of the fp8_db variants `_C` was built with (grouped form): cp.async first, then TMA,
    then the 128 x 256 tiles (only where n % 256 == 0)."""
    impls = {}
    for stages, stagger, tma in sorted(db.compiled_variants(), key=lambda v: (v[2], -v[0], v[1])):
        if tma == db.WIDE and out_shape[1] % 256 != 0:
            continue
        out = torch.empty(out_shape, device=dev, dtype=torch.bfloat16)

        def run(s: int = stages, t: int = stagger, m: int = tma, out: torch.Tensor = out) -> object:
            return db.m_grouped_fp8_gemm_nt_offsets_db(
                a, sfa, b, sfb, offs, out, stages=s, stagger=bool(t), tma=bool(m), wide=m == db.WIDE
            )

        impls[db.variant_name(stages, bool(stagger), tma)] = (run, out)
    return impls


def _bits_eq(impls: dict, name: str, ref: str) -> bool:
    return bool(torch.equal(impls[name][1].view(torch.int16), impls[ref][1].view(torch.int16)))


def _time(case: dict, impls: dict, flops: float, rep: int) -> list[dict]:
    """Time every impl; records with TFLOPS, x_api, x_cublas and (fp8_db / fp8_wide rows) calc_diff vs the API's
    output, x_s5 / x_t4 (speed-up over fp8_db_s5, the cp.async producer / fp8_db_t4, the TMA producer), bits_eq_s5
    (output bit-equal to fp8_db_s5's) and, wide rows, bits_eq_t4."""
    recs, times = [], {}
    for name, (fn, _) in impls.items():
        rec = {**case, "impl": name}
        ws.time_into(rec, fn, flops, rep, times)
        recs.append(rec)
    base = impls[API][1] if API in times else None
    for rec in recs:
        name = rec["impl"]
        if name not in times:
            continue
        for key, ref in (("x_api", API), ("x_api_cutlass", API_CUTLASS), ("x_cublas", CUBLAS), ("x_s5", S5), ("x_t4", T4)):
            if ref in times:
                rec[key] = times[ref] / times[name]
        if name.startswith("fp8_") and base is not None:
            out = impls[name][1]
            rows = slice(None, None, 7) if out.numel() > (1 << 26) else slice(None)  # bound the float64 copies
            rec["diff_vs_api"] = float(calc_diff(out[rows].double(), base[rows].double()))
        if name.startswith("fp8_") and name != S5 and S5 in times:
            rec["bits_eq_s5"] = _bits_eq(impls, name, S5)
        if name.startswith("fp8_wide") and T4 in times:
            rec["bits_eq_t4"] = _bits_eq(impls, name, T4)
    return recs


def dense_case(m: int, n: int, k: int, dev: str, rep: int) -> list[dict]:
    a, sfa = _fp8((m, k), dev), torch.rand(m, k // 128, device=dev) + 0.5
    b, sfb = _fp8((n, k), dev), torch.rand(n // 128, k // 128, device=dev) + 0.5
    api_out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    impls = {API: (lambda: dg.fp8_gemm_nt((a, sfa), (b, sfb), api_out), api_out)}
    if dev == "cuda":
        cut_out = torch.empty_like(api_out)
        impls[API_CUTLASS] = (lambda: _with_env(FP8_DENSE_ENV, "cutlass", dg.fp8_gemm_nt, (a, sfa), (b, sfb), cut_out),
                              cut_out)  # fmt: skip
        offs = torch.full((1,), m, dtype=torch.int32, device=dev)
        impls.update(_db_impls(a, sfa, b[None], sfb[None], offs, (m, n), dev))
        sa_row, sb_row = torch.rand(m, 1, device=dev) + 0.5, torch.rand(1, n, device=dev) + 0.5
        impls[CUBLAS] = (lambda: torch._scaled_mm(a, b.t(), scale_a=sa_row, scale_b=sb_row,
                                                  out_dtype=torch.bfloat16), None)  # fmt: skip
    return _time({"op": "fp8_gemm_nt", "m": m, "n": n, "k": k}, impls, 2.0 * m * n * k, rep)


def grouped_case(wname: str, n: int, k: int, tpe: int, g: int, w: tuple, dev: str, rep: int) -> list[dict]:
    m = tpe * g
    counts = torch.full((g,), tpe, dtype=torch.int64)
    a, sfa = _fp8((m, k), dev), torch.rand(m, k // 128, device=dev) + 0.5
    offs = counts.cumsum(0).to(torch.int32).to(dev)
    ids = torch.arange(g, dtype=torch.int32).repeat_interleave(counts).to(dev)
    api_out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    impls = {API: (lambda: dg.m_grouped_fp8_gemm_nt_contiguous((a, sfa), w, api_out, ids), api_out)}
    if dev == "cuda":
        impls.update(_db_impls(a, sfa, w[0], w[1], offs, (m, n), dev))
    case = {"op": "m_grouped_fp8_gemm_nt", "weights": wname, "tpe": tpe, "groups": g, "m": m, "n": n, "k": k}
    return _time(case, impls, 2.0 * m * n * k, rep)


def _line(r: dict) -> str:
    shape = f"m={r.get('m')} n={r.get('n')} k={r.get('k')}" + (f" tpe={r['tpe']}" if "tpe" in r else "")
    if "error" in r:
        return f"{r.get('op')} {shape} {r['impl']}: ERROR {r['error']}"
    xs = " ".join(f"{key}={r[key]:.2f}" for key in ("x_api", "x_api_cutlass", "x_cublas", "x_s5", "x_t4") if key in r)
    diff = f" diff_vs_api={r['diff_vs_api']:.1e}" if "diff_vs_api" in r else ""
    diff += "".join(f" {key}={r[key]}" for key in ("bits_eq_s5", "bits_eq_t4") if key in r)
    return f"{r['op']} {shape} {r['impl']}: {r['median_us']:.1f} us {r['tflops']:.0f} TFLOPS {xs}{diff}"


def table(path: str) -> str:
    recs = json.load(open(path))["records"]  # noqa: SIM115
    rows = ["| op | m | n | k | tpe | impl | us | TFLOPS | % FP8 ceiling | x API | x cuBLAS | x s5 | x t4 "
            "| calc_diff vs API | bits = t4 |", "|---" * 15 + "|"]  # fmt: skip
    for r in recs:
        head = f"| {r.get('op', '')} | {r.get('m', '')} | {r.get('n', '')} | {r.get('k', '')} | {r.get('tpe', '')}"
        if "error" in r:
            rows.append(f"{head} | {r['impl']} | error: {r['error'][:60]} | | | | | | | | |")
            continue
        xs = " | ".join(f"{r[key]:.2f}" if key in r else "" for key in ("x_api", "x_cublas", "x_s5", "x_t4"))
        diff = f"{r['diff_vs_api']:.1e}" if "diff_vs_api" in r else ""
        eq = str(r["bits_eq_t4"]) if "bits_eq_t4" in r else ""
        rows.append(f"{head} | {r['impl']} | {r['median_us']:.1f} | {r['tflops']:.1f} | {r['pct_fp8_ceiling']:.0f} | "
                    f"{xs} | {diff} | {eq} |")  # fmt: skip
    return "\n".join(rows)


def _save(path: str, recs: list[dict], start: float, done: bool) -> None:
    meta = {"package": "deep_gemm", "bench": "fp8_db", "seconds": time.monotonic() - start, "complete": done}
    write_results_json(path, recs, meta)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_dg_fp8_db.json", help="result JSON")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (the API's reference / Triton path)")
    p.add_argument("--table", metavar="JSON", help="print the markdown table of a saved run and exit")
    args = p.parse_args(argv)
    if args.table:
        print(table(args.table))
        return
    dev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if dev == "cpu" and not args.smoke:
        sys.exit("no CUDA device: run with --smoke for the CPU check")
    dense = [(8, 128, 256)] if args.smoke else [(m, n, k) for n, k in DENSE_NK for m in DENSE_MS]
    grouped = {"smoke": (128, 256)} if args.smoke else GROUPED
    tpes, g = ((4,) if args.smoke else TPES), (2 if args.smoke else EXPERTS)
    start, recs = time.monotonic(), []

    def over() -> bool:
        return time.monotonic() - start > BUDGET_S

    for m, n, k in dense:
        if over():
            recs.append({"op": "fp8_gemm_nt", "m": m, "n": n, "k": k, "impl": "*", "error": "skipped: time budget"})
            continue
        for r in dense_case(m, n, k, dev, 3 if args.smoke else 20):
            print(_line(r), flush=True)
            recs.append(r)
        _save(args.out, recs, start, False)
    for wname, (n, k) in grouped.items():
        w = (_fp8((g, n, k), dev), torch.rand(g, n // 128, k // 128, device=dev) + 0.5)
        for tpe in tpes:
            if over():
                recs.append({"op": "m_grouped_fp8_gemm_nt", "weights": wname, "tpe": tpe, "impl": "*",
                             "error": "skipped: time budget"})  # fmt: skip
                continue
            for r in grouped_case(wname, n, k, tpe, g, w, dev, 3 if args.smoke else 20):
                print(_line(r), flush=True)
                recs.append(r)
            _save(args.out, recs, start, False)
        del w
        if dev == "cuda":
            torch.cuda.empty_cache()
    _save(args.out, recs, start, True)
    print(f"wrote {args.out} ({len(recs)} records, {time.monotonic() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
