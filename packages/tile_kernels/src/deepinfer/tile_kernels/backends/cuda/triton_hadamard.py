"""Triton Walsh-Hadamard transform over the last dim (Sylvester order, `ref/quant.py::hadamard_transform`).

V4's indexer rotates every 128-wide q / k row before the FP4 simulation. A program takes BLOCK_R rows as one
[BLOCK_R, N] tile (N <= 1024 a power of two; 4096 elements: 8 KB of bf16 in and 8 KB out), so x is read once.

Why butterflies and not a [N x N] +-1 matmul (tl.dot), at N = 128 in bf16: the transform moves 4 bytes per
element (2 in, 2 out); butterflies cost log2(N) = 7 adds per element (1.75 FLOP/byte), the matmul 2N = 256 FLOPs
per element (64 FLOP/byte). Both sit below the H200's bf16 tensor-core ridge (735 TFLOPS / 4.07 TB/s ~ 180
FLOP/byte), so either can run at memory speed, but only the butterflies are bit-exact: they make the
reference's exact fp32 operations in the reference's order (stage h pairs i and i + h inside runs of 2h: a + b,
a - b), then one fp32 multiply by fp32(scale) and one rounding to x's dtype. The matmul accumulates 128 exact
products in the tensor core's fp32 adder tree (a different order, so a few fp32 ulps away; then the same after
rounding to bf16 in most, not all, elements) and fp32 input would need tf32 (inexact). "butterfly" is the default;
"dot" (bf16 / fp16 only) is a named variant the benchmark measures side by side, in case the butterflies' layout
shuffles (a reshape / permute / split / join per stage) keep them below memory speed on the GPU.

Rounding to bf16: the GPU's cast (RNE); under the interpreter (which truncates fp32 -> bf16) the integer-step RNE
of `triton_fused._rne_bf16`, so CPU tests check the GPU's arithmetic bit for bit. No host sync (CUDA-graph safe).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._launch import check_runnable
from .triton_fp4 import fp4_tile
from .triton_fused import _round_act

__all__ = ["MAX_N", "IMPLS", "hadamard_fp4_triton", "hadamard_triton"]

MAX_N = 1024
TILE_ELEMS = 4096
IMPLS = ("butterfly", "dot")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _stage(x, BLOCK_R: tl.constexpr, N: tl.constexpr, H: tl.constexpr):
    """One butterfly stage on [BLOCK_R, N]: inside every run of 2H, (a, b) = (x[i], x[i + H]) -> (a + b, a - b)."""
    v = tl.reshape(x, [BLOCK_R, N // (2 * H), 2, H])
    v = tl.permute(v, (0, 1, 3, 2))  # the pair axis last, for split / join
    a, b = tl.split(v)
    y = tl.join(a + b, a - b)
    y = tl.permute(y, (0, 1, 3, 2))
    return tl.reshape(y, [BLOCK_R, N])


@triton.jit
def fwht_tile(x, BLOCK_R: tl.constexpr, N: tl.constexpr, LOG_N: tl.constexpr):
    """Unnormalised Walsh-Hadamard transform of fp32 rows x [BLOCK_R, N] (N = 2^LOG_N), the reference's stages."""
    for i in tl.static_range(LOG_N):
        x = _stage(x, BLOCK_R, N, 1 << i)
    return x


