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

    a: (float8_e4m3fn [M, k], scales float32 | float8_e8m0fnu [M, ceil(k/128)]); rows of one expert are
       usually contiguous and padded, but any order works.
    b: (weights [g, n, k] FP8 or [g, n, k/2] packed FP4, scales) — see the module docstring.
    out: bfloat16 (allocated when None) or float32 [M, n].
    m_indices: int32 [M], the group (expert) of each row; -1 marks a padding row, whose out row is set to
       ZERO (a deterministic value, so a later reduction over padded rows cannot pick up stale data).
       Ids outside [-1, g-1] raise ValueError before anything is written.
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
    masked_m: int32 [g], valid rows per group, each in [0, m_max] (checked; ValueError otherwise).
    expected_m: int >= 0, a hint of the typical masked_m used by fast paths to pick tiles; the result
       does not depend on it.
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
    return ref.m_grouped_fp8_gemm_nt_masked(a_val, sfa, b_val, sfb, out, masked_m)


# DeepGEMM aliases: one implementation serves FP8 and FP4 weights (told apart by b's dtype).
m_grouped_fp8_fp4_gemm_nt_contiguous = m_grouped_fp8_gemm_nt_contiguous
m_grouped_fp8_fp4_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked
