"""Public M-grouped GEMM with bf16 activations and FP4 (e2m1) weights, contiguous layout ("W4A16" MoE experts).

Dispatch (no host sync on the fast path, so it can be captured in a CUDA graph):

* CUDA tensors -> the Triton kernel (`backends/cuda/triton_fp4_grouped.py`), unless
  DEEPINFER_DEEP_GEMM_BACKEND=reference (or Triton is not importable); or a compiled CUDA kernel for the
  memory-bound regime (`backends/cuda/cuda_fp4_grouped.py`: "kernel 5", the persistent one, and "kernel 4"): by
  `config=` / DEEPINFER_DG_W4A16_CONFIG naming a kernel-4 (`...cu`) or kernel-5 (`...cp`) config,
  or by the impl choice (env DEEPINFER_DG_W4A16_IMPL, default `DEFAULT_IMPL`): "triton" (Triton only),
  "auto" (CUDA when the rows-per-group estimate is <= CUDA_MAX_ROWS and `_C` has the kernel: kernel 5
  (`w4a16_configs.CUDA_P_BY_TN`) where `_C` has it and g <= CUDA_P_MAX_GROUPS, else kernel 4; Triton otherwise),
  "cuda" (CUDA wherever it can run: kernel 4's 64-token blocks above CUDA_MAX_ROWS rows per group), "cutlass_dq"
  (opt-in, prepared in session 5, not yet GPU-run: at >= `cutlass_w4a16_dq.MIN_ROWS` rows per group, dequantise
  chunks of experts to bf16 and run CUTLASS's grouped bf16 GEMM, `backends/cuda/cutlass_w4a16_dq.py`, where `_C`
  has it; "auto" otherwise);
* CPU tensors -> the PyTorch reference (`reference_w4a16.py`), unless DEEPINFER_DEEP_GEMM_BACKEND=triton,
  which needs TRITON_INTERPRET=1 (the interpreter; dot operands are then upcast to fp32 automatically).
"""

from __future__ import annotations

import os

import torch

from . import reference_w4a16 as ref
from ._backend import ENV_VAR
from ._checks import check_pair, check_same_device, check_tensor
from ._dispatch import impl, use_triton
from .backends.cuda import w4a16_configs as cfgs
from .backends.cuda.w4a16_configs import CUDA_BY_TN, W4A16Config, cuda_config, parse_config, rows_per_group

__all__ = ["m_grouped_bf16_fp4_gemm_nt_contiguous"]

IMPL_ENV = "DEEPINFER_DG_W4A16_IMPL"
IMPL_CHOICES = ("auto", "triton", "cuda", "cutlass_dq")
# What an unset DEEPINFER_DG_W4A16_IMPL means: "auto" since the CUDA kernel passed its GPU tests and beat Triton at
# decode sizes on the H200 (session 4, the `dg_w4a16[m8n64k256w4s4cu]` rows; kernel 5 since session 5, the
# `dg_w4a16[...cp]` rows: see w4a16_configs.CUDA_P_BY_TN).
DEFAULT_IMPL = "auto"

_PACKED = (torch.int8, torch.uint8)
_E8M0 = (torch.float8_e8m0fnu, torch.uint8)


