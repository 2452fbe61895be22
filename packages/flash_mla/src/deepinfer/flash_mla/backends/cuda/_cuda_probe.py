"""Out-of-process probe helpers shared by the compiled CUDA kernels' wrappers (`cuda_sparse_decode.py`, the serial
kernel; `cuda_ws_decode.py`, the warp-specialised ones).

A wrapper's `self_check` runs its kernel on small cases against the reference (`mismatch` words a failing case); its
`probe` runs that in a child process (`run_probe`: `python -m <wrapper module> [args]`, whose `__main__` block is
`probe_main`), so a kernel that faults or hangs cannot take the caller's CUDA context down. Not on any launch path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import NoReturn

import torch


def mismatch(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor) -> str | None:
    """None when out [t, h, d] / lse [t, h] agree with the reference within a loose bound (layout / protocol bugs,
    not last-bit errors: |out - ref| <= 2 % of max |ref| + 1e-3, |lse - ref| <= 1e-2, out finite), else what differs
    (largest errors, where, whether out is finite)."""
    err = (out.float() - ref_out).abs()
    bound = 0.02 * float(ref_out.abs().max()) + 1e-3
    dl = (lse - ref_lse).abs()
    lerr = float(torch.where(lse == ref_lse, torch.zeros_like(dl), dl).max())  # equal infinities: no error (an
    # empty row without a sink has lse = -inf on both sides)
    finite = bool(torch.isfinite(out).all())
    if finite and not float(err.max()) > bound and lerr <= 1e-2:  # `not >`: a NaN error passes here as it did
        return None
    where = tuple(int(i) for i in torch.unravel_index(err.nan_to_num(1e9).argmax(), err.shape))
    return (
        f"max |out - ref| {float(err.max()):.3e} (bound {bound:.3e}) at {where}, max |lse - ref| {lerr:.3e}, "
        f"finite out {finite}"
    )


def run_probe(module: str, args: list[str], timeout_s: float, what: str) -> tuple[bool, str]:
    """`python -m module *args` in a child process with this process's sys.path and without TRITON_INTERPRET:
    (it printed "PROBE OK" and exited 0, the last 3,000 characters of its output); a hang (killed after timeout_s)
    gives False and says `what` did not finish."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    env.pop("TRITON_INTERPRET", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return False, f"{what} probe did not finish in {timeout_s:.0f} s (hang?)"
    out = (proc.stdout + proc.stderr)[-3000:]
    return proc.returncode == 0 and "PROBE OK" in proc.stdout, out


def probe_main(have_kernel: bool, missing: str, check: Callable[[], str]) -> NoReturn:
    """A wrapper's `__main__` (the child of `run_probe`): "PROBE FAIL: `missing`" without a GPU or the kernel, else
    `check()` ("" = passed) as "PROBE OK" / "PROBE FAIL: why"; exits 0 only when it passed."""
    if not torch.cuda.is_available() or not have_kernel:
        print(f"PROBE FAIL: {missing}")
        sys.exit(1)
    why = check()
    print("PROBE OK" if not why else f"PROBE FAIL: {why}", flush=True)
    sys.exit(0 if not why else 1)
