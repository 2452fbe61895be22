"""Check a checkpoint's tensor list against the schema before any data is read."""

from __future__ import annotations

import torch

from deepinfer.engine.loader.schema import TensorSpec, allowed_dtypes

FoundTensor = tuple[tuple[int, ...], torch.dtype]
_MAX_LISTED = 20  # per category; a real checkpoint can miss thousands of tensors at once


def check_against_schema(found: dict[str, FoundTensor], expected: dict[str, TensorSpec]) -> None:
    """Raise one ValueError listing every missing, unexpected, mis-shaped or mis-typed tensor.

    found: official name -> (shape, torch dtype) as stored; expected: `expected_tensors(cfg)`.
    """
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    bad_shape, bad_dtype = [], []
    for name in sorted(set(found) & set(expected)):
        (shape, dtype), (want_shape, kind) = found[name], expected[name]
        if tuple(shape) != tuple(want_shape):
            bad_shape.append(f"{name}: expected shape {list(want_shape)}, got {list(shape)}")
        elif dtype not in allowed_dtypes(kind):
            want = ", ".join(str(d).removeprefix("torch.") for d in allowed_dtypes(kind))
            bad_dtype.append(f"{name}: expected dtype {want} ({kind}), got {str(dtype).removeprefix('torch.')}")
    parts = [
        _section("missing tensors", missing),
        _section("unexpected tensors", unexpected),
        _section("tensors with a wrong shape", bad_shape),
        _section("tensors with a wrong dtype", bad_dtype),
    ]
    parts = [p for p in parts if p]
    if parts:
        raise ValueError("checkpoint does not match the config:\n" + "\n".join(parts))


def _section(title: str, items: list[str]) -> str:
    if not items:
        return ""
    shown = "\n".join(f"  {s}" for s in items[:_MAX_LISTED])
    more = f"\n  ... and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else ""
    return f"{len(items)} {title}:\n{shown}{more}"
