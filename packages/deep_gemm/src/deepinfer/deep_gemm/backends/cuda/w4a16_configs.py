"""Tile configurations of the W4A16 grouped kernel (`triton_fp4_grouped.py`) and the metadata-only heuristic.

No Triton import here, so the API, tests and the benchmark can name configurations on any machine.

Why the row tile matters: one program owns (group, BLOCK_N columns) and walks its group's rows in BLOCK_M
tiles, dequantising the whole [BLOCK_N, k] weight slice again for every row tile. Decode groups hold 0-6 rows
(one 16-row tile, the smallest `tl.dot` allows); prefill groups hold ~200, where 16-row tiles dequantise each
weight 13 times and run 16-wide MMAs, so prefill wants 64-128 row tiles (weights dequantised ~once).

The heuristic reads only shapes (and an optional caller hint), never tensor values: the launcher must stay
CUDA-graph safe (no .item() / .tolist()). Rows per group is estimated as `expected_m` when the caller gives it
(DeepGEMM's name for the same hint), else ceil(m / g): exact when every group is active (prefill), an
underestimate when few are (decode), which errs toward the decode tiles, the right side to err on.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = [
    "W4A16Config", "DECODE", "PREFILL", "PREFILL_256", "V3_DECODE", "SWEEP", "default_config", "parse_config",
    "rows_per_group", "CUDA_VARIANTS", "CUDA_MAX_ROWS", "CUDA_SWEEP", "cuda_config", "cuda_variant",
    "CUDA_P_VARIANTS", "CUDA_P_SWEEP", "cuda_p_variant", "CUDA_P_BY_TN", "CUDA_DEFAULT_KERNEL", "CUDA_P_MAX_GROUPS",
    "CUDA_KERNELS",
]  # fmt: skip


# The compiled CUDA kernels' numbers and their config-name suffixes (4: one CTA per (expert, slab); 5: persistent).
# Session 6's kernel 6 (`...cs`: kernel 5's tiles in one pipeline per CTA) lost to kernel 5 everywhere and was removed
# in session 9; its names now fail in `parse_config` with an error naming the known kernels.
CUDA_KERNELS = (4, 5)
_CUDA_TAILS = {4: "cu", 5: "cp"}
_KNOWN_KERNELS = (
    "kernel 1 'm16n64k128w2s3', kernel 2 '...v2', kernel 3 '...v3' (+ 'f' fold, 'x2' split-K), CUDA kernel 4 "
    "'...cu' (e.g. 'm8n64k256w4s4cu'), CUDA kernel 5 '...cp' (e.g. 'm8n128k512w4s2cp')"
)


@dataclasses.dataclass(frozen=True)
class W4A16Config:
    """One launch configuration: tile sizes (powers of two; block_m, block_n >= 16; block_k >= 32, dividing k),
    Triton's num_warps / num_stages, and which kernel: 1 = `triton_fp4_grouped.py`, 2 =
    `triton_fp4_grouped_v2.py` (natural-k-order single dot, int32 scale words; block_k must be 128), 3 =
    `triton_fp4_grouped_v3.py` (decode: fewer dequant ops per weight, optional split-K), 4 = the compiled CUDA
    kernel (`csrc/cuda/dg_fp4_grouped.cuh` via `cuda_fp4_grouped.py`: block_m = tokens per block, 8..64;
    block_n = rows per CTA = num_warps * 16 * (1 or 2); block_k must be 256; one of `CUDA_VARIANTS`), 5 = its
    persistent variant (`csrc/cuda/dg_fp4_persistent.cuh`, same wrapper module,
    `cuda_fp4_grouped.m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_p`; the API's default up to CUDA_MAX_ROWS rows
    per group; block_k = k per stage, 256 or 512; one of `CUDA_P_VARIANTS`; names end in `cp`).
    Kernel 3 only: fold = one multiply by 2^(s-1) per two weights (exact for scale bytes <= 128 only, see
    the kernel's docstring); split_k in {1, 2, 4, 8} = k splits with fp32 partials and a reduce kernel."""

    block_m: int
    block_n: int
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3
    kernel: int = 1
    fold: bool = False
    split_k: int = 1

    def __post_init__(self) -> None:
        if self.kernel not in (1, 2, 3, 4, 5):
            raise ValueError(
                f"kernel: expected 1, 2, 3, 4 or 5 (kernel 6 was removed in session 9), got {self.kernel!r}"
            )
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            low = 8 if name == "block_m" and self.kernel in CUDA_KERNELS else 16  # CUDA kernels: MMA N side 8 tokens
            if not isinstance(v, int) or v < low or v & (v - 1):
                raise ValueError(f"{name}: expected a power of two >= {low}, got {v!r}")
        if not isinstance(self.block_k, int) or self.block_k < 32 or self.block_k & (self.block_k - 1):
            raise ValueError(f"block_k: expected a power of two >= 32, got {self.block_k!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps: expected 1, 2, 4, 8 or 16, got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"num_stages: expected an int in [1, 8], got {self.num_stages!r}")
        if self.kernel == 4 and cuda_variant(self) not in CUDA_VARIANTS:
            raise ValueError(f"kernel 4: expected one of the compiled CUDA variants {sorted(CUDA_NAMES)}, got "
                             f"{self.name!r}")  # fmt: skip
        if self.kernel == 5 and cuda_p_variant(self) not in CUDA_P_VARIANTS:
            raise ValueError(f"kernel 5: expected one of the compiled persistent CUDA variants {sorted(CUDA_P_NAMES)}, "
                             f"got {self.name!r}")  # fmt: skip
        if self.split_k not in (1, 2, 4, 8):
            raise ValueError(f"split_k: expected 1, 2, 4 or 8, got {self.split_k!r}")
        if self.kernel != 3 and (self.fold or self.split_k != 1):
            raise ValueError(f"fold / split_k: kernel 3 only, got kernel={self.kernel} with fold={self.fold!r}, "
                             f"split_k={self.split_k}")  # fmt: skip
        if self.kernel == 2 and self.block_k != 128:
            raise ValueError(f"block_k: kernel 2 needs 128, got {self.block_k!r}")

    @property
    def name(self) -> str:
        """Short id, e.g. 'm16n64k128w2s3' (kernel 2: suffix 'v2'; kernel 3: 'v3', then 'f' for fold and 'x2'
        for split_k = 2; parse it back with `parse_config`)."""
        if self.kernel in CUDA_KERNELS:
            tail = _CUDA_TAILS[self.kernel]
            return f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.num_warps}s{self.num_stages}{tail}"
        v = "" if self.kernel == 1 else f"v{self.kernel}"
        v += ("f" if self.fold else "") + (f"x{self.split_k}" if self.split_k > 1 else "")
        return f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.num_warps}s{self.num_stages}{v}"


