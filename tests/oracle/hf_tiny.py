"""Tiny random DeepSeek-V4 checkpoints built with transformers' `DeepseekV4ForCausalLM` (the logit oracle).

Three configs cover sliding-window, CSA and HCA layers, hash and routed MoE, YaRN, and index top-k smaller
than the number of visible entries. Parameters transformers initialises to constants (biases, sinks,
positional biases, mHC bases, norm weights) are randomised so the test exercises them, and `tid2eid` rows
hold distinct experts (architecture notes section 10.2).

All configs use 16 indexer heads: with 4 heads the ReLU in the index score gives exact 0.0 ties at the
top-k boundary (seen at position 39 of config 'a'), where torch.topk's choice is implementation-defined
and no exact implementation can match it. The official fixture made the same change for the same reason.
"""

from __future__ import annotations

from pathlib import Path

import torch

_COMMON = dict(
    num_key_value_heads=1, qk_rope_head_dim=64, scoring_func="sqrtsoftplus", routed_scaling_factor=1.5,
    swiglu_limit=10.0, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6, rope_theta=1e4,
    compress_rope_theta=1.6e5, n_shared_experts=1, bos_token_id=0, eos_token_id=1,
)
CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"

CONFIGS: dict[str, dict] = {
    # The notes' recipe: window 8, CSA 4, HCA 8, two hash layers, top-3 of the compressed entries.
    "a": dict(
        vocab_size=200, hidden_size=128, num_hidden_layers=6, num_attention_heads=4, head_dim=128, q_lora_rank=32,
        o_groups=2, o_lora_rank=16, sliding_window=8, layer_types=[SWA, SWA, CSA, HCA, CSA, HCA],
        compress_rates={CSA: 4, HCA: 8}, index_n_heads=16, index_head_dim=128, index_topk=3, n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=32, num_hash_layers=2, hc_mult=4,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32,
                      "beta_slow": 1},
        max_position_embeddings=64,
    ),
    # A hash-routed CSA first layer (like V4-Flash layer 2), 8 heads in 4 output groups, 2 mHC streams.
    "b": dict(
        vocab_size=256, hidden_size=96, num_hidden_layers=4, num_attention_heads=8, head_dim=128, q_lora_rank=48,
        o_groups=4, o_lora_rank=24, sliding_window=16, layer_types=[CSA, HCA, SWA, CSA],
        compress_rates={CSA: 4, HCA: 16}, index_n_heads=16, index_head_dim=128, index_topk=5, n_routed_experts=16,
        num_experts_per_tok=4, moe_intermediate_size=48, num_hash_layers=1, hc_mult=2,
        rope_scaling={"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 32,
                      "beta_slow": 1},
        max_position_embeddings=256,
    ),
    # V4-Flash proportions at toy width: window 128, HCA 128, hash layers through the first CSA layer.
    "c": dict(
        vocab_size=320, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=128, q_lora_rank=32,
        o_groups=2, o_lora_rank=32, sliding_window=128, layer_types=[SWA, SWA, CSA, HCA],
        compress_rates={CSA: 4, HCA: 128}, index_n_heads=16, index_head_dim=128, index_topk=8, n_routed_experts=8,
        num_experts_per_tok=3, moe_intermediate_size=40, num_hash_layers=3, hc_mult=4,
        rope_scaling={"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256, "beta_fast": 32,
                      "beta_slow": 1},
        max_position_embeddings=1024,
    ),
}


def _randomise(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("tid2eid"):
                continue
            if p.dim() == 1 or "position_bias" in name or name.endswith(("base", "scale", "sinks")):
                if name.endswith(("norm.weight", "layernorm.weight")):
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:  # matrices: unit-variance activations (std 1/sqrt(fan_in)) so the model is not degenerate
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        # tid2eid may be a buffer or a parameter depending on the transformers version
        for name, t in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith("tid2eid"):
                n_exp = model.config.n_routed_experts
                rows = [torch.randperm(n_exp, generator=g)[: t.shape[1]] for _ in range(t.shape[0])]
                t.copy_(torch.stack(rows).to(t.dtype))


def build_hf_model(name: str, seed: int = 0):
    """A randomised fp32 eager `DeepseekV4ForCausalLM` for config `name` in {'a', 'b', 'c'}."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    cfg = DeepseekV4Config(**_COMMON, **CONFIGS[name])
    cfg._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    _randomise(model, seed)
    return model


def save_hf_checkpoint(model, out_dir: Path) -> Path:
    """save_pretrained (transformers names, safetensors) plus a tiny word-level tokenizer for the API."""
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    write_word_tokenizer(out_dir, model.config.vocab_size)
    return out_dir


def write_word_tokenizer(out_dir: Path, vocab: int) -> None:
    """tokenizer.json mapping `<tK>` <-> id K (the fixture's convention); id 0 BOS, 1 EOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"<t{i}>": i for i in range(vocab)}, unk_token="<t2>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(Path(out_dir) / "tokenizer.json"))
    (Path(out_dir) / "tokenizer_config.json").write_text(
        '{"bos_token": "<t0>", "eos_token": "<t1>", "add_bos_token": false}'
    )


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """Full-sequence fp32 logits [len(ids), vocab] from the oracle."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def random_prompt(vocab: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [0] + torch.randint(2, vocab, (n - 1,), generator=g).tolist()


def save_official_checkpoint(model, out_dir: Path) -> Path:
    """The same weights under DeepSeek's official names (per-expert, no `model.` prefix) with an official-style
    config.json (`compress_ratios`, `num_hash_layers`, `rope_scaling`; transformers has no MTP block), one shard
    plus its index."""
    import json

    from safetensors.torch import save_file

    from deepinfer.engine.loader.names import is_merged_experts, official_name, split_merged_experts

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        off = official_name(name)
        parts = split_merged_experts(off, t) if is_merged_experts(off) else {off: t}
        tensors.update({k: v.contiguous().clone() for k, v in parts.items()})
    save_file(tensors, str(out_dir / "model-00001-of-00001.safetensors"))
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": {k: "model-00001-of-00001.safetensors" for k in sorted(tensors)}}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    c = model.config
    rates = c.compress_rates
    ratios = [{SWA: 0, CSA: rates[CSA], HCA: rates[HCA]}[t] for t in c.layer_types]
    rope = c.rope_parameters["compress"]
    cfg = {k: getattr(c, k) for k in (
        "vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "qk_rope_head_dim",
        "q_lora_rank", "o_groups", "o_lora_rank", "sliding_window", "index_n_heads", "index_head_dim", "index_topk",
        "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
        "scoring_func", "routed_scaling_factor", "swiglu_limit", "hc_mult", "hc_sinkhorn_iters", "hc_eps",
        "rms_norm_eps", "compress_rope_theta", "max_position_embeddings", "bos_token_id", "eos_token_id",
        "norm_topk_prob", "tie_word_embeddings")}
    cfg.update(model_type="deepseek_v4", architectures=["DeepseekV4ForCausalLM"], num_hidden_layers=len(c.layer_types),
               num_nextn_predict_layers=0, compress_ratios=ratios,
               num_hash_layers=sum(t == "hash_moe" for t in c.mlp_layer_types),
               rope_theta=c.rope_parameters["main"]["rope_theta"],
               torch_dtype="float32",
               rope_scaling={"type": "yarn", "factor": rope["factor"], "beta_fast": rope["beta_fast"],
                             "beta_slow": rope["beta_slow"],
                             "original_max_position_embeddings": rope["original_max_position_embeddings"]})
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    write_word_tokenizer(out_dir, c.vocab_size)
    return out_dir
