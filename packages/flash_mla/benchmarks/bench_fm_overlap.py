"""FA3-style overlap in the one-scorer consumer (session 10): the adaptive overlap builds ws3p1oa (BF16 cache) /
ws3p1voa (FP8 cache; S_{i+1} issued before softmax_i only if its tile has already landed; the API default from 128
tokens) side by side with their bases ws3p1l / ws3p1v (the default at 64..127 tokens, bit-identical results).
(The session-10 run also timed the blocking ws3p1o / ws3p1vo and the P-mbarrier ws3p1oam / ws3p1voam: slower,
removed; benchmarks/results/2026-12-01-s10-bench-fm_overlap.json keeps their rows, --table still prints it.)

    python packages/flash_mla/benchmarks/bench_fm_overlap.py --out RESULT.json   # GPU (< 60 s)
    python packages/flash_mla/benchmarks/bench_fm_overlap.py --smoke             # CPU: stand-in rows (reference)
    python packages/flash_mla/benchmarks/bench_fm_overlap.py --table RESULT.json # markdown table
    python packages/flash_mla/benchmarks/bench_fm_overlap.py --vw --out R.json   # session 11: ws3p1voa vs ws3p1voaw
    python packages/flash_mla/benchmarks/bench_fm_overlap.py --thresh --out R.json  # session 14: defaults vs ws3p1oat

Cases: decode b 32 / 64 / 128 / 256 x s_q 2 and b 128 x s_q 1 (64 heads, topk 640 = a 128-row window + 512 of 16,384
compressed rows: bench_flash_mla.decode_indices, ~3 % holes), prefill t 4,096 and 16,384 (bench_flash_mla.
prefill_indices); each on the BF16 cache and on the packed FP8 cache (584-byte rows). Per case and cache the two
variants are timed in A B B A order (kernelkit.bench_cuda, L2 flushed, CUDA graph), the record keeps both medians and
their mean; the overlap row records whether its out / lse are bit-identical to the base's on the same call (they must
be). TFLOPS = 2 * 64 * valid indices * 1024 / time (QK^T and PV over 512 dims:
bench_flash_mla's count).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

_HERE = pathlib.Path(__file__).resolve().parent
_PKG = _HERE.parent
for _p in (_PKG / "src", _PKG.parent / "kernelkit" / "src", _HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402
from bench_flash_mla import decode_indices, prefill_indices  # noqa: E402

H, D = 64, 512
SCALE = D**-0.5
# cache -> (the base the other row must equal bit for bit, the overlap build)
ROWS = {"bf16": ("ws3p1l", "ws3p1oa"), "fp8": ("ws3p1v", "ws3p1voa")}
# --vw (session 11): the FP8 overlap build against its kOptVecWide twin (12 producer rows in flight; same bits)
ROWS_VW = {"fp8": ("ws3p1voa", "ws3p1voaw")}
# --thresh (session 14): the defaults against the threshold-rescale build (same math, other rounding: bit_equal_base
# is expected False there)
ROWS_THRESH = {"bf16": ("ws3p1oa", "ws3p1oat"), "fp8": ("ws3p1voaw", "ws3p1oat")}
FLASHMLA_TFLOPS = {128: 230.0, 64: 218.0, 256: 243.0}  # DeepSeek FlashMLA, same H200, FP8 decode s_q 2 (session 6)


def _log(msg: str) -> None:
    print(msg, flush=True)


def _cases(smoke: bool) -> tuple[list[tuple[int, int, int, int, int]], list[tuple[int, int, int]]]:
    """(b, s_q, n_comp, k_comp, win) decode cases and (t, k_comp, win) prefill cases."""
    if smoke:
        return [(2, 2, 48, 24, 8)], [(8, 24, 8)]
    dec = [(b, 2, 16384, 512, 128) for b in (128, 32, 64, 256)] + [(128, 1, 16384, 512, 128)]
    return dec, [(4096, 512, 128), (16384, 512, 128)]


def _fns(smoke: bool, rows: dict) -> dict:
    """name -> fn(q, kv, idx, sink) -> (out, lse) for every variant of `rows`. Smoke (CPU): the reference under every
    name (a stand-in: checks this script's plumbing, not the kernels)."""
    from deepinfer.flash_mla import reference

    names = [v for vs in rows.values() for v in vs]
    if smoke:
        return {v: (lambda q, kv, i, s: reference.sparse_attn(q, kv, i, s, SCALE)) for v in names}
    from deepinfer.flash_mla.backends.cuda import cuda_ws_decode as ws

    return {v: (lambda q, kv, i, s, v=v: ws.sparse_attn_ws(q, kv, i, s, SCALE, variant=v)) for v in names}


def _bit_equal(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0].view(torch.int16), b[0].view(torch.int16)) and torch.equal(
        a[1].view(torch.int32), b[1].view(torch.int32)
    )


