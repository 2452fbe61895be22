"""kernelkit: DeepInfer's shared test and benchmark helpers (dev only, never published).

numerics: ``calc_diff``, ``rel_err``, ``assert_close_rel``, ``poison_`` / ``poison_like`` / ``poisoned_mask``,
format tolerances (``format_eps``, ``unit_roundoff``, ``rounding_tol``, ``accum_tol``).
timing: ``bench_cuda``. roofline: ``tflops``, ``gbps``, ``pct_of``, ``floor_us``, ``H200_CEILINGS``.
device: ``gpu_name``, ``sw_versions``, ``driver_version``. results: ``write_results_json``.
"""

from .device import driver_version, gpu_name, sw_versions
from .numerics import (
    accum_tol,
    assert_close_rel,
    calc_diff,
    format_eps,
    poison_,
    poison_like,
    poisoned_mask,
    rel_err,
    rounding_tol,
    unit_roundoff,
)
from .results import write_results_json
from .roofline import H200_CEILINGS, floor_us, gbps, pct_of, tflops
from .timing import bench_cuda

__version__ = "0.1.0"

__all__ = [
    "H200_CEILINGS",
    "accum_tol",
    "assert_close_rel",
    "bench_cuda",
    "calc_diff",
    "driver_version",
    "floor_us",
    "format_eps",
    "gbps",
    "gpu_name",
    "pct_of",
    "poison_",
    "poison_like",
    "poisoned_mask",
    "rel_err",
    "rounding_tol",
    "sw_versions",
    "tflops",
    "unit_roundoff",
    "write_results_json",
]
