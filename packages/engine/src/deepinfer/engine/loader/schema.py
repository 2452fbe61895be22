"""The official tensor schema of a DeepSeek-V4 checkpoint: every name, its shape and its storage kind.

`expected_tensors(cfg)` is the single source of truth for what a checkpoint holds (the loader validates
against it, checkpoint writers build from it). Names are DeepSeek's official ones (`layers.3.attn.wq_a.weight`,
no `model.` prefix); shapes follow `reference/v4-architecture.md` section 8.

Kinds:
- ``fp8_weight``  float8 e4m3 ``[out, in]``
- ``fp8_scale``   block scale ``[ceil(out/B0), ceil(in/B1)]`` (E8M0, or fp32 when ``scale_fmt == "fp32"``)
- ``fp4_weight``  int8, two e2m1 codes per byte ``[out, in/2]`` (low nibble = element 2k)
- ``fp4_scale``   E8M0 ``[out, in/32]``
- ``bf16``        a plain floating tensor (bf16 in the release; fp32 in an fp32 transformers save)
- ``f32``         an fp32 tensor (mHC parameters, ``ape``, sinks, gate bias)
- ``int``         an integer table (``tid2eid``: int64 in the release, int32 allowed)
"""

from __future__ import annotations

import math

import torch

from deepinfer.engine.config import ModelConfig, ratio_kind

TensorSpec = tuple[tuple[int, ...], str]
KINDS = ("fp8_weight", "fp8_scale", "fp4_weight", "fp4_scale", "bf16", "f32", "int")
FP4_BLOCK = 32  # inputs per E8M0 scale of an FP4 expert weight (fixed by the format)

# Dtypes a loaded tensor of each kind may have. The first entry is what a writer should store.
_KIND_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "fp8_weight": (torch.float8_e4m3fn,),
    "fp8_scale": (torch.float8_e8m0fnu, torch.float32),
    "fp4_weight": (torch.int8,),
    "fp4_scale": (torch.float8_e8m0fnu,),
    "bf16": (torch.bfloat16, torch.float32, torch.float16),
    "f32": (torch.float32, torch.bfloat16, torch.float16),
    "int": (torch.int64, torch.int32),
}


def allowed_dtypes(kind: str) -> tuple[torch.dtype, ...]:
    """Dtypes accepted for a tensor of `kind` (one of `KINDS`); the first is the release's storage dtype."""
    if kind not in _KIND_DTYPES:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    return _KIND_DTYPES[kind]


def storage_dtype(kind: str, cfg: ModelConfig) -> torch.dtype:
    """The dtype a checkpoint writer should use for `kind` under `cfg.quant` (fp32 scales if scale_fmt is fp32)."""
    if kind == "fp8_scale" and cfg.quant.scale_fmt == "fp32":
        return torch.float32
    return allowed_dtypes(kind)[0]


