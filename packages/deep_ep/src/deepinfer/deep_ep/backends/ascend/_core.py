"""Shared machinery of the Ascend (Huawei NPU) path: the op table entry, lazy torch_npu access, the fallback.

This file is byte-identical in every DeepInfer kernel package (like ``_backend.py``), so each package installs
alone. The package's ``backends/ascend/__init__.py`` builds its table of ``AscendOp`` entries and exposes
``dispatch = make_dispatch(OPS)``.

Contract of ``dispatch(op_name)``: it returns a drop-in replacement of the reference function the package's api
calls for that op (same positional/keyword arguments, same result: shapes, dtypes and values within the op's
documented tolerance). Each call of the returned function:

1. runs the torch_npu-backed adapter when the entry has one, ``torch_npu`` imports, the operator exists
   (``hasattr(torch_npu, npu_op)``) and the adapter accepts the inputs (tensors on an NPU, supported dtypes /
   shapes); the adapter raises ``Unsupported`` to decline;
2. otherwise runs the reference (pure PyTorch, which also runs on an NPU through torch_npu's aten kernels).

When the NPU operator itself rejects a call (RuntimeError / TypeError from an older or newer torch_npu / CANN), the
reference runs instead and a RuntimeWarning names the op once; ``DEEPINFER_ASCEND_STRICT=1`` re-raises. A
ValueError (bad argument values, e.g. from the shared validation helpers) propagates unchanged.
Adapters write caller-provided ``out`` buffers only after the NPU operator returned, so a fallback starts clean.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

NPU_DEVICE_TYPES: set[str] = {"npu"}
"""Device types the adapters accept. Tests add "cpu" to run the adapters against a fake torch_npu module."""

STRICT_ENV = "DEEPINFER_ASCEND_STRICT"


class Unsupported(Exception):
    """Raised by an adapter when the inputs are outside what the NPU operator supports: the reference runs."""


@dataclass(frozen=True)
class AscendOp:
    """One public op of the package on the Ascend path.

    name: the public op name. reference: the reference function the api calls (the fallback and the contract).
    npu_op: the torch_npu operator the adapter calls (None with an adapter: aten ops only, which torch_npu runs
    on the NPU). adapter: same signature as reference, may raise Unsupported; None means reference only.
    note: which operator and how arguments map, or why the op stays on the reference.
    """

    name: str
    reference: Callable
    npu_op: str | None = None
    adapter: Callable | None = None
    note: str = ""

    @property
    def kind(self) -> str:
        """ "torch_npu" (an NPU operator), "aten" (aten ops on the NPU) or "reference"."""
        if self.adapter is None:
            return "reference"
        return "torch_npu" if self.npu_op else "aten"


def torch_npu_module() -> types.ModuleType | None:
    """The torch_npu module, imported on first use; None when it is not installed (no NPU machine)."""
    mod = sys.modules.get("torch_npu")
    if mod is not None:
        return mod
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        return None


def npu_op(name: str) -> Callable:
    """``torch_npu.<name>``; raises Unsupported when torch_npu or the operator is absent."""
    mod = torch_npu_module()
    op = getattr(mod, name, None) if mod is not None else None
    if op is None:
        raise Unsupported(f"torch_npu.{name} is not available")
    return op


def on_npu(*tensors: torch.Tensor | None) -> None:
    """Raise Unsupported unless every given tensor lives on an NPU (device type in NPU_DEVICE_TYPES)."""
    for t in tensors:
        if t is not None and t.device.type not in NPU_DEVICE_TYPES:
            raise Unsupported(f"tensor on {t.device.type!r}, not an NPU")


def require(cond: bool, why: str) -> None:
    """Raise Unsupported(why) unless cond holds (an input outside the operator's documented range)."""
    if not cond:
        raise Unsupported(why)


_WARNED: set[str] = set()


def _warn_once(op: str, exc: BaseException) -> None:
    if op not in _WARNED:
        _WARNED.add(op)
        warnings.warn(
            f"Ascend path: torch_npu rejected {op} ({type(exc).__name__}: {exc}); running the reference instead",
            RuntimeWarning,
            stacklevel=4,
        )


def _available(entry: AscendOp) -> bool:
    """torch_npu imports and has the entry's operator (npu_op None: an aten-only adapter, torch_npu suffices)."""
    mod = torch_npu_module()
    return mod is not None and (entry.npu_op is None or hasattr(mod, entry.npu_op))


def _wrap(entry: AscendOp) -> Callable:
    """The callable dispatch returns for an entry with an adapter: adapter first, reference on decline."""
    adapter, reference = entry.adapter, entry.reference
    assert adapter is not None

    @functools.wraps(reference)
    def run(*args: object, **kwargs: object) -> object:
        if not _available(entry):
            return reference(*args, **kwargs)
        try:
            return adapter(*args, **kwargs)
        except Unsupported:
            return reference(*args, **kwargs)
        except (RuntimeError, TypeError) as exc:  # the installed CANN / torch_npu said no
            if os.environ.get(STRICT_ENV, "0") == "1":
                raise
            _warn_once(entry.name, exc)
            return reference(*args, **kwargs)

    run.ascend_op = entry  # type: ignore[attr-defined]
    return run


def make_dispatch(table: Mapping[str, AscendOp]) -> Callable[[str], Callable]:
    """Build ``dispatch(op_name) -> callable`` over a package's table (see the module docstring)."""
    wrapped = {name: (_wrap(e) if e.adapter is not None else e.reference) for name, e in table.items()}

    def dispatch(op_name: str) -> Callable:
        """The Ascend implementation of public op `op_name` (a drop-in for the reference function)."""
        try:
            return wrapped[op_name]
        except KeyError:
            raise KeyError(f"op_name: expected one of {sorted(wrapped)}, got {op_name!r}") from None

    return dispatch


def describe(table: Mapping[str, AscendOp]) -> list[dict[str, str]]:
    """One row per op for READMEs: name, implementation ("torch_npu.<op>" or "reference") and the note."""
    rows = []
    for name, e in sorted(table.items()):
        impl = "reference" if e.adapter is None else (f"torch_npu.{e.npu_op}" if e.npu_op else "aten on the NPU")
        rows.append({"op": name, "implementation": impl, "note": e.note})
    return rows


def markdown_table(table: Mapping[str, AscendOp]) -> str:
    """`describe` as a markdown table (op | Ascend implementation | notes)."""
    lines = ["| op | Ascend implementation | notes |", "| --- | --- | --- |"]
    lines += [f"| `{r['op']}` | {r['implementation']} | {r['note']} |" for r in describe(table)]
    return "\n".join(lines)
