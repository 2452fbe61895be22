"""A V4-Flash-shaped random model, truncated to a few layers, for both transformers and DeepInfer.

Real widths (hidden 4096, 64 heads of 512, q_lora 1024, 8 output groups, 64 indexer heads, top-512 index,
256 experts of 2048, top-6, window 128, CSA 4 / HCA 128, 3 hash layers). Built on the GPU with random
weights, then quantised the way DeepSeek stores V4: FP8 e4m3 linears with 128x128 E8M0 scales and FP4 e2m1
routed experts with per-32 E8M0 scales. transformers gets the dequantised values written back into its
bf16 parameters, so both engines run the same function.
"""

from __future__ import annotations

import torch

from deepinfer import tile_kernels as tk
from deepinfer.engine.loader.names import is_merged_experts, official_name

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
FLASH_TYPES = [SWA, SWA] + [CSA, HCA] * 20 + [CSA]
FP8_SUFFIXES = (
    "attn.wq_a.weight",
    "attn.wq_b.weight",
    "attn.wkv.weight",
    "attn.wo_a.weight",
    "attn.wo_b.weight",
    "indexer.wq_b.weight",
    "shared_experts.w1.weight",
    "shared_experts.w2.weight",
    "shared_experts.w3.weight",
)


def hf_config(num_layers: int = 4, **overrides):
    """transformers config of the model; `overrides` replace widths (smoke tests on CPU)."""
    from transformers import DeepseekV4Config

    kw = dict(
        vocab_size=129280,
        hidden_size=4096,
        num_hidden_layers=num_layers,
        num_attention_heads=64,
        num_key_value_heads=1,
        head_dim=512,
        qk_rope_head_dim=64,
        q_lora_rank=1024,
        o_groups=8,
        o_lora_rank=1024,
        sliding_window=128,
        layer_types=FLASH_TYPES[:num_layers],
        compress_rates={CSA: 4, HCA: 128},
        index_n_heads=64,
        index_head_dim=128,
        index_topk=512,
        n_routed_experts=256,
        num_experts_per_tok=6,
        n_shared_experts=1,
        moe_intermediate_size=2048,
        num_hash_layers=3,
        scoring_func="sqrtsoftplus",
        routed_scaling_factor=1.5,
        swiglu_limit=10.0,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        hc_eps=1e-6,
        rms_norm_eps=1e-6,
        rope_theta=1e4,
        compress_rope_theta=1.6e5,
        max_position_embeddings=1048576,
        rope_scaling={
            "type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 65536,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        bos_token_id=0,
        eos_token_id=1,
    )
    cfg = DeepseekV4Config(**{**kw, **overrides})
    cfg._attn_implementation = "eager"
    return cfg


def official_config(hf_cfg) -> dict:
    """The same model as an official-format config.json dict (FP8 linears, FP4 experts)."""
    rates = {SWA: 0, CSA: 4, HCA: 128}
    keys = (
        "vocab_size",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "qk_rope_head_dim",
        "q_lora_rank",
        "o_groups",
        "o_lora_rank",
        "sliding_window",
        "index_n_heads",
        "index_head_dim",
        "index_topk",
        "n_routed_experts",
        "n_shared_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "scoring_func",
        "routed_scaling_factor",
        "swiglu_limit",
        "hc_mult",
        "hc_sinkhorn_iters",
        "hc_eps",
        "rms_norm_eps",
        "compress_rope_theta",
        "max_position_embeddings",
        "bos_token_id",
        "eos_token_id",
    )
    d = {k: getattr(hf_cfg, k) for k in keys}
    d.update(
        model_type="deepseek_v4",
        num_hidden_layers=hf_cfg.num_hidden_layers,
        num_nextn_predict_layers=0,
        num_hash_layers=3,
        rope_theta=1e4,
        compress_ratios=[rates[t] for t in hf_cfg.layer_types],
        rope_scaling={
            "type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 65536,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        expert_dtype="fp4",
        norm_topk_prob=True,
        quantization_config={
            "quant_method": "fp8",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        },
    )
    return d


@torch.no_grad()
def randomise_(model: torch.nn.Module, seed: int = 0) -> None:
    """Unit-variance activations: matrices ~ N(0, 1/fan_in); biases, sinks, mHC bases random; norms 1 +- 0.1."""
    dev = next(iter(model.state_dict().values())).device
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, t in model.state_dict().items():
        if name.endswith("tid2eid"):
            n_exp = model.config.n_routed_experts
            t.copy_(torch.argsort(torch.rand(t.shape[0], n_exp, device=t.device, generator=g), dim=1)[:, : t.shape[1]])
        elif t.dim() == 1 or name.endswith(("base", "scale", "sinks", "position_bias")):
            r = torch.randn(t.shape, device=t.device, generator=g)
            t.copy_(1.0 + 0.1 * r if name.endswith("norm.weight") or "layernorm" in name else 0.5 * r)
        else:
            t.copy_(torch.randn(t.shape, device=t.device, generator=g, dtype=torch.float32) / t.shape[-1] ** 0.5)


@torch.no_grad()
def quantise_to_official(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Official-name, official-format tensors; the model's parameters become their exact dequantised values."""
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        off = official_name(name)
        if is_merged_experts(off):
            _quantise_experts(t, off, out)
            continue
        if off.endswith(FP8_SUFFIXES):
            q, s = tk.fp8_block_quant(t.float())
            t.copy_(tk.dequant_fp8_block(q, s).to(t.dtype))
            out[off], out[off.replace(".weight", ".scale")] = q, s
            continue
        out[off] = t.clone()
    return out


def _quantise_experts(t: torch.Tensor, off: str, out: dict[str, torch.Tensor]) -> None:
    """Merged experts -> FP4 per expert. gate_up [E, 2I, H]: rows [:I] are w1, [I:] are w3; down [E, H, I] is w2."""
    base = off.rsplit(".", 1)[0]  # <block>.ffn.experts
    for e in range(t.shape[0]):
        q, s = tk.fp4_pack(t[e].float())
        t[e].copy_(tk.unpack_fp4(q, s).to(t.dtype))
        if off.endswith("gate_up_proj"):
            half = q.shape[0] // 2
            parts = {"w1": (q[:half], s[:half]), "w3": (q[half:], s[half:])}
        else:
            parts = {"w2": (q, s)}
        for w, (qq, ss) in parts.items():
            out[f"{base}.{e}.{w}.weight"], out[f"{base}.{e}.{w}.scale"] = qq.contiguous(), ss.contiguous()
