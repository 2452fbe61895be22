"""Public flash_mla API: argument validation, then the fastest available implementation.

Every op has a reference twin (`reference.py`, `kv_format.py`). Sparse attention runs a compiled sm_90a kernel on
CUDA when `_C` is built (the warp-specialised ws3 kernel from 32 query tokens without an extra cache, else the serial
kernel), a Triton kernel otherwise (BF16 and FP8 caches; routing in `_dispatch.py`), the reference elsewhere; FP8
pack / unpack run the reference.
Validation reads shapes, dtypes and devices only, never tensor values, and the Triton launchers never sync
with the host, so each function is safe inside CUDA-graph capture.

KV caches (one shared K=V head, 512 dims for V4):

* BF16 / FP32: [num_slots, d] or paged [num_blocks, block_size, d]. Recommended block_size: 64.
* FP8 (V4 "MODEL1" content): uint8 [num_slots, 584] or [num_blocks, block_size, 584], one 584-byte row per
  entry (layout in `kv_format.py`; build it with `pack_fp8_kv`). Recommended block_size: 64.

Flat slot addressing: an index i names row i of kv.view(-1, row_width), i.e. block * block_size + offset;
the page lookup is folded into the indices, so no block table is passed. Valid indices are 0 <= i < num_slots;
-1 (and any other out-of-range value) is a hole and is skipped.
"""

from __future__ import annotations

import torch

from . import _dispatch
from . import reference as _ref
from ._validate import ACT_DTYPES, check_int, check_out, check_same_device, check_scale, check_shape, check_tensor
from .kv_format import FP8_KV_BYTES, KV_DIM
from .metadata import MAX_DECODE_S_Q, DecodeMetadata

__all__ = [
    "FP8_KV_BYTES",
    "KV_DIM",
    "MAX_DECODE_S_Q",
    "RECOMMENDED_BLOCK_SIZE",
    "DecodeMetadata",
    "get_decode_metadata",
    "pack_fp8_kv",
    "sparse_attn_decode",
    "sparse_attn_prefill",
    "unpack_fp8_kv",
]

RECOMMENDED_BLOCK_SIZE = 64  # tokens per cache block: one 64-row tile of the fast kernels per block


def _check_cache(name: str, kv: object, d: int) -> None:
    """A BF16/FP32 cache with last dim d, or a uint8 FP8 cache with last dim 584 (then d must be 512)."""
    check_tensor(name, kv, ndim=(2, 3), dtypes=(*ACT_DTYPES, torch.uint8))
    assert isinstance(kv, torch.Tensor)
    if kv.dtype == torch.uint8:
        if kv.shape[-1] != FP8_KV_BYTES or d != KV_DIM:
            raise ValueError(
                f"{name} as an FP8 cache must be uint8 [..., {FP8_KV_BYTES}] with q head dim {KV_DIM}, "
                f"got shape {tuple(kv.shape)} and head dim {d}"
            )
    elif kv.shape[-1] != d:
        raise ValueError(f"{name} must have last dim {d} (q's head dim), got shape {tuple(kv.shape)}")


def _check_attn_args(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    extra_kv: torch.Tensor | None,
    extra_indices: torch.Tensor | None,
    lead: tuple[int, ...],
) -> None:
    """Checks shared by prefill ([t] lead dims) and decode ([b, s_q] lead dims)."""
    h, d = q.shape[-2:]
    _check_cache("kv", kv, d)
    check_tensor("indices", indices, ndim=len(lead) + 1, dtypes=(torch.int32,))
    check_shape("indices", indices, (*lead, indices.shape[-1]))
    if sink is not None:
        check_tensor("sink", sink, ndim=1, dtypes=(torch.float32,))
        check_shape("sink", sink, (h,))
    if (extra_kv is None) != (extra_indices is None):
        raise ValueError("extra_kv and extra_indices must be given together, got only one of them")
    if extra_kv is not None and extra_indices is not None:
        _check_cache("extra_kv", extra_kv, d)
        check_tensor("extra_indices", extra_indices, ndim=len(lead) + 1, dtypes=(torch.int32,))
        check_shape("extra_indices", extra_indices, (*lead, extra_indices.shape[-1]))
    check_same_device(q=q, kv=kv, indices=indices, sink=sink, extra_kv=extra_kv, extra_indices=extra_indices)


