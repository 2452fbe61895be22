"""CUDA C++ (sm_90a, wgmma) sparse sink attention: `csrc/cuda/fm_sparse_decode.cu`, module `deepinfer.flash_mla._C`.

Same math, conventions and split-KV plan as `triton_split_attn.py`: one CTA per (query token, 64-head block,
split), 64-row tiles of gathered rows, both warpgroups sharing the work without computing the scores twice (design
notes at the top of the .cu file). The default kernel of `sparse_attn_split_triton` (DEFAULT_KERNELS, or
kernel="cuda"); it takes bf16 q [t, h, 512] (any h: 64 heads per CTA, a partial last block masked), a BF16 cache
(16-byte aligned rows) or the V4 FP8 rows, and optionally an extra cache of the same format (`extra_kv` /
`extra_indices`: the index space is the main list followed by the extra list). `supports` says whether a call fits
(the default falls back to the Triton kernel otherwise: no `_C`, q not bf16, d != 512, mixed cache formats).

Small-batch plans (named, measured side by side by the benchmark; DEFAULT_OPTIONS picks what kernel="cuda" runs):
* plan: "default" (`plan_num_splits`, at least 2 tiles per split), "fine" (at least 1 tile per split), "auto"
  (`fine` when every tile of every token gets its own CTA in one wave and a token has at most FINE_MAX_TILES tiles,
  else `default`), "wave" (session 7: `fine` whenever every tile gets its own CTA in one wave, however long the
  list: HCA b = 1 s_q = 1 runs 130 one-tile CTAs instead of 65 two-tile ones; a candidate for the default together
  with the "pdl_wide" merge, which makes the extra partials cheap to merge);
* merge of the split partials: "triton" (the Triton `_combine_kernel`, a second launch), "pdl" (the CUDA
  `combine_kernel`, launched with programmatic dependent launch so its CTAs wait on the idle SMs instead of
  behind a launch gap), "last_cta" (no second launch: the last CTA of each token to finish merges the others'
  partials; per-device counter buffer, so concurrent calls on two streams of one device must not use it);
  "pdl_wide" (session 7, `csrc/cuda/fm_combine_wide.cu`): the PDL combine with the same arithmetic in the same
  order (bit-equal to "pdl") but its L2 reads batched: 32 splits' lse per warp load, 8 partial rows in flight,
  where "pdl" chains ~S + S / 4 dependent L2 round trips per warp (S = 65 splits at HCA 1M);
* FP8 tile path ("fp8_path", FP8 caches only): "stage" (8-byte cp.async of the raw 584-byte rows into a staging
  buffer, then a shared -> shared dequantisation pass) or "vec" (session 9, `fp8v`: each thread loads its 7 e4m3
  16-byte units + 2 RoPE chunks of the tile straight into registers, converts them with ws3p kOptVec's dequant8v
  (`csrc/cuda/fm_fp8v.cuh`) and stores bf16 into the tile: no staging, no second pass, no integer division; the
  next tile's loads fly behind the current tile's math). Bit-identical (out, lse, split partials); "vec" needs a
  `_C` of SPARSE_DECODE_ABI >= 4 (`FP8_PATHS`, bench rows `cuda*_fp8v` in benchmarks/bench_fm_b2.py);
* prefetch (prefill, several waves of CTAs): the CTA of token i prefetches into L2 the index rows and q of token
  i + (CTAs per wave), which starts about one wave later, so its first loads hit L2 (`bench rows cuda_prefetch`).

`_C` is imported lazily: CPU builds (DEEPINFER_DEVICE=cpu) have none, and the repo's conftest / the benchmark put
the source tree first on sys.path, which holds no built `_C`, so the installed copy's is looked up as well.
The launcher reads shapes, strides and pointers only (no host sync): CUDA-graph safe (warm "last_cta" up before a
capture: its counter buffer is allocated on first use).
"""

from __future__ import annotations

import functools
import types

import torch

