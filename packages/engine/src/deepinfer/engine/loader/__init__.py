"""Checkpoint loading: resolve a path or hub id, read safetensors shards, map names, validate the schema.

Public API: `resolve_model_path(path_or_repo, revision=None) -> Path`,
`load_weights(model_dir, cfg, device="cpu", progress=True) -> dict[str, Tensor]` (official names, stored dtypes),
`expected_tensors(cfg) -> {name: (shape, kind)}` and `official_name(stored_name) -> str`.
"""

from deepinfer.engine.loader.load import load_weights
from deepinfer.engine.loader.names import official_name, split_merged_experts
from deepinfer.engine.loader.resolve import resolve_model_path
from deepinfer.engine.loader.schema import KINDS, TensorSpec, allowed_dtypes, expected_tensors, storage_dtype

__all__ = [
    "KINDS",
    "TensorSpec",
    "allowed_dtypes",
    "expected_tensors",
    "load_weights",
    "official_name",
    "resolve_model_path",
    "split_merged_experts",
    "storage_dtype",
]
