"""Which implementation a call runs: the compiled extension, Triton, Ascend or the PyTorch reference.

This file is byte-identical in every DeepInfer kernel package (tests/test_packaging.py checks it): the
package name comes from ``__package__``, so each package installs alone with no cross-package import.
The environment variable ``DEEPINFER_<PKG>_BACKEND`` (e.g. ``DEEPINFER_TILE_KERNELS_BACKEND``) takes
``auto|cuda|triton|ascend|reference`` and forces a choice; a forced choice that is unavailable raises.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import types
import warnings

import torch

CHOICES = ("auto", "cuda", "triton", "ascend", "reference")
_PKG = __package__ or __name__.rpartition(".")[0]
_NAME = _PKG.rpartition(".")[2]
ENV_VAR = f"DEEPINFER_{_NAME.upper()}_BACKEND"
DIST_NAME = "deepinfer-" + _NAME.replace("_", "-")


def _installed_extension_path() -> str | None:
    """The file of an installed copy's ``<pkg>._C`` on sys.path: the repo's conftest and benchmarks put
    packages/*/src first, and the source folder holds no built ``_C`` (a non-editable install put it in
    site-packages)."""
    for entry in sys.path:
        folder = os.path.join(entry, *_PKG.split("."))
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_C" + suffix)
            if os.path.isfile(path):
                return path
    return None


@functools.cache
def _compiled() -> tuple[types.ModuleType | None, str | None]:
    """(``<pkg>._C``, None) when the compiled extension imports (from the package or, when the source tree
    shadows it, from an installed copy); else (None, why not: "not built" or the import error)."""
    name = f"{_PKG}._C"
    path = None
    if importlib.util.find_spec(name) is None:
        path = _installed_extension_path()
        if path is None:
            return None, f"{name} was not built (build with DEEPINFER_DEVICE=cuda)"
    try:
        if path is None:
            return importlib.import_module(name), None
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[name] = mod
        return mod, None
    except ImportError as exc:  # built but broken (ABI, missing libcudart): say so, never hide it
        warnings.warn(f"{name} exists but failed to import: {exc}", RuntimeWarning, stacklevel=3)
        return None, f"{name} failed to import: {exc}"


def compiled_module() -> types.ModuleType | None:
    """The package's compiled extension ``<pkg>._C``, or None when it was not built or does not import."""
    return _compiled()[0]


def _compiled_error() -> str | None:
    """None when ``<pkg>._C`` imports; else why not ("not built" or the import error)."""
    return _compiled()[1]


@functools.cache
def _implemented() -> tuple[str, ...]:
    """Fast paths this package has (``backends.IMPLEMENTED``); ops without one still run the reference."""
    try:
        return tuple(getattr(importlib.import_module(f"{_PKG}.backends"), "IMPLEMENTED", ()))
    except ImportError:
        return ()


@functools.cache
def _module_error(module: str) -> str | None:
    """None when ``module`` imports, else the reason."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"{module} is not importable ({exc})"
    return None


def _device_type(device: torch.device | str | int | None) -> str:
    """The device type ("cpu", "cuda", "npu", ...) of ``device``; None means the current accelerator."""
    if device is None:
        acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        return acc.type if acc is not None else "cpu"
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, int) and not isinstance(device, bool):
        return "cuda"  # torch's convention for a bare ordinal
    if isinstance(device, str):
        kind = device.split(":", 1)[0]
        if kind == "npu":  # torch only parses "npu" once torch_npu is imported
            return kind
        try:
            return torch.device(device).type
        except RuntimeError as exc:
            raise ValueError(f"device: expected a torch device string like 'cuda:0', got {device!r}") from exc
    raise TypeError(f"device: expected torch.device, str, int or None, got {type(device).__name__}")


def _unavailable(choice: str, dev: str, forced: bool) -> str | None:
    """None when ``choice`` can run on device type ``dev``, else the reason it cannot."""
    if choice == "reference":
        return None
    if choice == "cuda":
        return _compiled_error() if dev == "cuda" else f"device is {dev!r}, not 'cuda'"
    if choice == "triton":
        if "triton" not in _implemented():
            return f"{_PKG} has no Triton kernels yet"
        # TRITON_INTERPRET=1 runs Triton on CPU tensors; only a forced choice uses it: CI exports it for
        # kernel tests, and `auto` must not send every CPU call through the (slow) interpreter.
        interp = forced and dev == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
        if dev != "cuda" and not interp:
            return f"device is {dev!r}, not 'cuda' (or 'cpu' with TRITON_INTERPRET=1)"
        return _module_error("triton")
    if dev != "npu":  # choice == "ascend"
        return f"device is {dev!r}, not 'npu'"
    return _module_error("torch_npu")


def backend(device: torch.device | str | int | None = None) -> str:
    """Name the implementation a call on ``device`` uses: "cuda", "triton", "ascend" or "reference".

    Args:
        device: a ``torch.device``, a device string ("cuda:0", "cpu", "npu:1"), a CUDA ordinal, or None
            for the current accelerator (CPU when there is none).

    ``auto`` (the default of ``DEEPINFER_<PKG>_BACKEND``) tries, in order: the compiled extension on a
    CUDA device, Triton on a CUDA device, the Ascend path on an ``npu`` device, then the reference.
    Raises ValueError for a bad env value or device string, RuntimeError when a forced choice is unavailable.
    """
    dev = _device_type(device)
    wanted = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if wanted not in CHOICES:
        raise ValueError(f"{ENV_VAR}: expected one of {'|'.join(CHOICES)}, got {wanted!r}")
    if wanted != "auto":
        reason = _unavailable(wanted, dev, forced=True)
        if reason is not None:
            raise RuntimeError(f"{ENV_VAR}={wanted} but it is unavailable: {reason}")
        return wanted
    for choice in ("cuda", "triton", "ascend"):
        if _unavailable(choice, dev, forced=False) is None:
            return choice
    return "reference"


def _built_module() -> types.ModuleType | None:
    """The generated ``_build_info`` module when pip built the package, else None (source tree)."""
    try:
        return importlib.import_module(f"{_PKG}._build_info")
    except ImportError:
        return None


def package_version(source_version: str) -> str:
    """The installed distribution's version when pip built the package, else ``source_version``."""
    if _built_module() is None:
        return source_version
    try:
        return importlib.metadata.version(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        return source_version


def build_info() -> dict[str, object]:
    """What this package was built for, as a JSON-friendly dict.

    Keys: "package" (distribution name), "built_for" ("cuda" | "ascend" | "cpu" from the build, or
    "source" when imported from the source tree), "compiled_backends" (list of str), "backend_env"
    (the value of ``DEEPINFER_<PKG>_BACKEND``, default "auto"), "path" (the package directory).
    """
    mod = _built_module()
    pkg = importlib.import_module(_PKG)
    return {
        "package": DIST_NAME,
        "version": getattr(pkg, "__version__", None),
        "built_for": getattr(mod, "BUILT_FOR", "source"),
        "compiled_backends": list(getattr(mod, "COMPILED_BACKENDS", ())),
        "backend_env": os.environ.get(ENV_VAR, "auto"),
        "path": os.path.dirname(os.path.abspath(__file__)),
    }
