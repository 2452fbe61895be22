"""Lightning indexer of CSA layers: scores compressed entries per query and keeps the top k."""

from __future__ import annotations

import torch

from deepinfer import deep_select
from deepinfer import tile_kernels as tk

from ..cache.pool import CachePool
from ..config import ModelConfig
from ..weights import QWeight, linear
from .batch import StepBatch
from .compressor import Compressor
from .rope import Rope


class Indexer:
    """I[t, j] = sum_h w[t, h] * relu(qI[t, h] . kI[j]); top-k over the entries visible at t."""

    def __init__(
        self, cfg: ModelConfig, wq_b: QWeight, weights_proj: QWeight, compressor: Compressor, rope: Rope, qat: bool
    ) -> None:
        self.wq_b, self.weights_proj, self.compressor, self.rope = wq_b, weights_proj, compressor, rope
        self.heads, self.dim, self.topk, self.qat = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk, qat
        self.weight_scale = self.dim**-0.5 * self.heads**-0.5
        self.record, self.recorded = False, []

    def rotate_quant(self, x: torch.Tensor) -> torch.Tensor:
        """Hadamard (orthonormal, applied to q and k alike) then, in the simulation, FP4 quant-dequant."""
        # The fused op is bit-exact to the two in sequence and reads x once
        return tk.hadamard_fp4_quant_dequant(x, block=32) if self.qat else tk.hadamard_transform(x)

    def finish_keys(self, entries: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.rotate_quant(self.rope.at(entries, positions))

    def select(
        self, x: torch.Tensor, qr: torch.Tensor, b: StepBatch, cs: tuple, pool: CachePool, layer: int
    ) -> torch.Tensor:
        """Top-k local entry ids [T, topk] int32 (-1 padded). x: [T, hidden] normed input; qr: [T, q_lora]."""
        t = x.shape[0]
        q = linear(qr, self.wq_b).view(t, self.heads, self.dim)
        q = self.rotate_quant(self.rope.apply(q, cs))
        w = linear(x, self.weights_proj).float() * self.weight_scale
        view = b.comp[4]
        keys = pool.index_keys[layer][:-1].view(pool.num_blocks, view.rows_per_block, self.dim)  # minus trash row
        sel = deep_select.indexer_topk(
            q,
            w,
            keys,
            self.topk,
            visible=view.visible,
            seq_rows=b.slots[b.tok_seq].to(torch.int32),
            block_table=pool.block_table,
            rows_per_block=view.rows_per_block,
        )
        # deep_select returns the k picks in no particular order (the CUDA kernel places candidates with shared
        # atomics, so the order changes from run to run); sparse attention sums its tiles in list order, so an
        # unordered list makes the logits differ in the last bits between identical runs and between batch
        # compositions. Descending ids fix the order (same set, deterministic sums) and keep deep_select's -1 padding
        # last. Not yet timed on the GPU (one small sort per CSA layer and step).
        sel = torch.sort(sel, dim=-1, descending=True).values
        if self.record:  # tests compare the selections with DeepSeek's reference
            self.recorded.append(sel)
        return sel
