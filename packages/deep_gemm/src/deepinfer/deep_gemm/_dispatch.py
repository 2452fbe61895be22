"""Whether a call with a Triton fast path runs it (shared by `api.py` and `api_w4a16.py`).

CUDA tensors -> Triton, unless DEEPINFER_DEEP_GEMM_BACKEND=reference (or Triton is not importable); CPU tensors
-> the reference, unless DEEPINFER_DEEP_GEMM_BACKEND=triton, which needs TRITON_INTERPRET=1 (the interpreter).
"""

from __future__ import annotations

import torch

from ._backend import backend


def use_triton(device: torch.device) -> bool:
    """True when a call on `device` runs its Triton kernel (env DEEPINFER_DEEP_GEMM_BACKEND, device)."""
    choice = backend(device)  # validates the env value; raises when a forced choice cannot run here
    if choice == "triton":
        return True
    if choice == "cuda":  # no compiled kernels in this package: Triton is the CUDA fast path
        try:
            import triton  # noqa: F401
        except ImportError:
            return False
        return True
    return False  # "reference", or "ascend" (no NPU kernels yet)


def impl(name: str, device: torch.device, ref_fn):
    """The function a call on `device` runs when no CUDA fast path took it: the Ascend mapping of op `name`
    (torch_npu operator where one fits, else the reference) when the backend choice is "ascend", else `ref_fn`."""
    if backend(device) == "ascend":
        from .backends.ascend import dispatch

        return dispatch(name)
    return ref_fn
