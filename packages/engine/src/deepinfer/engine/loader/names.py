"""Map stored tensor names to DeepSeek's official names.

Two non-official namings reach the loader:
- transformers' in-memory names (`model.layers.3.self_attn.q_a_proj.weight`, `mlp.experts.gate_up_proj`
  [E, 2I, H] and `down_proj` [E, H, I], `model.hc_head.hc_fn`, `lm_head.weight`, ...), written by tools
  that save a `state_dict()` directly;
- what transformers 5.24's `save_pretrained` writes: it reverses its own renaming, so names are official
  behind a `model.` prefix, except the root (`model.embed_tokens.weight`, `model.hc_head.hc_fn`) and the
  attention's kv_norm, which comes out as `attn.norm.weight` because the reverse of its
  `.norm. -> .kv_norm.` rule also hits that tensor.
FP8 scales named `weight_scale_inv` (HF FP8 convention) become `scale`, as DeepSeek's `convert.py` does.
"""

from __future__ import annotations

import re

import torch

_ROOT = {
    "embed_tokens.weight": "embed.weight",
    "lm_head.weight": "head.weight",
    "hc_head.hc_fn": "hc_head_fn",
    "hc_head.hc_base": "hc_head_base",
    "hc_head.hc_scale": "hc_head_scale",
}

# Prefix renames inside a block (after `layers.N.` / `mtp.N.`), most specific first.
_BLOCK_PREFIXES: tuple[tuple[str, str], ...] = (
    ("self_attn.compressor.indexer.scorer.weights_proj.", "attn.indexer.weights_proj."),
    ("self_attn.compressor.indexer.q_b_proj.", "attn.indexer.wq_b."),
    ("self_attn.compressor.indexer.kv_proj.", "attn.indexer.compressor.wkv."),
    ("self_attn.compressor.indexer.gate_proj.", "attn.indexer.compressor.wgate."),
    ("self_attn.compressor.indexer.kv_norm.", "attn.indexer.compressor.norm."),
    ("self_attn.compressor.indexer.position_bias", "attn.indexer.compressor.ape"),
    ("self_attn.compressor.kv_proj.", "attn.compressor.wkv."),
    ("self_attn.compressor.gate_proj.", "attn.compressor.wgate."),
    ("self_attn.compressor.kv_norm.", "attn.compressor.norm."),
    ("self_attn.compressor.position_bias", "attn.compressor.ape"),
    ("self_attn.q_a_proj.", "attn.wq_a."),
    ("self_attn.q_a_norm.", "attn.q_norm."),
    ("self_attn.q_b_proj.", "attn.wq_b."),
    ("self_attn.kv_proj.", "attn.wkv."),
    ("self_attn.kv_norm.", "attn.kv_norm."),
    ("self_attn.o_a_proj.", "attn.wo_a."),
    ("self_attn.o_b_proj.", "attn.wo_b."),
    ("self_attn.sinks", "attn.attn_sink"),
    ("self_attn.", "attn."),
    ("attn.norm.", "attn.kv_norm."),  # transformers 5.24 save_pretrained artefact (see module doc)
    ("input_layernorm.", "attn_norm."),
    ("post_attention_layernorm.", "ffn_norm."),
    ("attn_hc.fn", "hc_attn_fn"),
    ("attn_hc.base", "hc_attn_base"),
    ("attn_hc.scale", "hc_attn_scale"),
    ("ffn_hc.fn", "hc_ffn_fn"),
    ("ffn_hc.base", "hc_ffn_base"),
    ("ffn_hc.scale", "hc_ffn_scale"),
    ("mlp.gate.e_score_correction_bias", "ffn.gate.bias"),
    ("mlp.shared_experts.gate_proj.", "ffn.shared_experts.w1."),
    ("mlp.shared_experts.up_proj.", "ffn.shared_experts.w3."),
    ("mlp.shared_experts.down_proj.", "ffn.shared_experts.w2."),
    ("mlp.", "ffn."),
)
_BLOCK = re.compile(r"^((?:layers|mtp)\.\d+\.)(.*)$")
# Copies of the shared embedding / head inside an MTP block: DeepSeek's convert.py drops them "if present"
# and the model uses the main ones, so the loader skips them too.
_MTP_SHARED_COPIES = re.compile(r"^mtp\.\d+\.(?:emb|embed|head)\.")
MERGED_GATE_UP = "ffn.experts.gate_up_proj"
MERGED_DOWN = "ffn.experts.down_proj"


def official_name(name: str) -> str:
    """The official name of a stored tensor `name` (official names come back unchanged)."""
    if name.startswith("model."):
        name = name[len("model.") :]
    if name.endswith(".weight_scale_inv"):
        name = name[: -len("weight_scale_inv")] + "scale"
    if name in _ROOT:
        return _ROOT[name]
    m = _BLOCK.match(name)
    if m is None:
        return name
    prefix, rest = m.groups()
    for old, new in _BLOCK_PREFIXES:
        if rest.startswith(old):
            return prefix + new + rest[len(old) :]
    return name


def is_skipped(name: str) -> bool:
    """True for an official name the loader drops: MTP copies of the shared embedding or head."""
    return _MTP_SHARED_COPIES.match(name) is not None


def is_merged_experts(name: str) -> bool:
    """True for an (official-renamed) merged expert tensor: `<block>.ffn.experts.gate_up_proj` / `down_proj`."""
    m = _BLOCK.match(name)
    return m is not None and m.group(2) in (MERGED_GATE_UP, MERGED_DOWN)


def split_merged_experts(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """Split transformers' merged experts into official per-expert weights.

    name: `<block>.ffn.experts.gate_up_proj` with tensor [E, 2I, H] (rows 0..I-1 are w1 = gate, rows I..2I-1
    are w3 = up), or `<block>.ffn.experts.down_proj` with tensor [E, H, I] (w2). Any float dtype.
    Returns {`<block>.ffn.experts.{e}.w1.weight`: [I, H], ...}; each value is a contiguous copy-free slice.
    """
    m = _BLOCK.match(name)
    if m is None or m.group(2) not in (MERGED_GATE_UP, MERGED_DOWN):
        raise ValueError(f"name: expected '<block>.{MERGED_GATE_UP}' or '<block>.{MERGED_DOWN}', got {name!r}")
    if tensor.dim() != 3:
        raise ValueError(f"{name}: expected a 3-d tensor [experts, rows, cols], got shape {tuple(tensor.shape)}")
    base = m.group(1) + "ffn.experts."
    if m.group(2) == MERGED_DOWN:
        return {f"{base}{e}.w2.weight": tensor[e] for e in range(tensor.shape[0])}
    if tensor.shape[1] % 2:
        raise ValueError(f"{name}: expected an even number of rows (w1 then w3), got shape {tuple(tensor.shape)}")
    inter = tensor.shape[1] // 2
    out: dict[str, torch.Tensor] = {}
    for e in range(tensor.shape[0]):
        out[f"{base}{e}.w1.weight"] = tensor[e, :inter]
        out[f"{base}{e}.w3.weight"] = tensor[e, inter:]
    return out
