"""DIAGNOSTIC ablation builds of the register-operand W4A8 kernel `cuda_rs2s4n256` (timing only: results are WRONG).

Each build removes one part of the consumers' work (csrc/cuda/dg_w4a8_rs.cuh, kAblate; launchers in
csrc/cuda/dg_w4a8_rs_ablate.cu), so that one benchmark run (benchmarks/bench_dg_w4a8_ablate.py) shows where the
kernel's time goes. Not reachable through the W4A8 API's impl= names (parse_variant rejects them): only this module
launches them. Names -> kAblate masks in `ABLATIONS`:

    abl_A_noconv   1  fragment words loaded but fed raw to the wgmma (no FP4 -> e4m3 conversion)
    abl_B_nopromo  2  wgmmas accumulate straight into acc (no tmp, no per-block FFMA; one wait per block)
    abl_C_nowgmma  4  no wgmma (conversion + promotion kept alive through an empty asm with the wgmma's operands)
    abl_D_prodonly 8  consumers only wait full / arrive empty per block (+ the epilogue's stores): the feed rate
    abl_E_mmafeed  3  A + B: wgmma + feed only (the ceiling of this structure)
    abl_F_nostore 16  the epilogue stores nothing (the epilogue's cost)
    abl_G_noffma  32  the promotion FFMAs skipped, tmp and the per-half wait kept (B - G: the drain between halves)
"""

from __future__ import annotations

import torch

from ..._backend import compiled_module
from .cuda_w4a8_grouped import applies

__all__ = ["ABLATIONS", "available", "run_ablation"]

ABLATIONS: dict[str, int] = {
    "abl_A_noconv": 1,
    "abl_B_nopromo": 2,
    "abl_C_nowgmma": 4,
    "abl_D_prodonly": 8,
    "abl_E_mmafeed": 3,
    "abl_F_nostore": 16,
    "abl_G_noffma": 32,
}


def _module():
    """`deepinfer.deep_gemm._C` when it has the ablation builds, else None."""
    mod = compiled_module()
    return mod if mod is not None and hasattr(mod, "w4a8_rs_ablate") else None


def available() -> bool:
    """True when `_C` was built with the ablation launchers (a DEEPINFER_DEVICE=cuda build of this tree)."""
    return _module() is not None


def run_ablation(
    name: str,
    values: torch.Tensor,
    sfa: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor,
    ctas: int = 0,
) -> torch.Tensor:
    """Launch ablation `name` (a key of ABLATIONS) on the operands of `m_grouped_fp8_fp4_gemm_nt_offsets_cuda`.

    values: e4m3 [m, k]; sfa: fp32 [m, k/128]; packed: uint8 [g, n, k/2]; scales: uint8 [g, n, k/32]; offs: int32
    [g] cumulative group ends; out: bf16 [m, n] (written with WRONG values). Returns `out`. Raises KeyError for an
    unknown name, RuntimeError without the compiled launchers, ValueError for operands the kernel cannot take.
    """
    if name not in ABLATIONS:
        raise KeyError(f"ablation: expected one of {', '.join(ABLATIONS)}, got {name!r}")
    mod = _module()
    if mod is None:
        raise RuntimeError("the W4A8 rs ablation builds are not compiled (build deep_gemm with DEEPINFER_DEVICE=cuda)")
    if not applies(values, sfa, packed, scales):
        raise ValueError(f"operands: expected CUDA tensors on an sm_90 device, aligned; got device {values.device}")
    m, k = values.shape
    g, n, _ = packed.shape
    with torch.cuda.device(values.device):
        stream = torch.cuda.current_stream(values.device).cuda_stream
        mod.w4a8_rs_ablate(
            ABLATIONS[name], values.data_ptr(), sfa.data_ptr(), packed.data_ptr(), scales.data_ptr(),
            offs.data_ptr(), out.data_ptr(), m, n, k, g, ctas, stream,
        )  # fmt: skip
    return out