from ..._backend import compiled_module
from ._cuda_probe import mismatch, probe_main, run_probe
from .triton_split_attn import FP8_ROW_BYTES, LOG2E, combine_splits, device_sms, plan_num_splits

__all__ = [
    "DEFAULT_OPTIONS",
    "FP8_PATHS",
    "MERGES",
    "PLANS",
    "available",
    "cuda_num_splits",
    "sparse_attn_cuda",
    "supports",
]

_PKG = __package__.rsplit(".backends", 1)[0]  # "deepinfer.flash_mla"
BLOCK_H, BLOCK_N, HEAD_DIM = 64, 64, 512
_ABI = 2  # fm_bindings.cpp SPARSE_DECODE_ABI this wrapper calls (extra list, byte row strides, merge modes)
PLANS = ("default", "fine", "auto", "wave")
MERGES = ("triton", "pdl", "last_cta", "pdl_wide")
_MERGE_CODE = {"triton": 0, "pdl": 1, "last_cta": 2, "pdl_wide": 3}
_MERGE_ABI = {"pdl_wide": 3}  # merges that need a newer _C than _ABI (fm_bindings.cpp SPARSE_DECODE_ABI)
FP8_PATHS = ("stage", "vec")  # FP8 tile path: kv_mode 1 / 2 of fm_bindings.cpp sparse_decode
_FP8_PATH_ABI = {"vec": 4}  # paths that need a newer _C than _ABI
FINE_MAX_TILES = 16  # "auto" plan: above this a token's partials (one [h, 512] fp32 per split) cost more to merge
# What kernel="cuda" runs when the call does not name a plan / merge / prefetch: set from the session-4 H200 runs
# (bench rows cuda[_fp8]_<plan>_<merge> against cuda[_fp8] at decode b = 1 / 2 and HCA b = 1: fine + pdl fastest
# there, last_cta 2-8x slower; cuda_prefetch 1.00-1.02x at prefill, so off). README "Small-batch plans and merges"
# also notes the PDL merge looked slower than the Triton one at b = 32 (across two runs, not yet measured in one).
# Session 8: merge "pdl_wide" (bit-equal to "pdl", 1.04-1.10x at b 1-4 in session 7); a _C older than its ABI falls
# back to "pdl" (`_resolve_merge`).
# Session 9 (H200, bench_fm_b2.py, 7 rounds): fp8_path "vec" is bit-equal to "stage" (22 GPU tests) and 1.048x it at
# b 2 x s_q 2 (the public call 14.75 vs 15.46 us; FlashMLA 15.2), 1.083x with 2 tiles per CTA: the default.
DEFAULT_OPTIONS: dict[str, str | bool] = {"plan": "auto", "merge": "pdl_wide", "prefetch": False, "fp8_path": "vec"}


@functools.cache
def _module() -> types.ModuleType | None:
    """`deepinfer.flash_mla._C` with the sparse decode kernel of this ABI, or None (not built / CPU build / stale)."""
    mod = compiled_module()
    ok = mod is not None and hasattr(mod, "sparse_decode") and getattr(mod, "SPARSE_DECODE_ABI", 1) >= _ABI
    return mod if ok else None


def _abi() -> int:
    """SPARSE_DECODE_ABI of the loaded `_C` (2 when absent: the checks that use it run only with a module)."""
    return int(getattr(_module(), "SPARSE_DECODE_ABI", 2))


def _resolve_merge(merge: str | None) -> str:
    """The merge a call runs: `merge` as given, else DEFAULT_OPTIONS["merge"], or "pdl" when that default needs a
    newer `_C` than the loaded one (a stale build keeps working, on the older merge)."""
    if merge is not None:
        return merge
    default = str(DEFAULT_OPTIONS["merge"])
    return default if _abi() >= _MERGE_ABI.get(default, _ABI) else "pdl"


