"""Pure PyTorch references of every deep_gemm op (shipped: tests, benchmarks and the CPU fallback use them).

Each function takes already-validated operands (see `api.py`), dequantises to float32, multiplies in
float32 and writes the result into `out` (cast to out.dtype, round-to-nearest-even) which it returns.
Checks that need tensor values (group ids, masked counts) are done here, before anything is written.
"""

from __future__ import annotations

import torch

from .dequant import dequant_fp8_act, dequant_weight

__all__ = [
    "bf16_gemm_nt",
    "fp8_gemm_nt",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "grouped_gemm_nt_bf16",
    "grouped_gemm_nt_fp8",
]


def _finish(acc: torch.Tensor, out: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
    """out = acc (+ c), with the addition done in float32 before the single rounding to out.dtype."""
    if c is not None:
        acc = acc + c.to(torch.float32)
    out.copy_(acc)
    return out


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
    """out = c + a @ b^T; a [m, k], b [n, k] both bf16 or both float32, float32 accumulation, out [m, n]."""
    # bf16 x bf16 products are exact in float32, so upcasting first is the fp32-accumulate contract.
    return _finish(a.to(torch.float32) @ b.to(torch.float32).T, out, c)


def fp8_gemm_nt(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    out: torch.Tensor,
    c: torch.Tensor | None = None,
) -> torch.Tensor:
    """out = c + dequant(a, sfa) @ dequant(b, sfb)^T; layouts as in `api.fp8_gemm_nt` (FP8 or FP4 b)."""
    return _finish(dequant_fp8_act(a, sfa) @ dequant_weight(b, sfb).T, out, c)


def _check_group_ids(m_indices: torch.Tensor, num_groups: int) -> None:
    if m_indices.numel() == 0:
        return
    lo, hi = int(m_indices.min()), int(m_indices.max())
    if lo < -1 or hi >= num_groups:
        raise ValueError(
            f"m_indices: expected group ids in [-1, {num_groups - 1}] (-1 = padding row), got values in [{lo}, {hi}]"
        )


def m_grouped_fp8_gemm_nt_contiguous(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    out: torch.Tensor,
    m_indices: torch.Tensor,
) -> torch.Tensor:
    """Row i of out = dequant(a[i]) @ dequant(b[m_indices[i]])^T; rows with m_indices == -1 are zeroed.

    a [M, k] e4m3, sfa [M, ceil(k/128)], b [g, n, k] (or packed FP4 [g, n, k/2]), sfb [g, ...],
    out [M, n], m_indices int32 [M].
    """
    _check_group_ids(m_indices, b.shape[0])
    ids = m_indices.to(torch.int64)
    out[ids < 0] = 0
    for g in torch.unique(ids[ids >= 0]).tolist():  # only groups that own rows: cheap when experts are idle
        rows = torch.nonzero(ids == g).squeeze(1)
        acc = dequant_fp8_act(a[rows], sfa[rows]) @ dequant_weight(b[g], sfb[g]).T
        out[rows] = acc.to(out.dtype)
    return out


def m_grouped_fp8_gemm_nt_masked(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    out: torch.Tensor,
    masked_m: torch.Tensor,
) -> torch.Tensor:
    """out[g, :masked_m[g]] = dequant(a[g, :masked_m[g]]) @ dequant(b[g])^T; other rows of out are not written.

    a [g, m_max, k] e4m3, sfa [g, m_max, ceil(k/128)], b [g, n, k] (or packed FP4), out [g, m_max, n],
    masked_m int32 [g].
    """
    counts = masked_m.tolist()
    m_max = a.shape[1]
    bad = [(g, m) for g, m in enumerate(counts) if not 0 <= m <= m_max]
    if bad:
        raise ValueError(f"masked_m: expected counts in [0, m_max={m_max}], got (group, count) pairs {bad[:4]}")
    for g, m in enumerate(counts):
        if m == 0:
            continue  # an expert with no tokens: skip its weight dequantisation entirely
        acc = dequant_fp8_act(a[g, :m], sfa[g, :m]) @ dequant_weight(b[g], sfb[g]).T
        out[g, :m] = acc.to(out.dtype)
    return out


def grouped_gemm_nt_bf16(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[t, g] = a[t, g] @ b[g]^T; a [t, g, k], b [g, n, k] (both bf16 or both float32), out [t, g, n]."""
    return _finish(torch.einsum("tgk,gnk->tgn", a.to(torch.float32), b.to(torch.float32)), out, None)


def grouped_gemm_nt_fp8(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """FP8 form of `grouped_gemm_nt_bf16`: a e4m3 [t, g, k] with sfa [t, g, ceil(k/128)], b e4m3 [g, n, k]
    with sfb [g, ceil(n/128), ceil(k/128)] (or packed FP4 b with per-32 sfb), out [t, g, n]."""
    acc = torch.einsum("tgk,gnk->tgn", dequant_fp8_act(a, sfa), dequant_weight(b, sfb))
    return _finish(acc, out, None)
