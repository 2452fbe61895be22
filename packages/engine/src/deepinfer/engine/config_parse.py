"""Parse a DeepSeek-V4 `config.json` (any of its published dialects) into a validated `ModelConfig`.

Accepted dialects:
(a) the official HF-style config (`compress_ratios` with num_layers + MTP entries, `num_hash_layers`,
    `expert_dtype`, `quantization_config`, `rope_scaling` of type yarn, `compress_rope_theta`, `dspark_*`);
(b) the reference `inference/config.json` key set (`dim`, `n_layers`, `n_activated_experts`, `rope_factor`, ...);
(c) what transformers' `DeepseekV4Config.save_pretrained` writes (`layer_types` + `compress_rates`,
    `mlp_layer_types`, `rope_parameters` {main, compress}, no quantization). transformers neither builds nor
    saves MTP blocks, so this dialect (recognised by `layer_types` without `compress_ratios`) gets
    `num_mtp_layers = 0`;
(d) any of these nested under `text_config` (V4.1); keys of the inner dict win over the outer ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deepinfer.engine.config import DSparkConfig, ModelConfig, QuantConfig, YarnConfig

# ModelConfig fields whose config key is the field name itself.
_SAME_NAME = (
    "vocab_size head_dim q_lora_rank o_groups o_lora_rank index_n_heads index_head_dim index_topk n_routed_experts "
    "n_shared_experts norm_topk_prob swiglu_limit hc_mult hc_sinkhorn_iters hc_eps rope_theta compress_rope_theta "
    "bos_token_id tie_word_embeddings model_type"
).split()
# ModelConfig field -> accepted keys, HF name first, then the reference `inference/config.json` name.
_ALIASES: dict[str, tuple[str, ...]] = {f: (f,) for f in _SAME_NAME} | {
    "hidden_size": ("hidden_size", "dim"),
    "num_layers": ("num_hidden_layers", "n_layers"),
    "num_heads": ("num_attention_heads", "n_heads"),
    "rope_dim": ("qk_rope_head_dim", "rope_head_dim"),
    "window_size": ("sliding_window", "window_size"),
    "num_experts_per_tok": ("num_experts_per_tok", "n_activated_experts"),
    "moe_inter_dim": ("moe_intermediate_size", "moe_inter_dim"),
    "scoring_func": ("scoring_func", "score_func"),
    "route_scale": ("routed_scaling_factor", "route_scale"),
    "rms_norm_eps": ("rms_norm_eps", "norm_eps"),
    "max_position_embeddings": ("max_position_embeddings", "max_seq_len"),
    "num_mtp_layers": ("num_nextn_predict_layers", "n_mtp_layers"),
}
_REQUIRED = (
    "vocab_size hidden_size num_layers num_heads head_dim q_lora_rank o_groups o_lora_rank window_size "
    "index_n_heads index_head_dim index_topk n_routed_experts n_shared_experts num_experts_per_tok moe_inter_dim"
).split()
_OTHER_POSITIVE_INTS = ["rope_dim", "hc_mult", "hc_sinkhorn_iters", "max_position_embeddings"]
_POSITIVE_INTS = [f for f in _REQUIRED if f != "n_shared_experts"] + _OTHER_POSITIVE_INTS
_POSITIVE_FLOATS = ("route_scale", "swiglu_limit", "hc_eps", "rms_norm_eps", "rope_theta", "compress_rope_theta")
_SCORING_FUNCS = ("sqrtsoftplus", "sigmoid", "softmax")
_LAYER_TYPE_RATIO = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
_TORCH_DTYPES = ("bfloat16", "float16", "float32")


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read `<model_dir>/config.json` (or a path to a json file) and parse it with `config_from_dict`."""
    path = Path(model_dir)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"model_dir: expected a directory holding config.json or a json file, got {path}")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(d).__name__}")
    return config_from_dict(d)


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """Build a validated `ModelConfig` from a parsed config dict of any accepted dialect (see module doc).

    Raises ValueError naming the field, what was expected and what came, for missing or bad fields.
    """
    if not isinstance(d, dict):
        raise TypeError(f"d: expected a dict, got {type(d).__name__}")
    if isinstance(d.get("text_config"), dict):
        d = {**{k: v for k, v in d.items() if k != "text_config"}, **d["text_config"]}
    kw: dict[str, Any] = {}
    for field, keys in _ALIASES.items():
        key = next((k for k in keys if d.get(k) is not None), None)
        if key is not None:
            kw[field] = d[key]
    missing = [_ALIASES[f][0] for f in _REQUIRED if f not in kw]
    if missing:
        raise ValueError(f"config: missing required field(s) {missing}")
    if "rope_dim" not in kw and isinstance(d.get("partial_rotary_factor"), (int, float)):
        kw["rope_dim"] = round(kw["head_dim"] * d["partial_rotary_factor"])  # transformers stores the ratio
    if "rope_dim" not in kw:
        raise ValueError("config: missing required field 'qk_rope_head_dim' (or 'rope_head_dim')")
    if "norm_topk_prob" not in kw and "score_func" in d:
        kw["norm_topk_prob"] = d["score_func"] != "softmax"  # the reference renormalises unless softmax
    # V4 attention is MQA with one shared K=V head; anything else is a different model.
    _check_int("num_key_value_heads", 1 if d.get("num_key_value_heads") is None else d["num_key_value_heads"], 1, 1)
    _parse_schedule(d, kw)
    _parse_rope(d, kw)
    kw["eos_token_ids"] = _parse_eos(1 if d.get("eos_token_id") is None else d["eos_token_id"])
    kw["quant"] = _parse_quant(d)
    kw["dspark"] = _parse_dspark(d)
    dtype = d.get("torch_dtype", d.get("dtype"))
    if dtype in _TORCH_DTYPES:  # the reference's `dtype` means the weight format ("fp8"), not this
        kw["torch_dtype"] = dtype
    _validate(kw)
    for f in _POSITIVE_FLOATS:
        if f in kw:
            kw[f] = float(kw[f])  # json writes 10000 for 1e4; keep the dataclass types uniform
    for f in ("compress_ratios", "mtp_compress_ratios"):
        kw[f] = tuple(kw[f])
    return ModelConfig(**kw)