def kv_mode(fp8: bool, fp8_path: str | None) -> int:
    """The kernel's kv_mode (0 BF16, 1 FP8 "stage", 2 FP8 "vec") for a cache format and a named FP8 path (None:
    DEFAULT_OPTIONS["fp8_path"], or "stage" when that default needs a newer `_C`); a BF16 cache ignores the path.
    Raises ValueError for an unknown path or one the loaded `_C` lacks (named explicitly)."""
    if fp8_path is not None and fp8_path not in FP8_PATHS:
        raise ValueError(f"fp8_path: expected one of {FP8_PATHS}, got {fp8_path!r}")
    if not fp8:
        return 0
    abi = _abi()
    if fp8_path is None:
        default = str(DEFAULT_OPTIONS["fp8_path"])
        fp8_path = default if abi >= _FP8_PATH_ABI.get(default, _ABI) else "stage"
    need = _FP8_PATH_ABI.get(fp8_path, _ABI)
    if abi < need:
        raise ValueError(f"fp8_path={fp8_path!r} needs SPARSE_DECODE_ABI >= {need}, got {abi}: rebuild _C")
    return FP8_PATHS.index(fp8_path) + 1


def available() -> bool:
    """True when the compiled kernel is present (a DEEPINFER_DEVICE=cuda build of this source)."""
    return _module() is not None


def _cache_format(kv: torch.Tensor) -> str | None:
    """The format of a cache the kernel reads ("bf16" or "fp8"), else None."""
    if kv.dtype == torch.uint8 and kv.shape[-1] == FP8_ROW_BYTES:
        return "fp8"
    if kv.dtype == torch.bfloat16 and kv.shape[-1] == HEAD_DIM:
        return "bf16"
    return None


def supports(q: torch.Tensor, kv: torch.Tensor, extra_kv: torch.Tensor | None) -> str | None:
    """None when `sparse_attn_cuda` takes this call (shapes / dtypes / device only), else why not."""
    if not available():
        return "deepinfer.flash_mla._C is not built (DEEPINFER_DEVICE=cuda) or is older than this source"
    if q.dim() != 3 or q.dtype != torch.bfloat16 or q.shape[-1] != HEAD_DIM or q.shape[1] < 1:
        return f"q: expected bf16 [t, h, {HEAD_DIM}], got {q.dtype} {tuple(q.shape)}"
    fmt = _cache_format(kv)
    if fmt is None:
        return f"kv: expected bf16 [..., {HEAD_DIM}] or uint8 [..., {FP8_ROW_BYTES}], got {kv.dtype} {tuple(kv.shape)}"
    if extra_kv is not None and _cache_format(extra_kv) != fmt:
        return f"extra_kv: expected the format of kv ({fmt}), got {extra_kv.dtype} {tuple(extra_kv.shape)}"
    if q.device.type != "cuda":
        return f"q is on {q.device}, not a CUDA device"
    return None


def _aligned(t: torch.Tensor, strides: tuple[int, ...], align: int = 16) -> bool:
    """Base address 16-byte aligned and every given stride (elements) a multiple of 16 bytes."""
    es = t.element_size()
    return t.data_ptr() % align == 0 and all((s * es) % align == 0 for s in strides)


