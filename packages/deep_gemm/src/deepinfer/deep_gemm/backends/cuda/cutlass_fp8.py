"""CUTLASS SM90 FP8 block-scaled GEMM for `fp8_gemm_nt` (compiled: csrc/cuda/cutlass/, module `deep_gemm._C`).

out[m, n] (bf16) = c + dequant(a, sfa) @ dequant(b, sfb)^T, the contract of `reference.fp8_gemm_nt`, computed by
CUTLASS's warp-specialised TMA + wgmma kernel with groupwise scaling (each 128-deep k block accumulated in the
tensor core, then promoted to fp32 with sfa[row, kb] * sfb[n/128, kb], as DeepGEMM does).

a: float8_e4m3fn [m, k]; sfa [m, k/128]; b: float8_e4m3fn [n, k]; sfb [ceil(n/128), k/128]; scales float32, or
float8_e8m0fnu expanded to float32 here first (exact: every E8M0 value is an fp32 value). out: bf16 [m, n];
c: optional bf16 [m, n] (may alias out). Requirements (`applies` / `check_cutlass_args`): CUDA, k % 128 == 0
(the kernel assumes whole scale blocks), n % 8 == 0 (16-byte output rows for TMA), contiguous operands with
16-byte aligned data pointers, sm_90 device, and an extension built with CUTLASS (`available()`).

Scale layout. Configs 2-4 read A's scales K-major, i.e. the API's [m, k/128] as is (float32 contiguous; e8m0 is
expanded to float32 first), by cp.async from the producer warp that loads B's scales anyway: no per-call transform.
Configs 0-1 load them by TMA, which needs them M-major: `sfa_mn_major` writes sfa^T into a [k/128, ceil(m/4)*4]
fp32 buffer (row stride padded to 16 bytes, padding zeroed). Cost: an allocation plus one small copy kernel (and a
zero-fill when m % 4 != 0) per call, measured at 2-3 us on the H200 (3-10 % of the call at m >= 4096 in round 1).
A caller that keeps its activation scales M-major can pass them with `sfa_is_mn_major=True` (contiguous fp32
[k/128, ld], ld >= m, ld % 4 == 0; columns >= m are ignored) to skip it (configs 2-4 then transpose back).
B's scales are read K-major as given (cp.async, one 4-byte load per 128x128 block).

Configs (csrc/cuda/cutlass/dg_cutlass_fp8.h, `CONFIGS`): 0/2 = 128x128x128 cooperative, cluster 1x2, stream-K
(k is split across CTAs when there are fewer tiles than SMs: small m); 3 = the same with cluster 2x1; 5 = the
same with cluster 2x2 (A and B multicast: less L2 traffic per FLOP; session 4: 0.67-1.28x config 2, never the
fastest); 1/4 = 64x128x128 ping-pong,
persistent. Runtime tile-scheduler knobs (no extra instantiation): raster (0 heuristic,
1 along M, 2 along N), swizzle (1/2/4/8), and for the stream-K configs decomposition (0 heuristic, 1 data-parallel,
2 split-K, 3 stream-K) with splits. `auto_config(m, n, k)` is the per-shape choice of the API's auto dispatch.
Launch cost: the host builds TMA descriptors per call (a few us of CPU; the GPU work is asynchronous). The
workspace (stream-K partial sums) comes from torch's caching allocator. Never syncs with the host.
"""

from __future__ import annotations

import functools
import types

import torch

from ..._backend import compiled_module

__all__ = [
    "available",
    "applies",
    "check_cutlass_args",
    "fp8_gemm_nt_cutlass",
    "sfa_mn_major",
    "CONFIGS",
    "default_config",
    "auto_config",
    "built_configs",
    "check_knobs",
    "AUTO_SFA_K_MAJOR",
]

