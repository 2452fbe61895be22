"""CUDA C++ radix top-k (`csrc/cuda/topk_radix.cu`, built into `deepinfer.deep_select._C`): Python launcher.

Same contract and result layout as the Triton kernels (`topk_triton_v3`): int32 [b, k] ids in no particular
order, then -1 padding; ragged form through `starts` (ids relative to starts[r]). One CTA of 512 threads per
row, radix select over a unique 64-bit key (value image, then the column, so the lower column wins ties):

* mode="fast" (round 2): one pass over the row; an entry is counted in the 4096-bin histogram of
  the top 12 key bits and kept in shared memory only when it is at or above bmin, the bucket of the k-th best
  entry counted so far (refreshed after tiles 0-3, then every 4th tile), so after the first tiles almost every
  entry costs a compare and a warp vote; the next tile's loads are in flight while a tile is processed. The
  remaining digits are then resolved in shared memory. Rows whose kept entries overflow the buffer (ascending
  rows, heavy ties) fall back to the two-pass path.
* mode="lean" (DEFAULT_MODE since round 3; H200: 1.1-2.1x "fast"): the fast pass with a cheaper filter: tile 0 is
  counted first and then kept only at or above bmin (no 8,192-entry keep + compaction), later tiles test each
  entry with one float compare against bmin's lower bound (rank compare for fp16) and skip the validity math
  inside the row; only passing entries (~1-2 %) take per-lane shared atomics. 4 x 16-byte loads per thread per
  tile for every dtype.
* mode="lean_pf": lean plus a bulk L2 prefetch (cp.async.bulk.prefetch.L2, sm_90) of the tile 3 tiles ahead, so
  that more bytes are in flight per SM than the register double buffer holds (16-byte loads; else plain lean).
* mode="one_read" (round 1's default): the same one-read scheme with every entry counted (one shared atomic per
  entry) and a threshold refresh, plus a second visit of the registers, after every tile; no prefetch.
* mode="two_pass": the histogram pass, then a second pass (mostly from L2 at n <= 65,536) that writes every
  entry above the threshold bucket and keeps the bucket's entries in shared memory.

Rows whose threshold bucket alone overflows the buffer (heavy ties) take extra histogram passes over the row.

`_C` is imported lazily: a CPU build (DEEPINFER_DEVICE=cpu, CI) has no `_C` and never reaches this module's
kernels (`available()` is False).
"""

from __future__ import annotations

import functools
import math
import os
import types

import torch

from ..._backend import compiled_module

__all__ = ["DEFAULT_CAP", "DEFAULT_MODE", "MODES", "available", "choose_split", "topk_cuda", "topk_cuda_split"]

DEFAULT_CAP = 8192  # shared-memory candidate slots per CTA: 64 KB; 2 CTAs of 512 threads per SM
MODES = {"two_pass": 0, "one_read": 1, "fast": 2, "lean": 3, "lean_pf": 4}  # kernel MODE codes (topk_radix_kernel.cuh)
SPLIT_MODES = ("fast", "lean", "lean_pf")  # modes of the split's segments
# What the API runs (one CTA per row and the split's segments): "lean", the fastest mode at every benchmark shape but
# b = 1 sampler k = 50 (equal) on the H200 (session 4). The environment variable lets a GPU session run the API tests
# in another mode without an edit (validated at the first call).
DEFAULT_MODE = os.environ.get("DEEPINFER_DEEP_SELECT_CUDA_MODE", "lean")
SPLIT_FILL = 2  # choose_split's target CTAs per SM (round 3 measures 4: cuda_lean_s2 at b = 256, s8 at b = 64)
# choose_split's limits for lean / lean_pf segments, set from the session-4 H200 rows (JSON
# 2026-11-30-s4-bench-deep_select.json; see choose_split's comments for the rows that decided each one).
LEAN_SPLIT_MIN_N = 98304  # shorter rows run one CTA: n = 65,536 lost at b = 1 and 64, n = 129,280 won at b = 1
LEAN_MERGE_CANDS = 12288  # at most this many merge candidates (segs x k) per row
LEAN_FEW_SEG_MIN = 49152  # b > SMs / 4: each segment keeps at least this many entries ...
LEAN_FEW_SEG_MERGE = 64  # ... and the merge reads at most n / this many candidates
_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@functools.cache
def _module() -> types.ModuleType | None:
    return compiled_module()


