"""RoPE tables of a V4 model: plain (theta, SWA layers and MTP) and YaRN (compress_rope_theta, CSA/HCA)."""

from __future__ import annotations

import torch

from deepinfer import tile_kernels as tk

from ..config import ModelConfig


class Rope:
    """One frequency table; rotates the last `rope_dim` dims of vectors at given positions."""

    def __init__(self, inv_freq: torch.Tensor, rope_dim: int) -> None:
        self.inv_freq, self.rope_dim = inv_freq, rope_dim

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables [t, rope_dim/2] fp32 for positions [t]."""
        if self.inv_freq.device != positions.device:  # keep the table on the device: no copy per step
            self.inv_freq = self.inv_freq.to(positions.device)
        return tk.rope_cos_sin(positions, self.inv_freq)

    def apply(self, x: torch.Tensor, cs: tuple[torch.Tensor, torch.Tensor], inverse: bool = False) -> torch.Tensor:
        """x: [t, ..., d]; cs from `cos_sin` for the same t positions."""
        return tk.apply_rope_interleaved(x, cs[0], cs[1], self.rope_dim, inverse)

    def at(self, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        return self.apply(x, self.cos_sin(positions), inverse)


def build_ropes(cfg: ModelConfig) -> dict[str, Rope]:
    """{'plain': ..., 'compress': ...}: the two tables a V4 model uses."""
    plain = tk.rope_inv_freq(cfg.rope_dim, cfg.rope_theta)
    y = cfg.yarn
    compress = tk.rope_inv_freq(
        cfg.rope_dim,
        cfg.compress_rope_theta,
        yarn_factor=None if y is None else y.factor,
        yarn_original_max_pos=None if y is None else y.original_max_position_embeddings,
        beta_fast=32.0 if y is None else y.beta_fast,
        beta_slow=1.0 if y is None else y.beta_slow,
    )
    return {"plain": Rope(plain, cfg.rope_dim), "compress": Rope(compress, cfg.rope_dim)}
