"""The split-KV kernels (fused, chunked and deferred, BF16 / FP8 caches) compile for sm_90a on this CPU-only machine.

The interpreter tests run the kernels' Python, not Triton's compiler, so compile-only errors would first show on
the GPU. This runs `fm_sm90_compile.py` in a subprocess without TRITON_INTERPRET and asserts every variant
compiles; its report (shared memory, registers, stack bytes = spills) is printed for `pytest -s`. Spills are
reported, not asserted: the installed Triton may be newer than the GPU's and allocate differently.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_HERE = pathlib.Path(__file__).resolve().parent


def test_split_kernels_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(_HERE.parent / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(_HERE / "fm_sm90_compile.py"), "--quick"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    if "OK " not in out and ("ptxas" in out or "No module named" in out or "cuobjdump" in out):
        pytest.skip(f"Triton's CUDA compiler is not usable here: {out[-300:]}")
    print(proc.stdout)
    assert proc.returncode == 0, out[-4000:]
    assert proc.stdout.count("OK ") == 3, proc.stdout