def _rows(kv: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The cache as [slots, width] rows the kernel can read: BF16 16-byte aligned rows, FP8 contiguous rows."""
    fp8 = kv.dtype == torch.uint8
    flat = kv.reshape(-1, kv.shape[-1])
    # clone, not contiguous(): a contiguous view at a misaligned offset would come back unchanged
    if fp8:
        if not flat.is_contiguous() or flat.data_ptr() % 8:
            flat = flat.clone(memory_format=torch.contiguous_format)
    elif flat.stride(-1) != 1 or not _aligned(flat, (flat.stride(0),)):
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat, fp8


def _index_rows(name: str, idx: torch.Tensor, t: int) -> torch.Tensor:
    if idx.dtype != torch.int32 or idx.dim() != 2 or idx.shape[0] != t:
        raise ValueError(f"{name}: expected int32 [{t}, topk], got {idx.dtype} {tuple(idx.shape)}")
    return idx if idx.stride(-1) == 1 or idx.shape[1] <= 1 else idx.contiguous()


def cuda_num_splits(t: int, num_hb: int, tiles: int, num_sms: int, plan: str = "default") -> int:
    """Splits per token of the CUDA kernel under a named plan (see the module docstring); shapes only."""
    if plan not in PLANS:
        raise ValueError(f"plan: expected one of {PLANS}, got {plan!r}")
    one_wave = t * num_hb * tiles <= num_sms  # every tile its own CTA, all in one wave
    fine = plan == "fine" or (plan == "auto" and tiles <= FINE_MAX_TILES and one_wave) or (plan == "wave" and one_wave)
    return plan_num_splits(t, num_hb, tiles, num_sms, min_tiles=1 if fine else 2)


_COUNTERS: dict[tuple[str, int | None], torch.Tensor] = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 [>= n] per device for merge="last_cta" (the kernel leaves it zero after every launch)."""
    key = (device.type, device.index)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def sparse_attn_cuda(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    softmax_scale: float,
    *,
    out: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
    num_splits: int | None = None,
    extra_kv: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    plan: str | None = None,
    merge: str | None = None,
    prefetch: bool | int | None = None,
    fp8_path: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse sink attention on the compiled sm_90a kernel; returns (out [t, h, 512] bf16, lse fp32 [t, h]).

    Args:
        q: bf16 [t, h, 512] (V4: h = 64).
        kv: bf16 [n, 512] / [blocks, bs, 512], or uint8 FP8 rows [..., 584]; slots addressed flat.
        indices: int32 [t, topk]; -1 or any value outside [0, slots) is a hole.
        sink: fp32 [h] or None. softmax_scale: logit scale.
        out, lse_out: optional output buffers ([t, h, 512] bf16 / [t, h] fp32; copied when their strides do
            not suit the kernel).
        num_splits: splits per token (None: `cuda_num_splits` under `plan` for this device).
        extra_kv, extra_indices: optional second cache (the format of kv) and int32 [t, topk2] slots into it.
        plan, merge: names from PLANS / MERGES (None: DEFAULT_OPTIONS).
        prefetch: L2 prefetch of a later token's indices and q: True (one wave ahead, when the grid has more than
            one wave), an int (that many tokens ahead), False / 0 (off), None (DEFAULT_OPTIONS).
        fp8_path: FP8 cache tile path from FP8_PATHS ("stage" / "vec", same bits; None: DEFAULT_OPTIONS);
            ignored for a BF16 cache.
    """
    why = supports(q, kv, extra_kv)
    if why is not None:
        raise ValueError(f"sparse_attn_cuda: {why}")
    if (extra_kv is None) != (extra_indices is None):
        raise ValueError("extra_kv and extra_indices must be given together")
    plan = str(DEFAULT_OPTIONS["plan"]) if plan is None else plan
    merge = _resolve_merge(merge)
    prefetch = DEFAULT_OPTIONS["prefetch"] if prefetch is None else prefetch
    if merge not in MERGES:
        raise ValueError(f"merge: expected one of {MERGES}, got {merge!r}")
    abi = _abi()
    if abi < _MERGE_ABI.get(merge, _ABI):
        raise ValueError(f"merge={merge!r} needs SPARSE_DECODE_ABI >= {_MERGE_ABI[merge]}, got {abi}: rebuild _C")
    t, h, d = q.shape
    mode = kv_mode(_cache_format(kv) == "fp8", fp8_path)
    idx = _index_rows("indices", indices, t)
    if sink is not None and (sink.dtype != torch.float32 or tuple(sink.shape) != (h,)):
        raise ValueError(f"sink: expected fp32 [{h}], got {sink.dtype} {tuple(sink.shape)}")
    if out is None:
        out = torch.empty(t, h, d, dtype=q.dtype, device=q.device)
    elif tuple(out.shape) != (t, h, d) or out.dtype != q.dtype:
        raise ValueError(f"out: expected {q.dtype} {(t, h, d)}, got {out.dtype} {tuple(out.shape)}")
    if lse_out is None:
        lse_out = torch.empty(t, h, dtype=torch.float32, device=q.device)
    elif tuple(lse_out.shape) != (t, h) or lse_out.dtype != torch.float32:
        raise ValueError(f"lse_out: expected float32 {(t, h)}, got {lse_out.dtype} {tuple(lse_out.shape)}")
    ex_idx = _index_rows("extra_indices", extra_indices, t) if extra_indices is not None else None
    if t == 0:
        return out, lse_out
    kv_f = _rows(kv)[0]
    ex_f = _rows(extra_kv)[0] if extra_kv is not None else kv_f
    q_ok = q.stride(-1) == 1 and _aligned(q, (q.stride(0), q.stride(1)))
    q_c = q if q_ok else q.clone(memory_format=torch.contiguous_format)
    o_ok = out.stride(-1) == 1 and _aligned(out, (out.stride(0), out.stride(1)), 4)
    o_dst = out if o_ok else torch.empty(t, h, d, dtype=q.dtype, device=q.device)
    sink_c = sink.contiguous() if sink is not None else None

    num_hb = -(-h // BLOCK_H)
    topk2 = ex_idx.shape[1] if ex_idx is not None else 0
    tiles = -(-(idx.shape[1] + topk2) // BLOCK_N)
    if num_splits is None:
        num_splits = cuda_num_splits(t, num_hb, tiles, device_sms(q.device), plan)
    num_splits = max(1, min(int(num_splits), max(tiles, 1)))
    per_split = -(-tiles // num_splits)
    num_splits = max(1, -(-tiles // per_split)) if tiles else 1  # no empty trailing split
    po = pl = ctr = 0
    part_o = part_lse = None
    if num_splits > 1:
        part_o = torch.empty(t * num_splits * h, d, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(t * num_splits * h, dtype=torch.float32, device=q.device)
        po, pl = part_o.data_ptr(), part_lse.data_ptr()
        if merge == "last_cta":
            ctr = _counters(q.device, t * num_hb).data_ptr()
    ei = ex_idx if ex_idx is not None else idx
    wave = max(1, device_sms(q.device) // (num_hb * num_splits))  # tokens per wave of CTAs
    if prefetch is True:
        ahead = wave if t > wave else 0
    else:
        ahead = max(0, int(prefetch))
    _module().sparse_decode(
        q_c.data_ptr(), kv_f.data_ptr(), idx.data_ptr(), ex_f.data_ptr(), ei.data_ptr(),
        sink_c.data_ptr() if sink_c is not None else 0, o_dst.data_ptr(), lse_out.data_ptr(), po, pl, ctr,
        t, h, idx.shape[1], topk2, num_splits, per_split, _MERGE_CODE[merge], ahead, float(softmax_scale) * LOG2E,
        kv_f.shape[0], ex_f.shape[0] if ex_idx is not None else 0, idx.stride(0), ei.stride(0),
        kv_f.stride(0) * kv_f.element_size(), ex_f.stride(0) * ex_f.element_size(),
        q_c.stride(0), q_c.stride(1), o_dst.stride(0), o_dst.stride(1), lse_out.stride(0), lse_out.stride(1),
        mode if abi >= 4 else bool(mode), torch.cuda.current_stream(q.device).cuda_stream,
    )  # fmt: skip
    if part_o is not None and part_lse is not None and merge == "triton":
        combine_splits(part_o, part_lse, sink_c, o_dst, lse_out, num_splits, bf16_rne=False)
    if o_dst is not out:
        out.copy_(o_dst)
    return out, lse_out


# ------------------------------------------------------------------------------------- out-of-process probe


def self_check(seed: int = 0, device: str = "cuda") -> str:
    """Run the kernel once per cache format and mode on a small V4 case (4 tokens x 64 heads x 640 indices, holes,
    NaN in unused slots, a token without valid index, NaN-poisoned outputs) against the reference: one list, split
    or not; 512 + 128 indices with the 128 in an extra cache (the same rows, permuted) under each merge; returns ""
    when all agree within a loose bound (it catches layout bugs, not last-bit errors: the tests do that), else what
    went wrong. device: "cpu" only to test this function with a stand-in kernel. Meant to run in a child process
    (`probe`): a kernel that faults or hangs cannot then take the caller's CUDA context down."""
    from ... import reference
    from ...kv_format import pack_fp8_kv_ref

    g = torch.Generator().manual_seed(seed)
    t, n = 4, 2048
    q = torch.randn(t, BLOCK_H, HEAD_DIM, generator=g).bfloat16().to(device)
    cache = torch.randn(n, HEAD_DIM, generator=g).bfloat16()
    idx = torch.rand(t, n - 64, generator=g).topk(640, dim=-1).indices.to(torch.int32)
    idx[torch.rand(t, 640, generator=g) < 0.05] = -1
    idx[1] = -1
    idx[2, 600:] = n + 5  # out of range: holes too
    used = torch.zeros(n, dtype=torch.bool)
    used[idx[(idx >= 0) & (idx < n)].long()] = True
    perm = torch.randperm(n, generator=g)  # extra cache row j = main cache row perm[j]
    ex = idx[:, 512:]
    ex_ok = (ex >= 0) & (ex < n)
    ex2 = torch.where(ex_ok, torch.argsort(perm).to(torch.int32)[ex.clamp(0, n - 1).long()], ex)
    sink = torch.randn(BLOCK_H, generator=g).to(device)
    cases = [(None, False, None, 0), (1, False, None, 1), (10, False, "last_cta", 0), (1, True, None, 2)]
    # every merge the loaded _C supports (the default may pick any of them)
    cases += [(None, True, m, 0) for m in MERGES if _abi() >= _MERGE_ABI.get(m, _ABI)]
    fails = []
    for fp8 in (False, True):
        kv = pack_fp8_kv_ref(cache) if fp8 else cache.clone()
        kv[~used] = 0xFF if fp8 else float("nan")  # NaN data (and NaN scales) wherever no index points
        kv2 = kv[perm].to(device)
        kv, ic, ic2 = kv.to(device), idx.to(device), ex2.to(device)
        ro, rl = reference.sparse_attn(q, kv, ic, sink, HEAD_DIM**-0.5)
        for splits, extra, merge, pf in cases:
            out = torch.full_like(q, float("nan"))
            lse = torch.full((t, BLOCK_H), float("nan"), device=device)
            kw = dict(extra_kv=kv2, extra_indices=ic2) if extra else {}
            main = ic[:, :512].contiguous() if extra else ic
            sparse_attn_cuda(
                q,
                kv,
                main,
                sink,
                HEAD_DIM**-0.5,
                out=out,
                lse_out=lse,
                num_splits=splits,
                merge=merge,
                prefetch=pf,
                **kw,
            )
            if device != "cpu":
                torch.cuda.synchronize()
            why = mismatch(out, lse, ro, rl)
            if why is not None:
                fails.append(f"fp8={fp8} splits={splits} extra={extra} merge={merge} prefetch={pf}: {why}")
    return "; ".join(fails)


def probe(timeout_s: float = 180.0) -> tuple[bool, str]:
    """`self_check` in a child process (same sys.path): (passed, its output). A crash, a wrong result or a hang
    (killed after timeout_s) gives False; cached per process."""
    return _probe_cached(float(timeout_s))


@functools.cache
def _probe_cached(timeout_s: float) -> tuple[bool, str]:
    return run_probe(__name__, [], timeout_s, "the CUDA kernel")


if __name__ == "__main__":
    probe_main(available(), "no CUDA device or no _C", self_check)