def _finish(recs: dict, outs: dict, base: str, op: str, b: int, flops: float, nbytes: int, cache: str) -> None:
    """Fill in means, TFLOPS, GB/s, x base, x FlashMLA and bit equality of every record of one case and cache."""
    import kernelkit as kk

    for v, rec in recs.items():
        if rec["runs_us"] and "error" not in rec:
            us = sum(rec["runs_us"]) / len(rec["runs_us"])
            rec.update(median_us=us, tflops=kk.tflops(flops, us), gbps=kk.gbps(nbytes, us))
            rec["pct_bf16_tflops"] = kk.pct_of(rec["tflops"], kk.H200_CEILINGS["bf16_tflops"])
            if op == "decode" and rec["s_q"] == 2 and b in FLASHMLA_TFLOPS and cache == "fp8":
                rec["x_flashmla"] = rec["tflops"] / FLASHMLA_TFLOPS[b]
        if v != base and v in outs and base in outs:
            rec["bit_equal_base"] = _bit_equal(outs[v], outs[base])
    base_us = recs[base].get("median_us")
    for rec in recs.values():
        if base_us and rec.get("median_us"):
            rec["x_base"] = base_us / rec["median_us"]


def run_case(op: str, b: int, s_q: int, idx: torch.Tensor, caches: dict, cfg: dict) -> list[dict]:
    """Every variant of cfg["rows"] (cache -> (base, variants...)) on one case, A B B A per cache; a record per
    variant (error on failure). caches: cache name -> the cache tensor of that format."""
    import kernelkit as kk

    t, k = idx.shape[0] * (idx.shape[1] if idx.dim() == 3 else 1), idx.shape[-1]
    idx2 = idx.reshape(t, k)
    dev = idx2.device
    g = torch.Generator(device=dev).manual_seed(t * 7 + k)
    q = torch.randn(t, H, D, generator=g, device=dev).bfloat16()
    sink = torch.randn(H, generator=g, device=dev)
    valid = int((idx2 >= 0).sum())
    flops = 2 * H * valid * (D + D)
    shape = f"b={b} s_q={s_q} k={k}" if op == "decode" else f"t={t} k={k}"
    fns = _fns(cfg["smoke"], cfg["rows"])
    out: list[dict] = []
    for cache, names in cfg["rows"].items():
        kv = caches[cache]
        recs = {v: {"op": op, "shape": shape, "impl": f"cuda_{v}_{cache}", "variant": v, "cache": cache,
                    "base": names[0], "b": b, "s_q": s_q, "t": t, "topk": k, "valid": valid,
                    "runs_us": []} for v in names}  # fmt: skip
        outs: dict = {}
        for v in (*names, *reversed(names)):  # A B B A: drift hits both alike
            rec = recs[v]
            if "error" in rec:
                continue
            try:
                fn = fns[v]
                st = kk.bench_cuda(lambda fn=fn, kv=kv: fn(q, kv, idx2, sink), warmup=cfg["warmup"], rep=cfg["rep"])
                rec["runs_us"].append(st["median_us"])
                rec["timer"] = st["timer"]
                if v not in outs:
                    outs[v] = fn(q, kv, idx2, sink)
            except Exception as exc:  # record and go on: one failing variant must not lose the others
                rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
        nbytes = valid * (584 if cache == "fp8" else 1024) + idx2.numel() * 4 + 2 * t * H * D * 2
        _finish(recs, outs, names[0], op, b, flops, nbytes, cache)
        for rec in recs.values():
            _log(f"  {op} {shape} {rec['impl']}: " + _summary(rec))
        out += recs.values()
    return out


