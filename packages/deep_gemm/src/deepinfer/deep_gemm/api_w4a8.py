"""Public M-grouped GEMM with FP8 (e4m3) activations and FP4 (e2m1) weights, contiguous layout ("W4A8" experts).

The issue's FP4-expert format: FP8 activations with per-128 fp32 scales, FP4 weights with per-32 E8M0 scales,
converted to FP8 in registers and multiplied on the FP8 tensor cores (`backends/cuda/triton_fp4_fp8_grouped.py`).
Not wired into the engine (FP8 activations change the numerics vs the bf16-activation W4A16 path).

Dispatch as `api_w4a16.py`: CUDA tensors -> Triton unless DEEPINFER_DEEP_GEMM_BACKEND=reference; CPU tensors ->
the PyTorch reference unless DEEPINFER_DEEP_GEMM_BACKEND=triton (needs TRITON_INTERPRET=1).

Compiled kernel (`backends/cuda/cuda_w4a8_grouped.py`, FP8 wgmma, the compute-bound path): the default ("auto" =
DEFAULT_IMPL "rows") runs it from CUDA_MIN_ROWS rows per group (cuda_wg1s4; from RS_MIN_ROWS the register-operand
cuda_rs2s4n256, bit-equal to cuda_wg2s4), Triton below; `impl="cuda"` (or a variant name such as "cuda_wg2s5" /
"cuda_wg2s4r"), or env DEEPINFER_DG_W4A8_IMPL=cuda|cuda_wg..|triton, forces a choice. It runs on CUDA tensors when
`_C` has it and the operands fit (else the Triton path).

Prepared weights (session 13): `prepare_w4a8_wide(packed, scales)` once per weight gives a `W4A8WideWeights`; passed
as `b`, the call runs the W4A8 wide kernel (`backends/cuda/cuda_w4a8_wide.py`: the FP8 128 x 256 tile kernel's
consumers, FP4 -> e4m3 conversion in the producer warpgroup) from WIDE_MIN_ROWS rows per group when the weight is
`lossless` (else, and on every other path, the object's original (packed, scales) run as above). impl="wide" (or
the env) forces it whenever it applies.
"""

from __future__ import annotations

import os

import torch

from . import reference_w4a8 as ref
from ._checks import check_pair, check_same_device, check_tensor
from ._dispatch import use_triton
from .backends.cuda.w4a8_configs import W4A8Config
from .backends.cuda.w4a8_wide_pack import W4A8WideWeights, prepare_w4a8_wide
from .backends.cuda.w4a16_configs import rows_per_group

__all__ = ["m_grouped_fp8_fp4_gemm_nt_offsets", "prepare_w4a8_wide", "W4A8WideWeights", "IMPL_ENV", "DEFAULT_IMPL"]

IMPL_ENV = "DEEPINFER_DG_W4A8_IMPL"
# What "auto" runs on CUDA: "rows" = by rows per group (`_auto_variant`): the FP8-wgmma kernel from CUDA_MIN_ROWS rows
# per group, Triton below. Session 6 run 2 (H200, benchmarks/results/2026-11-30-s6-bench-deep_gemm-w4a8.json; 52 GPU
# tests passed): cuda_wg1s4 1.70-2.90x the Triton default at 64 rows / group, cuda_wg2s4 2.03-2.07x at 256 / 1,024
# (cuda_wg1s4 wins at 64, wg2s4 from 256); fewer rows per group were not measured, so they keep Triton. Session 8
# (H200, benchmarks/results/2026-11-30-s8-bench-dg_w4a8_rs.json; 110 + 151 GPU tests passed): cuda_rs2s4n256 (weights
# as the wgmma register operand, 256-token tiles) is bit-equal to cuda_wg2s4 and 1.62-1.67x it at 256 / 1,024 rows
# per group, but 0.93x at 64 (half-empty 256-token tiles), where cuda_wg1s4 stays; 65-255 rows were not measured.
DEFAULT_IMPL = "rows"
CUDA_MIN_ROWS = 64
RS_MIN_ROWS = 256
WIDE_MIN_ROWS = 64  # prepared weights: the wide kernel from here (session 13, H200: 2.4x cuda_rs2s4n256 at 64)

