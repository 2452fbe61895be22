"""FP8-cache producer side by side (session 9): ws3p1 (FP8 default) vs ws3p1v (kOptVec: lane-uniform FP8 producer).

    python packages/flash_mla/benchmarks/bench_fm_fp8v.py --out RESULT.json   # GPU (~25 s)
    python packages/flash_mla/benchmarks/bench_fm_fp8v.py --smoke             # CPU: stand-in rows (reference)
    python packages/flash_mla/benchmarks/bench_fm_fp8v.py --table RESULT.json # markdown table

Cases: decode b 128 / 64 / 256 / 32 x s_q 2 (64 heads, topk 640 = a 128-row window + 512 of 16,384 compressed rows,
bench_flash_mla.decode_indices: same index generation, ~3 % holes) and prefill t 4,096 (bench_flash_mla.
prefill_indices), all on a packed FP8 cache (584-byte rows). Each variant is timed twice in A B B A order
(kernelkit.bench_cuda, L2 flushed, CUDA graph), the record keeps both medians and their mean; every other row also
records whether its out / lse are bit-identical to ws3p1's on the same call (they must be). TFLOPS = 4 * 64 * valid
indices * 512 / time (bench_flash_mla's count); "x FlashMLA" against DeepSeek FlashMLA on the same H200 (session 6:
230 / 218 / 243 TFLOPS at b 128 / 64 / 256 x s_q 2).
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
BASE = "ws3p1"  # the FP8 default (cuda_ws_decode.default_variant)
VARIANTS = ("ws3p1", "ws3p1v")
CACHE = "fp8"  # --bf16: the BF16-cache default ws3p1l against ws3p1 (ws3p1v runs ws3p1 itself there)
FLASHMLA_TFLOPS = {128: 230.0, 64: 218.0, 256: 243.0}  # DeepSeek FlashMLA, same H200, decode s_q 2 (session 6)


def _log(msg: str) -> None:
    print(msg, flush=True)


def _cases(smoke: bool) -> tuple[list[tuple[int, int, int, int, int]], list[tuple[int, int, int]]]:
    """(b, s_q, n_comp, k_comp, win) decode cases and (t, k_comp, win) prefill cases."""
    if smoke:
        return [(2, 2, 48, 24, 8)], [(8, 24, 8)]
    return [(b, 2, 16384, 512, 128) for b in (128, 64, 256, 32)], [(4096, 512, 128)]


def _fns(smoke: bool) -> dict:
    """name -> fn(q, kv, idx, sink) -> (out, lse). Smoke (CPU): the reference under every name (a stand-in: checks
    this script's plumbing, not the kernels)."""
    from deepinfer.flash_mla import reference

    if smoke:
        return {v: (lambda q, kv, i, s: reference.sparse_attn(q, kv, i, s, SCALE)) for v in VARIANTS}
    from deepinfer.flash_mla.backends.cuda import cuda_ws_decode as ws

    return {v: (lambda q, kv, i, s, v=v: ws.sparse_attn_ws(q, kv, i, s, SCALE, variant=v)) for v in VARIANTS}


def _bit_equal(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0].view(torch.int16), b[0].view(torch.int16)) and torch.equal(
        a[1].view(torch.int32), b[1].view(torch.int32)
    )


def run_case(op: str, b: int, s_q: int, idx: torch.Tensor, kv: torch.Tensor, cfg: dict) -> list[dict]:
    """Every variant on one case, A B B A; one record per variant (error string on failure)."""
    import kernelkit as kk

    t, k = idx.shape[0] * (idx.shape[1] if idx.dim() == 3 else 1), idx.shape[-1]
    idx2 = idx.reshape(t, k)
    g = torch.Generator(device=kv.device).manual_seed(t * 7 + k)
    q = torch.randn(t, H, D, generator=g, device=kv.device).bfloat16()
    sink = torch.randn(H, generator=g, device=kv.device)
    valid = int((idx2 >= 0).sum())
    flops = 2 * H * valid * (D + D)
    shape = f"b={b} s_q={s_q} k={k}" if op == "decode" else f"t={t} k={k}"
    fns = _fns(cfg["smoke"])
    recs = {v: {"op": op, "shape": shape, "impl": f"cuda_{v}_{CACHE}", "variant": v, "b": b, "s_q": s_q, "t": t,
                "topk": k, "valid": valid, "runs_us": []} for v in VARIANTS}  # fmt: skip
    outs: dict = {}
    for v in (*VARIANTS, *reversed(VARIANTS)):  # A B B A: drift hits both alike
        rec = recs[v]
        if "error" in rec:
            continue
        try:
            fn = fns[v]
            st = kk.bench_cuda(lambda fn=fn: fn(q, kv, idx2, sink), warmup=cfg["warmup"], rep=cfg["rep"])
            rec["runs_us"].append(st["median_us"])
            rec["timer"] = st["timer"]
            if v not in outs:
                outs[v] = fn(q, kv, idx2, sink)
        except Exception as exc:  # record and go on: one failing variant must not lose the others
            rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
    for v, rec in recs.items():
        if rec["runs_us"] and "error" not in rec:
            us = sum(rec["runs_us"]) / len(rec["runs_us"])
            rec.update(median_us=us, tflops=kk.tflops(flops, us))
            rec["pct_bf16_tflops"] = kk.pct_of(rec["tflops"], kk.H200_CEILINGS["bf16_tflops"])
            rec["gbps"] = kk.gbps(valid * (584 if CACHE == "fp8" else 1024) + idx2.numel() * 4 + 2 * t * H * D * 2, us)
            if op == "decode" and b in FLASHMLA_TFLOPS and CACHE == "fp8":
                rec["x_flashmla"] = rec["tflops"] / FLASHMLA_TFLOPS[b]
        if v != BASE and v in outs and BASE in outs:
            rec["bit_equal_" + BASE] = _bit_equal(outs[v], outs[BASE])
    base = recs[BASE].get("median_us")
    for rec in recs.values():
        if base and rec.get("median_us"):
            rec["x_" + BASE] = base / rec["median_us"]
        _log(f"  {op} {shape} {rec['impl']}: " + _summary(rec))
    return list(recs.values())


