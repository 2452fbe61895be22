"""deep_select benchmark: exact row-wise top-k, CUDA C++ radix / Triton v3 vs torch.topk, on the issue 4 shapes.

    python packages/deep_select/benchmarks/bench_deep_select.py --out RESULT.json   # H200, < 200 s
    python packages/deep_select/benchmarks/bench_deep_select.py --smoke             # CPU, interpreter, tiny
    python packages/deep_select/benchmarks/bench_deep_select.py --table RESULT.json # README table

Shapes: indexer rows b in {1, 64, 256, 4096} x n in {4096, 65536, 262144} x k in {512, 2048} (fp32 scores, as
`indexer_scores` writes them; the headline rows also in bf16) and the sampler b in {1, 64, 256, 1024} x
n = 129,280 x k in {50, 512} (fp32 logits). Effective GB/s counts the bytes of scores read once (b * n *
itemsize), so a kernel that reads the row 3 times shows a third of its real traffic; % is of the 4.07 TB/s
copy ceiling. Every implementation returns unsorted indices (torch.topk with sorted=False); each Triton
result is checked against torch.topk's values (same multiset of chosen values) before timing. v3 records
`v3_fast_rows`: how many rows its one-read path served (the rest fell back to v2's passes).

Kernels: cuda = what the API runs with `_C` (`csrc/cuda/topk_radix.cu`, CUDA C++): the split
(`topk_cuda_split`: segments per row, one CTA each, then a merge CTA per row) for few long rows, else one CTA per
row in `cuda_topk.DEFAULT_MODE` ("lean" since session 4; the session-3 and session-4 JSON ran "fast" as cuda);
cuda_fast = the fast mode, one CTA per row, timed where either split rule splits; cuda_lean = the lean mode, one CTA
per row (tile 0 counted then kept, one float compare per entry after it, per-lane atomics for the ~1-2 % that
pass); cuda_lean_pf = lean + a bulk L2
prefetch 3 tiles ahead; cuda_lean_split = the split with lean segments at fast's rule's S (`choose_split(...,
mode="fast")`, the session-4 API's split); cuda_lean_s{S} where S = the lean rule's own S (`choose_split`'s
default since session 4; then cuda = that split); cuda_{fast,lean,lean_pf}_s{S} = the
split with S segments per row at the goal shapes (SEG_SWEEP), also where b fills the GPU; x cuda = against the
API's default of this run; cuda_r1 = round 1's one-read mode (also a baseline: x cuda_r1); cuda_2pass = a
histogram pass, then a collecting pass over the row (mostly from L2 at n <= 65,536),
v3 = `triton_filter.py` (1 read + a small scratch), split = `triton_split.py` (rows cut into segments so that
few rows fill the GPU; measured where the API picks it: b * 2 < SM count and n >= 16,384). Without `_C` the
API runs split where it applies, else v3. `--impls` adds the older v1 = `triton_topk.py` (5 reads) and
v2 = `triton_select.py` (3 reads), left out by default to keep the run short.

Fused indexer (op "indexer_fused"): a 4,096-token prefill chunk over 65,536 visible entries, h = 64, d = 128,
bf16 q / keys, k in {512, 2048}: `indexer_topk_fused` (scores never written as [t, n]) against "GEMM +
torch.topk" (per 256-query chunk: one bf16 GEMM [256 h, d] x [d, n], ReLU, the head-weighted sum as a bf16 bmm,
then torch.topk over the fp32 [t, n] scores). TFLOPS count 2 t h d n; % is of the 735 TFLOPS bf16 ceiling.
The fused result is checked on 8 queries against float64 scores (every pick within the fp32 bound).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

_ROOT = pathlib.Path(__file__).resolve().parents[3]
for _src in (_ROOT / "packages" / "deep_select" / "src", _ROOT / "packages" / "kernelkit" / "src"):
    sys.path.insert(0, str(_src))  # the source tree, not an older installed copy

import torch  # noqa: E402

if not torch.cuda.is_available():  # before triton is imported: the CPU run needs the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import kernelkit as kk  # noqa: E402
from deepinfer.deep_select.backends.cuda import cuda_topk, dispatch  # noqa: E402
from deepinfer.deep_select.backends.cuda.triton_filter import topk_triton_v3  # noqa: E402
from deepinfer.deep_select.backends.cuda.triton_indexer import indexer_topk_fused  # noqa: E402
from deepinfer.deep_select.backends.cuda.triton_select import topk_triton_v2  # noqa: E402
from deepinfer.deep_select.backends.cuda.triton_split import choose_segments, topk_triton_split  # noqa: E402
from deepinfer.deep_select.backends.cuda.triton_topk import topk_triton  # noqa: E402

COPY_GBPS = kk.H200_CEILINGS["hbm_copy_gbps"]
MAX_INPUT_BYTES = 8 * 10**9
TIME_BUDGET_S = 150.0  # stop starting new shapes after this (the run must stay under 200 s; compiles included)
IMPLS = (
    "torch.topk", "cuda", "cuda_fast", "cuda_lean", "cuda_lean_pf", "cuda_lean_split", "cuda_r1", "cuda_2pass",
    "triton_v3", "triton_split",
)  # fmt: skip
OPTIONAL_IMPLS = ("triton_v1", "triton_v2")  # --impls: measured only when asked
BASELINES = ("torch.topk", "cuda", "triton_v3", "cuda_r1")  # cuda = the API's default in this run
# Segment counts swept at the goal shapes (round 3, idea 1: split rows into S segments even when b fills the GPU;
# idea 4: more segments for b = 1): (b, n, k) -> S values, each measured with the fast and / or lean pass as
# cuda_{fast,lean}_s{S} (topk_cuda_split: S CTAs per row, then one merge CTA per row over S x k ids).
# Session-4 re-tune of choose_split for lean (not yet re-timed): S values next to the lean rule's choice that the
# session-4 run did not measure (b = 1: fewer segments at k = 512; b = 64: 2 segments; b = 1, n = 65,536: 2-4).
SEG_SWEEP = {
    (256, 65536, 512): ((2, 4), ("fast", "lean", "lean_pf")),
    (256, 262144, 512): ((2, 4), ("lean",)),
    (256, 262144, 2048): ((2,), ("lean",)),
    (4096, 262144, 512): ((2,), ("lean",)),
    (64, 262144, 512): ((2, 8, 16), ("lean",)),
    (64, 262144, 2048): ((2, 8), ("lean",)),
    (64, 65536, 512): ((2,), ("lean",)),
    (1, 65536, 512): ((4,), ("lean",)),
    (1, 65536, 2048): ((2,), ("lean",)),
    (1, 262144, 512): ((8, 11, 44), ("lean",)),
    (1, 262144, 2048): ((4, 6, 22, 32), ("lean",)),
}
_EXTRA: set[str] = set()  # optional implementations asked for on the command line


def _shapes(smoke: bool) -> list[dict]:
    """(op, dtype, b, n, k) cases, the headline shape first so a cut-short run still measures it."""
    if smoke:
        return [
            dict(op="indexer", dtype="float32", b=2, n=300, k=16),
            dict(op="indexer", dtype="bfloat16", b=2, n=300, k=64),
            dict(op="sampler", dtype="float32", b=1, n=500, k=50),
        ]
    cases = [dict(op="indexer", dtype="float32", b=256, n=65536, k=512)]
    cases += [dict(op="indexer", dtype="bfloat16", b=256, n=n, k=512) for n in (65536, 262144)]
    for b in (1, 64, 256, 4096):
        for n in (4096, 65536, 262144):
            for k in (512, 2048):
                cases.append(dict(op="indexer", dtype="float32", b=b, n=n, k=k))
    cases += [dict(op="sampler", dtype="float32", b=b, n=129280, k=k) for b in (1, 64, 256, 1024) for k in (50, 512)]
    seen, out = set(), []
    for c in cases:
        key = tuple(c.values())
        itemsize = torch.empty(0, dtype=getattr(torch, c["dtype"])).element_size()
        if key not in seen and c["b"] * c["n"] * itemsize <= MAX_INPUT_BYTES:
            seen.add(key)
            out.append(c)
    return out


def _fns(x: torch.Tensor, k: int) -> dict:
    kk_ = min(k, x.shape[1])
    fns = {"torch.topk": lambda: torch.topk(x, kk_, dim=1, sorted=False)}
    if x.is_cuda:  # the compiled kernel: an error record when _C is missing (the lead's build must have it)
        sms_ = torch.cuda.get_device_properties(x.device).multi_processor_count
        b_, n_ = x.shape
        on = dispatch.SPLIT_ENABLED
        segs = cuda_topk.choose_split(b_, n_, k, sms_) if on else 1  # the API's rule (DEFAULT_MODE's)
        segs_fast = cuda_topk.choose_split(b_, n_, k, sms_, mode="fast") if on else 1  # session 3's sqrt rule
        fns["cuda"] = lambda: dispatch._select_cuda(x, k, None, None, None)  # the API's choice, no fallback
        if max(segs, segs_fast) > 1:  # a split shape: also the one-CTA-per-row fast kernel
            fns["cuda_fast"] = lambda: cuda_topk.topk_cuda(x, k, mode="fast")
        fns["cuda_lean"] = lambda: cuda_topk.topk_cuda(x, k, mode="lean")  # round 3: one CTA per row
        fns["cuda_lean_pf"] = lambda: cuda_topk.topk_cuda(x, k, mode="lean_pf")  # + bulk L2 prefetch
        if segs_fast > 1:  # lean segments at the fast rule's S (the session-4 API's split; compare across runs)
            fns["cuda_lean_split"] = lambda: cuda_topk.topk_cuda_split(x, k, segs_fast, mode="lean")
        if segs > 1 and segs != segs_fast:  # the lean rule's own S (session-4 re-tune, cuda_lean_s{S})
            fns[f"cuda_lean_s{segs}"] = lambda: cuda_topk.topk_cuda_split(x, k, segs, mode="lean")
        sweep, modes = SEG_SWEEP.get((x.shape[0], x.shape[1], k), ((), ()))
        for s_ in sweep:
            for m_ in modes:
                fns[f"cuda_{m_}_s{s_}"] = lambda s_=s_, m_=m_: cuda_topk.topk_cuda_split(x, k, s_, mode=m_)
        fns["cuda_r1"] = lambda: cuda_topk.topk_cuda(x, k, mode="one_read")
        fns["cuda_2pass"] = lambda: cuda_topk.topk_cuda(x, k, mode="two_pass")
    fns["triton_v3"] = lambda: topk_triton_v3(x, k)
    if "triton_v1" in _EXTRA:
        fns["triton_v1"] = lambda: topk_triton(x, k)
    if "triton_v2" in _EXTRA:
        fns["triton_v2"] = lambda: topk_triton_v2(x, k)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132
    segments = choose_segments(x.shape[0], x.shape[1], k, sms)
    if segments > 1 or not x.is_cuda:  # on CPU (smoke) always, with 2 segments, to prove the plumbing
        fns["triton_split"] = lambda: topk_triton_split(x, k, max(segments, 2))
    return fns


def _v3_fast_rows(x: torch.Tensor, k: int) -> int:
    path = torch.zeros(x.shape[0], dtype=torch.int32, device=x.device)
    topk_triton_v3(x, k, path=path)
    return int(path.sum())


def _check(x: torch.Tensor, k: int, idx: torch.Tensor) -> str:
    """'ok' when the chosen values equal torch.topk's as a multiset (robust to ties), else what differs."""
    kk_ = min(k, x.shape[1])
    want = torch.topk(x.float(), kk_, dim=1, sorted=True).values
    got = torch.gather(x.float(), 1, idx[:, :kk_].long().clamp_min(0))
    got = torch.sort(got, dim=1, descending=True).values
    if bool((idx[:, :kk_] < 0).any()):
        return "padding among the first k slots"
    return "ok" if torch.equal(got, want) else "values differ from torch.topk"


