"""Triton sparse attention with a per-head sink over one shared K=V head (DeepSeek-V4), BF16 / FP32 caches.

Role: the API runs this kernel only for fp32 q or fp32 caches on a GPU (fp32 dot operands); bf16 and FP8 calls
go to `triton_split_attn.py` (all 64 heads per program, split-KV). Kept as the fp32 path and as the `legacy`
baseline of `benchmarks/bench_flash_mla.py`.

Semantics are those of `reference.sparse_attn`: for query token t and head h, over the valid indices j of
`indices[t]` (into kv) and `extra_indices[t]` (into extra_kv) together,

    z_j = softmax_scale * (q[t, h] . kv_j),   out[t, h] = sum_j exp(z_j) kv_j / (sum_j exp(z_j) + exp(sink_h)),
    lse[t, h] = log(sum_j exp(z_j) + exp(sink_h))   (natural log; no sink: the sink term is left out).

An index is valid when 0 <= i < rows of its cache; anything else is a hole. A token with no valid index gets
out = 0 and lse = sink_h (-inf without a sink).

Grid: one program per (token, block of BLOCK_H heads), flattened so that the head blocks of one token are
neighbours (h = 64 with BLOCK_H = 32: both halves read the same rows at about the same time, the second read
hits L2). A program keeps q [BLOCK_H, d] on chip and walks the index lists in tiles of BLOCK_N:

* load BLOCK_N indices, valid = 0 <= i < n; gather the rows [BLOCK_N, d] once with a masked load (a hole or
  out-of-range index is never dereferenced and reads as 0, so NaN in unused cache slots cannot leak);
* scores [BLOCK_H, BLOCK_N] = q @ rows^T (one tl.dot over the full d: the compiler's MMA loop splits d into
  k-steps), scaled by softmax_scale * log2(e), holes set to -inf;
* online softmax in base 2 (running max m and sum l per head, fp32); the accumulator [BLOCK_H, d] fp32 is
  rescaled and gets p @ rows (the same gathered tile serves as K and as V);
* after both lists: the sink joins the denominator, out = acc / l in q's dtype, lse = (m + log2 l) * ln 2.

DOT_FP32 (constexpr) upcasts both dot operands to fp32 (IEEE products): Triton's CPU interpreter computes bf16
`tl.dot` wrongly, so interpreter runs set it; on a GPU with bf16 q and kv it is False (bf16 operands, fp32
accumulation; p is rounded to bf16 for the P @ V product, as in FlashAttention). fp32 q or kv also sets it.
BF16_RNE (constexpr, interpreter only) rounds a bf16 output to nearest even by integer ops: the interpreter's
fp32 -> bf16 cast truncates, a GPU's rounds to nearest even.

The launcher reads metadata only (no .item(), no host sync, no value-dependent shapes): CUDA-graph safe.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["NUM_STAGES", "default_config", "sparse_attn_triton"]

NUM_STAGES = 2  # gathered-row tiles in flight (cp.async); d = 512 bf16 tiles are 32 KiB each at BLOCK_N = 32


@triton.jit
def _bf16_rne(x):
    """fp32 -> bf16 rounded to nearest, ties to even, by integer ops (finite x).

    The CPU interpreter's own fp32 -> bf16 cast truncates; the GPU's `.to(tl.bfloat16)` rounds to nearest
    even, and this gives the interpreter the same bits.
    """
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _attend_tile(
    m_i,
    l_i,
    acc,
    q,
    kv_ptr,
    idx_row_ptr,
    n_rows,
    stride_kv,
    start,
    topk,
    qk_scale,
    offs_n,
    offs_d,
    DOT_FP32: tl.constexpr,
):
    """One tile of BLOCK_N indices: update (m_i [BH], l_i [BH], acc [BH, D]) with its valid rows; returns them.

    q: [BH, D] (fp32 when DOT_FP32, else bf16); idx_row_ptr: this token's index row; qk_scale = scale * log2(e).
    """
    pos = start + offs_n  # [BN]
    idx = tl.load(idx_row_ptr + pos, mask=pos < topk, other=-1)
    valid = (idx >= 0) & (idx < n_rows)
    rows = tl.where(valid, idx, 0).to(tl.int64) * stride_kv  # [BN] element offsets of the rows
    kv = tl.load(kv_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)  # [BN, D]
    if DOT_FP32:
        kv = kv.to(tl.float32)
        s = tl.dot(q, tl.trans(kv), input_precision="ieee")  # [BH, BN]
    else:
        s = tl.dot(q, tl.trans(kv))
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing valid yet: any finite shift works
    alpha = tl.exp2(m_i - m_use)  # 0 while m_i is -inf
    p = tl.exp2(s - m_use[:, None])  # 0 at holes
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if DOT_FP32:
        acc = tl.dot(p, kv, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(kv.dtype), kv, acc)
    return m_new, l_i, acc


@triton.jit
def _sparse_attn_kernel(
    q_ptr,
    kv_ptr,
    idx_ptr,
    ex_kv_ptr,
    ex_idx_ptr,
    sink_ptr,
    out_ptr,
    lse_ptr,
    H,
    n_kv,
    n_ex,
    topk,
    topk_ex,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kv,
    stride_it,
    stride_ex,
    stride_et,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_HB: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    HAS_SINK: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BF16_RNE: tl.constexpr,
):
    """q [t, H, D]; kv [n_kv, D]; idx int32 [t, topk]; ex_kv [n_ex, D]; ex_idx int32 [t, topk_ex]; sink fp32 [H];
    out [t, H, D]; lse fp32 [t, H]. Last dims contiguous; program id = token * NUM_HB + head block.
    """
    pid = tl.program_id(0)
    tok = (pid // NUM_HB).to(tl.int64)
    heads = (pid % NUM_HB) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BH]
    h_mask = heads < H
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)

    q = tl.load(q_ptr + tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :], mask=h_mask[:, None], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D], dtype=tl.float32)

    idx_row = idx_ptr + tok * stride_it
    for start in range(0, topk, BLOCK_N):
        m_i, l_i, acc = _attend_tile(
            m_i, l_i, acc, q, kv_ptr, idx_row, n_kv, stride_kv, start, topk, qk_scale, offs_n, offs_d, DOT_FP32
        )
    if HAS_EXTRA:
        ex_row = ex_idx_ptr + tok * stride_et
        for start in range(0, topk_ex, BLOCK_N):
            m_i, l_i, acc = _attend_tile(
                m_i,
                l_i,
                acc,
                q,
                ex_kv_ptr,
                ex_row,
                n_ex,
                stride_ex,
                start,
                topk_ex,
                qk_scale,
                offs_n,
                offs_d,
                DOT_FP32,
            )

    # Finish: the sink (no value vector) joins the denominator; all in base 2 until the lse.
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=h_mask, other=0.0)
        sink2 = sink * 1.4426950408889634
        m_f = tl.maximum(m_i, sink2)
    else:
        m_f = m_i
    m_f = tl.where(m_f == float("-inf"), 0.0, m_f)
    alpha = tl.exp2(m_i - m_f)
    l_f = l_i * alpha
    if HAS_SINK:
        l_f += tl.exp2(sink2 - m_f)
    has_mass = l_f > 0.0  # False only for a token with no valid index and no sink
    l_safe = tl.where(has_mass, l_f, 1.0)
    o = acc * tl.where(has_mass, alpha / l_safe, 0.0)[:, None]
    lse = tl.where(has_mass, (m_f + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    if HAS_SINK:  # no valid index: lse is the sink itself, bit for bit (not a base-2 round trip of it)
        lse = tl.where(m_i == float("-inf"), sink, lse)

    o_ptrs = out_ptr + tok * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    if BF16_RNE:
        tl.store(o_ptrs, _bf16_rne(o), mask=h_mask[:, None])
    else:
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=h_mask[:, None])
    tl.store(lse_ptr + tok * stride_lt + heads * stride_lh, lse, mask=h_mask)


def _interpreting() -> bool:
    """True when Triton runs in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def default_config(h: int, d: int, *, fp32_gpu: bool = False) -> tuple[int, int, int]:
    """(block_h, block_n, num_warps) for h heads of dim d.

    block_h: 32 heads share each gathered tile when h >= 32 (h = 64: two programs per token), else 16 (tl.dot
    needs M >= 16; h = 4 / 8 leave rows masked). The fp32 accumulator [block_h, d] is 64 KiB at 32 x 512,
    64 registers per thread over 8 warps. block_n: 32 rows (a 32 KiB bf16 tile at d = 512), 64 at d <= 128.
    Triton 3.6, sm_90a, bf16: 190 registers at (32, 32, 8) for d = 512, <= 222 for the others, no spills.
    fp32_gpu: fp32 dot operands on a GPU (fp32 q or cache): (16, 16, 8), the largest tiles without stack use.
    """
    if fp32_gpu:
        return 16, 16, 8
    block_h = 32 if h >= 32 else 16
    block_n = 64 if d <= 128 else 32
    num_warps = 8 if block_h * d >= 32 * 512 else 4
    return block_h, block_n, num_warps


