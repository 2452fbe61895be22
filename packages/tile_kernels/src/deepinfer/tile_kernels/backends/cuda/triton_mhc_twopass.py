"""One-launch Triton mHC pre / head that keeps every program busy (`impl="twopass_l2"`; not the default).

Why the earlier one-launch kernels (`triton_mhc_fused.py`) lost to the two launches of `triton_mhc.py`: one program
(or F spinning programs) finished a whole token block after its S mix programs, and that finish is a serial loop
of dependent loads, so it ran at memory latency while the rest of the SM slots waited or idled.

The mix needs the whole hc*d row of a token before any weight is known, so x must be read twice; the goal is the
second read from L2. Here every program does the same two jobs, one after the other, with no wait in between
in the steady state:

1. mix unit (b, s): the fp32 `x_flat @ fn^T` partials and sum(x^2) of token block b over hc*d slice s (as
   `_mhc_mix_kernel`: tensor-core dots, bf16x3 / tf32x3), then a release increment of block b's counter;
2. finish unit (b - LAG, s): polls (acquire) until block b - LAG's S splits have arrived (long done in the
   steady state: LAG blocks were dispatched since), sums its partials in split order, forms the gates (and
   Sinkhorn: pre only) and writes x_in columns [s * d_per_fin, (s + 1) * d_per_fin) of that block; finish unit
   0 also stores post and comb.

Program p = b * S + s over a 1-D grid of (n_blocks + LAG) * S programs (the first LAG blocks' programs only mix,
the last LAG only finish). A program waits only on mix units of lower grid index, dispatched before it and never
waiting themselves, and gives up after SPIN_LIMIT polls (wrong results, never a hang); the interpreter runs
programs in grid order, so there the splits are always done. Between block b's first read (its mix) and its
re-read (the finish, LAG blocks later) the GPU reads about LAG more blocks of x from HBM (and writes their x_in):
a config's LAG times its block bytes (BLOCK_T * hc * d * 2 B, 1 MB at 32 V4 tokens) is chosen to stay well under
the 50 MB L2, and about the number of blocks in flight (resident programs / S), so the finish rarely polls twice.

Configs with S == 1 and LAG == 0 ("self_*") are the plain "each program re-reads its own block" design: program b
mixes its BLOCK_T tokens over all of hc*d and at once re-reads them (no cross-program wait). BLOCK_T cannot go
below 16 (tl.dot's minimum M), so its block is 512 KB and 132+ resident programs exceed L2; and each program
reads the whole fn (1.5 MB fp32 at V4) from L2 for only 16 tokens. It is measured for the comparison.

PREFETCH configs load the finish's x tiles one step ahead. EVICT configs add L2 eviction hints: the mix loads x
with evict_last (keep it for the re-read), the finish with evict_first (its last use). Math and results are those
of `triton_mhc_fused.py` (same dots, same fp32 partial order per split, partials summed in split order), so the
tolerances of `test_mhc_triton.py` apply; the default config has the fused default's splits, so its results are
bit-identical to it. Counters start at zero (one memset per call); no host sync: CUDA-graph safe.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .triton_mhc import DOT_PRECISION, _check_x, _split, _target_programs

__all__ = ["TWOPASS_CONFIGS", "TwopassConfig", "mhc_twopass_triton"]


class TwopassConfig(NamedTuple):
    """A named launch configuration of `_mhc_twopass_kernel` (see TWOPASS_CONFIGS)."""

    block_t: int  # tokens per block (>= 16: tl.dot's minimum M)
    splits: int  # S: mix units (hc*d slices) = finish units (d slices) per block
    lag: int  # finish block b - lag after mixing block b (0 only with S = 1)
    warps: int
    stages: int  # software-pipeline stages of the mix loop (cp.async)
    block_k: int  # hc*d columns per mix step
    block_d: int  # d columns per stream-sum step
    block_s: int  # partials summed per step
    evict: bool  # x loaded evict_last by the mix, evict_first by the finish
    maxnreg: int  # register cap (0: none)
    prefetch: bool  # finish loads its x tiles one step ahead, the first before the partial sums


# "default" is what impl="twopass_l2" runs without a config. Not GPU-run yet (prepared in session 4): the next
# session's benchmark picks among them. ptxas -v of Triton 3.6 at V4 shapes: uncapped, 8 warps need 168 registers
# at BLOCK_K = BLOCK_D = 64 (one program per SM; 255 with spills at 128); capped at 128, two programs of 8 warps
# (or four of 4) fit an SM with 44-164 bytes of spills. Blocks in flight ~ resident programs / S (~16 at 264
# programs, S = 16); LAG is about that, so the finish rarely waits, and LAG * 1 MB (+ x_in writes) is the L2 reuse
# distance.
_C = TwopassConfig
TWOPASS_CONFIGS: dict[str, TwopassConfig] = {
    "default": _C(32, 16, 16, 8, 3, 64, 64, 4, False, 128, False),
    "prefetch": _C(32, 16, 16, 8, 3, 64, 64, 4, False, 128, True),
    "evict": _C(32, 16, 16, 8, 3, 64, 64, 4, True, 128, False),
    "lag8": _C(32, 16, 8, 8, 3, 64, 64, 4, False, 128, False),
    "s8_lag24": _C(32, 8, 24, 8, 3, 64, 64, 4, False, 128, False),
    "w4_lag24": _C(32, 16, 24, 4, 3, 64, 64, 2, False, 128, False),
    "nocap": _C(32, 16, 16, 8, 3, 64, 64, 4, False, 0, False),
    "bt64": _C(64, 16, 10, 8, 3, 64, 64, 2, False, 128, False),
    "self_bt16": _C(16, 1, 0, 4, 3, 64, 64, 1, False, 128, False),
}
SPIN_LIMIT = 1 << 22  # polls before a finish unit gives up (seconds; only a broken dispatch order gets there)


@triton.jit
def _mhc_twopass_kernel(
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
    n_blocks,
    lag,
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
    MIX_EVICT: tl.constexpr,
    FIN_EVICT: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """x [T, HC, D] -> xin [T, D] (x dtype), post [T, HC], comb [T, HC, HC] fp32 (HEAD: xin only).

    part [S, T, 2*HC*HC] / sq [S, T] fp32 scratch; cnt [n_blocks] int32 zeros. Program b * S + s: mix unit
    (b, s) if b < n_blocks, then finish unit (b - lag, s) if b >= lag.
    """
    pid = tl.program_id(0)
    b = pid // S
    s = pid % S
    if b < n_blocks:
        _mix_unit(
            x_ptr, fn_ptr, part_ptr, sq_ptr, T, b, s, stride_xt, stride_xh, stride_xd, stride_fn_r, stride_fn_c,
            k_per_split, HC, D, BLOCK_T, BLOCK_K, PRECISION, HEAD, MIX_EVICT,
        )  # fmt: skip
        tl.debug_barrier()  # every warp's partial stores precede the release below
        tl.atomic_add(cnt_ptr + b, 1, sem="release", scope="gpu")
    bf = b - lag
    if bf >= 0:
        seen = tl.atomic_add(cnt_ptr + bf, 0, sem="acquire", scope="gpu")
        rounds = seen * 0
        while (seen < S) & (rounds < spin_limit):
            seen = tl.atomic_add(cnt_ptr + bf, 0, sem="acquire", scope="gpu")
            rounds += 1
        _finish_unit(
            part_ptr, sq_ptr, x_ptr, scale_ptr, base_ptr, xin_ptr, post_ptr, comb_ptr, T, S, bf, s, stride_xt,
            stride_xh, stride_xd, d_per_fin, rms_eps, hc_eps, sinkhorn_iters, HC, D, BLOCK_T, BLOCK_D, BLOCK_S,
            HEAD, FIN_EVICT, PREFETCH,
        )  # fmt: skip


@triton.jit
def _mix_unit(
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
    EVICT: tl.constexpr,
):
    """Split pid_s of token block pid_t: part[pid_s, tokens] = x_flat @ fn_slots^T, sq = sum(x^2) (the padded
    slots of `triton_mhc.py`'s mix kernel; the x loads carry the eviction hint EVICT, "" for none)."""
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
            eviction_policy=EVICT,
        )
        fv = tl.load(
            fn_rows_ptr[None, :] + k[:, None].to(tl.int64) * stride_fn_c,
            mask=fn_rmask[None, :] & kmask[:, None],
            other=0.0,
        ).to(tl.float32)
        xv = xr.to(tl.float32)
        sq += xv * xv
        if PRECISION == "bf16x3":  # x is bf16: fn = f1 + f2 + f3 in bf16, each product exact in fp32
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
def _finish_unit(
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
    part_idx,
    stride_xt,
    stride_xh,
    stride_xd,
    d_per_fin,
    rms_eps,
    hc_eps,
    sinkhorn_iters,
    HC: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HEAD: tl.constexpr,
    EVICT: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """Token block pid_t, finish unit part_idx: sum the S partials (split order), gates / Sinkhorn, post / comb
    (unit 0 only) and x_in columns [part_idx * d_per_fin, (part_idx + 1) * d_per_fin) (as `_finish_block` of
    `triton_mhc_fused.py`, with the x re-read carrying the eviction hint EVICT)."""
    NP: tl.constexpr = 2 * HC * HC
    tok = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tok < T
    tok64 = tok.to(tl.int64)
    p = tl.arange(0, NP)
    hh = tl.arange(0, HC)
    x_tile = x_ptr + tok64[:, None, None] * stride_xt + hh[None, :, None] * stride_xh  # [BT, HC, 1]
    dd = tl.arange(0, BLOCK_D)
    d_lo = part_idx * d_per_fin
    d_hi = tl.minimum(d_lo + d_per_fin, D)
    if PREFETCH:  # x tiles one step ahead, the first before the partial sums (x needs no acquire), so each load's
        # L2 latency overlaps the previous step's work (Triton 3.6 pipelines only loops that feed a tl.dot)
        col = d_lo + dd
        xr = tl.load(
            x_tile + col[None, None, :] * stride_xd,
            mask=tmask[:, None, None] & (col < d_hi)[None, None, :],
            other=0.0,
            eviction_policy=EVICT,
        )
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
    for d0 in range(d_lo, d_hi, BLOCK_D):
        col = d0 + dd
        if PREFETCH:
            nxt = col + BLOCK_D
            xn = tl.load(
                x_tile + nxt[None, None, :] * stride_xd,
                mask=tmask[:, None, None] & (nxt < d_hi)[None, None, :],
                other=0.0,
                eviction_policy=EVICT,
            )  # the next step's tile (all masked on the last step)
            xv = xr.to(tl.float32)
            xr = xn
        else:
            xv = tl.load(
                x_tile + col[None, None, :] * stride_xd,
                mask=tmask[:, None, None] & (col < d_hi)[None, None, :],
                other=0.0,
                eviction_policy=EVICT,
            ).to(tl.float32)
        y = tl.sum(xv * pre[:, :, None], axis=1)
        tl.store(
            xin_ptr + tok64[:, None] * D + col[None, :],
            y.to(xin_ptr.dtype.element_ty),
            mask=tmask[:, None] & (col < d_hi)[None, :],
        )


def _twopass_shape(t: int, hc: int, d: int, dev: torch.device, config: str) -> tuple[int, ...]:
    """(bt, n_blocks, splits, k_per_split, d_per_fin, lag, block_k, block_d) for x [t, hc, d] and a config.

    Splits: the config's S (always that many at large t: S units of a block run together, so only ~resident
    programs / S blocks are in flight); at t <= 64 (launch-bound decode) as many as the default mix. The finish
    units split d the same S ways (d_per_fin a multiple of BLOCK_D; units past d only form the gates). lag >= 1
    whenever S > 1 (a unit must never wait on a split of higher grid index), and <= n_blocks (no idle programs).
    """
    cfg = TWOPASS_CONFIGS[config]
    max_bt, max_splits, lag, block_k, block_d = cfg.block_t, cfg.splits, cfg.lag, cfg.block_k, cfg.block_d
    bt = max(16, min(max_bt, triton.next_power_of_2(max(t, 1))))
    bk = min(block_k, max(16, triton.next_power_of_2(hc * d)))
    n_tb = triton.cdiv(t, bt)
    n_chunks = triton.cdiv(hc * d, bk)
    ks, k_chunks = _split(1, n_chunks, max_splits, max_splits)
    if t <= 64:
        ks, k_chunks = _split(n_tb, n_chunks, _target_programs(dev), 64)
    bd = min(block_d, max(16, triton.next_power_of_2(d)))
    d_per_fin = triton.cdiv(triton.cdiv(d, ks), bd) * bd
    lag = min(max(lag, 1 if ks > 1 else 0), n_tb)
    return bt, n_tb, ks, k_chunks * bk, d_per_fin, lag, bk, bd


def mhc_twopass_triton(
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
    """One launch of `_mhc_twopass_kernel`: x [t, hc, d] (checked by the caller), fn rows as `triton_mhc`'s
    launchers take them; writes out = (x_in [t, d], post [t, hc], comb [t, hc, hc]) (head: x_in only)."""
    if config not in TWOPASS_CONFIGS:
        raise ValueError(f"config must be one of {sorted(TWOPASS_CONFIGS)} for impl='twopass_l2', got {config!r}")
    t, hc, d = _check_x(x)
    cfg = TWOPASS_CONFIGS[config]
    bt, n_tb, ks, k_per_split, d_per_fin, lag, bk, bd = _twopass_shape(t, hc, d, x.device, config)
    prec = DOT_PRECISION
    if prec == "auto":
        prec = "bf16x3" if x.dtype == torch.bfloat16 and x.device.type == "cuda" else "tf32x3"
    dev = x.device
    part = torch.empty((ks, t, 2 * hc * hc), dtype=torch.float32, device=dev)
    sq = torch.empty((ks, t), dtype=torch.float32, device=dev)
    cnt = torch.zeros(n_tb, dtype=torch.int32, device=dev)
    # maxnreg is a compile option: only on a GPU (the interpreter takes none)
    opts = {"maxnreg": cfg.maxnreg} if cfg.maxnreg and dev.type == "cuda" else {}
    _mhc_twopass_kernel[((n_tb + lag) * ks,)](
        x, fn, part, sq, cnt, scale, base, *out, t, ks, n_tb, lag, x.stride(0), x.stride(1), x.stride(2),
        fn.stride(0), fn.stride(1), k_per_split, d_per_fin, SPIN_LIMIT, float(rms_eps), float(hc_eps),
        int(sinkhorn_iters), HC=hc, D=d, BLOCK_T=bt, BLOCK_K=bk, BLOCK_D=bd, BLOCK_S=cfg.block_s,
        PRECISION=prec, HEAD=head, MIX_EVICT="evict_last" if cfg.evict else "",
        FIN_EVICT="evict_first" if cfg.evict else "", PREFETCH=cfg.prefetch, num_warps=cfg.warps,
        num_stages=cfg.stages, **opts,
    )  # fmt: skip