def parse_config(name: str) -> W4A16Config:
    """'m16n64k128w2s3' -> W4A16Config(16, 64, 128, 2, 3); '...v2' -> kernel 2; '...v3', '...v3f', '...v3fx2'
    -> kernel 3 (fold, split_k 2); 'm8n128k256w4s4cu' -> kernel 4 (CUDA); ValueError for anything else (including
    fold / split on kernels 1-2 and CUDA variants that are not compiled); '...cp' -> kernel 5 (persistent CUDA).
    Other 'c...' suffixes (e.g. the removed kernel 6's '...cs') raise a ValueError naming the known kernels."""
    cuda = re.fullmatch(r"m(\d+)n(\d+)k(\d+)w(\d+)s(\d+)(c[a-z0-9]*)", name)
    if cuda is not None:
        *ints, tail = cuda.groups()
        kernel = {v: k for k, v in _CUDA_TAILS.items()}.get(tail)
        if kernel is None:
            removed = " (kernel 6, '...cs', was removed in session 9)" if tail == "cs" else ""
            raise ValueError(f"config: unknown CUDA kernel suffix {tail!r}{removed}; expected one of "
                             f"{_KNOWN_KERNELS}, got {name!r}")  # fmt: skip
        return W4A16Config(*(int(v) for v in ints), kernel=kernel)
    match = re.fullmatch(r"m(\d+)n(\d+)k(\d+)w(\d+)s(\d+)(?:v([23]))?(f)?(?:x(\d+))?", name)
    if match is None:
        raise ValueError(f"config: expected a name of {_KNOWN_KERNELS}, got {name!r}")
    *ints, kern, fold, split = match.groups()
    kernel = int(kern) if kern else 1
    return W4A16Config(*(int(v) for v in ints), kernel=kernel, fold=bool(fold), split_k=int(split or 1))


