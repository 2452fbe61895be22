"""Compiled CUDA W4A16 M-grouped GEMMs ("kernel 4" and its persistent variant "kernel 5" of `W4A16Config`): the
memory-bound regime (kernel 4: <= 64 rows per group; kernel 5, the API's default up to 16: 8 / 16-token blocks).

Kernel: `csrc/cuda/dg_fp4_grouped.cuh` (built into `deepinfer.deep_gemm._C` by DEEPINFER_DEVICE=cuda builds; no
CUTLASS needed). Swap-AB mma.sync.m16n8k16 bf16 GEMV-GEMM in the style of Marlin: one CTA per (expert, block_n
output features) streams that slab of packed e2m1 weights, their E8M0 scales and the expert's activation rows
through a multi-stage cp.async pipeline (the scales ride in the same pipeline as the weights), dequantises in
registers (exact for scale bytes 0..254) and accumulates in fp32. Tokens per expert come from `offs` on the device:
experts with no rows exit at once, and the launcher never syncs with the host (CUDA-graph safe). No weight
re-layout is needed: each lane reads whole 16-byte chunks of its weight rows (the MMA's k order is permuted to
match, see the kernel's header comment).

Same operands and contract as `triton_fp4_grouped.py`. Requirements checked by `applies`: CUDA tensors on an sm_90
device, a 16-byte aligned `a` and packed weights, 4-byte aligned scales, `_C` built with the kernel.
"""

from __future__ import annotations

import functools

import torch

from ..._backend import compiled_module
from .w4a16_configs import CUDA_P_VARIANTS, CUDA_VARIANTS, W4A16Config, cuda_p_variant, cuda_variant

__all__ = [
    "available", "applies", "compiled_variants", "m_grouped_bf16_fp4_gemm_nt_contiguous_cuda",
    "available_p", "compiled_p_variants", "m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_p",
]  # fmt: skip


def _module():
    """`deepinfer.deep_gemm._C` when it imports and has the FP4 kernels, else None."""
    mod = compiled_module()
    return mod if mod is not None and hasattr(mod, "fp4_w4a16_grouped") else None


def available() -> bool:
    """True when `_C` has the W4A16 CUDA kernel (a DEEPINFER_DEVICE=cuda build of this source tree)."""
    return _module() is not None


def compiled_variants() -> tuple[tuple[int, int, int, int], ...]:
    """(tn, warps, rt, stages) of every variant `_C` was built with (empty without `_C`)."""
    mod = _module()
    return () if mod is None else tuple(tuple(v) for v in mod.fp4_w4a16_variants())


