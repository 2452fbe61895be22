"""The embedded default checkpoint: a tiny random DeepSeek-V4 model in DeepSeek's official on-disk format.

`build_tiny_checkpoint(out_dir, seed)` writes it deterministically (same bytes for the same seed):
`config.json` (the official key set), sharded safetensors with `model.safetensors.index.json` (FP8 e4m3
linears with 128x128 E8M0 scales, FP4 routed experts, BF16/F32/I64 tensors as the release stores them, an
MTP block `mtp.0.*`), a byte-level BPE `tokenizer.json` trained on `tiny_corpus.CORPUS` and a
`tokenizer_config.json` with a DeepSeek-style chat template. `default_model_path()` builds it once into the
cache and reuses it. Bump `FORMAT_VERSION` whenever the bytes this module writes change.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from deepinfer.engine.config import ModelConfig
from deepinfer.engine.config_parse import config_from_dict
from deepinfer.engine.loader.schema import expected_tensors, storage_dtype
from deepinfer.engine.tiny_tokenizer import TOKENIZER_VOCAB, _tokenizer_config, train_tokenizer
from deepinfer.tile_kernels import fp4_pack, fp8_block_quant

FORMAT_VERSION = 1
COMPRESS_RATIOS = [0, 4, 16, 4, 0]  # layers 0..3 (SWA, CSA, HCA, CSA) + the MTP block (SWA)
_LAYER_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 16: "heavily_compressed_attention"}


def tiny_config_dict(vocab_size: int = TOKENIZER_VOCAB) -> dict[str, Any]:
    """The tiny model's `config.json` as a dict: the official V4-Flash key set and order, tiny values."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "expert_dtype": "fp4",
        "hc_eps": 1e-06,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 256,
        "index_head_dim": 128,
        "index_n_heads": 16,
        "index_topk": 8,
        "initializer_range": 0.02,
        "max_position_embeddings": 4096,
        "model_type": "deepseek_v4",
        "moe_intermediate_size": 128,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": len(COMPRESS_RATIOS) - 1,
        "num_hash_layers": 2,
        "num_key_value_heads": 1,
        "num_nextn_predict_layers": 1,
        "o_groups": 2,
        "o_lora_rank": 128,
        "q_lora_rank": 128,
        "qk_rope_head_dim": 64,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "scale_fmt": "ue8m0",
            "weight_block_size": [128, 128],
        },
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 16,
            "original_max_position_embeddings": 65536,
            "type": "yarn",
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "sliding_window": 32,
        "swiglu_limit": 10.0,
        "tie_word_embeddings": False,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1",
        "use_cache": True,
        "vocab_size": vocab_size,
        "compress_rope_theta": 160000,
        "compress_ratios": list(COMPRESS_RATIOS),
        # Not in the release's key set: transformers maps `compress_ratios` entries through {0, 4, 128} only,
        # so HCA at 16 needs its explicit form (which it prefers); our parser reads `compress_ratios`.
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        "layer_types": [_LAYER_TYPES[r] for r in COMPRESS_RATIOS[:-1]],
    }


def _generator(seed: int, name: str) -> torch.Generator:
    """A generator seeded from (seed, tensor name) so each tensor's values do not depend on build order."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def _float_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """fp32 values for a plain (bf16/f32) tensor, scaled so activations stay O(1); nothing exactly 0 or 1."""

    def randn() -> torch.Tensor:
        return torch.randn(shape, generator=g)

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(shape, generator=g)

    if name.endswith("norm.weight"):
        # 1 +- [0.01, 0.1]: never rounds to exactly 1 in bf16.
        return 1.0 + uniform(0.01, 0.1) * torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    leaf = name.rsplit(".", 1)[-1]
    if leaf.startswith("hc_") and leaf.endswith("_fn"):
        return randn() * 0.05
    if leaf.startswith("hc_") and leaf.endswith("_base"):
        return 0.2 + 0.45 * randn()
    if leaf.startswith("hc_") and leaf.endswith("_scale"):
        return uniform(0.3, 0.95)
    if leaf == "ape":
        return randn()
    if leaf == "attn_sink":
        return 0.7 * randn() - 0.3
    if name.endswith("gate.bias"):
        return 0.3 * randn()
    if name == "embed.weight":
        return randn()
    if len(shape) == 2:  # head, router, compressor and indexer projections: std ~ 1/sqrt(fan_in)
        gain = 2.0 if name in ("head.weight",) or name.endswith("gate.weight") else 1.0
        return randn() * (gain / math.sqrt(shape[1]))
    raise ValueError(f"tiny checkpoint: no initialiser for tensor {name!r} of shape {list(shape)}")


def _fp8_linear(cfg: ModelConfig, shape: tuple[int, ...], g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 weight + block scale; each block gets a random factor 1/2, 1 or 2 so the scales differ."""
    n, k = shape
    b0, b1 = cfg.quant.weight_block_size
    w = torch.randn(n, k, generator=g) / math.sqrt(k)
    factor = torch.exp2(torch.randint(-1, 2, (math.ceil(n / b0), math.ceil(k / b1)), generator=g).float())
    w = w * factor.repeat_interleave(b0, 0).repeat_interleave(b1, 1)[:n, :k]
    return fp8_block_quant(w, block=(b0, b1), scale_fmt=cfg.quant.scale_fmt)


