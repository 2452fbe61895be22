"""Triton `mhc_post` and `mhc_head` (reference: `ref/mhc.py`), one pass over the residual streams each.

mhc_post: new[t, j, :] = post[t, j] * f[t, :] + sum_i comb[t, i, j] * residual[t, i, :] (fp32 math, output in
residual's dtype). The reference's einsum + multiply + add + cast is five or six kernels and three round trips
of [t, hc, d]; here one program owns a [hc, BLOCK_D] tile of one token: reads f once and the hc residual rows
once, writes hc rows (the floor: 2 * hc + 1 rows of d moved per token).

mhc_head's stream weights depend on an RMS-normalised dot over the whole [hc * d] row. For hc >= 4 the API runs
`triton_mhc.mhc_head_triton` (mhc_pre's kernels); for hc = 1, 2 (too few fn rows for tl.dot) the weights come
from the reference and the kernel here does the weighted sum out[t, :] = sum_i pre[t, i] * x[t, i, :].
No host syncs: CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["mhc_post_triton", "mhc_weighted_sum_triton"]

BLOCK_D = 512


@triton.jit
def _mhc_post_kernel(f_ptr, r_ptr, post_ptr, comb_ptr, out_ptr, D, HC: tl.constexpr, BLOCK_D: tl.constexpr):
    """f [T, D], r/out [T, HC, D], post [T, HC], comb [T, HC, HC] (all contiguous)."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    h = tl.arange(0, HC)
    f = tl.load(f_ptr + t * D + d, mask=dmask, other=0.0).to(tl.float32)  # [BD]
    rows = r_ptr + t * HC * D + h[:, None] * D + d[None, :]  # [HC, BD]
    r = tl.load(rows, mask=dmask[None, :], other=0.0).to(tl.float32)
    post = tl.load(post_ptr + t * HC + h).to(tl.float32)  # [HC] (j)
    comb = tl.load(comb_ptr + t * HC * HC + h[:, None] * HC + h[None, :]).to(tl.float32)  # [HC i, HC j]
    mixed = tl.sum(comb[:, :, None] * r[:, None, :], axis=0)  # [HC j, BD]
    out = mixed + post[:, None] * f[None, :]
    o = out_ptr + t * HC * D + h[:, None] * D + d[None, :]
    tl.store(o, out.to(out_ptr.dtype.element_ty), mask=dmask[None, :])


@triton.jit
def _weighted_sum_kernel(x_ptr, w_ptr, out_ptr, D, HC: tl.constexpr, BLOCK_D: tl.constexpr):
    """x [T, HC, D], w [T, HC] fp32 -> out [T, D] = sum_i w[t, i] * x[t, i, :] (fp32 math)."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    h = tl.arange(0, HC)
    x = tl.load(x_ptr + t * HC * D + h[:, None] * D + d[None, :], mask=dmask[None, :], other=0.0).to(tl.float32)
    w = tl.load(w_ptr + t * HC + h).to(tl.float32)
    out = tl.sum(w[:, None] * x, axis=0)
    tl.store(out_ptr + t * D + d, out.to(out_ptr.dtype.element_ty), mask=dmask)


def _check_hc(hc: int) -> None:
    if hc < 1 or hc & (hc - 1):
        raise ValueError(f"residual: the stream count hc must be a power of two for the Triton path, got {hc}")


def mhc_post_triton(f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """f [t, d], residual [t, hc, d], post [t, hc], comb [t, hc, hc] -> [t, hc, d] in residual.dtype.

    Shapes are validated by the API; this launcher makes operands contiguous and checks the device.
    """
    check_runnable(f, residual, post, comb)
    t, hc, d = residual.shape
    _check_hc(hc)
    out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    if t == 0 or d == 0:
        return out
    f, residual, post, comb = (x.contiguous() for x in (f, residual, post, comb))
    grid = (t, triton.cdiv(d, BLOCK_D))
    _mhc_post_kernel[grid](f, residual, post, comb, out, d, HC=hc, BLOCK_D=BLOCK_D, num_warps=4)
    return out


def mhc_weighted_sum_triton(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [t, hc, d], w [t, hc] (fp32) -> [t, d] = sum_i w[:, i] * x[:, i] in x.dtype (fp32 math)."""
    check_runnable(x, w)
    t, hc, d = x.shape
    _check_hc(hc)
    out = torch.empty((t, d), dtype=x.dtype, device=x.device)
    if t == 0 or d == 0:
        return out
    x, w = x.contiguous(), w.contiguous()
    _weighted_sum_kernel[(t, triton.cdiv(d, BLOCK_D))](x, w, out, d, HC=hc, BLOCK_D=BLOCK_D, num_warps=4)
    return out