def _run_case(case: dict, warmup: int, rep: int) -> list[dict]:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(case["b"] * 7 + case["n"] + case["k"])
    x = torch.randn(case["b"], case["n"], device=dev, generator=g).to(getattr(torch, case["dtype"]))
    if case["op"] == "sampler":
        x = x * 3.0  # logits scale; the distribution shape is what matters
    nbytes = x.numel() * x.element_size()
    recs = {}
    for name, fn in _fns(x, case["k"]).items():
        rec = dict(case, impl=name, bytes_read=nbytes)
        try:
            if name != "torch.topk":
                rec["check"] = _check(x, case["k"], fn())
            if name == "triton_v3":
                rec["v3_fast_rows"] = _v3_fast_rows(x, case["k"])
            t = kk.bench_cuda(fn, warmup=warmup, rep=rep)
            rec.update(median_us=t["median_us"], p10_us=t["p10"], p90_us=t["p90"], timer=t["timer"])
            rec["gbps"] = kk.gbps(nbytes, t["median_us"])
            rec["pct_of_copy"] = kk.pct_of(rec["gbps"], COPY_GBPS)
        except Exception as exc:  # record and go on: one bad case must not lose the others
            rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
        recs[name] = rec
    for rec in recs.values():
        for base in BASELINES:
            bt, mt = recs.get(base, {}).get("median_us"), rec.get("median_us")
            rec[f"x_{base}"] = bt / mt if bt and mt else None
    del x
    if dev == "cuda":
        torch.cuda.empty_cache()
    return list(recs.values())


