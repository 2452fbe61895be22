"""Session 10: the narrow PDL merge ("pdl_narrow", merge 4: 32-dim items, twice the warps) against "pdl_wide" (the
default merge) on the serial kernel where few tokens carry many splits: HCA at 1M context (128 window + 8,192
compressed rows) b = 1 x s_q = 1 / 2, and decode b = 1 x s_q = 1 / b = 2 x s_q = 2 (640 indices). Nsight Compute put
the wide merge at 11.9 us of the HCA b = 1 call (64 CTAs reading 8.5 MB of partials) next to 13.4 us of attention.
Rows per case and cache (BF16, FP8): `auto_wide` (the default), `auto_narrow`, and the "fine" plan (one tile per
split: twice the splits at HCA b = 1) with each merge. Rows are interleaved over R rounds (kernelkit.bench_cuda
medians); every row's out / lse are compared bit for bit with `auto_wide`'s (`bits_eq`).

    python packages/flash_mla/benchmarks/bench_fm_narrow.py --out RESULT.json   # H200, ~30 s
    python packages/flash_mla/benchmarks/bench_fm_narrow.py --smoke             # CPU: builds the rows, runs none
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
from collections.abc import Callable

_HERE = pathlib.Path(__file__).resolve().parent
for _p in (_HERE.parent / "src", _HERE.parent.parent / "kernelkit" / "src", _HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402

H, D = 64, 512
# (op, b, s_q, compressed rows per request, compressed rows picked per query)
CASES = (("decode_hca1m", 1, 1, 8192, 8192), ("decode_hca1m", 1, 2, 8192, 8192), ("decode", 1, 1, 16384, 512),
         ("decode", 2, 2, 16384, 512))  # fmt: skip
ROWS = (("auto", "pdl_wide"), ("auto", "pdl_narrow"), ("fine", "pdl_wide"), ("fine", "pdl_narrow"))


def _rows(q: torch.Tensor, caches: dict, idx2: torch.Tensor, sink: torch.Tensor) -> dict[str, Callable]:
    """name -> zero-argument callable returning (out, lse); idx2 [t, k] int32."""
    from deepinfer.flash_mla.backends.cuda import triton_split_attn as tsa

    rows = {}
    for suffix, cache in caches.items():
        for plan, merge in ROWS:
            rows[f"{plan}_{merge.removeprefix('pdl_')}{suffix}"] = lambda c=cache, p=plan, m=merge: (
                tsa.sparse_attn_split_triton(q, c, idx2, sink, D**-0.5, kernel="cuda", cuda_plan=p, cuda_merge=m)
            )
    return rows


def _case(op: str, b: int, s_q: int, n_comp: int, k_comp: int, rounds: int) -> list[dict]:
    from bench_flash_mla import decode_indices

    import kernelkit as kk
    from deepinfer.flash_mla import api

    g = torch.Generator(device="cuda").manual_seed(10)
    region = n_comp + 128
    idx = decode_indices(b, s_q, n_comp, k_comp, 128, region, g)
    cache = torch.randn(b * region, D, generator=g, device="cuda").bfloat16()
    caches = {"_bf16": cache, "_fp8": api.pack_fp8_kv(cache)}
    q = torch.randn(b * s_q, H, D, generator=g, device="cuda").bfloat16()
    sink = torch.randn(H, generator=g, device="cuda")
    rows = _rows(q, caches, idx.view(b * s_q, -1), sink)
    outs = {name: [t.clone() for t in fn()] for name, fn in rows.items()}
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(rounds):
        for name, fn in rows.items():
            times[name].append(float(kk.bench_cuda(fn, warmup=10, rep=200)["median_us"]))
    valid = int((idx >= 0).sum())
    recs = []
    for name, ts in times.items():
        suffix = "_fp8" if name.endswith("_fp8") else "_bf16"
        base = f"auto_wide{suffix}"
        us = statistics.median(ts)
        row_bytes = (584 if suffix == "_fp8" else 1024) * valid
        bits = all(torch.equal(a, b_) for a, b_ in zip(outs[name], outs[base], strict=True))
        recs.append({"op": op, "b": b, "s_q": s_q, "topk": idx.shape[-1], "valid": valid, "impl": name,
                     "median_us": us, "round_medians_us": ts, "tflops": kk.tflops(2 * H * valid * 2 * D, us),
                     "gbps": row_bytes / us / 1e3, "bits_eq_auto_wide": bits})  # fmt: skip
    us = {r["impl"]: r["median_us"] for r in recs}
    for r in recs:
        base = "auto_wide" + ("_fp8" if r["impl"].endswith("_fp8") else "_bf16")
        r["x_vs_auto_wide"] = us[base] / r["median_us"]
        print(f"{op} b={b} s_q={s_q} {r['impl']}: {r['median_us']:.2f} us {r['gbps']:.0f} GB/s "
              f"x_wide={r['x_vs_auto_wide']:.3f} bits_eq={r['bits_eq_auto_wide']}", flush=True)  # fmt: skip
    return recs


def run(rounds: int, out_path: str | None) -> list[dict]:
    import kernelkit as kk

    records: list[dict] = []
    for case in CASES:
        try:
            records += _case(*case, rounds)
        except Exception as e:  # noqa: BLE001 - record the failure, keep the other cases
            records.append({"op": case[0], "b": case[1], "s_q": case[2], "error": f"{type(e).__name__}: {e}"})
            print(f"{case}: FAILED {records[-1]['error']}", flush=True)
        if out_path:
            kk.write_results_json(out_path, records, {"package": "flash_mla", "bench": "bench_fm_narrow"})
    return records


def smoke() -> None:
    """CPU: build every row on tiny tensors without running a kernel."""
    from deepinfer.flash_mla import api

    cache = torch.randn(64, D).bfloat16()
    rows = _rows(torch.randn(2, H, D).bfloat16(), {"_bf16": cache, "_fp8": api.pack_fp8_kv(cache)},
                 torch.randint(0, 64, (2, 64), dtype=torch.int32), torch.randn(H))  # fmt: skip
    assert len(rows) == 2 * len(ROWS) and "auto_wide_bf16" in rows and "fine_narrow_fp8" in rows, sorted(rows)
    print(f"smoke: {len(rows)} rows: {', '.join(sorted(rows))}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON results here")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="CPU: build the rows, run none")
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return 0
    run(args.rounds, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