def _pow2_at_least_16(name: str, v: int) -> None:
    if v < 16 or v & (v - 1):
        raise ValueError(f"{name}: expected a power of two >= 16, got {v}")


def _flat_cache(name: str, kv: torch.Tensor, d: int) -> torch.Tensor:
    """[n, d] or [blocks, bs, d] float cache -> [slots, d] with unit last stride (a view for contiguous caches)."""
    if kv.dtype not in (torch.bfloat16, torch.float32) or kv.dim() not in (2, 3) or kv.shape[-1] != d:
        raise ValueError(
            f"{name}: expected a bf16/fp32 [n, {d}] or [blocks, bs, {d}] cache, got "
            f"{kv.dtype} {tuple(kv.shape)} (FP8 caches are not supported by this kernel)"
        )
    flat = kv.reshape(-1, d)
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def _index_rows(name: str, idx: torch.Tensor, t: int) -> torch.Tensor:
    """int32 [t, k] with unit last stride."""
    if idx.dtype != torch.int32 or idx.dim() != 2 or idx.shape[0] != t:
        raise ValueError(f"{name}: expected int32 [{t}, k], got {idx.dtype} {tuple(idx.shape)}")
    return idx if idx.stride(-1) == 1 or idx.shape[1] <= 1 else idx.contiguous()


