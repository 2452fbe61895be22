"""CUDA C++ radix top-k (`csrc/cuda/topk_radix.cu`, built into `deepinfer.deep_select._C`): Python launcher.

Same contract and result layout as the Triton kernels (`topk_triton_v3`): int32 [b, k] ids in no particular
order, then -1 padding; ragged form through `starts` (ids relative to starts[r]). One CTA of 512 threads per
row, radix select over a unique 64-bit key (value image, then the column, so the lower column wins ties):

* one_read=True (default): one pass over the row builds a 4096-bin histogram of the top 12 key bits and,
  tile by tile, keeps in shared memory every entry at or above the bucket of the k-th best entry seen so far
  (a lower bound of the final threshold bucket); the remaining digits are then resolved in shared memory.
  Rows whose kept entries overflow the buffer (ascending rows, heavy ties) fall back to the two-pass path.
* one_read=False: the histogram pass, then a second pass (mostly from L2 at n <= 65,536) that writes every
  entry above the threshold bucket and keeps the bucket's entries in shared memory.

Rows whose threshold bucket alone overflows the buffer (heavy ties) take extra histogram passes over the row.

`_C` is imported lazily: a CPU build (DEEPINFER_DEVICE=cpu, CI) has no `_C` and never reaches this module's
kernels (`available()` is False).
"""

from __future__ import annotations

import functools
import importlib
import types

import torch

__all__ = ["DEFAULT_CAP", "available", "topk_cuda"]

DEFAULT_CAP = 8192  # shared-memory candidate slots per CTA: 64 KB; 2 CTAs of 512 threads per SM
_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@functools.cache
def _module() -> types.ModuleType | None:
    try:
        return importlib.import_module("deepinfer.deep_select._C")
    except ImportError:
        return None


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
) -> torch.Tensor:
    """Exact row-wise top-k ids (unsorted), same arguments and result as `topk_triton_v3`.

    Args:
        scores: [b, n] fp32 / bf16 / fp16 on CUDA, any row stride (a non-unit column stride is copied first).
        k: >= 1; lengths (or ends) / starts: int32 [b] or None (ragged: ids relative to starts[r]).
        out: optional int32 [b, k] buffer (any strides); every slot is written.
        cap: shared-memory candidate slots (default min(DEFAULT_CAP, n)); tests shrink it to force the
            extra row passes of tie-heavy rows. vectorize: False forces scalar loads (tests).
        one_read: the one-read kernel (default) or the two-pass one (see the module docstring).

    Returns:
        int32 [b, k]: chosen ids in slots 0 .. min(k, len) - 1 (any order), then -1.
    Never syncs with the host (CUDA-graph safe).
    """
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
            out.data_ptr(), k, out.stride(0), out.stride(1), cap, vectorize and _vector_ok(scores), one_read,
            torch.cuda.current_stream(scores.device).cuda_stream,
        )  # fmt: skip
    return out
