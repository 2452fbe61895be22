"""Benchmark tile_kernels on V4-Flash shapes against torch eager and torch.compile of the reference (one run).

    python packages/tile_kernels/benchmarks/bench_tile_kernels.py --out RESULT.json   # H200: 16,384 / 64 / 1 / 4,096
    python packages/tile_kernels/benchmarks/bench_tile_kernels.py --tokens 1,64 --out SMALL.json  # some counts only
    TRITON_INTERPRET=1 python packages/tile_kernels/benchmarks/bench_tile_kernels.py --smoke   # CPU, tiny shapes
    python packages/tile_kernels/benchmarks/bench_tile_kernels.py --table RESULT.json  # README markdown table

Per case (op, shape) three implementations are timed with kernelkit.bench_cuda (CUDA events, L2 flushed):
"api" (the public function: Triton where wired), "eager" (the PyTorch reference) and "compile"
(torch.compile of the reference, compiled once per case, static shapes; with --smoke Dynamo's "eager" backend).
Token counts (--tokens, default 16384,4096,64,1, run in that order): every op at each count; at 1 and 64 tokens
the ops are launch bound, so compare time and x eager / x compile there, not % of copy. torch.compile baselines
at the largest count and at counts <= 64 only (4,096: its goals are % of copy and x eager). Time boxes (the whole
run < 200 s): no new compile starts after --compile-budget seconds (140; each costs 2-8 s, so the count run last
may lack some: "skipped: compile budget"), no named config after 160 s and no case after 185 s ("skipped: time
budget"). One record per (op, shape, impl):
median_us, GB/s of the bytes truly read + written, % of the 4.07 TB/s copy ceiling; "api" records add api_path
(detected), x_eager, x_compile (same run), max_abs_diff_vs_eager.
Named Triton configs of a case (`Case.variants`: tile sizes / warps of the memory-bound kernels, the Hadamard's
tl.dot form) are timed in the same run as "triton:<name>" records with x_api (API default time / config time,
> 1: the config is faster), max_abs_diff_vs_eager and bits_equal_api (its first output byte for byte the API
default's: a default switch must not change results); `--table` lists them under the main table. None starts
after 160 s. A failing case records its error string; the JSON is written in every case.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

_HERE = pathlib.Path(__file__).resolve().parent
for _p in (_HERE.parent / "src", _HERE.parents[1] / "kernelkit" / "src", _HERE):  # the source tree first
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402
from _cases import Case, cases, tensor_bytes  # noqa: E402

import kernelkit  # noqa: E402

COPY_GBPS = kernelkit.H200_CEILINGS["hbm_copy_gbps"]
COMPILE_BUDGET_S = 140.0  # no new torch.compile after this many seconds (each costs 2-8 s; round 1 run: 78 s)
SMOKE_COMPILE_BUDGET_S = 20.0
VARIANT_BUDGET_S = 160.0  # no named Triton config starts after this many seconds (each JIT-compiles once)
CASE_BUDGET_S = 185.0  # no case starts after this many seconds (the run must end within 200 s)
DEFAULT_TOKENS = (16384, 4096, 64, 1)  # largest first (the round-1 numbers; 4,096 has no compile baseline)
SMOKE_TOKENS = (8,)
DEFAULT_OUT = _HERE / "results" / "h200.json"


def _log(msg: str) -> None:
    print(msg, flush=True)


def _first_tensor(out: object) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


def _max_abs_diff(a: object, b: object) -> float | None:
    """Largest |a - b| over the first output tensor (NaN positions ignored); None when not comparable."""
    x, y = _first_tensor(a), _first_tensor(b)
    if x is None or y is None or x.shape != y.shape:
        return None
    d = (x.float() - y.float()).abs()
    d = d[~torch.isnan(d)]
    m = float(d.max()) if d.numel() else 0.0
    return m if math.isfinite(m) else None  # JSON holds no inf


def _bits_equal(a: object, b: object) -> bool | None:
    """Whether the first output tensors of a and b hold the same bytes (a config against the API default: a
    default switch must not change results); None when not comparable."""
    x, y = _first_tensor(a), _first_tensor(b)
    if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
        return None
    return bool(torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)))


def _call_and_path(fn, args: tuple) -> tuple[object, str]:
    """fn(*args) and which path it took: "triton" when a Triton kernel launched during the call, else
    "reference" (the API dispatches per call; this sees what it really ran, whoever wired which op)."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return fn(*args), "reference"
    launches, real = [0], JITFunction.run

    def counting_run(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        launches[0] += 1
        return real(self, *a, **k)

    JITFunction.run = counting_run
    try:
        out = fn(*args)
    finally:
        JITFunction.run = real
    return out, "triton" if launches[0] else "reference"


def _time(fn, args: tuple, warmup: int, rep: int) -> dict:
    return kernelkit.bench_cuda(lambda: fn(*args), warmup=warmup, rep=rep)


def _record(case: Case, impl: str, timing: dict, nbytes: int, path: str) -> dict:
    us = timing["median_us"]
    gbps = kernelkit.gbps(nbytes, us)
    rec = {
        "op": case.op,
        "shape": case.shape,
        "impl": impl,
        "api_path": path,
        "bytes": nbytes,
        "median_us": us,
        "p10_us": timing["p10"],
        "p90_us": timing["p90"],
        "gbps": gbps,
        "pct_copy_ceiling": kernelkit.pct_of(gbps, COPY_GBPS),
        "timer": timing["timer"],
    }
    if "graph_error" in timing:  # why the call was timed with events, not graph replays (a host sync, ...)
        rec["graph_error"] = timing["graph_error"]
    return rec


def run_case(
    case: Case, compile_ok: bool, warmup: int, rep: int, backend: str = "inductor", max_variants: int | None = None
) -> list[dict]:
    """Time api / eager / compile of one case; returns its records (errors recorded, never raised)."""
    recs: list[dict] = []
    try:
        args = case.make()
        want = case.ref(*args)
        got, path = _call_and_path(case.api, args)
        nbytes = case.nbytes(args, want) if case.nbytes else tensor_bytes(args) + tensor_bytes(want)
    except Exception as exc:  # noqa: BLE001 (record, go on)
        return [{"op": case.op, "shape": case.shape, "impl": "api", "error": f"setup: {exc!r}"[:500]}]
    times: dict[str, float] = {}
    impls = [("eager", case.ref), ("api", case.api)]
    if compile_ok:
        impls.append(("compile", torch.compile(case.ref, dynamic=False, backend=backend)))
    for impl, fn in impls:
        try:
            rec = _record(case, impl, _time(fn, args, warmup, rep), nbytes, path)
            times[impl] = rec["median_us"]
        except Exception as exc:  # noqa: BLE001
            rec = {"op": case.op, "shape": case.shape, "impl": impl, "error": repr(exc)[:500]}
        recs.append(rec)
    if not compile_ok:
        why = "compile budget" if case.compile_baseline else "no compile baseline at this token count (time box)"
        recs.append({"op": case.op, "shape": case.shape, "impl": "compile", "error": f"skipped: {why}"})
    recs += _run_variants(case, args, nbytes, warmup, rep, max_variants)
    for rec in recs:
        if rec["impl"] != "api" and not rec["impl"].startswith("triton:") or "error" in rec:
            continue
        for base in ("eager", "compile", "api"):
            if base in times and rec["impl"] != base:
                rec[f"x_{base}"] = times[base] / rec["median_us"]
            elif base != "api":
                rec[f"x_{base}"] = None
        if "_out" in rec:  # a named config: also whether it gives the default's bits
            rec["bits_equal_api"] = _bits_equal(rec["_out"], got)
        rec["max_abs_diff_vs_eager"] = _max_abs_diff(rec.pop("_out", got), want)
    del args, want, got
    return recs


def _run_variants(case: Case, args: tuple, nbytes: int, warmup: int, rep: int, limit: int | None) -> list[dict]:
    """Time each named Triton config of the case ("triton:<name>" records; x_api = API time / its time); `limit`:
    only the first few (--smoke: one, the interpreter is slow)."""
    recs = []
    if limit is not None:  # --smoke (or past the budget): prove the mechanism cheaply
        warmup, rep = 1, 1
    for name, fn in list(case.variants.items())[:limit]:
        impl = f"triton:{name}"
        try:
            out = fn(*args)
            rec = _record(case, impl, _time(fn, args, warmup, rep), nbytes, "triton")
            rec["_out"] = out
        except Exception as exc:  # noqa: BLE001 (a config that does not compile or run is a result too)
            rec = {"op": case.op, "shape": case.shape, "impl": impl, "error": repr(exc)[:500]}
        recs.append(rec)
    return recs


def _summary(rec: dict) -> str:
    if "error" in rec:
        return f"{rec['impl']:8s} ERROR {rec['error'][:120]}"
    extra = "".join(f" {k}={rec[k]:.2f}" for k in ("x_eager", "x_compile", "x_api") if rec.get(k) is not None)
    speed = f"{rec['median_us']:10.1f} us {rec['gbps']:8.1f} GB/s {rec['pct_copy_ceiling']:5.1f} %"
    return f"{rec['impl']:8s} {speed}{extra}"


def run(
    smoke: bool,
    out: pathlib.Path | None,
    warmup: int,
    rep: int,
    compile_budget: float = COMPILE_BUDGET_S,
    tokens: tuple[int, ...] | None = None,
    ops: tuple[str, ...] | None = None,
) -> list[dict]:
    dev = "cpu" if smoke else "cuda"
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --smoke on CPU")
    t0 = time.monotonic()
    records: list[dict] = []
    all_cases = cases(dev, tokens or (SMOKE_TOKENS if smoke else DEFAULT_TOKENS))
    if ops:  # --ops: only these ops (a short run that re-times some ops; the others keep their last JSON)
        unknown = sorted(set(ops) - {c.op for c in all_cases})
        if unknown:
            raise SystemExit(f"--ops: unknown op(s) {unknown}; expected names from {sorted({c.op for c in all_cases})}")
        all_cases = [c for c in all_cases if c.op in ops]
    for case in all_cases:
        if not smoke and time.monotonic() - t0 > CASE_BUDGET_S:
            records.append({"op": case.op, "shape": case.shape, "impl": "api", "error": "skipped: time budget"})
            continue
        compile_ok = case.compile_baseline and time.monotonic() - t0 < compile_budget
        n_var = (
            (1 if case.smoke_variants else 0) if smoke else (None if time.monotonic() - t0 < VARIANT_BUDGET_S else 0)
        )
        _log(f"[{time.monotonic() - t0:6.1f} s] {case.op} {case.shape}")
        # smoke: Dynamo traces every reference, but Inductor's C++ codegen (40 s a case on 2 cores) is skipped
        for rec in run_case(case, compile_ok, warmup, rep, "eager" if smoke else "inductor", n_var):
            records.append(rec)
            _log(f"    {_summary(rec)}" + (f"  [api path: {rec.get('api_path')}]" if rec.get("impl") == "api" else ""))
        if dev == "cuda":
            torch.cuda.empty_cache()
        if out is not None:  # after every case, so a killed run still leaves its numbers
            _write(out, records, smoke, time.monotonic() - t0)
    _log(f"done in {time.monotonic() - t0:.1f} s")
    return records


def _write(out: pathlib.Path, records: list[dict], smoke: bool, elapsed: float) -> None:
    meta = {
        "package": "deepinfer-tile-kernels",
        "smoke": smoke,
        "elapsed_s": round(elapsed, 1),
        "copy_ceiling_gbps": COPY_GBPS,
    }
    clean = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in records]
    try:
        kernelkit.write_results_json(out, clean, meta)
    except Exception as exc:  # noqa: BLE001 (keep measuring; the log still has the numbers)
        _log(f"could not write {out}: {exc!r}")