# Decode default: measured best of num_warps 2/4/8 and stages 2/3/4 on an H200 (Triton 3.6) for 8 experts x
# 1 row, n = 4096, k = 2048..4096, before the prefill tiles existed.
DECODE = W4A16Config(16, 64, 128, num_warps=2, num_stages=3)
# Prefill default: 128 x 128 tiles, 8 warps (two warpgroups of 64 weight rows each for wgmma), 3 stages, kernel 2
# (activations straight to shared memory, one dot in natural k order). Measured on the H200 (Triton 3.6,
# benchmarks/results/2026-11-30-bench-deep_gemm.json): fastest of the five swept prefill configs on all four
# prefill cases (e.g. 32 x 256 tokens gate+up: 7.2 ms vs 7.8 ms for kernel 1 with the same tiles).
PREFILL = W4A16Config(128, 128, 128, num_warps=8, num_stages=3, kernel=2)
MID = W4A16Config(64, 128, 128, num_warps=4, num_stages=3)  # 17..96 rows per group
# >= 160 rows per group: 256-row tiles (an expert of 160-256 rows is ONE row tile: each weight dequantised once).
# Measured on the H200 (round 1, build/gpu-r1/call1/bench-deep_gemm.json): ~10 % faster than PREFILL on all four
# prefill cases (32 x 256 tokens gate+up: 258 vs 233 TFLOPS; 256 tokens per expert: 310 vs 286).
PREFILL_256 = W4A16Config(256, 128, 128, num_warps=8, num_stages=2, kernel=2)
PREFILL_256_MIN_ROWS = 160  # below, a 256-row tile is mostly padding and PREFILL's 128-row tiles win
# Kernel 3 on the decode tiles (exact on the full scale domain): the candidate decode default, pending the GPU
# sweep (the lead switches DECODE to the fastest correct kernel-3 config of `meta.w4a16_best`).
V3_DECODE = W4A16Config(16, 64, 128, num_warps=2, num_stages=3, kernel=3)

# What the benchmark times per regime (every one is also a `gpu` test); the defaults are among them.
SWEEP: dict[str, tuple[W4A16Config, ...]] = {
    "decode": (
        DECODE,
        W4A16Config(16, 32, 128, num_warps=2, num_stages=4),  # twice the programs, deeper pipeline (tpe8's best)
        # kernel 3 (fewer dequant ops per weight) side by side with kernel 1 on the same tiles. The 4-warp kernel-1
        # configs (m16n64k128w4s3: 1.2 TB/s, m16n64k256w4s2: 0.95 TB/s vs 1.7-1.9 for DECODE on the H200) left
        # the sweep to keep the benchmark inside its time budget.
        V3_DECODE,
        W4A16Config(16, 64, 128, num_warps=2, num_stages=3, kernel=3, fold=True),  # one multiply per 2 weights
        W4A16Config(16, 32, 128, num_warps=2, num_stages=6, kernel=3),  # 138 regs: 7 CTAs/SM, 5 stages in flight
        W4A16Config(16, 32, 128, num_warps=2, num_stages=6, kernel=3, fold=True),  # the same, fewest instructions
        W4A16Config(16, 64, 128, num_warps=2, num_stages=3, kernel=3, split_k=2),  # twice the programs
    ),
    "prefill": (
        PREFILL,
        MID,
        W4A16Config(128, 64, 128, num_warps=4, num_stages=3),
        W4A16Config(64, 64, 128, num_warps=4, num_stages=4),
        W4A16Config(128, 128, 128, num_warps=8, num_stages=3),  # kernel 1 with the prefill tiles
        # 256-row tiles: a 192-256-row expert is ONE row tile, so each weight is dequantised once instead of twice
        # (sm_90a compile, Triton 3.9: 254 registers, 40 bytes of spills, 148 KB shared; 3 stages spill more)
        PREFILL_256,
    ),
}