def _summary(rec: dict) -> str:
    if "error" in rec:
        return rec["error"]
    if "median_us" not in rec:
        return "no time"
    eq = rec.get("bit_equal_" + BASE)
    return (
        f"{rec['median_us']:.1f} us ({', '.join(f'{u:.1f}' for u in rec['runs_us'])}), {rec['tflops']:.1f} TFLOPS, "
        f"x {BASE} {rec.get('x_' + BASE, float('nan')):.3f}" + ("" if eq is None else f", bit-equal {eq}")
    )


def run(smoke: bool, out_path: str | None) -> list[dict]:
    import kernelkit as kk
    from deepinfer.flash_mla import api

    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    cfg = {"smoke": smoke, "warmup": 1 if smoke else 5, "rep": 2 if smoke else 30}
    g = torch.Generator(device=dev).manual_seed(0)
    dec, pre = _cases(smoke)
    region = max(c[2] + c[4] for c in dec)
    t0 = time.time()
    pack = api.pack_fp8_kv if CACHE == "fp8" else (lambda x: x)
    fp8 = pack(torch.randn(max(c[0] for c in dec) * region, D, generator=g, device=dev).bfloat16())
    _log(f"FP8 cache: {fp8.shape[0]} rows in {time.time() - t0:.1f} s")
    meta = {
        "package": "flash_mla",
        "script": "bench_fm_fp8v",
        "smoke": smoke,
        "base": BASE,
        "cache": CACHE,
        "heads": H,
        "d": D,
    }
    records: list[dict] = []
    for b, s_q, n_comp, k_comp, win in dec:
        records += run_case("decode", b, s_q, decode_indices(b, s_q, n_comp, k_comp, win, region, g), fp8, cfg)
        if out_path:
            kk.write_results_json(out_path, records, meta)
    del fp8
    for t, k_comp, win in pre:
        idx, rows = prefill_indices(t, k_comp, win, g)
        pkv = pack(torch.randn(rows, D, generator=g, device=dev).bfloat16())
        records += run_case("prefill", t, 1, idx, pkv, cfg)
        if out_path:
            kk.write_results_json(out_path, records, meta)
    _log(f"done in {time.time() - t0:.1f} s")
    return records


def table(path: str) -> str:
    """Markdown: per case, each variant's us, TFLOPS, x ws3p1, x FlashMLA and bit-equality with ws3p1."""
    recs = json.loads(pathlib.Path(path).read_text())["records"]
    lines = [
        f"| op | shape | variant | us | TFLOPS | x {BASE} | x FlashMLA | bits = {BASE} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        if "error" in r or "median_us" not in r:
            lines.append(f"| {r['op']} | {r['shape']} | {r['variant']} | error: {r.get('error', 'no time')[:80]} |")
            continue
        xf = f"{r['x_flashmla']:.2f}" if "x_flashmla" in r else "-"
        eq = r.get("bit_equal_" + BASE)
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['variant']} | {r['median_us']:.1f} | {r['tflops']:.1f} | "
            f"{r.get('x_' + BASE, float('nan')):.3f} | {xf} | {'-' if eq is None else eq} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", metavar="JSON", help="write the records here (after every case)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, the reference as a stand-in")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a saved result and exit")
    ap.add_argument("--bf16", action="store_true", help="BF16 cache: ws3p1l (its default) vs ws3p1")
    args = ap.parse_args()
    if args.bf16:
        global BASE, VARIANTS, CACHE
        BASE, VARIANTS, CACHE = "ws3p1l", ("ws3p1l", "ws3p1"), "bf16"
    if args.table:
        print(table(args.table))
        return 0
    if not args.smoke and not torch.cuda.is_available():
        ap.error("no CUDA device: only --smoke or --table run here")
    recs = run(args.smoke, args.out)
    return 1 if args.smoke and any("error" in r for r in recs) else 0


if __name__ == "__main__":
    sys.exit(main())
