"""Whether a call with a Triton fast path runs it (shared by `api.py` and `api_w4a16.py`).

CUDA tensors -> Triton, unless DEEPINFER_DEEP_GEMM_BACKEND=reference (or Triton is not importable); CPU tensors
-> the reference, unless DEEPINFER_DEEP_GEMM_BACKEND=triton, which needs TRITON_INTERPRET=1 (the interpreter).
"""

from __future__ import annotations

import os

import torch

from ._backend import ENV_VAR, backend

FP8_DENSE_ENV = "DEEPINFER_DEEP_GEMM_FP8_DENSE"
FP8_DENSE_CHOICES = ("auto", "triton", "cutlass", "wide")
# What "auto" means for the dense FP8 GEMM: "per_shape" = the compiled fp8_wide kernel where
# `backends/cuda/cuda_fp8_db.wide_rule` says (session 12), else `backends/cuda/cutlass_fp8.auto_config`'s choice
# between the CUTLASS kernel (proven on the H200 in round 1: 95 GPU tests, 1.3-1.5x Triton at m > 128) and Triton
# (decode m <= 16, short-k small m). "triton" restores the round-1 default; "cutlass" never runs fp8_wide; "wide" runs
# fp8_wide for every call it fits (the rest as "per_shape").
FP8_DENSE_AUTO = "per_shape"


def use_triton(device: torch.device) -> bool:
    """True when a call on `device` runs its Triton kernel (env DEEPINFER_DEEP_GEMM_BACKEND, device)."""
    choice = backend(device)  # validates the env value; raises when a forced choice cannot run here
    if choice == "triton":
        return True
    if choice == "cuda":  # the compiled extension has only the opt-in CUTLASS FP8 GEMM: Triton stays the fast path
        try:
            import triton  # noqa: F401
        except ImportError:
            return False
        return True
    return False  # "reference", or "ascend" (no NPU kernels yet)


def fp8_dense_impl(device: torch.device) -> str:
    """Which kernel a CUDA `fp8_gemm_nt` call prefers (env DEEPINFER_DEEP_GEMM_FP8_DENSE): "cutlass", "triton", "wide"
    or "per_shape" (auto: `cuda_fp8_db.wide_rule(m, n, k)` picks fp8_wide, else `cutlass_fp8.auto_config(m, n, k)` a
    CUTLASS config or None = Triton).

    "cutlass" also needs DEEPINFER_DEEP_GEMM_BACKEND auto or cuda and a CUDA fast path for `device` (not the
    reference); whether `_C` has the kernel and the call fits it is `backends/cuda/cutlass_fp8.applies`'s to say
    (it also finds `_C` in the installed copy when the source tree shadows it: tests, benchmarks). Calls the
    CUTLASS kernel cannot take still run Triton.
    """
    wanted = os.environ.get(FP8_DENSE_ENV, "auto").strip().lower() or "auto"
    if wanted not in FP8_DENSE_CHOICES:
        raise ValueError(f"{FP8_DENSE_ENV}: expected one of {'|'.join(FP8_DENSE_CHOICES)}, got {wanted!r}")
    if wanted == "auto":
        wanted = FP8_DENSE_AUTO
    if wanted == "triton" or os.environ.get(ENV_VAR, "auto").strip().lower() not in ("", "auto", "cuda"):
        return "triton"
    return wanted if backend(device) in ("cuda", "triton") else "triton"


FP8_GROUPED_ENV = "DEEPINFER_DEEP_GEMM_FP8_GROUPED"
FP8_GROUPED_CHOICES = ("auto", "cutlass", "triton", "reference")
# "auto" for the FP8 grouped GEMMs (contiguous and masked): Triton when the rows per expert are at most this, else
# CUTLASS. H200 sweep (session 4): the CUTLASS ping-pong config beat the Triton kernel at every measured size (8, 64,
# 256, 1024 rows per expert, contiguous and masked), so Triton serves only calls CUTLASS cannot take.
FP8_GROUPED_TRITON_MAX_ROWS = 0


def fp8_grouped_impl(device: torch.device, rows_per_group: int, cutlass_ok: bool) -> str:
    """Which kernel a CUDA FP8 grouped call (contiguous or masked) runs: "cutlass", "triton" or "reference".

    env DEEPINFER_DEEP_GEMM_FP8_GROUPED: "auto" (default: Triton for rows_per_group <= FP8_GROUPED_TRITON_MAX_ROWS,
    else CUTLASS), "cutlass" (whenever `cutlass_ok`), "triton", "reference". CUTLASS needs `cutlass_ok` (built and
    the call fits it) and DEEPINFER_DEEP_GEMM_BACKEND auto / cuda, else Triton; Triton needs that variable auto /
    cuda / triton and Triton importable, else the reference. rows_per_group: the caller's estimate (a tiling hint only).
    """
    wanted = os.environ.get(FP8_GROUPED_ENV, "auto").strip().lower() or "auto"
    if wanted not in FP8_GROUPED_CHOICES:
        raise ValueError(f"{FP8_GROUPED_ENV}: expected one of {'|'.join(FP8_GROUPED_CHOICES)}, got {wanted!r}")
    choice = backend(device)  # DEEPINFER_DEEP_GEMM_BACKEND: "triton" turns CUTLASS off, as for the dense GEMM
    if wanted == "reference" or choice not in ("cuda", "triton"):
        return "reference"
    triton_ok = use_triton(device)
    big = rows_per_group > FP8_GROUPED_TRITON_MAX_ROWS
    cutlass_ok = cutlass_ok and choice == "cuda" and wanted != "triton"
    if cutlass_ok and (wanted == "cutlass" or big or not triton_ok):
        return "cutlass"
    return "triton" if triton_ok else "reference"


def impl(name: str, device: torch.device, ref_fn):
    """The function a call on `device` runs when no CUDA fast path took it: the Ascend mapping of op `name`
    (torch_npu operator where one fits, else the reference) when the backend choice is "ascend", else `ref_fn`."""
    if backend(device) == "ascend":
        from .backends.ascend import dispatch

        return dispatch(name)
    return ref_fn