def available() -> bool:
    """True when the compiled extension imports (a CUDA build)."""
    return _module() is not None


def _vector_ok(scores: torch.Tensor) -> bool:
    """16-byte loads need every row base 16-byte aligned (unit column stride is assumed)."""
    esize = scores.element_size()
    return scores.data_ptr() % 16 == 0 and (scores.shape[0] == 1 or (scores.stride(0) * esize) % 16 == 0)


def _int32_vec(name: str, v: torch.Tensor | None, b: int) -> torch.Tensor | None:
    if v is None:
        return None
    if v.dtype != torch.int32 or tuple(v.shape) != (b,):
        raise ValueError(f"{name}: expected int32 [{b}], got {v.dtype} {tuple(v.shape)}")
    return v.contiguous()


def topk_cuda(
    scores: torch.Tensor,
    k: int,
    *,
    lengths: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    cap: int | None = None,
    vectorize: bool = True,
    one_read: bool = True,
    mode: str | None = None,
) -> torch.Tensor:
    """Exact row-wise top-k ids (unsorted), same arguments and result as `topk_triton_v3`.

    Args:
        scores: [b, n] fp32 / bf16 / fp16 on CUDA, any row stride (a non-unit column stride is copied first).
        k: >= 1; lengths (or ends) / starts: int32 [b] or None (ragged: ids relative to starts[r]).
        out: optional int32 [b, k] buffer (any strides); every slot is written.
        cap: shared-memory candidate slots (default min(DEFAULT_CAP, n)); tests shrink it to force the
            extra row passes of tie-heavy rows. vectorize: False forces scalar loads (tests).
        mode: "fast" / "lean" / "lean_pf" / "one_read" / "two_pass" (see the module docstring); None:
            DEFAULT_MODE, or "two_pass" when one_read=False (round 1's switch, kept for callers).

    Returns:
        int32 [b, k]: chosen ids in slots 0 .. min(k, len) - 1 (any order), then -1.
    Never syncs with the host (CUDA-graph safe).
    """
    if mode is None and DEFAULT_MODE not in MODES:
        raise ValueError(f"DEEPINFER_DEEP_SELECT_CUDA_MODE: expected one of {sorted(MODES)}, got {DEFAULT_MODE!r}")
    mode = (DEFAULT_MODE if one_read else "two_pass") if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {sorted(MODES)}, got {mode!r}")
    mod = _module()
    if mod is None:
        raise RuntimeError("deep_select: the CUDA kernel needs deepinfer.deep_select._C (DEEPINFER_DEVICE=cuda build)")
    if scores.dim() != 2 or scores.dtype not in _DTYPE_CODE:
        raise ValueError(f"scores: expected [b, n] fp32 / bf16 / fp16, got {scores.dtype} {tuple(scores.shape)}")
    if scores.device.type != "cuda":
        raise ValueError(f"scores: expected a CUDA tensor, got device {scores.device}")
    if k < 1:
        raise ValueError(f"k: expected >= 1, got {k}")
    b, n = scores.shape
    if n >= 2**31:
        raise ValueError(f"scores: expected n < 2^31 columns, got {n}")
    if scores.stride(1) != 1 and n > 1:
        scores = scores.contiguous()
    lengths, starts = _int32_vec("lengths", lengths, b), _int32_vec("starts", starts, b)
    if out is None:
        out = torch.empty((b, k), dtype=torch.int32, device=scores.device)
    elif out.dtype != torch.int32 or tuple(out.shape) != (b, k):
        raise ValueError(f"out: expected int32 [{b}, {k}], got {out.dtype} {tuple(out.shape)}")
    if b == 0:
        return out
    cap = max(1, min(DEFAULT_CAP, n)) if cap is None else cap
    if not 1 <= cap <= DEFAULT_CAP:
        raise ValueError(f"cap: expected 1 .. {DEFAULT_CAP}, got {cap}")
    with torch.cuda.device(scores.device):
        mod.topk_radix(
            scores.data_ptr(), _DTYPE_CODE[scores.dtype], b, n, scores.stride(0),
            0 if lengths is None else lengths.data_ptr(), 0 if starts is None else starts.data_ptr(),
            out.data_ptr(), k, out.stride(0), out.stride(1), cap, vectorize and _vector_ok(scores), MODES[mode],
            1, 0, 0, torch.cuda.current_stream(scores.device).cuda_stream,
        )  # fmt: skip
    return out


