"""Public fused ops: one pass over memory where the engine's unfused path makes several.

Each equals the composition of single-op references in `ref/fused.py` (rounding to the activation dtype in
between, as the unfused path stores it). CUDA fp32/bf16/fp16 inputs run the Triton kernels of
`backends/cuda/triton_fused.py` (`hadamard_fp4_quant_dequant`: `triton_hadamard.py`); everything else runs the
reference.
"""

from __future__ import annotations

import torch

from ._dispatch import TRITON_DTYPES, triton_float_ok
from ._validate import check_tensor
from .ref import fused as _ref

__all__ = ["hadamard_fp4_quant_dequant", "kv_norm_rope_quant", "swiglu_clamp_fp8"]
_HADAMARD_MAX_N = 1024  # triton_hadamard.MAX_N


def _pow2(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 2 and v & (v - 1) == 0


def swiglu_clamp_fp8(
    gate: torch.Tensor, up: torch.Tensor, limit: float | None = 10.0, group_size: int = 128, scale_fmt: str = "ue8m0"
) -> tuple[torch.Tensor, torch.Tensor]:
    """SwiGLU with clamp fused with per-token-group FP8 quantisation of its output.

    gate, up: [..., n] float, same shape; n % group_size == 0; scale_fmt "ue8m0" | "fp32".
    Returns (q float8_e4m3fn [..., n], scales fp32 [..., n / group_size]) ==
    per_token_group_quant_fp8(swiglu_clamp(gate, up, limit), group_size, scale_fmt).
    """
    check_tensor("gate", gate, floating=True)
    if gate.shape != up.shape or gate.dim() < 1:
        raise ValueError(f"gate and up must have one shape [..., n], got {tuple(gate.shape)} and {tuple(up.shape)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if gate.shape[-1] % group_size:
        raise ValueError(f"gate's last dim ({gate.shape[-1]}) must be a multiple of group_size ({group_size})")
    if scale_fmt not in ("ue8m0", "fp32"):
        raise ValueError(f"scale_fmt must be 'ue8m0' or 'fp32', got {scale_fmt!r}")
    plain_limit = limit is None or (isinstance(limit, (int, float)) and not isinstance(limit, bool))
    if triton_float_ok(gate, up) and plain_limit and _pow2(group_size) and group_size <= 4096:
        from .backends.cuda.triton_fused import swiglu_clamp_fp8_triton  # imports triton: only on this path

        return swiglu_clamp_fp8_triton(gate, up, limit, group_size, scale_fmt)
    return _ref.swiglu_clamp_fp8(gate, up, limit, group_size, scale_fmt)


def kv_norm_rope_quant(
    kv: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope_dim: int = 64,
    eps: float = 1e-6,
    quant_block: int | None = 64,
    out: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """V4's KV entry: RMSNorm(kv, weight) -> RoPE of the last rope_dim dims -> FP8 quant-dequant of the others
    (blocks of quant_block, UE8M0; None: skipped) -> optionally written into a cache at given rows.

    kv [t, d] float; weight [d]; cos/sin [t, rope_dim/2] fp32. Returns [t, d] kv.dtype, or with out [n, d]
    (any float dtype) and rows int [t] (negative: skip; None: 0..t-1): out with out[rows[i]] = entry i. Rows must
    be < n (the CUDA path does not check: that would need a host sync). Equals `ref.fused.kv_norm_rope_quant`.
    """
    check_tensor("kv", kv, ndim=2, floating=True)
    t, d = kv.shape
    check_tensor("weight", weight, ndim=1)
    if tuple(weight.shape) != (d,):
        raise ValueError(f"weight must have shape {(d,)}, got {tuple(weight.shape)}")
    if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim % 2 or not 0 < rope_dim <= d:
        raise ValueError(f"rope_dim must be an even int in (0, {d}], got {rope_dim!r}")
    for name, cs in (("cos", cos), ("sin", sin)):
        check_tensor(name, cs, ndim=2)
        if tuple(cs.shape) != (t, rope_dim // 2):
            raise ValueError(f"{name} must have shape {(t, rope_dim // 2)}, got {tuple(cs.shape)}")
    nope = d - rope_dim
    if quant_block is not None and nope and (not isinstance(quant_block, int) or quant_block < 1 or nope % quant_block):
        raise ValueError(f"quant_block must be None or a positive int dividing {nope}, got {quant_block!r}")
    if out is not None:
        check_tensor("out", out, ndim=2, floating=True)
        if out.shape[1] != d:
            raise ValueError(f"out must be [n, {d}], got {tuple(out.shape)}")
    if rows is not None and tuple(rows.shape) != (t,):
        raise ValueError(f"rows must have shape {(t,)}, got {tuple(rows.shape)}")
    if _kv_fast(kv, weight, cos, sin, quant_block, nope, out, rows):
        from .backends.cuda.triton_fused import kv_norm_rope_quant_triton

        return kv_norm_rope_quant_triton(kv, weight, cos, sin, rope_dim, eps, quant_block, out, rows)
    return _ref.kv_norm_rope_quant(kv, weight, cos, sin, rope_dim, eps, quant_block, out, rows)


def _kv_fast(
    kv: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, quant_block: int | None,
    nope: int, out: torch.Tensor | None, rows: torch.Tensor | None,
) -> bool:  # fmt: skip
    """Whether the Triton kernel's limits hold (else the reference runs)."""
    d = kv.shape[1]
    if not triton_float_ok(kv, weight, cos, sin) or d % 2 or d > 16384:
        return False
    if quant_block is not None and nope and not _pow2(quant_block):
        return False
    if out is not None and (out.dtype not in TRITON_DTYPES or out.stride(1) != 1 or out.device != kv.device):
        return False
    if out is not None and rows is None and out.shape[0] < kv.shape[0]:
        return False
    return rows is None or (rows.dtype in (torch.int32, torch.int64) and rows.device == kv.device)


def hadamard_fp4_quant_dequant(x: torch.Tensor, scale: float | None = None, block: int = 32) -> torch.Tensor:
    """V4's indexer rotation and FP4 simulation in one pass: fp4_quant_dequant_ue8m0(hadamard_transform(x, scale),
    block), the transform rounded to x.dtype in between (bit-exact to the two ops in sequence).

    x: float [..., n], n a power of two, n % block == 0 (V4: n = 128, block 32); scale: default n^-1/2.
    Returns x's shape and dtype. On CUDA (n <= 1024, power-of-two block) one Triton pass: half the bytes.
    """
    check_tensor("x", x, floating=True)
    n = x.shape[-1] if x.dim() else 0
    if n < 1 or n & (n - 1):
        raise ValueError(f"x: last dim must be a power of two, got shape {tuple(x.shape)}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or n % block:
        raise ValueError(f"block must be a positive int dividing n = {n}, got {block!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")
    if triton_float_ok(x) and 2 <= n <= _HADAMARD_MAX_N and _pow2(block):
        from .backends.cuda.triton_hadamard import hadamard_fp4_triton  # imports triton: only on this path

        return hadamard_fp4_triton(x, scale, block)
    return _ref.hadamard_fp4_quant_dequant(x, scale, block)
