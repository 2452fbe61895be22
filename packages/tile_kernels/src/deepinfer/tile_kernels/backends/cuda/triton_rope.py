"""Triton interleaved-pair RoPE (`ref/rope.py::apply_rope_interleaved`) over x [t, M, d] (M = middle dims).

Program (i, b) takes token i and BLOCK_M of its M rows and walks the row in BLOCK_C-column steps: columns
below d - rope_dim are copied, the others are rotated as pairs (2k, 2k+1) of the rope region. Each column is
computed where it is stored, from its own value and its partner's (a second, cached load), so loads and
stores stay contiguous:

    even j = 2k: x[j] * c_k - x[j+1] * s_k        odd j = 2k+1: x[j] * c_k + x[j-1] * s_k

(s_k negated for `inverse`), the reference's products and sums in fp32. The launch turns Triton's fp fusion
off (`enable_fp_fusion=False`): by default the compiler contracts `xv * c + xp * s` into one FMA, which rounds
once where the reference (torch eager: a mul, a mul, an add) rounds three times. The two fp32 results then
differ by up to ~4 fp32 ulps of |(a, b)|, which is more than a bf16 ulp of the output where a*c and b*s nearly
cancel (|out| << |(a, b)|); this showed on the H200 as a 1-ulp bf16 miss at 4096 tokens. Without the FMA every
output is the same three correctly rounded fp32 operations as the reference (the operand order of the
commutative add differs only), so the result is bit-identical, also after the cast to bf16 (RNE both sides).
A memory-bound kernel loses nothing by it. No host sync (CUDA-graph safe); blocks come from shapes only.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["apply_rope_interleaved_triton"]

MAX_BLOCK_C = 1024  # columns per step
TILE_ELEMS = 4096  # most elements of one [BLOCK_M, BLOCK_C] tile
TARGET_PROGRAMS = 512  # shrink BLOCK_M (down to 1) until the grid has about this many programs
MAX_GRID_Y = 65535
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    y_ptr,
    M,
    d,
    rope_start,
    stride_xt,
    stride_xm,
    stride_xd,
    stride_ct,
    stride_ck,
    stride_st,
    stride_sk,
    INVERSE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """x [t, M, d] (strided), cos/sin [t, (d - rope_start) / 2] (strided) -> y [t, M, d] contiguous."""
    tok = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    rmask = rows < M
    x_row = x_ptr + tok * stride_xt + rows.to(tl.int64) * stride_xm  # [BM]
    y_row = y_ptr + (tok * M + rows) * d  # [BM]
    cc = tl.arange(0, BLOCK_C)
    for c0 in range(0, d, BLOCK_C):
        col = c0 + cc  # [BC]
        cmask = col < d
        j = col - rope_start  # index inside the rope region (negative: a copied column)
        is_rope = cmask & (j >= 0)
        jr = tl.maximum(j, 0)
        odd = (jr % 2) == 1
        partner = col + tl.where(odd, -1, 1)
        c = tl.load(cos_ptr + tok * stride_ct + (jr // 2) * stride_ck, mask=is_rope, other=1.0).to(tl.float32)
        s = tl.load(sin_ptr + tok * stride_st + (jr // 2) * stride_sk, mask=is_rope, other=0.0).to(tl.float32)
        if INVERSE:
            s = -s
        s = tl.where(odd, s, -s)  # even column: - x[j+1] * s; odd column: + x[j-1] * s
        m2 = rmask[:, None] & cmask[None, :]
        xv = tl.load(x_row[:, None] + col[None, :] * stride_xd, mask=m2, other=0.0).to(tl.float32)
        xp = tl.load(
            x_row[:, None] + partner[None, :] * stride_xd, mask=rmask[:, None] & is_rope[None, :], other=0.0
        ).to(tl.float32)
        y = tl.where(is_rope[None, :], xv * c[None, :] + xp * s[None, :], xv)  # BM x BC
        tl.store(y_row[:, None] + col[None, :], y.to(y_ptr.dtype.element_ty), mask=m2)


def _blocks(t: int, m: int, d: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_C, num_warps) from the shape alone: small BLOCK_M when t * M is small (decode)."""
    bc = min(MAX_BLOCK_C, max(16, triton.next_power_of_2(d)))
    bm = min(triton.next_power_of_2(m), max(1, TILE_ELEMS // bc))
    while bm > 1 and t * triton.cdiv(m, bm) < TARGET_PROGRAMS:
        bm //= 2
    while triton.cdiv(m, bm) > MAX_GRID_Y:
        bm *= 2
    return bm, bc, max(1, min(8, bm * bc // 512))


def apply_rope_interleaved_triton(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope_dim: int,
    inverse: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate the last `rope_dim` dims of x by interleaved pairs, same contract as `ref.rope.apply_rope_interleaved`.

    x: [t, ..., d] fp32/bf16/fp16 (any number of middle dims, any strides; middle dims that cannot be merged
    into one stride are copied first); cos/sin: [t, rope_dim/2] fp32/bf16/fp16 (fp32 in V4, any strides), pair k of
    token i rotates by (cos[i, k], sin[i, k]), by -angle when `inverse`. rope_dim even, 0 < rope_dim <= d.
    Returns a new tensor of x's shape and dtype (contiguous): the first d - rope_dim dims copied, the rest
    rotated in fp32. With `out` (contiguous, x's shape and dtype, not sharing x's storage) the result is
    written there. Shape checks only, no host sync.
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in _DTYPES:
        raise TypeError(f"x must be a fp32/bf16/fp16 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() < 2:
        raise ValueError(f"x must be [t, ..., d] (2+ dims), got shape {tuple(x.shape)}")
    t, d = x.shape[0], x.shape[-1]
    if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim % 2 or not 0 < rope_dim <= d:
        raise ValueError(f"rope_dim must be an even int in (0, {d}], got {rope_dim!r}")
    for name, cs in (("cos", cos), ("sin", sin)):
        if not isinstance(cs, torch.Tensor) or cs.dtype not in _DTYPES:
            raise TypeError(f"{name} must be a fp32/bf16/fp16 tensor, got {getattr(cs, 'dtype', type(cs).__name__)}")
        if tuple(cs.shape) != (t, rope_dim // 2):
            raise ValueError(f"{name} must have shape {(t, rope_dim // 2)}, got {tuple(cs.shape)}")
    check_runnable(x, cos, sin)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    elif (
        tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous()
    ):
        raise ValueError(
            f"out must be contiguous {x.dtype} {list(x.shape)} on {x.device}, "
            f"got {out.dtype} {list(out.shape)} on {out.device} (contiguous={out.is_contiguous()})"
        )
    elif out.numel() and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        raise ValueError("out must not share storage with x (a column reads its pair partner: no in-place RoPE)")
    m = math.prod(x.shape[1:-1])
    if x.numel() == 0:
        return out
    x3 = x.reshape(t, m, d)  # a view whenever the middle dims merge into one stride
    bm, bc, warps = _blocks(t, m, d)
    _rope_kernel[(t, triton.cdiv(m, bm))](
        x3,
        cos,
        sin,
        out,
        m,
        d,
        d - rope_dim,
        x3.stride(0),
        x3.stride(1),
        x3.stride(2),
        cos.stride(0),
        cos.stride(1),
        sin.stride(0),
        sin.stride(1),
        INVERSE=bool(inverse),
        BLOCK_M=bm,
        BLOCK_C=bc,
        num_warps=warps,
        enable_fp_fusion=False,  # no FMA: round like the reference (module docstring)
    )
    return out
