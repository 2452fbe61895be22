"""Triton interleaved-pair RoPE (`ref/rope.py::apply_rope_interleaved`) over x [t, M, d] (M = middle dims).

The t * M rows of x are flattened; program i takes BLOCK_M consecutive rows (for q [t, 64, 512]: 8 rows of one
token, 16 KB moved; for kv [t, 512] up to 32K tokens: 2 tokens, SMALL_BLOCK_M) and does two things:

* copy: columns [0, d - rope_dim) in [BLOCK_M, BLOCK_C] tiles, the stored bytes being the loaded ones (no
  arithmetic, no per-column masks beyond the region's end): full-width vector loads and stores. Most of the
  bytes are here (448 of 512 columns in V4), so this part decides the bandwidth.
* rotate: the rope_dim / 2 pairs of each row as two [BLOCK_M, BLOCK_R] tiles (even and odd columns, stride 2)
  with cos/sin of each row's token, in the reference's order, fp32:

    even 2k: a * c_k - b * s_k        odd 2k+1: a * s_k + b * c_k        (a, b) = (x[2k], x[2k+1])

  (s_k negated for `inverse`). Inputs of at most 16M elements (kv) issue these loads before the copy
  (EARLY_ROT, see `_rope_kernel`), larger ones (q) after it: the H200 measurements in SMALL_ELEMS' comment.

The launch turns Triton's fp fusion off (`enable_fp_fusion=False`): by default the compiler contracts
`a * c - b * s` into one FMA, which rounds once where the reference (torch eager: a mul, a mul, an add) rounds
three times. The two fp32 results then differ by up to ~4 fp32 ulps of |(a, b)|, which is more than a bf16 ulp
of the output where a*c and b*s nearly cancel (|out| << |(a, b)|); this showed on the H200 as a 1-ulp bf16
miss at 4096 tokens. Without the FMA every output is the same three correctly rounded fp32 operations as the
reference (the operand order of the commutative add differs only), so the result is bit-identical, also after
the cast to bf16 (RNE both sides). A memory-bound kernel loses nothing by it. No host sync (CUDA-graph safe);
blocks come from shapes only.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["apply_rope_interleaved_triton"]

MAX_BLOCK_C = 1024  # copied columns per step
TILE_ELEMS = 4096  # most elements of one [BLOCK_M, BLOCK_C] copy tile (8 KB of bf16 per load)
TARGET_PROGRAMS = 512  # shrink BLOCK_M (down to 1) until the grid has about this many programs
# Inputs up to SMALL_ELEMS elements (kv [16384, 512]: 8M) take at most SMALL_BLOCK_M rows per program: H200
# round 1, kv: 2 rows / 2 warps 1.06x over 8 / 8 (finer tail on a launch-bound 16 MB op); q keeps 8 / 8.
# They also issue the rotate loads first (EARLY_ROT): H200 sessions 3 and 4, kv [16384, 512]: 1.10x / 1.10x over
# the late loads; q [16384, 64, 512] (large, 8 / 8): 0.995x / 0.996x, so large inputs keep the late loads.
SMALL_ELEMS = 1 << 24
SMALL_BLOCK_M = 2
MAX_ROW_D = 4096  # widest row `_rope_row_kernel` takes as one tile
# `cs_rt=None`: with CS_RT_DEFAULT, `_rope_kernel_cs_rt` (same bits) for multi-head inputs (m > 1 rows per token,
# q-like) and the specialised kernel for one row per token (kv). Session 6 run 3 (H200, benchmarks/results/
# 2026-11-30-s6-bench-tile_kernels-quant.json, bit-equal, GPU tests test_rope_configs.py passed): q [t, 64, 512]
# 1.17x / 1.17x / 1.10x / 1.01x at 16,384 / 4,096 / 64 / 1 tokens (86 -> 101 % of copy at 16,384); kv [t, 512]
# 0.99x / 1.06x / 1.03x / 0.77x, so kv keeps the specialised kernel.
CS_RT_DEFAULT = True
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _rot_loads(x_row, tok, pm, k, ev, cos_ptr, sin_ptr, stride_ct, stride_ck, stride_st, stride_sk, stride_xd):
    """The rotate part's loads: cos, sin [BM, BR] and the even / odd columns a, b [BM, BR], all fp32."""
    c = tl.load(cos_ptr + tok[:, None] * stride_ct + k[None, :] * stride_ck, mask=pm, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + tok[:, None] * stride_st + k[None, :] * stride_sk, mask=pm, other=0.0).to(tl.float32)
    a = tl.load(x_row[:, None] + ev[None, :] * stride_xd, mask=pm, other=0.0).to(tl.float32)
    b = tl.load(x_row[:, None] + (ev + 1)[None, :] * stride_xd, mask=pm, other=0.0).to(tl.float32)
    return c, s, a, b


