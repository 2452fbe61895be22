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

_HERE = pathlib.Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

import bench_fm_overlap as ovl  # noqa: E402  (the A B B A machinery, shared since session 10)

BASE = "ws3p1"  # the FP8 default of session 9 (ws3p1v replaced it there)
VARIANTS = ("ws3p1", "ws3p1v")
BF16_VARIANTS = ("ws3p1l", "ws3p1")  # --bf16: the BF16-cache default ws3p1l against ws3p1
CASES = ([(b, 2, 16384, 512, 128) for b in (128, 64, 256, 32)], [(4096, 512, 128)])


def run(smoke: bool, out_path: str | None, bf16: bool = False) -> list[dict]:
    """The session-9 rows (FP8 cache: ws3p1 vs ws3p1v; bf16: ws3p1l vs ws3p1) through bench_fm_overlap.run."""
    rows = {"bf16": BF16_VARIANTS} if bf16 else {"fp8": VARIANTS}
    return ovl.run(smoke, out_path, rows=rows, cases=CASES, script="bench_fm_fp8v")


def table(path: str) -> str:
    """Markdown table of a result JSON; session-9 files (keys bit_equal_ws3p1 / x_ws3p1, FP8 only) are read too."""
    recs = json.loads(pathlib.Path(path).read_text())["records"]
    for r in recs:
        r.setdefault("cache", "fp8")
        if "bit_equal_" + BASE in r:
            r["bit_equal_base"] = r.pop("bit_equal_" + BASE)
        if "x_" + BASE in r:
            r["x_base"] = r.pop("x_" + BASE)
    return ovl.table_of(recs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", metavar="JSON", help="write the records here (after every case)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, the reference as a stand-in")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a saved result and exit")
    ap.add_argument("--bf16", action="store_true", help="BF16 cache: ws3p1l (its default) vs ws3p1")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    if not args.smoke and not ovl.torch.cuda.is_available():
        ap.error("no CUDA device: only --smoke or --table run here")
    recs = run(args.smoke, args.out, args.bf16)
    return 1 if args.smoke and any("error" in r for r in recs) else 0


if __name__ == "__main__":
    sys.exit(main())
