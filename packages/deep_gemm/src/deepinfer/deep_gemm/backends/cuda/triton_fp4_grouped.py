"""Triton M-grouped GEMM, contiguous layout: bf16 activations x FP4 (e2m1) weights with E8M0 per-32 scales.

out[r] = a[r] @ W_i^T for every row r of group i, W_i = dequant(packed[i], scales[i]) [n, k]; bf16 out, fp32
accumulation. Groups are given by `offs` (int32 [g], cumulative END row of each group; group i owns rows
offs[i-1] .. offs[i]-1 with offs[-1] := 0). Rows past offs[g-1] are not written.

Grid (g, cdiv(n, BLOCK_N)): program (i, j) reads offs[i-1], offs[i] and loops over its group's rows in BLOCK_M
tiles; an empty group's loop runs zero times, so its weights are never read (decode: most experts get 0-2 rows).
Each row tile dequantises the program's weight slice again, so the row tile follows the rows per group
(`w4a16_configs.py`: 16 for decode, 64 / 128 for prefill). For every row tile it streams k in BLOCK_K steps:

* the packed tile [BLOCK_N, BLOCK_K/2] bytes is loaded as [BLOCK_N, BLOCK_K/32, 16] (16 bytes = 32 values share
  one scale) with the scales [BLOCK_N, BLOCK_K/32] broadcast along the last axis;
* low nibbles hold the even columns k0 + 2c, high nibbles the odd ones k0 + 2c + 1 (c < BLOCK_K/2). Instead of
  interleaving them, the kernel runs two dots of depth BLOCK_K/2, the even weight half against the even columns
  of a and the odd half against the odd columns (a dot product does not care about the order of its terms);
* a code becomes the bf16 value e2m1 * 2^(s-127), exactly (an e2m1 value times a power of two has at most 2
  significant bits): on a GPU by inline PTX working on 4 bytes at a time (`_e2m1x4_bf16_asm`, USE_ASM), in the
  interpreter (and with use_asm=False) by plain integer ops (`_e2m1_bf16`). Both are exact for scale bytes s in
  [2, 252] (scales 2^-125 .. 2^125); outside that range (never seen in real checkpoints) the result is
  unspecified. The PTX path gets each scale as a ready bf16x2 multiplier (`_scale_bf16x2`, computed once per
  32 weights), so the per-weight work is the nibble shuffling and two bf16x2 multiplies;
* "swap AB": acc^T [BLOCK_N, BLOCK_M] += W [BLOCK_N, BLOCK_K/2] @ a^T [BLOCK_K/2, BLOCK_M], so the large,
  freshly dequantised operand is the MMA's A side (registers on Hopper wgmma) and the few rows are its N side.

DOT_FP32 (constexpr) upcasts both dot operands to fp32 (IEEE): Triton's CPU interpreter computes bf16 `tl.dot`
wrongly, so interpreter runs set it; on a GPU it is False (bf16 operands, fp32 accumulation).
The launcher never syncs with the host (no .item() / .tolist(), shapes from metadata only): CUDA-graph safe.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .w4a16_configs import W4A16Config, default_config, parse_config

__all__ = ["m_grouped_bf16_fp4_gemm_nt_contiguous_triton"]


@triton.jit
def _e2m1_bf16(code, sbits):
    """e2m1 codes (int32, 0..15) -> bf16 tensor equal to value(code) * 2^(s-127), sbits = (s - 1) << 7.

    Code bits: sign | 2-bit exponent e (bias 1) | 1-bit mantissa m. For e >= 1 the magnitude is
    2^(e-1) * (1 + m/2): bf16 exponent field e - 1 + (s - 127) + 127 = e + s - 1, mantissa bit 6 = m, i.e.
    ((e,m) << 6) + sbits. Code 1 is 0.5 = 2^-1: field s - 1, i.e. exactly sbits; code 0 is zero: 1 * sbits and
    0 * sbits cover both subnormal codes with one multiply.
    """
    em = code & 7
    mag = tl.where(em >= 2, (em << 6) + sbits, em * sbits)
    bits = mag | ((code & 8) << 12)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _scale_bf16x2(sb):
    """E8M0 bytes (uint8 tensor) -> int32 bf16x2 bits of 2^(s-127) in both 16-bit lanes (exponent field s).

    Computed once per scale group (1/32 of the weights) and broadcast, so the per-weight PTX below needs no
    scale unpacking. s = 0 / 255 give 0 / inf: outside the documented [2, 252] domain.
    """
    return (sb.to(tl.int32) << 7) * 0x10001


@triton.jit
def _e2m1x4_bf16_asm(packed, mult):
    """GPU fast path of `_e2m1_bf16` on 4 bytes at a time (inline PTX, sm_90+): -> (even, odd) bf16 tensors.

    packed: uint8 [...] (low nibble = even element); mult: int32 [...] `_scale_bf16x2` of each element's scale
    (broadcast). Per 32-bit register of 4 bytes b0..b3: `prmt` moves b0, b1 (b2, b3) to bytes 1 and 3 of a word
    t, so a high nibble sits at bits 12-15 / 28-31 of each 16-bit lane (t << 4 does the same for the low
    nibbles); then (t & 0x80008000) | ((t >> 6) & 0x01C001C0) is sign | (e,m) << 6, the bf16x2 bits of
    e2m1 * 2^-126 (e = 0 gives bf16 subnormals, which bf16 `mul` handles exactly). Two bf16x2 multiplies follow:
    by 2^126 and by 2^(s-127) (lane i takes element i's multiplier: one `lop3` merges the two elements'
    words: low lane = element 0, lop3 LUT 0xD8 = (a & ~c) | (b & c)). Exact for s in [1, 254] when the product is a
    normal bf16.
    """
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 z, c, s0, s1, t0, t1, u0, u1, x, y;
        mov.b32 z, 0;
        mov.b32 c, 0x7E807E80;
        lop3.b32 s0, $5, $6, 0xFFFF0000, 0xD8;
        lop3.b32 s1, $7, $8, 0xFFFF0000, 0xD8;
        prmt.b32 t0, $4, z, 0x1000;
        prmt.b32 t1, $4, z, 0x3222;
        shl.b32 u0, t0, 4;
        shl.b32 u1, t1, 4;
        and.b32 x, u0, 0x80008000; shr.b32 y, u0, 6; and.b32 y, y, 0x01C001C0; or.b32 x, x, y;
        mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 $0, x, s0;
        and.b32 x, u1, 0x80008000; shr.b32 y, u1, 6; and.b32 y, y, 0x01C001C0; or.b32 x, x, y;
        mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 $1, x, s1;
        and.b32 x, t0, 0x80008000; shr.b32 y, t0, 6; and.b32 y, y, 0x01C001C0; or.b32 x, x, y;
        mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 $2, x, s0;
        and.b32 x, t1, 0x80008000; shr.b32 y, t1, 6; and.b32 y, y, 0x01C001C0; or.b32 x, x, y;
        mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 $3, x, s1;
        }
        """,
        "=r,=r,=r,=r,r,r,r,r,r",
        [packed, mult],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


