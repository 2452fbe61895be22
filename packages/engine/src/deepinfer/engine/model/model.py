"""The DeepSeek-V4 model: embedding, mHC blocks, head, and the MTP block(s)."""

from __future__ import annotations

import torch

from deepinfer import tile_kernels as tk

from ..cache.pool import CachePool
from ..config import ModelConfig
from ..weights import linear
from .batch import StepBatch
from .block import Block, HyperConn
from .build import WeightSource, build_block, build_head
from .head import head_logits_bf16w
from .rope import build_ropes


class MTPBlock:
    """Multi-token prediction block: combines the main residual at t with the embedding of token t+1."""

    def __init__(self, src: WeightSource, cfg: ModelConfig, i: int, block: Block) -> None:
        p = f"mtp.{i}."
        self.e_proj, self.h_proj = src.linear(f"{p}e_proj"), src.linear(f"{p}h_proj")
        self.enorm, self.hnorm = src.take(f"{p}enorm.weight"), src.take(f"{p}hnorm.weight")
        self.norm = src.take(f"{p}norm.weight")
        self.head = build_head(src, p)
        self.block = block


class DeepseekV4:
    """Reference-path V4 forward over a flat batch of chunks, reading and writing a `CachePool`.

    `qat` switches on DeepSeek's quantisation simulation (FP8 on KV dims 0..nope-1 in blocks of 64; FP4
    after a Hadamard on the indexer queries and keys).
    """

    def __init__(
        self, cfg: ModelConfig, tensors: dict[str, torch.Tensor], *, dtype: torch.dtype, device, qat: bool
    ) -> None:
        self.cfg, self.dtype, self.device, self.qat = cfg, dtype, torch.device(device), qat
        src = WeightSource(tensors, cfg, self.device)
        self.ropes = build_ropes(cfg)
        self.embed = src.take("embed.weight")
        self.blocks = [
            build_block(src, cfg, f"layers.{i}", r, cfg.is_hash_layer(i), self.ropes, qat)
            for i, r in enumerate(cfg.compress_ratios)
        ]
        self.norm = src.take("norm.weight")
        self.head_w = src.take("head.weight")
        self._head_f32: torch.Tensor | None = None
        self.hc_head = build_head(src, "")
        self.mtp = [
            MTPBlock(src, cfg, i, build_block(src, cfg, f"mtp.{i}", r, False, self.ropes, qat))
            for i, r in enumerate(cfg.mtp_compress_ratios[: cfg.num_mtp_layers])
        ]
        left = src.leftover()
        if left:
            more = f" (and {len(left) - 10} more)" if len(left) > 10 else ""
            raise ValueError(f"checkpoint has tensors the model does not use: {left[:10]}{more}")

    @property
    def compress_ratios(self) -> set[int]:
        return {r for r in (*self.cfg.compress_ratios, *self.cfg.mtp_compress_ratios) if r}

    def _tables(self, b: StepBatch) -> dict[str, tuple]:
        return {k: r.cos_sin(b.positions) for k, r in self.ropes.items()}

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed[ids].to(self.dtype)

    def forward(self, b: StepBatch, pool: CachePool) -> torch.Tensor:
        """Run the main layers. Returns the final residual streams [T, hc, hidden] (before the head)."""
        x = self._embed(b.token_ids)[:, None, :].expand(-1, self.cfg.hc_mult, -1).contiguous()
        tables = self._tables(b)
        for i, blk in enumerate(self.blocks):
            cs = tables["plain" if blk.attn.kind == "swa" else "compress"]
            x = blk.forward(x, b, cs, pool, i)
        return x

    def logits(self, resid: torch.Tensor, head: HyperConn | None = None, norm: torch.Tensor | None = None):
        """fp32 logits [n, vocab] from residual streams [n, hc, hidden] (the head runs in fp32)."""
        c = self.cfg
        head = head or self.hc_head
        h = tk.mhc_head(resid, head.fn, head.scale, head.base, c.rms_norm_eps, c.hc_eps)
        h = tk.rms_norm(h, self.norm if norm is None else norm, c.rms_norm_eps)
        out = head_logits_bf16w(h.float(), self.head_w)  # fp32-exact products on tensor cores (CUDA)
        if out is not None:
            return out
        if self._head_f32 is None:  # the head runs in fp32 (as the reference); convert the weight once
            self._head_f32 = self.head_w.float()
        return h.float() @ self._head_f32.t()

    def mtp_forward(self, i: int, resid: torch.Tensor, b: StepBatch, pool: CachePool) -> torch.Tensor:
        """MTP block i. resid: main residual [T, hc, d] at positions b.positions; b.token_ids hold the
        NEXT token of each position (t+1). Returns the block's residual [T, hc, d]; its logits predict t+2.
        """
        m, c = self.mtp[i], self.cfg
        e = tk.rms_norm(self._embed(b.token_ids), m.enorm, c.rms_norm_eps)
        hs = tk.rms_norm(resid, m.hnorm, c.rms_norm_eps)
        x = linear(e, m.e_proj)[:, None, :] + linear(hs, m.h_proj)
        cs = self._tables(b)["plain" if m.block.attn.kind == "swa" else "compress"]
        return m.block.forward(x.to(self.dtype), b, cs, pool, len(self.blocks) + i)

    def mtp_logits(self, i: int, resid: torch.Tensor) -> torch.Tensor:
        return self.logits(resid, self.mtp[i].head, self.mtp[i].norm)