@functools.cache
def _is_sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def applies(a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> bool:
    """True when the CUDA kernel can take these (already validated) operands: `_C` has it, CUDA sm_90 device, a
    and packed 16-byte aligned, scales 4-byte aligned."""
    if not (a.is_cuda and available() and _is_sm90(a.device.index or 0)):
        return False
    return a.data_ptr() % 16 == 0 and packed.data_ptr() % 16 == 0 and scales.data_ptr() % 4 == 0


def _check_launchable(
    config: W4A16Config,
    variant: tuple[int, ...],
    compiled: tuple[tuple[int, ...], ...] | None,
    missing: str,
    a: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    extra_ok: bool = True,
) -> None:
    """Shared by the kernel-4 and kernel-5 wrappers, after their own config check: RuntimeError(`missing`) when `_C`
    lacks the kernel (`compiled` None; else the variants it was built with), RuntimeError when `variant` is not
    among them, ValueError when the operands do not fit the kernel (`applies` and the caller's `extra_ok`)."""
    if compiled is None:
        raise RuntimeError(missing)
    if variant not in compiled:
        raise RuntimeError(f"config {config.name!r}: _C was built without this variant (rebuild the package)")
    if not (applies(a, packed, scales) and extra_ok):
        raise ValueError(
            "operands: expected CUDA tensors on an sm_90 device with a and packed 16-byte aligned and scales 4-byte "
            f"aligned, got device {a.device}, a at {a.data_ptr():#x}, packed at {packed.data_ptr():#x}, scales at "
            f"{scales.data_ptr():#x}"
        )


def _launch(fn, variant: tuple[int, ...], a, packed, scales, offs, out: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """`fn` (a `_C` launcher) on the current stream of a's device with the variant's template values, then the
    operands' pointers and sizes (m, n, k, g); nothing to launch when m, n or g is 0. Returns `out`."""
    m, k = a.shape
    g, n, _ = packed.shape
    if m == 0 or n == 0 or g == 0:
        return out
    with torch.cuda.device(a.device):
        stream = torch.cuda.current_stream(a.device).cuda_stream
        fn(
            *variant, a.data_ptr(), packed.data_ptr(), scales.data_ptr(), offs.data_ptr(), out.data_ptr(),
            m, n, k, g, stream,
        )  # fmt: skip
    return out


def m_grouped_bf16_fp4_gemm_nt_contiguous_cuda(
    a: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor,
    config: W4A16Config,
) -> torch.Tensor:
    """Launch the CUDA kernel on validated operands (see `api_w4a16.py`); returns `out`.

    a: bf16 [m, k] contiguous, 16-byte aligned; packed: int8/uint8 [g, n, k/2] (low nibble = even column),
    16-byte aligned; scales: float8_e8m0fnu/uint8 [g, n, k/32], 4-byte aligned; offs: int32 [g] cumulative group
    ends (read on the device only); out: bf16 [m, n] contiguous. config: a kernel-4 `W4A16Config` (block_m =
    tokens per block, block_n = rows per CTA). Raises RuntimeError when `_C` lacks the kernel or the variant,
    ValueError when the operands do not fit it (alignment, device).
    """
    variant = cuda_variant(config) if config.kernel == 4 else None
    if variant not in CUDA_VARIANTS:
        raise ValueError(f"config: expected a kernel-4 config of CUDA_VARIANTS, got {config.name!r}")
    mod = _module()
    missing = "deep_gemm._C was not built with the FP4 CUDA kernels (build with DEEPINFER_DEVICE=cuda)"
    _check_launchable(config, variant, compiled_variants() if mod is not None else None, missing, a, packed, scales)
    return _launch(mod.fp4_w4a16_grouped, variant, a, packed, scales, offs, out)


# ---- kernel 5: the persistent variant (csrc/cuda/dg_fp4_persistent.cuh); GPU-run in session 5 and since then the
# API's default up to CUDA_MAX_ROWS rows per group (api_w4a16._cuda_choice, w4a16_configs.CUDA_P_BY_TN).


def available_p() -> bool:
    """True when `_C` has the persistent W4A16 kernel (kernel 5)."""
    mod = _module()
    return mod is not None and hasattr(mod, "fp4_w4a16_p_grouped")


def compiled_p_variants() -> tuple[tuple[int, int, int, int, int], ...]:
    """(kt, tn, warps, rt, stages) of every persistent variant `_C` was built with (empty without it)."""
    return tuple(tuple(v) for v in _module().fp4_w4a16_p_variants()) if available_p() else ()


def _check_p_operands(a, packed, scales, offs, out) -> None:
    """Shapes, dtypes and layout of a direct kernel-5 call (the API validates its own calls)."""
    if a.dtype != torch.bfloat16 or a.dim() != 2 or not a.is_contiguous():
        raise ValueError(f"a: expected a contiguous bf16 [m, k] tensor, got {a.dtype} {tuple(a.shape)}")
    m, k = a.shape
    if k % 128:
        raise ValueError(f"a: expected k % 128 == 0, got k = {k}")
    if packed.dim() != 3 or packed.shape[2] * 2 != k or packed.element_size() != 1 or not packed.is_contiguous():
        raise ValueError(f"packed: expected a contiguous 1-byte [g, n, {k // 2}] tensor, got {tuple(packed.shape)}")
    g, n, _ = packed.shape
    if tuple(scales.shape) != (g, n, k // 32) or scales.element_size() != 1 or not scales.is_contiguous():
        raise ValueError(f"scales: expected a contiguous 1-byte [{g}, {n}, {k // 32}] tensor, got "
                         f"{tuple(scales.shape)}")  # fmt: skip
    if offs.dtype != torch.int32 or tuple(offs.shape) != (g,) or not offs.is_contiguous():
        raise ValueError(f"offs: expected a contiguous int32 [{g}] tensor, got {offs.dtype} {tuple(offs.shape)}")
    if out is not None and (out.dtype != torch.bfloat16 or tuple(out.shape) != (m, n) or not out.is_contiguous()):
        raise ValueError(f"out: expected a contiguous bf16 [{m}, {n}] tensor, got {out.dtype} {tuple(out.shape)}")


def m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_p(
    a: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor | None,
    config: W4A16Config,
) -> torch.Tensor:
    """The persistent kernel 5 on the operands of `m_grouped_bf16_fp4_gemm_nt_contiguous_cuda` (same contract:
    a bf16 [m, k], packed [g, n, k/2], scales [g, n, k/32] E8M0 bytes, offs int32 [g] cumulative ends read on the
    device, out bf16 [m, n] or None to allocate; rows past offs[-1] are not written). config: a kernel-5
    `W4A16Config` (block_k = k per stage, 256 or 512). Raises ValueError for bad operands or config, RuntimeError
    when `_C` lacks the kernel or the variant."""
    missing = "deep_gemm._C lacks the persistent FP4 kernel (build with DEEPINFER_DEVICE=cuda)"
    variant = cuda_p_variant(config) if config.kernel == 5 else None
    if variant not in CUDA_P_VARIANTS:
        raise ValueError(f"config: expected a kernel-5 config of CUDA_P_VARIANTS, got {config.name!r}")
    _check_p_operands(a, packed, scales, offs, out)
    if out is None:
        out = torch.empty((a.shape[0], packed.shape[1]), dtype=torch.bfloat16, device=a.device)
    compiled = compiled_p_variants() if available_p() else None
    extra_ok = offs.is_cuda and out.is_cuda and out.data_ptr() % 2 == 0
    _check_launchable(config, variant, compiled, missing, a, packed, scales, extra_ok)
    return _launch(_module().fp4_w4a16_p_grouped, variant, a, packed, scales, offs, out)
