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

from .model.head import mm_fp32_out


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

    def exact_bf16(self) -> torch.Tensor | None:
        """The weight as bf16 [out, in] when every value is exactly a bf16 number (a BF16 checkpoint tensor always),
        else None. Checked once (one host sync for other formats), then cached."""
        if "exact_bf16" not in self._cache:
            had16 = torch.bfloat16 in self._cache
            w16 = self.dequant(torch.bfloat16)
            exact = self.fmt == "float" and self.weight.dtype == torch.bfloat16
            exact = exact or torch.equal(w16.float(), self.dequant(torch.float32))
            if not exact and not had16:
                del self._cache[torch.bfloat16]  # made for the check only: do not keep a copy nobody uses
            self._cache["exact_bf16"] = w16 if exact else None
        return self._cache["exact_bf16"]

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


def linear_fp32(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """fp32 y = x.float() @ W^T (products and sums in fp32), as V4 runs its router and compressor projections.

    x: [..., in] bf16 / fp32. On CUDA with a bf16 x and a weight that is exactly bf16 (`exact_bf16`): one bf16 GEMM
    with fp32 accumulation and output. Each bf16 x bf16 product is exact in fp32, so it is the fp32 GEMM up to the
    order of the additions, on tensor cores and reading half the weight bytes (the fp32 GEMM ran as a SIMT kernel
    on the H200). Else the fp32 GEMM of `linear`. Returns fp32 [..., out].
    """
    w16 = w.exact_bf16() if x.is_cuda and x.dtype == torch.bfloat16 else None
    if w16 is not None:
        y = mm_fp32_out(x.reshape(-1, x.shape[-1]), w16.t())
        if y is not None:
            return y.reshape(*x.shape[:-1], y.shape[-1])
    return linear(x.float(), w)
