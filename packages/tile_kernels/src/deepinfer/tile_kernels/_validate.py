"""Argument checks shared by the public API functions: each error names the argument and what came."""

from __future__ import annotations

import torch

_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_tensor(name: str, t: object, *, ndim: int | tuple[int, ...] | None = None, floating: bool = False) -> None:
    """Raise TypeError/ValueError unless `t` is a tensor with the given rank (and a float dtype if asked)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None:
        dims = (ndim,) if isinstance(ndim, int) else ndim
        if t.dim() not in dims:
            raise ValueError(f"{name} must have {' or '.join(map(str, dims))} dims, got shape {tuple(t.shape)}")
    if floating and t.dtype not in _FLOATS:
        raise TypeError(f"{name} must be a float tensor (fp32/bf16/fp16), got {t.dtype}")


def check_last_dim(name: str, t: torch.Tensor, size: int) -> None:
    if t.shape[-1] != size:
        raise ValueError(f"{name} must have last dim {size}, got shape {tuple(t.shape)}")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    devs = {n: t.device for n, t in tensors.items() if t is not None}
    if len(set(devs.values())) > 1:
        raise ValueError(f"tensors must be on one device, got {', '.join(f'{n}={d}' for n, d in devs.items())}")