def sparse_attn_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    softmax_scale: float,
    *,
    extra_kv: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    return_lse: bool = True,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sparse attention with a per-head sink over selected rows of a shared K=V cache (prefill form).

    o_h = sum_j exp(z_j) kv_j / (sum_j exp(z_j) + exp(sink_h)), z_j = softmax_scale * (q_h . kv_j), over the
    valid indices of `indices` and `extra_indices` together (values are the same rows as keys, value dim = d).
    fp32 math.

    Args:
        q: [t, h, d] bf16 / fp32 (V4: h = 64, d = 512).
        kv: cache [n, d] / [blocks, block_size, d] bf16 / fp32, or uint8 FP8 [..., 584] (d must be 512).
        indices: int32 [t, topk] flat slots into kv (-1 = hole; any order). A slot named twice in a row is
            counted twice, so rows should name each slot once (top-k output does).
        sink: fp32 [h] per-head sink logit, or None (no sink term).
        softmax_scale: the logit scale (V4: 512 ** -0.5).
        extra_kv: optional second cache (same formats, e.g. the sliding window while kv holds compressed rows).
        extra_indices: int32 [t, topk2] flat slots into extra_kv; required iff extra_kv is given.
        return_lse: False skips the lse output (returned as None).
        out: optional [t, h, d] buffer in q.dtype that receives the output (every element is written).

    Returns:
        (out [t, h, d] in q.dtype, lse fp32 [t, h] or None). lse = log(sum_j exp(z_j) + exp(sink_h)), natural
        log, the real softmax denominator including the sink. A row with no valid index gets out = 0 and
        lse = sink_h (-inf without a sink).
    """
    check_tensor("q", q, ndim=3, dtypes=ACT_DTYPES)
    scale = check_scale("softmax_scale", softmax_scale)
    _check_attn_args(q, kv, indices, sink, extra_kv, extra_indices, (q.shape[0],))
    if out is not None:
        check_out(out, tuple(q.shape), q.dtype, q.device)
    o, lse = _dispatch.sparse_attn(q, kv, indices, sink, scale, extra_kv, extra_indices, out)
    return o, (lse if return_lse else None)


def get_decode_metadata(
    batch_size: int,
    s_q: int,
    num_heads: int,
    topk: int,
    *,
    extra_topk: int = 0,
    device: torch.device | str | None = None,
) -> DecodeMetadata:
    """Scheduling metadata for `sparse_attn_decode`, computed once per batch shape and reused by every layer.

    Built from the shapes alone (no tensor is read, no host-device sync), so it is CUDA-graph safe: compute it
    before capture and pass the same object to every captured call. Today it stores only the shapes and each
    call is checked against them: the Triton kernel's split-KV plan (`plan_num_splits`) is a pure function of
    the shapes and the device's SM count, a few integer operations on the host per call, with no device
    tensor to precompute.

    Args:
        batch_size: requests b (>= 1); s_q: query tokens per request, 1..8; num_heads: h;
        topk: width of `indices`; extra_topk: width of `extra_indices` (0 when none); device: where a fast
        path would place its schedule tensors.
    """
    check_int("batch_size", batch_size, minimum=1)
    check_int("s_q", s_q, minimum=1)
    if s_q > MAX_DECODE_S_Q:
        raise ValueError(f"s_q must be in 1..{MAX_DECODE_S_Q}, got {s_q}")
    check_int("num_heads", num_heads, minimum=1)
    check_int("topk", topk, minimum=0)
    check_int("extra_topk", extra_topk, minimum=0)
    dev = torch.device(device) if device is not None else None
    return DecodeMetadata(batch_size, s_q, num_heads, topk, extra_topk, dev)


def sparse_attn_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    softmax_scale: float,
    *,
    extra_kv: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    metadata: DecodeMetadata | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode form of `sparse_attn_prefill`: b requests with s_q query tokens each (speculative verification).

    Args:
        q: [b, s_q, h, d] bf16 / fp32, 1 <= s_q <= 8.
        kv_cache: [blocks, block_size, d] (or flat [n, d]) bf16 / fp32, or uint8 FP8 [..., 584]. Block size 64
            is recommended.
        indices: int32 [b, s_q, topk] flat slots (block * block_size + offset), -1 = hole.
        sink, softmax_scale, extra_kv: as in `sparse_attn_prefill`.
        extra_indices: int32 [b, s_q, topk2] into extra_kv.
        metadata: from `get_decode_metadata` (optional for the reference; checked against the shapes if given).
        out: optional [b, s_q, h, d] buffer in q.dtype (every element is written).

    Returns:
        (out [b, s_q, h, d] in q.dtype, lse fp32 [b, s_q, h]) with the prefill form's conventions. Note the lse
        layout is [b, s_q, h] (FlashMLA returns [b, h, s_q]).
    """
    check_tensor("q", q, ndim=4, dtypes=ACT_DTYPES)
    b, s_q, h, d = q.shape
    if not 1 <= s_q <= MAX_DECODE_S_Q:
        raise ValueError(f"q must have 1..{MAX_DECODE_S_Q} query tokens per request, got shape {tuple(q.shape)}")
    scale = check_scale("softmax_scale", softmax_scale)
    _check_attn_args(q, kv_cache, indices, sink, extra_kv, extra_indices, (b, s_q))
    if metadata is not None:
        if not isinstance(metadata, DecodeMetadata):
            raise TypeError(f"metadata must be a DecodeMetadata, got {type(metadata).__name__}")
        metadata.check(q, indices, extra_indices)
    if out is not None:
        check_out(out, tuple(q.shape), q.dtype, q.device)
    flat_extra = extra_indices.reshape(b * s_q, -1) if extra_indices is not None else None
    out3 = _flat_view(out, (b * s_q, h, d)) if out is not None else None
    o, lse = _dispatch.sparse_attn(
        q.reshape(b * s_q, h, d), kv_cache, indices.reshape(b * s_q, -1), sink, scale, extra_kv, flat_extra, out3
    )
    o = o.view(b, s_q, h, d)
    if out is not None and out3 is None:  # out's strides have no [b * s_q, h, d] view: copy once
        out.copy_(o)
    return (out if out is not None else o), lse.view(b, s_q, h)