def _parse_schedule(d: dict[str, Any], kw: dict[str, Any]) -> None:
    """Fill compress_ratios, mtp_compress_ratios, num_mtp_layers and num_hash_layers."""
    n = _check_int("num_hidden_layers", kw["num_layers"], 1)
    if d.get("compress_ratios") is not None:
        ratios = _int_list("compress_ratios", d["compress_ratios"])
        n_mtp = _check_int("num_nextn_predict_layers", kw.get("num_mtp_layers", max(len(ratios) - n, 0)), 0)
        if len(ratios) == n:  # no MTP entries: MTP blocks are sliding-window only
            ratios = ratios + [0] * n_mtp
        if len(ratios) != n + n_mtp:
            raise ValueError(
                f"compress_ratios: expected {n} (num_hidden_layers) or {n + n_mtp} (+ num_nextn_predict_layers)"
                f" entries, got {len(ratios)}"
            )
    elif d.get("layer_types") is not None:
        rates = {**_LAYER_TYPE_RATIO, **(d.get("compress_rates") or {})}
        for legacy, name in (
            ("compress_rate_csa", "compressed_sparse_attention"),
            ("compress_rate_hca", "heavily_compressed_attention"),
        ):
            if d.get(legacy) is not None:
                rates[name] = d[legacy]
        types = d["layer_types"]
        if not isinstance(types, list) or len(types) != n or any(t not in rates for t in types):
            raise ValueError(f"layer_types: expected {n} entries from {sorted(rates)}, got {types!r}")
        ratios, n_mtp = [rates[t] for t in types], 0  # transformers stores no MTP weights
    else:
        raise ValueError("config: missing required field 'compress_ratios' (or 'layer_types')")
    kw["compress_ratios"], kw["mtp_compress_ratios"], kw["num_mtp_layers"] = ratios[:n], ratios[n:], n_mtp
    kw["num_hash_layers"] = _parse_hash_layers(d, n)


def _parse_hash_layers(d: dict[str, Any], n: int) -> int:
    for key in ("num_hash_layers", "n_hash_layers"):
        if d.get(key) is not None:
            return _check_int(key, d[key], 0, n)
    types = d.get("mlp_layer_types")
    if types is None:
        return 0  # V4.1 drops the key: no hash-routed layers
    k = sum(t == "hash_moe" for t in types) if isinstance(types, list) else -1
    # The model treats hash routing as "layer < num_hash_layers", so hash layers must form a prefix.
    if k < 0 or list(types) != ["hash_moe"] * k + ["moe"] * (n - k):
        raise ValueError(f"mlp_layer_types: expected {n} entries, 'hash_moe'* then 'moe'*, got {types!r}")
    return k


