"""Warp-specialised CUDA C++ (sm_90a) sparse sink attention: `csrc/cuda/fm_ws_decode.cu` (ws / ws2) and
`csrc/cuda/fm_ws3_decode.cu` (ws3), both through `_C.sparse_decode_ws`.

Same math, arguments, results and split-KV format as `cuda_sparse_decode.py` (the serial kernel: the default below 32
tokens and for extra-cache calls);
the kernel differs inside a CTA (design notes at the top of the .cu file): a producer warpgroup gathers 32-row
tiles into a 4-stage shared-memory ring (FP8 rows dequantised to bf16 by the producer), two consumer warpgroups run
only wgmma and the softmax, scores split over d, P in registers, P @ V of tile i overlapping the scores and softmax of
tile i + 1. For calls without an extra cache the API default runs ws3 from `WS3_MIN_TOKENS` (32) query tokens and the
ws3p family from `WS3P_MIN_TOKENS` (64; `default_variant`: ws3p1l on a BF16 cache, ws3p1v on FP8) and its adaptive
overlap builds from `WS3P_OVL_MIN_TOKENS` (128: ws3p1oa on a BF16 cache, ws3p1voa on FP8)
(`triton_split_attn.sparse_attn_split_triton(kernel=None)` asks `ws3_default_for`; kernel="cuda_ws3" forces ws3);
ws / ws2 run only when called directly (the benchmark's `cuda_ws[2][_fp8]` rows, `--all-variants`).

Variants (`variant=`; ws / ws2 from one source by template flags): "ws" the first version; "ws2" the producer signals
a BF16 tile with cp.async.mbarrier.arrive when its rows land (ws signals tile j only after the consumers released
tile j - 2: a producer round trip on the critical path of every tile) and FP8 rows bring their scale words in the
same loads (one memory round trip per tile instead of two); "ws3" (`csrc/cuda/fm_ws3_decode.cu`, a separate source:
64-row tiles, each consumer warpgroup scores half the keys of a tile over all 512 dims as the serial kernel does, so
only the row max and P (through shared memory) are exchanged; a 2-stage ring of 64-row tiles, the next tile's rows
prefetched into L2; FP8 loads issued before the stage wait; prepared in session 4, measured in session 5). `ablation=`
(timing only, WRONG results): "producer" (consumers only hand tiles back: the gather / dequant rate), "consumer" (no
gather after tile 0: the compute rate), "no_xchg" (no partial-S exchange), "qk_only" / "pv_only" (only the score /
only the P @ V wgmma), "no_softmax" (S packed to bf16 as P: no max / exp / row sums); ws3 has "producer" and
"consumer" only (`ablations_of`).

Extra cache (session 5 round 4; GPU-tested in session 6, off by default: 1.08x the serial kernel at engine decode
b 32, 0.90x at b 128, 0.85x at prefill 4,096): ws3 also takes the engine's call, `extra_kv` /
`extra_indices` (the step's fresh rows, same row format as kv): the main list followed by the extra list in 64-row tiles
(a tile may straddle both), the producer gathering each row from its cache, all-hole tiles skipped (the serial kernel's
rules; `_C.sparse_decode_ws3_extra`, fm_ws3_decode.cu's EXTRA flag). Routed only by an explicit
`sparse_attn_split_triton(kernel="cuda_ws3")` or, for the default route (kernel=None: the engine's calls), by the
environment variable `DEEPINFER_FLASH_MLA_WS3_EXTRA=1` (`WS3_EXTRA_ENV`; then extra-cache calls of at least
`WS3_MIN_TOKENS` tokens run ws3 too). Without either, extra-cache calls run the serial kernel as before.

Persistent ws3 (session 5 round 5, GPU-tested in session 6; `variant="ws3p"`, the default from 64 tokens only for a
`_C` without the option builds): the same kernel body
as ws3 (both caches, no extra cache, no ablations) in a persistent grid of min(#SMs, work items) CTAs
(`_C.sparse_decode_ws3p`, fm_ws3_decode.cu's ws3p_decode_kernel); each CTA takes work items (token, split, head
block) at a static stride, its producer's ring runs on into the next item's first tiles and the next item's Q is loaded
while the consumers finish the current one. `max_ctas=` caps the grid (tests: several items per CTA).

ws3p options (session 6, GPU-tested there; `variant=` "ws3pw" / "ws3pl" / "ws3pe" / "ws3px"; the default picks
"ws3p1l" (BF16) / "ws3p1v" (FP8; "ws3p1" without the kOptVec build) from `WS3P_MIN_TOKENS`):
ws3p compiled with option flags (`WS3P_OPTS`, fm_ws3_decode.cu kOpt*; `_C.sparse_decode_ws3p_opt`), each keeping
ws3p's results bit for bit: "ws3pw" the FP8 producer loads all 16 rows of a warp before storing (one load round trip
per tile instead of two; 120 / 192 producer / consumer registers; BF16: ws3p itself), "ws3pl" O *= alpha skipped by a
warp whose rows all kept their running max (alpha == 1 exactly), "ws3pe" the next tile's scores issued right behind
P @ V when that tile has already landed (a non-blocking test voted per warpgroup; otherwise ws3p's order), "ws3px"
all three; "ws3p1" (NOT bit-identical: same math, another summation order) consumer warpgroup 0 scores all 64 keys of
a tile (m64n64k16: fewer shared-memory operand reads than two warpgroups' m64n32k16) and runs the whole softmax (one
named barrier per tile instead of two), warpgroup 1 only rescales its O half and runs its P @ V; "ws3p1l" ws3p1 with
ws3pl's lazy rescale (bit-identical to ws3p1).

ws3p kOptVec build (session 9, GPU-tested there; `variant="ws3p1v"`, `WS3P_VEC_OPTS`, `_C.sparse_decode_ws3p_vec`,
fm_ws3v_decode.cu): ws3p1 with a lane-uniform FP8 producer (fm_ws3_decode.cu fp8v_tile: lane u dequantises the row's
16-byte e4m3 unit u with its own scale byte, no shuffles, no divergent branches, a separate RoPE pass, rows in batches
of 4 with two in flight, the row loop not unrolled), bit-identical to ws3p1; on a BF16 cache (nothing to dequantise)
it runs ws3p1 itself. Not in `VARIANTS` (the session-6 tests pin that table); `sparse_attn_ws` and `probe` accept it.
(Session 7's "ws3p1c" / "ws3p1h" dequant builds, 0.89-0.97x ws3p1, were removed in session 9.)

ws3p adaptive overlap builds (session 10, GPU-tested there; `variant="ws3p1oa"` / "ws3p1voa" (the same builds: BF16
opt 106 = ws3p1l + kOptOverlap + kOptOvlAdapt, FP8 opt 120 = ws3p1v + the same), `WS3P_OVL_OPTS`,
`_C.sparse_decode_ws3p_ovl`, fm_ws3_decode.cu consumer_p1o; the API default from `WS3P_OVL_MIN_TOKENS` (128) tokens):
FA3-style overlap in the scoring warpgroup 0: when tile i + 1 (same item) has already landed it issues that tile's
scores S_{i+1} before running softmax_i on S_i, so the tensor pipe has work queued while it runs the softmax; else
S_{i+1} goes out behind P_i V_i if the tile has landed by then, else in ws3p1's order (warpgroup 0 never waits for the
producer early, which with a 2-stage ring would serialise the gather of tile i + 1 with tile i's compute).
Per-warpgroup setmaxnreg 88 / 240 / 176. Same math and order: bit-identical to "ws3p1l" (BF16) / "ws3p1v" (FP8)
(`WS3P_OVL_BASE`). Not in `VARIANTS`; `sparse_attn_ws` and `probe` accept them. (Session 10 also measured and removed
"ws3p1o" / "ws3p1vo", S_{i+1} always before softmax_i with a blocking wait for its tile, 0.90-0.97x their base, and
"ws3p1oam" / "ws3p1voam", the adaptive form with the P exchange on an mbarrier, never faster than "oa".)

Split plan: `plan_num_splits` on 64-row tiles (the same splits as the serial kernel, so timings compare), handed to
the kernel in its own tiles (32 rows for ws / ws2, 64 for ws3); the partials are merged by `combine_splits`
(triton_split_attn's Triton combine).
The launcher reads shapes, strides and pointers only (no host sync): CUDA-graph safe.
"""

