"""Compiled CUDA W4A8 M-grouped GEMM on the FP8 tensor cores (sm_90a wgmma): the compute-bound regime.

Kernel: `csrc/cuda/dg_w4a8_grouped.cuh` (built into `deepinfer.deep_gemm._C` by DEEPINFER_DEVICE=cuda builds; no
CUTLASS needed). Persistent CTAs walk (expert, n tile, m tile) tiles of 64 * wg token rows x 128 weight rows; each
128-deep k block: activations by cp.async into a 128-byte-swizzled ring, the packed e2m1 weights + E8M0 bytes
turned into e4m3 tiles in shared memory (code * 2^(6 - (s_max - s_j)) while s_max - s_j <= 11: exact and normal),
four m64n128k32 FP8 wgmmas into a temporary, promoted once per block with sfa * 2^(s_max - 133). Blocks whose scales
spread wider take an exact per-32 path (see the kernel header). Same operands and contract as
`triton_fp4_fp8_grouped.py`.

Variants (wg, stages, rel): `W4A8_CUDA_VARIANTS`; names 'cuda_wg2s4', 'cuda_wg2s4r', 'cuda_ws2s4' etc. (`variant_name`);
rel = 2 / 3: the warp-specialised kernel (`csrc/cuda/dg_w4a8_ws.cuh`, same numerics as rel = 0; 3: pipelined
consumers, 'cuda_wsp2s4'). rel = 4: the register-operand kernel (`csrc/cuda/dg_w4a8_rs.cuh`: the converted weights
are the wgmma's A operand from registers, never written to shared memory; 'cuda_rs2s4', 'cuda_rs2s6'; rel = 5: the same
kernel with 256-token tiles, 'cuda_rs2s4n256', 'cuda_rs2s3n256' (rel = 6-10, the folded / cheap-conversion /
fast-epilogue rs builds, were removed in session 9: 0.96-1.07x their twins; so were rel = 11-14, the chunk-pipelined
n64 builds 'cuda_rs2s4n256p' / 'pl' / 'pi' / 'pil': bit-equal to rel 5, 0.93-0.98x it). rel = 1: row-reference
scales (a pre-pass kernel writes each weight row's largest scale byte into a uint16 [g, n] workspace, allocated per
call; the main loop's promotion is then one FFMA per accumulator; see the kernel header).
"""

from __future__ import annotations

import functools

import torch

from ..._backend import compiled_module

__all__ = [
    "W4A8_CUDA_VARIANTS", "WS_VARIANTS", "RS_VARIANTS", "DEFAULT_VARIANT", "MAX_GROUPS", "available", "applies",
    "compiled_variants", "variant_name", "parse_variant", "m_grouped_fp8_fp4_gemm_nt_offsets_cuda",
]  # fmt: skip

# Keep in sync with kEntries in csrc/cuda/dg_w4a8_grouped.cu (a CPU test compares them).
# rel (the scheme): 0 absolute scales, 1 row-reference scales, 2 "ws" = the warp-specialised kernel
# (csrc/cuda/dg_w4a8_ws.cuh: a producer warpgroup loads and converts, two consumer warpgroups only wgmma and promote;
# absolute numerics, bit-equal to scheme 0 with wg = 2), 3 "wsp" = ws with pipelined consumers (each keeps two
# blocks' wgmmas in flight; setmaxnreg), also bit-equal. 4 "rs" = the weights as the wgmma's register operand
# (csrc/cuda/dg_w4a8_rs.cuh: D^T = W x X^T; same conversion, k32 order and promotion products as scheme 0, operand
# roles swapped: tested against float64, bit-equality with scheme 0 reported); 5 = rs with 256-token tiles; (6-10:
# folded / cheap-conversion / fast-epilogue rs builds, removed in session 9; 11-14: the chunk-pipelined n64 rs builds,
# removed in session 9).
W4A8_CUDA_VARIANTS: tuple[tuple[int, int, int], ...] = (
    (2, 4, 0), (2, 5, 0), (1, 4, 0), (2, 4, 1), (1, 4, 1), (2, 4, 2), (2, 3, 2), (2, 4, 3), (2, 4, 4), (2, 6, 4),
    (2, 4, 5), (2, 3, 5),
)  # fmt: skip
WS_VARIANTS: tuple[tuple[int, int, int], ...] = tuple(v for v in W4A8_CUDA_VARIANTS if v[2] in (2, 3))
RS_SCHEMES = (4, 5)
RS_VARIANTS: tuple[tuple[int, int, int], ...] = tuple(v for v in W4A8_CUDA_VARIANTS if v[2] in RS_SCHEMES)
SREF_SCHEMES = (1,)  # schemes that need the row-reference pre-pass's uint16 [g, n] workspace
DEFAULT_VARIANT = (2, 4, 0)
MAX_GROUPS = 4096  # the kernel keeps a per-group tile prefix in shared memory


