"""Which machine and software a measurement came from: GPU name, torch / triton / CUDA / driver versions."""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess

import torch


def gpu_name(device: int | None = None) -> str:
    """Name of CUDA device ``device`` (default: the current one), e.g. "NVIDIA H200"; "cpu" without CUDA."""
    if not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name(device)


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def driver_version() -> str | None:
    """NVIDIA driver version from ``nvidia-smi`` (e.g. "580.159"), None when there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if lines else None


def sw_versions() -> dict[str, str | None]:
    """Versions that change benchmark numbers: {"python", "torch", "triton", "cuda" (torch's CUDA
    runtime), "driver"}; None for what is absent (triton not installed, CPU-only torch, no driver)."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _dist_version("triton"),  # metadata, not import: importing triton is slow
        "cuda": torch.version.cuda,
        "driver": driver_version(),
    }
