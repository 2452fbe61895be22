"""Per-layer cache layout: what state each layer kind keeps, and how many bytes it costs.

Every layer (main layers, then MTP blocks) gets one KV tensor `kv[l]` of shape
`[num_slots * W + num_blocks * R_l + 1, D]` (num_slots counts the pool's padding slot; the last row is a trash
row that predicated writes target):

* rows `[slot * W, slot * W + W)`: the sequence's sliding-window ring (position p in row p % W);
* rows after `num_slots * W`: paged compressed rows, `R_l = block_tokens // ratio_l` rows per block
  (R = 0 for sliding-window-only layers). Compressed entry j of a sequence lives in row
  `num_slots * W + block_table[slot, j // R] * R + j % R`.

One tensor per layer means attention reads window rows and compressed rows through one index list.
CSA layers add an indexer-key tensor `[num_blocks * R_l, index_head_dim]`. Compressed layers keep the
not-yet-pooled compressor tail per slot in fp32 (`tail_rows` rows of K and of gate scores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import ModelConfig, ratio_kind


@dataclass(frozen=True)
class LayerCacheSpec:
    """Cache needs of one attention layer."""

    kind: str  # "swa" | "csa" | "hca"
    ratio: int  # 0 for swa
    rows_per_block: int  # compressed rows per block (0 for swa)
    tail_rows: int  # compressor tail rows kept per slot (2 * ratio with overlap, ratio without, 0 for swa)
    tail_width: int  # coff * head_dim
    index_tail_width: int  # 2 * index_head_dim for csa, else 0


def block_tokens_for(cfg: ModelConfig) -> int:
    """Tokens covered by one cache block: lcm of 128 and every compress ratio (128 for V4-Flash)."""
    n = 128
    for r in (*cfg.compress_ratios, *cfg.mtp_compress_ratios):
        if r:
            n = math.lcm(n, r)
    return n


def layer_specs(cfg: ModelConfig) -> list[LayerCacheSpec]:
    """One spec per main layer, then one per MTP block."""
    bt = block_tokens_for(cfg)
    specs = []
    for ratio in (*cfg.compress_ratios, *cfg.mtp_compress_ratios):
        kind = ratio_kind(ratio)
        if kind == "swa":
            specs.append(LayerCacheSpec("swa", 0, 0, 0, 0, 0))
            continue
        coff = 2 if kind == "csa" else 1
        specs.append(
            LayerCacheSpec(
                kind,
                ratio,
                bt // ratio,
                coff * ratio,
                coff * cfg.head_dim,
                2 * cfg.index_head_dim if kind == "csa" else 0,
            )
        )
    return specs


def bytes_per_slot(cfg: ModelConfig, elem_bytes: int) -> int:
    """Fixed per-sequence state: window rings (compute dtype) + compressor tails (fp32, K and score)."""
    total = 0
    for s in layer_specs(cfg):
        total += cfg.window_size * cfg.head_dim * elem_bytes
        total += 2 * s.tail_rows * (s.tail_width + s.index_tail_width) * 4
    return total


def bytes_per_block(cfg: ModelConfig, elem_bytes: int) -> int:
    """Paged state per block: compressed rows (+ indexer keys on CSA layers)."""
    total = 0
    for s in layer_specs(cfg):
        width = cfg.head_dim + (cfg.index_head_dim if s.kind == "csa" else 0)
        total += s.rows_per_block * width * elem_bytes
    return total