def _parse_rope(d: dict[str, Any], kw: dict[str, Any]) -> None:
    """YaRN of the compressed layers from rope_scaling, rope_parameters or the reference's rope_factor."""
    scaling = d.get("rope_scaling")
    params = d.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("compress"), dict):
        main, scaling = params.get("main") or {}, params["compress"]
        if main.get("rope_theta") is not None:
            kw["rope_theta"] = main["rope_theta"]
        if scaling.get("rope_theta") is not None:
            kw["compress_rope_theta"] = scaling["rope_theta"]
    elif scaling is None and isinstance(params, dict):
        scaling = params
    if scaling is None and d.get("rope_factor") is not None:
        scaling = {
            "type": "yarn" if d["rope_factor"] != 1 else "default",
            "factor": d["rope_factor"],
            "original_max_position_embeddings": d.get("original_seq_len"),
            "beta_fast": d.get("beta_fast", 32),
            "beta_slow": d.get("beta_slow", 1),
        }
    kw["yarn"] = None if scaling is None else _parse_yarn(scaling)


def _parse_yarn(s: Any) -> YarnConfig | None:
    if not isinstance(s, dict):
        raise ValueError(f"rope_scaling: expected a dict, got {s!r}")
    kind = s.get("type", s.get("rope_type", "default"))
    if kind in ("default", None):
        return None
    if kind != "yarn":
        raise ValueError(f"rope_scaling.type: expected 'yarn' or 'default', got {kind!r}")
    factor = _check_float("rope_scaling.factor", s.get("factor"))
    if factor <= 0:
        raise ValueError(f"rope_scaling.factor: expected a positive number, got {factor}")
    orig = _check_int("rope_scaling.original_max_position_embeddings", s.get("original_max_position_embeddings"), 1)
    fast = _check_float("rope_scaling.beta_fast", s.get("beta_fast", 32.0))
    slow = _check_float("rope_scaling.beta_slow", s.get("beta_slow", 1.0))
    return YarnConfig(float(factor), orig, float(fast), float(slow))


def _parse_quant(d: dict[str, Any]) -> QuantConfig:
    qc = d.get("quantization_config")
    if qc is None:
        ref_dtype = d.get("dtype") if d.get("dtype") in ("fp8", "bf16") else None  # the reference key
        if ref_dtype != "fp8":
            return QuantConfig(fmt=None, expert_dtype=d.get("expert_dtype") or "bf16")
        qc = {"quant_method": "fp8", "scale_fmt": d.get("scale_fmt")}
    if not isinstance(qc, dict) or qc.get("quant_method", "fp8") != "fp8":
        raise ValueError(f"quantization_config: expected {{'quant_method': 'fp8', ...}}, got {qc!r}")
    block = qc.get("weight_block_size", [128, 128])
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(_is_int(b) and b > 0 for b in block)):
        raise ValueError(f"quantization_config.weight_block_size: expected two positive ints, got {block!r}")
    # Absent scale_fmt means fp32 scales, as in DeepSeek's reference (scale_fmt=None) and V3-style checkpoints.
    quant = QuantConfig(
        fmt=qc.get("fmt", "e4m3"),
        scale_fmt=qc.get("scale_fmt") or "fp32",
        weight_block_size=(int(block[0]), int(block[1])),
        expert_dtype=qc.get("expert_dtype") or d.get("expert_dtype") or "fp8",
    )
    if quant.fmt != "e4m3":
        raise ValueError(f"quantization_config.fmt: expected 'e4m3', got {quant.fmt!r}")
    if quant.scale_fmt not in ("ue8m0", "fp32"):
        raise ValueError(f"quantization_config.scale_fmt: expected 'ue8m0' or 'fp32', got {quant.scale_fmt!r}")
    return quant


def _parse_dspark(d: dict[str, Any]) -> DSparkConfig | None:
    keys = ("dspark_block_size", "dspark_noise_token_id", "dspark_target_layer_ids", "dspark_markov_rank")
    if all(d.get(k) is None for k in keys):
        return None
    missing = [k for k in keys if d.get(k) is None]
    if missing:
        raise ValueError(f"config: dspark_* fields are partly present; missing {missing}")
    n_exp = d.get("dspark_n_routed_experts")
    topk = d.get("dspark_num_experts_per_tok", d.get("dspark_n_activated_experts"))
    return DSparkConfig(
        block_size=_check_int("dspark_block_size", d["dspark_block_size"], 1),
        noise_token_id=_check_int("dspark_noise_token_id", d["dspark_noise_token_id"], 0),
        target_layer_ids=tuple(_int_list("dspark_target_layer_ids", d["dspark_target_layer_ids"])),
        markov_rank=_check_int("dspark_markov_rank", d["dspark_markov_rank"], 1),
        n_routed_experts=None if n_exp is None else _check_int("dspark_n_routed_experts", n_exp, 1),
        num_experts_per_tok=None if topk is None else _check_int("dspark_num_experts_per_tok", topk, 1),
    )