def sparse_attn_triton(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    softmax_scale: float,
    *,
    extra_kv: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    block_h: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = NUM_STAGES,
    dot_fp32: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse sink attention (module docstring); returns (out [t, h, d] in q.dtype, lse fp32 [t, h]).

    Args:
        q: [t, h, d] bf16 / fp32, d a power of two >= 16 (V4: h = 64, d = 512).
        kv: [n, d] or paged [blocks, bs, d] bf16 / fp32 cache, addressed flat (slot = block * bs + offset).
        indices: int32 [t, topk] slots into kv; -1 or any value outside [0, n) is a hole.
        sink: fp32 [h] or None. softmax_scale: the logit scale (V4: 512 ** -0.5).
        extra_kv, extra_indices: optional second cache and int32 [t, topk2] slots into it (both or neither).
        out: optional [t, h, d] q.dtype buffer (any strides; every element is written).
        lse_out: optional fp32 [t, h] buffer (any strides).
        block_h, block_n, num_warps: overrides of `default_config` (block sizes: powers of two >= 16).
        num_stages: software-pipelining depth of the tile loop.
        dot_fp32: upcast dot operands to fp32 (None: under TRITON_INTERPRET=1, or when q / a cache is fp32).

    Arguments are expected to be validated already (`api.py`); only what the kernel itself needs is checked.
    """
    if q.dim() != 3 or q.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"q: expected bf16/fp32 [t, h, d], got {q.dtype} {tuple(q.shape)}")
    t, h, d = q.shape
    _pow2_at_least_16("head dim d", d)
    if (extra_kv is None) != (extra_indices is None):
        raise ValueError("extra_kv and extra_indices must be given together")

    kv_f = _flat_cache("kv", kv, d)
    idx = _index_rows("indices", indices, t)
    has_extra = extra_kv is not None and extra_indices is not None
    ex_f = _flat_cache("extra_kv", extra_kv, d) if has_extra else kv_f
    ex_idx = _index_rows("extra_indices", extra_indices, t) if has_extra else idx
    if dot_fp32 is None:
        dot_fp32 = _interpreting() or any(x.dtype != torch.bfloat16 for x in (q, kv_f, ex_f))
    cfg_h, cfg_n, cfg_w = default_config(h, d, fp32_gpu=bool(dot_fp32) and q.device.type == "cuda")
    block_h, block_n, num_warps = block_h or cfg_h, block_n or cfg_n, num_warps or cfg_w
    _pow2_at_least_16("block_h", block_h)
    _pow2_at_least_16("block_n", block_n)
    if sink is not None and (sink.dtype != torch.float32 or sink.shape != (h,)):
        raise ValueError(f"sink: expected fp32 [{h}], got {sink.dtype} {tuple(sink.shape)}")

    if out is None:
        out = torch.empty(t, h, d, dtype=q.dtype, device=q.device)
    elif out.shape != (t, h, d) or out.dtype != q.dtype:
        raise ValueError(f"out: expected {q.dtype} {(t, h, d)}, got {out.dtype} {tuple(out.shape)}")
    if lse_out is None:
        lse_out = torch.empty(t, h, dtype=torch.float32, device=q.device)
    elif lse_out.shape != (t, h) or lse_out.dtype != torch.float32:
        raise ValueError(f"lse_out: expected float32 {(t, h)}, got {lse_out.dtype} {tuple(lse_out.shape)}")
    if t == 0 or h == 0:
        return out, lse_out

    q_c = q if q.stride(-1) == 1 else q.contiguous()
    o_dst = out if out.stride(-1) == 1 else torch.empty(t, h, d, dtype=q.dtype, device=q.device)
    num_hb = triton.cdiv(h, block_h)
    _sparse_attn_kernel[(t * num_hb,)](
        q_c,
        kv_f,
        idx,
        ex_f,
        ex_idx,
        sink if sink is not None else lse_out,
        o_dst,
        lse_out,
        h,
        kv_f.shape[0],
        ex_f.shape[0] if has_extra else 0,
        idx.shape[1],
        ex_idx.shape[1] if has_extra else 0,
        float(softmax_scale) * 1.4426950408889634,
        q_c.stride(0),
        q_c.stride(1),
        kv_f.stride(0),
        idx.stride(0),
        ex_f.stride(0),
        ex_idx.stride(0),
        o_dst.stride(0),
        o_dst.stride(1),
        lse_out.stride(0),
        lse_out.stride(1),
        D=d,
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        NUM_HB=num_hb,
        HAS_EXTRA=has_extra,
        HAS_SINK=sink is not None,
        DOT_FP32=bool(dot_fp32),
        BF16_RNE=_interpreting() and q.dtype == torch.bfloat16,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if o_dst is not out:
        out.copy_(o_dst)
    return out, lse_out
