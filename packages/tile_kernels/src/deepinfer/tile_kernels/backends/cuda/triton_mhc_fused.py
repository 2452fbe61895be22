"""One-launch Triton mHC pre / head (`impl="fused"`): x re-read from L2 right after the mix, not from HBM.

`triton_mhc.py` (the default, `impl="split"`) runs two launches, the mix over all tokens and then the finish,
so x [t, hc, d] (537 MB at 16,384 V4 tokens, 10x the 50 MB L2) comes from HBM twice. Here one launch does both:

* Program (s, b) (split s of the flattened hc*d axis, fastest-varying, so the S splits of token block b are
  dispatched together) computes the fp32 mix partials of BLOCK_T tokens over its slice exactly as
  `_mhc_mix_kernel` does (tensor-core dots, bf16x3 / tf32x3) and stores them.
* It then increments the block's arrival counter (a CTA barrier first, so all its warps' stores are ordered
  before the gpu-scope acq_rel atomic). The program that arrives last (old value S - 1) sums the S partials in
  split order (fixed: deterministic, whoever arrives last), forms the gates and the Sinkhorn projection as
  `_mhc_finish_kernel` does, and writes x_in = sum_i pre[i] * x[:, i, :] for the whole block: the block's
  BLOCK_T x hc x d elements were read by its S splits moments ago, so this re-read hits L2 (few blocks are in
  flight: ~resident programs / S).

One program finishes a whole block (BLOCK_T x hc x d re-read serially), so the `SPIN_CONFIGS` run
`_mhc_spin_kernel` instead: a 1-D grid of token blocks, each S mix programs followed by F finish programs; a
finish program polls the block's counter (acquire) until the S splits have arrived, then forms the gates and
writes its 1/F of the block's x_in columns. It waits only on programs of a lower grid index (dispatched before
it, never waiting themselves), and gives up after SPIN_LIMIT polls, so a broken dispatch order gives wrong
results, never a hang. The interpreter runs programs in grid order: the splits are done before the first poll.

Counters start at zero (one memset per call). No host sync: CUDA-graph safe. Math and results are those of
`triton_mhc.py` (same dots, same fp32 partial order per split, partials summed in the same order), so the
tolerances of its tests apply. The mix partials come from `triton_mhc._mix_partials` (the default mix kernel's
body); the gates, the spin wait and the launch shapes are in `triton_mhc_onelaunch.py`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_mhc import MIX_BLOCK_K, _check_x, _mix_partials
from .triton_mhc_onelaunch import (
    SPIN_LIMIT,
    _block_gates,
    _block_splits,
    _dot_precision,
    _scratch,
    _wait_arrivals,
)

__all__ = ["FUSED_CONFIGS", "SPIN_CONFIGS", "mhc_fused_triton"]


MAX_GRID_Y = 65535  # CUDA's limit on the grid's second axis
# name -> (tokens per block, most splits, warps, d columns per stream-sum step, partials summed per step);
# "default" is what impl="fused" runs without a config. Chosen without spills on sm_90 (ptxas -v of Triton 3.6,
# V4 shapes): 138-178 registers, one program per SM (two for bt64_s16).
FUSED_CONFIGS: dict[str, tuple[int, int, int, int, int]] = {
    "default": (32, 16, 8, 64, 4),
    "bt32_s32": (32, 32, 8, 64, 4),
    "bt16_s16": (16, 16, 8, 256, 8),
    "bt64_s16": (64, 16, 4, 16, 1),
}
# `_mhc_spin_kernel` configs: name -> (tokens per block, most splits, finish programs per block, warps, d columns
# per stream-sum step, partials summed per step)
SPIN_CONFIGS: dict[str, tuple[int, int, int, int, int, int]] = {
    "spin": (32, 16, 8, 8, 64, 4),
    "spin_bt64": (64, 16, 16, 4, 16, 1),
}


@triton.jit
def _mhc_fused_kernel(
    x_ptr,
    fn_ptr,
    part_ptr,
    sq_ptr,
    cnt_ptr,
    scale_ptr,
    base_ptr,
    xin_ptr,
    post_ptr,
    comb_ptr,
    T,
    S,
    stride_xt,
    stride_xh,
    stride_xd,
    stride_fn_r,
    stride_fn_c,
    k_per_split,
    rms_eps,
    hc_eps,
    sinkhorn_iters,
    HC: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PRECISION: tl.constexpr,
    HEAD: tl.constexpr,
):
    """x [T, HC, D] -> xin [T, D] (x dtype), post [T, HC], comb [T, HC, HC] fp32 (HEAD: xin only).

    part [S, T, 2*HC*HC] / sq [S, T] fp32 scratch; cnt [n_blocks] int32 zeros (arrivals per token block).
    """
    pid_s = tl.program_id(0)
    pid_t = tl.program_id(1)
    _mix_partials(
        x_ptr, fn_ptr, part_ptr, sq_ptr, T, pid_t, pid_s, stride_xt, stride_xh, stride_xd, stride_fn_r,
        stride_fn_c, k_per_split, HC, D, BLOCK_T, BLOCK_K, PRECISION, HEAD,
    )  # fmt: skip
    tl.debug_barrier()  # every warp's partial stores precede the release below
    arrived = tl.atomic_add(cnt_ptr + pid_t, 1, sem="acq_rel", scope="gpu")
    if arrived == S - 1:  # the block's last split: all S partials are visible
        _finish_block(
            part_ptr, sq_ptr, x_ptr, scale_ptr, base_ptr, xin_ptr, post_ptr, comb_ptr, T, S, pid_t, stride_xt,
            stride_xh, stride_xd, rms_eps, hc_eps, sinkhorn_iters, 0, D, pid_t * 0, HC, D, BLOCK_T, BLOCK_D, BLOCK_S,
            HEAD,
        )  # fmt: skip


@triton.jit
def _mhc_spin_kernel(
    x_ptr,
    fn_ptr,
    part_ptr,
    sq_ptr,
    cnt_ptr,
    scale_ptr,
    base_ptr,
    xin_ptr,
    post_ptr,
    comb_ptr,
    T,
    S,
    F,
    stride_xt,
    stride_xh,
    stride_xd,
    stride_fn_r,
    stride_fn_c,
    k_per_split,
    d_per_fin,
    spin_limit,
    rms_eps,
    hc_eps,
    sinkhorn_iters,
    HC: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PRECISION: tl.constexpr,
    HEAD: tl.constexpr,
):
    """`_mhc_fused_kernel` with the finish spread over F programs: a 1-D grid of token blocks, each S mix
    programs then F finish programs (finish program f: gates, and x_in columns [f * d_per_fin, ...)).

    A finish program polls the block's arrival counter until all S splits have arrived (acquire), so it waits
    only on programs with a lower grid index, which were dispatched before it and never wait themselves; the
    poll gives up after spin_limit rounds (wrong results, never a hang). Under the interpreter (programs run one
    by one in grid order) the splits are done before the first poll.
    """
    pid = tl.program_id(0)
    pid_t = pid // (S + F)
    r = pid % (S + F)
    if r < S:
        _mix_partials(
            x_ptr, fn_ptr, part_ptr, sq_ptr, T, pid_t, r, stride_xt, stride_xh, stride_xd, stride_fn_r,
            stride_fn_c, k_per_split, HC, D, BLOCK_T, BLOCK_K, PRECISION, HEAD,
        )  # fmt: skip
        tl.debug_barrier()  # every warp's partial stores precede the release below
        tl.atomic_add(cnt_ptr + pid_t, 1, sem="release", scope="gpu")
    else:
        f = r - S
        _wait_arrivals(cnt_ptr + pid_t, S, spin_limit)
        _finish_block(
            part_ptr, sq_ptr, x_ptr, scale_ptr, base_ptr, xin_ptr, post_ptr, comb_ptr, T, S, pid_t, stride_xt,
            stride_xh, stride_xd, rms_eps, hc_eps, sinkhorn_iters, f * d_per_fin, d_per_fin, f, HC, D,
            BLOCK_T, BLOCK_D, BLOCK_S, HEAD,
        )  # fmt: skip


@triton.jit
def _finish_block(
    part_ptr,
    sq_ptr,
    x_ptr,
    scale_ptr,
    base_ptr,
    xin_ptr,
    post_ptr,
    comb_ptr,
    T,
    S,
    pid_t,
    stride_xt,
    stride_xh,
    stride_xd,
    rms_eps,
    hc_eps,
    sinkhorn_iters,
    d_lo,
    d_len,
    part_idx,
    HC: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HEAD: tl.constexpr,
):
    """Token block pid_t: sum the S partials (split order), gates / Sinkhorn, post / comb (finish part part_idx
    0 only) and x_in columns [d_lo, d_lo + d_len)."""
    tok = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    pre = _block_gates(
        part_ptr, sq_ptr, scale_ptr, base_ptr, post_ptr, comb_ptr, T, S, tok, part_idx, rms_eps, hc_eps,
        sinkhorn_iters, HC, D, BLOCK_T, BLOCK_S, HEAD,
    )  # fmt: skip
    tmask = tok < T
    tok64 = tok.to(tl.int64)
    hh = tl.arange(0, HC)
    x_tok = x_ptr + tok64 * stride_xt
    dd = tl.arange(0, BLOCK_D)
    h3 = hh[None, :, None]
    for d0 in range(d_lo, d_lo + d_len, BLOCK_D):
        col = d0 + dd
        cmask = (col < D) & (col < d_lo + d_len)
        xv = tl.load(
            x_tok[:, None, None] + h3 * stride_xh + col[None, None, :] * stride_xd,
            mask=tmask[:, None, None] & cmask[None, None, :],
            other=0.0,
        ).to(tl.float32)
        y = tl.sum(xv * pre[:, :, None], axis=1)
        tl.store(
            xin_ptr + tok64[:, None] * D + col[None, :],
            y.to(xin_ptr.dtype.element_ty),
            mask=tmask[:, None] & cmask[None, :],
        )


def mhc_fused_triton(
    x: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    rms_eps: float,
    hc_eps: float,
    sinkhorn_iters: int,
    head: bool,
    config: str = "default",
) -> None:
    """One launch of the fused kernel: x [t, hc, d] (checked by the caller), fn rows as `triton_mhc`'s launchers
    take them, writes out = (x_in [t, d], post [t, hc], comb [t, hc, hc]) (head: x_in only)."""
    if config in SPIN_CONFIGS:
        max_bt, max_splits, n_fin, warps, block_d, block_s = SPIN_CONFIGS[config]
    elif config in FUSED_CONFIGS:
        (max_bt, max_splits, warps, block_d, block_s), n_fin = FUSED_CONFIGS[config], 0
    else:
        raise ValueError(f"config must be one of {sorted([*FUSED_CONFIGS, *SPIN_CONFIGS])}, got {config!r}")
    t, hc, d = _check_x(x)
    bt, bk, n_tb, ks, k_per_split = _block_splits(t, hc, d, x.device, max_bt, max_splits, MIX_BLOCK_K)
    # token blocks run on the grid's second axis (splits first: they dispatch together)
    if n_tb > MAX_GRID_Y and not n_fin:
        raise ValueError(f"impl='fused' takes at most {MAX_GRID_Y * max_bt} tokens with config {config!r}, got {t}")
    prec = _dot_precision(x)
    part, sq, cnt = _scratch(ks, t, hc, n_tb, x.device)
    bd = min(block_d, max(16, triton.next_power_of_2(d)))
    if n_fin:
        d_per_fin = triton.cdiv(triton.cdiv(d, n_fin), bd) * bd  # a multiple of BLOCK_D
        n_fin = triton.cdiv(d, d_per_fin)
        _mhc_spin_kernel[(n_tb * (ks + n_fin),)](
            x, fn, part, sq, cnt, scale, base, *out, t, ks, n_fin, x.stride(0), x.stride(1), x.stride(2),
            fn.stride(0), fn.stride(1), k_per_split, d_per_fin, SPIN_LIMIT, float(rms_eps), float(hc_eps),
            int(sinkhorn_iters), HC=hc, D=d, BLOCK_T=bt, BLOCK_K=bk, BLOCK_D=bd, BLOCK_S=block_s, PRECISION=prec,
            HEAD=head, num_warps=warps,
        )  # fmt: skip
        return
    _mhc_fused_kernel[(ks, n_tb)](
        x, fn, part, sq, cnt, scale, base, *out, t, ks, x.stride(0), x.stride(1), x.stride(2), fn.stride(0),
        fn.stride(1), k_per_split, float(rms_eps), float(hc_eps), int(sinkhorn_iters), HC=hc, D=d, BLOCK_T=bt,
        BLOCK_K=bk, BLOCK_D=bd, BLOCK_S=block_s, PRECISION=prec,
        HEAD=head, num_warps=warps,
    )  # fmt: skip
