"""loader on transformers-named checkpoints: `save_pretrained` output and raw `state_dict()` names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from deepinfer.engine.config_parse import load_config
from deepinfer.engine.loader import expected_tensors, load_weights, official_name

# transformers parameter suffix (inside a layer) -> official suffix, written out by hand from
# `reference/v4-architecture.md` section 8 so the test does not reuse the loader's own table.
HF_TO_OFFICIAL = {
    "self_attn.sinks": "attn.attn_sink",
    "self_attn.q_a_proj.weight": "attn.wq_a.weight",
    "self_attn.q_a_norm.weight": "attn.q_norm.weight",
    "self_attn.q_b_proj.weight": "attn.wq_b.weight",
    "self_attn.kv_proj.weight": "attn.wkv.weight",
    "self_attn.kv_norm.weight": "attn.kv_norm.weight",
    "self_attn.o_a_proj.weight": "attn.wo_a.weight",
    "self_attn.o_b_proj.weight": "attn.wo_b.weight",
    "self_attn.compressor.position_bias": "attn.compressor.ape",
    "self_attn.compressor.kv_proj.weight": "attn.compressor.wkv.weight",
    "self_attn.compressor.gate_proj.weight": "attn.compressor.wgate.weight",
    "self_attn.compressor.kv_norm.weight": "attn.compressor.norm.weight",
    "self_attn.compressor.indexer.position_bias": "attn.indexer.compressor.ape",
    "self_attn.compressor.indexer.kv_proj.weight": "attn.indexer.compressor.wkv.weight",
    "self_attn.compressor.indexer.gate_proj.weight": "attn.indexer.compressor.wgate.weight",
    "self_attn.compressor.indexer.kv_norm.weight": "attn.indexer.compressor.norm.weight",
    "self_attn.compressor.indexer.q_b_proj.weight": "attn.indexer.wq_b.weight",
    "self_attn.compressor.indexer.scorer.weights_proj.weight": "attn.indexer.weights_proj.weight",
    "mlp.gate.weight": "ffn.gate.weight",
    "mlp.gate.tid2eid": "ffn.gate.tid2eid",
    "mlp.gate.e_score_correction_bias": "ffn.gate.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
    "mlp.shared_experts.up_proj.weight": "ffn.shared_experts.w3.weight",
    "mlp.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "attn_hc.fn": "hc_attn_fn",
    "attn_hc.base": "hc_attn_base",
    "attn_hc.scale": "hc_attn_scale",
    "ffn_hc.fn": "hc_ffn_fn",
    "ffn_hc.base": "hc_ffn_base",
    "ffn_hc.scale": "hc_ffn_scale",
}
HF_ROOT = {
    "model.embed_tokens.weight": "embed.weight",
    "lm_head.weight": "head.weight",
    "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny random DeepseekV4ForCausalLM (architecture doc 10.2) saved with save_pretrained; its state_dict."""
    import transformers  # the oracle is a test dependency (DESIGN.md); a missing one must fail, not skip

    cfg = transformers.DeepseekV4Config(
        vocab_size=200, hidden_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
        head_dim=128, qk_rope_head_dim=64, q_lora_rank=32, o_groups=2, o_lora_rank=16, sliding_window=8,
        layer_types=["sliding_attention"] * 2 + ["compressed_sparse_attention", "heavily_compressed_attention"] * 2,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        index_n_heads=4, index_head_dim=128, index_topk=3, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, moe_intermediate_size=48, num_hash_layers=2, rope_theta=1e4, compress_rope_theta=1.6e5,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                      "beta_fast": 32, "beta_slow": 1},
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(1234)
    model = transformers.DeepseekV4ForCausalLM(cfg).float()
    with torch.no_grad():  # random everything: HF zero-inits sinks, biases and tid2eid, which would hide swaps
        for p in model.parameters():
            p.normal_()
        for name, buf in model.named_buffers():
            if name.endswith("tid2eid"):
                buf.copy_(torch.stack([torch.randperm(8)[:2] for _ in range(buf.shape[0])]))
    out = tmp_path_factory.mktemp("hf") / "saved"
    model.save_pretrained(out)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return out, sd


def _check_against_state_dict(weights: dict[str, torch.Tensor], sd: dict[str, torch.Tensor], inter: int) -> None:
    seen = set()
    for key, value in sd.items():
        if key in HF_ROOT:
            names = {HF_ROOT[key]: value}
        else:
            m = re.fullmatch(r"model\.layers\.(\d+)\.(.*)", key)
            assert m is not None, key
            base, suffix = f"layers.{m.group(1)}.", m.group(2)
            if suffix == "mlp.experts.gate_up_proj":  # [E, 2I, H]: w1 (gate) rows first, then w3 (up)
                names = {f"{base}ffn.experts.{e}.w1.weight": value[e, :inter] for e in range(value.shape[0])}
                names |= {f"{base}ffn.experts.{e}.w3.weight": value[e, inter:] for e in range(value.shape[0])}
            elif suffix == "mlp.experts.down_proj":  # [E, H, I]
                names = {f"{base}ffn.experts.{e}.w2.weight": value[e] for e in range(value.shape[0])}
            else:
                names = {base + HF_TO_OFFICIAL[suffix]: value}
        for name, want in names.items():
            assert weights[name].dtype == want.dtype, name
            assert torch.equal(weights[name], want), name
            seen.add(name)
    assert seen == set(weights)


def test_save_pretrained_checkpoint(hf_model) -> None:
    path, sd = hf_model
    cfg = load_config(path)
    weights = load_weights(path, cfg, progress=False)
    assert set(weights) == set(expected_tensors(cfg))
    _check_against_state_dict(weights, sd, inter=48)


def test_state_dict_names_checkpoint(hf_model, tmp_path: Path) -> None:
    """transformers' in-memory names (self_attn.q_a_proj, merged experts, ...) as written by a plain save_file."""
    path, sd = hf_model
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    assert "model.layers.0.mlp.experts.gate_up_proj" in sd  # the merged layout this test is about
    weights = load_weights(tmp_path, load_config(tmp_path), progress=False)
    _check_against_state_dict(weights, sd, inter=48)


def test_official_names_pass_through_and_scale_rename() -> None:
    assert official_name("layers.7.attn.wq_a.weight") == "layers.7.attn.wq_a.weight"
    assert official_name("mtp.0.attn.kv_norm.weight") == "mtp.0.attn.kv_norm.weight"
    assert official_name("mtp.0.e_proj.scale") == "mtp.0.e_proj.scale"
    assert official_name("model.layers.3.self_attn.q_b_proj.weight_scale_inv") == "layers.3.attn.wq_b.scale"
    assert official_name("model.layers.3.attn.norm.weight") == "layers.3.attn.kv_norm.weight"


def test_saved_config_dialect(hf_model) -> None:
    path, _ = hf_model
    saved = json.loads((path / "config.json").read_text())
    assert "layer_types" in saved and "quantization_config" not in saved
