"""Session 7 small-batch / long-list bench of the serial CUDA kernel: split counts x merges, side by side with today's
default (kernel="cuda" with DEFAULT_OPTIONS: plan "auto", merge "pdl").

Cases (V4: 64 heads x 512, ~3 % holes, random q / sink, the rows of bench_flash_mla.decode_indices):
* decode, 128 window + 512 of 16,384 compressed rows (640 indices = 10 tiles), b = 1, 2, 4 x s_q = 1, 2;
* HCA at 1M context, 128 window + all 8,192 compressed rows (130 tiles), b = 1 s_q = 1, 2 and b = 32 s_q = 2;
each on the BF16 and the FP8 cache. Rows per case and cache (`_fp8` suffix: FP8 cache):
* `default`: kernel="cuda" as the API runs it today; every other row has `x_vs_default` (default time / its time);
* `wide`: the same plan, merge="pdl_wide" (csrc/cuda/fm_combine_wide.cu: bit-equal to "pdl", fewer serial L2
  round trips); `bit_equal_to_default` says whether its output equals the default's bit for bit;
* `wave_pdl` / `wave_wide` (HCA): plan "wave" (one CTA per tile when that fits one wave) under each PDL merge;
* `s<N>_pdl` / `s<N>_wide`: N splits per token (tiles per split = ceil(tiles / N)) under each PDL merge: the plan
  sweep (which split count wins, once the merge is cheap?);
* b = 2 s_q = 2 FP8 rows carry `x_vs_flashmla` (DeepSeek FlashMLA 15.2 us on the same H200, its own harness).
Every row: median us (CUDA-graph replays, 256 MiB L2 flush before each), TFLOPS, "effective" GB/s (bytes of the
indexed rows + q / out / indices over the time: the issue's HCA metric) and % of the 4.07 TB/s copy ceiling, the max
|out - reference|. Usage: --out RESULT.json (GPU, ~1 min), --smoke (CPU, Triton interpreter: the harness only; the
CUDA rows record "skipped"), --table RESULT.json (markdown).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

_HERE = pathlib.Path(__file__).resolve().parent
_PKG = _HERE.parent
for _p in (_PKG / "src", _PKG.parent / "kernelkit" / "src", _HERE):  # source tree first, as the root conftest does
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402

H, D = 64, 512
SCALE = D**-0.5
FLASHMLA_B2_FP8_US = 15.2  # DeepSeek FlashMLA, b = 2 s_q = 2, 640 indices, FP8 cache, same H200 (h200-ceilings.md)


def _log(msg: str) -> None:
    print(msg, flush=True)


def _cases(smoke: bool) -> list[tuple[str, int, int, int, int, int]]:
    """(op, b, s_q, n_comp, k_comp, win)."""
    if smoke:
        return [("decode", 1, 2, 48, 24, 8)]
    dec = [("decode", b, s, 16384, 512, 128) for b in (1, 2, 4) for s in (1, 2)]
    return dec + [("decode_hca1m", 1, 1, 8192, 8192, 128), ("decode_hca1m", 1, 2, 8192, 8192, 128),
                  ("decode_hca1m", 32, 2, 8192, 8192, 128)]  # fmt: skip


def _sweep(op: str, b: int, s_q: int) -> tuple[int, ...]:
    """Split counts per token to time besides the default plan's (10 tiles at decode, 130 at HCA)."""
    if op == "decode":
        return (2, 5, 10)  # 5, 2 and 1 tiles per split (auto: 10 when t * 10 <= 132 CTAs)
    if b == 1:
        return (9, 17, 33, 44, 65, 130)  # 15, 8, 4, 3, 2 and 1 tiles per split (auto: 65)
    return (1, 2, 4)  # b = 32 s_q = 2: 64 tokens fill the SMs (auto: 2)


def _impls(op: str, b: int, s_q: int, smoke: bool) -> list[tuple[str, dict]]:
    """(row name without the cache suffix, sparse_attn_split_triton kwargs)."""
    if smoke:
        return [("split", dict(kernel="fused")), ("default", dict(kernel="cuda"))]
    rows = [("default", dict(kernel="cuda")), ("wide", dict(kernel="cuda", cuda_merge="pdl_wide"))]
    if op != "decode":  # plan "wave": 130 one-tile CTAs at b = 1 s_q = 1, else auto's plan (decode: always auto's)
        rows += [(f"wave_{m}", dict(kernel="cuda", cuda_plan="wave", cuda_merge=m)) for m in ("pdl", "pdl_wide")]
    for n in _sweep(op, b, s_q):
        rows += [(f"s{n}_{m}", dict(kernel="cuda", num_splits=n, cuda_merge=m)) for m in ("pdl", "pdl_wide")]
    return [(name.replace("pdl_wide", "wide"), kw) for name, kw in rows]


def _bytes(idx: torch.Tensor, t: int, row_bytes: int) -> int:
    """Indexed rows (valid entries) + q in + out (bf16) + the index list itself."""
    return int((idx >= 0).sum()) * row_bytes + 2 * t * H * D * 2 + idx.numel() * 4


def _time_row(name: str, fn, cfg: dict, rec: dict) -> torch.Tensor | None:  # noqa: ANN001
    """Time fn into rec (median_us, p10, p90) and return its output; on failure rec["error"] and None."""
    import kernelkit as kk

    try:
        out = fn()[0]
        st = kk.bench_cuda(fn, warmup=cfg["warmup"], rep=cfg["rep"])
        rec.update(median_us=st["median_us"], p10=st["p10"], p90=st["p90"], timer=st.get("timer"))
        return out
    except Exception as exc:  # record and go on: one failing row must not lose the others
        rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
        return None


def run_case(op: str, b: int, s_q: int, idx: torch.Tensor, caches: dict, cfg: dict) -> list[dict]:
    """Every row of one case on both caches; speed-ups against the same cache's `default` row."""
    import kernelkit as kk
    from deepinfer.flash_mla import reference
    from deepinfer.flash_mla.backends.cuda import triton_split_attn as tsa

    t, k = b * s_q, idx.shape[-1]
    idx2 = idx.reshape(t, k)
    dev = idx.device
    g = torch.Generator(device=dev).manual_seed(t * 7 + k)
    q = torch.randn(t, H, D, generator=g, device=dev).bfloat16()
    sink = torch.randn(H, generator=g, device=dev)
    valid = int((idx2 >= 0).sum())
    flops = 2 * H * valid * (D + D)
    shape = f"b={b} s_q={s_q} k={k}"
    recs = []
    for suffix, cache in caches.items():
        ref = reference.sparse_attn(q, cache, idx2, sink, SCALE)[0].float()
        outs, times = {}, {}
        for name, kw in _impls(op, b, s_q, cfg["smoke"]):
            row = name + suffix
            rec = {"op": op, "shape": shape, "impl": row, "b": b, "s_q": s_q, "t": t, "topk": k, "valid": valid}
            if cfg["smoke"] and kw.get("kernel") == "cuda":
                rec["skipped"] = "no GPU: the CUDA kernel runs only in the GPU bench"
                recs.append(rec)
                continue
            why = cfg.get("cuda_error") or (cfg.get("wide_error") if kw.get("cuda_merge") == "pdl_wide" else None)
            if why and kw.get("kernel") == "cuda":
                rec["error"] = why
                recs.append(rec)
                continue

            def fn(kw=kw, cache=cache):  # noqa: ANN001, ANN202
                return tsa.sparse_attn_split_triton(q, cache, idx2, sink, SCALE, **kw)

            out = _time_row(row, fn, cfg, rec)
            if out is not None:
                us = rec["median_us"]
                outs[name], times[name] = out, us
                rec["tflops"] = kk.tflops(flops, us)
                rec["gbps"] = kk.gbps(_bytes(idx2, t, 584 if suffix else 2 * D), us)
                rec["pct_hbm_copy"] = kk.pct_of(rec["gbps"], kk.H200_CEILINGS["hbm_copy_gbps"])
                rec["pct_bf16_tflops"] = kk.pct_of(rec["tflops"], kk.H200_CEILINGS["bf16_tflops"])
                rec["max_abs_err_vs_ref"] = float((out.float() - ref).abs().max())
            recs.append(rec)
        _finish(recs, outs, times, suffix, (op, b, s_q, k))
        for rec in recs:
            if rec["impl"].endswith(suffix) and rec.get("_logged") is None:
                rec["_logged"] = True
                _log(f"  {op} {shape} {rec['impl']}: {_summary(rec)}")
    for rec in recs:
        rec.pop("_logged", None)
    return recs


