"""One Triton kernel for mHC pre (`ref/mhc.py::mhc_pre`): RMS-scaled mixing logits, gates, Sinkhorn, stream mix.

Each program owns BLOCK_T tokens (so every fn tile read from L2 serves BLOCK_T tokens):

* pass 1 streams the token's hc*d values (one stream i at a time, BLOCK_K columns per step) and accumulates
  the sum of squares and `x_flat @ fn^T` with an fp32 (IEEE, no TF32) `tl.dot` into a padded [BLOCK_T, NP]
  accumulator, NP = 2*HC*HC. The fn rows are loaded into padded slots so that the accumulator reshapes to
  [BLOCK_T, 2, HC, HC]: half 0 holds pre logits (row 0) and post logits (row 1), rows 2.. are zero; half 1 is
  the HC x HC comb logit matrix (fn row 2*HC + HC*i + j -> slot HC*HC + HC*i + j).
* the gates and the Sinkhorn projection run in registers on [BLOCK_T, HC, HC] tiles.
* pass 2 re-reads x and writes x_in = sum_i pre[i] * x[:, i, :] in x.dtype, BLOCK_D columns per step.

All math is fp32. The launcher does no host sync (CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["mhc_pre_triton"]

BLOCK_T = 16  # tokens per program; tl.dot needs >= 16 rows
BLOCK_K = 128  # columns of one stream per pass-1 step (capped at next_pow2(d))
BLOCK_D = 128  # columns per pass-2 step (capped at next_pow2(d))
NUM_WARPS = 4


@triton.jit
def _mhc_pre_kernel(
    x_ptr, fn_ptr, scale_ptr, base_ptr, xin_ptr, post_ptr, comb_ptr,
    T, stride_xt, stride_xh, stride_xd, stride_fn_r, stride_fn_c,
    rms_eps, hc_eps, sinkhorn_iters,
    HC: tl.constexpr, D: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """x [T, HC, D] (strided) -> xin [T, D] (contiguous, x dtype), post [T, HC], comb [T, HC, HC] fp32."""
    NP: tl.constexpr = 2 * HC * HC
    pid = tl.program_id(0)
    tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    tmask = tok < T
    x_tok = x_ptr + tok.to(tl.int64) * stride_xt  # [BT] row pointers

    # padded accumulator slot p -> fn row (or -1 for a zero slot)
    p = tl.arange(0, NP)
    fn_row = tl.where(p < 2 * HC, p, tl.where(p >= HC * HC, p - HC * HC + 2 * HC, -1))
    fn_rmask = fn_row >= 0
    fn_rows_ptr = fn_ptr + tl.maximum(fn_row, 0).to(tl.int64) * stride_fn_r  # [NP]

    # ---- pass 1: sum of squares and the NP dot products over the flattened hc*d axis
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_T, NP], dtype=tl.float32)
    sq = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    for i in tl.static_range(HC):
        for k0 in range(0, D, BLOCK_K):
            col = k0 + kk  # [BK] column inside stream i
            cmask = col < D
            xv = tl.load(
                x_tok[:, None] + i * stride_xh + col[None, :] * stride_xd,
                mask=tmask[:, None] & cmask[None, :], other=0.0,
            ).to(tl.float32)  # [BT, BK]
            fv = tl.load(
                fn_rows_ptr[None, :] + (i * D + col)[:, None].to(tl.int64) * stride_fn_c,
                mask=fn_rmask[None, :] & cmask[:, None], other=0.0,
            ).to(tl.float32)  # [BK, NP]
            sq += xv * xv
            acc = tl.dot(xv, fv, acc, input_precision="ieee")
    ms = tl.sum(sq, axis=1) / (HC * D)  # [BT]
    r = 1.0 / tl.sqrt(ms + rms_eps)
    m4 = tl.reshape(acc * r[:, None], [BLOCK_T, 2, HC, HC])

    # ---- split the logits: half 0 -> pre (row 0), post (row 1); half 1 -> comb
    h4 = tl.arange(0, 2)[None, :, None, None]
    pp = tl.sum(tl.where(h4 == 0, m4, 0.0), axis=1)  # [BT, HC, HC]
    cl = tl.sum(tl.where(h4 == 1, m4, 0.0), axis=1)  # [BT, HC, HC]
    ri = tl.arange(0, HC)[None, :, None]  # row index of an [.., HC, HC] tile
    cj = tl.arange(0, HC)[None, None, :]  # column index
    pre_l = tl.sum(tl.where(ri == 0, pp, 0.0), axis=1)  # [BT, HC]
    post_l = tl.sum(tl.where(ri == 1, pp, 0.0), axis=1)  # [BT, HC]

    hh = tl.arange(0, HC)
    s0 = tl.load(scale_ptr).to(tl.float32)
    s1 = tl.load(scale_ptr + 1).to(tl.float32)
    s2 = tl.load(scale_ptr + 2).to(tl.float32)
    b_pre = tl.load(base_ptr + hh).to(tl.float32)
    b_post = tl.load(base_ptr + HC + hh).to(tl.float32)
    b_comb = tl.load(base_ptr + 2 * HC + ri * HC + cj).to(tl.float32)  # [1, HC, HC]

    pre = 1.0 / (1.0 + tl.exp(-(pre_l * s0 + b_pre[None, :]))) + hc_eps  # [BT, HC]
    post = 2.0 / (1.0 + tl.exp(-(post_l * s1 + b_post[None, :])))  # [BT, HC]

    # ---- Sinkhorn on [BT, HC, HC]: softmax rows + eps, columns, then (iters - 1) x (rows, columns)
    z = cl * s2 + b_comb
    e = tl.exp(z - tl.max(z, axis=2)[:, :, None])
    c = e / tl.sum(e, axis=2)[:, :, None] + hc_eps
    c = c / (tl.sum(c, axis=1)[:, None, :] + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        c = c / (tl.sum(c, axis=2)[:, :, None] + hc_eps)
        c = c / (tl.sum(c, axis=1)[:, None, :] + hc_eps)

    tok64 = tok.to(tl.int64)
    tl.store(post_ptr + tok64[:, None] * HC + hh[None, :], post, mask=tmask[:, None])
    tl.store(comb_ptr + tok64[:, None, None] * (HC * HC) + ri * HC + cj, c, mask=tmask[:, None, None])

    # ---- pass 2: x_in = sum_i pre[i] * x[:, i, :]
    dd = tl.arange(0, BLOCK_D)
    h3 = hh[None, :, None]  # [1, HC, 1]
    for d0 in range(0, D, BLOCK_D):
        col = d0 + dd
        cmask = col < D
        xv = tl.load(
            x_tok[:, None, None] + h3 * stride_xh + col[None, None, :] * stride_xd,
            mask=tmask[:, None, None] & cmask[None, None, :], other=0.0,
        ).to(tl.float32)  # [BT, HC, BD]
        y = tl.sum(xv * pre[:, :, None], axis=1)  # [BT, BD]
        tl.store(
            xin_ptr + tok64[:, None] * D + col[None, :],
            y.to(xin_ptr.dtype.element_ty), mask=tmask[:, None] & cmask[None, :],
        )


def mhc_pre_triton(
    x: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
    sinkhorn_iters: int = 20,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused mHC pre, same contract as `ref.mhc.mhc_pre`.

    x: [t, hc, d] bf16/fp16/fp32 (any strides); fn: [(2+hc)*hc, hc*d] (any float, read as fp32);
    scale: [3]; base: [(2+hc)*hc] (contiguous). hc must be a power of two >= 4 (V4: 4).
    Returns x_in [t, d] (x.dtype, contiguous), post [t, hc] fp32, comb [t, hc, hc] fp32.
    Shape checks only; no host sync, so it can be captured in a CUDA graph.
    """
    if x.dim() != 3:
        raise ValueError(f"x must be [t, hc, d], got shape {tuple(x.shape)}")
    t, hc, d = x.shape
    if hc < 4 or hc & (hc - 1):
        raise ValueError(f"hc must be a power of two >= 4 (tl.dot needs 2*hc*hc >= 16), got {hc}")
    if tuple(fn.shape) != ((2 + hc) * hc, hc * d):
        raise ValueError(f"fn must have shape {((2 + hc) * hc, hc * d)}, got {tuple(fn.shape)}")
    if scale.numel() < 3 or base.numel() != (2 + hc) * hc:
        raise ValueError(f"scale needs 3 and base {(2 + hc) * hc} values, got {scale.numel()} and {base.numel()}")
    scale, base = scale.contiguous(), base.contiguous()
    x_in = torch.empty((t, d), dtype=x.dtype, device=x.device)
    post = torch.empty((t, hc), dtype=torch.float32, device=x.device)
    comb = torch.empty((t, hc, hc), dtype=torch.float32, device=x.device)
    if t == 0:
        return x_in, post, comb
    dp2 = triton.next_power_of_2(d)
    grid = (triton.cdiv(t, BLOCK_T),)
    _mhc_pre_kernel[grid](
        x, fn, scale, base, x_in, post, comb,
        t, x.stride(0), x.stride(1), x.stride(2), fn.stride(0), fn.stride(1),
        float(rms_eps), float(hc_eps), int(sinkhorn_iters),
        HC=hc, D=d, BLOCK_T=BLOCK_T, BLOCK_K=max(16, min(BLOCK_K, dp2)), BLOCK_D=min(BLOCK_D, dp2),
        num_warps=NUM_WARPS,
    )
    return x_in, post, comb
