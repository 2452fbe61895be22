"""Triton sparse sink attention, all heads of a token per program, split-KV: the fast decode / prefill kernel.

Same math and conventions as `triton_sparse_attn.py` and `reference.sparse_attn` (module docstrings there):
per query token, the valid indices of `indices` (into kv) and `extra_indices` (into extra_kv) together, a
per-head sink in the denominator, out = 0 and lse = sink for a token without any valid index.

Why another kernel: in V4 all 64 heads of a token attend to the *same* rows. Here one program holds q of all
heads (BLOCK_H = 64: [64, 512] bf16) and walks a BLOCK_N-row tile of gathered rows at a time, so each row is
read from memory once per token and feeds two tensor-core GEMMs, [64, 512] x [512, BLOCK_N] (scores) and
[64, BLOCK_N] x [BLOCK_N, 512] (P @ V, the same tile as V). The older kernel gives each program 32 heads
(two programs read every row) and M = 32 rules out Hopper's wgmma.

Split-KV: with few query tokens (decode at b = 1..32) one program per token leaves most of the 132 SMs idle,
so the tiles of a token are cut into `num_splits` contiguous ranges, one program each. Each writes its
normalised partial output (fp32) and its base-2 log-sum-exp; `_combine_kernel` merges them with the sink.
With num_splits = 1 (prefill, large decode batches) the main kernel finishes the token itself and no
workspace is used. The split is a function of the shapes only (`plan_num_splits`).

Caches: bf16 [n, d] / paged, or the V4 FP8 rows (uint8 [..., 584], `kv_format.py`): 448 e4m3 values with
one power-of-two scale per 64 dims and 64 bf16 RoPE dims, dequantised exactly to bf16 in registers before the
GEMMs (an e4m3 value times a power of two is a bf16 number): the FP8 cache reads 584 instead of 1,024 bytes
per row and gives the same result as the dequantised bf16 cache up to accumulation order.

Where the time goes (V4: 64 heads x 512, BN-row tiles; sm_90a code from Triton 3.9 on the CPU machine,
`tests/fm_sm90_compile.py`, plus the H200 numbers of 2026-11-30; the GPU runs Triton 3.6, so recheck there):

* Work per tile: 2 * 64 * BN * 512 FLOPs each for S = q K^T and P @ V (4.2 MFLOP at BN = 64) over BN * 1,024 B
  (BF16, 64 KiB) or BN * 584 B (FP8, 36.5 KiB): 64 FLOP/B BF16, 112 FP8. The H200's ridge is ~180 FLOP/B, so
  both are memory-bound in principle: BF16 decode tops out near 4.07 TB/s * 64 = 260 TFLOPS (the 250 goal is
  ~96 % of copy bandwidth), FP8 near 457 (then the tensor cores bind).
* Registers: the [64, 512] fp32 accumulator is 128 registers per thread over 8 warps (P @ V has
  `warpsPerCTA = [4, 2]`: each warpgroup owns 256 output dims). Every variant compiles to 255 registers plus
  stack: 336 B (BF16, 64 x 2 stages), 376 B (FP8, 32 x 3), 1,120 B (FP8, 64 x 2): the spills are mostly 64-bit
  addresses of the next tile's cp.async gathers (reloaded once per tile), for FP8 also the dequantised tile.
* Duplicated scores, confirmed: S has `warpsPerCTA = [8, 1]` (Triton puts all warps along M when a dot feeds
  another dot in the loop body) and M = 64, so both warpgroups compute the whole [64, BN] S: per tile 3 units of
  tensor work for 2 useful; the compute ceiling is 2/3 of the peak. `triton_split_deferred.py` removes it.
* Shared memory: q 64 KiB + stages * BN KiB (bf16 tile) = 192 KiB at 64 x 2 (FP8 64 x 2: 224 KiB with the
  uint8 staging and the bf16 copy the wgmma reads): one CTA per SM, so nothing hides one CTA's softmax.
* Serialisation: every wgmma is followed by a wait(0); load -> S -> softmax -> P @ V run back to back and only
  the cp.async gather of the next tile overlaps. Decode b = 128, s_q = 2 (256 CTAs, two waves): 106.6 us, i.e.
  ~5.3 us per 64-row tile against ~2.3 us of tensor work (with the duplication) and ~2.2 us of the SM's share
  of HBM: neither unit is busy; the time is latency of the serial chain.
* FP8 (2x slower than BF16 though it reads 57 % of the bytes): the [BN, 512] tile is dequantised in registers
  through a [BN, 8, 64] reshape and a [BN, 512] select, on top of the accumulator (more spills), and the work
  sits on the serial chain. `triton_split_chunked.py` applies the 7 scales per 64-dim chunk (one multiply by a
  per-row [BN] vector, no reshape, no gather): 384 B of stack at 64 x 2 instead of 1,120, one bf16 chunk live.

DOT_FP32 / BF16_RNE: as in `triton_sparse_attn.py` (interpreter runs: fp32 dot operands, RNE bf16 stores).
The launcher reads shapes, strides and dtypes only: no .item(), no host sync, CUDA-graph safe.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

__all__ = [
    "COMPILED_KERNELS",
    "DEFAULT_KERNELS",
    "KERNELS",
    "compiled_kernel_for",
    "default_split_config",
    "plan_num_splits",
    "sparse_attn_split_triton",
]

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
FP8_ROW_BYTES = 584  # kv_format.FP8_KV_BYTES; the kernel hard-codes the V4 row layout below
_NOPE = 448
_SCALE_AT = 576


@triton.jit
def _bf16_rne(x):
    """fp32 -> bf16 rounded to nearest even by integer ops (the interpreter's own cast truncates)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _load_fp8_rows(kv_ptr, kv16_ptr, rows, valid, offs_d, BLOCK_N: tl.constexpr):
    """Dequantise gathered V4 FP8 rows to bf16 [BN, 512]. kv_ptr: the uint8 cache, kv16_ptr: the same bytes as
    bf16 (292 per row); rows: [BN] int64 row ids (0 at holes), valid: [BN].

    Dims < 448: e4m3 byte d times 2^(scale byte d // 64 - 127), exact in bf16; dims >= 448: the bf16 RoPE
    dims at byte 448 + 2 (d - 448). A 255 scale byte (E8M0's NaN) gives NaN, as in the reference.
    """
    base = rows * 584
    is_nope = offs_d < 448
    b = tl.load(kv_ptr + base[:, None] + offs_d[None, :], mask=valid[:, None] & is_nope[None, :], other=0)
    x = b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    offs_s = tl.arange(0, 8)
    sb = tl.load(kv_ptr + base[:, None] + 576 + offs_s[None, :], mask=valid[:, None] & (offs_s[None, :] < 7), other=127)
    sb = sb.to(tl.uint32)
    scale = (sb << 23).to(tl.float32, bitcast=True)  # 2^(sb - 127) for 1 <= sb <= 254 (the format's range)
    scale = tl.where(sb == 255, float("nan"), scale)  # [BN, 8]; tile 7 (RoPE dims) is 1.0
    x = tl.reshape(tl.reshape(x, [BLOCK_N, 8, 64]) * scale[:, :, None], [BLOCK_N, 512])
    rope_mask = valid[:, None] & (offs_d[None, :] >= 448)
    rope = tl.load(kv16_ptr + rows[:, None] * 292 + 224 + (offs_d[None, :] - 448), mask=rope_mask, other=0.0)
    return tl.where(is_nope[None, :], x, rope.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _tile(
    m_i, l_i, acc, q, kv_ptr, kv16_ptr, idx, n_rows, stride_kv, qk_scale, offs_d,
    BLOCK_N: tl.constexpr, KV_FP8: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    """One tile of BLOCK_N indices idx [BN] (holes: any value outside [0, n_rows)): online-softmax update."""
    valid = (idx >= 0) & (idx < n_rows)
    rows = tl.where(valid, idx, 0).to(tl.int64)
    if KV_FP8:
        kv = _load_fp8_rows(kv_ptr, kv16_ptr, rows, valid, offs_d, BLOCK_N)
    else:  # a hole is never dereferenced and reads as 0, so NaN in unused slots cannot leak
        kv = tl.load(kv_ptr + rows[:, None] * stride_kv + offs_d[None, :], mask=valid[:, None], other=0.0)
    if not DOT_FP32:
        kv = kv.to(tl.bfloat16)  # no-op for bf16 caches (fp32 caches go to the older kernel on a GPU)
    if DOT_FP32:
        kv = kv.to(tl.float32)
        s = tl.dot(q, tl.trans(kv), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(kv))
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing valid yet: any finite shift works
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if DOT_FP32:
        acc = tl.dot(p, kv, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(tl.bfloat16), kv, acc)
    return m_new, l_i, acc


@triton.jit
def _attend_range(
    m_i, l_i, acc, q, kv_ptr, kv16_ptr, idx_row, n_rows, stride_kv, t_lo, t_hi, lim, qk_scale, offs_n, offs_d,
    BLOCK_N: tl.constexpr, KV_FP8: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    """Tiles [t_lo, t_hi) of one index list (lim entries at idx_row).

    The next tile's indices are loaded one iteration ahead into registers, so their memory latency hides
    behind this tile's GEMMs; the compiler's pipeliner then issues the next tile's row gather (cp.async)
    while this tile's P @ V runs.
    """
    pos = t_lo * BLOCK_N + offs_n  # loads stay inside the row (mask pos < lim) even for an empty range
    idx_next = tl.load(idx_row + pos, mask=pos < lim, other=-1)
    for tile in range(t_lo, t_hi):
        idx = idx_next
        pos = (tile + 1) * BLOCK_N + offs_n
        idx_next = tl.load(idx_row + pos, mask=pos < lim, other=-1)
        m_i, l_i, acc = _tile(
            m_i, l_i, acc, q, kv_ptr, kv16_ptr, idx, n_rows, stride_kv, qk_scale, offs_d, BLOCK_N, KV_FP8, DOT_FP32
        )
    return m_i, l_i, acc


@triton.jit
def _store_out(o_ptrs, o, mask, BF16_RNE: tl.constexpr):
    if BF16_RNE:
        tl.store(o_ptrs, _bf16_rne(o), mask=mask)
    else:
        tl.store(o_ptrs, o.to(o_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _finish(m_i, l_i, acc, heads, h_mask, sink_ptr, HAS_SINK: tl.constexpr):
    """Sink into the denominator: (out fp32 [BH, D], lse fp32 [BH] natural log) of one token."""
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
    has_mass = l_f > 0.0  # False only without any valid index and without a sink
    l_safe = tl.where(has_mass, l_f, 1.0)
    o = acc * tl.where(has_mass, alpha / l_safe, 0.0)[:, None]
    lse = tl.where(has_mass, (m_f + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    if HAS_SINK:  # no valid index: lse is the sink itself, bit for bit
        lse = tl.where(m_i == float("-inf"), sink, lse)
    return o, lse


@triton.jit
def _split_attn_kernel(
    q_ptr, kv_ptr, kv16_ptr, idx_ptr, ex_kv_ptr, ex16_ptr, ex_idx_ptr, sink_ptr, out_ptr, lse_ptr,
    part_o_ptr, part_lse_ptr,
    H, n_kv, n_ex, topk, topk_ex, qk_scale, num_splits, tiles_per_split,
    stride_qt, stride_qh, stride_kv, stride_it, stride_ex, stride_et, stride_ot, stride_oh, stride_lt, stride_lh,
    D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_HB: tl.constexpr, SPLIT: tl.constexpr,
    HAS_EXTRA: tl.constexpr, HAS_SINK: tl.constexpr, KV_FP8: tl.constexpr, EX_FP8: tl.constexpr,
    DOT_FP32: tl.constexpr, BF16_RNE: tl.constexpr,
):  # fmt: skip
    """q [t, H, D]; kv / ex_kv caches; idx [t, topk], ex_idx [t, topk_ex] int32; sink fp32 [H]; out [t, H, D];
    lse fp32 [t, H]; part_o fp32 [t, num_splits, H, D] and part_lse fp32 [t, num_splits, H] (SPLIT: num_splits > 1).
    Program id = (token * num_splits + split) * NUM_HB + head block; a split owns tiles
    [split * tiles_per_split, +tiles_per_split) of the main list's tiles followed by the extra list's tiles.
    """
    pid = tl.program_id(0)
    hb = pid % NUM_HB
    split = (pid // NUM_HB) % num_splits
    tok = (pid // (NUM_HB * num_splits)).to(tl.int64)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < H
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)

    q = tl.load(q_ptr + tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :], mask=h_mask[:, None], other=0.0)
    q = q.to(tl.float32) if DOT_FP32 else q.to(tl.bfloat16)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D], dtype=tl.float32)

    n1 = tl.cdiv(topk, BLOCK_N)
    lo = split * tiles_per_split
    hi = lo + tiles_per_split
    m_i, l_i, acc = _attend_range(
        m_i, l_i, acc, q, kv_ptr, kv16_ptr, idx_ptr + tok * stride_it, n_kv, stride_kv, lo, tl.minimum(hi, n1), topk,
        qk_scale, offs_n, offs_d, BLOCK_N, KV_FP8, DOT_FP32,
    )  # fmt: skip
    if HAS_EXTRA:
        n2 = tl.cdiv(topk_ex, BLOCK_N)
        m_i, l_i, acc = _attend_range(
            m_i, l_i, acc, q, ex_kv_ptr, ex16_ptr, ex_idx_ptr + tok * stride_et, n_ex, stride_ex,
            tl.maximum(lo, n1) - n1, tl.minimum(hi, n1 + n2) - n1, topk_ex, qk_scale, offs_n, offs_d, BLOCK_N,
            EX_FP8, DOT_FP32,
        )  # fmt: skip

    if not SPLIT:
        o, lse = _finish(m_i, l_i, acc, heads, h_mask, sink_ptr, HAS_SINK)
        o_ptrs = out_ptr + tok * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        _store_out(o_ptrs, o, h_mask[:, None], BF16_RNE)
        tl.store(lse_ptr + tok * stride_lt + heads * stride_lh, lse, mask=h_mask)
    else:  # partial: acc / l and base-2 lse (m + log2 l); an empty split stores 0 and -inf
        has = l_i > 0.0
        o = acc * tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)[:, None]
        part = (tok * num_splits + split) * H + heads  # [BH] row of the [t * S * H, D] workspace
        tl.store(part_o_ptr + part[:, None] * D + offs_d[None, :], o, mask=h_mask[:, None])
        tl.store(part_lse_ptr + part, tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf")), mask=h_mask)


@triton.jit
def _combine_kernel(
    part_o_ptr, part_lse_ptr, sink_ptr, out_ptr, lse_ptr, H, num_splits,
    stride_ot, stride_oh, stride_lt, stride_lh,
    D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, NUM_HB: tl.constexpr,
    HAS_SINK: tl.constexpr, BF16_RNE: tl.constexpr,
):  # fmt: skip
    """Merge num_splits partials of one (token, head block, BLOCK_D dims): weights 2^(lse_s - m), the sink in
    the denominator. Program id = (token * NUM_HB + head block) * (D // BLOCK_D) + dim block."""
    pid = tl.program_id(0)
    num_db: tl.constexpr = D // BLOCK_D
    tok = (pid // (NUM_HB * num_db)).to(tl.int64)
    heads = ((pid // num_db) % NUM_HB) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < H
    offs_d = (pid % num_db) * BLOCK_D + tl.arange(0, BLOCK_D)
    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    for s in range(num_splits):
        m = tl.maximum(m, tl.load(part_lse_ptr + (tok * num_splits + s) * H + heads, mask=h_mask, other=float("-inf")))
    m_valid = m  # -inf: no split saw a valid index
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=h_mask, other=0.0)
        sink2 = sink * 1.4426950408889634
        m = tl.maximum(m, sink2)
    m = tl.where(m == float("-inf"), 0.0, m)
    l_f = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for s in range(num_splits):
        part = (tok * num_splits + s) * H + heads
        w = tl.exp2(tl.load(part_lse_ptr + part, mask=h_mask, other=float("-inf")) - m)  # 0 for empty splits
        l_f += w
        acc += w[:, None] * tl.load(part_o_ptr + part[:, None] * D + offs_d[None, :], mask=h_mask[:, None], other=0.0)
    if HAS_SINK:
        l_f += tl.exp2(sink2 - m)
    has_mass = l_f > 0.0
    l_safe = tl.where(has_mass, l_f, 1.0)
    o = acc * tl.where(has_mass, 1.0 / l_safe, 0.0)[:, None]
    lse = tl.where(has_mass, (m + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    if HAS_SINK:
        lse = tl.where(m_valid == float("-inf"), sink, lse)
    _store_out(out_ptr + tok * stride_ot + heads[:, None] * stride_oh + offs_d[None, :], o, h_mask[:, None], BF16_RNE)
    first_db = heads * 0 + pid % num_db == 0  # one dim block writes lse
    tl.store(lse_ptr + tok * stride_lt + heads * stride_lh, lse, mask=h_mask & first_db)


# ----------------------------------------------------------------------------------------------- launcher


def _as_bf16(rows: torch.Tensor) -> torch.Tensor:
    """FP8 rows [slots, 584] uint8 seen as bf16 [slots, 292] (for the RoPE dims); other caches unchanged."""
    return rows.view(torch.bfloat16) if rows.dtype == torch.uint8 else rows


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def default_split_config(h: int, d: int, *, fp8: bool = False, kernel: str = "fused") -> tuple[int, int, int, int]:
    """(block_h, block_n, num_warps, num_stages) for h heads of dim d (fp8: an FP8 cache is involved).

    block_h: all heads of a token up to 64 (tl.dot needs M >= 16). For d = 512 the fp32 accumulator [64, 512] is
    128 registers per thread over 8 warps. Measured on the H200 (Triton 3.6, 2026-11-30,
    benchmarks/results/2026-11-30-bench-flash_mla.json) with BF16 caches: 64-row tiles with two cp.async stages
    beat 32-row tiles with three (decode b=128 s_q=2: 107 vs 122 us; prefill 4,096 queries: 1,331 vs 1,825 us)
    and 16-row tiles (175 / 2,647 us). FP8 rows are dequantised in registers (more pressure) and were only
    measured at 32 x 3, so they keep it. kernel: the `sparse_attn_split_triton` kernel the config is for.
    """
    block_h = max(16, min(64, triton.next_power_of_2(h)))
    num_warps = 8 if block_h * d >= 64 * 256 else 4
    if kernel == "deferred" and d >= 512:  # two gathers per tile in flight: 64 x 2 needs 328 KiB of smem
        return block_h, 32, num_warps, 3  # (sm_90a compile, Triton 3.9: 196 KiB, no spills with BF16 rows)
    if d >= 512 and fp8 and kernel == "chunked":  # H200 2026-11-30 (round 1), b = 128 s_q = 2: 64 x 2 111.5
        return block_h, 64, num_warps, 2  # TFLOPS vs 32 x 3 83.5 (one 64-dim chunk live, 384 B of stack)
    if d >= 512 and fp8:
        return block_h, 32, num_warps, 3
    return block_h, 64, num_warps, 2 if d >= 512 else 3


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_sms(device: torch.device) -> int:
    """SM count of a CUDA device (cached host query, no sync); 132 (H200) for anything else."""
    if device.type != "cuda":
        return 132
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


MIN_TILES_PER_SPLIT = 2  # a split writes a [h, d] fp32 partial (128 KiB at V4): give it at least 2 tiles to read


def plan_num_splits(t: int, num_hb: int, tiles: int, num_sms: int, min_tiles: int = MIN_TILES_PER_SPLIT) -> int:
    """Splits per token so that t * num_hb * splits programs fill the SMs without a second partial wave.

    One program per SM fits (its shared memory), so splits = floor(num_sms / (t * num_hb)), at most one per
    min_tiles tiles (each split's fp32 partial output costs as much traffic as a few tiles of rows); then
    rebalanced so every split gets the same number of tiles (no empty split). 1 when the tokens alone fill
    the GPU (prefill, decode at b >= 66 x 2 query tokens).
    """
    if t <= 0 or tiles < 2 * min_tiles:
        return 1
    splits = max(1, min(tiles // min_tiles, num_sms // max(1, t * num_hb)))
    per = -(-tiles // splits)
    return -(-tiles // per)


def _cache_rows(name: str, kv: torch.Tensor, d: int) -> tuple[torch.Tensor, bool]:
    """[n, d] / [blocks, bs, d] bf16, or uint8 [..., 584] (d = 512) -> ([slots, width] unit last stride, fp8)."""
    if kv.dtype == torch.uint8:
        if kv.shape[-1] != FP8_ROW_BYTES or d != 512:
            raise ValueError(f"{name}: expected uint8 [..., {FP8_ROW_BYTES}] with d = 512, got {tuple(kv.shape)}, {d}")
        flat = kv.reshape(-1, FP8_ROW_BYTES)
        return (flat if flat.is_contiguous() else flat.contiguous()), True
    if kv.dtype not in (torch.bfloat16, torch.float32) or kv.dim() not in (2, 3) or kv.shape[-1] != d:
        raise ValueError(
            f"{name}: expected a bf16/fp32 [n, {d}] or [blocks, bs, {d}] cache, got {kv.dtype} {tuple(kv.shape)}"
        )
    flat = kv.reshape(-1, d)
    return (flat if flat.stride(-1) == 1 else flat.contiguous()), False


def _index_rows(name: str, idx: torch.Tensor, t: int) -> torch.Tensor:
    if idx.dtype != torch.int32 or idx.dim() != 2 or idx.shape[0] != t:
        raise ValueError(f"{name}: expected int32 [{t}, k], got {idx.dtype} {tuple(idx.shape)}")
    return idx if idx.stride(-1) == 1 or idx.shape[1] <= 1 else idx.contiguous()


def _buffers(
    q: torch.Tensor, out: torch.Tensor | None, lse_out: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    t, h, d = q.shape
    if out is None:
        out = torch.empty(t, h, d, dtype=q.dtype, device=q.device)
    elif out.shape != (t, h, d) or out.dtype != q.dtype:
        raise ValueError(f"out: expected {q.dtype} {(t, h, d)}, got {out.dtype} {tuple(out.shape)}")
    if lse_out is None:
        lse_out = torch.empty(t, h, dtype=torch.float32, device=q.device)
    elif lse_out.shape != (t, h) or lse_out.dtype != torch.float32:
        raise ValueError(f"lse_out: expected float32 {(t, h)}, got {lse_out.dtype} {tuple(lse_out.shape)}")
    return out, lse_out


# Stage counts that failed for lack of shared memory, per (constexprs, num_warps): the next call starts lower.
_STAGES_CAP: dict[tuple, int] = {}


# sparse_attn_split_triton(kernel=...): this module's kernel, triton_split_chunked, triton_split_deferred, the
# compiled serial sm_90a kernel (cuda_sparse_decode.py; needs _C, bf16 q, d = 512, an extra cache of the main one's
# format) and the warp-specialised ws3 kernel (cuda_ws_decode.py; also h % 64 == 0 and no extra cache)
KERNELS = ("fused", "chunked", "deferred", "cuda", "cuda_ws3")
COMPILED_KERNELS = ("cuda", "cuda_ws3")


def _kernel_fn(kernel: str):  # noqa: ANN202 (a triton JITFunction)
    if kernel == "fused":
        return _split_attn_kernel
    if kernel == "chunked":
        from .triton_split_chunked import _split_chunked_kernel  # imports this module: import here, not on top

        return _split_chunked_kernel
    if kernel == "deferred":
        from .triton_split_deferred import _split_deferred_kernel

        return _split_deferred_kernel
    raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")


# The kernel `sparse_attn_split_triton(kernel=None)` runs, per cache format ("fp8": any FP8 cache involved).
# "cuda" (the sm_90a wgmma kernels of csrc/cuda) passed its H200 tests and beat every Triton kernel at every decode
# shape and at prefill (2026-11-30: 239 vs 196 TFLOPS BF16, 165 vs 112 FP8 at b = 128, s_q = 2). As a default it
# means: without an extra cache ws3p1l / ws3p1 (BF16 / FP8 cache) from WS3P_MIN_TOKENS tokens and ws3 from
# WS3_MIN_TOKENS (`cuda_ws_decode.ws3_default_for` / `default_variant`; session 5 / 6 H200 runs), else the serial
# kernel, else "fused" for a call neither takes (no _C, q not bf16, d != 512, mixed cache formats).
# "cuda_ws3" as a default: ws3 wherever it takes the call (any token count), else the same fallbacks. Extra-cache
# calls go to ws3 only when the call names kernel="cuda_ws3" or DEEPINFER_FLASH_MLA_WS3_EXTRA=1 (cuda_ws_decode).
DEFAULT_KERNELS = {"bf16": "cuda", "fp8": "cuda"}


def compiled_kernel_for(
    kernel: str | None, q: torch.Tensor, kv: torch.Tensor, extra_kv: torch.Tensor | None, *, tuned: bool = False
) -> tuple[str | None, str | None]:
    """(compiled kernel that runs the call: "cuda_ws3p1l" / "cuda_ws3p1" / "cuda_ws3p" (the default from
    `cuda_ws_decode.WS3P_MIN_TOKENS` tokens: `default_variant`) / "cuda_ws3" / "cuda" / None for a Triton kernel,
    why the named compiled
    kernel cannot run it or None). kernel: the call's argument (None: DEFAULT_KERNELS); tuned: the call passes
    config / dot_fp32 (Triton-only options). A forced kernel (kernel="cuda" / "cuda_ws3") is never swapped for
    another; the caller raises with the reason. Shapes / dtypes only."""
    fp8_any = kv.dtype == torch.uint8 or (extra_kv is not None and extra_kv.dtype == torch.uint8)
    name = kernel if kernel is not None else DEFAULT_KERNELS["fp8" if fp8_any else "bf16"]
    if name not in COMPILED_KERNELS:
        return None, None
    from . import cuda_sparse_decode as cu  # both import this module: import here, not on top
    from . import cuda_ws_decode as ws

    tuned_why = "config / dot_fp32 do not apply" if tuned else None
    if name == "cuda_ws3":  # an extra cache: when named by the call, or with DEEPINFER_FLASH_MLA_WS3_EXTRA=1
        allow_extra = kernel is not None or ws.ws3_extra_enabled()
        why = ws.ws3_why_not(q, kv, extra_kv, allow_extra=allow_extra) or tuned_why
        if why is None or kernel is not None:
            return ("cuda_ws3" if why is None else None), why
    elif kernel is None and tuned_why is None and ws.ws3_default_for(q, kv, extra_kv):
        return "cuda_" + ws.default_variant(q.shape[0], extra_kv is not None, fp8_any), None
    why = cu.supports(q, kv, extra_kv) or tuned_why
    return ("cuda" if why is None else None), why


def _pick_kernel(kernel: str | None, d: int, fp8: bool) -> str:
    """The kernel name to run: the given one (checked) or DEFAULT_KERNELS' (fused when chunked cannot take d)."""
    if kernel is None:
        kernel = DEFAULT_KERNELS["fp8" if fp8 else "bf16"]
        return "fused" if kernel == "chunked" and d != 512 else kernel
    _kernel_fn(kernel)  # an unknown name raises before any work
    if kernel == "chunked" and d != 512:
        raise ValueError(f"kernel='chunked': expected head dim d = 512, got {d}")
    return kernel


def _launch(
    grid: tuple[int], args: tuple, consts: dict, num_warps: int, num_stages: int, kernel: str = "fused"
) -> None:
    """Launch the split kernel (`kernel`: a name of KERNELS, all take the same arguments); if this build of
    Triton needs more shared memory than the SM has for num_stages (compile time, so never inside a CUDA-graph
    capture that follows a warm-up call), retry with fewer stages down to 1 and remember the count that fits."""
    fn = _kernel_fn(kernel)
    key = (kernel, tuple(sorted(consts.items())), num_warps)
    stages = min(num_stages, _STAGES_CAP.get(key, num_stages))
    while True:
        try:
            fn[grid](*args, **consts, num_warps=num_warps, num_stages=stages)
            return
        except OutOfResources:
            if stages <= 1:
                raise
            stages -= 1
            _STAGES_CAP[key] = stages


def combine_splits(
    part_o: torch.Tensor,
    part_lse: torch.Tensor,
    sink: torch.Tensor | None,
    out: torch.Tensor,
    lse_out: torch.Tensor,
    num_splits: int,
    *,
    bf16_rne: bool = False,
) -> None:
    """Merge split partials into out [t, h, d] (unit last stride) and lse_out fp32 [t, h] (natural log, sink in
    the denominator). part_o fp32 [t * num_splits * h, d] = acc / l, part_lse fp32 [t * num_splits * h] = base-2
    m + log2 l (-inf: empty split); also used by the CUDA kernel (`cuda_sparse_decode.py`)."""
    t, h, d = out.shape
    comb_h, comb_d = 2, min(d, 256)  # [2, 256] fp32 per program: 64 programs per token at V4 (b = 1 too)
    comb_hb = triton.cdiv(h, comb_h)
    _combine_kernel[(t * comb_hb * (d // comb_d),)](
        part_o, part_lse, sink if sink is not None else lse_out, out, lse_out, h, num_splits,
        out.stride(0), out.stride(1), lse_out.stride(0), lse_out.stride(1),
        D=d, BLOCK_H=comb_h, BLOCK_D=comb_d, NUM_HB=comb_hb, HAS_SINK=sink is not None,
        BF16_RNE=bf16_rne, num_warps=4,
    )  # fmt: skip


def sparse_attn_split_triton(
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
    num_splits: int | None = None,
    config: tuple[int, int, int, int] | None = None,
    dot_fp32: bool | None = None,
    kernel: str | None = None,
    cuda_plan: str | None = None,
    cuda_merge: str | None = None,
    cuda_prefetch: bool | int | None = None,
    cuda_fp8_path: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse sink attention, all heads per program, split-KV; returns (out [t, h, d] q.dtype, lse fp32 [t, h]).

    Args:
        q: [t, h, d] bf16 (fp32 accepted; the GPU path rounds it to bf16, see `api.py` for routing), d a power
            of two >= 16 (V4: h = 64, d = 512).
        kv: bf16 [n, d] / [blocks, bs, d], or uint8 FP8 rows [..., 584] (d = 512); slots addressed flat.
        indices: int32 [t, topk]; -1 or any value outside [0, slots) is a hole.
        sink: fp32 [h] or None. softmax_scale: logit scale.
        extra_kv, extra_indices: optional second cache (same formats) and int32 [t, topk2] slots into it.
        out, lse_out: optional output buffers (any strides with a unit last stride for out; else copied).
        num_splits: splits per token (None: `plan_num_splits` for this device); 1 = no workspace, no combine.
        config: (block_h, block_n, num_warps, num_stages) override of `default_split_config`.
        dot_fp32: fp32 dot operands (None: under TRITON_INTERPRET=1 only).
        kernel: None (DEFAULT_KERNELS for the cache format: "cuda", else "fused"), "fused" (this module's kernel),
            "chunked" (`triton_split_chunked.py`: the tile in eight 64-dim chunks, FP8 scales applied per chunk;
            d = 512 only) or "deferred" (`triton_split_deferred.py`: P @ V one tile behind, scores not duplicated
            across warpgroups) or "cuda" (`cuda_sparse_decode.py`: the compiled serial sm_90a wgmma kernel; bf16
            q, d = 512, both caches of one format; raises otherwise) or "cuda_ws3" (`cuda_ws_decode.py`, variant
            ws3: the warp-specialised kernel; bf16 q, h % 64 == 0, d = 512, an extra cache of kv's format too
            (GPU-tested in session 6); raises otherwise). None on CUDA: without an extra cache ws3p1l / ws3p1 from
            `cuda_ws_decode.WS3P_MIN_TOKENS` tokens, ws3 from `WS3_MIN_TOKENS` (extra-cache calls too when
            DEEPINFER_FLASH_MLA_WS3_EXTRA=1), else the serial kernel (`compiled_kernel_for`). Same results up to
            rounding.
        cuda_plan, cuda_merge, cuda_prefetch: the serial CUDA kernel's split plan / partial merge / L2 prefetch
            (`cuda_sparse_decode.PLANS` / `MERGES`, `sparse_attn_cuda(prefetch=)`; None: its DEFAULT_OPTIONS);
            ignored when another kernel runs (ws3: the serial kernel's default split plan, Triton combine).
        cuda_fp8_path: the serial CUDA kernel's FP8 tile path (`cuda_sparse_decode.FP8_PATHS`: "stage" / "vec",
            same bits; None: its DEFAULT_OPTIONS); ignored when another kernel runs or the cache is BF16.
    """
    if q.dim() != 3 or q.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"q: expected bf16/fp32 [t, h, d], got {q.dtype} {tuple(q.shape)}")
    t, h, d = q.shape
    if d < 16 or d & (d - 1):
        raise ValueError(f"head dim d: expected a power of two >= 16, got {d}")
    if (extra_kv is None) != (extra_indices is None):
        raise ValueError("extra_kv and extra_indices must be given together")
    if sink is not None and (sink.dtype != torch.float32 or tuple(sink.shape) != (h,)):
        raise ValueError(f"sink: expected fp32 [{h}], got {sink.dtype} {tuple(sink.shape)}")
    compiled, why = compiled_kernel_for(kernel, q, kv, extra_kv, tuned=bool(config or dot_fp32))
    if compiled is not None and compiled.startswith("cuda_ws3"):  # ws3 or a ws3p-family variant (`default_variant`)
        from . import cuda_ws_decode as ws

        ex = dict(extra_kv=extra_kv, extra_indices=extra_indices) if extra_kv is not None else {}
        variant = compiled.removeprefix("cuda_")
        return ws.sparse_attn_ws(
            q, kv, indices, sink, softmax_scale, out=out, lse_out=lse_out, num_splits=num_splits, variant=variant, **ex
        )
    if compiled == "cuda":
        from . import cuda_sparse_decode as cu

        return cu.sparse_attn_cuda(
            q, kv, indices, sink, softmax_scale, out=out, lse_out=lse_out, num_splits=num_splits,
            extra_kv=extra_kv, extra_indices=extra_indices, plan=cuda_plan, merge=cuda_merge,
            prefetch=cuda_prefetch, fp8_path=cuda_fp8_path,
        )  # fmt: skip
    if kernel in COMPILED_KERNELS:
        raise ValueError(f"kernel={kernel!r} cannot run this call: {why}")
    if kernel is None and why is not None:
        kernel = "fused"  # the default names a compiled kernel but this call fits neither
    kv_f, kv_fp8 = _cache_rows("kv", kv, d)
    idx = _index_rows("indices", indices, t)
    has_extra = extra_kv is not None and extra_indices is not None
    ex_f, ex_fp8 = _cache_rows("extra_kv", extra_kv, d) if has_extra else (kv_f, kv_fp8)
    ex_idx = _index_rows("extra_indices", extra_indices, t) if has_extra else idx
    kernel = _pick_kernel(kernel, d, kv_fp8 or ex_fp8)
    out, lse_out = _buffers(q, out, lse_out)
    if t == 0 or h == 0:
        return out, lse_out
    if dot_fp32 is None:
        dot_fp32 = _interpreting()
    block_h, block_n, num_warps, num_stages = config or default_split_config(h, d, fp8=kv_fp8 or ex_fp8, kernel=kernel)
    num_hb = triton.cdiv(h, block_h)
    topk_ex = ex_idx.shape[1] if has_extra else 0
    tiles = triton.cdiv(idx.shape[1], block_n) + triton.cdiv(topk_ex, block_n)
    if num_splits is None:
        num_splits = plan_num_splits(t, num_hb, tiles, device_sms(q.device))
    num_splits = max(1, min(int(num_splits), max(tiles, 1)))
    per_split = -(-tiles // num_splits)

    q_c = q if q.stride(-1) == 1 else q.contiguous()
    o_dst = out if out.stride(-1) == 1 else torch.empty(t, h, d, dtype=q.dtype, device=q.device)
    if num_splits > 1:
        part_o = torch.empty(t * num_splits * h, d, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(t * num_splits * h, dtype=torch.float32, device=q.device)
    else:
        part_o, part_lse = lse_out, lse_out  # unused
    sink_arg = sink if sink is not None else lse_out
    bf16_rne = _interpreting() and q.dtype == torch.bfloat16
    args = (
        q_c, kv_f, _as_bf16(kv_f), idx, ex_f, _as_bf16(ex_f), ex_idx, sink_arg, o_dst, lse_out, part_o, part_lse,
        h, kv_f.shape[0], ex_f.shape[0] if has_extra else 0, idx.shape[1], topk_ex,
        float(softmax_scale) * LOG2E, num_splits, per_split,
        q_c.stride(0), q_c.stride(1), kv_f.stride(0), idx.stride(0), ex_f.stride(0), ex_idx.stride(0),
        o_dst.stride(0), o_dst.stride(1), lse_out.stride(0), lse_out.stride(1),
    )  # fmt: skip
    consts = dict(
        D=d, BLOCK_H=block_h, BLOCK_N=block_n, NUM_HB=num_hb, SPLIT=num_splits > 1, HAS_EXTRA=has_extra,
        HAS_SINK=sink is not None, KV_FP8=kv_fp8, EX_FP8=ex_fp8, DOT_FP32=bool(dot_fp32), BF16_RNE=bf16_rne,
    )  # fmt: skip
    _launch((t * num_splits * num_hb,), args, consts, num_warps, num_stages, kernel)
    if num_splits > 1:
        combine_splits(part_o, part_lse, sink, o_dst, lse_out, num_splits, bf16_rne=bf16_rne)
    if o_dst is not out:
        out.copy_(o_dst)
    return out, lse_out
