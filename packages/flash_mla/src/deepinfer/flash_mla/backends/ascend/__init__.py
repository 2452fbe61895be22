"""Ascend (Huawei NPU) path of flash_mla: every public op mapped to a torch_npu operator or the reference.

The api calls ``dispatch(op_name)`` when ``backend(device) == "ascend"`` (an ``npu`` tensor and torch_npu
importable, or DEEPINFER_FLASH_MLA_BACKEND=ascend); it returns a drop-in replacement of the reference function
the api calls for that op (same arguments and results; mechanics in ``_core.py``). Every op stays on the
reference (gather + fp32 sink softmax), pure PyTorch that runs on the NPU through torch_npu's aten kernels.
Operator names and signatures were checked against the torch_npu / CANN documentation (hiascend.com, op-plugin,
sgl-kernel-npu); no NPU run was made.

* `sparse_attn_prefill`, `sparse_attn_decode` (-> `reference.sparse_attn`) -> reference:
  `npu_sparse_flash_attention` (DeepSeek-V3.2 DSA, Atlas A3) has no per-head attention sink and returns no lse; it
  is built for MLA's 512 + 64 split K with separate `query_rope` / `key_rope`, not V4's single 512-d K=V row (448 +
  64), and it reads a paged cache through a block table rather than flat slot ids with -1 holes. A sink can be
  folded in afterwards only with the lse (o *= exp(lse - lse'), lse' = logaddexp(lse, sink)), which it does not
  return
* `pack_fp8_kv`, `unpack_fp8_kv` -> reference: the 584-byte V4 cache row (e4m3 + bf16 RoPE + UE8M0 bytes) is a byte
  format no NPU operator writes; on Atlas A2/A3 there is no FP8 arithmetic either
* `get_decode_metadata` -> reference (host): shapes only, no device work (DecodeMetadata)
"""

from __future__ import annotations

from ... import reference as _ref
from ...metadata import DecodeMetadata
from ._core import AscendOp, describe, make_dispatch, markdown_table

_ATTN = "reference: npu_sparse_flash_attention has no sink, no lse, and MLA's 512+64 split K / block-table layout"
_FP8 = "reference: V4's 584-byte FP8 row is a byte format; no FP8 arithmetic on A2/A3"
_ENTRIES = {
    "sparse_attn": (_ref.sparse_attn, _ATTN),
    "sparse_attn_prefill": (_ref.sparse_attn, _ATTN),
    "sparse_attn_decode": (_ref.sparse_attn, _ATTN + " (called on [b * s_q] flattened rows)"),
    "pack_fp8_kv": (_ref.pack_fp8_kv_ref, _FP8),
    "unpack_fp8_kv": (_ref.unpack_fp8_kv_ref, _FP8),
    "get_decode_metadata": (DecodeMetadata, "reference (host): shapes only, no device work"),
}

OPS: dict[str, AscendOp] = {name: AscendOp(name, fn, note=why) for name, (fn, why) in _ENTRIES.items()}
"""Every public op of flash_mla (plus `sparse_attn`, the routed call of `_dispatch.py`) -> its Ascend entry."""

dispatch = make_dispatch(OPS)

__all__ = ["OPS", "describe", "dispatch", "markdown_table"]
