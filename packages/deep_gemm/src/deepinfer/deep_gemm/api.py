"""Public deep_gemm API: argument checks, output allocation, and the op contracts (DeepGEMM naming).

Conventions (DeepGEMM's): "nt" means D = C + A @ B^T with A row-major [m, k] and B given as [n, k]
(both K-major). `out` is written in place and also returned; when it is None a new tensor is allocated.
All operands must be contiguous and on one device. FP8 operands carry scale factors as a pair
`(values, scales)`; scales are float32 or torch.float8_e8m0fnu (DeepGEMM's packed-int32 UE8M0 layout is
not accepted). Weight operands come in two formats, told apart by dtype:

* FP8: float8_e4m3fn [n, k] with 128x128 block scales [ceil(n/128), ceil(k/128)];
* FP4: int8 [n, k/2], two e2m1 codes a byte (low nibble = element 2j), scales [n, k/32] (one per 32 inputs).

Activations are FP8 with 1x128 per-token scales [m, ceil(k/128)]. Every op accumulates in float32.
The MoE grouped GEMMs are in `api_moe.py` and re-exported here.
"""

from __future__ import annotations

import os

import torch

from . import reference as ref
from ._checks import (
    check_fp8_act,
    check_k,
    check_out,
    check_pair,
    check_same_device,
    check_tensor,
)
from ._checks import check_weight_scales as _check_weight
from ._dispatch import fp8_dense_impl, impl, use_triton
from .api_moe import (
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nt_masked,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_masked,
)
from .backends.cuda import cublas as _cublas

__all__ = [
    "bf16_gemm_nt",
    "fp8_gemm_nt",
    "fp8_fp4_gemm_nt",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked",
    "grouped_gemm_nt_bf16",
    "grouped_gemm_nt_fp8",
]

_FLOAT_IN = (torch.bfloat16, torch.float32)
_LOW_OUT = (torch.bfloat16, torch.float32)


def _cublas_ok(a: torch.Tensor, out: torch.Tensor, c: torch.Tensor | None) -> bool:
    """The cuBLAS bf16 path applies (CUDA, bf16 in and out, no C) unless the package is forced to reference."""
    return _cublas.applies(a, out, c) and os.environ.get("DEEPINFER_DEEP_GEMM_BACKEND", "auto") != "reference"