def _finish(recs: list[dict], outs: dict, times: dict, suffix: str, key: tuple) -> None:
    """x_vs_default, bit_equal_to_default (same plan, other merge) / to the pdl row of the same split count."""
    base = outs.get("default")
    for rec in recs:
        name = rec["impl"][: len(rec["impl"]) - len(suffix)] if suffix else rec["impl"]
        if not rec["impl"].endswith(suffix) or (suffix == "" and rec["impl"].endswith("_fp8")) or name not in times:
            continue
        if "default" in times and name != "default":
            rec["x_vs_default"] = times["default"] / times[name]
        if name == "wide" and base is not None:
            rec["bit_equal_to_default"] = bool(torch.equal(outs[name], base))
        if name.endswith("_wide") and name.replace("_wide", "_pdl") in outs:
            rec["bit_equal_to_pdl"] = bool(torch.equal(outs[name], outs[name.replace("_wide", "_pdl")]))
        if suffix and key == ("decode", 2, 2, 640):
            rec["flashmla_h200_us"] = FLASHMLA_B2_FP8_US
            rec["x_vs_flashmla"] = FLASHMLA_B2_FP8_US / times[name]


def _summary(rec: dict) -> str:
    if "error" in rec:
        return "error: " + rec["error"]
    if "skipped" in rec:
        return "skipped"
    s = f"{rec['median_us']:.1f} us {rec['tflops']:.1f} TFLOPS {rec['gbps']:.0f} GB/s"
    s += f" err {rec['max_abs_err_vs_ref']:.2e}"
    for k in ("x_vs_default", "x_vs_flashmla"):
        if k in rec:
            s += f" {k} {rec[k]:.2f}"
    for k in ("bit_equal_to_default", "bit_equal_to_pdl"):
        if k in rec:
            s += f" {k}={rec[k]}"
    return s


_WIDE_PROBE = """
import torch
from deepinfer.flash_mla.backends.cuda import triton_split_attn as tsa
g = torch.Generator(device="cuda").manual_seed(0)
kv = torch.randn(16384, 512, generator=g, device="cuda").bfloat16()
idx = torch.randperm(16384, generator=g, device="cuda")[: 130 * 64].view(1, -1).int()
q = torch.randn(1, 64, 512, generator=g, device="cuda").bfloat16()
a = tsa.sparse_attn_split_triton(q, kv, idx, None, 512**-0.5, kernel="cuda", cuda_merge="pdl")
b = tsa.sparse_attn_split_triton(q, kv, idx, None, 512**-0.5, kernel="cuda", cuda_merge="pdl_wide")
torch.cuda.synchronize()
assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "pdl_wide differs from pdl"
print("WIDE OK")
"""


def _wide_probe_error() -> str | None:
    """One pdl_wide call in a child process (65 splits, against pdl): None when it ran and matched, else why. A
    kernel that faults there cannot take this process's CUDA context (and the other rows) down."""
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        proc = subprocess.run([sys.executable, "-c", _WIDE_PROBE], capture_output=True, text=True, timeout=120,
                              env=env)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "pdl_wide probe timed out"
    if proc.returncode != 0 or "WIDE OK" not in proc.stdout:
        return "pdl_wide probe failed: " + (proc.stdout + proc.stderr)[-400:]
    return None


