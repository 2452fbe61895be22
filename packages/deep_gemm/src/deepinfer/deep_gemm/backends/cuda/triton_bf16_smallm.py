"""Triton bf16 GEMM for few rows (decode): out [m, n] = a [m, k] @ b [n, k]^T with m <= 64, memory-bound.

At decode batch sizes a linear layer is a weight stream: [n, k] bf16 bytes read once, a few rows of activations.
cuBLAS picks tile shapes made for large m and reaches about 0.7 TB/s there on an H200 (128 x 7168 x 2048 runs at
90 TFLOPS, i.e. 41 us for 29 MB of weights). This kernel gives every program a [BLOCK_N, k/split] slab of the
weight, so the grid always has enough programs in flight to keep HBM busy:

* swap AB: acc^T [BLOCK_N, BLOCK_M] += b [BLOCK_N, BLOCK_K] @ a^T [BLOCK_K, BLOCK_M] (the big operand is the
  MMA's M side; the few rows pad to BLOCK_M = 16..64);
* split-K when n alone gives too few programs (n / BLOCK_N < ~2 waves of 132 SMs): each split writes fp32
  partials [split, m, n] and a second kernel adds them in a fixed order (deterministic: no atomics, so the
  result of a row does not depend on the other rows or on timing);
* the split count depends on (n, k) only, never on m: a row's summation order is the same at every batch size.

The launcher never syncs with the host: CUDA-graph safe.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["MAX_M", "applies", "bf16_gemm_nt_smallm", "plan_split"]

MAX_M = 64  # beyond this cuBLAS's tiles are efficient
BLOCK_N = 64
BLOCK_K = 128
TARGET_PROGRAMS = 256  # about two waves of 132 SMs
NUM_WARPS = 4
NUM_STAGES = 4


@triton.jit
def _smallm_kernel(
    a_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    K_PER_SPLIT,
    stride_ag,
    stride_am,
    stride_bg,
    stride_bn,
    stride_os,
    stride_og,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """Program (j, s, g): group g, columns j*BLOCK_N.., k range [s*K_PER_SPLIT, (s+1)*K_PER_SPLIT). out: fp32
    partials indexed [s, m, g, n], or the bf16 result [m, g, n] when there is one split (stride_os = 0)."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_g = tl.program_id(2).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_mask = n < N
    m_mask = m < M
    k_lo = pid_s * K_PER_SPLIT
    b_rows = b_ptr + pid_g * stride_bg + n.to(tl.int64)[:, None] * stride_bn  # [BN, 1]
    a_cols = a_ptr + pid_g * stride_ag + m.to(tl.int64)[None, :] * stride_am  # [1, BM]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(k_lo, k_lo + K_PER_SPLIT, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_mask = kk < K
        w = tl.load(b_rows + kk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)  # [BN, BK]
        x = tl.load(a_cols + kk[:, None], mask=k_mask[:, None] & m_mask[None, :], other=0.0)  # [BK, BM]
        if DOT_FP32:
            acc = tl.dot(w.to(tl.float32), x.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, x, acc)
    o = out_ptr + pid_s.to(tl.int64) * stride_os + pid_g * stride_og + m.to(tl.int64)[None, :] * stride_om
    o = o + n[:, None]
    tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


@triton.jit
def _sum_splits_kernel(ws_ptr, out_ptr, MN, S: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = bf16(sum_s ws[s, i]) over the flattened [M, N], splits added in order 0..S-1."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(S):
        acc += tl.load(ws_ptr + s * MN + i, mask=mask, other=0.0)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=mask)


def plan_split(n: int, k: int, block_n: int = BLOCK_N, block_k: int = BLOCK_K) -> int:
    """Split-K factor for an [n, k] weight: a power of two, enough programs for ~2 waves, >= 1 k-block each."""
    n_blocks = triton.cdiv(n, block_n)
    k_blocks = triton.cdiv(k, block_k)
    split = 1
    while n_blocks * split < TARGET_PROGRAMS and split * 2 <= k_blocks:
        split *= 2
    return split


def applies(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """CUDA bf16 operands and output (plain or grouped form), 1 <= m <= MAX_M, unit inner strides, contiguous out,
    and opted in with DEEPINFER_DEEP_GEMM_SMALLM=1. Off by default: on the H200 (GPU time from CUDA-graph replays,
    benchmarks/results/2026-11-30-bench-deep_gemm.json) it ran 0.6-1.05x cuBLAS on V4's decode shapes (cuBLAS
    reaches 1.1-2.8 TB/s there; an earlier eager timing that suggested otherwise was measuring launch overhead)."""
    return (
        a.is_cuda
        and a.dtype == b.dtype == out.dtype == torch.bfloat16
        and 1 <= a.shape[0] <= MAX_M
        and a.stride(-1) == 1
        and b.stride(-1) == 1
        and out.is_contiguous()
        and os.environ.get("DEEPINFER_DEEP_GEMM_SMALLM", "0") == "1"
    )


def bf16_gemm_nt_smallm(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, split: int | None = None, dot_fp32: bool | None = None
) -> torch.Tensor:
    """out [m, n] = a [m, k] @ b [n, k]^T (bf16 in, fp32 accumulation, bf16 out); m <= MAX_M. Returns out.

    Grouped form: a [m, g, k], b [g, n, k], out [m, g, n] contiguous: out[:, i] = a[:, i] @ b[i]^T (V4's grouped
    output projection). split: split-K factor (power of two; None: `plan_split(n * g, k)`). dot_fp32: fp32 dot
    operands (None: only in Triton's CPU interpreter, whose bf16 dot is wrong).
    """
    if a.dim() == 2:
        _launch(a[:, None], b[None], out[:, None], split, dot_fp32)
    else:
        _launch(a, b, out, split, dot_fp32)
    return out


def _launch(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, split: int | None, dot_fp32: bool | None) -> None:
    """a [m, g, k], b [g, n, k], out [m, g, n]: views of the caller's tensors, written in place."""
    m, g, k = a.shape
    n = b.shape[1]
    if not 1 <= m <= MAX_M:
        raise ValueError(f"a: expected 1..{MAX_M} rows for the small-m kernel, got {m}")
    split = plan_split(n * g, k) if split is None else split
    if split < 1 or split & (split - 1):
        raise ValueError(f"split: expected a power of two >= 1, got {split}")
    if dot_fp32 is None:
        dot_fp32 = os.environ.get("TRITON_INTERPRET", "0") == "1"
    block_m = max(16, triton.next_power_of_2(m))
    k_per_split = triton.cdiv(triton.cdiv(k, split), BLOCK_K) * BLOCK_K
    grid = (triton.cdiv(n, BLOCK_N), split, g)
    meta = dict(BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, DOT_FP32=bool(dot_fp32))
    meta.update(num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    strides = (a.stride(1), a.stride(0), b.stride(0), b.stride(1))
    if split == 1:
        _smallm_kernel[grid](a, b, out, m, n, k, k_per_split, *strides, 0, out.stride(1), out.stride(0), **meta)
        return
    ws = torch.empty((split, m, g, n), dtype=torch.float32, device=a.device)
    _smallm_kernel[grid](a, b, ws, m, n, k, k_per_split, *strides, ws.stride(0), ws.stride(2), ws.stride(1), **meta)
    total, block = m * g * n, 1024
    _sum_splits_kernel[(triton.cdiv(total, block),)](ws, out, total, S=split, BLOCK=block, num_warps=4)
