"""Build model modules from a loaded state dict (official tensor names, stored formats).

Every tensor must be consumed: what is left over, or missing, is an error naming it.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig, ratio_kind
from ..weights import QWeight
from .attention import Attention
from .block import Block, HyperConn
from .compressor import Compressor
from .indexer import Indexer
from .moe import Expert, MoE
from .rope import Rope


class WeightSource:
    """Pops tensors by official name, moving them to the model's device."""

    def __init__(self, tensors: dict[str, torch.Tensor], cfg: ModelConfig, device: torch.device) -> None:
        self.tensors, self.cfg, self.device = dict(tensors), cfg, device

    def take(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise KeyError(f"checkpoint is missing tensor {name!r}")
        return self.tensors.pop(name).to(self.device)

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.take(name) if name in self.tensors else None

    def linear(self, prefix: str) -> QWeight:
        """`prefix.weight` (+ `prefix.scale`) as a QWeight in its stored format."""
        w = self.take(f"{prefix}.weight")
        scale = self.maybe(f"{prefix}.scale")
        if scale is None:
            return QWeight(w)
        if w.dtype == torch.int8 or w.dtype == torch.uint8:
            return QWeight(w, scale, "fp4", (1, 32))
        return QWeight(w, scale, "fp8", tuple(self.cfg.quant.weight_block_size))

    def leftover(self) -> list[str]:
        return sorted(self.tensors)


def build_compressor(src: WeightSource, prefix: str, ratio: int, dim: int, eps: float) -> Compressor:
    return Compressor(
        src.linear(f"{prefix}.wkv"),
        src.linear(f"{prefix}.wgate"),
        src.take(f"{prefix}.ape"),
        src.take(f"{prefix}.norm.weight"),
        ratio,
        dim,
        eps,
    )


def build_attention(src: WeightSource, cfg: ModelConfig, p: str, ratio: int, rope: Rope, qat: bool) -> Attention:
    kind = ratio_kind(ratio)
    w = {n: src.linear(f"{p}.{n}") for n in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b")}
    w["q_norm"] = src.take(f"{p}.q_norm.weight")
    w["kv_norm"] = src.take(f"{p}.kv_norm.weight")
    w["attn_sink"] = src.take(f"{p}.attn_sink")
    if kind != "swa":
        w["compressor"] = build_compressor(src, f"{p}.compressor", ratio, cfg.head_dim, cfg.rms_norm_eps)
    if kind == "csa":
        icomp = build_compressor(src, f"{p}.indexer.compressor", ratio, cfg.index_head_dim, cfg.rms_norm_eps)
        w["indexer"] = Indexer(
            cfg, src.linear(f"{p}.indexer.wq_b"), src.linear(f"{p}.indexer.weights_proj"), icomp, rope, qat
        )
    return Attention(cfg, w, kind, ratio, rope, qat)


def build_moe(src: WeightSource, cfg: ModelConfig, p: str, hash_layer: bool) -> MoE:
    lim = cfg.swiglu_limit
    experts = [
        Expert(
            src.linear(f"{p}.experts.{e}.w1"), src.linear(f"{p}.experts.{e}.w2"), src.linear(f"{p}.experts.{e}.w3"), lim
        )
        for e in range(cfg.n_routed_experts)
    ]
    shared = None
    if cfg.n_shared_experts:
        s = f"{p}.shared_experts"
        shared = Expert(src.linear(f"{s}.w1"), src.linear(f"{s}.w2"), src.linear(f"{s}.w3"), lim)
    tid2eid = src.take(f"{p}.gate.tid2eid").long() if hash_layer else None
    bias = None if hash_layer else src.maybe(f"{p}.gate.bias")
    return MoE(cfg, src.take(f"{p}.gate.weight"), bias, tid2eid, experts, shared)


def build_block(
    src: WeightSource, cfg: ModelConfig, p: str, ratio: int, hash_layer: bool, ropes: dict[str, Rope], qat: bool
) -> Block:
    rope = ropes["plain" if ratio == 0 else "compress"]
    attn = build_attention(src, cfg, f"{p}.attn", ratio, rope, qat)
    moe = build_moe(src, cfg, f"{p}.ffn", hash_layer)

    def hc(site: str) -> HyperConn:
        return HyperConn(
            src.take(f"{p}.hc_{site}_fn"), src.take(f"{p}.hc_{site}_base"), src.take(f"{p}.hc_{site}_scale")
        )

    return Block(
        cfg, attn, moe, src.take(f"{p}.attn_norm.weight"), src.take(f"{p}.ffn_norm.weight"), hc("attn"), hc("ffn")
    )


def build_head(src: WeightSource, p: str) -> HyperConn:
    return HyperConn(src.take(f"{p}hc_head_fn"), src.take(f"{p}hc_head_base"), src.take(f"{p}hc_head_scale"))