CONFIGS = {
    0: "128x128x128 cooperative 1x2 stream-K, M-major A scales",
    1: "64x128x128 ping-pong 1x1 persistent, M-major A scales",
    2: "128x128x128 cooperative 1x2 stream-K, K-major A scales",
    3: "128x128x128 cooperative 2x1 stream-K, K-major A scales",
    4: "64x128x128 ping-pong 1x1 persistent, K-major A scales",
    5: "128x128x128 cooperative 2x2 stream-K, K-major A scales",
}
K_MAJOR_SFA = frozenset({2, 3, 4, 5})  # configs that read the API's [m, k/128] A scales as is
STREAM_K = frozenset({0, 2, 3, 5})  # configs whose scheduler takes decomposition / splits
# The auto dispatch's configs use K-major A scales (2 / 4: no per-call transpose): configs 2-4 passed
# tests/test_dg_fp8_cutlass.py on the H200 and measured as fast as 0 / 1 at large m and faster at m <= 128
# (pingpong_k 12.8 vs 15.0 us at 128 x 1024 x 4096, 2026-11-30); False restores the M-major configs 0 / 1.
AUTO_SFA_K_MAJOR = True
_PKG = __package__.rsplit(".backends", 1)[0]  # "deepinfer.deep_gemm"
_FP8 = torch.float8_e4m3fn
_E8M0 = torch.float8_e8m0fnu
_SCALES = (torch.float32, _E8M0)


@functools.cache
def _module() -> types.ModuleType | None:
    """`deepinfer.deep_gemm._C` when it imports and was built with CUTLASS, else None."""
    mod = compiled_module()
    return mod if mod is not None and getattr(mod, "has_cutlass_fp8", lambda: False)() else None


def available() -> bool:
    """True when the compiled CUTLASS FP8 GEMM is present (built with DEEPINFER_DEVICE=cuda and CUTLASS headers)."""
    return _module() is not None


@functools.cache
def _is_sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def auto_config(m: int, n: int, k: int) -> int | None:
    """The CUTLASS config the API's auto dispatch runs for an (m, n, k) problem, or None for the Triton kernel.

    From the H200 sweep of 2026-11-30 (`benchmarks/results/2026-11-30-s3-bench-deep_gemm-fp8_dense.json`, all five
    configs on the issue's shapes at m = 1 .. 16384): Triton wins small m with short k (6.4 vs 8.0 us at
    1 x 8192 x 1024: few k blocks, CUTLASS's prologue dominates); the 64x128 ping-pong kernel reading the A scales
    as given (4) wins m <= 256 otherwise (22.1 vs 27.5 us at 1 x 4096 x 8192, 12.8 vs 19.6 at 128 x 1024 x 4096) and
    mid m with narrow n or short k; the cooperative 128x128 kernels win large m, where the M-major one (0) is 6-9 %
    faster than the K-major one (2) on the biggest shapes (1062 vs 1128 us at 16384 x 4096 x 8192).
    """
    if not AUTO_SFA_K_MAJOR:  # the M-major configs only (0 / 1)
        if m <= 16:
            return None
        return (1 if k >= 4096 else None) if m <= 128 else 0
    if m <= 16:
        return 4 if k >= 4096 else None
    if m <= 256:
        return 4 if k >= 2048 or n >= 16384 else None
    if m < 4096:
        return 4 if n <= 1024 or k <= 1024 else 2
    return 0


def default_config(m: int, n: int, k: int = 4096) -> int:
    """The tile config `fp8_gemm_nt_cutlass` uses when none is given: `auto_config`, or for the shapes auto leaves
    to Triton the ping-pong kernel (small m)."""
    cfg = auto_config(m, n, k)
    if cfg is None:
        cfg = 4 if AUTO_SFA_K_MAJOR else 1
    return cfg


def built_configs() -> int:
    """How many configs the loaded `_C` has (a `_C` built before configs 2-4 existed has 2); 0 without `_C`."""
    mod = _module()
    return 0 if mod is None else int(getattr(mod, "cutlass_fp8_configs", 2))


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


