"""Pure PyTorch reference of every flash_mla op (no validation: `api.py` checks arguments first).

Sparse attention with a per-head sink over one shared K=V head (DeepSeek-V4):

    z_j   = softmax_scale * (q_h . kv_j)                     over the valid indices j of both index lists
    o_h   = sum_j exp(z_j) kv_j / (sum_j exp(z_j) + exp(sink_h))
    lse_h = log(sum_j exp(z_j) + exp(sink_h))                (natural log, the real denominator)

All math is fp32. An index is valid when 0 <= i < number of slots; anything else (-1 holes, out-of-range
values) is skipped. A query with no valid index gets o = 0 and lse = sink_h (-inf without a sink). The kv row
of a skipped index is never read into the sums, so NaN or garbage in unused cache slots cannot leak.
"""

from __future__ import annotations

import torch

from .kv_format import pack_fp8_kv_ref, unpack_fp8_kv_ref

__all__ = ["pack_fp8_kv_ref", "sparse_attn", "unpack_fp8_kv_ref"]

# Bound on elements of one gathered [rows, topk, d] block; keeps the reference's memory flat for long prefill.
_CHUNK_ELEMS = 1 << 23


def _flat_rows(kv: torch.Tensor) -> torch.Tensor:
    """Cache [n, D] or [blocks, block_size, D] -> [slots, D] (slot = block * block_size + offset)."""
    return kv.reshape(-1, kv.shape[-1])


def gather_kv(kv_flat: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the cache named by idx, dequantised to fp32, zeroed where the index is invalid.

    kv_flat: [slots, 512 | D] bf16/fp32 or uint8 [slots, 584] (FP8 entries); idx: int [t, k].
    Returns (rows fp32 [t, k, d], valid bool [t, k]).
    """
    slots = kv_flat.shape[0]
    valid = (idx >= 0) & (idx < slots)
    packed = kv_flat.dtype == torch.uint8
    d = 512 if packed else kv_flat.shape[-1]
    if slots == 0:
        return torch.zeros(*idx.shape, d, dtype=torch.float32, device=idx.device), valid
    rows = kv_flat[torch.where(valid, idx, 0).long()]
    rows = unpack_fp8_kv_ref(rows, torch.float32) if packed else rows.float()
    # Zero, not just mask: exp(-inf) = 0 times a NaN row would still be NaN.
    return torch.where(valid.unsqueeze(-1), rows, 0.0), valid


def _attend(
    q: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sink softmax over the gathered rows. q fp32 [t, h, d]; rows fp32 [t, k, d]; valid [t, k].

    Returns (out fp32 [t, h, d], lse fp32 [t, h]).
    """
    z = torch.einsum("thd,tkd->thk", q, rows) * scale
    z = z.masked_fill(~valid.unsqueeze(1), float("-inf"))
    m = z.amax(dim=-1) if z.shape[-1] > 0 else torch.full(q.shape[:2], float("-inf"), device=q.device)
    if sink is not None:
        m = torch.maximum(m, sink.unsqueeze(0))
    m = torch.where(torch.isfinite(m), m, 0.0)  # no valid entry and no sink: any shift works
    p = torch.exp(z - m.unsqueeze(-1))
    denom = p.sum(dim=-1)
    if sink is not None:
        denom = denom + torch.exp(sink.unsqueeze(0) - m)
    out = torch.einsum("thk,tkd->thd", p, rows)
    safe = torch.where(denom > 0, denom, 1.0)
    out = torch.where((denom > 0).unsqueeze(-1), out / safe.unsqueeze(-1), 0.0)
    return out, torch.log(denom) + m


def _chunk_rows(t: int, topk: int, d: int) -> int:
    return max(1, min(t, _CHUNK_ELEMS // max(topk * d, 1)))


def sparse_attn(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    softmax_scale: float,
    extra_kv: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse sink attention (module docstring) for q [t, h, d]; indices [t, k] (+ extra [t, k2]).

    kv / extra_kv: [n, d] or [blocks, block_size, d] bf16/fp32, or the uint8 [..., 584] FP8 form.
    Returns (out [t, h, d] in q.dtype, lse fp32 [t, h]).
    """
    t, h, d = q.shape
    kv_flat = _flat_rows(kv)
    ex_flat = _flat_rows(extra_kv) if extra_kv is not None else None
    width = indices.shape[1] + (extra_indices.shape[1] if extra_indices is not None else 0)
    out = torch.empty(t, h, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(t, h, dtype=torch.float32, device=q.device)
    sink_f = sink.float() if sink is not None else None
    step = _chunk_rows(t, width, d)
    for r in range(0, t, step):
        rows, valid = gather_kv(kv_flat, indices[r : r + step])
        if ex_flat is not None and extra_indices is not None:
            ex_rows, ex_valid = gather_kv(ex_flat, extra_indices[r : r + step])
            rows, valid = torch.cat([rows, ex_rows], dim=1), torch.cat([valid, ex_valid], dim=1)
        o, s = _attend(q[r : r + step].float(), rows, valid, sink_f, softmax_scale)
        out[r : r + step] = o.to(q.dtype)
        lse[r : r + step] = s
    return out, lse