def run(smoke: bool, out_path: str | None) -> list[dict]:
    from bench_flash_mla import decode_indices

    import kernelkit as kk
    from deepinfer.flash_mla import api

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = dict(warmup=1, rep=2, smoke=True) if smoke else dict(warmup=3, rep=20, smoke=False)
    if not smoke:
        from deepinfer.flash_mla.backends.cuda import cuda_sparse_decode as cu

        ok, out = cu.probe()  # the default kernel's own out-of-process check (faults end a CUDA context)
        if not ok:
            _log(f"CUDA kernel probe failed, every CUDA row will record it: {out[-300:]}")
            cfg["cuda_error"] = "CUDA kernel probe failed: " + out[-300:]
        else:
            cfg["wide_error"] = _wide_probe_error()
            _log(f"pdl_wide probe: {cfg['wide_error'] or 'ok (bit-equal to pdl)'}")
    g = torch.Generator(device=dev).manual_seed(0)
    cases = _cases(smoke)
    region = max(c[3] + c[5] for c in cases)
    b_max = max(c[1] for c in cases)
    t0 = time.time()
    cache = torch.randn(b_max * region, D, generator=g, device=dev).bfloat16()
    caches = {"": cache, "_fp8": api.pack_fp8_kv(cache)}
    _log(f"caches: {b_max} x {region} rows in {time.time() - t0:.1f} s")
    meta = {"package": "flash_mla", "bench": "bench_fm_small", "smoke": smoke, "heads": H, "d": D}
    records: list[dict] = []
    for op, b, s_q, n_comp, k_comp, win in cases:
        idx = decode_indices(b, s_q, n_comp, k_comp, win, region, g)
        try:
            records += run_case(op, b, s_q, idx, caches, cfg)
        except Exception as exc:  # a case-level failure (reference, inputs): record it, keep the others
            records.append({"op": op, "b": b, "s_q": s_q, "impl": "case", "error": f"{type(exc).__name__}: {exc}"})
            _log(f"  {op} b={b} s_q={s_q}: case failed: {exc}")
        if out_path:
            kk.write_results_json(out_path, records, meta)
    _log(f"done in {time.time() - t0:.1f} s")
    return records


def table(path: str) -> str:
    """Markdown table of a saved result: per case and row, time, effective GB/s, x default, bit-equality."""
    recs = json.loads(pathlib.Path(path).read_text())["records"]
    lines = ["| op | shape | impl | us | GB/s (eff.) | % copy | x default | x FlashMLA | bit-equal | max err |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in recs:
        if "median_us" not in r:
            why = r.get("error", r.get("skipped", ""))[:60]
            lines.append(f"| {r['op']} | {r.get('shape', '')} | {r['impl']} | {why} | | | | | | |")
            continue
        xd, xf = r.get("x_vs_default"), r.get("x_vs_flashmla")
        be = r.get("bit_equal_to_default", r.get("bit_equal_to_pdl", ""))
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['impl']} | {r['median_us']:.1f} | {r['gbps']:.0f} "
            f"| {r['pct_hbm_copy']:.1f} | {f'{xd:.2f}' if xd else ''} | {f'{xf:.2f}' if xf else ''} | {be} "
            f"| {r['max_abs_err_vs_ref']:.1e} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON results here")
    ap.add_argument("--smoke", action="store_true", help="tiny shape on CPU (Triton interpreter): the harness only")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a saved result and exit")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    if args.smoke:
        global H
        H = 16  # the interpreter is slow; FP8 rows fix d = 512
    if not torch.cuda.is_available():
        if not args.smoke:
            ap.error("no CUDA device: only --smoke (Triton interpreter) or --table run here")
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported
    recs = run(args.smoke, args.out)
    failed = [r for r in recs if "error" in r]
    _log(f"{len(recs)} records, {len(failed)} failed" + (f"; results in {args.out}" if args.out else ""))
    return 1 if failed and args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