_PACKED = (torch.int8, torch.uint8)
_E8M0 = (torch.float8_e8m0fnu, torch.uint8)


def m_grouped_fp8_fp4_gemm_nt_offsets(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor] | W4A8WideWeights,
    offs: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    expected_m: int | None = None,
    config: W4A8Config | None = None,
    impl: str | None = None,
) -> torch.Tensor:
    """Grouped GEMM: out[r] = (a[0][r] * a[1][r]) @ W_i^T for the rows r of group i, W_i = dequant(b[i]) [n, k].

    a: (values, scales). values: float8_e4m3fn [m, k], contiguous, rows sorted by group; scales: float32
       [m, k/128] contiguous, one per row and 128 inputs.
    b: (packed, scales). packed: int8 or uint8 [g, n, k/2], two e2m1 codes a byte (LOW nibble = element 2j);
       scales: float8_e8m0fnu or uint8 (raw E8M0 byte, 2^(byte-127)) [g, n, k/32]. The Triton path is exact
       (up to fp32 summation order) for scale bytes in [1, 254]; the reference for all. Or a `W4A8WideWeights`
       from `prepare_w4a8_wide` (the W4A8 wide kernel where it applies, else its packed / scales as above).
    offs: int32 [g], cumulative END row of each group (as `m_grouped_bf16_fp4_gemm_nt_contiguous`); empty groups
       allowed; rows past offs[g-1] are left untouched. Validated (ValueError) only on the reference path.
    out: bfloat16 [m, n], contiguous; allocated when None.
    expected_m: optional rows-per-group hint (picks the tile; never read on the device).
    config: optional `W4A8Config` for the Triton path (benchmark sweeps); None -> `default_w4a8_config`.
    impl: None (env DEEPINFER_DG_W4A8_IMPL, default "auto"), "auto" (the compiled FP8-wgmma kernel from 64 rows per
       group, Triton below: `DEFAULT_IMPL`; with prepared weights the wide kernel from WIDE_MIN_ROWS), "triton",
       "wide" (prepared weights: the wide kernel whenever it applies, else as "rows"), or "cuda" /
       "cuda_wg<W>s<S>[r]" (the compiled kernel on CUDA tensors when built and applicable, else Triton; ignored on
       the reference path). A `config` forces Triton.
    Requires k % 128 == 0 and n % 16 == 0. Accumulates in float32. Returns out [m, n].
    """
    prepared = b if isinstance(b, W4A8WideWeights) else None
    if prepared is not None:
        b = (prepared.packed, prepared.scales)
    values, sfa = check_pair("a", a)
    check_tensor("a[0] (FP8 values)", values, (torch.float8_e4m3fn,), [None, None])
    m, k = values.shape
    packed, scales = check_pair("b", b)
    check_tensor("b[0] (packed FP4)", packed, _PACKED, [None, None, None])
    g, n, kb = packed.shape
    if 2 * kb != k:
        raise ValueError(f"K mismatch: a has K={k} but b[0] packs K = 2 * {kb} = {2 * kb}")
    if k % 128 != 0:
        raise ValueError(f"K must be a multiple of 128, got K={k}")
    if n % 16 != 0:
        raise ValueError(f"N must be a multiple of 16, got N={n}")
    check_tensor("a[1] (activation scales)", sfa, (torch.float32,), [m, k // 128])
    check_tensor("b[1] (E8M0 scales)", scales, _E8M0, [g, n, k // 32])
    check_tensor("offs", offs, (torch.int32,), [g])
    if out is not None:
        check_tensor("out", out, (torch.bfloat16,), [m, n])
    check_same_device(a=values, sfa=sfa, packed=packed, scales=scales, offs=offs, out=out)
    rows = rows_per_group(m, g, expected_m)  # also validates the hint on every path
    if config is not None and not isinstance(config, W4A8Config):
        raise TypeError(f"config: expected a W4A8Config or None, got {type(config).__name__}")
    if config is not None and k % (128 * config.split_k):
        raise ValueError(f"config.split_k: expected 128 * split_k to divide K={k}, got {config.split_k}")
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=values.device)
    if prepared is not None and values.is_cuda and config is None and _wide_wanted(impl, rows):
        from .backends.cuda import cuda_w4a8_wide as ww

        if not _forced_reference() and ww.applies(values, prepared):
            return ww.m_grouped_fp8_fp4_gemm_nt_offsets_wide(values, sfa, prepared, offs, out)
    cuda_variant = _cuda_variant(impl, config, rows)
    if values.is_cuda and cuda_variant is not None and not _forced_reference():
        from .backends.cuda import cuda_w4a8_grouped as cw

        if cw.applies(values, sfa, packed, scales) and cuda_variant in cw.compiled_variants():
            return cw.m_grouped_fp8_fp4_gemm_nt_offsets_cuda(values, sfa, packed, scales, offs, out, cuda_variant)
    if use_triton(values.device):
        from .backends.cuda.triton_fp4_fp8_grouped import m_grouped_fp8_fp4_gemm_nt_offsets_triton

        return m_grouped_fp8_fp4_gemm_nt_offsets_triton(
            values, sfa, packed, scales, offs, out, config=config, expected_m=expected_m
        )
    return ref.m_grouped_fp8_fp4_gemm_nt_offsets(values, sfa, packed, scales, offs, out)


def _impl_choice(impl: str | None) -> str:
    """impl, or env DEEPINFER_DG_W4A8_IMPL when None ("auto" when unset)."""
    choice = impl if impl is not None else (os.environ.get(IMPL_ENV, "auto").strip().lower() or "auto")
    if not isinstance(choice, str):
        raise TypeError(f"impl: expected a str or None, got {type(choice).__name__}")
    return choice


def _wide_wanted(impl: str | None, rows: float) -> bool:
    """Prepared weights: whether the call asks for the wide kernel ("wide", or "auto" / "rows" from WIDE_MIN_ROWS)."""
    choice = _impl_choice(impl)
    return choice == "wide" or (choice in ("auto", "rows") and DEFAULT_IMPL == "rows" and rows >= WIDE_MIN_ROWS)


def _auto_variant(rows: float) -> str:
    """DEFAULT_IMPL "rows": the impl name for `rows` rows per group (see DEFAULT_IMPL's comment)."""
    if rows < CUDA_MIN_ROWS:
        return "triton"
    return "cuda_rs2s4n256" if rows >= RS_MIN_ROWS else "cuda_wg1s4"


def _cuda_variant(impl: str | None, config: W4A8Config | None, rows: float) -> tuple[int, int, int] | None:
    """The (wg, stages, rel) CUDA variant the call asks for, or None for Triton / the reference. `impl` None reads env
    DEEPINFER_DG_W4A8_IMPL; "auto" means DEFAULT_IMPL ("rows": by `rows` rows per group). ValueError for an unknown
    name (on every path)."""
    from .backends.cuda.cuda_w4a8_grouped import parse_variant

    choice = _impl_choice(impl)
    if choice == "auto":
        choice = DEFAULT_IMPL
    if choice in ("rows", "wide"):  # "wide" that did not apply: what "rows" runs
        choice = _auto_variant(rows)
    if choice == "triton":
        return None
    try:
        variant = parse_variant(choice)
    except ValueError as exc:
        raise ValueError(f"impl ({IMPL_ENV}): expected auto, triton or a CUDA name; {exc}") from None
    return None if config is not None else variant


def _forced_reference() -> bool:
    """True when DEEPINFER_DEEP_GEMM_BACKEND forces the reference or Triton (the CUDA kernel then never runs)."""
    from ._backend import ENV_VAR

    return os.environ.get(ENV_VAR, "").strip().lower() in ("reference", "triton")
