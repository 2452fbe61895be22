"""CUTLASS SM90 M-grouped FP8 GEMM, contiguous and masked layouts (compiled: csrc/cuda/cutlass/fp8_grouped_*.cu).

* contiguous (DeepGEMM `m_grouped_fp8_gemm_nt_contiguous`): out[i] = dequant(a[i], sfa[i]) @ dequant(b[e], sfb[e])^T
  with e = m_indices[i]; rows with id -1 (padding) or an id >= g are zeroed. Each expert's rows must be contiguous
  (DeepGEMM / DeepEP's layout: rows sorted by expert, padding anywhere between experts); an expert whose rows form
  several runs is not computed and its rows are written NaN (loud, instead of silently wrong).
* masked (DeepGEMM `m_grouped_fp8_gemm_nt_masked`, DeepEP low-latency layout): a [g, m_max, k]; expert e's rows
  i < masked_m[e] (clamped to [0, m_max]) computed, the other rows of out untouched.

CUTLASS's ptr-array grouped kernel with groupwise scaling; per-expert problem shapes and pointers are built on the
device from m_indices / masked_m (a scan and / or a setup kernel before the GEMM: no host sync, CUDA-graph safe).
Configs (`CONFIGS`, index = `config=`): 0 128x128x128 cooperative cluster 1x2; 1 the same, cluster 2x1 (B multicast
across two M tiles of one expert); 2 64x128x128 ping-pong 1x1; 3 128x128x128 cooperative 1x1; 4 the same,
cluster 2x2 (A and B multicast). Runtime knobs:
raster (0/1 along M, 2 along N) and swizzle (1, 2, 4, 8).

a: float8_e4m3fn [M, k] (masked: [g, m_max, k]); sfa [M, k/128] (masked: [g, m_max, k/128]); b: float8_e4m3fn
[g, n, k]; sfb [g, ceil(n/128), k/128]; scales float32, or float8_e8m0fnu expanded to float32 here (exact);
out: bf16 [M, n] (masked: [g, m_max, n]). Ids / counts are not validated (that would sync with the host).
Requirements: CUDA sm_90a, k % 128 == 0, n % 8 == 0, contiguous 16-byte aligned operands, `_C` built with CUTLASS.
"""

from __future__ import annotations

import functools

import torch

from . import cutlass_fp8 as _dense

__all__ = [
    "CONFIGS",
    "DEFAULT_CONFIG",
    "auto_config",
    "available",
    "built_configs",
    "check_grouped_args",
    "check_masked_args",
    "m_grouped_fp8_gemm_nt_contiguous_cutlass",
    "m_grouped_fp8_gemm_nt_masked_cutlass",
]

_FP8 = torch.float8_e4m3fn
_SCALES = (torch.float32, torch.float8_e8m0fnu)
CONFIGS = {0: "coop", 1: "coop_2x1", 2: "pingpong", 3: "coop_1x1", 4: "coop_2x2"}
# The config the API runs (`auto_config`), by rows per expert: first entry whose bound holds. H200 sweep (session 4,
# 256 experts, gate+up / down): ping-pong fastest at 8 and 64 rows per expert (1.14-1.17x / 1.13-2.6x the Triton
# kernel), the 2x1-cluster cooperative kernel at 256 (866 / 809 TFLOPS) and within 0.5 % of the best at 1024.
DEFAULT_CONFIG = 1
# ((max rows per expert, config), ...), else DEFAULT_CONFIG
AUTO_CONFIG_BY_ROWS: tuple[tuple[int, int], ...] = ((128, 2),)


def available() -> bool:
    """True when `_C` has this grouped kernel (a CUTLASS build of this source tree, with the config table)."""
    mod = _dense._module()
    return (
        mod is not None
        and getattr(mod, "has_cutlass_fp8_grouped", lambda: False)()
        and hasattr(mod, "cutlass_fp8_grouped_configs")
    )


def built_configs() -> int:
    """Number of grouped configs `_C` was built with (0 when unavailable)."""
    return int(_dense._module().cutlass_fp8_grouped_configs) if available() else 0


