"""Checks shared by the Triton launchers of this package."""

from __future__ import annotations

import os

import torch


def check_runnable(*tensors: torch.Tensor) -> None:
    """Raise unless all tensors share a device that Triton can run on (CUDA, or CPU under TRITON_INTERPRET=1)."""
    devs = {t.device for t in tensors}
    if len(devs) != 1:
        raise ValueError(f"tensors must be on one device, got {sorted(map(str, devs))}")
    dev = tensors[0].device
    if dev.type != "cuda" and not (dev.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
        raise ValueError(f"Triton kernels need CUDA tensors (or CPU with TRITON_INTERPRET=1), got device {dev}")
