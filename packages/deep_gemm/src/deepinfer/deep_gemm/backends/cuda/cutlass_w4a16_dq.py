"""W4A16 grouped GEMM by "dequantise a chunk of experts to bf16, then CUTLASS's SM90 grouped bf16 GEMM".

Compiled: csrc/cuda/cutlass/w4a16_dq_*.cu (contract in dg_cutlass_w4a16.h). Opt-in, not a default: the API runs it
only with DEEPINFER_DG_W4A16_IMPL=cutlass_dq at >= `MIN_ROWS` rows per expert (api_w4a16). Prepared in session 5 for
the compute-bound regime (>= 64 tokens per expert), NOT yet GPU-run.

Why not CUTLASS's mixed-input collective (bf16 x e2m1 with the scales applied in the mainloop): it takes one scale
per row per k tile and its k tile is >= 64 for bf16 (sm90_mma_array_tma_gmma_rs_warpspecialized_mixed_input.hpp
lines 239 / 599 / 949, see w4a16_dq_kernel.cuh), so per-32 scales cannot be expressed. This path keeps the
checkpoint format (packed e2m1 + E8M0 bytes, nothing converted at load time) and pays per call: read the FP4
weights of the non-empty experts, write them as bf16 (4x the bytes) and read them again in the GEMM.

Per call, all on the current stream (no host sync, CUDA-graph safe): for each chunk of `chunk` experts, a
dequantiser (one thread per 32 weights; empty experts skipped, from `offs` on the device), a setup kernel (problem
rows from `offs`, clamped to [0, m]) and CUTLASS's ptr-array grouped GEMM (fp32 accumulation). Scratch: bf16
[chunk, n, k] from the caching allocator; `chunk` defaults to as many experts as fit in `SCRATCH_BYTES`.

a: bf16 [m, k]; packed: uint8 / int8 [g, n, k/2] (low nibble = element 2j); scales: uint8 / float8_e8m0fnu
[g, n, k/32]; offs: int32 [g] cumulative end rows; out: bf16 [m, n]. Requirements: CUDA sm_90a, k % 128 == 0,
n % 16 == 0, contiguous 16-byte aligned operands, `_C` built with CUTLASS.
Configs (`CONFIGS`, index = `config=`): 0 128x256x64 cooperative; 1 64x256x64 ping-pong (both cluster 1x1).
"""

from __future__ import annotations

import functools
import os

import torch

from . import cutlass_fp8 as _dense

__all__ = [
    "CONFIGS",
    "MIN_ROWS",
    "SCRATCH_BYTES",
    "auto_config",
    "available",
    "check_args",
    "chunk_experts",
    "m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq",
]

CONFIGS = {0: "coop", 1: "pingpong"}
# Rows per expert from which the API's `cutlass_dq` impl takes this path (below it: the `auto` choice).
MIN_ROWS = 64
# Config by rows per expert ((max rows, config), ...; else 0): 64-row ping-pong tiles where a 128-row tile would be
# half empty. A guess (not GPU-run): the benchmark times both configs at 64 / 256 / 1024 rows per expert.
AUTO_CONFIG_BY_ROWS: tuple[tuple[int, int], ...] = ((64, 1),)
# Bytes of bf16 scratch per call (chunk = experts that fit, at least 1); env DEEPINFER_DG_W4A16_DQ_BYTES overrides.
SCRATCH_BYTES = 1 << 30
SCRATCH_ENV = "DEEPINFER_DG_W4A16_DQ_BYTES"
_PACKED = (torch.uint8, torch.int8)
_SCALES = (torch.uint8, torch.float8_e8m0fnu)


def available() -> bool:
    """True when `_C` has this kernel (a CUTLASS build of this source tree)."""
    mod = _dense._module()
    return mod is not None and getattr(mod, "has_cutlass_w4a16_dq", lambda: False)()


def auto_config(rows_per_group: int) -> int:
    """The config for about `rows_per_group` rows per expert (`AUTO_CONFIG_BY_ROWS`)."""
    for bound, cfg in AUTO_CONFIG_BY_ROWS:
        if rows_per_group <= bound:
            return cfg
    return 0


def _scratch_bytes() -> int:
    raw = os.environ.get(SCRATCH_ENV, "").strip()
    if not raw:
        return SCRATCH_BYTES
    if not raw.isdigit() or int(raw) <= 0:
        raise ValueError(f"{SCRATCH_ENV}: expected a positive integer (bytes), got {raw!r}")
    return int(raw)


