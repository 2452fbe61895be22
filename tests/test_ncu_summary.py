"""benchmarks/ncu_summary.py on a small synthetic Nsight Compute source-page export (no GPU, no ncu needed)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("ncu_summary", Path(__file__).parents[1] / "benchmarks/ncu_summary.py")
ncu_summary = importlib.util.module_from_spec(_SPEC)
sys.modules["ncu_summary"] = ncu_summary  # dataclasses look their module up there
_SPEC.loader.exec_module(ncu_summary)

REASONS = ("stall_barrier", "stall_long_sb", "stall_wait")


def _write(path: Path, rows: list[tuple[str, int, dict[str, int]]]) -> None:
    hdr = ["Address", "Source", ncu_summary.SAMPLES, ncu_summary.EXECUTED, *REASONS, "stall_wait (Not Issued)"]
    lines = ['"Kernel Name","k"', ",".join(f'"{h}"' for h in hdr)]
    for i, (src, ex, st) in enumerate(rows):
        vals = [hex(i), src, str(sum(st.values())), str(ex), *(str(st.get(r, 0)) for r in REASONS), "0"]
        lines.append(",".join(f'"{v}"' for v in vals))
    path.write_text("\n".join(lines) + "\n")


def test_totals_hottest_regions_and_segments(tmp_path: Path) -> None:
    rng = random.Random(7)
    rows = [(f"OP{i} R{i}", 4 if 3 <= i < 13 else 1, {r: rng.randrange(0, 50) for r in REASONS}) for i in range(20)]
    rows[5] = ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 4, {"stall_barrier": 900})
    path = tmp_path / "sass.csv"
    _write(path, rows)
    lines = ncu_summary.load(str(path))
    assert [ln.samples for ln in lines] == [sum(st.values()) for _, _, st in rows]
    text = ncu_summary.report(lines, top=1, regions=["3-12"], segments=True)
    hottest = text.splitlines()[2]
    assert hottest.split()[0] == "5" and "DEPBAR" in hottest and "barrier 100%" in hottest
    region_share = 100 * sum(sum(st.values()) for _, _, st in rows[3:13]) / sum(sum(st.values()) for _, _, st in rows)
    assert f"region 3-12: {region_share:.1f}% of samples, 40 warp-instructions" in text
    assert "     3-    12 ex=        4" in text  # the 10 lines executed 4 times form one segment


def test_rejects_a_csv_without_the_samples_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text('"Kernel Name","k"\n"Address","Source"\n"0x0","NOP"\n')
    with pytest.raises(ValueError, match="Warp Stall Sampling"):
        ncu_summary.load(str(path))
