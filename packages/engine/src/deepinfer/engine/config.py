"""Model configuration for DeepSeek-V4 checkpoints.

`ModelConfig` is the engine's one view of a checkpoint's architecture. `ModelConfig.from_dict` accepts
the official HF-style `config.json` (with legacy fields such as `compress_ratios`, `num_hash_layers`,
`expert_dtype`, `quantization_config`, `dspark_*`), transformers-style fields (`layer_types` +
`compress_rates`), the reference `inference/config.json` key set (`dim`, `n_layers`, ...) and a nested
`text_config` (V4.1). Parsing lives in `config_parse.py`; this file only defines the fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class YarnConfig:
    """YaRN frequency interpolation used by compressed (CSA/HCA) layers. No attention mscale in V4."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass(frozen=True)
class QuantConfig:
    """How the checkpoint stores weights. `fmt is None` means unquantised (bf16/fp32) linears."""

    fmt: str | None = "e4m3"  # "e4m3" (FP8 linears) or None
    scale_fmt: str = "ue8m0"  # "ue8m0" (E8M0 power-of-two scales) or "fp32"
    weight_block_size: tuple[int, int] = (128, 128)  # V4.1 uses (32, 32)
    expert_dtype: str = "fp8"  # "fp4" (e2m1, per-32 E8M0 scales), "fp8", or "bf16" for unquantised


@dataclass(frozen=True)
class DSparkConfig:
    block_size: int
    noise_token_id: int
    target_layer_ids: tuple[int, ...]
    markov_rank: int
    # V4.1's DSpark stages have their own MoE width (`dspark_n_routed_experts`, `dspark_num_experts_per_tok`);
    # None means the stages use the main model's values.
    n_routed_experts: int | None = None
    num_experts_per_tok: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a DeepSeek-V4 model. Names follow the reference `ModelArgs` where possible.

    `compress_ratios[l]` is 0 (sliding window only), 4 (CSA: overlapping compressor + indexer top-k) or
    128 (HCA: all closed compressed rows) for main layer l; `mtp_compress_ratios` holds the MTP blocks'.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    rope_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    window_size: int
    compress_ratios: tuple[int, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_inter_dim: int
    num_hash_layers: int
    scoring_func: str = "sqrtsoftplus"  # "sqrtsoftplus" | "sigmoid" | "softmax"
    route_scale: float = 1.5
    norm_topk_prob: bool = True
    swiglu_limit: float = 10.0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    yarn: YarnConfig | None = None
    max_position_embeddings: int = 1048576
    num_mtp_layers: int = 1
    mtp_compress_ratios: tuple[int, ...] = (0,)
    bos_token_id: int = 0
    eos_token_ids: tuple[int, ...] = (1,)
    tie_word_embeddings: bool = False
    quant: QuantConfig = field(default_factory=QuantConfig)
    torch_dtype: str = "bfloat16"
    dspark: DSparkConfig | None = None
    # Room for V4.1 (`reference/v41-differences.md`): layer l may reuse the compressed KV / top-k of
    # an earlier "source" layer (None: every layer owns its state), and some layers look up hash memory.
    kv_source_layers: tuple[int | None, ...] | None = None
    model_type: str = "deepseek_v4"

    @property
    def nope_dim(self) -> int:
        """Non-RoPE dims of a KV entry (448 in V4-Flash): the part the FP8 simulation touches."""
        return self.head_dim - self.rope_dim

    def layer_kind(self, layer: int) -> str:
        """'swa', 'csa' or 'hca' for main layer `layer`."""
        return ratio_kind(self.compress_ratios[layer])

    def is_hash_layer(self, layer: int) -> bool:
        return layer < self.num_hash_layers


def ratio_kind(ratio: int) -> str:
    """Map a compress ratio to a layer kind: 0 -> 'swa', 4 -> 'csa' (overlapping + indexer), else 'hca'."""
    if ratio == 0:
        return "swa"
    if ratio == 4:
        return "csa"
    return "hca"