def _summary(rec: dict) -> str:
    if "error" in rec:
        return rec["error"]
    if "median_us" not in rec:
        return "no time"
    eq = rec.get("bit_equal_base")
    return (
        f"{rec['median_us']:.1f} us ({', '.join(f'{u:.1f}' for u in rec['runs_us'])}), {rec['tflops']:.1f} TFLOPS, "
        f"x {rec['base']} {rec.get('x_base', float('nan')):.3f}" + ("" if eq is None else f", bit-equal {eq}")
    )


def run(
    smoke: bool, out_path: str | None, rows: dict | None = None, cases: tuple | None = None, script: str | None = None
) -> list[dict]:
    """Time every case (`_cases`, or `cases` = (decode cases, prefill cases)) for `rows` (default ROWS); records to
    out_path after every case. bench_fm_fp8v.py runs its session-9 rows through here."""
    import kernelkit as kk
    from deepinfer.flash_mla import api

    rows = ROWS if rows is None else rows
    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    cfg = {"smoke": smoke, "warmup": 1 if smoke else 5, "rep": 2 if smoke else 30, "rows": rows}
    g = torch.Generator(device=dev).manual_seed(0)
    dec, pre = _cases(smoke) if cases is None or smoke else cases
    region = max(c[2] + c[4] for c in dec)
    t0 = time.time()
    bf16 = torch.randn(max(c[0] for c in dec) * region, D, generator=g, device=dev).bfloat16()
    caches = {"bf16": bf16, "fp8": api.pack_fp8_kv(bf16)}
    _log(f"caches: {bf16.shape[0]} rows in {time.time() - t0:.1f} s")
    meta = {"package": "flash_mla", "script": script or "bench_fm_overlap", "smoke": smoke, "rows": rows, "heads": H,
            "d": D}  # fmt: skip
    records: list[dict] = []
    for b, s_q, n_comp, k_comp, win in dec:
        idx = decode_indices(b, s_q, n_comp, k_comp, win, region, g)
        records += run_case("decode", b, s_q, idx, caches, cfg)
        if out_path:
            kk.write_results_json(out_path, records, meta)
    del caches, bf16
    for t, k_comp, win in pre:
        idx, rows = prefill_indices(t, k_comp, win, g)
        pkv = torch.randn(rows, D, generator=g, device=dev).bfloat16()
        records += run_case("prefill", t, 1, idx, {"bf16": pkv, "fp8": api.pack_fp8_kv(pkv)}, cfg)
        if out_path:
            kk.write_results_json(out_path, records, meta)
    _log(f"done in {time.time() - t0:.1f} s")
    return records


def table(path: str) -> str:
    """Markdown: per case and cache, each variant's us, TFLOPS, x the default, x FlashMLA and bit-equality."""
    return table_of(json.loads(pathlib.Path(path).read_text())["records"])


def table_of(recs: list[dict]) -> str:
    """`table` of records already loaded."""
    lines = [
        "| op | shape | cache | variant | us | TFLOPS | x default | x FlashMLA | bits = default |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        head = f"| {r['op']} | {r['shape']} | {r['cache']} | {r['variant']} |"
        if "error" in r or "median_us" not in r:
            lines.append(f"{head} error: {r.get('error', 'no time')[:80]} |")
            continue
        xf = f"{r['x_flashmla']:.2f}" if "x_flashmla" in r else "-"
        eq = r.get("bit_equal_base")
        lines.append(
            f"{head} {r['median_us']:.1f} | {r['tflops']:.1f} | {r.get('x_base', float('nan')):.3f} | {xf} | "
            f"{'-' if eq is None else eq} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", metavar="JSON", help="write the records here (after every case)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, the reference as a stand-in")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a saved result and exit")
    ap.add_argument("--vw", action="store_true", help="FP8 cache: ws3p1voa against ws3p1voaw (kOptVecWide)")
    ap.add_argument("--thresh", action="store_true", help="the defaults against ws3p1oat (kOptThresh)")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    if not args.smoke and not torch.cuda.is_available():
        ap.error("no CUDA device: only --smoke or --table run here")
    flag = "--vw" if args.vw else "--thresh" if args.thresh else ""
    rows = {"--vw": ROWS_VW, "--thresh": ROWS_THRESH}.get(flag)
    recs = run(args.smoke, args.out, rows=rows, script=f"bench_fm_overlap {flag}".strip())
    return 1 if args.smoke and any("error" in r for r in recs) else 0


if __name__ == "__main__":
    sys.exit(main())