def rows_per_group(m: int, g: int, expected_m: int | None = None) -> int:
    """The rows-per-group estimate the heuristic uses: expected_m if given, else ceil(m / g) (0 when g == 0)."""
    if expected_m is not None:
        if isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m < 0:
            raise ValueError(f"expected_m: expected an int >= 0 (rows per group hint), got {expected_m!r}")
        return expected_m
    return -(-m // g) if g > 0 else 0


def default_config(m: int, g: int, expected_m: int | None = None) -> W4A16Config:
    """Config for a grouped GEMM of m rows over g groups, from metadata only (see the module docstring).

    <= 16 rows per group: DECODE; 17..96: MID (64-row tiles); 97..159: PREFILL (128-row tiles); >= 160:
    PREFILL_256 (256-row tiles).
    """
    rows = rows_per_group(m, g, expected_m)
    if rows <= 16:
        return DECODE
    if rows <= 96:
        return MID
    return PREFILL_256 if rows >= PREFILL_256_MIN_ROWS else PREFILL


# ---- kernel 4: the compiled CUDA kernel (csrc/cuda/dg_fp4_grouped.cuh), memory-bound regime (<= 64 rows per group)
# (tn, warps, rt, stages) of every compiled variant: tokens per block, warps per CTA, 16-row MMA tiles per warp,
# cp.async stages. Keep in sync with kEntries in csrc/cuda/dg_fp4_grouped.cu (a GPU test compares them).
CUDA_VARIANTS: tuple[tuple[int, int, int, int], ...] = (
    (8, 4, 2, 4), (8, 4, 1, 4), (8, 8, 1, 4), (8, 4, 2, 6), (16, 4, 2, 4), (16, 4, 1, 4), (16, 8, 1, 4),
    (32, 4, 2, 3), (32, 8, 1, 3), (64, 4, 2, 3), (64, 8, 1, 3),
)  # fmt: skip
CUDA_NAMES = tuple(f"m{t}n{w * r * 16}k256w{w}s{s}cu" for t, w, r, s in CUDA_VARIANTS)
# The auto rule sends groups of at most this many rows (estimated: `rows_per_group`) to the CUDA kernel. H200 run
# (session 4): the 8-token variants beat Triton 1.08-1.50x at 1-8 rows per expert, the 64-token ones lost to it
# (0.78-0.96x) at 64 rows per expert; 16 keeps the measured wins (16-32 rows per expert were not measured).
CUDA_MAX_ROWS = 16


def cuda_variant(cfg: W4A16Config) -> tuple[int, int, int, int] | None:
    """(tn, warps, rt, stages) of a kernel-4 config (None when its tiles cannot map to the CUDA kernel)."""
    rt, rem = divmod(cfg.block_n, 16 * cfg.num_warps)
    if rem or cfg.block_k != 256:
        return None
    return (cfg.block_m, cfg.num_warps, rt, cfg.num_stages)


def _cu(tn: int, warps: int, rt: int, stages: int) -> W4A16Config:
    return W4A16Config(tn, warps * rt * 16, 256, num_warps=warps, num_stages=stages, kernel=4)


# Default variant per tokens-per-block: 64-feature CTAs (rt = 1) measured fastest at 1-8 rows per expert on the H200
# (session 4, gate+up and down); 32 / 64 untuned (the benchmark sweeps CUDA_SWEEP).
CUDA_BY_TN: dict[int, W4A16Config] = {
    8: _cu(8, 4, 1, 4), 16: _cu(16, 4, 1, 4), 32: _cu(32, 4, 2, 3), 64: _cu(64, 4, 2, 3),
}  # fmt: skip
CUDA_SWEEP: dict[int, tuple[W4A16Config, ...]] = {
    tn: tuple(_cu(*v) for v in CUDA_VARIANTS if v[0] == tn) for tn in (8, 16, 32, 64)
}


def cuda_config(m: int, g: int, expected_m: int | None = None, kernel: int | None = None) -> W4A16Config | None:
    """The CUDA kernel's config for a grouped GEMM of m rows over g groups (metadata only), or None when the rows
    per group estimate is above CUDA_MAX_ROWS (the Triton tiles serve those). Tokens per block = the smallest of
    8 / 16 / 32 / 64 covering the estimate (a group with more rows streams its weights once per block).
    kernel: 5 (`CUDA_P_BY_TN`, the persistent kernel) or 4 (`CUDA_BY_TN`); None = CUDA_DEFAULT_KERNEL. The API
    passes 4 when `_C` lacks kernel 5 or g > CUDA_P_MAX_GROUPS."""
    kernel = CUDA_DEFAULT_KERNEL if kernel is None else kernel
    if kernel not in (4, 5):
        raise ValueError(f"kernel: expected 4 or 5 (the CUDA kernels), got {kernel!r}")
    rows = rows_per_group(m, g, expected_m)
    if rows > CUDA_MAX_ROWS:
        return None
    tn = next(t for t in (8, 16, 32, 64) if rows <= t)
    return CUDA_P_BY_TN[tn] if kernel == 5 else CUDA_BY_TN[tn]


# ---- kernel 5: the persistent CUDA variant (csrc/cuda/dg_fp4_persistent.cuh), the API's default up to CUDA_MAX_ROWS
# (kt, tn, warps, rt, stages): k per stage, tokens per block, warps per CTA, 16-row MMA tiles per warp, stages. Keep
# in sync with kPEntries in csrc/cuda/dg_fp4_persistent.cu and the emulator driver (a test compares them).
CUDA_P_VARIANTS: tuple[tuple[int, int, int, int, int], ...] = (
    (256, 8, 4, 1, 4), (512, 8, 4, 1, 2), (512, 8, 8, 1, 2), (256, 8, 4, 2, 3), (512, 8, 4, 2, 2), (256, 8, 4, 1, 3),
    (256, 8, 4, 2, 4),  # session 6: the default's 128-row tile with 256-k stages in its 85 KB (3 x 16 KB in flight)
    (256, 16, 4, 1, 4), (512, 16, 4, 1, 2),
    # 32 / 64 tokens per block for ~64 rows per group (session-5 stretch, benchmark rows only; no default uses them)
    (256, 32, 4, 1, 4), (256, 32, 4, 2, 3), (512, 32, 8, 1, 2), (256, 64, 8, 1, 3),
)  # fmt: skip
CUDA_P_NAMES = tuple(f"m{t}n{w * r * 16}k{kt}w{w}s{s}cp" for kt, t, w, r, s in CUDA_P_VARIANTS)


def cuda_p_variant(cfg: W4A16Config) -> tuple[int, int, int, int, int] | None:
    """(kt, tn, warps, rt, stages) of a kernel-5 config (None when its tiles cannot map to them)."""
    rt, rem = divmod(cfg.block_n, 16 * cfg.num_warps)
    if rem or cfg.block_k not in (256, 512):
        return None
    return (cfg.block_k, cfg.block_m, cfg.num_warps, rt, cfg.num_stages)


def _cp(kt: int, tn: int, warps: int, rt: int, stages: int) -> W4A16Config:
    return W4A16Config(tn, warps * rt * 16, kt, num_warps=warps, num_stages=stages, kernel=5)


# What the benchmark times next to kernel 4 per tokens-per-block (every one is also a `gpu` test).
CUDA_P_SWEEP: dict[int, tuple[W4A16Config, ...]] = {
    tn: tuple(_cp(*v) for v in CUDA_P_VARIANTS if v[1] == tn) for tn in (8, 16, 32, 64)
}

# The API's kernel-5 config per tokens-per-block (`cuda_config`). Session 5 H200 run (build/s5/r1, 256 experts,
# n 4096, k 4096 / 2048, `dg_w4a16[...cp]` rows): m8n128k512w4s2cp was the fastest kernel-5 config on all four
# gate+up cases (decode b4 / b32 / b256, 8 tokens per expert: 70.7 / 316.0 / 760.7 / 674.9 us, 5-12 % ahead of the
# next config) and on down at decode b32 / b256 (168.9 / 382.5 us); at decode b4 down it is 2.7 % behind
# m8n64k512w4s2cp (42.2 vs 41.1 us) and at 8 tokens per expert down 0.6 % behind m8n128k256w4s3cp (344.0 vs 341.9):
# within the run's repeatability, so one config for both weights. Against kernel 4's m8n64k256w4s4cu (the
# previous default) it is 1.46-1.56x faster on all 8 cases. 16-token blocks (9-16 rows per group, not measured
# there): m16n64k512w4s2cp, faster than m16n64k256w4s4cp on all 8 (decode-sized) cases of that run.
CUDA_P_BY_TN: dict[int, W4A16Config] = {8: _cp(512, 8, 4, 2, 2), 16: _cp(512, 16, 4, 1, 2)}
# Which CUDA kernel `cuda_config` (and so the API's auto choice up to CUDA_MAX_ROWS) picks: 5 since the session-5
# run above; 4 restores kernel 4's CUDA_BY_TN (kernel 4 also stays reachable by name, e.g. config=
# parse_config("m8n64k256w4s4cu") or DEEPINFER_DG_W4A16_CONFIG=m8n64k256w4s4cu).
CUDA_DEFAULT_KERNEL = 5
# Kernel 5 keeps a copy of offs and the active-expert list in shared memory (8 bytes per group): up to 1024 groups
# the CTAs per SM of CUDA_P_BY_TN stay what the sm_90a build planned (2 of m8n128k512w4s2cp, 3 of
# m16n64k512w4s2cp); above, the API runs kernel 4 (whose shared memory does not grow with g).
CUDA_P_MAX_GROUPS = 1024