from __future__ import annotations

import functools
import os
import sys
import types

import torch

from ..._backend import compiled_module
from ._cuda_probe import mismatch, probe_main, run_probe
from .cuda_sparse_decode import _aligned  # the serial kernel's row / alignment rules hold here too
from .cuda_sparse_decode import _rows as _cache_rows
from .triton_split_attn import FP8_ROW_BYTES, LOG2E, combine_splits, device_sms, plan_num_splits

__all__ = [
    "ABLATIONS",
    "VARIANTS",
    "WS3P_BIT_EXACT",
    "WS3P_OPTS",
    "WS3P_OVL_BASE",
    "WS3P_OVL_OPTS",
    "WS3P_THRESH_OPTS",
    "WS3P_OPT_VARIANTS",
    "WS3P_VEC_BASE",
    "WS3P_VEC_OPTS",
    "ablations_of",
    "available",
    "block_rows",
    "probe",
    "probe_ablations",
    "probe_extra",
    "run_ablations",
    "self_check",
    "self_check_extra",
    "sparse_attn_ws",
    "split_plan",
    "supports",
    "ws3_available",
    "ws3_default_for",
    "ws3_extra_available",
    "ws3_extra_enabled",
    "ws3_why_not",
    "ws3p_available",
    "ws3p_grid",
    "ws3p_opt_available",
    "ws3p_ovl_available",
    "ws3p_vw_available",
    "ws3p_thresh_available",
    "ws3p_vec_available",
]

BLOCK_H, HEAD_DIM = 64, 512
PLAN_ROWS = 64  # rows per tile of the split plan (the serial kernel's tile)
KERNEL_ROWS = 32  # rows per tile of ws / ws2 (fm_ws_decode.cu kBN; checked against _C.ws_block_rows())
WS3_ROWS = 64  # rows per tile of ws3 (fm_ws3_decode.cu kBN; checked against _C.ws3_block_rows())
# name -> variant code (sparse_decode_ws; the ws3p family: sparse_decode_ws3p / sparse_decode_ws3p_opt, `WS3P_OPTS`)
VARIANTS = {
    "ws": 1,
    "ws2": 2,
    "ws3": 3,
    "ws3p": 4,
    "ws3pw": 5,
    "ws3pl": 6,
    "ws3pe": 7,
    "ws3px": 8,
    "ws3p1": 9,
    "ws3p1l": 10,
}
# The ws3p family: name -> option bits of fm_ws3_decode.cu's ws3p_decode_kernel (kOptWideFp8 1, kOptLazy 2,
# kOptEarlyS 4, kOptOneScorer 8; 0 = ws3p as measured in session 6). All but ws3p1 / ws3p1l keep ws3p's results bit
# for bit (module docstring); those compute the same math in another summation order (last bits differ).
WS3P_OPTS = {"ws3p": 0, "ws3pw": 1, "ws3pl": 2, "ws3pe": 4, "ws3px": 7, "ws3p1": 8, "ws3p1l": 10}
# session 6 candidates (`_C.sparse_decode_ws3p_opt`)
WS3P_OPT_VARIANTS = ("ws3pw", "ws3pl", "ws3pe", "ws3px", "ws3p1", "ws3p1l")
WS3P_BIT_EXACT = ("ws3pw", "ws3pl", "ws3pe", "ws3px")  # the option builds whose results equal ws3p's bit for bit
# session 9: name -> option bits of the kOptVec build (fm_ws3v_decode.cu, `_C.sparse_decode_ws3p_vec`, FP8 cache; on
# a BF16 cache the same bits without kOptVec run through sparse_decode_ws3p_opt). It equals its base bit for bit.
OPT_VEC = 16  # kOptVec: the lane-uniform FP8 producer (fp8v_tile)
WS3P_VEC_OPTS = {"ws3p1v": 8 | OPT_VEC}
WS3P_VEC_BASE = {"ws3p1v": "ws3p1"}  # the variant each kOptVec build must equal bit for bit
# session 10: name -> (BF16 opt, FP8 opt) of the adaptive overlap builds (`_C.sparse_decode_ws3p_ovl`; kOptOverlap
# 32 + kOptOvlAdapt 64 on top of ws3p1l = 10 / ws3p1v = 24); each equals its base (`WS3P_OVL_BASE`, per cache) bit
# for bit. Both names run the same pair of builds (the one of the call's cache format).
OPT_OVL, OPT_OVL_ADAPT = 32, 64
# session 11: + OPT_VEC_WIDE on the FP8 cache (12 of a producer warp's 16 rows loaded before the stage wait, not 8;
# setmaxnreg 104 / 232 / 168): "ws3p1voaw" (its BF16 twin is ws3p1oa's build).
OPT_VEC_WIDE = 512
WS3P_OVL_OPTS = {
    "ws3p1oa": (10 | OPT_OVL | OPT_OVL_ADAPT, 8 | OPT_VEC | OPT_OVL | OPT_OVL_ADAPT),
    "ws3p1voa": (10 | OPT_OVL | OPT_OVL_ADAPT, 8 | OPT_VEC | OPT_OVL | OPT_OVL_ADAPT),
    "ws3p1voaw": (10 | OPT_OVL | OPT_OVL_ADAPT, 8 | OPT_VEC | OPT_OVL | OPT_OVL_ADAPT | OPT_VEC_WIDE),
}
WS3P_OVL_BASE = ("ws3p1l", "ws3p1v")  # (BF16, FP8 cache): the variant every kOptOverlap build must equal bit for bit
# session 14: + kOptThresh 1024 (the running max moves only when a tile's max passes it by more than 8 in log2, so
# alpha is exactly 1 on most tiles and the lazy skip drops the O rescale; exp2 by one FFMA with the scale folded in)
# on the defaults' builds (BF16 ws3p1oa 106; FP8 ws3p1voaw 632, + kOptLazy 2 there). NOT bit-equal to them: same
# math, other rounding (GPU tests against the reference and the defaults within bf16 tolerance).
OPT_THRESH = 1024
WS3P_THRESH_OPTS = {"ws3p1oat": (106 | OPT_THRESH, 632 | 2 | OPT_THRESH)}
# every build run through `_C.sparse_decode_ws3p_ovl`: name -> (BF16 opt, FP8 opt)
_OVL_ALL = {**WS3P_OVL_OPTS, **WS3P_THRESH_OPTS}
# every persistent (ws3p family) variant (the overlap builds under their BF16 opt; their launch picks per cache)
_WS3P_ALL = {**WS3P_OPTS, **WS3P_VEC_OPTS, **{k: v[0] for k, v in _OVL_ALL.items()}}
# name -> the kernel's Mode (fm_ws_decode.cu; ws3: the first three, fm_ws3_decode.cu); every mode but "full" is for
# timing only (wrong numbers)
ABLATIONS = {"full": 0, "producer": 1, "consumer": 2, "no_xchg": 3, "qk_only": 4, "pv_only": 5, "no_softmax": 6}
_WS3_ABLATIONS = ("full", "producer", "consumer")
# The API default (`sparse_attn_split_triton(kernel=None)` with DEFAULT_KERNELS "cuda") runs ws3 instead of the serial
# kernel for a call without an extra cache of at least this many query tokens (t = b * s_q, or prefill's t).
# Session 5 H200 run (benchmarks/results/2026-11-30-s5-bench-flash_mla.json; us, ws3 vs serial, BF16 / FP8 cache):
# ws3 wins from 32 tokens up: b 32 s_q 1 24.8 vs 27.8 / 28.5 vs 33.2; b 128 s_q 2 87.6 vs 92.4 / 115.5 vs 133.2;
# b 256 s_q 4 318.0 vs 338.9 / 434.0 vs 503.3; prefill t 4,096 1,188 vs 1,288, t 16,384 4,613 vs 5,002; HCA 1M b 32
# 119.1 vs 132.5. The serial kernel wins at 1..4 tokens: b 2 s_q 2 14.5 vs 15.6 / 16.2 vs 19.3; b 1 s_q 4 14.3 vs
# 15.5; HCA 1M b 1 31.7 vs 33.6 (its plan: fine splits + the PDL merge; ws3 has the Triton combine). Between 4 and
# 32 tokens nothing was measured, so the serial kernel keeps that range. Run r3 (2026-11-30-s5r3-bench-flash_mla.json)
# timed the public call with this threshold: ws3 at every case from 32 tokens, the serial kernel below, each within
# 2 % of the kernel's own row (ws3 x serial: 1.04-1.18 BF16 / 1.14-1.22 FP8 from 32 tokens, 0.81-0.98 at 1..4).
WS3_MIN_TOKENS = 32
# From this many query tokens the default runs the persistent ws3p family instead of ws3. Session 6 run 1 (H200,
# benchmarks/results/2026-11-30-s6-bench-flash_mla.json): plain ws3p 1.01-1.04x ws3 from 256 tokens, 0.97-0.99x at
# 32-128. Run 2 (benchmarks/results/2026-11-30-s6r2-bench-flash_mla.json): `ws3p1l` (one consumer warpgroup scores the
# whole tile and runs the softmax, the other only rescales and runs its P.V; the rescale skipped when no row max
# moved) 1.05x ws3p on the BF16 cache at b 32 / 128 / 256 x s_q 2 and 1.06x at prefill 4,096 (b 128 s_q 2: 81.9 vs
# 86.2 us = 254.5 TFLOPS; b 32 s_q 2 = 64 tokens: 32.9 vs ws3's 34.0 us), `ws3p1` 1.03x on the FP8 cache (110.4 vs
# 113.9 us; ws3 40.8 vs 40.5 at 64 tokens). Both GPU-tested against the reference and the float64 oracle (same math as
# ws3p in another summation order). Below 64 tokens (not measured for them) ws3 stays.
WS3P_MIN_TOKENS = 64
# From this many query tokens the default runs the adaptive overlap builds (ws3p1oa on a BF16 cache, ws3p1voa on FP8)
# instead of ws3p1l / ws3p1v, when `_C` has them (`ws3p_ovl_available`). Session 10 H200 run
# (benchmarks/results/2026-12-01-s10-bench-fm_overlap.json; bit-equal to their base in every GPU test), x the base:
# BF16 decode b 32 s_q 2 (64 tokens) 0.994, b 64 s_q 2 1.012, b 128 s_q 1 1.010, b 128 s_q 2 1.021, b 256 s_q 2 1.022,
# prefill t 4,096 1.022, t 16,384 1.003; FP8 0.999 / 1.006 / 1.010 / 1.018 / 1.020, prefill 1.014 / 1.008. So 64..127
# tokens keep ws3p1l / ws3p1v (0.994-0.999x at 64).
WS3P_OVL_MIN_TOKENS = 128
# "1": the default route (kernel=None) sends extra-cache calls (the engine's) of >= WS3_MIN_TOKENS tokens to ws3 as
# well (`ws3_default_for`); unset / anything else: they run the serial kernel (the measured default). Read per call.
WS3_EXTRA_ENV = "DEEPINFER_FLASH_MLA_WS3_EXTRA"