@triton.jit
def _hadamard_kernel(
    x_ptr,
    y_ptr,
    h_ptr,
    rows,
    stride_xr,
    stride_xc,
    scale,
    N: tl.constexpr,
    LOG_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    USE_DOT: tl.constexpr,
    IS_BF16: tl.constexpr,
    HW_CAST: tl.constexpr,
):
    """x [rows, N] strided -> y [rows, N] contiguous = scale * (x @ H_N), rounded to y's dtype. h_ptr: H_N in x's
    dtype ([N, N] contiguous), read only when USE_DOT."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < rows
    j = tl.arange(0, N)
    mask = rmask[:, None]
    x = tl.load(x_ptr + r[:, None] * stride_xr + j[None, :] * stride_xc, mask=mask, other=0.0)
    if USE_DOT:
        h = tl.load(h_ptr + j[:, None] * N + j[None, :])
        acc = tl.dot(x, h, out_dtype=tl.float32)
    else:
        acc = fwht_tile(x.to(tl.float32), BLOCK_R, N, LOG_N)
    dt = y_ptr.dtype.element_ty
    y = _round_act(acc * scale, dt, IS_BF16, HW_CAST)
    tl.store(y_ptr + r[:, None] * N + j[None, :], y.to(dt), mask=mask)


@triton.jit
def _hadamard_fp4_kernel(
    x_ptr,
    y_ptr,
    rows,
    stride_xr,
    stride_xc,
    scale,
    N: tl.constexpr,
    LOG_N: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    IS_BF16: tl.constexpr,
    HW_CAST: tl.constexpr,
):
    """x [rows, N] strided -> y [rows, N] contiguous = fp4_quant_dequant(round(scale * H_N x), GROUP): the
    butterflies above, the rounding to x's dtype the unfused path stores, then triton_fp4's quantiser."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask = (r < rows)[:, None]
    j = tl.arange(0, N)
    x = tl.load(x_ptr + r[:, None] * stride_xr + j[None, :] * stride_xc, mask=mask, other=0.0)
    dt = y_ptr.dtype.element_ty
    h = _round_act(fwht_tile(x.to(tl.float32), BLOCK_R, N, LOG_N) * scale, dt, IS_BF16, HW_CAST)
    _, _, deq = fp4_tile(tl.reshape(h, [BLOCK_R * (N // GROUP), GROUP]), GROUP)
    y = tl.reshape(deq, [BLOCK_R, N])
    tl.store(y_ptr + r[:, None] * N + j[None, :], y.to(dt), mask=mask)


def _check(x: torch.Tensor) -> int:
    """n (x's last dim) after checking dtype and size."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _DTYPES:
        raise TypeError(f"x must be a fp32/bf16/fp16 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    n = x.shape[-1] if x.dim() else 0
    if not 2 <= n <= MAX_N or n & (n - 1):
        raise ValueError(f"x's last dim must be a power of two in [2, {MAX_N}], got shape {tuple(x.shape)}")
    return n


def hadamard_fp4_triton(
    x: torch.Tensor,
    scale: float | None = None,
    block: int = 32,
    *,
    tile_elems: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """fp4_quant_dequant_ue8m0(hadamard_transform(x, scale), block) in one pass, bit-exact to that composition
    (V4's indexer q / k simulation): x [..., n] fp32/bf16/fp16, any strides, n a power of two in [2, MAX_N];
    block a power of two in [2, n]. Returns x's shape and dtype (contiguous). Half the bytes of the two kernels
    (the transformed rows never go to memory). tile_elems / num_warps: benchmark configs (elements per program, a
    power of two >= n; None: TILE_ELEMS, one warp per 512 elements up to 8). No host sync."""
    n = _check(x)
    if isinstance(block, bool) or not isinstance(block, int) or not 2 <= block <= n or block & (block - 1):
        raise ValueError(f"block must be a power of two in [2, {n}], got {block!r}")
    check_runnable(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    br = max(1, min((tile_elems or TILE_ELEMS) // n, triton.next_power_of_2(rows)))
    _hadamard_fp4_kernel[(triton.cdiv(rows, br),)](
        x2,
        out,
        rows,
        x2.stride(0),
        x2.stride(1),
        float(n) ** -0.5 if scale is None else float(scale),
        N=n,
        LOG_N=n.bit_length() - 1,
        GROUP=block,
        BLOCK_R=br,
        IS_BF16=x.dtype == torch.bfloat16,
        HW_CAST=x.is_cuda,
        num_warps=num_warps or max(1, min(8, br * n // 512)),
        enable_fp_fusion=False,
    )
    return out


@functools.cache
def _sylvester(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """H_n (+-1, Sylvester order) as a contiguous [n, n] tensor: H[i, j] = (-1)^popcount(i & j)."""
    i = torch.arange(n)
    bits = i[:, None] & i[None, :]
    parity = torch.zeros_like(bits)
    while bool(bits.any()):
        parity ^= bits & 1
        bits = bits >> 1
    return (1 - 2 * parity).to(dtype).to(device)


def hadamard_triton(x: torch.Tensor, scale: float | None = None, impl: str = "butterfly") -> torch.Tensor:
    """y = scale * H_n x over the last dim, x's shape and dtype (contiguous), as `ref.quant.hadamard_transform`.

    x: [..., n] fp32/bf16/fp16, any strides, n a power of two in [2, MAX_N]. scale: default n^-1/2 (rounded to
    fp32, as the reference). impl: "butterfly" (bit-exact, default) or "dot" (bf16 / fp16 only: one tl.dot with
    H_n, fp32 accumulation, not bit-exact; see the module docstring). No host sync.
    """
    n = _check(x)
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "dot" and (x.dtype == torch.float32 or n < 16):
        raise ValueError(f"impl 'dot' needs bf16/fp16 x and n >= 16, got {x.dtype}, n = {n}")
    check_runnable(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    s = float(n) ** -0.5 if scale is None else float(scale)
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    br = max(1, min(TILE_ELEMS // n, triton.next_power_of_2(rows)))
    if impl == "dot":
        br = max(br, 16)  # tl.dot needs >= 16 rows
    h = _sylvester(n, x.dtype, x.device) if impl == "dot" else x2
    _hadamard_kernel[(triton.cdiv(rows, br),)](
        x2,
        out,
        h,
        rows,
        x2.stride(0),
        x2.stride(1),
        s,
        N=n,
        LOG_N=n.bit_length() - 1,
        BLOCK_R=br,
        USE_DOT=impl == "dot",
        IS_BF16=x.dtype == torch.bfloat16,
        HW_CAST=x.is_cuda,
        num_warps=max(1, min(8, br * n // 512)),
        enable_fp_fusion=False,
    )
    return out