@triton.jit(do_not_specialize=["M"])  # M varies per call (tokens): one compile for all
def _w4a16_grouped_kernel(
    a_ptr,
    b_ptr,
    s_ptr,
    offs_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_am,
    stride_bg,
    stride_bn,
    stride_sg,
    stride_sn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    """a int32 [M, K/2] (bf16 pairs); b uint8 [G, N, K/2]; s uint8 [G, N, K/32]; offs int32 [G]; out bf16 [M, N].

    a is read as int32 (even, odd) pairs: 4-byte loads that Triton's pipeliner prefetches with cp.async (2-byte
    strided loads stay synchronous). The scale bytes are left to plain loads: on an H200 (Triton 3.6) that kept
    the dequantised tile in registers as the wgmma A operand and was faster than an int32-word scale load.
    """
    HALF_K: tl.constexpr = BLOCK_K // 2  # bytes (and even or odd columns, and a pairs) per k step
    SG: tl.constexpr = BLOCK_K // 32  # scale groups per k step
    gid = tl.program_id(0)
    pid_n = tl.program_id(1)

    end = tl.minimum(tl.load(offs_ptr + gid), M)
    start = tl.maximum(tl.where(gid > 0, tl.load(offs_ptr + tl.maximum(gid - 1, 0)), 0), 0)

    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    n_mask = n < N
    b_rows = b_ptr + gid.to(tl.int64) * stride_bg + n.to(tl.int64) * stride_bn  # [BN]
    s_rows = s_ptr + gid.to(tl.int64) * stride_sg + n.to(tl.int64) * stride_sn  # [BN]
    grp = tl.arange(0, SG)  # [SG]
    byte3 = grp[:, None] * 16 + tl.arange(0, 16)[None, :]  # [SG, 16] byte offset inside the k step
    c = tl.arange(0, HALF_K)  # [HK] even/odd column pair index inside the k step

    for m0 in range(start, end, BLOCK_M):  # zero trips for an empty group: no weight bytes are read
        rows = m0 + tl.arange(0, BLOCK_M)  # [BM]
        r_mask = rows < end
        a_cols = a_ptr + rows.to(tl.int64)[None, :] * stride_am  # [1, BM]
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # acc^T: swap AB
        for k0 in range(0, K, BLOCK_K):
            packed = tl.load(
                b_rows[:, None, None] + (k0 // 2 + byte3)[None, :, :], mask=n_mask[:, None, None], other=0
            )  # [BN, SG, 16] uint8
            sb = tl.load(s_rows[:, None] + (k0 // 32 + grp)[None, :], mask=n_mask[:, None], other=0)  # [BN, SG]
            if USE_ASM:
                mult = tl.broadcast_to(_scale_bf16x2(sb)[:, :, None], [BLOCK_N, SG, 16])
                w_even, w_odd = _e2m1x4_bf16_asm(packed, mult)
            else:
                p32 = packed.to(tl.int32)
                sbits = ((sb.to(tl.int32) - 1) << 7)[:, :, None]  # [BN, SG, 1]
                w_even = _e2m1_bf16(p32 & 15, sbits)
                w_odd = _e2m1_bf16(p32 >> 4, sbits)
            w_even = tl.reshape(w_even, [BLOCK_N, HALF_K])  # columns k0 + 2c
            w_odd = tl.reshape(w_odd, [BLOCK_N, HALF_K])  # columns k0 + 2c + 1
            a_pair = tl.load(a_cols + (k0 // 2 + c)[:, None], mask=r_mask[None, :], other=0)  # [HK, BM] int32
            a_even = a_pair.to(tl.int16).to(tl.bfloat16, bitcast=True)  # column k0 + 2c: the low half
            a_odd = (a_pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)  # column k0 + 2c + 1
            if DOT_FP32:
                acc = tl.dot(w_even.to(tl.float32), a_even.to(tl.float32), acc, input_precision="ieee")
                acc = tl.dot(w_odd.to(tl.float32), a_odd.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(w_even, a_even, acc)
                acc = tl.dot(w_odd, a_odd, acc)
        o_ptrs = out_ptr + rows.to(tl.int64)[None, :] * stride_om + n[:, None]  # [BN, BM]
        tl.store(o_ptrs, acc.to(tl.bfloat16), mask=r_mask[None, :] & n_mask[:, None])


def _interpreting() -> bool:
    """True when Triton runs in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _int32_view(t: torch.Tensor) -> torch.Tensor:
    """Reinterpret a contiguous tensor's last dim as int32 words (a copy only when its start is not 4-aligned)."""
    if t.storage_offset() * t.element_size() % 4:
        t = t.clone()
    return t.view(torch.int32)


def m_grouped_bf16_fp4_gemm_nt_contiguous_triton(
    a: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor,
    *,
    config: W4A16Config | None = None,
    expected_m: int | None = None,
    dot_fp32: bool | None = None,
    use_asm: bool | None = None,
) -> torch.Tensor:
    """Launch the kernel on already-validated operands (see `api_w4a16.py`); returns `out`.

    a: bf16 [m, k] contiguous; packed: int8/uint8 [g, n, k/2] (low nibble = even column); scales:
    float8_e8m0fnu/uint8 [g, n, k/32]; offs: int32 [g] cumulative group ends; out: bf16 [m, n] contiguous.
    config: tiles and warps (`w4a16_configs.W4A16Config`); None -> env DEEPINFER_DG_W4A16_CONFIG (a config
    name) when set, else `default_config(m, g, expected_m)`, which reads only shapes and the `expected_m`
    rows-per-group hint. config.block_k must divide k.
    dot_fp32: upcast dot operands to fp32 (None: only under TRITON_INTERPRET=1).
    use_asm: dequantise with the inline-PTX `_e2m1x4_bf16_asm` (None: on a GPU, not in the interpreter, unless
    env DEEPINFER_DG_W4A16_ASM=0).
    Reads only metadata on the host, so it can be captured in a CUDA graph.
    """
    m, k = a.shape
    g, n, _ = packed.shape
    forced = os.environ.get("DEEPINFER_DG_W4A16_CONFIG")  # operator override, e.g. 'm16n64k128w2s3'
    if config is None and forced:
        config = parse_config(forced)
    cfg = default_config(m, g, expected_m) if config is None else config
    if not isinstance(cfg, W4A16Config):
        raise TypeError(f"config: expected a W4A16Config or None, got {type(cfg).__name__}")
    if k % cfg.block_k:
        raise ValueError(f"config.block_k: expected a power of two >= 32 dividing k={k}, got {cfg.block_k}")
    if m == 0 or n == 0 or g == 0:
        return out
    if dot_fp32 is None:
        dot_fp32 = _interpreting()
    if use_asm is None:  # DEEPINFER_DG_W4A16_ASM=0: the plain integer dequantiser (a fallback, slower)
        use_asm = not _interpreting() and os.environ.get("DEEPINFER_DG_W4A16_ASM", "1") != "0"
    if cfg.kernel == 2:
        from .triton_fp4_grouped_v2 import launch_v2

        return launch_v2(a, packed, scales, offs, out, cfg, bool(dot_fp32), bool(use_asm))
    if cfg.kernel == 3:
        from .triton_fp4_grouped_v3 import launch_v3

        return launch_v3(a, packed, scales, offs, out, cfg, bool(dot_fp32), bool(use_asm))
    a32 = _int32_view(a)  # [m, k/2] bf16 pairs (a bit view; a copy only when misaligned)
    b_u8 = packed.view(torch.uint8)  # bit views: no copies
    s_u8 = scales.view(torch.uint8)
    grid = (g, triton.cdiv(n, cfg.block_n))
    _w4a16_grouped_kernel[grid](
        a32,
        b_u8,
        s_u8,
        offs,
        out,
        m,
        n,
        k,
        a32.stride(0),
        b_u8.stride(0),
        b_u8.stride(1),
        s_u8.stride(0),
        s_u8.stride(1),
        out.stride(0),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        DOT_FP32=bool(dot_fp32),
        USE_ASM=bool(use_asm),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