def m_grouped_bf16_fp4_gemm_nt_contiguous(
    a: torch.Tensor,
    b: tuple[torch.Tensor, torch.Tensor],
    offs: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    expected_m: int | None = None,
    config: W4A16Config | None = None,
) -> torch.Tensor:
    """Grouped GEMM: out[r] = a[r] @ W_i^T for the rows r of group i, W_i = dequant(b[0][i], b[1][i]) [n, k].

    a: bfloat16 [m, k], row-major contiguous, rows sorted by group (MoE experts).
    b: (packed, scales). packed: int8 or uint8 [g, n, k/2], two e2m1 codes a byte (LOW nibble = element 2j,
       high nibble = element 2j+1; code c -> [0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, ..., -6][c]);
       scales: float8_e8m0fnu or uint8 (the raw E8M0 byte, value 2^(byte-127)) [g, n, k/32], one per 32
       inputs. The Triton path is exact for scale bytes in [2, 252]; the reference for all.
    offs: int32 [g] on a's device, cumulative END row of each group (torch._grouped_mm convention): group i
       owns rows offs[i-1] .. offs[i]-1 (offs[-1] := 0), 0 <= offs[0] <= ... <= offs[g-1] <= m; empty groups
       are allowed. Rows past offs[g-1] are left untouched. The values are checked (ValueError) only on the
       reference path; the Triton path never reads them on the host (it clamps rows to [0, m)).
    out: bfloat16 [m, n], contiguous; allocated (uninitialised) when None.
    expected_m: optional hint, the typical number of rows per group (DeepGEMM's name), used only to pick the
       kernel's row tile on the Triton path; None estimates it as ceil(m / g) from the shapes. Never read on
       the device, so any value is safe: it changes speed, not results.
    config: optional explicit `W4A16Config` (tiles, warps, stages) for the fast path (benchmark sweeps; kernels 4
       and 5 = the compiled CUDA kernels); None -> env DEEPINFER_DG_W4A16_CONFIG (a config name) when set, else
       the impl choice (module docstring) and `w4a16_configs.default_config(m, g, expected_m)` /
       `cuda_config(m, g, expected_m, kernel)`. Ignored by the reference.
    Requires k % 128 == 0 and n % 16 == 0; all tensors on one device. Accumulates in float32.
    Returns out [m, n].
    """
    check_tensor("a", a, (torch.bfloat16,), [None, None])
    m, k = a.shape
    packed, scales = check_pair("b", b)
    check_tensor("b[0] (packed FP4)", packed, _PACKED, [None, None, None])
    g, n, kb = packed.shape
    if 2 * kb != k:
        raise ValueError(f"K mismatch: a has K={k} but b[0] packs K = 2 * {kb} = {2 * kb}")
    if k % 128 != 0:
        raise ValueError(f"K must be a multiple of 128, got K={k}")
    if n % 16 != 0:
        raise ValueError(f"N must be a multiple of 16, got N={n}")
    check_tensor("b[1] (E8M0 scales)", scales, _E8M0, [g, n, k // 32])
    check_tensor("offs", offs, (torch.int32,), [g])
    if out is not None:
        check_tensor("out", out, (torch.bfloat16,), [m, n])
    check_same_device(a=a, packed=packed, scales=scales, offs=offs, out=out)
    rows_per_group(m, g, expected_m)  # validates the hint on every path
    _impl()  # validates DEEPINFER_DG_W4A16_IMPL on every path
    if config is not None and not isinstance(config, W4A16Config):
        raise TypeError(f"config: expected a W4A16Config or None, got {type(config).__name__}")
    cuda_kernel = config is not None and config.kernel in cfgs.CUDA_KERNELS  # the CUDA kernels zero-fill k tails
    if config is not None and not cuda_kernel and k % config.block_k:
        raise ValueError(f"config.block_k: expected a divisor of K={k}, got {config.block_k}")
    if config is not None and not cuda_kernel and k % (config.block_k * config.split_k):
        raise ValueError(f"config.split_k: expected block_k * split_k to divide K={k}, got {config.split_k}")
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if use_triton(a.device):
        if config is None and _use_cutlass_dq(a, packed, scales, offs, out, g, expected_m):
            from .backends.cuda import cutlass_w4a16_dq as dq

            run_dq = dq.m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq
            return run_dq(a, packed, scales, offs, out, expected_m=expected_m)
        cfg = _cuda_choice(a, packed, scales, g, config, expected_m)
        if cfg is not None:
            return _run_cuda(cfg, a, packed, scales, offs, out)
        from .backends.cuda.triton_fp4_grouped import m_grouped_bf16_fp4_gemm_nt_contiguous_triton

        return m_grouped_bf16_fp4_gemm_nt_contiguous_triton(
            a, packed, scales, offs, out, config=config, expected_m=expected_m
        )
    fn = impl("m_grouped_bf16_fp4_gemm_nt_contiguous", a.device, ref.m_grouped_bf16_fp4_gemm_nt_contiguous)
    return fn(a, packed, scales, offs, out)


def _impl() -> str:
    """The W4A16 impl choice: env DEEPINFER_DG_W4A16_IMPL (auto | triton | cuda | cutlass_dq), else DEFAULT_IMPL."""
    wanted = os.environ.get(IMPL_ENV, "").strip().lower() or DEFAULT_IMPL
    if wanted not in IMPL_CHOICES:
        raise ValueError(f"{IMPL_ENV}: expected one of {'|'.join(IMPL_CHOICES)}, got {wanted!r}")
    return wanted


def _on_cuda(t: torch.Tensor) -> bool:
    """True for a CUDA tensor (a seam: the CPU routing tests fake it)."""
    return t.is_cuda


def _use_cutlass_dq(
    a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, g: int,
    expected_m: int | None,
) -> bool:  # fmt: skip
    """True when the opt-in `cutlass_dq` impl is chosen and applies: no forced config name, enough rows per group
    (`cutlass_w4a16_dq.MIN_ROWS`), `_C` built with it, operands it takes (metadata only: no device values read)."""
    if _impl() != "cutlass_dq" or os.environ.get("DEEPINFER_DG_W4A16_CONFIG"):
        return False
    if os.environ.get(ENV_VAR, "").strip().lower() == "triton" or not _on_cuda(a):
        return False
    from .backends.cuda import cutlass_w4a16_dq as dq

    if rows_per_group(a.shape[0], g, expected_m) < dq.MIN_ROWS or not dq.available():
        return False
    try:
        dq.check_args(a, packed, scales, offs, out)
    except (TypeError, ValueError):
        return False  # e.g. a misaligned view: the default kernels take it
    return True


def _cuda_choice(
    a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, g: int, config: W4A16Config | None,
    expected_m: int | None,
) -> W4A16Config | None:  # fmt: skip
    """The CUDA (kernel 4 or 5) config a fast-path call runs, or None for Triton. An explicit (or env-forced)
    kernel-4 / kernel-5 config always runs CUDA (the wrapper raises when it cannot); otherwise the impl choice
    decides (metadata only: `cu.applies` reads pointers and the device, never values)."""
    forced = os.environ.get("DEEPINFER_DG_W4A16_CONFIG")
    if config is None and forced:
        config = parse_config(forced)
    if config is not None:
        return config if config.kernel in cfgs.CUDA_KERNELS else None
    impl = _impl()
    if impl == "triton" or os.environ.get(ENV_VAR, "").strip().lower() == "triton":
        return None  # DEEPINFER_DEEP_GEMM_BACKEND=triton: Triton kernels only
    from .backends.cuda import cuda_fp4_grouped as cu

    if not cu.applies(a, packed, scales):  # False for CPU tensors, a `_C` without kernel 4, misaligned operands
        return None
    # kernel 5 where `_C` has it (a build of this tree) and its shared offs copy stays small; else kernel 4
    kernel = cfgs.CUDA_DEFAULT_KERNEL if cu.available_p() and g <= cfgs.CUDA_P_MAX_GROUPS else 4
    cfg = cuda_config(a.shape[0], g, expected_m, kernel=kernel)
    return CUDA_BY_TN[64] if cfg is None and impl == "cuda" else cfg


def _run_cuda(
    cfg: W4A16Config, a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """Launch the CUDA kernel of `cfg` (5: persistent, 4: one CTA per (expert, slab)) on validated operands."""
    from .backends.cuda import cuda_fp4_grouped as cu

    if cfg.kernel == 5:
        return cu.m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_p(a, packed, scales, offs, out, cfg)
    return cu.m_grouped_bf16_fp4_gemm_nt_contiguous_cuda(a, packed, scales, offs, out, cfg)