def chunk_experts(g: int, n: int, k: int, chunk: int | None = None) -> int:
    """Experts dequantised per chunk: `chunk` if given (1..g), else as many [n, k] bf16 weights as fit in the
    scratch budget (`SCRATCH_BYTES` / env), at least 1, at most g (and 65535, the dequantiser's grid.y)."""
    if chunk is not None:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= max(g, 1):
            raise ValueError(f"chunk: expected an int in 1..{max(g, 1)} (experts per chunk), got {chunk!r}")
        return min(chunk, 65535)
    per_expert = max(2 * n * k, 1)
    return max(1, min(g, _scratch_bytes() // per_expert, 65535))


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def check_args(
    a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor, out: torch.Tensor
) -> tuple[int, int, int, int]:
    """Raise TypeError / ValueError (argument, expected, got) unless the kernel takes these; returns (m, g, n, k).
    Metadata only (dtypes, shapes, contiguity, alignment, device): no device values are read."""
    for name, t, dtypes, dim in (
        ("a", a, (torch.bfloat16,), 2), ("packed", packed, _PACKED, 3), ("scales", scales, _SCALES, 3),
        ("offs", offs, (torch.int32,), 1), ("out", out, (torch.bfloat16,), 2),
    ):  # fmt: skip
        if t.dtype not in dtypes:
            raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
        _require(t.dim() == dim and t.is_contiguous(), f"{name}: expected a contiguous {dim}-D tensor, got "
                 f"{tuple(t.shape)}")  # fmt: skip
        _require(t.data_ptr() % 16 == 0 or name == "offs" or t.numel() == 0,
                 f"{name}: expected a 16-byte aligned data pointer, got {t.data_ptr():#x}")  # fmt: skip
    (m, k), (g, n, kb) = a.shape, packed.shape
    _require(2 * kb == k, f"packed: expected [g, n, {k // 2}] (k of a / 2), got {tuple(packed.shape)}")
    _require(k > 0 and k % 128 == 0, f"k: expected a positive multiple of 128, got {k}")
    _require(n % 16 == 0, f"n: expected a multiple of 16, got {n}")
    _require(tuple(scales.shape) == (g, n, k // 32), f"scales: expected shape {(g, n, k // 32)}, got "
             f"{tuple(scales.shape)}")  # fmt: skip
    _require(tuple(offs.shape) == (g,), f"offs: expected shape ({g},), got {tuple(offs.shape)}")
    _require(tuple(out.shape) == (m, n), f"out: expected shape {(m, n)}, got {tuple(out.shape)}")
    devices = {t.device for t in (a, packed, scales, offs, out)}
    _require(len(devices) == 1, f"operands: expected one device, got {sorted(str(d) for d in devices)}")
    return m, g, n, k


@functools.lru_cache(maxsize=256)
def _buffer_bytes(config: int, chunk: int, device_index: int) -> tuple[int, int]:
    """(aux, workspace) bytes; aux rounded up to 256 so the workspace that follows it stays aligned."""
    del device_index  # part of the key: the workspace size follows the device's SM count
    mod = _dense._module()
    aux = -(-int(mod.cutlass_w4a16_dq_aux_bytes(config, chunk)) // 256) * 256
    return aux, int(mod.cutlass_w4a16_dq_workspace_size(config, chunk))


def _check_knobs(config: int, raster: int, swizzle: int) -> None:
    if config not in CONFIGS:
        raise ValueError(f"config: expected one of {sorted(CONFIGS)}, got {config!r}")
    if raster not in (0, 1, 2):
        raise ValueError(f"raster: expected 0 (along M), 1 (along M) or 2 (along N), got {raster}")
    if swizzle not in (1, 2, 4, 8):
        raise ValueError(f"swizzle: expected 1, 2, 4 or 8, got {swizzle}")


def m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq(
    a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor, out: torch.Tensor,
    *, config: int | None = None, chunk: int | None = None, expected_m: int | None = None, raster: int = 0,
    swizzle: int = 1,
) -> torch.Tensor:  # fmt: skip
    """out[r] = a[r] @ dequant(packed[e], scales[e])^T for the rows r of expert e (module docstring). config None:
    `auto_config(expected_m or ceil(m / g))`; chunk None: `chunk_experts`. Returns out. Never syncs with the host."""
    if not available():
        raise RuntimeError("deep_gemm._C was not built with the CUTLASS W4A16 dq GEMM (DEEPINFER_DEVICE=cuda and "
                           "CUTLASS_INCLUDE_DIR)")  # fmt: skip
    m, g, n, k = check_args(a, packed, scales, offs, out)
    rows = expected_m if expected_m is not None else -(-m // max(g, 1))
    cfg = auto_config(rows) if config is None else config
    _check_knobs(cfg, raster, swizzle)
    c = chunk_experts(g, n, k, chunk)
    if m == 0 or n == 0 or g == 0:
        return out
    with torch.cuda.device(a.device):
        aux, ws = _buffer_bytes(cfg, c, torch.cuda.current_device())
        buf = torch.empty(aux + max(ws, 1), dtype=torch.uint8, device=a.device)
        scratch = torch.empty((c, n, k), dtype=torch.bfloat16, device=a.device)
        stream = torch.cuda.current_stream(a.device).cuda_stream
        _dense._module().cutlass_w4a16_dq_gemm(
            a.data_ptr(), packed.data_ptr(), scales.data_ptr(), offs.data_ptr(), out.data_ptr(), m, n, k, g, c,
            scratch.data_ptr(), buf.data_ptr(), buf.data_ptr() + aux, stream, cfg, raster, swizzle,
        )  # fmt: skip
    return out
