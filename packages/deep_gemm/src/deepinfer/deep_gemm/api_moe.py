"""M-grouped GEMMs for MoE experts: contiguous (prefill, DeepEP normal dispatch) and masked (decode, DeepEP
low-latency dispatch) layouts. Re-exported by `api.py`; conventions are described there.

Weights of all groups come as one tensor: FP8 float8_e4m3fn [g, n, k] with scales [g, ceil(n/128),
ceil(k/128)], or FP4 int8 [g, n, k/2] (packed e2m1, low nibble first) with scales [g, n, k/32]. The
`*_fp8_fp4_*` names are aliases (as in DeepGEMM): the weight format is told apart by dtype.
"""

from __future__ import annotations

import torch

from . import reference as ref
from ._checks import check_fp8_act, check_k, check_out, check_pair, check_same_device, check_tensor
from ._checks import check_weight_scales as _check_weight
from ._dispatch import fp8_grouped_impl

__all__ = [
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked",
]

_OUT = (torch.bfloat16, torch.float32)


def m_grouped_fp8_gemm_nt_contiguous(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor | None,
    m_indices: torch.Tensor,
) -> torch.Tensor:
    """Contiguous-layout grouped GEMM: out[i] = dequant(a[i]) @ dequant(b[m_indices[i]])^T.

    a: (float8_e4m3fn [M, k], scales float32 | float8_e8m0fnu [M, ceil(k/128)]); each expert's rows
       contiguous (DeepGEMM / DeepEP's layout, padding rows between experts). The reference and Triton paths
       take any order; the CUDA default for large experts (CUTLASS) writes NaN into the rows of an expert whose
       rows are not contiguous.
    b: (weights [g, n, k] FP8 or [g, n, k/2] packed FP4, scales) — see the module docstring.
    out: bfloat16 (allocated when None) or float32 [M, n].
    m_indices: int32 [M], the group (expert) of each row; -1 marks a padding row, whose out row is set to
       ZERO (a deterministic value, so a later reduction over padded rows cannot pick up stale data).
       Reference path (CPU, FP4 weights, DEEPINFER_DEEP_GEMM_BACKEND=reference): ids outside [-1, g-1] raise
       ValueError before anything is written. CUDA fast paths never sync with the host, so they do not
       validate ids: ids >= g are zeroed like padding.
    CUDA: FP8 weights run CUTLASS (bf16 out, k % 128 == 0, n % 8 == 0) or Triton, chosen by rows per expert
    (M / g; `_dispatch.fp8_grouped_impl`, env DEEPINFER_DEEP_GEMM_FP8_GROUPED=auto|cutlass|triton|reference).
    Returns out [M, n].
    """
    a_val, sfa = check_fp8_act("a", a, ())
    b_val, sfb = check_pair("b", b)
    k = _check_weight("b", b_val, sfb, (None,))
    check_k("a", a_val.shape[1], "b", k)
    m, n = a_val.shape[0], b_val.shape[1]
    check_tensor("m_indices", m_indices, (torch.int32,), [m])
    check_same_device(a=a_val, sfa=sfa, b=b_val, sfb=sfb, m_indices=m_indices)
    out = check_out(out, (m, n), _OUT, a_val)
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=a_val.device)
    if m == 0 or n == 0:  # nothing to compute (and no empty launch inside a graph capture)
        return out
    rows_per_group = max(m // max(b_val.shape[0], 1), 1)  # a tiling hint only (padding rows included)
    path = _fast_path(a_val, sfa, b_val, sfb, out, m_indices, rows_per_group)
    if path == "cutlass":
        from .backends.cuda.cutlass_fp8_grouped import m_grouped_fp8_gemm_nt_contiguous_cutlass

        return m_grouped_fp8_gemm_nt_contiguous_cutlass(a_val, sfa, b_val, sfb, out, m_indices)
    if path == "triton":
        from .backends.cuda.triton_fp8_grouped import m_grouped_fp8_contiguous_triton

        return m_grouped_fp8_contiguous_triton(a_val, sfa, b_val, sfb, out, m_indices, expected_m=rows_per_group)
    return ref.m_grouped_fp8_gemm_nt_contiguous(a_val, sfa, b_val, sfb, out, m_indices)


def m_grouped_fp8_gemm_nt_masked(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor | None,
    masked_m: torch.Tensor,
    expected_m: int,
) -> torch.Tensor:
    """Masked-layout grouped GEMM: out[g, i] = dequant(a[g, i]) @ dequant(b[g])^T for i < masked_m[g].

    a: (float8_e4m3fn [g, m_max, k], scales [g, m_max, ceil(k/128)]) — e.g. DeepEP low-latency recv_x.
    b: (weights [g, n, k] FP8 or [g, n, k/2] packed FP4, scales) — see the module docstring.
    out: bfloat16 or float32 [g, m_max, n]. Rows i >= masked_m[g] are NOT computed and NOT written: they
       keep what out held before the call (a new out, allocated when None, is zero-filled so they read 0).
    masked_m: int32 [g], valid rows per group, each in [0, m_max] (checked on the reference path, ValueError
       otherwise; CUDA fast paths never sync with the host: they clamp counts to [0, m_max] instead).
    expected_m: int >= 0, a hint of the typical masked_m used by fast paths to pick the kernel and tiles
       (0: m_max); the result does not depend on it.
    CUDA: FP8 weights run CUTLASS or Triton as in the contiguous form (rows per expert = expected_m).
    Returns out [g, m_max, n].
    """
    a_val, sfa = check_fp8_act("a", a, (None,))
    g, m_max, k_a = a_val.shape
    b_val, sfb = check_pair("b", b)
    k = _check_weight("b", b_val, sfb, (g,))
    check_k("a", k_a, "b", k)
    n = b_val.shape[1]
    check_tensor("masked_m", masked_m, (torch.int32,), [g])
    if not isinstance(expected_m, int) or isinstance(expected_m, bool):
        raise TypeError(f"expected_m: expected an int, got {type(expected_m).__name__}")
    if expected_m < 0:
        raise ValueError(f"expected_m: expected a non-negative hint, got {expected_m}")
    check_same_device(a=a_val, sfa=sfa, b=b_val, sfb=sfb, masked_m=masked_m)
    out = check_out(out, (g, m_max, n), _OUT, a_val)
    if out is None:
        out = torch.zeros((g, m_max, n), dtype=torch.bfloat16, device=a_val.device)
    if g == 0 or m_max == 0 or n == 0:
        return out
    path = _fast_path(a_val, sfa, b_val, sfb, out, masked_m, expected_m or m_max)
    if path == "cutlass":
        from .backends.cuda.cutlass_fp8_grouped import m_grouped_fp8_gemm_nt_masked_cutlass

        return m_grouped_fp8_gemm_nt_masked_cutlass(a_val, sfa, b_val, sfb, out, masked_m, expected_m)
    if path == "triton":
        from .backends.cuda.triton_fp8_grouped import m_grouped_fp8_masked_triton

        return m_grouped_fp8_masked_triton(a_val, sfa, b_val, sfb, out, masked_m, expected_m or m_max)
    return ref.m_grouped_fp8_gemm_nt_masked(a_val, sfa, b_val, sfb, out, masked_m)


def _fast_path(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, ids: torch.Tensor,
    rows_per_group: int,
) -> str:  # fmt: skip
    """Which path a grouped call runs: "cutlass", "triton" or "reference".

    ids: m_indices [M] (contiguous) or masked_m [g] (masked); rows_per_group: the tiling hint.

    Fast paths take FP8 (not FP4) weights with k % 16 == 0 (Triton) or k % 128 == 0, n % 8 == 0, bf16 out and
    16-byte aligned operands (CUTLASS); which one runs: `_dispatch.fp8_grouped_impl` (env
    DEEPINFER_DEEP_GEMM_FP8_GROUPED, rows per expert). Off CUDA only the Triton interpreter can run
    (DEEPINFER_DEEP_GEMM_BACKEND=triton); the reference (which validates ids / counts) otherwise.
    """
    if b.dtype != torch.float8_e4m3fn or a.shape[-1] % 16:
        return "reference"
    return fp8_grouped_impl(a.device, rows_per_group, a.is_cuda and _cutlass_fits(a, sfa, b, sfb, out, ids))


def _cutlass_fits(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, ids: torch.Tensor
) -> bool:
    """The CUTLASS grouped kernel is built and takes these operands (its own checks, as a yes / no)."""
    from .backends.cuda import cutlass_fp8_grouped as cg

    if not cg.available():
        return False
    check = cg.check_masked_args if a.dim() == 3 else cg.check_grouped_args
    try:
        check(a, sfa, b, sfb, out, ids)
    except (TypeError, ValueError):
        return False
    return True


# DeepGEMM aliases: one implementation serves FP8 and FP4 weights (told apart by b's dtype).
m_grouped_fp8_fp4_gemm_nt_contiguous = m_grouped_fp8_gemm_nt_contiguous
m_grouped_fp8_fp4_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked
