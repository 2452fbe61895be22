"""Argument checks for the public API: every error names the argument, what was expected and what came.

Only shapes, dtypes and devices are checked, never tensor values: a value check would synchronise with
the device and break CUDA-graph capture.
"""

from __future__ import annotations

import math

import torch

ACT_DTYPES = (torch.float32, torch.bfloat16)


def _names(dtypes: tuple[torch.dtype, ...]) -> str:
    return "/".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | tuple[int, ...] | None = None,
    dtypes: tuple[torch.dtype, ...] | None = None,
) -> torch.Tensor:
    """Raise TypeError/ValueError unless `t` is a tensor of the given rank and dtype; returns it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None:
        dims = (ndim,) if isinstance(ndim, int) else ndim
        if t.dim() not in dims:
            want = " or ".join(map(str, dims))
            raise ValueError(f"{name} must have {want} dims, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {_names(dtypes)}, got {t.dtype}")
    return t


def check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Raise ValueError unless t.shape == shape."""
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def check_int(name: str, v: object, *, minimum: int) -> int:
    """Raise TypeError/ValueError unless v is an int (not bool) >= minimum; returns it."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def check_scale(name: str, v: object) -> float:
    """Raise TypeError/ValueError unless v is a finite real number (int or float, not bool); returns float(v)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(v).__name__}")
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return float(v)


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """Raise ValueError when the given (non-None) tensors live on more than one device."""
    devs = {n: t.device for n, t in tensors.items() if t is not None}
    if len(set(devs.values())) > 1:
        got = ", ".join(f"{n}={d}" for n, d in devs.items())
        raise ValueError(f"tensors must be on one device, got {got}")


def check_out(out: object, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A caller-provided output buffer must match shape, dtype and device exactly."""
    check_tensor("out", out, dtypes=(dtype,))
    assert isinstance(out, torch.Tensor)
    check_shape("out", out, shape)
    if out.device != device:
        raise ValueError(f"out must be on {device}, got {out.device}")
    return out
