"""Balanced pair consumers (session 11) side by side with the API default: ws3p1oa -> ws3p2 (BF16 cache), ws3p1voa ->
ws3p2v (FP8 cache).

    python packages/flash_mla/benchmarks/bench_fm_pair.py --out RESULT.json   # GPU (< 60 s)
    python packages/flash_mla/benchmarks/bench_fm_pair.py --smoke             # CPU: stand-in rows (reference)
    python packages/flash_mla/benchmarks/bench_fm_pair.py --table RESULT.json # markdown table

Cases (bench_fm_overlap's): decode b 32 / 64 / 128 / 256 x s_q 2 and b 128 x s_q 1 (64 heads, topk 640 = a 128-row
window + 512 of 16,384 compressed rows, ~3 % holes), prefill t 4,096 and 16,384 (640 indices), each on the BF16 and
the packed FP8 cache. A B B A per case and cache (kernelkit.bench_cuda, L2 flushed, CUDA graph). The pair builds sum
in another order than the default, so "bits = default" is expected False; the GPU tests bound their error
(tests/test_mla_ws3p2.py). TFLOPS = 2 * 64 * valid indices * 1024 / time; x FlashMLA against DeepSeek FlashMLA on
the same H200 (FP8 decode s_q 2: 218 / 230 / 243 TFLOPS at b 64 / 128 / 256).
"""

from __future__ import annotations

import argparse
import sys
import pathlib

_HERE = pathlib.Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

import bench_fm_overlap as ovl  # noqa: E402  (the A B B A machinery)

ROWS = {"bf16": ("ws3p1oa", "ws3p2", "ws3p2r"), "fp8": ("ws3p1voa", "ws3p2v")}
# --ablate: the pair builds with their timing-only modes (wrong results) at b 128 x s_q 2 and prefill t 4,096
ABLATE_ROWS = {c: (v, f"{v}:producer", f"{v}:consumer") for c, v in (("bf16", "ws3p2"), ("fp8", "ws3p2v"))}
ABLATE_ROWS["bf16"] += ("ws3p2r", "ws3p2r:producer")
ABLATE_CASES = ([(128, 2, 16384, 512, 128)], [(4096, 512, 128)])


def run(smoke: bool, out_path: str | None, ablate: bool = False) -> list[dict]:
    """Every bench_fm_overlap case for ROWS (the default first: the base of x default); ablate: ABLATE_ROWS at
    ABLATE_CASES."""
    if ablate:
        return ovl.run(smoke, out_path, rows=ABLATE_ROWS, cases=ABLATE_CASES, script="bench_fm_pair --ablate")
    return ovl.run(smoke, out_path, rows=ROWS, script="bench_fm_pair")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", metavar="JSON", help="write the records here (after every case)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, the reference as a stand-in")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a saved result and exit")
    ap.add_argument("--ablate", action="store_true", help="the pair builds' producer-only / consumer-only modes")
    args = ap.parse_args()
    if args.table:
        print(ovl.table(args.table))
        return 0
    if not args.smoke and not ovl.torch.cuda.is_available():
        ap.error("no CUDA device: only --smoke or --table run here")
    recs = run(args.smoke, args.out, args.ablate)
    return 1 if args.smoke and any("error" in r for r in recs) else 0


if __name__ == "__main__":
    sys.exit(main())