def _smallm_ok(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """The small-m Triton path applies (opted in, m <= 64 bf16 rows on CUDA, Triton importable)."""
    if os.environ.get("DEEPINFER_DEEP_GEMM_SMALLM", "0") != "1":  # off by default: skip the rest on every call
        return False
    if not (a.is_cuda and a.shape[0] <= 64 and use_triton(a.device)):
        return False
    from .backends.cuda.triton_bf16_smallm import applies

    return applies(a, b, out)


def _check_float_operands(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must share a dtype (bf16 or float32), got a {a.dtype} and b {b.dtype}")


def bf16_gemm_nt(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, c: torch.Tensor | None = None
) -> torch.Tensor:
    """D = C + A @ B^T in float32 accumulation.

    a: [m, k] bfloat16 or float32, row-major. b: [n, k], same dtype as a. c: optional [m, n] float32 or
    bfloat16 accumulator (may alias out). out: optional [m, n]; bfloat16 or float32 for bf16 inputs,
    float32 for float32 inputs. When out is None it is allocated with a's dtype: bf16 in -> bf16 out,
    float32 in -> float32 out (the engine's exact / oracle path uses float32 end to end).
    Returns out [m, n].
    """
    check_tensor("a", a, _FLOAT_IN, [None, None])
    check_tensor("b", b, _FLOAT_IN, [None, None])
    _check_float_operands(a, b)
    (m, k), (n, kb) = a.shape, b.shape
    check_k("a", k, "b", kb)
    if c is not None:
        check_tensor("c", c, _FLOAT_IN, [m, n])
    check_same_device(a=a, b=b, c=c)
    out_dtypes = _LOW_OUT if a.dtype == torch.bfloat16 else (torch.float32,)
    out = check_out(out, (m, n), out_dtypes, a)
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if _cublas_ok(a, out, c):
        if _smallm_ok(a, b, out):  # decode rows: a weight stream, split-K Triton beats cuBLAS's tiles
            from .backends.cuda.triton_bf16_smallm import bf16_gemm_nt_smallm

            return bf16_gemm_nt_smallm(a, b, out)
        return _cublas.bf16_gemm_nt(a, b, out)
    return impl("bf16_gemm_nt", a.device, ref.bf16_gemm_nt)(a, b, out, c)


def fp8_gemm_nt(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor | None = None,
    c: torch.Tensor | None = None,
) -> torch.Tensor:
    """D = C + dequant(A) @ dequant(B)^T with float32 accumulation (DeepGEMM `fp8_gemm_nt` / `fp8_fp4_gemm_nt`).

    Backend: the Triton block-scaled FP8 kernel (`backends/cuda/triton_fp8_gemm.py`, DeepGEMM-style promotion
    every 128 k) on CUDA for FP8 weights with k % 16 == 0; the reference for FP4 weights, other k, CPU, or
    DEEPINFER_DEEP_GEMM_BACKEND=reference. The CUTLASS SM90 kernel (`backends/cuda/cutlass_fp8.py`, when `_C` was
    built with it) takes the calls it fits (bf16 out, bf16 or no C, k % 128 == 0, n % 8 == 0) where
    `cutlass_fp8.auto_config` says it is faster (m > 16; see there), or all of them with
    DEEPINFER_DEEP_GEMM_FP8_DENSE=cutlass (=triton: never). Before both, the compiled 128 x 256 tile kernel
    (`backends/cuda/cuda_fp8_db.py`, fp8_wide_t4: float32 scales, no C, n % 256 == 0) takes the shapes
    `cuda_fp8_db.wide_rule` names (m >= 4096 with short k), or every call it fits with =wide. Never syncs with the
    host on the Triton, CUTLASS or fp8_wide paths.

    a: (float8_e4m3fn [m, k], scales float32 | float8_e8m0fnu [m, ceil(k/128)]) — per-token 1x128 scales.
    b: (float8_e4m3fn [n, k], scales [ceil(n/128), ceil(k/128)]) — 128x128 block scales; or
       (int8 [n, k/2] packed e2m1, scales [n, k/32]) — FP4 weights (K % 32 == 0).
    out: optional bfloat16 (default) or float32 [m, n]. c: optional float32 or bfloat16 [m, n] (may alias out).
    Returns out [m, n].
    """
    a_val, sfa = check_fp8_act("a", a, ())
    b_val, sfb = check_pair("b", b)
    k = _check_weight("b", b_val, sfb, ())
    m, n = a_val.shape[0], b_val.shape[0]
    check_k("a", a_val.shape[1], "b", k)
    if c is not None:
        check_tensor("c", c, _FLOAT_IN, [m, n])
    check_same_device(a=a_val, sfa=sfa, b=b_val, sfb=sfb, c=c)
    out = check_out(out, (m, n), _LOW_OUT, a_val)
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=a_val.device)
    if m == 0 or n == 0:  # nothing to compute (a CUDA graph capture must not see an empty launch either)
        return out
    choice = fp8_dense_impl(a_val.device) if a_val.is_cuda else None  # read once for both compiled paths
    if _fp8_wide_ok(choice, a_val, sfa, b_val, sfb, out, c):
        from .backends.cuda.cuda_fp8_db import fp8_gemm_nt_db

        return fp8_gemm_nt_db(a_val, sfa, b_val, sfb, out, wide=True)
    cutlass_cfg = _fp8_cutlass_config(choice, a_val, b_val, out, c)
    if cutlass_cfg is not None:
        from .backends.cuda.cutlass_fp8 import fp8_gemm_nt_cutlass

        return fp8_gemm_nt_cutlass(a_val, sfa, b_val, sfb, out, c, config=cutlass_cfg)
    if _fp8_triton_ok(a_val, b_val):
        from .backends.cuda.triton_fp8_gemm import fp8_gemm_nt_triton

        return fp8_gemm_nt_triton(a_val, sfa, b_val, sfb, out, c)
    return ref.fp8_gemm_nt(a_val, sfa, b_val, sfb, out, c)


def _fp8_wide_ok(
    choice: str | None,
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    out: torch.Tensor,
    c: torch.Tensor | None,
) -> bool:
    """The compiled fp8_wide kernel (128 x 256 tiles) takes this call: CUDA (choice = `fp8_dense_impl`, None off
    CUDA), chosen (DEEPINFER_DEEP_GEMM_FP8_DENSE "wide": every call it fits; "auto": where `cuda_fp8_db.wide_rule`
    says), and the operands fit it as they are."""
    if choice not in ("per_shape", "wide"):
        return False
    from .backends.cuda import cuda_fp8_db

    (m, k), n = a.shape, b.shape[0]
    if choice == "per_shape" and not cuda_fp8_db.wide_rule(m, n, k):
        return False
    return cuda_fp8_db.wide_applies(a, sfa, b, sfb, out, c)


def _fp8_cutlass_config(
    choice: str | None, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, c: torch.Tensor | None
) -> int | None:
    """The CUTLASS config this call runs, or None (Triton / reference): CUDA (choice = `fp8_dense_impl`, None off
    CUDA), chosen (DEEPINFER_DEEP_GEMM_FP8_DENSE: "cutlass" always, "auto" per shape by `cutlass_fp8.auto_config`),
    built, and the operands fit it (bf16 out, bf16 or no C, k % 128, n % 8)."""
    if choice is None or choice == "triton":
        return None
    from .backends.cuda import cutlass_fp8

    if not cutlass_fp8.applies(a, b, out, c):
        return None
    (m, k), n = a.shape, b.shape[0]
    per_shape = choice in ("per_shape", "wide")  # "wide": the calls fp8_wide cannot take dispatch as auto
    cfg = cutlass_fp8.auto_config(m, n, k) if per_shape else cutlass_fp8.default_config(m, n, k)
    return cfg if cfg is not None and cfg < cutlass_fp8.built_configs() else None


def _fp8_triton_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The Triton block-scaled FP8 GEMM covers this call: FP8 (not FP4) weights, k % 16 == 0, Triton chosen.

    Operands are contiguous (checked above), so the kernel's unit-stride requirements hold; scale dtypes and
    shapes are the ones `check_fp8_act` / `check_weight_scales` accept. Everything else runs the reference.
    """
    return b.dtype == torch.float8_e4m3fn and a.shape[1] % 16 == 0 and use_triton(a.device)


# DeepGEMM exposes one function under both names; the weight format is told apart by b's dtype.
fp8_fp4_gemm_nt = fp8_gemm_nt


def grouped_gemm_nt_bf16(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Per-group D[:, g] = A[:, g] @ B[g]^T: V4 attention's grouped output projection (wo_a).

    a: [t, g, k] bfloat16 or float32 (V4-Flash: [tokens, 8, 4096], group g = heads 8g..8g+7 flattened).
    b: [g, n, k], same dtype as a (V4-Flash: wo_a viewed as [8, 1024, 4096]).
    out: optional [t, g, n]; dtype rules as in `bf16_gemm_nt` (default: a's dtype). Returns out.
    """
    check_tensor("a", a, _FLOAT_IN, [None, None, None])
    t, g, k = a.shape
    check_tensor("b", b, _FLOAT_IN, [g, None, None])
    _check_float_operands(a, b)
    check_k("a", k, "b", b.shape[2])
    n = b.shape[1]
    check_same_device(a=a, b=b)
    out_dtypes = _LOW_OUT if a.dtype == torch.bfloat16 else (torch.float32,)
    out = check_out(out, (t, g, n), out_dtypes, a)
    if out is None:
        out = torch.empty((t, g, n), dtype=a.dtype, device=a.device)
    if _cublas_ok(a, out, None):
        if _smallm_ok(a, b, out):
            from .backends.cuda.triton_bf16_smallm import bf16_gemm_nt_smallm

            return bf16_gemm_nt_smallm(a, b, out)
        return _cublas.grouped_gemm_nt_bf16(a, b, out)
    return impl("grouped_gemm_nt_bf16", a.device, ref.grouped_gemm_nt_bf16)(a, b, out)


def grouped_gemm_nt_fp8(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 form of `grouped_gemm_nt_bf16`: D[:, g] = dequant(A[:, g]) @ dequant(B[g])^T.

    a: (float8_e4m3fn [t, g, k], scales [t, g, ceil(k/128)]) — per-token 1x128 scales.
    b: (float8_e4m3fn [g, n, k], scales [g, ceil(n/128), ceil(k/128)]) — 128x128 block scales per group
       (wo_a as stored: rows 1024g..1024g+1023 of [8192, 4096] are group g, so a view [8, 1024, 4096]
       with scales viewed [8, 8, 32] fits), or packed FP4 (int8 [g, n, k/2], scales [g, n, k/32]).
    out: optional bfloat16 (default) or float32 [t, g, n]. Returns out.
    """
    a_val, sfa = check_fp8_act("a", a, (None,))
    t, g, k = a_val.shape
    b_val, sfb = check_pair("b", b)
    kb = _check_weight("b", b_val, sfb, (g,))
    check_k("a", k, "b", kb)
    n = b_val.shape[1]
    check_same_device(a=a_val, sfa=sfa, b=b_val, sfb=sfb)
    out = check_out(out, (t, g, n), _LOW_OUT, a_val)
    if out is None:
        out = torch.empty((t, g, n), dtype=torch.bfloat16, device=a_val.device)
    return ref.grouped_gemm_nt_fp8(a_val, sfa, b_val, sfb, out)


from .api_w4a16 import *  # noqa: E402,F401,F403  (bf16 x FP4-weight grouped GEMM)
from .api_w4a16 import __all__ as _w4a16_all  # noqa: E402

__all__ += list(_w4a16_all)

from .api_w4a8 import *  # noqa: E402,F401,F403  (FP8 x FP4-weight grouped GEMM, the issue's W4A8 format)
from .api_w4a8 import __all__ as _w4a8_all  # noqa: E402

__all__ += list(_w4a8_all)