def ablations_of(variant: str) -> tuple[str, ...]:
    """The `ABLATIONS` names a variant's kernel has (ws3: full / producer / consumer; ws3p: full; ws, ws2: all)."""
    if variant in _WS3P_ALL:  # the persistent ws3 (and its option builds): the kernel only
        return ("full",)
    return _WS3_ABLATIONS if variant == "ws3" else tuple(ABLATIONS)


def block_rows(variant: str) -> int:
    """KV rows per tile of a variant's kernel: the unit of its tiles_per_split (ws / ws2: 32, ws3 / ws3p: 64)."""
    return WS3_ROWS if variant == "ws3" or variant in _WS3P_ALL else KERNEL_ROWS


@functools.cache
def _module() -> types.ModuleType | None:
    """`deepinfer.flash_mla._C` when it has the warp-specialised kernel, else None (not built / CPU build)."""
    mod = compiled_module()
    return mod if mod is not None and hasattr(mod, "sparse_decode_ws") else None


def available() -> bool:
    """True when `_C` was built with fm_ws_decode.cu (a DEEPINFER_DEVICE=cuda build of this source)."""
    return _module() is not None


def supports(q: torch.Tensor, kv: torch.Tensor) -> str | None:
    """None when `sparse_attn_ws` takes this call (shapes / dtypes / device only), else why not."""
    if not available():
        return "deepinfer.flash_mla._C is not built with sparse_decode_ws (DEEPINFER_DEVICE=cuda)"
    if q.device.type != "cuda":
        return f"q is on {q.device}, not a CUDA device"
    if q.dim() != 3 or q.dtype != torch.bfloat16 or q.shape[-1] != HEAD_DIM or q.shape[1] % BLOCK_H:
        return f"q: expected bf16 [t, 64 * n, {HEAD_DIM}], got {q.dtype} {tuple(q.shape)}"
    if kv.dtype == torch.uint8:
        return None if kv.shape[-1] == FP8_ROW_BYTES else f"kv: expected uint8 [..., {FP8_ROW_BYTES}]"
    if kv.dtype != torch.bfloat16 or kv.shape[-1] != HEAD_DIM:
        return f"kv: expected bf16 [..., {HEAD_DIM}] or uint8 [..., {FP8_ROW_BYTES}], got {kv.dtype} {tuple(kv.shape)}"
    return None


def ws3_available() -> bool:
    """True when `_C` has the ws3 kernel (`ws3_block_rows`); a `_C` built before ws3 has sparse_decode_ws without it."""
    mod = _module()
    return mod is not None and hasattr(mod, "ws3_block_rows")


def ws3p_available() -> bool:
    """True when `_C` has the persistent ws3 (`sparse_decode_ws3p`, session 5 round 5 source)."""
    mod = _module()
    return mod is not None and hasattr(mod, "sparse_decode_ws3p")


def ws3p_opt_available() -> bool:
    """True when `_C` has ws3p's option builds (`sparse_decode_ws3p_opt`, session 6 source)."""
    mod = _module()
    return mod is not None and hasattr(mod, "sparse_decode_ws3p_opt")


def ws3p_vec_available() -> bool:
    """True when `_C` has ws3p's kOptVec build (`sparse_decode_ws3p_vec`, session 9 source: "ws3p1v")."""
    mod = _module()
    return mod is not None and hasattr(mod, "sparse_decode_ws3p_vec")


def ws3p_ovl_available() -> bool:
    """True when `_C` has ws3p's adaptive overlap builds (`sparse_decode_ws3p_ovl`, session 10: "ws3p1oa")."""
    mod = _module()
    return mod is not None and hasattr(mod, "sparse_decode_ws3p_ovl")


def ws3p_vw_available() -> bool:
    """True when `_C`'s overlap builds include the FP8 kOptVecWide one (opt 632, session 11: "ws3p1voaw")."""
    mod = _module()
    return ws3p_ovl_available() and 632 in getattr(mod, "ws3p_ovl_opts", ())


def ws3p_thresh_available() -> bool:
    """True when `_C`'s overlap builds include the kOptThresh ones (opts 1130 / 1658, session 14: "ws3p1oat")."""
    mod = _module()
    return ws3p_ovl_available() and WS3P_THRESH_OPTS["ws3p1oat"][1] in getattr(mod, "ws3p_ovl_opts", ())


def ws3_extra_available() -> bool:
    """True when `_C` has ws3 with the extra cache (`sparse_decode_ws3_extra`, session 5 round 4 source)."""
    mod = _module()
    return mod is not None and hasattr(mod, "sparse_decode_ws3_extra")


def ws3_extra_enabled() -> bool:
    """Whether the default route may send extra-cache calls to ws3: `DEEPINFER_FLASH_MLA_WS3_EXTRA=1` (off by
    default)."""
    return os.environ.get(WS3_EXTRA_ENV, "0") == "1"


def _extra_why_not(kv: torch.Tensor, extra_kv: torch.Tensor) -> str | None:
    """Why ws3 cannot read this extra cache (its format must be kv's; the `_C` must have the extra entry point)."""
    fmt = (kv.dtype, kv.shape[-1])
    if (extra_kv.dtype, extra_kv.shape[-1]) != fmt or extra_kv.device != kv.device:
        return f"extra_kv: expected the format of kv ({kv.dtype} [..., {kv.shape[-1]}]), got {extra_kv.dtype} " + (
            f"{tuple(extra_kv.shape)} on {extra_kv.device}")  # fmt: skip
    if not ws3_extra_available():
        return "extra_kv: deepinfer.flash_mla._C has no ws3 extra-cache kernel (sparse_decode_ws3_extra: rebuild)"
    return None


def ws3_why_not(
    q: torch.Tensor, kv: torch.Tensor, extra_kv: torch.Tensor | None = None, *, allow_extra: bool = False
) -> str | None:
    """None when `sparse_attn_ws(..., variant="ws3")` takes this call (shapes / dtypes / device only), else why not:
    `supports`' reasons, a `_C` without ws3, an extra cache unless allow_extra (then: its format, a `_C` without the
    extra entry point)."""
    why = supports(q, kv)
    if why is not None:
        return why
    if extra_kv is not None and not allow_extra:
        return "extra_kv: ws3 takes an extra cache only when asked (kernel='cuda_ws3' or " + WS3_EXTRA_ENV + "=1)"
    if not ws3_available():
        return "deepinfer.flash_mla._C has no ws3 kernel (built before ws3: rebuild)"
    return _extra_why_not(kv, extra_kv) if extra_kv is not None else None