def choose_split(b: int, n: int, k: int, num_sms: int, fill: int | None = None, mode: str | None = None) -> int:
    """Segments per row for `topk_cuda_split` (1 = no split; the caller then runs one CTA per row).

    Args:
        b, n, k: rows, columns, picks per row; num_sms: the device's SM count (132 on the H200).
        fill: target CTAs per SM (default SPLIT_FILL = 2, the kernel's residency).
        mode: the segments' pass, "fast", "lean" or "lean_pf"; None: DEFAULT_MODE when it is one of those, else
            "fast" (what `dispatch._select_cuda` runs the segments in).

    Rows shorter than 16,384 or k > n / 8 never split. "fast" (session 3's rule): enough CTAs to fill the GPU,
    fill x SMs / b, and about sqrt(n / k) segments so that a segment's pass (n / segs entries) and the merge's
    (segs x k candidates) cost about the same; fill = 2 splits only b <= SMs, 4 also gives b <= 2 x SMs 2
    segments. "lean" / "lean_pf": see `_lean_split`.
    """
    mode = (DEFAULT_MODE if DEFAULT_MODE in SPLIT_MODES else "fast") if mode is None else mode
    if mode not in SPLIT_MODES:
        raise ValueError(f"mode: expected one of {SPLIT_MODES}, got {mode!r}")
    if n < 16384 or 8 * k > n:
        return 1
    fill = SPLIT_FILL if fill is None else fill
    if mode != "fast":
        return _lean_split(b, n, k, num_sms, fill)
    segs = min((fill * num_sms) // max(b, 1), int((n / k) ** 0.5), 64)
    return segs if segs >= 2 else 1


def _lean_split(b: int, n: int, k: int, num_sms: int, fill: int) -> int:
    """choose_split for lean / lean_pf segments: fast's rule, with fewer splits and fewer segments.

    Why: a lean CTA reads a row 1.1-2.1x faster than a fast one, while the split still pays a second launch and
    one merge CTA per row over segs x k gathered candidates (b = 1, n = 262,144, k = 2048: S = 6 / 11 / 22 / 32
    took 60.6 / 65.9 / 86.7 / 105.6 us while the merge grew 12,288 / 22,528 / 45,056 / 65,536 candidates, about
    0.85 us per 1,000 more). Each limit below cites the session-4 H200 rows that set it (fp32, us, the split with
    S lean segments vs one lean CTA per row, same run; JSON 2026-11-30-s4-bench-deep_select.json). Limits lie
    between a measured win and a measured loss; shapes between the measured ones were not timed.
    """
    b = max(b, 1)
    # 1. No split for rows a lean CTA reads in ~27-37 us: n = 65,536 lost at b = 1 (k = 512: S = 11 29.2 vs
    #    26.9; k = 2048: S = 5 43.9 vs 36.6) and b = 64 (34.6 vs 29.9; 50.4 vs 39.5); n = 129,280 won at b = 1
    #    (sampler k = 50: S = 50 24.4 vs 26.4; k = 512: S = 15 35.2 vs 37.4). The limit sits between them.
    # 2. No split unless a row gains >= 2 SMs (b <= SMs / 2, the Triton split's limit too): with b > SMs / 2
    #    one CTA per row already has an SM each, and b = 256 with 2 segments lost (74.2 vs 43.9 us at
    #    n = 65,536; 131.0 vs 91.4 at n = 262,144).
    if n < LEAN_SPLIT_MIN_N or 2 * b > num_sms:
        return 1
    # 3. Segments: fast's min(fill x SMs / b, sqrt(n / k), 64), and at most LEAN_MERGE_CANDS merge candidates:
    #    b = 1, n = 262,144, k = 2048: S = 6 (12,288 candidates) 60.6 us beat fast's S = 11 (22,528) 65.9;
    #    k = 512: S = 22 (11,264) 41.7 beat S = 44 (22,528) 50.3 and one CTA 54.5.
    segs = min((fill * num_sms) // b, math.isqrt(n // k), LEAN_MERGE_CANDS // k, 64)
    # 4. Few segments (b > SMs / 4: the split gives a row 2-4 SMs, not dozens): only long segments and a small
    #    merge pay for the second launch. b = 64 (S = 4): n = 262,144, k = 512 won (57.8 vs 60.5 us: 65,536
    #    entries a segment, merge n / 128); k = 2048 lost (88.0 vs 86.5: merge n / 32); n = 129,280 lost
    #    (sampler k = 50: 36.0 vs 30.9, k = 512: 44.6 vs 41.1: 32,320 entries a segment). Limits in between.
    if 4 * b > num_sms and (n < LEAN_FEW_SEG_MIN * segs or segs * k * LEAN_FEW_SEG_MERGE > n):
        return 1
    return segs if segs >= 2 else 1


def topk_cuda_split(
    scores: torch.Tensor,
    k: int,
    segs: int,
    *,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    cap: int | None = None,
    vectorize: bool = True,
    mode: str = "fast",
) -> torch.Tensor:
    """`topk_cuda` for few long rows: each row cut into `segs` segments, one CTA each (fast mode), writing its
    segment's top k as row ids to a [b * segs, k] scratch; then one merge CTA per row selects among those
    segs x k ids by the values they name (the key's column part is the id, so ties still go to the lower column).
    Row-wise calls only (no starts). Same result as `topk_cuda`.

    Args:
        scores: [b, n] fp32 / bf16 / fp16 on CUDA; k >= 1; segs >= 1 (1 = `topk_cuda`);
        lengths: int32 [b] or None; out: optional int32 [b, k]; cap / vectorize as in `topk_cuda`.
        mode: the segments' pass, "fast", "lean" or "lean_pf" (the merge runs the fast pass over gathered ids).

    Returns:
        int32 [b, k]: chosen ids in slots 0 .. min(k, len) - 1 (any order), then -1.
    """
    if segs < 1:
        raise ValueError(f"segs: expected >= 1, got {segs}")
    if mode not in SPLIT_MODES:
        raise ValueError(f"mode: expected one of {SPLIT_MODES}, got {mode!r}")
    if segs == 1:
        return topk_cuda(scores, k, lengths=lengths, out=out, cap=cap, vectorize=vectorize, mode=mode)
    stage1 = topk_cuda_stage1(scores, k, segs, lengths=lengths, cap=cap, vectorize=vectorize, mode=mode)
    return topk_cuda_merge(scores, k, stage1, lengths=lengths, out=out, cap=cap, vectorize=vectorize)


def _launch(
    mod: types.ModuleType, scores: torch.Tensor, b: int, lengths, out, k, cap, vec, segs, gather, m, mode="fast"
) -> None:
    with torch.cuda.device(scores.device):
        mod.topk_radix(
            scores.data_ptr(), _DTYPE_CODE[scores.dtype], b, scores.shape[1], scores.stride(0),
            0 if lengths is None else lengths.data_ptr(), 0, out.data_ptr(), k, out.stride(0), out.stride(1), cap,
            vec, MODES[mode], segs, 0 if gather is None else gather.data_ptr(), m,
            torch.cuda.current_stream(scores.device).cuda_stream,
        )  # fmt: skip


def _checked(scores: torch.Tensor, k: int, lengths: torch.Tensor | None) -> tuple[torch.Tensor, object]:
    mod = _module()
    if mod is None:
        raise RuntimeError("deep_select: the CUDA kernel needs deepinfer.deep_select._C (DEEPINFER_DEVICE=cuda build)")
    if scores.dim() != 2 or scores.dtype not in _DTYPE_CODE or scores.device.type != "cuda":
        raise ValueError(f"scores: expected CUDA [b, n] fp32 / bf16 / fp16, got {scores.dtype} {tuple(scores.shape)}")
    if k < 1 or scores.shape[1] >= 2**31:
        raise ValueError(f"expected k >= 1 and n < 2^31, got k={k}, n={scores.shape[1]}")
    if scores.stride(1) != 1 and scores.shape[1] > 1:
        scores = scores.contiguous()
    return scores, mod


def topk_cuda_stage1(
    scores: torch.Tensor,
    k: int,
    segs: int,
    *,
    lengths: torch.Tensor | None = None,
    cap: int | None = None,
    vectorize: bool = True,
    mode: str = "fast",
) -> torch.Tensor:
    """The split's first stage: int32 [b, segs * k], segment s's top k as row ids in columns s*k .. s*k + k - 1
    (-1 padded); segments are ceil(n / segs) rounded up to 8 columns. mode: one of SPLIT_MODES."""
    scores, mod = _checked(scores, k, lengths)
    b, n = scores.shape
    lengths = _int32_vec("lengths", lengths, b)
    seg = -(-n // segs)
    seg = (seg + 7) // 8 * 8
    cap = max(1, min(DEFAULT_CAP, seg)) if cap is None else cap
    if not 1 <= cap <= DEFAULT_CAP:
        raise ValueError(f"cap: expected 1 .. {DEFAULT_CAP}, got {cap}")
    stage1 = torch.empty((b * segs, k), dtype=torch.int32, device=scores.device)
    if b > 0:
        _launch(mod, scores, b, lengths, stage1, k, cap, vectorize and _vector_ok(scores), segs, None, 0, mode)
    return stage1.view(b, segs * k)


def topk_cuda_merge(
    scores: torch.Tensor,
    k: int,
    cand: torch.Tensor,
    *,
    lengths: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    cap: int | None = None,
    vectorize: bool = True,
) -> torch.Tensor:
    """The split's merge: the top min(k, length) of row r among the ids cand[r] (int32 [b, m], -1 = none; every
    id < lengths[r]; together a superset of the row's top k), by value then lower id. int32 [b, k], -1 padded."""
    scores, mod = _checked(scores, k, lengths)
    b = scores.shape[0]
    lengths = _int32_vec("lengths", lengths, b)
    if cand.dtype != torch.int32 or cand.dim() != 2 or cand.shape[0] != b:
        raise ValueError(f"cand: expected int32 [{b}, m], got {cand.dtype} {tuple(cand.shape)}")
    cand = cand.contiguous()
    m = cand.shape[1]
    if out is None:
        out = torch.empty((b, k), dtype=torch.int32, device=scores.device)
    elif out.dtype != torch.int32 or tuple(out.shape) != (b, k):
        raise ValueError(f"out: expected int32 [{b}, {k}], got {out.dtype} {tuple(out.shape)}")
    cap = max(1, min(DEFAULT_CAP, m)) if cap is None else cap
    if not 1 <= cap <= DEFAULT_CAP:
        raise ValueError(f"cap: expected 1 .. {DEFAULT_CAP}, got {cap}")
    vec = vectorize and cand.data_ptr() % 16 == 0 and (m * 4) % 16 == 0
    if b > 0 and m > 0:
        _launch(mod, scores, b, lengths, out, k, cap, vec, 1, cand, m)
    elif b > 0:
        out.fill_(-1)
    return out
