"""Pieces of the one-launch mHC pre / head kernels (`triton_mhc_fused.py`, `impl="fused"`).

They do in one launch what `triton_mhc.py`'s default ("split") does in two: fp32 mix partials of a token block over
S slices of hc*d (`triton_mhc._mix_partials`, the default mix kernel's own body), an arrival counter per block, then
the gates of the block from its summed partials (`_block_gates`) and the x_in stream sum. Inlined into each kernel by
Triton. (A second one-launch family, `impl="twopass_l2"`, shared these until session 5, when it lost on the H200 and
was removed: package README, "One-launch mHC".)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_mhc import DOT_PRECISION, _split, _target_programs

SPIN_LIMIT = 1 << 22  # polls before a finish program gives up (seconds; only a broken dispatch order gets there)


@triton.jit
def _wait_arrivals(cnt_ptr, S, spin_limit):
    """Poll the block counter at cnt_ptr (acquire) until S splits have arrived or spin_limit rounds have passed."""
    seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
    rounds = seen * 0
    while (seen < S) & (rounds < spin_limit):
        seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
        rounds += 1


@triton.jit
def _block_gates(
    part_ptr,
    sq_ptr,
    scale_ptr,
    base_ptr,
    post_ptr,
    comb_ptr,
    T,
    S,
    tok,
    part_idx,
    rms_eps,
    hc_eps,
    sinkhorn_iters,
    HC: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HEAD: tl.constexpr,
):
    """Tokens tok [BLOCK_T]: sum the S partials (split order), gates and Sinkhorn (not HEAD: post [T, HC] and
    comb [T, HC, HC] stored by finish part part_idx 0 only); returns the pre gates [BLOCK_T, HC] fp32."""
    NP: tl.constexpr = 2 * HC * HC
    tmask = tok < T
    tok64 = tok.to(tl.int64)
    p = tl.arange(0, NP)
    hh = tl.arange(0, HC)
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
    return pre


def _block_splits(
    t: int, hc: int, d: int, dev: torch.device, max_bt: int, max_splits: int, block_k: int
) -> tuple[int, int, int, int, int]:
    """(bt, bk, n_blocks, splits, k_per_split) of a one-launch mix over x [t, hc, d].

    Tokens per block: 16 (the tl.dot minimum) for decode, up to max_bt. Always max_splits splits (not fewer at
    large t, as the default mix does): the S splits of a block run together, so only ~(resident programs / S)
    blocks are in flight and their x stays in L2 for the re-read. At t <= 64 (launch-bound decode) as many
    splits as the default mix (it fills the GPU with one block).
    """
    bt = max(16, min(max_bt, triton.next_power_of_2(max(t, 1))))
    bk = min(block_k, max(16, triton.next_power_of_2(hc * d)))
    n_tb = triton.cdiv(t, bt)
    n_chunks = triton.cdiv(hc * d, bk)
    ks, k_chunks = _split(1, n_chunks, max_splits, max_splits)
    if t <= 64:
        ks, k_chunks = _split(n_tb, n_chunks, _target_programs(dev), 64)
    return bt, bk, n_tb, ks, k_chunks * bk


def _dot_precision(x: torch.Tensor) -> str:
    """The mix's dot precision for x: DOT_PRECISION, with "auto" resolved as `triton_mhc.py`'s mix does."""
    if DOT_PRECISION != "auto":
        return DOT_PRECISION
    return "bf16x3" if x.dtype == torch.bfloat16 and x.device.type == "cuda" else "tf32x3"


def _scratch(splits: int, t: int, hc: int, n_blocks: int, dev: torch.device) -> tuple[torch.Tensor, ...]:
    """(part [splits, t, 2*hc*hc], sq [splits, t]) fp32 partials and the zeroed int32 arrival counters [n_blocks]."""
    part = torch.empty((splits, t, 2 * hc * hc), dtype=torch.float32, device=dev)
    sq = torch.empty((splits, t), dtype=torch.float32, device=dev)
    return part, sq, torch.zeros(n_blocks, dtype=torch.int32, device=dev)
