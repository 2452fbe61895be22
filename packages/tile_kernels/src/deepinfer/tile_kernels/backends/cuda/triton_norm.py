"""Triton RMSNorm (`ref/norm.py::rms_norm`): one program per BLOCK_R rows, the whole row in registers.

x is read once: the row is loaded into a [BLOCK_R, BLOCK_D] tile (BLOCK_D = next power of two >= d, at most
MAX_D), the mean square is a register reduction and y = weight * (x * r) is written from the same tile. All
math is fp32 in the reference's order; the launcher does no host sync (CUDA-graph safe) and picks its blocks
from shapes only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["MAX_D", "rms_norm_triton"]

MAX_D = 16384  # longest row held in registers (V4: 512, 1024, 4096)
ROWS_SINGLE = 1024  # up to this many rows: one row per program (decode: spread over the SMs)
TILE_ELEMS = 2048  # above ROWS_SINGLE rows: rows per program so that a tile has about this many elements
MAX_BLOCK_R = 16
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    n_rows,
    d,
    stride_xr,
    stride_xd,
    stride_w,
    eps,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """x [n_rows, d] (strided), w [d] (strided) -> y [n_rows, d] contiguous (y dtype)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BR]
    cols = tl.arange(0, BLOCK_D)  # [BD]
    rmask = rows < n_rows
    cmask = cols < d
    mask = rmask[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_xr + cols[None, :] * stride_xd, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    ms = tl.sum(xf * xf, axis=1) / d  # [BR] mean of squares (masked columns add 0)
    r = 1.0 / tl.sqrt(ms + eps)
    y = xf * r[:, None]
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols * stride_w, mask=cmask, other=0.0).to(tl.float32)
        y = w[None, :] * y
    tl.store(y_ptr + rows64[:, None] * d + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def _check_out(o: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """Raise unless the output buffer `o` is contiguous with the given shape, dtype and device."""
    if tuple(o.shape) != shape or o.dtype != dtype or o.device != device or not o.is_contiguous():
        raise ValueError(
            f"out must be contiguous {dtype} {list(shape)} on {device}, "
            f"got {o.dtype} {list(o.shape)} on {o.device} (contiguous={o.is_contiguous()})"
        )


def _blocks(n_rows: int, d: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_D, num_warps) from the shape alone."""
    bd = max(16, triton.next_power_of_2(d))
    br = 1 if n_rows <= ROWS_SINGLE else max(1, min(MAX_BLOCK_R, TILE_ELEMS // bd))
    warps = max(1, min(8, br * bd // 512))
    return br, bd, warps


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6, out: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm over the last dim, same contract as `ref.norm.rms_norm`.

    y = (weight.float() * (x.float() * rsqrt(mean(x.float()^2) + eps))).to(x.dtype), fp32 math.
    x: [..., d] fp32/bf16/fp16, any strides (leading dims that cannot be merged into one row stride are
    copied first), 1 <= d <= MAX_D; weight: [d] fp32/bf16/fp16 (any stride) or None (unweighted).
    Returns [..., d] in x.dtype, contiguous; written into `out` (contiguous, x's shape and dtype; may be x
    itself when x is contiguous) when given, else freshly allocated. Shape checks only, no host sync.
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in _DTYPES:
        raise TypeError(f"x must be a fp32/bf16/fp16 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dim [..., d]")
    d = x.shape[-1]
    if d > MAX_D:
        raise ValueError(f"rms_norm_triton holds a row in registers: d must be <= {MAX_D}, got {d}")
    if weight is not None:
        if weight.dtype not in _DTYPES:
            raise TypeError(f"weight must be fp32/bf16/fp16, got {weight.dtype}")
        if tuple(weight.shape) != (d,):
            raise ValueError(f"weight must have shape {(d,)} for x {tuple(x.shape)}, got {tuple(weight.shape)}")
        check_runnable(x, weight)
    else:
        check_runnable(x)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        _check_out(out, tuple(x.shape), x.dtype, x.device)
    n_rows = x.numel() // d if d else 0
    if n_rows == 0 or d == 0:
        return out
    x2 = x.reshape(n_rows, d)  # a view whenever the leading dims merge into one stride
    br, bd, warps = _blocks(n_rows, d)
    _rms_norm_kernel[(triton.cdiv(n_rows, br),)](
        x2,
        weight if weight is not None else x2,
        out,
        n_rows,
        d,
        x2.stride(0),
        x2.stride(1),
        weight.stride(0) if weight is not None else 0,
        float(eps),
        HAS_WEIGHT=weight is not None,
        BLOCK_R=br,
        BLOCK_D=bd,
        num_warps=warps,
    )
    return out