FUSED_IMPLS = ("gemm+torch.topk", "triton_fused")


def _fused_shapes(smoke: bool) -> list[dict]:
    if smoke:
        return [dict(op="indexer_fused", dtype="bfloat16", b=4, n=300, k=16, h=16, d=32)]
    return [dict(op="indexer_fused", dtype="bfloat16", b=4096, n=65536, k=k, h=64, d=128) for k in (512, 2048)]


def _gemm_topk(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, k: int, chunk: int = 256) -> torch.Tensor:
    """The baseline: scores by a bf16 GEMM per query chunk (never [t, h, n] at once), then torch.topk."""
    t, h, d = q.shape
    scores = torch.empty(t, keys.shape[0], dtype=torch.float32, device=q.device)
    wb = w.to(q.dtype)
    for r in range(0, t, chunk):
        logits = torch.mm(q[r : r + chunk].reshape(-1, d), keys.t()).relu_()  # [chunk * h, n]
        rows = logits.shape[0] // h
        scores[r : r + rows] = torch.bmm(wb[r : r + rows, None, :], logits.view(rows, h, -1))[:, 0].float()
    return torch.topk(scores, min(k, keys.shape[0]), dim=1, sorted=False).indices


def _check_fused(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, k: int, idx: torch.Tensor) -> str:
    """On 8 queries: exactly min(k, n) picks, each within the fp32 accumulation bound of the k-th best score."""
    rows = min(8, q.shape[0])
    qd, kd, wd = q[:rows].double(), keys.double(), w[:rows].double()
    exact = torch.einsum("thn,th->tn", torch.relu(torch.einsum("thd,nd->thn", qd, kd)), wd)
    bound = (q.shape[2] + q.shape[1] + 2) * 2.0**-24 * torch.einsum("th,thd,nd->tn", wd.abs(), qd.abs(), kd.abs())
    kk_ = min(k, keys.shape[0])
    picked = idx[:rows, :kk_].long()
    if bool((picked < 0).any()):
        return "padding among the first k slots"
    kth = torch.topk(exact, kk_, dim=1).values[:, -1:]
    ok = torch.gather(exact, 1, picked) >= kth - 2 * bound.max(dim=1, keepdim=True).values
    return "ok" if bool(ok.all()) else f"{int((~ok).sum())} picks below the k-th score minus the bound"