def variant_name(variant: tuple[int, int, int]) -> str:
    """(2, 4, 0) -> 'cuda_wg2s4'; (2, 4, 1) -> 'cuda_wg2s4r'; (2, 4, 2) -> 'cuda_ws2s4' (warp-specialised);
    (2, 4, 3) -> 'cuda_wsp2s4' (warp-specialised, pipelined consumers); (2, 4, 4) -> 'cuda_rs2s4' (register-operand
    weights); (2, 4, 5) -> 'cuda_rs2s4n256' (register-operand weights, 256-token tiles)."""
    if variant[2] in RS_SCHEMES:
        return f"cuda_rs{variant[0]}s{variant[1]}{'n256' if variant[2] == 5 else ''}"
    if variant[2] >= 2:
        return f"cuda_ws{'p' if variant[2] == 3 else ''}{variant[0]}s{variant[1]}"
    return f"cuda_wg{variant[0]}s{variant[1]}{'r' if variant[2] else ''}"


def parse_variant(name: str) -> tuple[int, int, int]:
    """'cuda' -> DEFAULT_VARIANT; 'cuda_wg2s5' -> (2, 5, 0); ValueError for anything not in W4A8_CUDA_VARIANTS."""
    if name == "cuda":
        return DEFAULT_VARIANT
    for v in W4A8_CUDA_VARIANTS:
        if variant_name(v) == name:
            return v
    names = ", ".join(["cuda", *(variant_name(v) for v in W4A8_CUDA_VARIANTS)])
    raise ValueError(f"impl: expected one of {names}, got {name!r}")


def _module():
    """`deepinfer.deep_gemm._C` when it imports and has the W4A8 kernel, else None."""
    mod = compiled_module()
    return mod if mod is not None and hasattr(mod, "w4a8_cuda_grouped") else None


def available() -> bool:
    """True when `_C` has the W4A8 CUDA kernel (a DEEPINFER_DEVICE=cuda build of this source tree)."""
    return _module() is not None


@functools.cache
def compiled_variants() -> tuple[tuple[int, int, int], ...]:
    """(wg, stages, rel) of every variant `_C` was built with (empty without `_C`; cached: `_C` never changes)."""
    mod = _module()
    return () if mod is None else tuple(tuple(v) for v in mod.w4a8_cuda_variants())


@functools.cache
def _is_sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def applies(values: torch.Tensor, sfa: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> bool:
    """True when the kernel can take these (already validated) operands: `_C` has it, CUDA sm_90 device, values and
    packed 16-byte aligned, sfa and scales 4-byte aligned, 1 <= groups <= MAX_GROUPS."""
    if not (values.is_cuda and available() and _is_sm90(values.device.index or 0)):
        return False
    if not 1 <= packed.shape[0] <= MAX_GROUPS:
        return False
    return (
        values.data_ptr() % 16 == 0 and packed.data_ptr() % 16 == 0
        and sfa.data_ptr() % 4 == 0 and scales.data_ptr() % 4 == 0
    )  # fmt: skip


def m_grouped_fp8_fp4_gemm_nt_offsets_cuda(
    values: torch.Tensor,
    sfa: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor,
    variant: tuple[int, int, int] = DEFAULT_VARIANT,
    ctas: int = 0,
) -> torch.Tensor:
    """Launch the CUDA kernel on validated operands (see `api_w4a8.py`); returns `out`.

    values: e4m3 [m, k] contiguous; sfa: fp32 [m, k/128]; packed: int8/uint8 [g, n, k/2]; scales:
    float8_e8m0fnu/uint8 [g, n, k/32]; offs: int32 [g] cumulative group ends (read on the device only); out: bf16
    [m, n]. variant: (warpgroups, stages, rel) from W4A8_CUDA_VARIANTS; ctas: persistent CTAs (0: one full wave).
    Raises RuntimeError when `_C` lacks the kernel or the variant, ValueError when the operands do not fit it.
    """
    mod = _module()
    if mod is None:
        raise RuntimeError("the W4A8 CUDA kernel is not built (build deep_gemm with DEEPINFER_DEVICE=cuda)")
    if tuple(variant) not in compiled_variants():
        raise RuntimeError(f"variant {variant}: _C was built with {compiled_variants()} (rebuild the package)")
    if not applies(values, sfa, packed, scales):
        raise ValueError(
            "operands: expected CUDA tensors on an sm_90 device, values and packed 16-byte aligned, sfa and scales "
            f"4-byte aligned, 1..{MAX_GROUPS} groups; got device {values.device}, values at {values.data_ptr():#x}, "
            f"packed at {packed.data_ptr():#x}, sfa at {sfa.data_ptr():#x}, scales at {scales.data_ptr():#x}, "
            f"{packed.shape[0]} groups"
        )
    m, k = values.shape
    g, n, _ = packed.shape
    if m == 0 or n == 0:
        return out
    wg, stages, rel = variant
    # SREF_SCHEMES: the pre-pass's per-row reference exponents (uint16 [g, n]; torch allocations are 256-byte aligned)
    use_sref = rel in SREF_SCHEMES
    sref = torch.empty(g * n if use_sref else 0, dtype=torch.int16, device=values.device)
    with torch.cuda.device(values.device):
        stream = torch.cuda.current_stream(values.device).cuda_stream
        mod.w4a8_cuda_grouped(
            wg, stages, rel, values.data_ptr(), sfa.data_ptr(), packed.data_ptr(), scales.data_ptr(),
            offs.data_ptr(), out.data_ptr(), sref.data_ptr() if use_sref else 0, m, n, k, g, ctas, stream,
        )  # fmt: skip
    return out
