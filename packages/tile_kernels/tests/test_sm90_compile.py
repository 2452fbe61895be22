"""Every Triton kernel variant of the package compiles for sm_90 (H200) on this CPU-only machine.

The interpreter tests run the kernels' Python, not Triton's compiler, so compile-only errors would first show on
the GPU. This runs `tk_sm90_compile.py` in a subprocess without TRITON_INTERPRET and asserts that every variant
compiles. It also pins the RoPE fix: with fp fusion on, the kernel's PTX has FMAs (the reference rounds products
and sums separately), with it off (as launched) none. The locally installed Triton may be newer than the GPU's.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_HERE = pathlib.Path(__file__).resolve().parent


def test_all_kernels_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(_HERE.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(_HERE / "tk_sm90_compile.py")], env=env, capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    if "OK " not in out and ("ptxas" in out or "No module named" in out):
        pytest.skip(f"Triton's CUDA compiler is not usable here: {out[-300:]}")
    assert proc.returncode == 0, out[-4000:]
    fma = dict(re.findall(r"^OK (rope fusion o(?:n|ff)) .* fma=(\d+)$", out, re.M))
    assert int(fma["rope fusion on"]) > 0 and int(fma["rope fusion off"]) == 0, out