def ws3_default_for(q: torch.Tensor, kv: torch.Tensor, extra_kv: torch.Tensor | None = None) -> bool:
    """Whether the API default runs ws3 for this call: at least `WS3_MIN_TOKENS` query tokens (q [t, h, 512]) and
    `ws3_why_not` is None; an extra cache only with `ws3_extra_enabled()`. Shapes / dtypes only (CUDA-graph safe)."""
    if q.dim() != 3 or q.shape[0] < WS3_MIN_TOKENS:
        return False
    return ws3_why_not(q, kv, extra_kv, allow_extra=extra_kv is not None and ws3_extra_enabled()) is None


def default_variant(t: int, extra: bool = False, fp8: bool = False) -> str:
    """The ws variant the API default runs for t query tokens once `ws3_default_for` holds. Without an extra cache
    (the ws3p family has no extra-cache form): from WS3P_OVL_MIN_TOKENS (128) the adaptive overlap builds "ws3p1voa"
    (FP8 cache) / "ws3p1oa" (BF16) when `_C` has them (session 10: bit-equal to ws3p1v / ws3p1l, 1.003-1.022x them on
    the H200 from 128 tokens, 0.994-0.999x at 64); otherwise, and from WS3P_MIN_TOKENS (64), "ws3p1v" on an FP8 cache
    (session 9: bit-equal to "ws3p1", 1.14-1.27x it; "ws3p1" when `_C` lacks the kOptVec build) / "ws3p1l" on BF16
    when `_C` has the option builds, "ws3p" when it has only ws3p; below 64 tokens or with an extra cache "ws3".
    Session 11: on an FP8 cache "ws3p1voaw" from 64 tokens when `_C` has it (`ws3p_vw_available`; bit-equal to
    ws3p1v, 1.028-1.058x ws3p1voa on the H200 at 64-512 decode tokens, and 35.2 vs ws3p1v's 36.1 us at 64).
    Session 14: "ws3p1oat" (the threshold-rescale builds, `ws3p_thresh_available`) in place of ws3p1voaw on an FP8
    cache (from 64 tokens) and of ws3p1oa on BF16 (from 128): H200 (2026-12-01-s14-bench-fm_thresh.json) 1.012-1.045x
    them on FP8 at 64-512 decode tokens and prefill, 1.001-1.035x on BF16 from 128; same math, other rounding."""
    if t < WS3P_MIN_TOKENS or extra:
        return "ws3"
    if fp8 and ws3p_thresh_available():
        return "ws3p1oat"
    if fp8 and ws3p_vw_available():
        return "ws3p1voaw"
    if ws3p_opt_available():
        if t >= WS3P_OVL_MIN_TOKENS and ws3p_ovl_available():  # (a `_C` with them has the option builds too)
            if not fp8 and ws3p_thresh_available():
                return "ws3p1oat"
            return "ws3p1voa" if fp8 else "ws3p1oa"
        if fp8:
            return "ws3p1v" if ws3p_vec_available() else "ws3p1"
        return "ws3p1l"
    return "ws3p" if ws3p_available() else "ws3"