def _flat_view(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    """A view of t with this shape sharing its memory, or None when t's strides do not allow one."""
    try:
        return t.view(shape)
    except RuntimeError:
        return None


def pack_fp8_kv(kv: torch.Tensor) -> torch.Tensor:
    """Quantise 512-d K=V entries into the 584-byte FP8 cache rows (layout and rounding in `kv_format.py`).

    Args:
        kv: [..., 512] bf16 / fp32 (e.g. [n, 512] new entries, or a whole [blocks, block_size, 512] cache).

    Returns:
        uint8 [..., 584]: per entry 448 e4m3 bytes (dims 0..447, one power-of-two UE8M0 scale per 64 dims),
        64 bf16 RoPE dims (exact for bf16 input), 7 scale bytes, 1 zero pad byte.
    """
    check_tensor("kv", kv, dtypes=ACT_DTYPES)
    if kv.dim() < 1 or kv.shape[-1] != KV_DIM:
        raise ValueError(f"kv must have last dim {KV_DIM}, got shape {tuple(kv.shape)}")
    return _ref.pack_fp8_kv_ref(kv)


def unpack_fp8_kv(packed: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Dequantise FP8 cache rows: uint8 [..., 584] -> dtype [..., 512] (bf16 / fp32; exact for finite entries)."""
    check_tensor("packed", packed, dtypes=(torch.uint8,))
    if packed.dim() < 1 or packed.shape[-1] != FP8_KV_BYTES:
        raise ValueError(f"packed must have last dim {FP8_KV_BYTES}, got shape {tuple(packed.shape)}")
    if dtype not in ACT_DTYPES:
        raise TypeError(f"dtype must be torch.bfloat16 or torch.float32, got {dtype}")
    return _ref.unpack_fp8_kv_ref(packed, dtype)
