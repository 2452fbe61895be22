"""One V4 block: mHC around attention and around the MoE."""

from __future__ import annotations

import torch

from deepinfer import tile_kernels as tk

from ..cache.pool import CachePool
from ..config import ModelConfig
from .attention import Attention
from .batch import StepBatch
from .moe import MoE


class HyperConn:
    """Parameters of one mHC site (fn [(2+hc)*hc, hc*d], base, scale)."""

    def __init__(self, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor) -> None:
        self.fn, self.base, self.scale = fn.float(), base.float(), scale.float()


class Block:
    def __init__(
        self,
        cfg: ModelConfig,
        attn: Attention,
        moe: MoE,
        attn_norm: torch.Tensor,
        ffn_norm: torch.Tensor,
        hc_attn: HyperConn,
        hc_ffn: HyperConn,
    ) -> None:
        self.cfg, self.attn, self.moe = cfg, attn, moe
        self.attn_norm, self.ffn_norm, self.hc_attn, self.hc_ffn = attn_norm, ffn_norm, hc_attn, hc_ffn

    def _pre(self, x: torch.Tensor, hc: HyperConn):
        c = self.cfg
        return tk.mhc_pre(x, hc.fn, hc.scale, hc.base, c.rms_norm_eps, c.hc_eps, c.hc_sinkhorn_iters)

    def forward(self, x: torch.Tensor, b: StepBatch, cs: tuple, pool: CachePool, layer: int) -> torch.Tensor:
        """x: [T, hc, hidden] residual streams -> same."""
        eps = self.cfg.rms_norm_eps
        h, post, comb = self._pre(x, self.hc_attn)
        a = self.attn.forward(tk.rms_norm(h, self.attn_norm, eps), b, cs, pool, layer)
        x = tk.mhc_post(a, x, post, comb)
        h, post, comb = self._pre(x, self.hc_ffn)
        f = self.moe.forward(tk.rms_norm(h, self.ffn_norm, eps), b.token_ids)
        return tk.mhc_post(f, x, post, comb)
