"""Triton M-grouped FP8 GEMMs (MoE experts) with DeepGEMM's 1x128 / 128x128 block scales: contiguous and masked.

Same numerics as the dense `triton_fp8_gemm.py` (one fp32 promotion per 128-deep k block, scales applied on
CUDA cores; E8M0 decoded bit-exactly); semantics = `reference.m_grouped_fp8_gemm_nt_contiguous` / `_masked`.

* contiguous: a [M, k] with a group id per row (`m_indices`, -1 = padding row, written as zeros). Grid
  (cdiv(M, BLOCK_M), cdiv(n, BLOCK_N)). A tile reads its rows' ids; when the layout is DeepGEMM's (each group's
  rows padded to a multiple of BLOCK_M) the tile holds one group and does one pass. A tile that holds several
  groups (any order is allowed) loops: take the largest remaining id, run the k loop with that group's weight,
  store only its rows, mark them done. Correct for any order; fast for aligned layouts.
* masked: a [g, m_max, k] with per-group valid counts `masked_m`. Grid (g * cdiv(m_max, BLOCK_M), cdiv(n,
  BLOCK_N)); tiles past a group's count do nothing (read on the device: CUDA-graph safe). Rows >= masked_m[g]
  of out are left untouched.

Requirements: k % 16 == 0; operands contiguous. Ids / counts are not validated (no host sync): contiguous rows
with an id outside [0, g-1] are zeroed like padding, masked counts are clamped to [0, m_max]. The launchers never
sync with the host. The API (`api_moe.py`) runs these on CUDA where CUTLASS does not take the call or the experts
are small (`_dispatch.fp8_grouped_impl`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_fp8_gemm import BLOCK_K, _check_block, _e8m0_to_f32, _f32_to_bf16_rne, _interpreting, default_config

__all__ = ["m_grouped_fp8_contiguous_triton", "m_grouped_fp8_masked_triton"]
_E8M0 = torch.float8_e8m0fnu


@triton.jit
def _scaled_dot(
    a_ptrs, b_ptrs, sfa_ptrs, sfb_row, r_mask, c_mask, K, stride_sfa_k, stride_sfb_k,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SFA_E8M0: tl.constexpr,
    SFB_E8M0: tl.constexpr, EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr,
):  # fmt: skip
    """sum over 128-deep k blocks of dot(a, b^T) * sfa[row] * sfb: fp32 [BM, BN] (or [BN, BM] with SWAP_AB)."""
    offs_k = tl.arange(0, BLOCK_K)
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        if EVEN_K:
            a = tl.load(a_ptrs + k0, mask=r_mask[:, None], other=0.0)
            b = tl.load(b_ptrs + k0, mask=c_mask[:, None], other=0.0)
        else:
            k_mask = (k0 + offs_k) < K
            a = tl.load(a_ptrs + k0, mask=r_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(b_ptrs + k0, mask=c_mask[:, None] & k_mask[None, :], other=0.0)
        if SFA_E8M0:
            sa = _e8m0_to_f32(tl.load(sfa_ptrs + kb * stride_sfa_k, mask=r_mask, other=127))
        else:
            sa = tl.load(sfa_ptrs + kb * stride_sfa_k, mask=r_mask, other=1.0)
        if SFB_E8M0:
            sb = _e8m0_to_f32(tl.load(sfb_row + kb * stride_sfb_k))
        else:
            sb = tl.load(sfb_row + kb * stride_sfb_k)
        s = sa * sb
        if SWAP_AB:
            acc += tl.dot(b, tl.trans(a)) * s[None, :]
        else:
            acc += tl.dot(a, tl.trans(b)) * s[:, None]
    return acc


@triton.jit
def _store(out_ptr, rows, cols, stride_om, acc, mask_rows, c_mask, SWAP_AB: tl.constexpr, BF16_RNE_BITS: tl.constexpr):
    """Store acc ([BM, BN], or [BN, BM] with SWAP_AB) to the rows where mask_rows holds."""
    if SWAP_AB:
        ptrs = out_ptr + rows.to(tl.int64)[None, :] * stride_om + cols[:, None]
        mask = mask_rows[None, :] & c_mask[:, None]
    else:
        ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        mask = mask_rows[:, None] & c_mask[None, :]
    if BF16_RNE_BITS:
        tl.store(ptrs, _f32_to_bf16_rne(acc), mask=mask)
    else:
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _contiguous_kernel(
    a_ptr, sfa_ptr, b_ptr, sfb_ptr, ids_ptr, out_ptr,
    M, N, K, G,
    stride_am, stride_sfa_m, stride_sfa_k, stride_bg, stride_bn, stride_sfb_g, stride_sfb_n, stride_sfb_k,
    stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SFA_E8M0: tl.constexpr,
    SFB_E8M0: tl.constexpr, EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr, BF16_RNE_BITS: tl.constexpr,
):  # fmt: skip
    """a e4m3 [M, K], sfa [M, cdiv(K,128)], b e4m3 [G, N, K], sfb [G, cdiv(N,128), cdiv(K,128)], ids int32 [M]."""
    pid_m = tl.program_id(0)  # fastest: neighbouring programs share the n tile (and, aligned, the group's b)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    r_mask = rows < M
    c_mask = cols < N
    ids = tl.load(ids_ptr + rows, mask=r_mask, other=-1)
    ids = tl.where(ids < G, ids, -1)  # ids are not validated (no host sync): an id >= G is zeroed like padding
    if SWAP_AB:
        zero = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        zero = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    _store(out_ptr, rows, cols, stride_om, zero, r_mask & (ids < 0), c_mask, SWAP_AB, BF16_RNE_BITS)  # padding
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    sfa_ptrs = sfa_ptr + rows.to(tl.int64) * stride_sfa_m
    cur = tl.max(ids, axis=0)
    while cur >= 0:  # one trip per group present in the tile (one for aligned layouts)
        g64 = cur.to(tl.int64)
        b_ptrs = b_ptr + g64 * stride_bg + cols.to(tl.int64)[:, None] * stride_bn + offs_k[None, :]
        sfb_row = sfb_ptr + g64 * stride_sfb_g + ((pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sfb_n
        sel = ids == cur
        acc = _scaled_dot(
            a_ptrs, b_ptrs, sfa_ptrs, sfb_row, r_mask & sel, c_mask, K, stride_sfa_k, stride_sfb_k,
            BLOCK_M, BLOCK_N, BLOCK_K, SFA_E8M0, SFB_E8M0, EVEN_K, SWAP_AB,
        )  # fmt: skip
        _store(out_ptr, rows, cols, stride_om, acc, r_mask & sel, c_mask, SWAP_AB, BF16_RNE_BITS)
        ids = tl.where(sel, -1, ids)
        cur = tl.max(ids, axis=0)


@triton.jit
def _masked_kernel(
    a_ptr, sfa_ptr, b_ptr, sfb_ptr, cnt_ptr, out_ptr,
    M_MAX, N, K, TILES_M,
    stride_ag, stride_am, stride_sfa_g, stride_sfa_m, stride_sfa_k, stride_bg, stride_bn, stride_sfb_g,
    stride_sfb_n, stride_sfb_k, stride_og, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SFA_E8M0: tl.constexpr,
    SFB_E8M0: tl.constexpr, EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr, BF16_RNE_BITS: tl.constexpr,
):  # fmt: skip
    """a e4m3 [G, M_MAX, K], sfa [G, M_MAX, cdiv(K,128)], b [G, N, K], sfb [G, cdiv(N,128), cdiv(K,128)],
    cnt int32 [G], out [G, M_MAX, N]. Grid (G * TILES_M, cdiv(N, BLOCK_N))."""
    gid = tl.program_id(0) // TILES_M
    m0 = (tl.program_id(0) % TILES_M) * BLOCK_M
    pid_n = tl.program_id(1)
    cnt = tl.minimum(tl.load(cnt_ptr + gid), M_MAX)
    if m0 < cnt:  # tiles past the group's valid rows read and write nothing
        g64 = gid.to(tl.int64)
        rows = m0 + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        r_mask = rows < cnt
        c_mask = cols < N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + g64 * stride_ag + rows.to(tl.int64)[:, None] * stride_am + offs_k[None, :]
        sfa_ptrs = sfa_ptr + g64 * stride_sfa_g + rows.to(tl.int64) * stride_sfa_m
        b_ptrs = b_ptr + g64 * stride_bg + cols.to(tl.int64)[:, None] * stride_bn + offs_k[None, :]
        sfb_row = sfb_ptr + g64 * stride_sfb_g + ((pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sfb_n
        acc = _scaled_dot(
            a_ptrs, b_ptrs, sfa_ptrs, sfb_row, r_mask, c_mask, K, stride_sfa_k, stride_sfb_k,
            BLOCK_M, BLOCK_N, BLOCK_K, SFA_E8M0, SFB_E8M0, EVEN_K, SWAP_AB,
        )  # fmt: skip
        _store(out_ptr + g64 * stride_og, rows, cols, stride_om, acc, r_mask, c_mask, SWAP_AB, BF16_RNE_BITS)


def _check(a, sfa, b, sfb, out) -> tuple[int, int, int]:
    """Metadata checks shared by both launchers; returns (m, n, k) of one group's problem."""
    k = a.shape[-1]
    g, n, kb_ = b.shape
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise TypeError(f"a and b must be float8_e4m3fn, got {a.dtype} and {b.dtype}")
    if kb_ != k or k % 16:
        raise ValueError(f"k: expected a and b to share k with k % 16 == 0, got {k} and {kb_}")
    kb = triton.cdiv(k, BLOCK_K)
    if tuple(sfa.shape) != (*a.shape[:-1], kb) or tuple(sfb.shape) != (g, triton.cdiv(n, 128), kb):
        raise ValueError(
            f"scale shapes: expected sfa {(*a.shape[:-1], kb)} and sfb {(g, triton.cdiv(n, 128), kb)}, "
            f"got {tuple(sfa.shape)} and {tuple(sfb.shape)}"
        )
    for name, t in (("sfa", sfa), ("sfb", sfb)):
        if t.dtype not in (torch.float32, _E8M0):
            raise TypeError(f"{name}: expected float32 or float8_e8m0fnu scales, got {t.dtype}")
    if out.dtype not in (torch.bfloat16, torch.float32) or tuple(out.shape) != (*a.shape[:-1], n):
        raise ValueError(f"out: expected bfloat16/float32 {(*a.shape[:-1], n)}, got {out.dtype} {tuple(out.shape)}")
    for name, t in (("a", a), ("b", b), ("out", out), ("sfa", sfa), ("sfb", sfb)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
    return a.shape[-2], n, k


def _flags(sfa, sfb, out, k) -> dict:
    return {
        "SFA_E8M0": sfa.dtype == _E8M0,
        "SFB_E8M0": sfb.dtype == _E8M0,
        "EVEN_K": k % BLOCK_K == 0,
        "BF16_RNE_BITS": out.dtype == torch.bfloat16 and _interpreting(),
    }


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == _E8M0 else t


def m_grouped_fp8_contiguous_triton(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor,
    m_indices: torch.Tensor, *, expected_m: int | None = None, block_m: int | None = None,
    block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
    swap_ab: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """out[i] = dequant(a[i]) @ dequant(b[m_indices[i]])^T, rows with id -1 zeroed; returns out.

    a: e4m3 [M, k], sfa fp32|e8m0 [M, ceil(k/128)]; b: e4m3 [g, n, k], sfb [g, ceil(n/128), ceil(k/128)];
    out: bf16|fp32 [M, n]; m_indices: int32 [M] (not checked: rows with ids outside [0, g-1] are zeroed).
    Tiles: `default_config` of the expected rows per group (expected_m; None -> 128, DeepGEMM's row alignment of
    the contiguous layout); swap_ab None -> expected rows <= 64.
    """
    m, n, k = _check(a, sfa, b, sfb, out)
    rows = 128 if expected_m is None else max(int(expected_m), 1)
    dm, dn, dw, ds = default_config(rows, n)
    bm, bn = block_m or dm, block_n or dn
    _check_block("block_m", bm, (16, 32, 64, 128))
    _check_block("block_n", bn, (16, 32, 64, 128))  # must divide 128: one weight-scale row per tile
    if m == 0 or n == 0:
        return out
    if k == 0 or b.shape[0] == 0:
        raise ValueError("k and the number of groups must be positive")
    sa, sb = _u8(sfa), _u8(sfb)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _contiguous_kernel[grid](
        a, sa, b, sb, m_indices, out, m, n, k, b.shape[0],
        a.stride(0), sa.stride(0), sa.stride(1), b.stride(0), b.stride(1), sb.stride(0), sb.stride(1), sb.stride(2),
        out.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=BLOCK_K, SWAP_AB=rows <= 64 if swap_ab is None else bool(swap_ab),
        **_flags(sfa, sfb, out, k), num_warps=num_warps or dw, num_stages=num_stages or ds,
    )  # fmt: skip
    return out


def m_grouped_fp8_masked_triton(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor,
    masked_m: torch.Tensor, expected_m: int, *, block_m: int | None = None, block_n: int | None = None,
    num_warps: int | None = None, num_stages: int | None = None, swap_ab: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """Per group gi, rows i < masked_m[gi]: out[gi, i] = dequant(a[gi, i]) @ dequant(b[gi])^T; returns out.

    a: e4m3 [g, m_max, k], sfa [g, m_max, ceil(k/128)]; b, sfb as in the contiguous form; out [g, m_max, n]
    (other rows untouched); masked_m int32 [g] in [0, m_max] (not checked). expected_m (rows per group, a
    hint) picks the tile: `default_config(expected_m, n)`; swap_ab None -> expected_m <= 64.
    """
    m_max, n, k = _check(a, sfa, b, sfb, out)
    g = a.shape[0]
    rows = max(int(expected_m), 1)
    dm, dn, dw, ds = default_config(rows, n)
    bm, bn = block_m or dm, block_n or dn
    _check_block("block_m", bm, (16, 32, 64, 128))
    _check_block("block_n", bn, (16, 32, 64, 128))  # must divide 128: one weight-scale row per tile
    if m_max == 0 or n == 0 or g == 0:
        return out
    if k == 0:
        raise ValueError("k must be positive")
    sa, sb = _u8(sfa), _u8(sfb)
    tiles_m = triton.cdiv(m_max, bm)
    grid = (g * tiles_m, triton.cdiv(n, bn))
    _masked_kernel[grid](
        a, sa, b, sb, masked_m, out, m_max, n, k, tiles_m,
        a.stride(0), a.stride(1), sa.stride(0), sa.stride(1), sa.stride(2), b.stride(0), b.stride(1),
        sb.stride(0), sb.stride(1), sb.stride(2), out.stride(0), out.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=BLOCK_K, SWAP_AB=rows <= 64 if swap_ab is None else bool(swap_ab),
        **_flags(sfa, sfb, out, k), num_warps=num_warps or dw, num_stages=num_stages or ds,
    )  # fmt: skip
    return out