@triton.jit
def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    y_ptr,
    n_rows,
    M,
    d,
    rope_start,
    stride_xt,
    stride_xm,
    stride_xd,
    stride_ct,
    stride_ck,
    stride_st,
    stride_sk,
    INVERSE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
    EARLY_ROT: tl.constexpr,
):
    """x [t, M, d] (strided), cos/sin [t, (d - rope_start) / 2] (strided) -> y [t, M, d] contiguous.

    Rows are the flattened t * M; BLOCK_R >= (d - rope_start) / 2 pairs per row. EARLY_ROT issues the rotate
    part's loads before the copy (the copy's stores may alias x for all the compiler knows, so otherwise those
    loads wait for them: two DRAM round trips per program instead of one); same arithmetic, same bits.
    """
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM] flattened row
    rmask = rows < n_rows
    tok = rows // M
    x_row = x_ptr + tok * stride_xt + (rows % M) * stride_xm  # [BM]
    y_row = y_ptr + rows * d  # [BM]

    k = tl.arange(0, BLOCK_R)
    pm = rmask[:, None] & (k < (d - rope_start) // 2)[None, :]  # [BM, BR]
    ev = rope_start + 2 * k  # [BR]
    if EARLY_ROT:
        c, s, a, b = _rot_loads(
            x_row, tok, pm, k, ev, cos_ptr, sin_ptr, stride_ct, stride_ck, stride_st, stride_sk, stride_xd
        )

    # copy the pass-through columns: loaded bytes stored as they are
    cc = tl.arange(0, BLOCK_C)
    for c0 in range(0, rope_start, BLOCK_C):
        col = c0 + cc
        m2 = rmask[:, None] & (col < rope_start)[None, :]
        xv = tl.load(x_row[:, None] + col[None, :] * stride_xd, mask=m2)
        tl.store(y_row[:, None] + col[None, :], xv, mask=m2)

    # rotate the pairs: even column rope_start + 2k, odd column rope_start + 2k + 1
    if not EARLY_ROT:
        c, s, a, b = _rot_loads(
            x_row, tok, pm, k, ev, cos_ptr, sin_ptr, stride_ct, stride_ck, stride_st, stride_sk, stride_xd
        )
    if INVERSE:
        # flip the sign bit, as torch's negate (sin = 0 -> -0.0); a float `-s` may compile to 0 - s (+0.0)
        s = (s.to(tl.int32, bitcast=True) ^ -2147483648).to(tl.float32, bitcast=True)
    tl.store(y_row[:, None] + ev[None, :], (a * c - b * s).to(y_ptr.dtype.element_ty), mask=pm)
    tl.store(y_row[:, None] + (ev + 1)[None, :], (a * s + b * c).to(y_ptr.dtype.element_ty), mask=pm)


@triton.jit
def _rope_row_kernel(
    x_ptr, cos_ptr, sin_ptr, y_ptr, n_rows, M, d, rope_start,
    stride_xt, stride_xm, stride_xd, stride_ct, stride_ck, stride_st, stride_sk,
    INVERSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """`_rope_kernel`'s contract (same arguments but the blocks; same bits) with whole rows as one tile (session 6,
    config `row*`): each of the BLOCK_M rows is loaded once as a [BLOCK_D] vector (BLOCK_D >= d, full-width vector
    loads, no strided even / odd loads), its pairs rotated in registers, and stored once. The pass-through columns
    are selected from the loaded values themselves (a select of x.dtype bits: NaN payloads and -0.0 kept); the
    rotated ones are the default's fp32 arithmetic (fp fusion off), rounded by the same cast. Every pair of the row
    is rotated (cos / sin only loaded for the rope pairs, 1 / 0 elsewhere) and the results outside the rope region
    dropped: more ALU work for one memory pass."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM] flattened row
    rmask = rows < n_rows
    tok = rows // M
    x_row = x_ptr + tok * stride_xt + (rows % M) * stride_xm  # [BM]
    cols = tl.arange(0, BLOCK_D)
    m2 = rmask[:, None] & (cols < d)[None, :]
    xv = tl.load(x_row[:, None] + cols[None, :] * stride_xd, mask=m2, other=0.0)  # [BM, BD] x.dtype
    k = tl.arange(0, BLOCK_D // 2) - rope_start // 2  # pair index inside the rope region
    kr = (k >= 0) & (k < (d - rope_start) // 2)
    kk = tl.maximum(k, 0)
    km = rmask[:, None] & kr[None, :]
    c = tl.load(cos_ptr + tok[:, None] * stride_ct + kk[None, :] * stride_ck, mask=km, other=1.0).to(tl.float32)
    sn = tl.load(sin_ptr + tok[:, None] * stride_st + kk[None, :] * stride_sk, mask=km, other=0.0).to(tl.float32)
    if INVERSE:  # flip the sign bit, as torch's negate (see _rope_kernel)
        sn = (sn.to(tl.int32, bitcast=True) ^ -2147483648).to(tl.float32, bitcast=True)
    a, b = tl.split(tl.reshape(xv, [BLOCK_M, BLOCK_D // 2, 2]))  # x.dtype pairs (2k, 2k + 1)
    af, bf = a.to(tl.float32), b.to(tl.float32)
    dt = y_ptr.dtype.element_ty
    ra = tl.where(kr[None, :], (af * c - bf * sn).to(dt), a)
    rb = tl.where(kr[None, :], (af * sn + bf * c).to(dt), b)
    y = tl.reshape(tl.join(ra, rb), [BLOCK_M, BLOCK_D])
    tl.store(y_ptr + rows[:, None] * d + cols[None, :], y, mask=m2)


# `_rope_kernel` compiled with the cos / sin column strides as run-time values (session 6, config `cs_rt`). With the
# usual specialisation (a stride of 1 becomes a constant) Triton loads cos / sin [BM, BR] fp32 as 16-byte vectors
# and converts them to the layout of the even / odd x columns through shared memory (sm_90a SASS, Triton 3.6: cos
# load -> st.shared -> bar.sync, then the sin load -> st.shared -> bar.sync, then the x loads): three dependent DRAM
# round trips per program. Unspecialised, the compiler knows nothing of their contiguity and loads them as scalars
# straight into that layout: no shared memory, no barrier, every load of the program issued before the first use.
# Same arithmetic, same bits.
_rope_kernel_cs_rt = triton.jit(do_not_specialize=["stride_ck", "stride_sk"])(_rope_kernel.fn)


def _blocks(rows: int, d: int, rope_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_C, BLOCK_R, num_warps) from the shape alone: small BLOCK_M when there are few rows.

    A [BLOCK_M, BLOCK_C] copy tile holds up to TILE_ELEMS elements (16 per thread at 8 warps: two 16-byte
    vectors of bf16 per load), so a program moves ~16 KB for q's and kv's 512-wide rows.
    """
    bc = min(MAX_BLOCK_C, max(16, triton.next_power_of_2(d - rope_dim)))
    bm = max(1, TILE_ELEMS // max(bc, triton.next_power_of_2(d)))
    while bm > 1 and triton.cdiv(rows, bm) < TARGET_PROGRAMS:
        bm //= 2
    if rows * d <= SMALL_ELEMS:
        bm = min(bm, SMALL_BLOCK_M)
    br = max(2, triton.next_power_of_2(rope_dim // 2))
    return bm, bc, br, max(1, min(8, bm * bc // 512))


def _early_rotate(rows: int, d: int) -> bool:
    """Default EARLY_ROT: on for inputs of at most SMALL_ELEMS elements (the kv path), off above (q)."""
    return rows * d <= SMALL_ELEMS


def apply_rope_interleaved_triton(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope_dim: int,
    inverse: bool = False,
    out: torch.Tensor | None = None,
    *,
    block_m: int | None = None,
    num_warps: int | None = None,
    early_rotate: bool | None = None,
    row_tile: bool = False,
    cs_rt: bool | None = None,
) -> torch.Tensor:
    """Rotate the last `rope_dim` dims of x by interleaved pairs, same contract as `ref.rope.apply_rope_interleaved`.

    x: [t, ..., d] fp32/bf16/fp16 (any number of middle dims, any strides; middle dims that cannot be merged
    into one stride are copied first); cos/sin: [t, rope_dim/2] fp32/bf16/fp16 (fp32 in V4, any strides), pair k of
    token i rotates by (cos[i, k], sin[i, k]), by -angle when `inverse`. rope_dim even, 0 < rope_dim <= d.
    Returns a new tensor of x's shape and dtype (contiguous): the first d - rope_dim dims copied, the rest
    rotated in fp32. With `out` (contiguous, x's shape and dtype, not sharing x's storage) the result is
    written there. Shape checks only, no host sync. block_m / num_warps: benchmark configs (rows per program, a
    power of two, and warps; None: `_blocks`' choice); early_rotate: the kernel's EARLY_ROT (None: on for inputs of
    at most SMALL_ELEMS elements, `_early_rotate`; True / False: the benchmark configs early_rot / late_rot).
    row_tile (a benchmark config, session 6; d <= MAX_ROW_D): `_rope_row_kernel`, whole rows as one tile (same
    bits), block_m rows of num_warps warps per program (None: `_blocks`' choice). cs_rt (session 6; None:
    CS_RT_DEFAULT and more than one row per token, i.e. q: the default since run 3): `_rope_kernel_cs_rt`,
    `_rope_kernel` compiled with unspecialised cos / sin strides (same bits).
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in _DTYPES:
        raise TypeError(f"x must be a fp32/bf16/fp16 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() < 2:
        raise ValueError(f"x must be [t, ..., d] (2+ dims), got shape {tuple(x.shape)}")
    t, d = x.shape[0], x.shape[-1]
    if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim % 2 or not 0 < rope_dim <= d:
        raise ValueError(f"rope_dim must be an even int in (0, {d}], got {rope_dim!r}")
    for name, cs in (("cos", cos), ("sin", sin)):
        if not isinstance(cs, torch.Tensor) or cs.dtype not in _DTYPES:
            raise TypeError(f"{name} must be a fp32/bf16/fp16 tensor, got {getattr(cs, 'dtype', type(cs).__name__)}")
        if tuple(cs.shape) != (t, rope_dim // 2):
            raise ValueError(f"{name} must have shape {(t, rope_dim // 2)}, got {tuple(cs.shape)}")
    check_runnable(x, cos, sin)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    elif (
        tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous()
    ):
        raise ValueError(
            f"out must be contiguous {x.dtype} {list(x.shape)} on {x.device}, "
            f"got {out.dtype} {list(out.shape)} on {out.device} (contiguous={out.is_contiguous()})"
        )
    elif out.numel() and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        raise ValueError("out must not share storage with x (a column reads its pair partner: no in-place RoPE)")
    m = math.prod(x.shape[1:-1])
    if x.numel() == 0:
        return out
    x3 = x.reshape(t, m, d)  # a view whenever the middle dims merge into one stride
    if row_tile:
        _launch_rows(x3, cos, sin, out, rope_dim, bool(inverse), block_m, num_warps)
        return out
    bm, bc, br, warps = _blocks(t * m, d, rope_dim)
    if block_m is not None:
        bm, warps = block_m, max(1, min(8, block_m * bc // 512))
    warps = num_warps or warps
    use_rt = (CS_RT_DEFAULT and m > 1) if cs_rt is None else cs_rt
    kernel = _rope_kernel_cs_rt if use_rt else _rope_kernel
    kernel[(triton.cdiv(t * m, bm),)](
        x3,
        cos,
        sin,
        out,
        t * m,
        m,
        d,
        d - rope_dim,
        x3.stride(0),
        x3.stride(1),
        x3.stride(2),
        cos.stride(0),
        cos.stride(1),
        sin.stride(0),
        sin.stride(1),
        INVERSE=bool(inverse),
        BLOCK_M=bm,
        BLOCK_C=bc,
        BLOCK_R=br,
        EARLY_ROT=_early_rotate(t * m, d) if early_rotate is None else bool(early_rotate),
        num_warps=warps,
        enable_fp_fusion=False,  # no FMA: round like the reference (module docstring)
    )
    return out


def _launch_rows(
    x3: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor, rope_dim: int, inverse: bool,
    block_m: int | None, num_warps: int | None,
) -> None:  # fmt: skip
    """`_rope_row_kernel` on x3 [t, m, d] (the `row_tile` config): block_m rows per program (None: `_blocks`'),
    num_warps (None: one warp per 512 elements of the tile, at most 8)."""
    t, m, d = x3.shape
    if d > MAX_ROW_D:
        raise ValueError(f"row_tile takes rows of at most {MAX_ROW_D} elements, got d = {d}")
    bd = max(16, triton.next_power_of_2(d))
    bm = block_m or _blocks(t * m, d, rope_dim)[0]
    warps = num_warps or max(1, min(8, bm * bd // 512))
    _rope_row_kernel[(triton.cdiv(t * m, bm),)](
        x3, cos, sin, out, t * m, m, d, d - rope_dim, x3.stride(0), x3.stride(1), x3.stride(2),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        INVERSE=inverse, BLOCK_M=bm, BLOCK_D=bd, num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
