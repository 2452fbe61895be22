"""Ascend (Huawei NPU) path of deep_ep: every public op mapped to a torch_npu operator or the reference.

`Buffer` calls ``dispatch(op_name)`` when ``backend(device) == "ascend"`` (``npu`` tensors and torch_npu
importable, or DEEPINFER_DEEP_EP_BACKEND=ascend); it returns a drop-in replacement of the reference function the
Buffer method calls (same arguments, the ``Comm`` first; mechanics in ``_core.py``). Every op stays on the
reference, whose transport is ``torch.distributed.all_to_all_single`` of uint8 rows: on Ascend the process group
is HCCL (``dist.init_process_group("hccl")`` after ``import torch_npu``), which does uneven all-to-all (alltoallv)
over HCCS within a node and RoCE across nodes. World size 1 is the local permutation. Operator names and
signatures were checked against the torch_npu / CANN documentation (hiascend.com, op-plugin); no NPU run was made.

* `Buffer.get_dispatch_layout` (-> `dispatch_layout`) -> reference: counting with scatter / sum (aten)
* `Buffer.dispatch` / `cached_dispatch` / `combine` -> reference over HCCL: `npu_moe_distribute_dispatch` /
  `_combine` (and `_v2`) send one row per (token, expert), quantise only to int8 (dynamic, amax/127), need H = 7168
  on Atlas A3 (V4-Flash has 4096) and 2/4/8 servers on A2, and return an expert-compact `expand_x` with opaque
  `expand_idx`: not normal mode's once-per-rank send with received top-k ids, weights and a rank-ordered layout
* `Buffer.low_latency_dispatch` / `low_latency_combine` -> reference over HCCL: the same operators are
  DeepEP-low-latency-like but produce no `[E_local, max * R, hidden]` masked layout, no e4m3 1x128 scales (int8
  only), BS <= 256 (A2) / 512 (A3) and the A3 hidden-size restriction above
* `per_token_cast_to_fp8` -> reference: e4m3 with max(amax, 1e-4) / 448 scales per 128 channels; `npu_dynamic_quant`
  makes int8 (or FP8 on 950 only) with one scale per row
"""

from __future__ import annotations

from ... import reference as _ref
from ... import reference_ll as _ref_ll
from ._core import AscendOp, describe, make_dispatch, markdown_table

_MOE = "reference over HCCL all_to_all_single: npu_moe_distribute_* is int8-only, H=7168 on A3, other layouts"
_ENTRIES = {
    "get_dispatch_layout": (_ref.dispatch_layout, "reference: counting (aten)"),
    "dispatch": (_ref.dispatch, _MOE),
    "cached_dispatch": (_ref.cached_dispatch, _MOE),
    "combine": (_ref.combine, _MOE),
    "low_latency_dispatch": (_ref_ll.low_latency_dispatch, _MOE + "; no masked [E_local, max*R, h] layout"),
    "low_latency_combine": (_ref_ll.low_latency_combine, _MOE + "; no masked [E_local, max*R, h] layout"),
    "per_token_cast_to_fp8": (_ref_ll.per_token_cast_to_fp8, "reference: npu_dynamic_quant is int8 per row"),
}

OPS: dict[str, AscendOp] = {name: AscendOp(name, fn, note=why) for name, (fn, why) in _ENTRIES.items()}
"""Every public op of deep_ep (the Buffer methods and `per_token_cast_to_fp8`) -> its Ascend entry."""

dispatch = make_dispatch(OPS)

__all__ = ["OPS", "describe", "dispatch", "markdown_table"]
