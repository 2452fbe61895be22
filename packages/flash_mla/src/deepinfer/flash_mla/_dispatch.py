"""Route a validated sparse-attention call to a Triton kernel or the reference (api.py calls this).

`backend(q.device)` decides between the GPU routes ("triton", or "cuda" when `_C` is built: the same routes) and
"reference" (DEEPINFER_FLASH_MLA_BACKEND forces one).
On the Triton backend:

* bf16 q with bf16 and/or FP8 (uint8 [..., 584]) caches: `triton_split_attn.sparse_attn_split_triton`, which
  runs DEFAULT_KERNELS' kernel: when `_C` is built, the warp-specialised kernels (`cuda_ws_decode.py`) for
  calls without an extra cache (h % 64 == 0, d = 512): the threshold-rescale build ws3p1oat (session 14) from 128
  query tokens on a BF16 cache and from 64 on FP8 (`cuda_ws_decode.default_variant`); with a `_C` without it, the
  adaptive overlap builds ws3p1oa (BF16 cache) / ws3p1voa (FP8) from WS3P_OVL_MIN_TOKENS (128) query tokens
  (session 10 H200, bit-equal to their base: 1.010-1.022x it at decode b 64..256, 1.003-1.022x at prefill 4,096 /
  16,384; 0.994-0.999x at 64 tokens, hence the threshold; a `_C` without them keeps the base), ws3p1l (BF16) / ws3p1v (FP8; ws3p1 without the kOptVec build) from WS3P_MIN_TOKENS
  (64), ws3 from WS3_MIN_TOKENS (32; extra-cache calls too only with DEEPINFER_FLASH_MLA_WS3_EXTRA=1), else
  the serial CUDA kernel (`cuda_sparse_decode.py`) when it takes the call (d = 512, both caches of one format, with
  or without the extra cache), else the Triton split kernel (all heads per program, split-KV for few tokens);
  prefill and decode alike (decode's [b, s_q] tokens flattened: t = b * s_q). `kernel_for` names it;
* fp32 q or an fp32 cache, no FP8 cache: `triton_sparse_attn` with fp32 dot operands (exact fp32 products);
* fp32 mixed with an FP8 cache, or a head dim that is not a power of two >= 16: the reference.

Under TRITON_INTERPRET=1 (CPU tests) every dtype goes to `triton_split_attn` (fp32 dot operands there).
Nothing here reads tensor values: the route depends on dtypes, shapes and the device only (CUDA-graph safe).
"""

from __future__ import annotations

import importlib
import os
import types

import torch

from . import reference as _ref
from ._backend import backend

_KERNELS = __package__ + ".backends.cuda."


def _kernel(name: str) -> types.ModuleType:
    """The kernel module, imported on first use (Triton is optional; CPU-only installs never import it)."""
    return importlib.import_module(_KERNELS + name)


def route(q: torch.Tensor, kv: torch.Tensor, extra_kv: torch.Tensor | None) -> str:
    """The path of a call with these tensors: "split", "legacy" or "reference" (see the module docstring)."""
    # "cuda" (auto picks it once _C is built) runs the same Triton routes; the compiled kernel is chosen inside
    # sparse_attn_split_triton (kernel="cuda" / DEFAULT_KERNELS), so a built _C never sends calls to the reference.
    if backend(q.device) not in ("triton", "cuda"):
        return "reference"
    d = q.shape[-1]
    if d < 16 or d & (d - 1):
        return "reference"
    caches = [kv] if extra_kv is None else [kv, extra_kv]
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return "split"
    if q.dtype == torch.bfloat16 and all(c.dtype in (torch.bfloat16, torch.uint8) for c in caches):
        return "split"
    if any(c.dtype == torch.uint8 for c in caches):
        return "reference"
    return "legacy"


def kernel_for(q: torch.Tensor, kv: torch.Tensor, extra_kv: torch.Tensor | None) -> str:
    """The kernel a call with these tensors (q [t, h, d], as `sparse_attn` gets it) runs: "cuda_ws3p1oat" (session
    14: >= 128 tokens, on an FP8 cache >= 64), "cuda_ws3p1oa" / "cuda_ws3p1voa" / "cuda_ws3p1voaw" (older `_C`s),
    "cuda_ws3p1l" / "cuda_ws3p1v" / "cuda_ws3p1" / "cuda_ws3p" (>= WS3P_MIN_TOKENS tokens; all without an extra
    cache: `cuda_ws_decode.default_variant`), "cuda_ws3" (the warp-specialised sm_90a kernel: >= WS3_MIN_TOKENS tokens,
    no extra cache unless DEEPINFER_FLASH_MLA_WS3_EXTRA=1), "cuda" (the serial sm_90a kernel),
    "fused" / "chunked" / "deferred" (Triton split kernels), "legacy" (the older Triton kernel) or "reference".
    Shapes / dtypes only."""
    path = route(q, kv, extra_kv)
    if path != "split":
        return path
    mod = _kernel("triton_split_attn")
    compiled, why = mod.compiled_kernel_for(None, q, kv, extra_kv)
    if compiled is not None:
        return compiled
    if why is not None:  # the default names a compiled kernel that cannot take the call
        return "fused"
    fp8 = kv.dtype == torch.uint8 or (extra_kv is not None and extra_kv.dtype == torch.uint8)
    name = mod.DEFAULT_KERNELS["fp8" if fp8 else "bf16"]
    return "fused" if name == "chunked" and q.shape[-1] != 512 else name


def sparse_attn(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sink: torch.Tensor | None,
    scale: float,
    extra_kv: torch.Tensor | None,
    extra_indices: torch.Tensor | None,
    out: torch.Tensor | None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [t, h, d]; indices [t, k] (+ extra [t, k2]); out None or [t, h, d] q.dtype (filled in place).

    Returns (out [t, h, d] q.dtype, lse fp32 [t, h]) from the routed implementation.
    """
    path = route(q, kv, extra_kv)
    kw = dict(extra_kv=extra_kv, extra_indices=extra_indices, out=out)
    if path == "split":
        return _kernel("triton_split_attn").sparse_attn_split_triton(
            q, kv, indices, sink, scale, num_splits=num_splits, **kw
        )
    if path == "legacy":
        return _kernel("triton_sparse_attn").sparse_attn_triton(q, kv, indices, sink, scale, **kw)
    o, lse = _ref.sparse_attn(q, kv, indices, sink, scale, extra_kv, extra_indices)
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse
