"""Shared start-up of the small engine GPU benchmarks (bench_moe_combine.py, bench_sampler.py): the source trees on
sys.path and a `--out RESULT.json` command line that refuses to run without a GPU."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def add_src_paths(*packages: str) -> None:
    """Put packages/<name>/src of this checkout first on sys.path (the source tree, not an installed copy)."""
    root = Path(__file__).resolve().parents[1] / "packages"
    for name in packages:
        sys.path.insert(0, str(root / name / "src"))


def gpu_main(doc: str, run: Callable[[str | None], object]) -> int:
    """Parse `--out`, exit with a usage error when CUDA is missing, else run(out) and return 0."""
    import torch

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", help="write the JSON results here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("GPU only")
    run(args.out)
    return 0
