"""Triton per-block FP8 (e4m3) quantisation with UE8M0 or fp32 scales (`ref/quant.py`), bit-exact to the reference.

One kernel serves `fp8_quant_ue8m0` (q + int32 exponents), `per_token_group_quant_fp8` (q + fp32 scales 2^e or
amax/448) and `fp8_quant_dequant_ue8m0` (q * 2^e back in x's dtype, e.g. V4's KV simulation on dims 0..447 of a
[t, 512] row, read in place through the row stride). x [rows, n] is seen as rows * n/GROUP groups; a program
takes BLOCK_G groups as a [BLOCK_G, GROUP] tile, so x is read once and each output written once.

Bit-exactness, step by step against the reference:
* amax = max |x| per group; the reference's amax propagates NaN, `tl.max` need not, so a NaN flag is carried.
  The floor (1e-4 as fp32) is a max, exact.
* ue8m0: e = ceil(log2(amax * fp32(1/448))) from the IEEE bits of the rounded fp32 product (as the reference);
  2^-e and 2^e are built from exponent bits (exact: e is in [-22, 127] after the floor). x * 2^-e is one
  correctly rounded fp32 multiply on both sides (fp fusion is off, nothing to contract anyway).
* fp32 scales: scale = amax / 448 and x / scale use `tl.div_rn` (IEEE division; Triton's `/` is div.full, 2 ulp).
* clamp to +-448 with `where` (NaN passes, as torch.clamp), then round to nearest even e4m3 (`_e4m3_rne`): on a
  GPU (HW_CAST, set by the launchers for CUDA tensors) the hardware conversion (sm_90: one
  cvt.rn.satfinite.e4m3x2.f32 per two values, RNE, never saturating after the clamp) and back (exact); under
  the interpreter exact integer steps, because the interpreter's fp8 cast rounds differently from the GPU's.
  Both give the same bytes (NaN -> 0x7F), and the integer steps cost ~15 ALU operations per element, which
  made the quantisers ALU-bound on the H200.
* non-finite groups: exponent 128, q NaN, dequantised NaN, fp32 2^e scale inf (the reference's ldexp(1, 128)).
No host sync (CUDA-graph safe); blocks come from shapes only.

The default kernel since after session 5's 14:30 run: `_fp8_group_tiles_kernel` with `idx32` and `const_gpr` (config
`i32c`), the same quantiser math (`quant_tile_store`) as the session-4 default `_fp8_group_kernel`, with other
indexing and load order. What `_fp8_group_kernel` does per program (sm_90a PTX of Triton, [64, 128] bf16 tile, 8
warps, checked with CUDA 13.0 ptxas: 32 registers, so 8 programs / SM): 4 16-byte loads a thread, two amax
reductions over 8 lanes, 2 16-byte fp8 stores and one scale store, and each group's (row, column) from an int64
`//` and `%` by the runtime groups_per_row (a div.s64 with a 32-bit fast path per row a thread holds). The
options: `idx32` (int32 index math when every offset fits, else int64), `const_gpr` (groups_per_row a constexpr: a
multiply-shift, a shift for powers of two; one compilation per row width) and `tiles_per_program` n (a benchmark
config: a program takes n tiles, tile pid + i * grid, and loads tile i + 1 before it quantises and stores tile i;
47-48 registers at n = 2-4). All are bit-exact to `_fp8_group_kernel` (same math per group; only the indexing and
the load order change; GPU-tested bit for bit at V4 shapes, 1 / 64 / 4,096 / 16,384 tokens). H200, session 5
(benchmarks/results/2026-11-30-s5r3-bench-tile_kernels-quant.json): `i32c` ran 1.00-1.43x as fast as the old default
at 1 / 64 / 4,096 / 16,384 tokens in all three quantiser ops (never slower), hence the switch;
`idx32=False, const_gpr=False` (benchmark config `i64`) still runs `_fp8_group_kernel`.

Session 6 (the default since that session's GPU run: `LEAN_DEFAULT`): `lean=True` runs `quant_tile_store_lean`,
the same bytes with about half the SASS instructions per element (sm_90a, Triton 3.6: 148 against 296 a thread
for a [32, 128] bf16 tile; its docstring says what it drops and why that is exact), and `persistent=n` a grid of
n programs per SM striding over the tiles. `LEAN_DEFAULT` is what `lean=None` takes (the default switch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import check_runnable

__all__ = ["fp8_group_quant_triton", "tile_groups"]

FP8_MAX = 448.0
AMAX_FLOOR = 1e-4
TILE_ELEMS = 4096  # elements of one [BLOCK_G, GROUP] tile
# The launchers' `lean=None`: True (since session 6) makes `quant_tile_store_lean` (the same bytes, about half the
# instructions) the default of the three quantiser ops (per_token_group_quant_fp8 / fp8_quant_ue8m0,
# fp8_quant_dequant_ue8m0, swiglu_clamp_fp8). Session 6 run 3 (H200, benchmarks/results/2026-11-30-s6-bench-
# tile_kernels-quant.json): bit-equal to the old epilogue at 1 / 64 / 4,096 / 16,384 tokens (GPU tests
# test_quant_lean.py passed) and 1.28x / 1.14x / 1.35x faster at 16,384 tokens (per-token / quant-dequant / SwiGLU),
# 1.03-1.16x at 1 and 64 tokens. False keeps `quant_tile_store`.
LEAN_DEFAULT = True
MAX_GROUP = 4096
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# constants the kernel reads (jit globals must be constexpr)
_MAX = tl.constexpr(FP8_MAX)
_FLOOR = tl.constexpr(AMAX_FLOOR)
_INF = tl.constexpr(float("inf"))
# kernel modes
EXP_I32 = tl.constexpr(0)
POW2_F32 = tl.constexpr(1)
AMAX_F32 = tl.constexpr(2)
DEQUANT = tl.constexpr(3)
_MODES = {"exp": 0, "pow2": 1, "fp32": 2, "dequant": 3}


@triton.jit
def _nan():
    """A quiet fp32 NaN (built from its bits: a NaN constexpr global would fail Triton's "same value" check of
    globals between compilations, NaN != NaN)."""
    return tl.full([], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_rne(y, HW_CAST: tl.constexpr = False):
    """fp32 y (|y| <= 448 or NaN) -> (e4m3fn byte as uint8, its value as fp32), round to nearest even.

    HW_CAST: the GPU's conversion instruction (RNE), NaN mapped to byte 0x7F as below. Otherwise:

    Done in integer / exact fp32 steps rather than with a cast, because Triton's interpreter rounds fp8 casts
    differently (ties up, lost carries) from the GPU: E = max(floor(log2 |y|), -6) (from the exponent bits; -6 is
    e4m3's smallest normal exponent, below it the subnormal grid 2^-9 continues), v = |y| * 2^(3-E) in [0, 16)
    (exact), m = rne(v) by the 2^23 add trick (one correctly rounded add), byte = (E + 6) * 8 + m (m = 16 or
    E = -6, m = 8 carry into the exponent field correctly), sign bit from y, NaN -> 0x7F.
    """
    if HW_CAST:
        f8 = y.to(tl.float8e4nv)  # round to nearest even (the default downcast rounding)
        nan = y != y
        byte = tl.where(nan, 0x7F, f8.to(tl.uint8, bitcast=True)).to(tl.uint8)
        return byte, tl.where(nan, _nan(), f8.to(tl.float32))
    a = tl.abs(y)
    ebits = (a.to(tl.int32, bitcast=True) >> 23) & 0xFF
    big_e = tl.maximum(ebits - 127, -6)
    v = a * ((130 - big_e) << 23).to(tl.float32, bitcast=True)  # * 2^(3 - E)
    m = (v + 8388608.0) - 8388608.0  # round half to even to an integer (0 <= v <= 16 < 2^23)
    mag = tl.where(a == 0.0, 0.0, m * ((big_e + 124) << 23).to(tl.float32, bitcast=True))  # m * 2^(E-3)
    neg = (y.to(tl.int32, bitcast=True) >> 31) != 0
    byte = (big_e + 6) * 8 + m.to(tl.int32) + tl.where(neg, 128, 0)
    nan = y != y
    byte = tl.where(nan, 0x7F, byte)
    val = tl.where(neg, -mag, mag)
    return byte.to(tl.uint8), tl.where(nan, _nan(), val)


@triton.jit
def _fp8_group_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    n_groups,
    groups_per_row,
    stride_xr,
    stride_xc,
    inv_max,
    MODE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HW_CAST: tl.constexpr,
):
    """x [rows, groups_per_row * GROUP] strided -> q [rows, n] contiguous (e4m3, or x's dtype for DEQUANT) and
    s [rows, groups_per_row] contiguous (int32 exponent or fp32 scale; not written for DEQUANT)."""
    g = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)  # [BG] global group index
    gmask = g < n_groups
    row = g // groups_per_row
    col0 = (g % groups_per_row) * GROUP
    j = tl.arange(0, GROUP)
    mask = gmask[:, None]
    x = tl.load(x_ptr + row[:, None] * stride_xr + (col0[:, None] + j[None, :]) * stride_xc, mask=mask, other=0.0)
    quant_tile_store(x.to(tl.float32), g, gmask, q_ptr, s_ptr, inv_max, MODE, GROUP, BLOCK_G, HW_CAST)


@triton.jit
def tile_groups(tile, n_groups, groups_per_row, BLOCK_G: tl.constexpr, IDX32: tl.constexpr, GPR: tl.constexpr):
    """Global group ids g [BG] of tile `tile`, their mask, row and first column / GROUP. IDX32: int32 math (the
    launcher checks every offset fits), else int64; GPR > 0: groups_per_row as a constexpr (a multiply-shift)."""
    if IDX32:
        g = tile * BLOCK_G + tl.arange(0, BLOCK_G)
    else:
        g = tile.to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    if GPR > 0:
        row = g // GPR
        gcol = g % GPR
    else:
        row = g // groups_per_row
        gcol = g % groups_per_row
    return g, g < n_groups, row, gcol


@triton.jit
def _load_groups(x_ptr, tile, n_groups, groups_per_row, stride_xr, stride_xc, GROUP: tl.constexpr,
                 BLOCK_G: tl.constexpr, IDX32: tl.constexpr, GPR: tl.constexpr):  # fmt: skip
    """Tile `tile` of x as fp32 [BG, GROUP] (0 where masked), its group ids and mask."""
    g, gmask, row, gcol = tile_groups(tile, n_groups, groups_per_row, BLOCK_G, IDX32, GPR)
    cols = gcol[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    x = tl.load(x_ptr + row[:, None] * stride_xr + cols * stride_xc, mask=gmask[:, None], other=0.0)
    return x.to(tl.float32), g, gmask


@triton.jit
def _fp8_group_tiles_kernel(
    x_ptr, q_ptr, s_ptr, n_groups, groups_per_row, stride_xr, stride_xc, inv_max,
    MODE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HW_CAST: tl.constexpr, IDX32: tl.constexpr,
    GPR: tl.constexpr, TILES: tl.constexpr, LEAN: tl.constexpr = False,
):  # fmt: skip
    """`_fp8_group_kernel` (same arguments and results) with the benchmark configs of the module docstring: TILES
    tiles per program (tile pid + i * grid; the next tile's load issued before the current tile's stores), or
    TILES = 0: persistent (session 6), the program strides over every tile pid + i * grid < the tile count, the
    next tile's load issued before the current tile's stores (the launcher sizes the grid to the SMs); LEAN:
    `quant_tile_store_lean` (same bytes, fewer instructions)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    x, g, gmask = _load_groups(x_ptr, pid, n_groups, groups_per_row, stride_xr, stride_xc, GROUP, BLOCK_G, IDX32, GPR)
    if TILES == 0:
        for tile in range(pid + nprog, tl.cdiv(n_groups, BLOCK_G).to(tl.int32), nprog):  # tile ids are < 2^31
            xn, gn, gmn = _load_groups(
                x_ptr, tile, n_groups, groups_per_row, stride_xr, stride_xc, GROUP, BLOCK_G, IDX32, GPR
            )
            quant_store(x, g, gmask, q_ptr, s_ptr, inv_max, MODE, GROUP, BLOCK_G, HW_CAST, LEAN)
            x, g, gmask = xn, gn, gmn
    for i in tl.static_range(1, TILES):
        xn, gn, gmn = _load_groups(
            x_ptr, pid + i * nprog, n_groups, groups_per_row, stride_xr, stride_xc, GROUP, BLOCK_G, IDX32, GPR
        )
        quant_store(x, g, gmask, q_ptr, s_ptr, inv_max, MODE, GROUP, BLOCK_G, HW_CAST, LEAN)
        x, g, gmask = xn, gn, gmn
    quant_store(x, g, gmask, q_ptr, s_ptr, inv_max, MODE, GROUP, BLOCK_G, HW_CAST, LEAN)


@triton.jit
def quant_store(
    x, g, gmask, q_ptr, s_ptr, inv_max,
    MODE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HW_CAST: tl.constexpr, LEAN: tl.constexpr,
):  # fmt: skip
    """`quant_tile_store_lean` when LEAN (2: with NAN_MUL), else `quant_tile_store` (same bytes)."""
    if LEAN:
        quant_tile_store_lean(x, g, gmask, q_ptr, s_ptr, inv_max, MODE, GROUP, BLOCK_G, HW_CAST, LEAN == 2)
    else:
        quant_tile_store(x, g, gmask, q_ptr, s_ptr, inv_max, MODE, GROUP, BLOCK_G, HW_CAST)


@triton.jit
def quant_tile_store(
    x,
    g,
    gmask,
    q_ptr,
    s_ptr,
    inv_max,
    MODE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HW_CAST: tl.constexpr = False,
):
    """Quantise fp32 groups x [BLOCK_G, GROUP] (global group ids g, valid where gmask) and store q (or the
    dequantised values) at q_ptr[g * GROUP + j] and the scales at s_ptr[g], as `_fp8_group_kernel` documents."""
    j = tl.arange(0, GROUP)
    mask = gmask[:, None]
    ax = tl.abs(x)
    has_nan = tl.max((ax != ax).to(tl.int32), axis=1) > 0  # [BG]
    amax = tl.maximum(tl.max(ax, axis=1), _FLOOR)
    amax = tl.where(has_nan, _nan(), amax)
    if MODE == AMAX_F32:
        scale = tl.div_rn(amax, tl.full([BLOCK_G], _MAX, tl.float32))
        y = tl.div_rn(x, scale[:, None])
    else:
        bits = (amax * inv_max).to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        bad = (bits & 0x7F800000) == 0x7F800000  # product inf or NaN
        e = tl.where(bad, 128, e)
        inv = ((127 - tl.minimum(e, 127)) << 23).to(tl.float32, bitcast=True)  # 2^-e (e <= 127 here)
        y = x * inv[:, None]
        y = tl.where(bad[:, None], _nan(), y)
    y = tl.where(y > _MAX, _MAX, y)
    y = tl.where(y < -_MAX, -_MAX, y)
    qb, qv = _e4m3_rne(y, HW_CAST)
    out = g[:, None] * GROUP + j[None, :]
    if MODE == DEQUANT:
        pw = ((tl.minimum(e, 127) + 127) << 23).to(tl.float32, bitcast=True)  # 2^e
        d = qv * pw[:, None]
        d = tl.where(bad[:, None], _nan(), d)
        tl.store(q_ptr + out, d.to(q_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(q_ptr + out, qb, mask=mask)  # q_ptr is the e4m3 output viewed as uint8
        if MODE == EXP_I32:
            tl.store(s_ptr + g, e, mask=gmask)
        elif MODE == POW2_F32:
            pw = ((tl.minimum(e, 127) + 127) << 23).to(tl.float32, bitcast=True)
            tl.store(s_ptr + g, tl.where(e == 128, _INF, pw), mask=gmask)
        else:
            tl.store(s_ptr + g, scale, mask=gmask)


@triton.jit
def _nanmax(a, b):
    """max that propagates NaN (max.NaN.f32 on the GPU, np.maximum in the interpreter): a group's amax is NaN
    exactly when the group holds a NaN, with no separate NaN flag and its second reduction."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def quant_tile_store_lean(
    x, g, gmask, q_ptr, s_ptr, inv_max,
    MODE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HW_CAST: tl.constexpr = False,
    NAN_MUL: tl.constexpr = False,
):  # fmt: skip
    """`quant_tile_store` (same arguments, same bytes) with fewer instructions per element (session 6, config
    `lean`): the amax reduction propagates NaN (no NaN-flag reduction); on the GPU (HW_CAST) no clamp to +-448 and
    no NaN byte select: the e4m3 conversion is cvt.rn.satfinite (RNE, finite values beyond 448 saturate to +-448,
    exactly what the clamp then RNE gives) and the only NaN it sees is the positive quiet NaN of a non-finite
    group (byte 0x7F, e4m3fn's NaN, as the reference's). The interpreter keeps the clamps and the integer-step
    rounding of `_e4m3_rne`. NAN_MUL (config `leanx`, 2^e modes): a non-finite group's 2^-e is a NaN instead of
    a select per element, relying on the GPU's multiply returning its canonical positive NaN (then byte 0x7F);
    the GPU test compares its bytes with the default's on NaN and inf groups."""
    j = tl.arange(0, GROUP)
    mask = gmask[:, None]
    amax = tl.reduce(tl.abs(x), 1, _nanmax)  # [BG], NaN iff the group holds a NaN
    amax = tl.maximum(amax, _FLOOR, propagate_nan=tl.PropagateNan.ALL)
    if MODE == AMAX_F32:
        scale = tl.div_rn(amax, tl.full([BLOCK_G], _MAX, tl.float32))
        y = tl.div_rn(x, scale[:, None])
        # a NaN group (amax NaN) and inf / inf in an inf group: the positive quiet NaN whatever div_rn's sign
        y = tl.where(y != y, _nan(), y)
    else:
        bits = (amax * inv_max).to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        bad = (bits & 0x7F800000) == 0x7F800000  # product inf or NaN
        e = tl.where(bad, 128, e)
        inv = ((127 - tl.minimum(e, 127)) << 23).to(tl.float32, bitcast=True)  # 2^-e (e <= 127 here)
        if NAN_MUL:
            inv = tl.where(bad, _nan(), inv)  # per group, not per element
        y = x * inv[:, None]
        if MODE != DEQUANT and not NAN_MUL:  # (DEQUANT overwrites a bad group's outputs below)
            y = tl.where(bad[:, None], _nan(), y)
    if HW_CAST:
        f8 = y.to(tl.float8e4nv)  # cvt.rn.satfinite: RNE, +-448 beyond, +NaN -> 0x7F
        qb = f8.to(tl.uint8, bitcast=True)
        qv = f8.to(tl.float32)  # exact; used by DEQUANT only (dead code otherwise)
    else:
        y = tl.where(y > _MAX, _MAX, y)
        y = tl.where(y < -_MAX, -_MAX, y)
        qb, qv = _e4m3_rne(y, False)
    out = g[:, None] * GROUP + j[None, :]
    if MODE == DEQUANT:
        pw = ((tl.minimum(e, 127) + 127) << 23).to(tl.float32, bitcast=True)  # 2^e
        d = tl.where(bad[:, None], _nan(), qv * pw[:, None])
        tl.store(q_ptr + out, d.to(q_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(q_ptr + out, qb, mask=mask)  # q_ptr is the e4m3 output viewed as uint8
        if MODE == EXP_I32:
            tl.store(s_ptr + g, e, mask=gmask)
        elif MODE == POW2_F32:
            pw = ((tl.minimum(e, 127) + 127) << 23).to(tl.float32, bitcast=True)
            tl.store(s_ptr + g, tl.where(e == 128, _INF, pw), mask=gmask)
        else:
            tl.store(s_ptr + g, scale, mask=gmask)


def fp8_group_quant_triton(
    x: torch.Tensor,
    group: int,
    mode: str = "exp",
    out: torch.Tensor | None = None,
    *,
    tile_elems: int | None = None,
    num_warps: int | None = None,
    idx32: bool = True,
    const_gpr: bool = True,
    tiles_per_program: int = 1,
    lean: bool | int | None = None,
    persistent: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-group e4m3 quantisation of the last dim, bit-exact to `ref/quant.py`.

    x: [..., n] fp32/bf16/fp16, any strides (leading dims that do not merge are copied first), n % group == 0,
    group a power of two in [2, 4096]. mode:
      "exp"     -> (q e4m3 [..., n], e int32 [..., n/group])        as `fp8_quant_ue8m0`
      "pow2"    -> (q e4m3 [..., n], 2^e fp32 [..., n/group])       as `per_token_group_quant_fp8(.., "ue8m0")`
      "fp32"    -> (q e4m3 [..., n], amax/448 fp32 [..., n/group])  as `per_token_group_quant_fp8(.., "fp32")`
      "dequant" -> (q * 2^e in x.dtype [..., n], None)              as `fp8_quant_dequant_ue8m0`
    `out` (contiguous, [..., n], e4m3 or x.dtype for "dequant") receives the first result. No host sync.
    tile_elems / num_warps (benchmark configs; None: TILE_ELEMS and the default warps): elements per program
    tile (a power of two) and warps per program. idx32 / const_gpr / tiles_per_program (the module docstring; any
    of them set, as by default: `_fp8_group_tiles_kernel`; idx32=False, const_gpr=False, tiles_per_program=1: the
    session-4 `_fp8_group_kernel`, same bits): int32 index math (ignored, i.e. int64, when an offset could reach
    2^31), groups_per_row as a constexpr (one compilation per row width), tiles per program (a benchmark config).
    lean (session 6; implies the tiles kernel; None: LEAN_DEFAULT, True since run 3): `quant_tile_store_lean`, the
    same bytes with about half the instructions per element on the GPU (2: also NAN_MUL, config `leanx`).
    persistent n > 0 (a benchmark config, session 6; instead of tiles_per_program): min(tiles, n * SMs) programs
    striding over the tiles, the tiles kernel's TILES = 0.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")
    if not isinstance(x, torch.Tensor) or x.dtype not in _DTYPES:
        raise TypeError(f"x must be a fp32/bf16/fp16 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if isinstance(group, bool) or not isinstance(group, int) or not 2 <= group <= MAX_GROUP or group & (group - 1):
        raise ValueError(f"group must be a power of two in [2, {MAX_GROUP}], got {group!r}")
    if x.dim() < 1 or x.shape[-1] % group:
        raise ValueError(f"x's last dim must be a multiple of group ({group}), got shape {tuple(x.shape)}")
    check_runnable(x)
    lean = lean_level(lean, legacy=not (idx32 or const_gpr))
    n = x.shape[-1]
    qdtype = x.dtype if mode == "dequant" else torch.float8_e4m3fn
    if out is None:
        out = torch.empty(x.shape, dtype=qdtype, device=x.device)
    elif tuple(out.shape) != tuple(x.shape) or out.dtype != qdtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(
            f"out must be contiguous {qdtype} {list(x.shape)} on {x.device}, "
            f"got {out.dtype} {list(out.shape)} on {out.device} (contiguous={out.is_contiguous()})"
        )
    sdtype = torch.int32 if mode == "exp" else torch.float32
    scales = None if mode == "dequant" else torch.empty((*x.shape[:-1], n // group), dtype=sdtype, device=x.device)
    if x.numel() == 0:
        return out, scales
    x2 = x.reshape(-1, n)  # a view whenever the leading dims merge into one stride
    n_groups = x.numel() // group
    bg = max(1, min((tile_elems or TILE_ELEMS) // group, triton.next_power_of_2(n_groups)))
    warps = num_warps or max(1, min(8, bg * group // 512))
    if idx32 or const_gpr or tiles_per_program != 1 or lean or persistent:  # the default (i32c) and the configs
        tiles = persistent_tiles(persistent, tiles_per_program)
        _launch_tiles(x2, out, scales, mode, group, bg, warps, idx32, const_gpr, tiles, lean, persistent)
        return out, scales
    _fp8_group_kernel[(triton.cdiv(n_groups, bg),)](
        x2,
        out if mode == "dequant" else out.view(torch.uint8),
        scales if scales is not None else out,
        n_groups,
        n // group,
        x2.stride(0),
        x2.stride(1),
        1.0 / FP8_MAX,
        MODE=_MODES[mode],
        GROUP=group,
        BLOCK_G=bg,
        HW_CAST=x.is_cuda,
        num_warps=warps,
        enable_fp_fusion=False,
    )
    return out, scales


def lean_level(lean: bool | int | None, legacy: bool = False) -> int:
    """The kernels' LEAN: 0 (off), 1 (`quant_tile_store_lean`), 2 (with NAN_MUL); None: LEAN_DEFAULT, except for the
    legacy `i64` config (idx32=False, const_gpr=False: legacy=True), which keeps the session-4 kernel unless a call
    asks for lean explicitly."""
    lean = (0 if legacy else LEAN_DEFAULT) if lean is None else lean
    if lean not in (0, 1, 2):
        raise ValueError(f"lean must be None, a bool or 2, got {lean!r}")
    return int(lean)


def persistent_tiles(persistent: int, tiles_per_program: int) -> int:
    """The kernels' TILES: 0 for a persistent launch (persistent programs per SM > 0), else tiles_per_program;
    raises on bad values."""
    if isinstance(persistent, bool) or not isinstance(persistent, int) or not 0 <= persistent <= 32:
        raise ValueError(f"persistent must be an int in [0, 32] (programs per SM), got {persistent!r}")
    tiles = tiles_per_program
    if isinstance(tiles, bool) or not isinstance(tiles, int) or not 1 <= tiles <= 16:
        raise ValueError(f"tiles_per_program must be an int in [1, 16], got {tiles!r}")
    if persistent and tiles != 1:
        raise ValueError(f"persistent and tiles_per_program > 1 exclude each other, got tiles_per_program={tiles}")
    return 0 if persistent else tiles


def tiles_grid(n_tiles: int, tiles: int, persistent: int, device: torch.device) -> int:
    """Programs of a tiles launch: n_tiles / tiles, or for a persistent one (tiles 0) min(n_tiles, persistent *
    the device's SMs; 4 SMs off CUDA, the interpreter)."""
    if tiles:
        return triton.cdiv(n_tiles, tiles)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(n_tiles, persistent * sms))


def fits_int32(*views: torch.Tensor, extra: int = 0) -> bool:
    """True when every element offset of the views (and `extra`, e.g. the last group id a grid reaches) is < 2^31."""
    span = [sum((s - 1) * abs(st) for s, st in zip(v.shape, v.stride())) + 1 for v in views]  # largest offset + 1
    return max([*span, extra]) < 2**31


def _launch_tiles(
    x2: torch.Tensor, out: torch.Tensor, scales: torch.Tensor | None, mode: str, group: int, bg: int, warps: int,
    idx32: bool, const_gpr: bool, tiles: int, lean: bool = False, persistent: int = 0,
) -> None:  # fmt: skip
    """`_fp8_group_tiles_kernel` on x2 [rows, n] (the default and the benchmark configs of `fp8_group_quant_triton`)."""
    n_groups, gpr = x2.numel() // group, x2.shape[1] // group
    grid = tiles_grid(triton.cdiv(n_groups, bg), tiles, persistent, x2.device)
    use32 = idx32 and fits_int32(x2, out, extra=(triton.cdiv(n_groups, bg) + grid * max(tiles, 1) + 1) * bg * group)
    _fp8_group_tiles_kernel[(grid,)](
        x2, out if mode == "dequant" else out.view(torch.uint8), scales if scales is not None else out,
        n_groups, gpr, x2.stride(0), x2.stride(1), 1.0 / FP8_MAX,
        MODE=_MODES[mode], GROUP=group, BLOCK_G=bg, HW_CAST=x2.is_cuda, IDX32=use32,
        GPR=gpr if const_gpr else 0, TILES=tiles, LEAN=int(lean), num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
