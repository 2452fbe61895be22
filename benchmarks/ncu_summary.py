"""Summarise Nsight Compute's per-SASS-line export (`ncu -i R.ncu-rep --page source --csv --print-source sass`).

    python benchmarks/ncu_summary.py SASS.csv                 # stall totals + the 40 hottest SASS lines
    python benchmarks/ncu_summary.py SASS.csv --top 20 --regions 445-1058 2816-3426   # + stall mix per line range
    python benchmarks/ncu_summary.py SASS.csv --segments      # runs of lines with equal execution counts (loops)

Line numbers are rows of the CSV after its two header rows (the numbering every output here uses). Stall samples are
per warp: a line's share of samples is the share of warp time spent there (issuing or stalled).
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from dataclasses import dataclass

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


@dataclass
class Line:
    """One SASS instruction: its text, stall samples (total and by reason) and warp-level execution count."""

    src: str
    samples: int
    executed: int
    stalls: Counter


def load(path: str, kernel: str | None = None) -> list[Line]:
    """Parse the export: per profiled kernel a row naming it, a row of column names, then one row per SASS line.
    Several kernels: the first whose name contains `kernel`, else the one with the most samples."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    if not starts or starts[0] + 1 >= len(rows) or SAMPLES not in rows[starts[0] + 1]:
        raise ValueError(f"{path}: expected an ncu source-page CSV with a {SAMPLES!r} column, got {rows[:2]!r}")
    sections = []
    for a, b in zip(starts, [*starts[1:], len(rows)]):
        sections.append((rows[a][1] if len(rows[a]) > 1 else "", _parse(rows[a + 1], rows[a + 2 : b])))
    if kernel is not None:
        hits = [lines for name, lines in sections if kernel in name]
        if not hits:
            raise ValueError(f"{path}: no kernel name contains {kernel!r}; got {[n[:60] for n, _ in sections]}")
        return hits[0]
    return max((lines for _, lines in sections), key=lambda ls: sum(ln.samples for ln in ls))


def _parse(hdr: list[str], body: list[list[str]]) -> list[Line]:
    ix = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in body:
        if len(r) < len(hdr):
            continue
        stalls = Counter({h[6:]: int(r[ix[h]] or 0) for h in reasons})
        out.append(Line(r[ix["Source"]].strip(), int(r[ix[SAMPLES]] or 0), int(r[ix[EXECUTED]] or 0), stalls))
    return out


def _mix(c: Counter, n: int, k: int = 8) -> str:
    return ", ".join(f"{name} {100 * v / max(n, 1):.0f}%" for name, v in c.most_common(k) if v)


def report(lines: list[Line], top: int, regions: list[str], segments: bool) -> str:
    """The text report: totals, hottest lines, optional regions and loop segments."""
    n = sum(ln.samples for ln in lines)
    tot = sum((ln.stalls for ln in lines), Counter())
    out = [f"{len(lines)} SASS lines, {n} samples; stalls: {_mix(tot, n, 12)}", "hottest lines:"]
    for i, ln in sorted(enumerate(lines), key=lambda x: -x[1].samples)[:top]:
        out.append(f"{i:6d} {100 * ln.samples / max(n, 1):5.1f}% ex={ln.executed:9d} {ln.src[:60]:60s} "
                   f"{_mix(ln.stalls, ln.samples, 3)}")  # fmt: skip
    for spec in regions:
        a, b = (int(x) for x in spec.split("-"))
        part = lines[a : b + 1]
        s = sum(ln.samples for ln in part)
        c = sum((ln.stalls for ln in part), Counter())
        ex = sum(ln.executed for ln in part)
        out.append(f"region {spec}: {100 * s / max(n, 1):.1f}% of samples, {ex} warp-instructions; {_mix(c, s)}")
    if segments:
        out += _segments(lines, n)
    return "\n".join(out)


def _segments(lines: list[Line], n: int) -> list[str]:
    """Runs of >= 8 consecutive lines with the same execution count (a loop body or a straight block)."""
    out, start = ["segments (first line, last line, executions, share of samples):"], 0
    for i in range(1, len(lines) + 1):
        if i == len(lines) or lines[i].executed != lines[start].executed:
            s = sum(ln.samples for ln in lines[start:i])
            if i - start >= 8:
                out.append(f"{start:6d}-{i - 1:6d} ex={lines[start].executed:9d} {100 * s / max(n, 1):5.1f}% "
                           f"{lines[start].src[:50]}")  # fmt: skip
            start = i
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=40, help="how many of the hottest lines to list")
    ap.add_argument("--regions", nargs="*", default=[], metavar="A-B", help="line ranges to summarise")
    ap.add_argument("--segments", action="store_true", help="list loop-like runs of equal execution counts")
    ap.add_argument("--kernel", help="with several kernels in the export: the first whose name contains this")
    args = ap.parse_args()
    print(report(load(args.csv, args.kernel), args.top, args.regions, args.segments))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
