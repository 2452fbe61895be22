"""When a public op may take its Triton fast path instead of the reference (shared by api.py and api_quant.py)."""

from __future__ import annotations

import os

import torch

TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def triton_ok(x: torch.Tensor) -> bool:
    """Triton kernels run for CUDA tensors unless DEEPINFER_TILE_KERNELS_BACKEND forces the reference."""
    return x.is_cuda and os.environ.get("DEEPINFER_TILE_KERNELS_BACKEND", "auto").strip().lower() != "reference"


def triton_float_ok(*tensors: torch.Tensor | None) -> bool:
    """`triton_ok` for the first tensor, every given tensor fp32/bf16/fp16, and no autograd wanted (the kernels
    have no backward: a call that needs gradients keeps the differentiable reference)."""
    given = [t for t in tensors if t is not None]
    if not triton_ok(given[0]) or any(t.dtype not in TRITON_DTYPES for t in given):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in given))


def ascend_or(name: str, device: torch.device, ref_fn):
    """What a call runs when no Triton path took it: the Ascend mapping of op `name` (a torch_npu operator where
    one fits, else the reference) when this package's backend choice on `device` is "ascend", else `ref_fn`."""
    from ._backend import backend

    if backend(device) == "ascend":
        from .backends.ascend import dispatch

        return dispatch(name)
    return ref_fn