def make_tensors(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor of `expected_tensors(cfg)` with random values, in the dtypes the release stores."""
    spec = expected_tensors(cfg)
    out: dict[str, torch.Tensor] = {}
    for name, (shape, kind) in sorted(spec.items()):
        g = _generator(seed, name)
        base = name.removesuffix(".weight")
        if kind == "fp8_weight":
            out[name], out[base + ".scale"] = _fp8_linear(cfg, shape, g)
        elif kind == "fp4_weight":
            k = shape[1] * 2
            out[name], out[base + ".scale"] = fp4_pack(torch.randn(shape[0], k, generator=g) / math.sqrt(k))
        elif kind == "int":  # hash routing table: distinct experts per row
            perm = torch.rand(shape[0], cfg.n_routed_experts, generator=g).argsort(dim=1)
            out[name] = perm[:, : shape[1]].to(storage_dtype(kind, cfg)).contiguous()
        elif kind in ("bf16", "f32"):
            out[name] = _float_init(name, shape, g).to(storage_dtype(kind, cfg))
    for name, (shape, kind) in spec.items():  # self-check against the schema (scales came with weights)
        t = out.get(name)
        if t is None or tuple(t.shape) != shape or t.dtype != storage_dtype(kind, cfg):
            raise RuntimeError(f"tiny checkpoint: tensor {name!r} does not match its schema {shape}, {kind}")
    return out


def _shard_of(name: str, num_layers: int) -> int:
    """Shard number (1-based) following the release layout: embed | one per layer | head+norm | MTP."""
    if name == "embed.weight":
        return 1
    if name.startswith("layers."):
        return 2 + int(name.split(".")[1])
    if name.startswith("mtp."):
        return num_layers + 3
    return num_layers + 2


def _write_shards(tensors: dict[str, torch.Tensor], out_dir: Path, num_layers: int) -> None:
    total = num_layers + 3
    shards: dict[int, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        shards.setdefault(_shard_of(name, num_layers), {})[name] = t
    weight_map: dict[str, str] = {}
    for i in range(1, total + 1):
        fname = f"model-{i:05d}-of-{total:05d}.safetensors"
        save_file(dict(sorted(shards[i].items())), str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shards[i]})
    index = {
        "metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def build_tiny_checkpoint(out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny V4 checkpoint into `out_dir` (created if needed; existing files are overwritten).

    out_dir: a directory path. seed: int >= 0; the same seed gives the same bytes in every file.
    Returns out_dir as a Path. Layout: see the module docstring (about 9.5 MB, 7 shards).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected an int >= 0, got {seed!r}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir: expected a directory path, got an existing file {out}")
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    cfg_dict = tiny_config_dict(tok.get_vocab_size())
    cfg = config_from_dict(cfg_dict)
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=2, ensure_ascii=False) + "\n")
    _write_shards(make_tensors(cfg, seed), out, cfg.num_layers)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    tok_cfg = json.dumps(_tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    (out / "tokenizer_config.json").write_text(tok_cfg, encoding="utf-8")
    return out


def default_model_path() -> Path:
    """The cached tiny checkpoint `$DEEPINFER_CACHE/tiny-v4-<FORMAT_VERSION>` (default cache ~/.cache/deepinfer).

    Built on first use into a temporary sibling directory and renamed into place, so concurrent callers
    never see a half-written checkpoint (the loser of a race discards its copy).
    """
    root = Path(os.environ.get("DEEPINFER_CACHE") or Path.home() / ".cache" / "deepinfer")
    target = root / f"tiny-v4-{FORMAT_VERSION}"
    if target.exists():
        return _check_complete(target)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        build_tiny_checkpoint(tmp)
        try:
            os.rename(tmp, target)  # atomic within one filesystem
        except OSError:
            if not target.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _check_complete(target)


def _check_complete(target: Path) -> Path:
    needed = ("config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json")
    missing = [n for n in needed if not (target / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{target}: cached tiny checkpoint lacks {missing}; delete the folder to rebuild it")
    return target
