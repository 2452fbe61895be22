"""`load_weights`: read a checkpoint's safetensors shards into a dict of official-name tensors."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from deepinfer.engine.config import ModelConfig
from deepinfer.engine.loader.names import is_merged_experts, is_skipped, official_name, split_merged_experts
from deepinfer.engine.loader.safetensors_io import DTYPES, open_shard, peek, read_tensor, shard_index
from deepinfer.engine.loader.schema import expected_tensors
from deepinfer.engine.loader.validate import FoundTensor, check_against_schema


def load_weights(
    model_dir: str | Path, cfg: ModelConfig, device: str | torch.device = "cpu", progress: bool = True
) -> dict[str, torch.Tensor]:
    """Load every tensor of the checkpoint in `model_dir` under its official name, in its stored dtype.

    model_dir: a local checkpoint directory (see `resolve_model_path` for hub ids) holding
    `model.safetensors.index.json` + shards, or `*.safetensors` files. cfg: the parsed config; the stored
    tensor list must equal `expected_tensors(cfg)` (names, shapes, dtypes), checked from the headers before
    any data is read. transformers names (`model.layers.N.self_attn.q_a_proj.weight`, merged
    `mlp.experts.gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I]) are renamed and split per expert. MTP copies
    of the shared embedding / head (`mtp.N.emb*`, `mtp.N.head.*`), which DeepSeek's converter drops, are skipped.
    Returns {name: tensor on `device`}: FP8 weights float8_e4m3fn [out, in] with float8_e8m0fnu (or fp32)
    block scales, FP4 experts int8 [out, in/2] + float8_e8m0fnu [out, in/32], bf16/fp32 tensors as stored,
    `tid2eid` int64/int32. Raises FileNotFoundError (missing dir or shard) and ValueError (corrupt shard,
    schema mismatch), each naming the offending file or tensors.
    """
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"cfg: expected a ModelConfig, got {type(cfg).__name__}")
    root = Path(model_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"model_dir: no such checkpoint directory: {root}")
    index = {k: v for k, v in shard_index(root).items() if not is_skipped(official_name(k))}
    found = _plan(index)
    check_against_schema(found, expected_tensors(cfg))
    return _read_all(index, str(device), progress)


def _plan(index: dict[str, Path]) -> dict[str, FoundTensor]:
    """Official name -> (shape, dtype) of every tensor, from shard headers only."""
    by_shard: dict[Path, list[str]] = defaultdict(list)
    for name, path in index.items():
        by_shard[path].append(name)
    found: dict[str, FoundTensor] = {}
    origin: dict[str, str] = {}
    for path in sorted(by_shard):
        with open_shard(path) as f:
            for stored in by_shard[path]:
                shape, dt = peek(f, path, stored)
                if dt not in DTYPES:
                    raise ValueError(f"{path.name}: tensor {stored!r} has dtype {dt!r}; expected one of {list(DTYPES)}")
                for name, item in _expand(stored, shape, DTYPES[dt]).items():
                    if name in found:
                        raise ValueError(f"tensors {origin[name]!r} and {stored!r} both map to official name {name!r}")
                    found[name], origin[name] = item, stored
    return found


def _expand(stored: str, shape: tuple[int, ...], dtype: torch.dtype) -> dict[str, FoundTensor]:
    """The official tensors one stored tensor becomes (several for merged experts), with their shapes."""
    name = official_name(stored)
    if not is_merged_experts(name):
        return {name: (shape, dtype)}
    if len(shape) != 3:
        raise ValueError(f"{stored}: expected merged experts [experts, rows, cols], got shape {list(shape)}")
    meta = torch.empty(shape, dtype=dtype, device="meta")  # split on a meta tensor to get the per-expert shapes
    return {k: (tuple(v.shape), dtype) for k, v in split_merged_experts(name, meta).items()}


def _read_all(index: dict[str, Path], device: str, progress: bool) -> dict[str, torch.Tensor]:
    by_shard: dict[Path, list[str]] = defaultdict(list)
    for name, path in index.items():
        by_shard[path].append(name)
    out: dict[str, torch.Tensor] = {}
    with tqdm(total=len(index), disable=not progress, desc="loading weights", unit="tensor") as bar:
        for path in sorted(by_shard):
            with open_shard(path, device=device) as f:
                for stored in by_shard[path]:
                    t = read_tensor(f, path, stored).to(device)
                    name = official_name(stored)
                    out.update(split_merged_experts(name, t) if is_merged_experts(name) else {name: t})
                    bar.update(1)
    return out
