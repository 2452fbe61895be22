"""config_parse: the four config dialects and the validation errors."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from deepinfer.engine.config import DSparkConfig, QuantConfig, YarnConfig
from deepinfer.engine.config_parse import config_from_dict, load_config

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "data" / "v4-tiny-official"


@pytest.fixture(scope="module")
def official() -> dict:
    return json.loads((FIXTURE / "config.json").read_text())


def test_official_hf_config(official: dict) -> None:
    cfg = config_from_dict(official)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.head_dim) == (512, 256, 6, 4, 256)
    assert (cfg.rope_dim, cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank, cfg.window_size) == (64, 128, 2, 128, 128)
    assert cfg.compress_ratios == (0, 4, 128, 4, 128, 4)
    assert cfg.mtp_compress_ratios == (0,) and cfg.num_mtp_layers == 1
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (16, 128, 4)
    assert (cfg.n_routed_experts, cfg.n_shared_experts, cfg.num_experts_per_tok, cfg.moe_inter_dim) == (8, 1, 2, 128)
    assert cfg.num_hash_layers == 2 and cfg.scoring_func == "sqrtsoftplus" and cfg.route_scale == 1.5
    assert cfg.yarn == YarnConfig(16.0, 65536, 32.0, 1.0)
    assert (cfg.rope_theta, cfg.compress_rope_theta) == (10000.0, 160000.0)
    assert cfg.quant == QuantConfig(fmt="e4m3", scale_fmt="ue8m0", weight_block_size=(128, 128), expert_dtype="fp4")
    assert (cfg.bos_token_id, cfg.eos_token_ids, cfg.max_position_embeddings) == (0, (1,), 4096)
    assert cfg.dspark is None and cfg.torch_dtype == "bfloat16"
    assert [cfg.layer_kind(i) for i in range(6)] == ["swa", "csa", "hca", "csa", "hca", "csa"]


def test_reference_inference_config_matches_official(official: dict) -> None:
    ref = load_config(FIXTURE / "inference" / "config.json")
    hf = config_from_dict(official)
    # The reference key set has no max_position_embeddings (max_seq_len is a runtime choice there).
    assert dataclasses.replace(ref, max_position_embeddings=hf.max_position_embeddings) == hf
    assert load_config(FIXTURE) == hf  # directory form


def test_transformers_saved_config(tmp_path: Path) -> None:
    import transformers  # the oracle is a test dependency (DESIGN.md); a missing one must fail, not skip

    hf_cfg = transformers.DeepseekV4Config(
        vocab_size=200, hidden_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
        head_dim=128, qk_rope_head_dim=64, q_lora_rank=32, o_groups=2, o_lora_rank=16, sliding_window=8,
        layer_types=["sliding_attention"] * 2 + ["compressed_sparse_attention", "heavily_compressed_attention"] * 2,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        index_n_heads=4, index_head_dim=128, index_topk=3, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, moe_intermediate_size=32, num_hash_layers=2, routed_scaling_factor=2.5,
        rope_theta=1e4, compress_rope_theta=1.6e5, eos_token_id=[1, 7], max_position_embeddings=64,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                      "beta_fast": 32, "beta_slow": 1},
    )  # fmt: skip
    hf_cfg.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "layer_types" in saved and "compress_ratios" not in saved  # the dialect this test is about
    cfg = load_config(tmp_path)
    assert cfg.compress_ratios == (0, 0, 4, 8, 4, 8)
    assert cfg.num_mtp_layers == 0 and cfg.mtp_compress_ratios == ()  # transformers keeps no MTP weights
    assert cfg.num_hash_layers == 2 and cfg.route_scale == 2.5 and cfg.rope_dim == 64
    assert cfg.yarn == YarnConfig(4.0, 16, 32.0, 1.0) and cfg.compress_rope_theta == 1.6e5
    assert cfg.quant == QuantConfig(fmt=None, expert_dtype="bf16")
    assert cfg.eos_token_ids == (1, 7)


def test_flat_rope_parameters_and_legacy_rates(official: dict) -> None:
    d = copy.deepcopy(official)
    del d["rope_scaling"], d["compress_ratios"]
    d["rope_parameters"] = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512}
    d["layer_types"] = ["sliding_attention", "heavily_compressed_attention"] * 3
    d["compress_rate_hca"] = 16
    cfg = config_from_dict(d)
    assert cfg.yarn == YarnConfig(8.0, 512, 32.0, 1.0)
    assert cfg.compress_ratios == (0, 16) * 3


def test_nested_text_config_v41_style(official: dict) -> None:
    inner = {k: v for k, v in official.items() if k not in ("quantization_config", "expert_dtype")}
    inner["model_type"] = "deepseek_v41_text"
    outer = {
        "model_type": "deepseek_v41",
        "dtype": "bfloat16",
        "eos_token_id": 1,
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                                "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
        "text_config": inner,
        "vision_config": {"hidden_size": 1024},
    }  # fmt: skip
    cfg = config_from_dict(outer)
    assert cfg.quant == QuantConfig(fmt="e4m3", scale_fmt="ue8m0", weight_block_size=(32, 32), expert_dtype="fp4")
    assert cfg.model_type == "deepseek_v41_text" and cfg.hidden_size == 256
    assert cfg.compress_ratios == config_from_dict(official).compress_ratios


def test_eos_list_and_dspark(official: dict) -> None:
    d = {**official, "eos_token_id": [1, 9], "dspark_block_size": 5, "dspark_noise_token_id": 3,
         "dspark_target_layer_ids": [3, 4, 5], "dspark_markov_rank": 16}  # fmt: skip
    cfg = config_from_dict(d)
    assert cfg.eos_token_ids == (1, 9)
    assert cfg.dspark == DSparkConfig(block_size=5, noise_token_id=3, target_layer_ids=(3, 4, 5), markov_rank=16)


def test_reference_bf16_dtype_is_unquantised() -> None:
    d = json.loads((FIXTURE / "inference" / "config.json").read_text())
    d["dtype"] = "bf16"
    assert config_from_dict(d).quant.fmt is None


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"hidden_size": "256"}, "hidden_size"),
        ({"qk_rope_head_dim": 256}, "qk_rope_head_dim"),
        ({"qk_rope_head_dim": 63}, "qk_rope_head_dim"),
        ({"compress_ratios": [0, 4, 1, 4, 128, 4, 0]}, "compress_ratios"),
        ({"compress_ratios": [0, 4, 128]}, "compress_ratios"),
        ({"scoring_func": "relu"}, "scoring_func"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"num_hash_layers": 7}, "num_hash_layers"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"eos_token_id": 512}, "eos_token_id"),
        ({"eos_token_id": []}, "eos_token_id"),
        ({"o_groups": 3}, "o_groups"),
        ({"norm_topk_prob": "yes"}, "norm_topk_prob"),
        ({"rms_norm_eps": -1e-6}, "rms_norm_eps"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.type"),
        ({"rope_scaling": {"type": "yarn", "factor": 2.0}}, "original_max_position_embeddings"),
        ({"rope_scaling": {"type": "yarn", "factor": 0, "original_max_position_embeddings": 64}}, "factor"),
        ({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}}, "quantization_config.fmt"),
        ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}}, "weight_block_size"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
        ({"expert_dtype": "int4"}, "expert_dtype"),
        ({"dspark_block_size": 5}, "dspark"),
    ],
)
def test_bad_fields(official: dict, edit: dict, match: str) -> None:
    d = {k: v for k, v in {**official, **edit}.items() if v is not None}
    with pytest.raises(ValueError, match=match):
        config_from_dict(d)


def test_bad_mlp_layer_types(official: dict) -> None:
    d = {k: v for k, v in official.items() if k != "num_hash_layers"}
    d["mlp_layer_types"] = ["moe", "hash_moe", "moe", "moe", "moe", "moe"]  # hash layers must be a prefix
    with pytest.raises(ValueError, match="mlp_layer_types"):
        config_from_dict(d)


def test_load_config_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        load_config(tmp_path / "no_such_dir")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        load_config(tmp_path)
    with pytest.raises(TypeError, match="dict"):
        config_from_dict([1, 2])  # type: ignore[arg-type]
