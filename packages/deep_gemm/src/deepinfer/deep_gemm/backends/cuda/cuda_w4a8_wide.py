"""Compiled W4A8 GEMM on the 128 x 256 FP8 tile kernel's consumers ("w4a8_wide", sm_90a; issue 6, session 13).

Kernel: `csrc/cuda/dg_w4a8_wide.cuh` (launched through `_C.fp8_db_grouped` with tma mode W4A8_WIDE). The producer
warpgroup bulk-copies prepared FP4 weight chunks (`w4a8_wide_pack.prepare_w4a8_wide`) and converts them to e4m3 in
shared memory; the consumers are fp8_wide's (per 128-deep block acc += t * sfa[row] * sfb[block]). Weights must be
prepared and `lossless` (every 128 x 128 block spans <= 11 binades of E8M0 scales, no NaN byte): then the result
equals the reference's fp32 dot products up to summation order, as the FP8 kernel's.
"""

from __future__ import annotations

import torch

from . import cuda_fp8_db as db
from .w4a8_wide_pack import CHUNK_BYTES, TILE_N, W4A8WideWeights

__all__ = ["MAX_GROUPS", "W4A8_WIDE", "STAGES", "applies", "available", "m_grouped_fp8_fp4_gemm_nt_offsets_wide"]

STAGES, _, W4A8_WIDE = db.W4A8_VARIANT  # e4m3 ring depth 3 (the only one built), tma mode 4 of fp8_db_grouped
MAX_GROUPS = 1024  # kW4MaxGroups: the kernel's smaller group prefix leaves shared memory for 4 raw chunk slots


def available() -> bool:
    """True when `_C` was built with the W4A8 wide kernel."""
    return db.W4A8_VARIANT in db.compiled_variants()


def applies(values: torch.Tensor, w: W4A8WideWeights) -> bool:
    """True when the kernel can take the call: built, a lossless prepared weight, CUDA tensors on an sm_90 device,
    <= MAX_GROUPS (1024) groups, 16-byte aligned activations (the API has checked shapes and dtypes)."""
    if not (available() and isinstance(w, W4A8WideWeights) and w.lossless and values.is_cuda):
        return False
    g = w.shape[0]
    major, _ = torch.cuda.get_device_capability(values.device)
    return major == 9 and 1 <= g <= MAX_GROUPS and values.data_ptr() % 16 == 0


def _validate(values, sfa, w: W4A8WideWeights, offs, out) -> tuple[int, int, int, int]:
    g, n, k = w.shape
    m = values.shape[0]
    if tuple(values.shape) != (m, k) or values.dtype != torch.float8_e4m3fn or not values.is_contiguous():
        raise ValueError(f"a: expected contiguous float8_e4m3fn [m, {k}], got {values.dtype} {tuple(values.shape)}")
    checks = (
        ("a scales", sfa, torch.float32, (m, k // 128)),
        ("chunks", w.chunks, torch.uint8, (g, n // TILE_N, k // 128, CHUNK_BYTES)),
        ("sfb", w.sfb, torch.float32, (g, n // 128, k // 128)),
        ("offs", offs, torch.int32, (g,)),
        ("out", out, torch.bfloat16, (m, n)),
    )
    for name, t, dtype, shape in checks:
        if t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{name}: expected contiguous {dtype} {shape}, got {t.dtype} {tuple(t.shape)}")
        if t.device != values.device:
            raise ValueError(f"{name}: expected device {values.device} (a's), got {t.device}")
    if out.data_ptr() % 16 != 0 or w.chunks.data_ptr() % 16 != 0:
        raise ValueError("out / chunks: expected 16-byte aligned tensors")
    return m, n, k, g


def m_grouped_fp8_fp4_gemm_nt_offsets_wide(
    values: torch.Tensor, sfa: torch.Tensor, w: W4A8WideWeights, offs: torch.Tensor, out: torch.Tensor,
    ctas: int = 0,
) -> torch.Tensor:  # fmt: skip
    """out[r] = (values[r] * sfa[r]) @ W_i^T for the rows r of group i (offs = cumulative group ends).

    values: e4m3 [m, k]; sfa: fp32 [m, k / 128]; w: a lossless `W4A8WideWeights` (n % 256 == 0); offs: int32 [g];
    out: bf16 [m, n] (rows past offs[-1] untouched). ctas: persistent CTAs (0: one per SM). Returns out.
    """
    if not isinstance(w, W4A8WideWeights):
        raise TypeError(f"w: expected a W4A8WideWeights (prepare_w4a8_wide), got {type(w).__name__}")
    if not w.lossless:
        raise ValueError("w: expected a lossless prepared weight (a block spans > 11 binades or holds byte 255)")
    m, n, k, g = _validate(values, sfa, w, offs, out)
    return db.launch_variant(values, sfa, w.chunks, w.sfb, offs, out, m, n, k, g, STAGES, False, ctas, W4A8_WIDE)