def split_plan(
    t: int, h: int, topk: int, num_sms: int, num_splits: int | None, rows: int = KERNEL_ROWS
) -> tuple[int, int]:
    """(num_splits, tiles_per_split in `rows`-row tiles) for t tokens x h heads x topk indices; rows = the kernel's
    tile (`block_rows`: 32 for ws / ws2, 64 for ws3).

    num_splits None: `plan_num_splits` over 64-row tiles (the serial kernel's plan); else the given count clamped to
    [1, tiles]. Recomputed so that no split is empty (topk = 0: one split of no tiles)."""
    if PLAN_ROWS % rows:
        raise ValueError(f"split_plan: rows: expected a divisor of {PLAN_ROWS}, got {rows}")
    tiles = -(-topk // rows)
    if tiles == 0:
        return 1, 0
    if num_splits is None:
        tiles64 = -(-topk // PLAN_ROWS)
        splits = plan_num_splits(t, h // BLOCK_H, tiles64, num_sms)
        per = -(-tiles64 // splits) * (PLAN_ROWS // rows)
    else:
        splits = max(1, min(int(num_splits), tiles))
        per = -(-tiles // splits)
    return -(-tiles // per), per


def ws3p_grid(t: int, h: int, num_splits: int, num_sms: int, max_ctas: int | None = None) -> tuple[int, int, int]:
    """ws3p's persistent grid (what fm_ws3_decode.cu's launch_persist launches) for t tokens x h heads x num_splits:
    (CTAs = min(max_ctas or num_sms, work items), work items = t * num_splits * h / 64, items of the busiest CTA:
    CTA b takes items b, b + CTAs, ...)."""
    if max_ctas is not None and max_ctas < 1:
        raise ValueError(f"ws3p_grid: max_ctas: expected None or >= 1, got {max_ctas}")
    items = t * num_splits * (h // BLOCK_H)
    ctas = min(max_ctas or num_sms, items)
    return ctas, items, (-(-items // ctas) if ctas else 0)


def _check_args(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor | None) -> None:
    why = supports(q, kv)
    if why is not None:
        raise ValueError(f"sparse_attn_ws: {why}")
    t, h, _ = q.shape
    if indices.dtype != torch.int32 or indices.dim() != 2 or indices.shape[0] != t:
        raise ValueError(f"indices: expected int32 [{t}, topk], got {indices.dtype} {tuple(indices.shape)}")
    if indices.device != q.device or kv.device != q.device:
        raise ValueError(f"indices / kv: expected on {q.device}, got {indices.device} / {kv.device}")
    if sink is not None and (sink.dtype != torch.float32 or tuple(sink.shape) != (h,)):
        raise ValueError(f"sink: expected fp32 [{h}], got {sink.dtype} {tuple(sink.shape)}")


def _check_extra(
    kv: torch.Tensor, extra_kv: torch.Tensor, extra_indices: torch.Tensor, t: int, variant: str, ablation: str
) -> None:
    """The extra cache / index list a ws3 call can take (kv's format, int32 [t, topk2] on kv's device)."""
    if variant != "ws3" or ablation != "full":
        raise ValueError(f"extra_kv: only variant 'ws3' with ablation 'full' takes it, got {variant!r} / {ablation!r}")
    why = _extra_why_not(kv, extra_kv)
    if why is not None:
        raise ValueError(f"sparse_attn_ws: {why}")
    if extra_indices.dtype != torch.int32 or extra_indices.dim() != 2 or extra_indices.shape[0] != t:
        raise ValueError(
            f"extra_indices: expected int32 [{t}, topk2], got {extra_indices.dtype} {tuple(extra_indices.shape)}"
        )
    if extra_indices.device != kv.device:
        raise ValueError(f"extra_indices: expected on {kv.device}, got {extra_indices.device}")


def _extra_rows(extra_kv: torch.Tensor, extra_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(extra cache as [slots, width] rows the kernel reads, extra_indices with a unit last stride)."""
    ex_idx = extra_indices
    if ex_idx.stride(-1) != 1 and ex_idx.shape[1] > 1:
        ex_idx = ex_idx.contiguous()
    return _cache_rows(extra_kv)[0], ex_idx


def _check_block_rows(mod: types.ModuleType, variant: str) -> None:
    """The built kernel's tile rows are the ones this wrapper plans with (an old _C has no ws3 at all)."""
    fn = "ws3_block_rows" if variant == "ws3" or variant in _WS3P_ALL else "ws_block_rows"
    entry = {"ws3p": "sparse_decode_ws3p"}.get(variant, "sparse_decode_ws3p_opt" if variant in WS3P_OPTS else fn)
    if variant in WS3P_VEC_OPTS:
        entry = "sparse_decode_ws3p_vec"
    if variant in _OVL_ALL:
        entry = "sparse_decode_ws3p_ovl"
    if not hasattr(mod, fn) or not hasattr(mod, entry):
        raise RuntimeError(f"sparse_attn_ws: _C has no {fn} / entry point: built before variant {variant!r} (rebuild)")
    got = getattr(mod, fn)()
    if got != block_rows(variant):
        raise RuntimeError(f"_C.{fn}() is {got}, this wrapper plans {block_rows(variant)}-row tiles for {variant}")


def sparse_attn_ws(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    softmax_scale: float,
    *,
    out: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    num_splits: int | None = None,
    variant: str = "ws",
    ablation: str = "full",
    extra_kv: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    max_ctas: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse sink attention on the warp-specialised sm_90a kernel; returns (out [t, h, 512] bf16, lse fp32 [t, h]).

    Args:
        q: bf16 [t, h, 512], h a multiple of 64 (V4: 64).
        kv: bf16 [n, 512] / [blocks, bs, 512], or uint8 FP8 rows [..., 584]; slots addressed flat.
        indices: int32 [t, topk]; -1 or any value outside [0, slots) is a hole (never read).
        sink: fp32 [h] or None. softmax_scale: logit scale.
        out, lse_out: optional output buffers ([t, h, 512] bf16 / [t, h] fp32; copied when their strides do not suit
            the kernel).
        num_splits: splits per token (None: `split_plan`, the serial kernel's plan).
        variant: "ws", "ws2", "ws3", "ws3p" or a ws3p option build (`WS3P_OPTS`; module docstring). ablation:
            "full" (the kernel) or a timing-only mode of `ablations_of(variant)` whose results are wrong.
        extra_kv, extra_indices: optional second cache (kv's format) and int32 [t, topk2] slots into it, after the
            main list in the index space (ws3, ablation "full" only; `_C.sparse_decode_ws3_extra`).
        max_ctas: the ws3p family only: cap on its persistent grid (None: one CTA per SM); a small cap gives every
            CTA several work items (tests).
    Raises ValueError (with the reason) for a call the kernel cannot take.
    """
    known = variant in VARIANTS or variant in WS3P_VEC_OPTS or variant in _OVL_ALL
    if not known or ablation not in ablations_of(variant):
        allowed = sorted(ablations_of(variant)) if known else sorted(ABLATIONS)
        names = sorted(VARIANTS) + sorted(WS3P_VEC_OPTS) + sorted(_OVL_ALL)
        raise ValueError(
            f"sparse_attn_ws: variant / ablation: expected one of {names} / {allowed}, got {variant!r} / {ablation!r}"
        )
    if max_ctas is not None and (variant not in _WS3P_ALL or int(max_ctas) < 1):
        raise ValueError(
            f"max_ctas: expected None, or >= 1 with a ws3p variant {sorted(_WS3P_ALL)}, "
            f"got {max_ctas!r} with {variant!r}"
        )
    _check_args(q, kv, indices, sink)
    t, h, d = q.shape
    if (extra_kv is None) != (extra_indices is None):
        raise ValueError("sparse_attn_ws: extra_kv and extra_indices must be given together")
    if extra_kv is not None:
        _check_extra(kv, extra_kv, extra_indices, t, variant, ablation)
    if out is None:
        out = torch.empty(t, h, d, dtype=q.dtype, device=q.device)
    elif tuple(out.shape) != (t, h, d) or out.dtype != q.dtype:
        raise ValueError(f"out: expected {q.dtype} {(t, h, d)}, got {out.dtype} {tuple(out.shape)}")
    if lse_out is None:
        lse_out = torch.empty(t, h, dtype=torch.float32, device=q.device)
    elif tuple(lse_out.shape) != (t, h) or lse_out.dtype != torch.float32:
        raise ValueError(f"lse_out: expected float32 {(t, h)}, got {lse_out.dtype} {tuple(lse_out.shape)}")
    if t == 0:
        return out, lse_out
    mod = _module()
    kv_f, fp8 = _cache_rows(kv)
    if variant in WS3P_VEC_OPTS and not fp8:  # nothing to dequantise: the base variant is the same kernel
        variant = WS3P_VEC_BASE[variant]
    _check_block_rows(mod, variant)
    q_ok = q.stride(-1) == 1 and _aligned(q, (q.stride(0), q.stride(1)))
    q_c = q if q_ok else q.clone(memory_format=torch.contiguous_format)  # contiguous() keeps a misaligned view
    idx = indices if indices.stride(-1) == 1 or indices.shape[1] <= 1 else indices.contiguous()
    o_ok = out.stride(-1) == 1 and _aligned(out, (out.stride(0), out.stride(1)), 4)
    o_dst = out if o_ok else torch.empty(t, h, d, dtype=q.dtype, device=q.device)
    sink_c = sink.contiguous() if sink is not None else None
    ex = _extra_rows(extra_kv, extra_indices) if extra_kv is not None else None
    topk2 = ex[1].shape[1] if ex is not None else 0
    splits, per = split_plan(t, h, idx.shape[1] + topk2, device_sms(q.device), num_splits, block_rows(variant))
    part_o = part_lse = None
    if splits > 1:
        part_o = torch.empty(t * splits * h, d, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(t * splits * h, dtype=torch.float32, device=q.device)
    sink_p = sink_c.data_ptr() if sink_c is not None else 0
    po, pl = (part_o.data_ptr(), part_lse.data_ptr()) if part_o is not None and part_lse is not None else (0, 0)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    if ex is not None:
        ex_f, ex_idx = ex
        mod.sparse_decode_ws3_extra(
            q_c.data_ptr(), kv_f.data_ptr(), idx.data_ptr(), ex_f.data_ptr(), ex_idx.data_ptr(), sink_p,
            o_dst.data_ptr(), lse_out.data_ptr(), po, pl,
            t, h, idx.shape[1], topk2, splits, per, float(softmax_scale) * LOG2E, kv_f.shape[0], ex_f.shape[0],
            idx.stride(0), ex_idx.stride(0), q_c.stride(0), q_c.stride(1), kv_f.stride(0),
            ex_f.stride(0) * ex_f.element_size(), o_dst.stride(0), o_dst.stride(1),
            lse_out.stride(0), lse_out.stride(1), fp8, stream,
        )  # fmt: skip
    elif variant in _WS3P_ALL:
        entry = mod.sparse_decode_ws3p if variant == "ws3p" else mod.sparse_decode_ws3p_opt
        if variant in WS3P_VEC_OPTS:
            entry = mod.sparse_decode_ws3p_vec
        opt = () if variant == "ws3p" else (_WS3P_ALL[variant],)
        if variant in _OVL_ALL:  # one name, a build per cache format
            entry, opt = mod.sparse_decode_ws3p_ovl, (_OVL_ALL[variant][int(fp8)],)
        entry(
            q_c.data_ptr(), kv_f.data_ptr(), idx.data_ptr(), sink_p, o_dst.data_ptr(), lse_out.data_ptr(), po, pl,
            t, h, idx.shape[1], splits, per, float(softmax_scale) * LOG2E, kv_f.shape[0],
            idx.stride(0), q_c.stride(0), q_c.stride(1), kv_f.stride(0), o_dst.stride(0), o_dst.stride(1),
            lse_out.stride(0), lse_out.stride(1), fp8, int(max_ctas or 0), *opt, stream,
        )  # fmt: skip
    else:
        mod.sparse_decode_ws(
            q_c.data_ptr(), kv_f.data_ptr(), idx.data_ptr(), sink_p, o_dst.data_ptr(), lse_out.data_ptr(), po, pl,
            t, h, idx.shape[1], splits, per, float(softmax_scale) * LOG2E, kv_f.shape[0],
            idx.stride(0), q_c.stride(0), q_c.stride(1), kv_f.stride(0), o_dst.stride(0), o_dst.stride(1),
            lse_out.stride(0), lse_out.stride(1), fp8, VARIANTS[variant], ABLATIONS[ablation], stream,
        )  # fmt: skip
    if part_o is not None and part_lse is not None:
        combine_splits(part_o, part_lse, sink_c, o_dst, lse_out, splits, bf16_rne=False)
    if o_dst is not out:
        out.copy_(o_dst)
    return out, lse_out


# ------------------------------------------------------------------------------------- out-of-process probe


def self_check(seed: int = 0, device: str = "cuda", variant: str = "ws") -> str:
    """Run the kernel on small V4 cases against the reference: BF16 / FP8 caches, auto and forced splits (1, 7),
    topk 640 and 600 (not a multiple of 32), holes, out-of-range indices, a token without any valid index, NaN in
    unused cache slots, NaN-poisoned outputs. Returns "" when all agree within a loose bound (layout / protocol bugs,
    not last-bit errors: the tests do that), else what went wrong. device "cpu": only to test this function with a
    stand-in kernel. Meant to run in a child process (`probe`): a kernel that faults or hangs cannot then take the
    caller's CUDA context down. variant: which kernel variant (`VARIANTS`), or several joined by commas (one child
    process checks them all: the ws3p option builds)."""
    from ... import reference
    from ...kv_format import pack_fp8_kv_ref

    g = torch.Generator().manual_seed(seed)
    t, n = 4, 2048
    q = torch.randn(t, BLOCK_H, HEAD_DIM, generator=g).bfloat16().to(device)
    cache = torch.randn(n, HEAD_DIM, generator=g).bfloat16()
    sink = torch.randn(BLOCK_H, generator=g).to(device)
    fails = []
    for topk in (640, 600):
        idx = torch.rand(t, n - 64, generator=g).topk(topk, dim=-1).indices.to(torch.int32)
        idx[torch.rand(t, topk, generator=g) < 0.05] = -1
        idx[1] = -1
        idx[2, topk - 40 :] = n + 5  # out of range: holes too
        used = torch.zeros(n, dtype=torch.bool)
        used[idx[(idx >= 0) & (idx < n)].long()] = True
        for fp8 in (False, True):
            kv = pack_fp8_kv_ref(cache) if fp8 else cache.clone()
            kv[~used] = 0xFF if fp8 else float("nan")  # NaN data (and NaN scales) wherever no index points
            kv, ic = kv.to(device), idx.to(device)
            ro, rl = reference.sparse_attn(q, kv, ic, sink, HEAD_DIM**-0.5)
            # the ws3p family: also a grid of 3 CTAs (4 or 4 x splits work items: several per CTA, unequal counts)
            for v in variant.split(","):
                grids = (None, 3) if v in _WS3P_ALL else (None,)
                for splits, ctas in [(s, c) for s in (None, 1, 7) for c in grids]:
                    out = torch.full_like(q, float("nan"))
                    lse = torch.full((t, BLOCK_H), float("nan"), device=device)
                    kw = {"max_ctas": ctas} if ctas else {}
                    sparse_attn_ws(
                        q, kv, ic, sink, HEAD_DIM**-0.5, out=out, lse_out=lse, num_splits=splits, variant=v, **kw
                    )
                    if device != "cpu":
                        torch.cuda.synchronize()
                    why = mismatch(out, lse, ro, rl)
                    if why is not None:
                        grid = f" max_ctas={ctas}" if ctas else ""
                        name = f"{v} " if "," in variant else ""
                        fails.append(f"{name}topk={topk} fp8={fp8} splits={splits}{grid}: {why}")
    return "; ".join(fails)


def self_check_extra(seed: int = 0, device: str = "cuda") -> str:
    """ws3 with the extra cache (`sparse_attn_ws(..., variant="ws3", extra_kv=, extra_indices=)`) on small engine-like
    cases against the reference: BF16 / FP8 caches, 512 + 128 indices (the main list's first 128 all holes: two
    all-hole tiles, as a fresh prompt) and 600 + 100 (a tile straddling both lists), auto and forced splits (1, 3),
    holes and out-of-range indices in both lists, a token without any valid index, NaN in unused slots of both caches,
    NaN-poisoned outputs. Returns "" when all agree within a loose bound, else what went wrong. For a child process
    (`probe_extra`); device "cpu": only to test this function with a stand-in kernel."""
    from ... import reference
    from ...kv_format import pack_fp8_kv_ref

    g = torch.Generator().manual_seed(seed)
    t, n, n2 = 4, 2048, 160
    q = torch.randn(t, BLOCK_H, HEAD_DIM, generator=g).bfloat16().to(device)
    cache, cache2 = torch.randn(n, HEAD_DIM, generator=g).bfloat16(), torch.randn(n2, HEAD_DIM, generator=g).bfloat16()
    sink = torch.randn(BLOCK_H, generator=g).to(device)
    fails = []
    for k1, k2 in ((640, 128), (600, 100)):
        idx = torch.rand(t, n - 64, generator=g).topk(k1, dim=-1).indices.to(torch.int32)
        idx2 = torch.rand(t, n2 - 8, generator=g).topk(k2, dim=-1).indices.to(torch.int32)
        if k1 == 640:
            idx[:, :128] = -1  # two all-hole tiles in every token (a fresh prompt's empty ring)
        idx[torch.rand(t, k1, generator=g) < 0.05] = -1
        idx2[torch.rand(t, k2, generator=g) < 0.3] = -1
        idx2[2, : k2 // 2] = n2 + 3  # out of range: holes too
        idx[1], idx2[1] = -1, -1
        for fp8 in (False, True):
            kv, kv2 = (pack_fp8_kv_ref(c) if fp8 else c.clone() for c in (cache, cache2))
            for c, i in ((kv, idx), (kv2, idx2)):  # NaN data (and NaN scales) wherever no index points
                used = torch.zeros(c.shape[0], dtype=torch.bool)
                used[i[(i >= 0) & (i < c.shape[0])].long()] = True
                c[~used] = 0xFF if fp8 else float("nan")
            kv, kv2, ic, ic2 = kv.to(device), kv2.to(device), idx.to(device), idx2.to(device)
            ro, rl = reference.sparse_attn(q, kv, ic, sink, HEAD_DIM**-0.5, kv2, ic2)
            for splits in (None, 1, 3):
                out = torch.full_like(q, float("nan"))
                lse = torch.full((t, BLOCK_H), float("nan"), device=device)
                sparse_attn_ws(q, kv, ic, sink, HEAD_DIM**-0.5, out=out, lse_out=lse, num_splits=splits,
                               variant="ws3", extra_kv=kv2, extra_indices=ic2)  # fmt: skip
                if device != "cpu":
                    torch.cuda.synchronize()
                why = mismatch(out, lse, ro, rl)
                if why is not None:
                    fails.append(f"k={k1}+{k2} fp8={fp8} splits={splits}: {why}")
    return "; ".join(fails)


def run_ablations(seed: int = 0, device: str = "cuda") -> str:
    """Every timing-only ablation of every variant once (BF16 / FP8 cache, 4 tokens x 640 indices with holes, auto
    plan (split) and one split), synchronised: "" when all finish, else the first error. Numbers are not checked
    (wrong by design). Meant for a child process (`probe_ablations`): a hang is what this looks for."""
    from ...kv_format import pack_fp8_kv_ref

    g = torch.Generator().manual_seed(seed)
    t, n, topk = 4, 2048, 640
    q = torch.randn(t, BLOCK_H, HEAD_DIM, generator=g).bfloat16().to(device)
    cache = torch.randn(n, HEAD_DIM, generator=g).bfloat16()
    idx = torch.rand(t, n, generator=g).topk(topk, dim=-1).indices.to(torch.int32)
    idx[torch.rand(t, topk, generator=g) < 0.05] = -1
    idx = idx.to(device)
    sink = torch.randn(BLOCK_H, generator=g).to(device)
    for kv in (cache.to(device), pack_fp8_kv_ref(cache).to(device)):
        for variant in VARIANTS:
            for ablation in ablations_of(variant):
                for splits in (None, 1):
                    try:
                        sparse_attn_ws(q, kv, idx, sink, HEAD_DIM**-0.5, num_splits=splits, variant=variant,
                                       ablation=ablation)  # fmt: skip
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001 - reported to the parent process
                        return f"{variant} {ablation} {kv.dtype} splits={splits}: {type(e).__name__}: {e}"
    return ""


def probe_ablations(timeout_s: float = 120.0) -> tuple[bool, str]:
    """`run_ablations` in a child process: (finished cleanly, its output); a fault or a hang gives False. Cached."""
    return _probe_cached(float(timeout_s), "ablations")


def probe(timeout_s: float = 120.0, variant: str = "ws") -> tuple[bool, str]:
    """`self_check(variant=variant)` in a child process (same sys.path): (passed, its output). A crash, a wrong result
    or a hang (killed after timeout_s) gives False; cached per process and variant. Several variants joined by commas
    are checked by one child process."""
    names = sorted(VARIANTS) + sorted(WS3P_VEC_OPTS) + sorted(_OVL_ALL)
    if not variant or any(v not in names for v in variant.split(",")):
        raise ValueError(f"probe: variant: expected one of {names}, got {variant!r}")
    return _probe_cached(float(timeout_s), variant)


def probe_extra(timeout_s: float = 120.0) -> tuple[bool, str]:
    """`self_check_extra` (ws3 with the extra cache) in a child process: (passed, its output); cached."""
    return _probe_cached(float(timeout_s), "ws3_extra")


@functools.cache
def _probe_cached(timeout_s: float, variant: str) -> tuple[bool, str]:
    return run_probe(__name__, [variant], timeout_s, f"the warp-specialised kernel ({variant})")


if __name__ == "__main__":
    arg = sys.argv[1] if len(sys.argv) > 1 else "ws"
    checks = {"ablations": run_ablations, "ws3_extra": self_check_extra}
    probe_main(
        available() and (arg != "ws3_extra" or ws3_extra_available()),
        "no CUDA device or no _C.sparse_decode_ws (ws3_extra: no _C.sparse_decode_ws3_extra)",
        checks.get(arg, lambda: self_check(variant=arg)),
    )
