"""FP8-cache ws3p1 with the dequant shared by consumer warpgroup 1 (session 8): ws3p1 (FP8 default) vs ws3p1s8 /
ws3p1s16 / ws3p1s24 (kOptDq*: warpgroup 1 dequantises the last 8 / 16 / 24 rows of each tile) and ws3p1s16e /
ws3p1s24e (the same for 16 / 24 rows, their raw bytes staged by cp.async a tile ahead: kOptDqEarly).

    python packages/flash_mla/benchmarks/bench_fm_ws3p_dq.py --out RESULT.json   # GPU (~60 s)
    python packages/flash_mla/benchmarks/bench_fm_ws3p_dq.py --smoke             # CPU: stand-in rows (reference)
    python packages/flash_mla/benchmarks/bench_fm_ws3p_dq.py --table RESULT.json # markdown table

Cases: decode b 128 / 64 / 256 / 32 x s_q 2 and prefill t 4,096 on a packed FP8 cache, exactly bench_fm_ws3p_fp8.py's
(its run_case: bench_flash_mla.decode_indices / prefill_indices, A B C D D C B A order, kernelkit.bench_cuda with L2
flushed, each variant's bits compared with ws3p1's on the same call, TFLOPS, x ws3p1 and x DeepSeek FlashMLA at 230 /
218 / 243 TFLOPS for b 128 / 64 / 256). The kOptDq builds use a new barrier protocol: before any timing they run the
out-of-process probe (cuda_ws_decode.probe; a hang or a trap there cannot take this process down), and a build that
fails it is recorded with the probe's error and not timed.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

_HERE = pathlib.Path(__file__).resolve().parent
_PKG = _HERE.parent
for _p in (_PKG / "src", _PKG.parent / "kernelkit" / "src", _HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import bench_fm_ws3p_fp8 as fp8b  # noqa: E402
import torch  # noqa: E402
from bench_flash_mla import decode_indices, prefill_indices  # noqa: E402

BASE = "ws3p1"
DQ = ("ws3p1s8", "ws3p1s16", "ws3p1s24", "ws3p1s16e", "ws3p1s24e")
D = fp8b.D


def _log(msg: str) -> None:
    print(msg, flush=True)


def _probe_failures(smoke: bool) -> dict[str, str]:
    """kOptDq name -> why its probe failed (empty: all passed, or the smoke run, which times stand-ins). One child
    process for all builds; only when it fails, one per build to tell which."""
    if smoke:
        return {}
    from deepinfer.flash_mla.backends.cuda import cuda_ws_decode as ws

    if not ws.ws3p_dq_available():
        return dict.fromkeys(DQ, "_C without sparse_decode_ws3p_dq (rebuild)")
    t0 = time.time()
    ok, out = ws.probe(variant=",".join(DQ), timeout_s=90.0)
    _log(f"probe {','.join(DQ)}: {'ok' if ok else 'FAILED'} in {time.time() - t0:.1f} s")
    if ok:
        return {}
    if "did not finish" in out:  # a hang (the watchdog did not fire): do not pay it once per build
        return dict.fromkeys(DQ, f"joint probe hung: {out[-400:]}")
    fails = {}
    for v in DQ:
        ok_v, out_v = ws.probe(variant=v, timeout_s=40.0)
        _log(f"probe {v}: {'ok' if ok_v else 'FAILED: ' + out_v[-300:]}")
        if not ok_v:
            fails[v] = f"probe failed: {out_v[-400:]}"
    return fails or dict.fromkeys(DQ, f"joint probe failed: {out[-400:]}")


def run(smoke: bool, out_path: str | None) -> list[dict]:
    """Every case, ws3p1 and the kOptDq builds that passed their probe side by side; the JSON is rewritten after
    each case (kernelkit.write_results_json), failed builds get one record per case with the error."""
    import kernelkit as kk
    from deepinfer.flash_mla import api

    bad = _probe_failures(smoke)
    fp8b.BASE, fp8b.CACHE = BASE, "fp8"
    fp8b.VARIANTS = (BASE, *(v for v in DQ if v not in bad))
    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    cfg = {"smoke": smoke, "warmup": 1 if smoke else 5, "rep": 2 if smoke else 30}
    g = torch.Generator(device=dev).manual_seed(0)
    dec, pre = fp8b._cases(smoke)
    region = max(c[2] + c[4] for c in dec)
    t0 = time.time()
    fp8 = api.pack_fp8_kv(torch.randn(max(c[0] for c in dec) * region, D, generator=g, device=dev).bfloat16())
    _log(f"FP8 cache: {fp8.shape[0]} rows in {time.time() - t0:.1f} s")
    meta = {"package": "flash_mla", "script": "bench_fm_ws3p_dq", "smoke": smoke, "base": BASE, "cache": "fp8",
            "variants": [BASE, *DQ], "probe_failures": bad}  # fmt: skip
    records: list[dict] = []

    def add(recs: list[dict], op: str, shape_of: dict) -> None:
        records.extend(recs)
        for v, why in bad.items():
            records.append({"op": op, **shape_of, "impl": f"cuda_{v}_fp8", "variant": v, "error": why})
        if out_path:
            kk.write_results_json(out_path, records, meta)

    for b, s_q, n_comp, k_comp, win in dec:
        idx = decode_indices(b, s_q, n_comp, k_comp, win, region, g)
        recs = fp8b.run_case("decode", b, s_q, idx, fp8, cfg)
        add(recs, "decode", {"shape": recs[0]["shape"], "b": b, "s_q": s_q})
    del fp8
    for t, k_comp, win in pre:
        idx, rows = prefill_indices(t, k_comp, win, g)
        pkv = api.pack_fp8_kv(torch.randn(rows, D, generator=g, device=dev).bfloat16())
        recs = fp8b.run_case("prefill", t, 1, idx, pkv, cfg)
        add(recs, "prefill", {"shape": recs[0]["shape"], "b": t, "s_q": 1})
    _log(f"done in {time.time() - t0:.1f} s")
    return records


def table(path: str) -> str:
    """Markdown: per case, each variant's us, TFLOPS, x ws3p1, x FlashMLA and bit-equality with ws3p1."""
    fp8b.BASE = BASE
    return fp8b.table(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", metavar="JSON", help="write the records here (after every case)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, the reference as a stand-in")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a saved result and exit")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    if not args.smoke and not torch.cuda.is_available():
        ap.error("no CUDA device: only --smoke or --table run here")
    recs = run(args.smoke, args.out)
    if not args.smoke and args.out:
        _log(table(args.out))
    return 1 if args.smoke and any("error" in r for r in recs) else 0


if __name__ == "__main__":
    sys.exit(main())
