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
tolerances of its tests apply.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_mhc import DOT_PRECISION, MIX_BLOCK_K, _check_x, _split, _target_programs

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
SPIN_LIMIT = 1 << 22  # polls before a finish program gives up (seconds; only a broken dispatch order gets there)


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
        seen = tl.atomic_add(cnt_ptr + pid_t, 0, sem="acquire", scope="gpu")
        rounds = seen * 0
        while (seen < S) & (rounds < spin_limit):
            seen = tl.atomic_add(cnt_ptr + pid_t, 0, sem="acquire", scope="gpu")
            rounds += 1
        _finish_block(
            part_ptr, sq_ptr, x_ptr, scale_ptr, base_ptr, xin_ptr, post_ptr, comb_ptr, T, S, pid_t, stride_xt,
            stride_xh, stride_xd, rms_eps, hc_eps, sinkhorn_iters, f * d_per_fin, d_per_fin, f, HC, D,
            BLOCK_T, BLOCK_D, BLOCK_S, HEAD,
        )  # fmt: skip


@triton.jit
def _mix_partials(
    x_ptr,
    fn_ptr,
    part_ptr,
    sq_ptr,
    T,
    pid_t,
    pid_s,
    stride_xt,
    stride_xh,
    stride_xd,
    stride_fn_r,
    stride_fn_c,
    k_per_split,
    HC: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    HEAD: tl.constexpr,
):
    """Split pid_s of token block pid_t: part[pid_s, tokens] = x_flat @ fn_slots^T, sq = sum(x^2) (as the mix
    kernel of triton_mhc.py, whose docstring explains the padded slots)."""
    NP: tl.constexpr = 2 * HC * HC
    K: tl.constexpr = HC * D
    tok = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tok < T
    x_tok = x_ptr + tok.to(tl.int64) * stride_xt
    p = tl.arange(0, NP)
    if HEAD:
        fn_row = tl.where(p < HC, p, -1)
    else:
        fn_row = tl.where(p < 2 * HC, p, tl.where(p >= HC * HC, p - HC * HC + 2 * HC, -1))
    fn_rows_ptr = fn_ptr + tl.maximum(fn_row, 0).to(tl.int64) * stride_fn_r
    fn_rmask = fn_row >= 0
    kk = tl.arange(0, BLOCK_K)
    k_lo = pid_s * k_per_split
    acc = tl.zeros([BLOCK_T, NP], dtype=tl.float32)
    sq = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, k_per_split, BLOCK_K):
        k = k_lo + k0 + kk
        kmask = k < K
        xr = tl.load(
            x_tok[:, None] + ((k // D) * stride_xh + (k % D) * stride_xd)[None, :],
            mask=tmask[:, None] & kmask[None, :],
            other=0.0,
        )
        fv = tl.load(
            fn_rows_ptr[None, :] + k[:, None].to(tl.int64) * stride_fn_c,
            mask=fn_rmask[None, :] & kmask[:, None],
            other=0.0,
        ).to(tl.float32)
        xv = xr.to(tl.float32)
        sq += xv * xv
        if PRECISION == "bf16x3":
            f1 = fv.to(tl.bfloat16)
            r1 = fv - f1.to(tl.float32)
            f2 = r1.to(tl.bfloat16)
            f3 = (r1 - f2.to(tl.float32)).to(tl.bfloat16)
            acc = tl.dot(xr, f3, acc)
            acc = tl.dot(xr, f2, acc)
            acc = tl.dot(xr, f1, acc)
        else:
            acc = tl.dot(xv, fv, acc, input_precision=PRECISION)
    row = pid_s * T + tok.to(tl.int64)
    tl.store(part_ptr + row[:, None] * NP + p[None, :], acc, mask=tmask[:, None])
    tl.store(sq_ptr + row, tl.sum(sq, axis=1), mask=tmask)


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
    NP: tl.constexpr = 2 * HC * HC
    tok = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tok < T
    tok64 = tok.to(tl.int64)
    p = tl.arange(0, NP)
    sb = tl.arange(0, BLOCK_S)
    acc3 = tl.zeros([BLOCK_S, BLOCK_T, NP], dtype=tl.float32)
    ss2 = tl.zeros([BLOCK_S, BLOCK_T], dtype=tl.float32)
    for s0 in range(0, S, BLOCK_S):
        row = (s0 + sb)[:, None].to(tl.int64) * T + tok64[None, :]
        rmask = ((s0 + sb) < S)[:, None] & tmask[None, :]
        # .cg: from L2 (other SMs wrote them), never a stale L1 line
        acc3 += tl.load(
            part_ptr + row[:, :, None] * NP + p[None, None, :], mask=rmask[:, :, None], other=0.0, cache_modifier=".cg"
        )
        ss2 += tl.load(sq_ptr + row, mask=rmask, other=0.0, cache_modifier=".cg")
    acc = tl.sum(acc3, axis=0)
    r = 1.0 / tl.sqrt(tl.sum(ss2, axis=0) / (HC * D) + rms_eps)
    m4 = tl.reshape(acc * r[:, None], [BLOCK_T, 2, HC, HC])
    h4 = tl.arange(0, 2)[None, :, None, None]
    pp = tl.sum(tl.where(h4 == 0, m4, 0.0), axis=1)
    ri = tl.arange(0, HC)[None, :, None]
    cj = tl.arange(0, HC)[None, None, :]
    hh = tl.arange(0, HC)
    pre_l = tl.sum(tl.where(ri == 0, pp, 0.0), axis=1)
    sc0 = tl.load(scale_ptr).to(tl.float32)
    b_pre = tl.load(base_ptr + hh).to(tl.float32)
    pre = 1.0 / (1.0 + tl.exp(-(pre_l * sc0 + b_pre[None, :]))) + hc_eps
    if not HEAD:
        post_l = tl.sum(tl.where(ri == 1, pp, 0.0), axis=1)
        s1 = tl.load(scale_ptr + 1).to(tl.float32)
        s2 = tl.load(scale_ptr + 2).to(tl.float32)
        b_post = tl.load(base_ptr + HC + hh).to(tl.float32)
        b_comb = tl.load(base_ptr + 2 * HC + ri * HC + cj).to(tl.float32)
        post = 2.0 / (1.0 + tl.exp(-(post_l * s1 + b_post[None, :])))
        cl = tl.sum(tl.where(h4 == 1, m4, 0.0), axis=1)
        z = cl * s2 + b_comb
        e = tl.exp(z - tl.max(z, axis=2)[:, :, None])
        c = e / tl.sum(e, axis=2)[:, :, None] + hc_eps
        c = c / (tl.sum(c, axis=1)[:, None, :] + hc_eps)
        for _ in range(sinkhorn_iters - 1):
            c = c / (tl.sum(c, axis=2)[:, :, None] + hc_eps)
            c = c / (tl.sum(c, axis=1)[:, None, :] + hc_eps)
        gmask = tmask & ((tok * 0 + part_idx) == 0)  # a tensor mask (the interpreter needs one)
        tl.store(post_ptr + tok64[:, None] * HC + hh[None, :], post, mask=gmask[:, None])
        tl.store(comb_ptr + tok64[:, None, None] * (HC * HC) + ri * HC + cj, c, mask=gmask[:, None, None])
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


def _fused_block_t(t: int, max_bt: int) -> int:
    """Tokens per block: 16 (the tl.dot minimum) for decode, up to the config's max_bt."""
    return max(16, min(max_bt, triton.next_power_of_2(max(t, 1))))


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
    bt = _fused_block_t(t, max_bt)
    bk = min(MIX_BLOCK_K, max(16, triton.next_power_of_2(hc * d)))
    n_tb = triton.cdiv(t, bt)
    if (
        n_tb > MAX_GRID_Y and not n_fin
    ):  # token blocks run on the grid's second axis (splits first: they dispatch together)
        raise ValueError(f"impl='fused' takes at most {MAX_GRID_Y * max_bt} tokens with config {config!r}, got {t}")
    n_chunks = triton.cdiv(hc * d, bk)
    # always max_splits splits (not fewer at large t, as the default mix does): the S splits of a block run
    # together, so only ~(resident programs / S) blocks are in flight and their x stays in L2 for the finish
    ks, k_chunks = _split(1, n_chunks, max_splits, max_splits)
    if t <= 64:  # launch-bound decode: as many splits as the default mix (it fills the GPU with one block)
        ks, k_chunks = _split(n_tb, n_chunks, _target_programs(x.device), 64)
    prec = DOT_PRECISION
    if prec == "auto":
        prec = "bf16x3" if x.dtype == torch.bfloat16 and x.device.type == "cuda" else "tf32x3"
    dev = x.device
    part = torch.empty((ks, t, 2 * hc * hc), dtype=torch.float32, device=dev)
    sq = torch.empty((ks, t), dtype=torch.float32, device=dev)
    cnt = torch.zeros(n_tb, dtype=torch.int32, device=dev)
    bd = min(block_d, max(16, triton.next_power_of_2(d)))
    if n_fin:
        d_per_fin = triton.cdiv(triton.cdiv(d, n_fin), bd) * bd  # a multiple of BLOCK_D
        n_fin = triton.cdiv(d, d_per_fin)
        _mhc_spin_kernel[(n_tb * (ks + n_fin),)](
            x, fn, part, sq, cnt, scale, base, *out, t, ks, n_fin, x.stride(0), x.stride(1), x.stride(2),
            fn.stride(0), fn.stride(1), k_chunks * bk, d_per_fin, SPIN_LIMIT, float(rms_eps), float(hc_eps),
            int(sinkhorn_iters), HC=hc, D=d, BLOCK_T=bt, BLOCK_K=bk, BLOCK_D=bd, BLOCK_S=block_s, PRECISION=prec,
            HEAD=head, num_warps=warps,
        )  # fmt: skip
        return
    _mhc_fused_kernel[(ks, n_tb)](
        x, fn, part, sq, cnt, scale, base, *out, t, ks, x.stride(0), x.stride(1), x.stride(2), fn.stride(0),
        fn.stride(1), k_chunks * bk, float(rms_eps), float(hc_eps), int(sinkhorn_iters), HC=hc, D=d, BLOCK_T=bt,
        BLOCK_K=bk, BLOCK_D=bd, BLOCK_S=block_s, PRECISION=prec,
        HEAD=head, num_warps=warps,
    )  # fmt: skip