def _run_fused(case: dict, warmup: int, rep: int) -> list[dict]:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(17)
    t, n, h, d, k = case["b"], case["n"], case["h"], case["d"], case["k"]
    q = torch.randn(t, h, d, device=dev, generator=g).bfloat16()
    keys = torch.randn(n, d, device=dev, generator=g).bfloat16()
    w = torch.rand(t, h, device=dev, generator=g) * h**-0.5
    visible = torch.full((t,), n, dtype=torch.int32, device=dev)
    flops = 2.0 * t * h * d * n
    fns = {
        "gemm+torch.topk": lambda: _gemm_topk(q, w, keys, k),
        "triton_fused": lambda: indexer_topk_fused(q, w, keys, k, visible=visible),
    }
    recs = {}
    for name, fn in fns.items():
        rec = dict(case, impl=name, flops=flops)
        try:
            if name == "triton_fused":
                rec["check"] = _check_fused(q, w, keys, k, fn())
            tm = kk.bench_cuda(fn, warmup=warmup, rep=rep)
            rec.update(median_us=tm["median_us"], p10_us=tm["p10"], p90_us=tm["p90"], timer=tm["timer"])
            rec["tflops"] = kk.tflops(flops, tm["median_us"])
            rec["pct_of_bf16"] = kk.pct_of(rec["tflops"], kk.H200_CEILINGS["bf16_tflops"])
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
        recs[name] = rec
    base = recs["gemm+torch.topk"].get("median_us")
    for rec in recs.values():
        mt = rec.get("median_us")
        rec["x_gemm+torch.topk"] = base / mt if base and mt else None
    return list(recs.values())


