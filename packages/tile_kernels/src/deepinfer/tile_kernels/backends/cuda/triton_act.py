"""Triton SwiGLU with V4's clamp (`ref/act.py::swiglu_clamp`), from two tensors or one fused [..., 2n] input.

One elementwise kernel over [rows, n] tiles: gate and up are read through their own (row, column) strides, so
the fused MoE layout h [..., 2n] is read in place as gate = h[..., :n], up = h[..., n:]. fp32 math in the
reference's order: silu(g) = g / (1 + exp(-g)), then * u. The clamps are `where`s, so NaN propagates as in
torch.clamp. No host sync (CUDA-graph safe); blocks come from shapes only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["swiglu_clamp_fused_triton", "swiglu_clamp_triton"]

MAX_BLOCK_N = 1024  # columns per program
TILE_ELEMS = 2048  # rows per program so that a tile has about this many elements
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _exp_ftz(x):
    """exp(x) as Triton lowers tl.exp on the GPU (x * fp32(log2 e), fp fusion off, then ex2.approx) but with the
    flush-to-zero ex2.approx.ftz.f32 (one MUFU.EX2; the non-ftz form adds a range test, a pre-scale and a square
    for results below 2^-126). Equal to tl.exp's result wherever that result is normal; where it is subnormal
    (x < -87.3) this gives 0, and 1 + either is exactly 1, so silu's g / (1 + exp(-g)) is the same bits. GPU only
    (inline PTX): the interpreter takes tl.exp."""
    z = x * 1.4426950408889634  # rounds to fp32(log2 e) = 0x3FB8AA3B, the constant of Triton's own lowering
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [z], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def swiglu_math(g, u, limit, HAS_LIMIT: tl.constexpr, FTZ_EXP: tl.constexpr = False):
    """fp32 silu(min(g, limit)) * clamp(u, -limit, limit) in the reference's order (shared with triton_fused).
    FTZ_EXP (GPU only; session 6's config `lean_ex2` of swiglu_clamp_fp8): the exp by `_exp_ftz`, same bits."""
    if HAS_LIMIT:  # torch.clamp order: max(., lo) then min(., hi)
        g = tl.where(g > limit, limit, g)
        u = tl.where(u < -limit, -limit, u)
        u = tl.where(u > limit, limit, u)
    if FTZ_EXP:
        e = _exp_ftz(-g)
    else:
        e = tl.exp(-g)
    return g / (1.0 + e) * u


@triton.jit
def _swiglu_kernel(
    g_ptr,
    u_ptr,
    y_ptr,
    n_rows,
    n,
    stride_gr,
    stride_gn,
    stride_ur,
    stride_un,
    limit,
    HAS_LIMIT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """gate, up [n_rows, n] (strided) -> y [n_rows, n] contiguous (y dtype)."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)  # [BR]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    mask = (rows < n_rows)[:, None] & (cols < n)[None, :]
    g = tl.load(g_ptr + rows[:, None] * stride_gr + cols[None, :] * stride_gn, mask=mask, other=0.0)
    u = tl.load(u_ptr + rows[:, None] * stride_ur + cols[None, :] * stride_un, mask=mask, other=0.0)
    y = swiglu_math(g.to(tl.float32), u.to(tl.float32), limit, HAS_LIMIT)
    tl.store(y_ptr + rows[:, None] * n + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def _check_float(name: str, t: object) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPES:
        raise TypeError(f"{name} must be a fp32/bf16/fp16 tensor, got {getattr(t, 'dtype', type(t).__name__)}")


def _launch(
    gate: torch.Tensor, up: torch.Tensor, limit: float | None, out: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """Validate `out` (or allocate it) for gate's shape and `dtype`, then run the kernel on gate, up [..., n]."""
    if isinstance(limit, bool) or (limit is not None and not isinstance(limit, (int, float))):
        raise TypeError(f"limit must be a float or None, got {type(limit).__name__}")
    check_runnable(gate, up)
    shape = tuple(gate.shape)
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=gate.device)
    elif tuple(out.shape) != shape or out.dtype != dtype or out.device != gate.device or not out.is_contiguous():
        raise ValueError(
            f"out must be contiguous {dtype} {list(shape)} on {gate.device}, "
            f"got {out.dtype} {list(out.shape)} on {out.device} (contiguous={out.is_contiguous()})"
        )
    n = shape[-1] if shape else 1
    if out.numel() == 0:
        return out
    n_rows = out.numel() // n
    g2, u2 = gate.reshape(n_rows, n), up.reshape(n_rows, n)  # views whenever the leading dims merge
    bn = min(MAX_BLOCK_N, max(16, triton.next_power_of_2(n)))
    br = min(triton.next_power_of_2(n_rows), max(1, TILE_ELEMS // bn))
    _swiglu_kernel[(triton.cdiv(n_rows, br), triton.cdiv(n, bn))](
        g2,
        u2,
        out,
        n_rows,
        n,
        g2.stride(0),
        g2.stride(1),
        u2.stride(0),
        u2.stride(1),
        float(limit) if limit is not None else 0.0,
        HAS_LIMIT=limit is not None,
        BLOCK_R=br,
        BLOCK_N=bn,
        num_warps=max(1, min(8, br * bn // 512)),
    )
    return out


def swiglu_clamp_triton(
    gate: torch.Tensor, up: torch.Tensor, limit: float | None = 10.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit) in fp32, same contract as `ref.act.swiglu_clamp`.

    gate, up: [..., n], same shape, fp32/bf16/fp16 (dtypes may differ), any strides; limit None: no clamp.
    Returns [..., n] in gate.dtype, contiguous; written into `out` (contiguous, gate's shape and dtype; may be
    gate or up itself when that is contiguous) when given. Shape checks only, no host sync.
    """
    _check_float("gate", gate)
    _check_float("up", up)
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have the same shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    return _launch(gate, up, limit, out, gate.dtype)


def swiglu_clamp_fused_triton(
    h: torch.Tensor, limit: float | None = 10.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """SwiGLU-clamp of the fused MoE layout: h [..., 2n] -> swiglu_clamp(h[..., :n], h[..., n:], limit).

    h: fp32/bf16/fp16, 1+ dims, even last dim, any strides. Returns [..., n] in h.dtype, contiguous; written
    into `out` (contiguous, that shape and dtype) when given. Shape checks only, no host sync.
    """
    _check_float("h", h)
    if h.dim() < 1 or h.shape[-1] % 2:
        raise ValueError(f"h must be [..., 2n] with an even last dim, got shape {tuple(h.shape)}")
    n = h.shape[-1] // 2
    return _launch(h[..., :n], h[..., n:], limit, out, h.dtype)