def _parse_eos(v: Any) -> tuple[int, ...]:
    ids = [v] if _is_int(v) else v
    if not isinstance(ids, list) or not ids or not all(_is_int(i) for i in ids):
        raise ValueError(f"eos_token_id: expected an int or a non-empty list of ints, got {v!r}")
    return tuple(ids)


def _validate(kw: dict[str, Any]) -> None:
    """Range and consistency checks; each error names the field (HF key) with expected and got."""
    for f in _POSITIVE_INTS:
        if f in kw:
            _check_int(_ALIASES[f][0], kw[f], 1)
    _check_int("num_hash_layers", kw["num_hash_layers"], 0, kw["num_layers"])
    _check_int("n_shared_experts", kw["n_shared_experts"], 0)
    for f in _POSITIVE_FLOATS:
        if f in kw and _check_float(_ALIASES[f][0], kw[f]) <= 0:
            raise ValueError(f"{_ALIASES[f][0]}: expected a positive number, got {kw[f]!r}")
    for f in ("norm_topk_prob", "tie_word_embeddings"):
        if f in kw and not isinstance(kw[f], bool):
            raise ValueError(f"{_ALIASES[f][0]}: expected true or false, got {kw[f]!r}")
    if kw["rope_dim"] >= kw["head_dim"] or kw["rope_dim"] % 2:
        raise ValueError(f"qk_rope_head_dim: expected an even value < head_dim={kw['head_dim']}, got {kw['rope_dim']}")
    if kw["index_head_dim"] < kw["rope_dim"]:
        raise ValueError(f"index_head_dim: expected >= qk_rope_head_dim={kw['rope_dim']}, got {kw['index_head_dim']}")
    if kw["num_heads"] % kw["o_groups"]:
        raise ValueError(f"o_groups: expected a divisor of num_attention_heads={kw['num_heads']}, got {kw['o_groups']}")
    if kw["num_experts_per_tok"] > kw["n_routed_experts"]:
        raise ValueError(
            f"num_experts_per_tok: expected <= n_routed_experts={kw['n_routed_experts']}, "
            f"got {kw['num_experts_per_tok']}"
        )
    if kw.get("scoring_func", "sqrtsoftplus") not in _SCORING_FUNCS:
        raise ValueError(f"scoring_func: expected one of {_SCORING_FUNCS}, got {kw['scoring_func']!r}")
    bad = [r for r in kw["compress_ratios"] + kw["mtp_compress_ratios"] if r != 0 and r < 2]
    if bad:
        raise ValueError(f"compress_ratios: expected entries 0 or >= 2, got {bad}")
    vocab = kw["vocab_size"]
    for name, ids in (("bos_token_id", [kw.get("bos_token_id", 0)]), ("eos_token_id", kw["eos_token_ids"])):
        if not all(_is_int(i) and 0 <= i < vocab for i in ids):
            raise ValueError(f"{name}: expected ids in [0, vocab_size={vocab}), got {ids}")
    q = kw["quant"]
    if q.expert_dtype not in ("fp4", "fp8", "bf16"):
        raise ValueError(f"expert_dtype: expected 'fp4', 'fp8' or 'bf16', got {q.expert_dtype!r}")
    if q.expert_dtype == "fp4" and (kw["hidden_size"] % 32 or kw["moe_inter_dim"] % 32):
        raise ValueError(
            "expert_dtype: 'fp4' needs hidden_size and moe_intermediate_size divisible by 32, "
            f"got {kw['hidden_size']} and {kw['moe_inter_dim']}"
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(name: str, v: Any, lo: int, hi: int | None = None) -> int:
    if not _is_int(v) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: expected an int {rng}, got {v!r}")
    return v


def _check_float(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{name}: expected a number, got {v!r}")
    return float(v)


def _int_list(name: str, v: Any) -> list[int]:
    if not isinstance(v, (list, tuple)) or not all(_is_int(x) for x in v):
        raise ValueError(f"{name}: expected a list of ints, got {v!r}")
    return list(v)