def _line(rec: dict) -> str:
    if "error" in rec:
        return f"{rec['impl']:>11}: ERROR {rec['error'][:120]}"
    if rec["op"] == "indexer_fused":
        x = rec.get("x_gemm+torch.topk")
        xs = f"x_gemm+torch.topk={x:.2f}" if x else ""
        speed = f"{rec['median_us']:10.1f} us {rec['tflops']:8.1f} TFLOPS {rec['pct_of_bf16']:5.1f}%"
        return f"{rec['impl']:>11}: {speed} {xs} {rec.get('check', '')}"
    xs = " ".join(f"x{b}={rec[f'x_{b}']:.2f}" for b in BASELINES if rec.get(f"x_{b}"))
    speed = f"{rec['median_us']:10.1f} us {rec['gbps']:8.1f} GB/s {rec['pct_of_copy']:5.1f}%"
    fast = f" fast rows {rec['v3_fast_rows']}/{rec['b']}" if "v3_fast_rows" in rec else ""
    return f"{rec['impl']:>11}: {speed} {xs} {rec.get('check', '')}{fast}"


def _ordered(smoke: bool) -> list[dict]:
    """Every case in run order: the goal shapes first (top-k headline, fused k = 512), so that a run cut short
    by the time budget still measures them."""
    topk_cases, fused_cases = _shapes(smoke), _fused_shapes(smoke)
    head = [c for c in topk_cases if c["b"] == 256 and c["n"] == 65536 and c["k"] == 512]
    rest = [c for c in topk_cases if c not in head]
    return head + fused_cases[:1] + rest + fused_cases[1:]


def run(out: str | None, smoke: bool) -> list[dict]:
    warmup, rep = (1, 2) if smoke else (3, 20)
    t0, records = time.time(), []
    for case in _ordered(smoke):
        fused = case["op"] == "indexer_fused"
        label = f"{case['op']} {case['dtype']} b={case['b']} n={case['n']} k={case['k']}"
        if time.time() - t0 > TIME_BUDGET_S:
            impls = FUSED_IMPLS if fused else (*IMPLS, *sorted(_EXTRA))
            records += [dict(case, impl=i, error="skipped: time budget") for i in impls]
            print(f"[skip] {label}", flush=True)
            continue
        print(f"[{time.time() - t0:6.1f}s] {label}", flush=True)
        if fused:  # ~10-40 ms per call: fewer repetitions
            recs = _run_fused(case, 1 if smoke else 2, 2 if smoke else 5)
        else:
            recs = _run_case(case, warmup, rep)
        for rec in recs:
            print("    " + _line(rec), flush=True)
        records += recs
        if out:  # rewrite after every shape: a killed run still leaves its results
            kk.write_results_json(out, records, {"package": "deep_select", "smoke": smoke})
    return records


