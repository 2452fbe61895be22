"""Stored-format weights and the linear layer dispatch.

A `QWeight` keeps a linear weight exactly as the checkpoint stores it (FP8 e4m3 + block scales, FP4 e2m1
packed two per byte + per-32 scales, or a plain float tensor) so fast kernels can consume it directly. The
reference path multiplies with a dequantised copy, made once per compute dtype and cached (`dequant`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepinfer import deep_gemm
from deepinfer import tile_kernels as tk


@dataclass(eq=False)
class QWeight:
    """A linear weight [out, in] in its stored format.

    fmt: "float" (weight is [out, in] bf16/fp32, scale None), "fp8" (weight e4m3 [out, in], scale
    [ceil(out/b0), ceil(in/b1)] E8M0 or fp32 with block `block`), "fp4" (weight int8 [out, in/2] low nibble
    first, scale E8M0 [out, in/32]).
    """

    weight: torch.Tensor
    scale: torch.Tensor | None = None
    fmt: str = "float"
    block: tuple[int, int] = (128, 128)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        out = self.weight.shape[0]
        cols = self.weight.shape[1] * (2 if self.fmt == "fp4" else 1)
        return out, cols

    def dequant(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight as a dense [out, in] tensor of `dtype` (exact for FP8/FP4 in fp32; cached)."""
        if dtype not in self._cache:
            if self.fmt == "fp8":
                w = tk.dequant_fp8_block(self.weight, self.scale, block=self.block, dtype=torch.float32)
            elif self.fmt == "fp4":
                w = tk.unpack_fp4(self.weight, self.scale, block=32, dtype=torch.float32)
            else:
                w = self.weight
            self._cache[dtype] = w.to(dtype).contiguous()
        return self._cache[dtype]

    def to(self, device: torch.device | str) -> QWeight:
        """Move the stored tensors (not the cache) to `device`."""
        scale = None if self.scale is None else self.scale.to(device)
        return QWeight(self.weight.to(device), scale, self.fmt, self.block)


def linear(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """y = x @ W^T with x [..., in] in the compute dtype (bf16 or fp32); returns [..., out] in x.dtype.

    The reference path runs a float GEMM on the dequantised weight (no activation rounding, which is what
    the oracles compute). FP8/FP4 kernels that quantise activations plug in here (deep_gemm issue).
    """
    x2 = x.reshape(-1, x.shape[-1])
    y = deep_gemm.bf16_gemm_nt(x2.contiguous(), w.dequant(x.dtype))
    return y.reshape(*x.shape[:-1], y.shape[-1])