def table(path: pathlib.Path) -> str:
    """The README markdown table of the "api" records of a saved JSON (baselines as columns)."""
    doc = json.loads(path.read_text())
    lines = [
        f"GPU: {doc.get('gpu')}, {doc.get('date')}; x = speed-up of the API over the baseline, same run.",
        "At 1 and 64 tokens the ops are launch bound: compare the time and x eager / x torch.compile there; their %",
        "of the copy ceiling is not meaningful (a few KB to MB moved in a few us). '-': no baseline (time box).",
        "",
        "| op | shape | API path | time (us) | GB/s | % of 4.07 TB/s | x eager | x torch.compile |",
        "|---|---|---|---|---|---|---|---|",
    ]
    variants = []
    for r in doc["records"]:
        if r.get("impl", "").startswith("triton:"):
            variants.append(r)
            continue
        if r.get("impl") != "api":
            continue
        if "error" in r:
            lines.append(f"| {r['op']} | {r['shape']} | - | error: {r['error'][:80]} | | | | |")
            continue
        xs = [f"{r[k]:.2f}" if r.get(k) is not None else "-" for k in ("x_eager", "x_compile")]
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['api_path']} | {r['median_us']:.1f} | {r['gbps']:.0f} | "
            f"{r['pct_copy_ceiling']:.1f} | {xs[0]} | {xs[1]} |"
        )
    return "\n".join(lines + _variant_table(variants))