def applies(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, c: torch.Tensor | None) -> bool:
    """True when `fp8_gemm_nt_cutlass` can run this already-validated `fp8_gemm_nt` call (no host sync)."""
    if not (a.is_cuda and b.dtype == _FP8 and out.dtype == torch.bfloat16):
        return False
    if c is not None and (c.dtype != torch.bfloat16 or not _aligned(c) or not c.is_contiguous()):
        return False
    if not out.is_contiguous():
        return False
    m, k = a.shape
    n = b.shape[0]
    if k == 0 or k % 128 or n % 8 or not (_aligned(a) and _aligned(b) and _aligned(out)):
        return False
    return available() and _is_sm90(a.device.index if a.device.index is not None else torch.cuda.current_device())


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def check_cutlass_args(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, c: torch.Tensor | None
) -> None:
    """Raise TypeError/ValueError (argument, expected, got) unless the CUTLASS kernel can take these operands.

    Checks metadata only (no device sync). sfa is the API's [m, k/128] (K-major) layout.
    """
    for name, t, dt in (("a", a, _FP8), ("b", b, _FP8), ("out", out, torch.bfloat16)):
        if t.dtype != dt:
            raise TypeError(f"{name}: expected dtype {dt}, got {t.dtype}")
        _require(t.dim() == 2 and t.is_contiguous(), f"{name}: expected a contiguous 2-D tensor, got {tuple(t.shape)}")
        _require(_aligned(t), f"{name}: expected a 16-byte aligned data pointer, got {t.data_ptr():#x}")
    (m, k), n = a.shape, b.shape[0]
    _require(b.shape[1] == k, f"b: expected [n, {k}] (k of a), got {tuple(b.shape)}")
    _require(k > 0 and k % 128 == 0, f"k: expected a positive multiple of 128, got {k}")
    _require(n % 8 == 0, f"n: expected a multiple of 8 (16-byte bf16 output rows), got {n}")
    _require(tuple(out.shape) == (m, n), f"out: expected shape {(m, n)}, got {tuple(out.shape)}")
    for name, t, shape in (("sfa", sfa, (m, k // 128)), ("sfb", sfb, (-(-n // 128), k // 128))):
        if t.dtype not in _SCALES:
            raise TypeError(f"{name}: expected dtype float32 or float8_e8m0fnu, got {t.dtype}")
        _require(tuple(t.shape) == shape, f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    _require(sfb.is_contiguous(), f"sfb: expected a contiguous tensor, got strides {sfb.stride()}")
    if c is not None:
        if c.dtype != torch.bfloat16:
            raise TypeError(f"c: expected dtype torch.bfloat16 (float32 C runs the Triton kernel), got {c.dtype}")
        _require(tuple(c.shape) == (m, n) and c.is_contiguous(), f"c: expected contiguous [{m}, {n}], got {c.shape}")
        _require(_aligned(c), f"c: expected a 16-byte aligned data pointer, got {c.data_ptr():#x}")
    devices = {t.device for t in (a, sfa, b, sfb, out) + ((c,) if c is not None else ())}
    _require(len(devices) == 1, f"operands: expected one device, got {sorted(str(d) for d in devices)}")


def sfa_mn_major(sfa: torch.Tensor) -> torch.Tensor:
    """[m, kb] scales (float32 or e8m0, any strides) -> float32 [kb, ld] with ld = ceil(m/4)*4, [:, :m] = sfa^T.

    The kernel's scale tensor has M extent ld (CUTLASS's can_implement wants a multiple of 4); the padding columns
    only scale accumulator rows >= m, which are never stored, and are zeroed so they cannot even hold NaN.
    """
    m, kb = sfa.shape
    ld = -(-m // 4) * 4
    t = torch.empty((kb, ld), dtype=torch.float32, device=sfa.device)
    t[:, :m].copy_(sfa.t())  # e8m0 -> fp32 is exact
    if ld > m:
        t[:, m:].zero_()
    return t


def _check_mn_major_sfa(sfa: torch.Tensor, m: int, k: int) -> None:
    """An M-major A-scale buffer as the kernel reads it: contiguous float32 [k/128, ld], ld >= m, ld % 4 == 0."""
    if sfa.dtype != torch.float32:
        raise TypeError(f"sfa (M-major): expected dtype torch.float32, got {sfa.dtype}")
    ok = sfa.dim() == 2 and sfa.shape[0] == k // 128 and sfa.shape[1] >= m and sfa.shape[1] % 4 == 0
    _require(ok and sfa.is_contiguous(), f"sfa (M-major): expected contiguous [{k // 128}, ld >= {m}, ld % 4 == 0], "
             f"got {tuple(sfa.shape)} strides {sfa.stride()}")  # fmt: skip
    _require(_aligned(sfa), f"sfa (M-major): expected a 16-byte aligned data pointer, got {sfa.data_ptr():#x}")


@functools.lru_cache(maxsize=512)
def _workspace_bytes(config: int, m: int, n: int, k: int, device_index: int, knobs: tuple[int, ...]) -> int:
    del device_index  # part of the key: stream-K sizing depends on the device's SM count
    extra = dict(zip(_KNOBS, knobs)) if knobs != _DEFAULT_KNOBS else {}  # a round-1 _C takes no knobs
    return int(_module().cutlass_fp8_workspace_size(config, m, n, k, **extra))


_KNOBS = ("raster", "swizzle", "decomposition", "splits")
_DEFAULT_KNOBS = (0, 1, 0, 1)


def check_knobs(config: int, raster: int, swizzle: int, decomposition: int, splits: int, built: int) -> None:
    """Raise ValueError (argument, expected, got) unless `config` (of `built` compiled ones) takes these knobs."""
    if config not in CONFIGS or config >= built:
        raise ValueError(f"config: expected one of {list(range(min(built, len(CONFIGS))))} (built), got {config}")
    if raster not in (0, 1, 2):
        raise ValueError(f"raster: expected 0 (heuristic), 1 (along M) or 2 (along N), got {raster}")
    if swizzle not in (1, 2, 4, 8):
        raise ValueError(f"swizzle: expected 1, 2, 4 or 8, got {swizzle}")
    if decomposition not in (0, 1, 2, 3) or not 1 <= splits <= 64:
        raise ValueError(f"decomposition/splits: expected 0..3 and 1..64, got {decomposition}/{splits}")
    if (decomposition, splits) != (0, 1) and config not in STREAM_K:
        raise ValueError(
            f"decomposition/splits: config {config} has no stream-K scheduler, got {decomposition}/{splits}"
        )


def _scales_for(config: int, sfa: torch.Tensor, m: int, sfa_is_mn_major: bool) -> torch.Tensor:
    """The A-scale buffer config `config` reads: K-major fp32 [m, k/128] or M-major fp32 [k/128, ld]."""
    if config in K_MAJOR_SFA:
        sfa_k = sfa[:, :m].t() if sfa_is_mn_major else sfa
        return sfa_k.to(torch.float32).contiguous()  # no copy when already fp32 contiguous (the API's layout)
    return sfa if sfa_is_mn_major else sfa_mn_major(sfa)


def fp8_gemm_nt_cutlass(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    out: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    config: int | None = None,
    sfa_is_mn_major: bool = False,
    raster: int = 0,
    swizzle: int = 1,
    decomposition: int = 0,
    splits: int = 1,
) -> torch.Tensor:
    """out = c + dequant(a, sfa) @ dequant(b, sfb)^T through CUTLASS; see the module docstring for shapes.

    a [m, k] e4m3, sfa [m, k/128] (or [k/128, ld] fp32 with sfa_is_mn_major), b [n, k] e4m3,
    sfb [ceil(n/128), k/128], out bf16 [m, n], c optional bf16 [m, n]. config None -> `default_config(m, n, k)`;
    raster / swizzle / decomposition / splits: the tile scheduler's runtime knobs (module docstring). Returns out.
    """
    mod = _module()
    if mod is None:
        raise RuntimeError("deep_gemm._C was not built with CUTLASS (DEEPINFER_DEVICE=cuda and CUTLASS_INCLUDE_DIR)")
    m, k = a.shape
    n = b.shape[0]
    if sfa_is_mn_major:
        _check_mn_major_sfa(sfa, m, k)
        check_cutlass_args(a, sfa.t()[:m], b, sfb, out, c)  # the [m, k/128] view: same checks as the API layout
    else:
        check_cutlass_args(a, sfa, b, sfb, out, c)
    cfg = default_config(m, n, k) if config is None else config
    check_knobs(cfg, raster, swizzle, decomposition, splits, built_configs())
    if m == 0 or n == 0:
        return out
    sfa_k = _scales_for(cfg, sfa, m, sfa_is_mn_major)
    sfb32 = sfb if sfb.dtype == torch.float32 else sfb.float()
    src = c if c is not None else out  # beta = 0: C is never read, but CUTLASS wants a valid pointer
    knobs = (raster, swizzle, decomposition, splits)
    extra = dict(zip(_KNOBS, knobs)) if knobs != _DEFAULT_KNOBS else {}
    sfa_ld = sfa_k.shape[1] if cfg not in K_MAJOR_SFA else -(-m // 4) * 4  # ignored by the K-major configs
    with torch.cuda.device(a.device):  # CUTLASS queries the current device (SM count) and launches on it
        nbytes = _workspace_bytes(cfg, m, n, k, torch.cuda.current_device(), knobs)
        ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=a.device)
        stream = torch.cuda.current_stream(a.device).cuda_stream
        mod.cutlass_fp8_gemm(
            cfg, a.data_ptr(), sfa_k.data_ptr(), b.data_ptr(), sfb32.data_ptr(), src.data_ptr(), out.data_ptr(),
            m, n, k, sfa_ld, 1.0 if c is not None else 0.0, ws.data_ptr(), stream, **extra,
        )  # fmt: skip
    return out