def auto_config(rows_per_group: int) -> int:
    """The config the API runs for about `rows_per_group` rows per expert (`AUTO_CONFIG_BY_ROWS`)."""
    for bound, cfg in AUTO_CONFIG_BY_ROWS:
        if rows_per_group <= bound:
            return cfg
    return DEFAULT_CONFIG


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def _check_common(a, sfa, b, sfb, out, lead: tuple[int, ...]) -> tuple[int, int, int]:
    """Dtypes, shapes, contiguity, alignment and device of both layouts; returns (g, n, k)."""
    nd = len(lead) + 1
    for name, t, dt, dim in (("a", a, _FP8, nd), ("b", b, _FP8, 3), ("out", out, torch.bfloat16, nd)):
        if t.dtype != dt:
            raise TypeError(f"{name}: expected dtype {dt}, got {t.dtype}")
        _require(t.dim() == dim and t.is_contiguous(), f"{name}: expected a contiguous {dim}-D tensor, got "
                 f"{tuple(t.shape)}")  # fmt: skip
        _require(t.data_ptr() % 16 == 0, f"{name}: expected a 16-byte aligned data pointer, got {t.data_ptr():#x}")
    k, (g, n) = a.shape[-1], b.shape[:2]
    _require(tuple(a.shape[:-1]) == lead, f"a: expected leading dims {lead}, got {tuple(a.shape)}")
    _require(b.shape[2] == k, f"b: expected [g, n, {k}] (k of a), got {tuple(b.shape)}")
    _require(k > 0 and k % 128 == 0, f"k: expected a positive multiple of 128, got {k}")
    _require(n % 8 == 0, f"n: expected a multiple of 8 (16-byte bf16 output rows), got {n}")
    _require(tuple(out.shape) == (*lead, n), f"out: expected shape {(*lead, n)}, got {tuple(out.shape)}")
    for name, t, shape in (("sfa", sfa, (*lead, k // 128)), ("sfb", sfb, (g, -(-n // 128), k // 128))):
        if t.dtype not in _SCALES:
            raise TypeError(f"{name}: expected dtype float32 or float8_e8m0fnu, got {t.dtype}")
        _require(tuple(t.shape) == shape, f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    return g, n, k


def _check_ids(name: str, t: torch.Tensor, shape: tuple[int, ...], others: tuple[torch.Tensor, ...]) -> None:
    if t.dtype != torch.int32:
        raise TypeError(f"{name}: expected dtype torch.int32, got {t.dtype}")
    _require(tuple(t.shape) == shape and t.is_contiguous(), f"{name}: expected contiguous {list(shape)}, got "
             f"{tuple(t.shape)}")  # fmt: skip
    devices = {x.device for x in (*others, t)}
    _require(len(devices) == 1, f"operands: expected one device, got {sorted(str(d) for d in devices)}")


def check_grouped_args(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, m_indices: torch.Tensor
) -> None:
    """Contiguous layout: raise TypeError/ValueError (argument, expected, got) unless the kernel takes these."""
    _require(a.dim() == 2, f"a: expected a contiguous 2-D tensor, got {tuple(a.shape)}")
    _check_common(a, sfa, b, sfb, out, (a.shape[0],))
    _check_ids("m_indices", m_indices, (a.shape[0],), (a, sfa, b, sfb, out))


def check_masked_args(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, masked_m: torch.Tensor
) -> None:
    """Masked layout: raise TypeError/ValueError (argument, expected, got) unless the kernel takes these."""
    _require(a.dim() == 3, f"a: expected a contiguous 3-D tensor [g, m_max, k], got {tuple(a.shape)}")
    g, _, _ = _check_common(a, sfa, b, sfb, out, tuple(a.shape[:2]))
    _require(a.shape[0] == g, f"a: expected {g} groups (b's), got {a.shape[0]}")
    _check_ids("masked_m", masked_m, (g,), (a, sfa, b, sfb, out))


@functools.lru_cache(maxsize=256)
def _buffer_bytes(config: int, groups: int, device_index: int) -> tuple[int, int]:
    """(aux, workspace) bytes; aux rounded up to 256 so the workspace that follows it stays aligned."""
    del device_index  # part of the key: the workspace size follows the device's SM count
    mod = _dense._module()
    aux = -(-int(mod.cutlass_fp8_grouped_aux_bytes(config, groups)) // 256) * 256
    return aux, int(mod.cutlass_fp8_grouped_workspace_size(config, groups))


def _check_config(config: int, raster: int, swizzle: int) -> None:
    built = built_configs()
    if not 0 <= config < built:
        raise ValueError(f"config: expected 0..{built - 1} (built grouped configs), got {config}")
    if raster not in (0, 1, 2):
        raise ValueError(f"raster: expected 0 (along M), 1 (along M) or 2 (along N), got {raster}")
    if swizzle not in (1, 2, 4, 8):
        raise ValueError(f"swizzle: expected 1, 2, 4 or 8, got {swizzle}")


def _launch(a, sfa, b, sfb, out, ids, rows: int, masked: int, m_max: int, config: int, raster: int, swizzle: int):
    """Allocate aux + workspace (caching allocator: graph-safe) and launch on the current stream."""
    g, n, k = b.shape
    sfa32 = sfa.to(torch.float32).contiguous()
    sfb32 = sfb.to(torch.float32).contiguous()
    with torch.cuda.device(a.device):
        aux, ws = _buffer_bytes(config, g, torch.cuda.current_device())
        buf = torch.empty(aux + max(ws, 1), dtype=torch.uint8, device=a.device)
        stream = torch.cuda.current_stream(a.device).cuda_stream
        _dense._module().cutlass_fp8_grouped_gemm(
            a.data_ptr(), sfa32.data_ptr(), b.data_ptr(), sfb32.data_ptr(), out.data_ptr(), ids.data_ptr(),
            rows, n, k, g, buf.data_ptr(), buf.data_ptr() + aux, stream, masked, m_max, config, raster, swizzle,
        )  # fmt: skip


def _need_kernel() -> None:
    if not available():
        raise RuntimeError("deep_gemm._C was not built with the CUTLASS grouped FP8 GEMM (DEEPINFER_DEVICE=cuda and "
                           "CUTLASS_INCLUDE_DIR)")  # fmt: skip


def m_grouped_fp8_gemm_nt_contiguous_cutlass(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, m_indices: torch.Tensor,
    *, config: int | None = None, raster: int = 0, swizzle: int = 1,
) -> torch.Tensor:  # fmt: skip
    """out[i] = dequant(a[i]) @ dequant(b[m_indices[i]])^T, rows with id -1 zeroed; shapes in the module docstring.
    config None: `auto_config(rows / g)`. Returns out. Never syncs with the host."""
    _need_kernel()
    check_grouped_args(a, sfa, b, sfb, out, m_indices)
    rows, g = a.shape[0], b.shape[0]
    cfg = auto_config(rows // max(g, 1)) if config is None else config
    _check_config(cfg, raster, swizzle)
    if rows == 0 or b.shape[1] == 0 or g == 0:
        return out
    _launch(a, sfa, b, sfb, out, m_indices, rows, 0, 0, cfg, raster, swizzle)
    return out


def m_grouped_fp8_gemm_nt_masked_cutlass(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, masked_m: torch.Tensor,
    expected_m: int | None = None, *, config: int | None = None, raster: int = 0, swizzle: int = 1,
) -> torch.Tensor:  # fmt: skip
    """Per expert e, rows i < masked_m[e]: out[e, i] = dequant(a[e, i]) @ dequant(b[e])^T; other rows untouched.
    config None: `auto_config(expected_m or m_max)`. Returns out. Never syncs with the host."""
    _need_kernel()
    check_masked_args(a, sfa, b, sfb, out, masked_m)
    g, m_max = a.shape[:2]
    cfg = auto_config(expected_m or m_max) if config is None else config
    _check_config(cfg, raster, swizzle)
    if g == 0 or m_max == 0 or b.shape[1] == 0:
        return out
    _launch(a, sfa, b, sfb, out, masked_m, g * m_max, 1, m_max, cfg, raster, swizzle)
    return out