def table(path: str) -> str:
    """Markdown table of a saved result JSON."""
    doc = json.loads(pathlib.Path(path).read_text())
    # Older results (before the CUDA kernel) used triton_v1 as the second baseline.
    bases = BASELINES if any("x_triton_v3" in r for r in doc["records"]) else ("torch.topk", "triton_v1")
    bases = tuple(b for b in bases if any(f"x_{b}" in r for r in doc["records"]))  # cuda_r1: from round 2 on
    rows = [
        f"GPU: {doc.get('gpu')}; {doc.get('date')}. GB/s = bytes of scores read once / time; "
        "% of the 4.07 TB/s copy ceiling.",
        "",
        "| op | dtype | b | n | k | impl | time (us) | GB/s | % of copy | "
        + " | ".join(f"x {b}" for b in bases)
        + " |",
        "|---|---|---|---|---|---|---|---|---|" + "---|" * len(bases),
    ]
    fused = [r for r in doc["records"] if r["op"] == "indexer_fused"]
    for r in doc["records"]:
        if r["op"] == "indexer_fused":
            continue
        head = f"| {r['op']} | {r['dtype']} | {r['b']} | {r['n']} | {r['k']} | {r['impl']} |"
        if "error" in r:
            rows.append(f"{head} {r['error'][:60]} |" + " |" * (2 + len(bases)))
            continue
        xs = " | ".join(f"{r[f'x_{b}']:.2f}" if r.get(f"x_{b}") else "-" for b in bases)
        rows.append(f"{head} {r['median_us']:.1f} | {r['gbps']:.0f} | {r['pct_of_copy']:.1f} | {xs} |")
    rows += ["", *_best_table(doc["records"])]
    if fused:
        rows += [
            "",
            "| fused indexer | t | n | k | h x d | impl | time (us) | TFLOPS | % of bf16 | x GEMM + torch.topk |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
    for r in fused:
        head = f"| bf16 | {r['b']} | {r['n']} | {r['k']} | {r['h']} x {r['d']} | {r['impl']} |"
        if "error" in r:
            rows.append(f"{head} {r['error'][:60]} | | | |")
            continue
        x = r.get("x_gemm+torch.topk")
        xs = f"{x:.2f}" if x else "-"
        rows.append(f"{head} {r['median_us']:.1f} | {r['tflops']:.1f} | {r['pct_of_bf16']:.1f} | {xs} |")
    return "\n".join(rows)


def _best_table(records: list[dict]) -> list[str]:
    """Per shape: the API's default (cuda), the fastest CUDA variant of the same run and its x cuda / x torch.topk
    (what an auto rule would pick)."""
    shapes: dict[tuple, dict[str, float]] = {}
    for r in records:
        if r["op"] != "indexer_fused" and "median_us" in r and r.get("check", "ok") == "ok":
            shapes.setdefault((r["op"], r["dtype"], r["b"], r["n"], r["k"]), {})[r["impl"]] = r["median_us"]
    rows = [
        "| op | dtype | b | n | k | cuda (us) | fastest CUDA variant | its time (us) | x cuda | x torch.topk |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, times in shapes.items():
        cands = {i: t for i, t in times.items() if i.startswith("cuda") and i not in ("cuda_r1", "cuda_2pass")}
        if "cuda" not in times or not cands:
            continue
        best = min(cands, key=cands.get)
        tt = times.get("torch.topk")
        xt = f"{tt / cands[best]:.2f}" if tt else "-"
        head = " | ".join(str(v) for v in key)
        rows.append(
            f"| {head} | {times['cuda']:.1f} | {best} | {cands[best]:.1f} | {times['cuda'] / cands[best]:.2f} | {xt} |"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the result JSON here")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (interpreter) to prove the script")
    ap.add_argument("--table", metavar="JSON", help="print the README table of a saved result and exit")
    ap.add_argument("--impls", default="", help=f"comma-separated extra implementations: {','.join(OPTIONAL_IMPLS)}")
    args = ap.parse_args()
    for name in filter(None, args.impls.split(",")):
        if name not in OPTIONAL_IMPLS:
            sys.exit(f"--impls: expected names from {OPTIONAL_IMPLS}, got {name!r}")
        _EXTRA.add(name)
    if args.table:
        print(table(args.table))
        return
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke on CPU")
    recs = run(args.out, args.smoke)
    bad = [r for r in recs if r.get("check", "ok") != "ok" or ("error" in r and "time budget" not in r["error"])]
    print(f"{len(recs)} records, {len(bad)} with errors or failed checks", flush=True)
    if args.smoke and bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