def _variant_table(variants: list[dict]) -> list[str]:
    """Named Triton configs next to the API default (x API > 1: the config is faster than the default)."""
    if not variants:
        return []
    head = "| op | shape | config | time (us) | % of 4.07 TB/s | x API default | max abs diff vs eager | API's bits |"
    lines = ["", head, "|---|---|---|---|---|---|---|---|"]
    for r in variants:
        if "error" in r:
            lines.append(f"| {r['op']} | {r['shape']} | {r['impl']} | error: {r['error'][:80]} | | | | |")
            continue
        xa = f"{r['x_api']:.2f}" if r.get("x_api") is not None else "-"
        d = r.get("max_abs_diff_vs_eager")
        bits = {True: "same", False: "differ"}.get(r.get("bits_equal_api"), "-")  # "-": not recorded / comparable
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['impl'][7:]} | {r['median_us']:.1f} | {r['pct_copy_ceiling']:.1f} | "
            f"{xa} | {'-' if d is None else f'{d:.3g}'} | {bits} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, default=None, help=f"JSON to write (default {DEFAULT_OUT})")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (proves the script)")
    ap.add_argument("--table", type=pathlib.Path, default=None, help="print the markdown table of a saved JSON")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument(
        "--compile-budget", type=float, default=COMPILE_BUDGET_S, help="seconds after which no new torch.compile starts"
    )
    ap.add_argument(
        "--tokens",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        default=None,
        help=f"token counts, comma-separated, run in that order (default {','.join(map(str, DEFAULT_TOKENS))})",
    )
    ap.add_argument(
        "--ops",
        type=lambda v: tuple(x for x in v.split(",") if x),
        default=None,
        help="only these ops, comma-separated (default: every op)",
    )
    a = ap.parse_args()
    if a.table is not None:
        print(table(a.table))
        return
    out = a.out if a.out is not None else (None if a.smoke else DEFAULT_OUT)
    smoke_default = a.smoke and (a.warmup, a.rep) == (3, 20)  # the interpreter is slow: one warm-up, two reps
    # --smoke: Dynamo traces only the first cases (each costs seconds on 2 cores; the run must stay under 60 s)
    budget = min(a.compile_budget, SMOKE_COMPILE_BUDGET_S) if a.smoke else a.compile_budget
    run(a.smoke, out, 1 if smoke_default else a.warmup, 2 if smoke_default else a.rep, budget, a.tokens, a.ops)


if __name__ == "__main__":
    main()
