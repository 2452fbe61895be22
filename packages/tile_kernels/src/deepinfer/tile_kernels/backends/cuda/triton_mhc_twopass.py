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
of `triton_mhc_fused.py` (the same mix and gate code, `triton_mhc_onelaunch.py`: same dots, same fp32 partial
order per split, partials summed in split order), so the tolerances of `test_mhc_triton.py` apply; the default
config has the fused default's splits, so its results are bit-identical to it. Counters start at zero (one
memset per call); no host sync: CUDA-graph safe.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .triton_mhc import _check_x, _mix_partials
from .triton_mhc_onelaunch import (
    SPIN_LIMIT,
    _block_gates,
    _block_splits,
    _dot_precision,
    _scratch,
    _wait_arrivals,
)

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
        _mix_partials(
            x_ptr, fn_ptr, part_ptr, sq_ptr, T, b, s, stride_xt, stride_xh, stride_xd, stride_fn_r, stride_fn_c,
            k_per_split, HC, D, BLOCK_T, BLOCK_K, PRECISION, HEAD, MIX_EVICT,
        )  # fmt: skip
        tl.debug_barrier()  # every warp's partial stores precede the release below
        tl.atomic_add(cnt_ptr + b, 1, sem="release", scope="gpu")
    bf = b - lag
    if bf >= 0:
        _wait_arrivals(cnt_ptr + bf, S, spin_limit)
        _finish_unit(
            part_ptr, sq_ptr, x_ptr, scale_ptr, base_ptr, xin_ptr, post_ptr, comb_ptr, T, S, bf, s, stride_xt,
            stride_xh, stride_xd, d_per_fin, rms_eps, hc_eps, sinkhorn_iters, HC, D, BLOCK_T, BLOCK_D, BLOCK_S,
            HEAD, FIN_EVICT, PREFETCH,
        )  # fmt: skip


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
    tok = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tok < T
    tok64 = tok.to(tl.int64)
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
    pre = _block_gates(
        part_ptr, sq_ptr, scale_ptr, base_ptr, post_ptr, comb_ptr, T, S, tok, part_idx, rms_eps, hc_eps,
        sinkhorn_iters, HC, D, BLOCK_T, BLOCK_S, HEAD,
    )  # fmt: skip
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
    bt, bk, n_tb, ks, k_per_split = _block_splits(t, hc, d, dev, cfg.block_t, cfg.splits, cfg.block_k)
    bd = min(cfg.block_d, max(16, triton.next_power_of_2(d)))
    d_per_fin = triton.cdiv(triton.cdiv(d, ks), bd) * bd
    lag = min(max(cfg.lag, 1 if ks > 1 else 0), n_tb)
    return bt, n_tb, ks, k_per_split, d_per_fin, lag, bk, bd


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
    prec = _dot_precision(x)
    dev = x.device
    part, sq, cnt = _scratch(ks, t, hc, n_tb, dev)
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