def expected_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor of an official-format checkpoint for `cfg`, as name -> (shape, kind).

    Covers the root tensors, every main layer `layers.{l}.*` (attention variant from
    `cfg.compress_ratios[l]`, hash routing for `l < cfg.num_hash_layers`) and every MTP block
    `mtp.{m}.*`. Linears are FP8 + scale when `cfg.quant.fmt` is set, plain ``bf16`` otherwise; routed
    experts follow `cfg.quant.expert_dtype` ("fp4", "fp8" or "bf16").
    """
    if cfg.dspark is not None:
        # The DSpark stage tensors (main_proj, markov/confidence heads) are not pinned down yet
        # (architecture doc section 6, "unverified"); refuse rather than validate against a guess.
        raise NotImplementedError("expected_tensors: DSpark checkpoints (config has dspark_*) are not supported yet")
    out: dict[str, TensorSpec] = {}
    h = cfg.hidden_size
    out["embed.weight"] = ((cfg.vocab_size, h), "bf16")
    if not cfg.tie_word_embeddings:
        out["head.weight"] = ((cfg.vocab_size, h), "bf16")
    out["norm.weight"] = ((h,), "bf16")
    _hc_head(out, "", cfg)
    for layer in range(cfg.num_layers):
        ratio = cfg.compress_ratios[layer]
        _block(out, f"layers.{layer}.", cfg, ratio, hash_routed=cfg.is_hash_layer(layer))
    for m in range(cfg.num_mtp_layers):
        p = f"mtp.{m}."
        _block(out, p, cfg, cfg.mtp_compress_ratios[m], hash_routed=False)
        _linear(out, p + "e_proj", h, h, cfg)
        _linear(out, p + "h_proj", h, h, cfg)
        for norm in ("enorm", "hnorm", "norm"):
            out[f"{p}{norm}.weight"] = ((h,), "bf16")
        _hc_head(out, p, cfg)
    return out


def _hc_head(out: dict[str, TensorSpec], p: str, cfg: ModelConfig) -> None:
    hc = cfg.hc_mult
    out[p + "hc_head_fn"] = ((hc, hc * cfg.hidden_size), "f32")
    out[p + "hc_head_base"] = ((hc,), "f32")
    out[p + "hc_head_scale"] = ((1,), "f32")


def _linear(out: dict[str, TensorSpec], name: str, n_out: int, n_in: int, cfg: ModelConfig) -> None:
    """A dense linear `name` with weight [n_out, n_in]: FP8 + block scale, or plain float when unquantised."""
    if cfg.quant.fmt is None:
        out[name + ".weight"] = ((n_out, n_in), "bf16")
        return
    b0, b1 = cfg.quant.weight_block_size
    out[name + ".weight"] = ((n_out, n_in), "fp8_weight")
    out[name + ".scale"] = ((math.ceil(n_out / b0), math.ceil(n_in / b1)), "fp8_scale")


def _expert_linear(out: dict[str, TensorSpec], name: str, n_out: int, n_in: int, cfg: ModelConfig) -> None:
    """A routed expert's linear, stored per `cfg.quant.expert_dtype`."""
    dt = cfg.quant.expert_dtype
    if dt == "fp4":
        if n_in % FP4_BLOCK:
            raise ValueError(f"{name}: FP4 experts need in_features divisible by {FP4_BLOCK}, got {n_in}")
        out[name + ".weight"] = ((n_out, n_in // 2), "fp4_weight")
        out[name + ".scale"] = ((n_out, n_in // FP4_BLOCK), "fp4_scale")
    elif dt == "fp8":
        b0, b1 = cfg.quant.weight_block_size
        out[name + ".weight"] = ((n_out, n_in), "fp8_weight")
        out[name + ".scale"] = ((math.ceil(n_out / b0), math.ceil(n_in / b1)), "fp8_scale")
    elif dt == "bf16":
        out[name + ".weight"] = ((n_out, n_in), "bf16")
    else:
        raise ValueError(f"cfg.quant.expert_dtype: expected 'fp4', 'fp8' or 'bf16', got {dt!r}")


def _block(out: dict[str, TensorSpec], p: str, cfg: ModelConfig, ratio: int, hash_routed: bool) -> None:
    """One transformer block (mHC + attention + MoE) under prefix `p`."""
    h, hc = cfg.hidden_size, cfg.hc_mult
    out[p + "attn_norm.weight"] = ((h,), "bf16")
    out[p + "ffn_norm.weight"] = ((h,), "bf16")
    for sub in ("attn", "ffn"):
        # (2 + hc) * hc mixing logits: hc pre weights, hc post weights, hc x hc residual matrix.
        out[f"{p}hc_{sub}_fn"] = (((2 + hc) * hc, hc * h), "f32")
        out[f"{p}hc_{sub}_base"] = (((2 + hc) * hc,), "f32")
        out[f"{p}hc_{sub}_scale"] = ((3,), "f32")
    _attention(out, p + "attn.", cfg, ratio)
    _moe(out, p + "ffn.", cfg, hash_routed)


def _attention(out: dict[str, TensorSpec], p: str, cfg: ModelConfig, ratio: int) -> None:
    h, d, nh = cfg.hidden_size, cfg.head_dim, cfg.num_heads
    _linear(out, p + "wq_a", cfg.q_lora_rank, h, cfg)
    out[p + "q_norm.weight"] = ((cfg.q_lora_rank,), "bf16")
    _linear(out, p + "wq_b", nh * d, cfg.q_lora_rank, cfg)
    _linear(out, p + "wkv", d, h, cfg)
    out[p + "kv_norm.weight"] = ((d,), "bf16")
    # Grouped output projection: wo_a maps each group's heads (nh*d/g inputs) to o_lora_rank outputs.
    _linear(out, p + "wo_a", cfg.o_groups * cfg.o_lora_rank, nh * d // cfg.o_groups, cfg)
    _linear(out, p + "wo_b", h, cfg.o_groups * cfg.o_lora_rank, cfg)
    out[p + "attn_sink"] = ((nh,), "f32")
    if ratio == 0:
        return
    _compressor(out, p + "compressor.", cfg, ratio, d)
    if ratio_kind(ratio) == "csa":
        _linear(out, p + "indexer.wq_b", cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank, cfg)
        out[p + "indexer.weights_proj.weight"] = ((cfg.index_n_heads, h), "bf16")
        _compressor(out, p + "indexer.compressor.", cfg, ratio, cfg.index_head_dim)


def _compressor(out: dict[str, TensorSpec], p: str, cfg: ModelConfig, ratio: int, dim: int) -> None:
    # The overlapping (CSA) compressor pools two series (previous and current window) per channel.
    coff = 2 if ratio_kind(ratio) == "csa" else 1
    out[p + "wkv.weight"] = ((coff * dim, cfg.hidden_size), "bf16")
    out[p + "wgate.weight"] = ((coff * dim, cfg.hidden_size), "bf16")
    out[p + "ape"] = ((ratio, coff * dim), "f32")
    out[p + "norm.weight"] = ((dim,), "bf16")


def _moe(out: dict[str, TensorSpec], p: str, cfg: ModelConfig, hash_routed: bool) -> None:
    h, inter, n_exp = cfg.hidden_size, cfg.moe_inter_dim, cfg.n_routed_experts
    out[p + "gate.weight"] = ((n_exp, h), "bf16")
    if hash_routed:
        out[p + "gate.tid2eid"] = ((cfg.vocab_size, cfg.num_experts_per_tok), "int")
    else:
        out[p + "gate.bias"] = ((n_exp,), "f32")
    for e in range(n_exp):
        _expert_linear(out, f"{p}experts.{e}.w1", inter, h, cfg)
        _expert_linear(out, f"{p}experts.{e}.w2", h, inter, cfg)
        _expert_linear(out, f"{p}experts.{e}.w3", inter, h, cfg)
    if cfg.n_shared_experts > 0:
        shared = cfg.n_shared_experts * inter  # shared experts are fused into one wider MLP
        _linear(out, p + "shared_experts.w1", shared, h, cfg)
        _linear(out, p + "shared_experts.w2", h, shared, cfg)
        _linear(out, p + "shared_experts.w3", shared, h, cfg)
