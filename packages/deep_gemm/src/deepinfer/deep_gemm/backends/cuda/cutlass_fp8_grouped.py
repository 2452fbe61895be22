"""CUTLASS SM90 M-grouped contiguous FP8 GEMM (compiled: csrc/cuda/cutlass/fp8_grouped_contiguous.cu, `_C`).

out[i] = dequant(a[i], sfa[i]) @ dequant(b[e], sfb[e])^T with e = m_indices[i]; rows with m_indices -1 are zeroed.
DeepGEMM's `m_grouped_fp8_gemm_nt_contiguous` layout: rows sorted by expert, each expert's valid rows contiguous
(its 128-row aligned block ends with -1 padding rows). CUTLASS's ptr-array grouped kernel with groupwise scaling
(128x128x128 cooperative, cluster 1x2); the per-expert problem shapes are derived on the device from m_indices (a
scan and a setup kernel before the GEMM: no host sync, CUDA-graph safe).

a: float8_e4m3fn [M, k]; sfa [M, k/128]; b: float8_e4m3fn [g, n, k]; sfb [g, ceil(n/128), k/128]; scales float32,
or float8_e8m0fnu expanded to float32 here (exact); out: bf16 [M, n]; m_indices: int32 [M] in [-1, g-1] (values
not checked, like DeepGEMM). Requirements: CUDA sm_90, k % 128 == 0, n % 8 == 0, contiguous 16-byte aligned
operands, `_C` built with CUTLASS. NOT wired into the API yet (not yet run on a GPU): the benchmark and the GPU
tests call it directly.
"""

from __future__ import annotations

import functools

import torch

from . import cutlass_fp8 as _dense

__all__ = ["available", "check_grouped_args", "m_grouped_fp8_gemm_nt_contiguous_cutlass"]

_FP8 = torch.float8_e4m3fn
_SCALES = (torch.float32, torch.float8_e8m0fnu)


def available() -> bool:
    """True when `_C` has the grouped kernel (CUTLASS build of this source tree)."""
    mod = _dense._module()
    return mod is not None and getattr(mod, "has_cutlass_fp8_grouped", lambda: False)()


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def check_grouped_args(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, m_indices: torch.Tensor
) -> None:
    """Raise TypeError/ValueError (argument, expected, got) unless the grouped kernel can take these operands."""
    for name, t, dt, dim in (("a", a, _FP8, 2), ("b", b, _FP8, 3), ("out", out, torch.bfloat16, 2)):
        if t.dtype != dt:
            raise TypeError(f"{name}: expected dtype {dt}, got {t.dtype}")
        _require(t.dim() == dim and t.is_contiguous(), f"{name}: expected a contiguous {dim}-D tensor, got "
                 f"{tuple(t.shape)}")  # fmt: skip
        _require(t.data_ptr() % 16 == 0, f"{name}: expected a 16-byte aligned data pointer, got {t.data_ptr():#x}")
    (rows, k), (g, n) = a.shape, b.shape[:2]
    _require(b.shape[2] == k, f"b: expected [g, n, {k}] (k of a), got {tuple(b.shape)}")
    _require(k > 0 and k % 128 == 0, f"k: expected a positive multiple of 128, got {k}")
    _require(n % 8 == 0, f"n: expected a multiple of 8 (16-byte bf16 output rows), got {n}")
    _require(tuple(out.shape) == (rows, n), f"out: expected shape {(rows, n)}, got {tuple(out.shape)}")
    for name, t, shape in (("sfa", sfa, (rows, k // 128)), ("sfb", sfb, (g, -(-n // 128), k // 128))):
        if t.dtype not in _SCALES:
            raise TypeError(f"{name}: expected dtype float32 or float8_e8m0fnu, got {t.dtype}")
        _require(tuple(t.shape) == shape, f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    if m_indices.dtype != torch.int32:
        raise TypeError(f"m_indices: expected dtype torch.int32, got {m_indices.dtype}")
    _require(tuple(m_indices.shape) == (rows,) and m_indices.is_contiguous(),
             f"m_indices: expected contiguous [{rows}], got {tuple(m_indices.shape)}")  # fmt: skip
    devices = {t.device for t in (a, sfa, b, sfb, out, m_indices)}
    _require(len(devices) == 1, f"operands: expected one device, got {sorted(str(d) for d in devices)}")


@functools.lru_cache(maxsize=64)
def _buffer_bytes(groups: int, device_index: int) -> tuple[int, int]:
    """(aux, workspace) bytes; aux rounded up to 256 so the workspace that follows it stays aligned."""
    del device_index  # part of the key: the workspace holds per-SM tensor maps
    mod = _dense._module()
    aux = -(-int(mod.cutlass_fp8_grouped_aux_bytes(groups)) // 256) * 256
    return aux, int(mod.cutlass_fp8_grouped_workspace_size(groups))


def m_grouped_fp8_gemm_nt_contiguous_cutlass(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor, m_indices: torch.Tensor
) -> torch.Tensor:
    """out[i] = dequant(a[i]) @ dequant(b[m_indices[i]])^T, rows with id -1 zeroed; shapes in the module docstring.
    Returns out. Never syncs with the host."""
    if not available():
        raise RuntimeError("deep_gemm._C was not built with the CUTLASS grouped FP8 GEMM (DEEPINFER_DEVICE=cuda and "
                           "CUTLASS_INCLUDE_DIR)")  # fmt: skip
    check_grouped_args(a, sfa, b, sfb, out, m_indices)
    (rows, k), (g, n) = a.shape, b.shape[:2]
    if rows == 0 or n == 0:
        return out
    sfa32 = sfa.to(torch.float32).contiguous()
    sfb32 = sfb.to(torch.float32).contiguous()
    with torch.cuda.device(a.device):
        aux, ws = _buffer_bytes(g, torch.cuda.current_device())
        buf = torch.empty(aux + max(ws, 1), dtype=torch.uint8, device=a.device)
        stream = torch.cuda.current_stream(a.device).cuda_stream
        _dense._module().cutlass_fp8_grouped_gemm(
            a.data_ptr(), sfa32.data_ptr(), b.data_ptr(), sfb32.data_ptr(), out.data_ptr(), m_indices.data_ptr(),
            rows, n, k, g, buf.data_ptr(), buf.data_ptr() + aux, stream,
        )  # fmt: skip
    return out
