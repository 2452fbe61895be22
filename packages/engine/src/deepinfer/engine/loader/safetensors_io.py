"""Low-level safetensors access: which shard holds which tensor, header peeks, memory-mapped reads.

Every failure names the file: a missing shard (with one tensor the index puts in it), a truncated or corrupt
shard, a tensor the index promises but the shard lacks.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

INDEX_FILE = "model.safetensors.index.json"

# safetensors header dtype strings -> torch dtypes (what the loader hands out, unchanged).
DTYPES: dict[str, torch.dtype] = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E8M0": torch.float8_e8m0fnu,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I8": torch.int8,
    "U8": torch.uint8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "BOOL": torch.bool,
}


def shard_index(model_dir: Path) -> dict[str, Path]:
    """Map every stored tensor name to the shard file holding it.

    Uses `model.safetensors.index.json` when present (every shard it names must exist), else every
    `*.safetensors` file in `model_dir` (names read from the headers; a name in two files is an error).
    """
    index = model_dir / INDEX_FILE
    if index.is_file():
        return _from_index(index)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model_dir: expected {INDEX_FILE} or *.safetensors files in {model_dir}, found none")
    out: dict[str, Path] = {}
    for path in files:
        with open_shard(path) as f:
            for name in f.keys():
                if name in out:
                    raise ValueError(f"tensor {name!r} is stored twice: in {out[name].name} and {path.name}")
                out[name] = path
    return out


def _from_index(index: Path) -> dict[str, Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{index}: expected JSON with a 'weight_map' object ({e!r})") from e
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: expected a non-empty 'weight_map' object, got {weight_map!r}")
    out = {name: index.parent / shard for name, shard in weight_map.items()}
    seen: set[Path] = set()
    for name, path in out.items():
        if path not in seen and not path.is_file():
            raise FileNotFoundError(f"shard {path.name} listed in {index.name} is missing (it holds e.g. {name!r})")
        seen.add(path)
    return out


@contextmanager
def open_shard(path: Path, device: str = "cpu") -> Iterator[Any]:
    """`safe_open` a shard (memory-mapped); a truncated or corrupt file raises ValueError naming it."""
    try:
        handle = safe_open(str(path), framework="pt", device=device)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupt?): {e}") from e
    with handle as f:
        yield f


def peek(f: Any, path: Path, name: str) -> tuple[tuple[int, ...], str]:
    """(shape, header dtype string) of tensor `name` in an open shard, without reading its data."""
    try:
        sl = f.get_slice(name)
    except SafetensorError as e:
        raise ValueError(f"{path.name}: tensor {name!r} listed in the index is not in the file ({e})") from e
    return tuple(sl.get_shape()), sl.get_dtype()


def read_tensor(f: Any, path: Path, name: str) -> torch.Tensor:
    """Read tensor `name` from an open shard in its stored dtype.

    Falls back to reading the raw bytes and reinterpreting them when this safetensors build cannot
    materialise a dtype (older releases lack F8_E8M0).
    """
    try:
        return f.get_tensor(name)
    except (SafetensorError, TypeError, ValueError, RuntimeError) as e:
        if peek(f, path, name)[1] not in DTYPES:
            raise ValueError(f"{path.name}: tensor {name!r} has an unsupported dtype ({e})") from e
        return read_raw(path, name)


def read_raw(path: Path, name: str) -> torch.Tensor:
    """Read tensor `name` straight from the file bytes: header offsets, a memory-mapped slice, `.view(dtype)`."""
    header, data_start = _header(path)
    if name not in header:
        raise ValueError(f"{path.name}: no tensor {name!r} in the header")
    meta = header[name]
    dtype = DTYPES.get(meta.get("dtype"))
    if dtype is None:
        raise ValueError(
            f"{path.name}: tensor {name!r} has dtype {meta.get('dtype')!r}; expected one of {list(DTYPES)}"
        )
    begin, end = (data_start + o for o in meta["data_offsets"])
    if end == begin:  # frombuffer rejects an empty buffer
        return torch.empty(meta["shape"], dtype=dtype)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if end > len(mm):
            raise ValueError(f"{path}: truncated: tensor {name!r} ends at byte {end}, file has {len(mm)}")
        raw = bytearray(mm[begin:end])
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(meta["shape"])


def _header(path: Path) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: truncated: no safetensors header")
        (n,) = struct.unpack("<Q", head)
        try:
            return json.loads(fh.read(n)), 8 + n
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: corrupt safetensors header ({e})") from e
