"""Fused Triton kernels of the V4 forward (`ref/fused.py`): each reads its input once and writes its output once.

* `swiglu_clamp_fp8_triton`: SwiGLU with clamp, rounded to gate.dtype (as the unfused path stores it), then the
  per-group FP8 quantisation of `triton_quant` (q e4m3 + fp32 scales). The [rows, n] SwiGLU output never
  reaches memory.
* `kv_norm_rope_quant_triton`: V4's KV entry per token row [d]: RMSNorm (weight, fp32, the order of
  `triton_norm`), rounded to kv.dtype; RoPE of the last rope_dim dims as interleaved pairs (fp fusion off, the
  reference's roundings, see `triton_rope`), rounded to kv.dtype; the FP8 quant-dequant of the other dims in
  blocks (bit-exact `triton_quant` math); the row written into a cache at rows[i] (the paged write), or a new
  tensor. A program takes BLOCK_T tokens (1 at d = 512, one warp); the rows live in registers. (A prefetching
  loop kernel, several such blocks per program with the next block's loads issued first, lost to this at every
  count from 4,096 tokens up on the H200, 0.44-0.93x, and was removed after session 5: see the README.)
Both round to the activation dtype between steps exactly where the unfused reference does, so the only
differences from the reference are those of the single kernels (fp32 reduction order, exp accuracy), which can
move a value by one bf16 ulp before the quantiser. No host sync (CUDA-graph safe); blocks from shapes only.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import triton_quant as _quant
from ._launch import check_runnable
from .triton_act import swiglu_math
from .triton_quant import (
    FP8_MAX,
    MAX_GROUP,
    fits_int32,
    persistent_tiles,
    quant_store,
    quant_tile_store,
    tile_groups,
    tiles_grid,
)

__all__ = ["kv_norm_rope_quant_triton", "swiglu_clamp_fp8_triton"]

TILE_ELEMS = 4096
KV_TARGET_PROGRAMS = 512
# KV tile: 1 token of d = 512 per program, 1 warp (H200, 2026-11-30: 19.7 us vs 23.9 for 2 tokens / 2 warps and
# 36.7 for 8 / 8, bit-identical; the 16 MB op is launch / tail bound, and small programs spread it over the SMs
# in finer steps). Session 5's 14:30 run (benchmarks/results/2026-11-30-s5r3-bench-tile_kernels-quant.json): more
# tokens per 1-warp program were faster from 4,096 tokens up (bt4_w1 1.08x at 16,384, bt2_w1 1.04x at 4,096; 0.67-
# 0.93x at 1 / 64); they were tested within one ulp of this default, not bit for bit, so no size rule was switched
# on (round 4 below: with one warp per row they keep this default's sum order)
KV_TILE_ELEMS = 512
# The default since session 6 (prepared in session 5 round 4): one warp per token row, more rows per program from
# 4,096 tokens up ((min tokens, tokens per 1-warp program), largest first). With one warp and one BLOCK_D = 512 row
# per warp, Triton gives the [BT, 512] tile the default [1, 512] tile's layout along the row (8 contiguous columns
# per lane, 32 lanes, 1 warp: tests/tk_kv_layout.py checks the sm_90 TTGIR), and its reduce lowers each row from
# that row's own registers and lanes, so every row's RMSNorm sum is added in the default's order: the same bits
# (GPU test: test_kv_rows_exact.py, passed on the H200 in session 6 run 1, where rows_rule ran 1.09x / 1.06x / 1.01x
# the 1-row tiling at 16,384 / 4,096 / 64 tokens: build/s6, benchmarks/results/2026-11-30-s6-tkkv.json).
# DEEPINFER_TK_KV_ROWS=0 (or row_rule=False) keeps one token per program at every count.
KV_ROWS_RULE: tuple[tuple[int, int], ...] = ((16384, 4), (4096, 2))
KV_ROWS_RULE_ON = os.environ.get("DEEPINFER_TK_KV_ROWS", "1") != "0"
MAX_D = 16384
# Session 6 run 3 (H200, benchmarks/results/2026-11-30-s6-bench-tile_kernels-quant.json, every row bit-equal to the
# old default; GPU tests test_quant_lean.py passed): swiglu_clamp_fp8 with silu's exp by `_exp_ftz` on top of the lean
# epilogue 1.45x / 1.40x / 1.07x / 1.05x the old default at 16,384 / 4,096 / 64 / 1 tokens (101.9 % of copy at
# 16,384); kv_norm_rope_quant's lean quant-dequant 1.11x / 1.16x / 1.07x / 1.08x. Both defaults since then.
FTZ_EXP_DEFAULT = True
KV_LEAN_DEFAULT = True
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DEQUANT = tl.constexpr(3)  # triton_quant's mode numbers: 1 = 2^e scales, 2 = amax / 448, 3 = dequantise


@triton.jit
def _rne_bf16(x):
    """fp32 x rounded to the nearest bf16 (ties to even), as fp32: the GPU's cvt.rn in integer steps, because
    Triton's interpreter truncates fp32 -> bf16 casts (the CPU tests then check the GPU's arithmetic; on the GPU
    `_round_act` uses the cast itself). NaN kept."""
    b = x.to(tl.int32, bitcast=True)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, r)


@triton.jit
def _round_act(x, dt: tl.constexpr, IS_BF16: tl.constexpr, HW_CAST: tl.constexpr = False):
    """fp32 x rounded to the activation dtype dt (round to nearest even), returned as fp32. HW_CAST (GPU): the
    hardware cast also for bf16 (cvt.rn: the same rounding as `_rne_bf16`, one instruction instead of ~6)."""
    if IS_BF16 and not HW_CAST:
        y = _rne_bf16(x)
    else:
        y = x.to(dt).to(tl.float32)
    return y


@triton.jit
def _swiglu_fp8_kernel(
    g_ptr, u_ptr, q_ptr, s_ptr, y_ptr,
    n_groups, groups_per_row, sgr, sgc, sur, suc, limit, inv_max,
    HAS_LIMIT: tl.constexpr, STORE_Y: tl.constexpr, MODE: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr, IS_BF16: tl.constexpr, HW_CAST: tl.constexpr,
):  # fmt: skip
    """gate, up [rows, n] strided -> q e4m3 [rows, n] + scales fp32 [rows, n / GROUP] (STORE_Y: the rounded SwiGLU
    output y [rows, n] in gate's dtype instead, for tests)."""
    g = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    gmask = g < n_groups
    row = g // groups_per_row
    col = (g % groups_per_row)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = gmask[:, None]
    gt = tl.load(g_ptr + row[:, None] * sgr + col * sgc, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(u_ptr + row[:, None] * sur + col * suc, mask=mask, other=0.0).to(tl.float32)
    y = _round_act(swiglu_math(gt, up, limit, HAS_LIMIT), y_ptr.dtype.element_ty, IS_BF16, HW_CAST)  # as unfused
    if STORE_Y:
        tl.store(y_ptr + g[:, None] * GROUP + tl.arange(0, GROUP)[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        quant_tile_store(y, g, gmask, q_ptr, s_ptr, inv_max, MODE, GROUP, BLOCK_G, HW_CAST)


@triton.jit
def _load_swiglu(g_ptr, u_ptr, tile, n_groups, groups_per_row, sgr, sgc, sur, suc, limit, dt: tl.constexpr,
                 HAS_LIMIT: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, IS_BF16: tl.constexpr,
                 HW_CAST: tl.constexpr, IDX32: tl.constexpr, GPR: tl.constexpr,
                 FTZ_EXP: tl.constexpr = False):  # fmt: skip
    """Tile `tile`'s gate / up groups [BG, GROUP] -> the SwiGLU output rounded to dt (fp32), group ids, mask
    (FTZ_EXP: triton_act's flush-to-zero exp, GPU only, same bits)."""
    g, gmask, row, gcol = tile_groups(tile, n_groups, groups_per_row, BLOCK_G, IDX32, GPR)
    col = gcol[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = gmask[:, None]
    gt = tl.load(g_ptr + row[:, None] * sgr + col * sgc, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(u_ptr + row[:, None] * sur + col * suc, mask=mask, other=0.0).to(tl.float32)
    y = swiglu_math(gt, up, limit, HAS_LIMIT, FTZ_EXP and HW_CAST)
    return _round_act(y, dt, IS_BF16, HW_CAST), g, gmask


@triton.jit
def _swiglu_fp8_tiles_kernel(
    g_ptr, u_ptr, q_ptr, s_ptr, n_groups, groups_per_row, sgr, sgc, sur, suc, limit, inv_max,
    HAS_LIMIT: tl.constexpr, MODE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    IS_BF16: tl.constexpr, HW_CAST: tl.constexpr, IDX32: tl.constexpr, GPR: tl.constexpr, TILES: tl.constexpr,
    LEAN: tl.constexpr = False, FTZ_EXP: tl.constexpr = False,
):  # fmt: skip
    """`_swiglu_fp8_kernel` (q and scales only) with triton_quant's benchmark configs: int32 / constexpr-width
    indexing and TILES tiles per program (tile pid + i * grid), the next tile's gate / up loaded before the current
    tile is quantised and stored (TILES = 0: persistent, striding over every tile, as triton_quant's tiles kernel);
    LEAN: triton_quant's `quant_tile_store_lean` (same bytes); FTZ_EXP: triton_act's `_exp_ftz` (GPU, same bits)."""
    dt = g_ptr.dtype.element_ty  # the SwiGLU output's dtype (gate's, as the unfused path stores it)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    y, g, gmask = _load_swiglu(g_ptr, u_ptr, pid, n_groups, groups_per_row, sgr, sgc, sur, suc, limit, dt,
                               HAS_LIMIT, GROUP, BLOCK_G, IS_BF16, HW_CAST, IDX32, GPR, FTZ_EXP)  # fmt: skip
    if TILES == 0:
        for tile in range(pid + nprog, tl.cdiv(n_groups, BLOCK_G).to(tl.int32), nprog):  # tile ids are < 2^31
            yn, gn, gmn = _load_swiglu(g_ptr, u_ptr, tile, n_groups, groups_per_row, sgr, sgc, sur, suc, limit, dt,
                                       HAS_LIMIT, GROUP, BLOCK_G, IS_BF16, HW_CAST, IDX32, GPR, FTZ_EXP)  # fmt: skip
            quant_store(y, g, gmask, q_ptr, s_ptr, inv_max, MODE, GROUP, BLOCK_G, HW_CAST, LEAN)
            y, g, gmask = yn, gn, gmn
    for i in tl.static_range(1, TILES):
        yn, gn, gmn = _load_swiglu(g_ptr, u_ptr, pid + i * nprog, n_groups, groups_per_row, sgr, sgc, sur, suc,
                                   limit, dt, HAS_LIMIT, GROUP, BLOCK_G, IS_BF16, HW_CAST, IDX32, GPR,
                                   FTZ_EXP)  # fmt: skip
        quant_store(y, g, gmask, q_ptr, s_ptr, inv_max, MODE, GROUP, BLOCK_G, HW_CAST, LEAN)
        y, g, gmask = yn, gn, gmn
    quant_store(y, g, gmask, q_ptr, s_ptr, inv_max, MODE, GROUP, BLOCK_G, HW_CAST, LEAN)


@triton.jit
def _cos_sin(cos_ptr, sin_ptr, tok, kk, km, sct, sck, sst, ssk):
    """cos, sin [BT, BD / 2] fp32 of the rope pairs (1 and 0 outside the rope region)."""
    c = tl.load(cos_ptr + tok[:, None] * sct + kk[None, :] * sck, mask=km, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + tok[:, None] * sst + kk[None, :] * ssk, mask=km, other=0.0).to(tl.float32)
    return c, s


@triton.jit
def _kv_norm(x, w, d, eps, dt: tl.constexpr, IS_BF16: tl.constexpr, HW_CAST: tl.constexpr):
    """RMSNorm of fp32 rows x [BT, BD] with weight w [BD] (triton_norm's order), rounded to dt (as fp32)."""
    ms = tl.sum(x * x, axis=1) / d  # [BT], triton_norm's order
    r = 1.0 / tl.sqrt(ms + eps)
    return _round_act(w[None, :] * (x * r[:, None]), dt, IS_BF16, HW_CAST)


@triton.jit
def _pairs(y, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """y [BT, BD] -> its pairs (2k, 2k + 1) as two [BT, BD / 2] tensors."""
    return tl.split(tl.reshape(y, [BLOCK_T, BLOCK_D // 2, 2]))


@triton.jit
def _kv_rope(a, b, c, s, kr, dt: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, IS_BF16: tl.constexpr,
             HW_CAST: tl.constexpr):  # fmt: skip
    """Rotate the pairs (a, b) [BT, BD / 2] where kr (rope pairs) by cos / sin c, s [BT, BD / 2]; each result
    rounded to dt (fp fusion off: the reference's roundings); returns the rows [BT, BD]."""
    ra = _round_act(tl.where(kr[None, :], a * c - b * s, a), dt, IS_BF16, HW_CAST)
    rb = _round_act(tl.where(kr[None, :], a * s + b * c, b), dt, IS_BF16, HW_CAST)
    return tl.reshape(tl.join(ra, rb), [BLOCK_T, BLOCK_D])


@triton.jit
def _kv_store(
    y, t0, T, d, out_ptr, rows_ptr, sor, inv_max,
    HAS_ROWS: tl.constexpr, NOPE: tl.constexpr, QUANT: tl.constexpr, QB: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr, HW_CAST: tl.constexpr, LEAN: tl.constexpr = False,
):  # fmt: skip
    """Write the entries y [BT, BD] of tokens t0 .. t0 + BT - 1 (< T) to out[rows[token]] (or out[token]): the rope
    dims as they are, the first NOPE dims FP8 quant-dequantised in blocks of QB (QUANT) or as they are."""
    tok = t0 + tl.arange(0, BLOCK_T)
    tmask = tok < T
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < d
    if HAS_ROWS:
        orow = tl.load(rows_ptr + tok, mask=tmask, other=-1).to(tl.int64)
    else:
        orow = tl.where(tmask, tok, -1)
    ok = orow >= 0  # negative row (or past T): skip the token
    dst = out_ptr + tl.maximum(orow, 0) * sor  # [BT] row pointers
    if QUANT:
        m2 = ok[:, None] & (cmask & (cols >= NOPE))[None, :]
        tl.store(dst[:, None] + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=m2)
        # the nope dims as BLOCK_T * GPR groups of QB; group f is block f % GPR of token f // GPR
        GPR: tl.constexpr = BLOCK_D // QB
        f = tl.arange(0, BLOCK_T * GPR)
        gi = f % GPR
        gt = t0 + f // GPR  # each group's token
        if HAS_ROWS:  # its row again (a cached load: a register tensor cannot be gathered)
            grow = tl.load(rows_ptr + gt, mask=gt < T, other=-1).to(tl.int64)
        else:
            grow = tl.where(gt < T, gt, -1)
        gdst = out_ptr + tl.maximum(grow, 0) * sor  # [BT * GPR]
        yq = tl.reshape(y, [BLOCK_T * GPR, QB])
        quant_store(
            yq,
            gi,
            (gi < NOPE // QB) & (grow >= 0),
            gdst[:, None],
            gdst[:, None],
            inv_max,
            _DEQUANT,
            QB,
            BLOCK_T * GPR,
            HW_CAST,
            LEAN,
        )
    else:
        tl.store(dst[:, None] + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=ok[:, None] & cmask[None, :])


@triton.jit
def _kv_fused_kernel(
    kv_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, rows_ptr,
    T, d, skr, skc, sw, sct, sck, sst, ssk, sor, eps, inv_max,
    HAS_ROWS: tl.constexpr, NOPE: tl.constexpr, QUANT: tl.constexpr, QB: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr, IS_BF16: tl.constexpr, HW_CAST: tl.constexpr, EARLY_CS: tl.constexpr,
    LEAN: tl.constexpr = False,
):  # fmt: skip
    """kv [T, d] strided, weight [d], cos/sin [T, (d - NOPE) / 2] -> out[rows[i]] (row stride sor, unit columns).

    BLOCK_T tokens per program as a [BLOCK_T, BLOCK_D] tile (one token per program left a 1 KB row and two warps
    per program at V4's d = 512: latency-bound at a third of the copy bandwidth). EARLY_CS issues the cos / sin
    loads with kv's (otherwise after the norm's cross-warp reduction: a second DRAM round trip per program) at
    the cost of holding them in registers through the norm; same arithmetic, same bits.
    """
    t0 = tl.program_id(0).to(tl.int64) * BLOCK_T
    tok = t0 + tl.arange(0, BLOCK_T)  # [BT]
    tmask = tok < T
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < d
    x = tl.load(kv_ptr + tok[:, None] * skr + cols[None, :] * skc, mask=tmask[:, None] & cmask[None, :], other=0.0).to(
        tl.float32
    )
    k = tl.arange(0, BLOCK_D // 2) - NOPE // 2  # pair index inside the rope region
    kr = (k >= 0) & (k < (d - NOPE) // 2)
    kk = tl.maximum(k, 0)
    km = tmask[:, None] & kr[None, :]
    if EARLY_CS:
        c, s = _cos_sin(cos_ptr, sin_ptr, tok, kk, km, sct, sck, sst, ssk)
    w = tl.load(w_ptr + cols * sw, mask=cmask, other=0.0).to(tl.float32)
    dt = kv_ptr.dtype.element_ty
    a, b = _pairs(_kv_norm(x, w, d, eps, dt, IS_BF16, HW_CAST), BLOCK_T, BLOCK_D)
    if not EARLY_CS:
        c, s = _cos_sin(cos_ptr, sin_ptr, tok, kk, km, sct, sck, sst, ssk)
    y = _kv_rope(a, b, c, s, kr, dt, BLOCK_T, BLOCK_D, IS_BF16, HW_CAST)
    _kv_store(y, t0, T, d, out_ptr, rows_ptr, sor, inv_max, HAS_ROWS, NOPE, QUANT, QB, BLOCK_T, BLOCK_D, HW_CAST, LEAN)


def _float(name: str, t: object, ndim: int | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPES:
        raise TypeError(f"{name} must be a fp32/bf16/fp16 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    return t


def swiglu_clamp_fp8_triton(
    gate: torch.Tensor,
    up: torch.Tensor,
    limit: float | None = 10.0,
    group_size: int = 128,
    scale_fmt: str = "ue8m0",
    store_y: bool = False,
    *,
    tile_elems: int | None = None,
    num_warps: int | None = None,
    idx32: bool = True,
    const_gpr: bool = True,
    tiles_per_program: int = 1,
    lean: bool | int | None = None,
    persistent: int = 0,
    ftz_exp: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """per_token_group_quant_fp8(swiglu_clamp(gate, up, limit), group_size, scale_fmt) in one pass.

    gate, up: [..., n] same shape, fp32/bf16/fp16, any strides; n % group_size == 0, group_size a power of two
    in [2, 4096]; scale_fmt "ue8m0" (2^e scales) or "fp32" (amax / 448). Returns (q float8_e4m3fn [..., n],
    scales fp32 [..., n / group_size]). `store_y` (tests): returns (the SwiGLU output in gate.dtype, None).
    tile_elems / num_warps: benchmark configs (None: TILE_ELEMS elements per program, the default warps).
    idx32 / const_gpr / tiles_per_program: as in `triton_quant.fp8_group_quant_triton` (any set, as by default, and
    not store_y: `_swiglu_fp8_tiles_kernel`; idx32=False, const_gpr=False: the session-4 `_swiglu_fp8_kernel`, the
    benchmark config `i64`; same bits). The i32c default since after session 5's 14:30 run: 1.04-1.15x the old
    kernel at 1 / 64 / 4,096 / 16,384 tokens (benchmarks/results/2026-11-30-s5r3-bench-tile_kernels-quant.json).
    lean (session 6; not with store_y; None: triton_quant.LEAN_DEFAULT, True since run 3): the tiles kernel with
    `quant_tile_store_lean`.
    persistent (a benchmark config, session 6; not with store_y): programs per SM of a persistent tiles launch.
    ftz_exp (session 6; the tiles kernel; None: FTZ_EXP_DEFAULT): silu's exp by triton_act's `_exp_ftz` (same bits).
    """
    legacy = not (idx32 or const_gpr)  # the `i64` config: the session-4 kernel, no session-6 options by default
    ftz_exp = (FTZ_EXP_DEFAULT and not legacy) if ftz_exp is None else bool(ftz_exp)
    _float("gate", gate)
    _float("up", up)
    if gate.shape != up.shape or gate.dim() < 1:
        raise ValueError(f"gate and up must have one shape [..., n], got {tuple(gate.shape)} and {tuple(up.shape)}")
    if isinstance(limit, bool) or (limit is not None and not isinstance(limit, (int, float))):
        raise TypeError(f"limit must be a float or None, got {type(limit).__name__}")
    n = gate.shape[-1]
    if isinstance(group_size, bool) or not isinstance(group_size, int) or not 2 <= group_size <= MAX_GROUP:
        raise ValueError(f"group_size must be a power of two in [2, {MAX_GROUP}], got {group_size!r}")
    if group_size & (group_size - 1) or n % group_size:
        raise ValueError(f"group_size must be a power of two dividing n = {n}, got {group_size}")
    if scale_fmt not in ("ue8m0", "fp32"):
        raise ValueError(f"scale_fmt must be 'ue8m0' or 'fp32', got {scale_fmt!r}")
    check_runnable(gate, up)
    lean = _quant.lean_level(lean, legacy)  # LEAN_DEFAULT read at call time: the switch is one constant
    shape, dev = tuple(gate.shape), gate.device
    y = torch.empty(shape if store_y else (1,), dtype=gate.dtype, device=dev)
    q = torch.empty(shape if not store_y else (1,), dtype=torch.float8_e4m3fn, device=dev)
    s = torch.empty((*shape[:-1], n // group_size) if not store_y else (1,), dtype=torch.float32, device=dev)
    n_groups = gate.numel() // group_size
    if n_groups:
        g2, u2 = gate.reshape(-1, n), up.reshape(-1, n)
        bg = max(1, min((tile_elems or TILE_ELEMS) // group_size, triton.next_power_of_2(n_groups)))
        if not store_y and (idx32 or const_gpr or tiles_per_program != 1 or lean or persistent or ftz_exp):
            cfg = (idx32, const_gpr, persistent_tiles(persistent, tiles_per_program), lean, persistent, ftz_exp)
            _swiglu_tiles(g2, u2, q, s, limit, scale_fmt, group_size, bg, num_warps, *cfg)
            return q, s
        _swiglu_fp8_kernel[(triton.cdiv(n_groups, bg),)](
            g2, u2, q.view(torch.uint8), s, y,
            n_groups, n // group_size, g2.stride(0), g2.stride(1), u2.stride(0), u2.stride(1),
            float(limit) if limit is not None else 0.0, 1.0 / FP8_MAX,
            HAS_LIMIT=limit is not None, STORE_Y=store_y, MODE=1 if scale_fmt == "ue8m0" else 2, GROUP=group_size,
            BLOCK_G=bg, IS_BF16=gate.dtype == torch.bfloat16, HW_CAST=gate.is_cuda,
            num_warps=num_warps or max(1, min(8, bg * group_size // 512)), enable_fp_fusion=False,
        )  # fmt: skip
    return (y, None) if store_y else (q, s)


def _swiglu_tiles(
    g2: torch.Tensor, u2: torch.Tensor, q: torch.Tensor, s: torch.Tensor, limit: float | None, scale_fmt: str,
    group: int, bg: int, num_warps: int | None, idx32: bool, const_gpr: bool, tiles: int, lean: bool = False,
    persistent: int = 0, ftz_exp: bool = False,
) -> None:  # fmt: skip
    """`_swiglu_fp8_tiles_kernel` on gate / up [rows, n] (default and configs of `swiglu_clamp_fp8_triton`; tiles
    0: persistent, `persistent` programs per SM)."""
    n_groups, gpr = g2.numel() // group, g2.shape[1] // group
    grid = tiles_grid(triton.cdiv(n_groups, bg), tiles, persistent, g2.device)
    use32 = idx32 and fits_int32(g2, u2, q, extra=(triton.cdiv(n_groups, bg) + grid * max(tiles, 1) + 1) * bg * group)
    _swiglu_fp8_tiles_kernel[(grid,)](
        g2, u2, q.view(torch.uint8), s, n_groups, gpr, g2.stride(0), g2.stride(1), u2.stride(0), u2.stride(1),
        float(limit) if limit is not None else 0.0, 1.0 / FP8_MAX,
        HAS_LIMIT=limit is not None, MODE=1 if scale_fmt == "ue8m0" else 2, GROUP=group, BLOCK_G=bg,
        IS_BF16=g2.dtype == torch.bfloat16, HW_CAST=g2.is_cuda, IDX32=use32, GPR=gpr if const_gpr else 0,
        TILES=tiles, LEAN=int(lean), FTZ_EXP=bool(ftz_exp), num_warps=num_warps or max(1, min(8, bg * group // 512)),
        enable_fp_fusion=False,
    )  # fmt: skip


def _check_kv(kv: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int) -> None:
    _float("kv", kv, 2)
    t, d = kv.shape
    if tuple(_float("weight", weight, 1).shape) != (d,):
        raise ValueError(f"weight must have shape {(d,)}, got {tuple(weight.shape)}")
    if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim % 2 or not 0 < rope_dim <= d:
        raise ValueError(f"rope_dim must be an even int in (0, {d}], got {rope_dim!r}")
    if d % 2 or d > MAX_D:
        raise ValueError(f"kv's last dim must be even and <= {MAX_D}, got {d}")
    for name, cs in (("cos", cos), ("sin", sin)):
        if tuple(_float(name, cs, 2).shape) != (t, rope_dim // 2):
            raise ValueError(f"{name} must have shape {(t, rope_dim // 2)}, got {tuple(cs.shape)}")


def _kv_block_t(t: int, bd: int) -> int:
    """Tokens per KV program: a [BLOCK_T, bd] tile of about KV_TILE_ELEMS, fewer while the grid is under
    KV_TARGET_PROGRAMS programs (decode: spread the few tokens over the SMs)."""
    bt = max(1, KV_TILE_ELEMS // bd)
    while bt > 1 and triton.cdiv(t, bt) < KV_TARGET_PROGRAMS:
        bt //= 2
    return bt


def _kv_rows_block_t(t: int, bd: int) -> int | None:
    """Tokens per 1-warp program under KV_ROWS_RULE, or None (the default tiling): only for one-warp rows (bd ==
    KV_TILE_ELEMS: the default's own tile is one row of one warp, so its sum order is kept)."""
    if bd != KV_TILE_ELEMS:
        return None
    return next((bt for min_t, bt in KV_ROWS_RULE if t >= min_t), None)


def kv_norm_rope_quant_triton(
    kv: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope_dim: int = 64,
    eps: float = 1e-6,
    quant_block: int | None = 64,
    out: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    *,
    block_t: int | None = None,
    num_warps: int | None = None,
    early_cos_sin: bool = False,
    row_rule: bool | None = None,
    lean: bool | None = None,
) -> torch.Tensor:
    """V4's KV entry in one pass, same contract as `ref.fused.kv_norm_rope_quant`.

    kv: [t, d] fp32/bf16/fp16 (any strides), d even <= MAX_D; weight [d]; cos/sin [t, rope_dim/2]; quant_block
    None (no FP8 simulation) or a power of two dividing d - rope_dim. out: None (returns a new [t, d] kv.dtype)
    or a cache [n, d] fp32/bf16/fp16 with unit column stride; rows: int [t] target rows of out (negative: skip;
    None: row i). Rows must be < n: unchecked here (that would need a host sync), the reference raises.
    block_t / num_warps: benchmark configs (tokens per program, a power of two; None: `_kv_block_t`'s choice);
    early_cos_sin: the kernel's EARLY_CS (a benchmark config). row_rule (None: KV_ROWS_RULE_ON, on unless
    DEEPINFER_TK_KV_ROWS=0): without block_t / num_warps, KV_ROWS_RULE's tokens per 1-warp program (the 1-row
    tiling's bits, GPU-tested). lean (session 6; None: KV_LEAN_DEFAULT): the FP8 quant-dequant by triton_quant's
    `quant_tile_store_lean` (same bits; at 4 rows per program 94 registers instead of 128 on sm_90a).
    """
    lean = KV_LEAN_DEFAULT if lean is None else bool(lean)
    _check_kv(kv, weight, cos, sin, rope_dim)
    t, d = kv.shape
    nope = d - rope_dim
    quant = quant_block is not None and nope > 0
    if quant and (
        isinstance(quant_block, bool) or not isinstance(quant_block, int) or quant_block < 2
        or quant_block & (quant_block - 1) or nope % quant_block
    ):  # fmt: skip
        raise ValueError(f"quant_block must be None or a power of two dividing {nope}, got {quant_block!r}")
    if out is None:
        out = torch.empty((t, d), dtype=kv.dtype, device=kv.device)
    elif _float("out", out, 2).shape[1] != d or out.stride(1) != 1 or (rows is None and out.shape[0] < t):
        raise ValueError(
            f"out must be [n, {d}] with unit column stride (n >= {t} without rows), got {tuple(out.shape)}"
        )
    if rows is not None and (rows.dtype not in (torch.int32, torch.int64) or tuple(rows.shape) != (t,)):
        raise ValueError(f"rows must be int32/int64 of shape {(t,)}, got {rows.dtype} {tuple(rows.shape)}")
    check_runnable(kv, weight, cos, sin, out, *([rows] if rows is not None else []))
    if t == 0:
        return out
    bd = max(16, triton.next_power_of_2(d))
    qb = quant_block if quant else 2
    bt = block_t or _kv_block_t(t, bd)
    nw = num_warps or max(1, min(8, bt * bd // 512))
    use_rule = KV_ROWS_RULE_ON if row_rule is None else bool(row_rule)
    rule_bt = _kv_rows_block_t(t, bd) if use_rule and block_t is None and num_warps is None else None
    if rule_bt:
        bt, nw = rule_bt, 1  # one warp per row: the default's layout along each row
    args = (
        kv, weight, cos, sin, out, rows if rows is not None else out,
        t, d, kv.stride(0), kv.stride(1), weight.stride(0), cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        out.stride(0), float(eps), 1.0 / FP8_MAX,
    )  # fmt: skip
    kw = {"HAS_ROWS": rows is not None, "NOPE": nope, "QUANT": quant, "QB": qb, "BLOCK_T": bt, "BLOCK_D": bd}
    kw.update(IS_BF16=kv.dtype == torch.bfloat16, HW_CAST=kv.is_cuda, enable_fp_fusion=False)
    kw["num_warps"] = nw
    _kv_fused_kernel[(triton.cdiv(t, bt),)](*args, EARLY_CS=bool(early_cos_sin), LEAN=bool(lean), **kw)
    return out
