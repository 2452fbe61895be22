"""Ascend (Huawei NPU) path of deep_select: every public op mapped to a torch_npu operator or the reference.

The api calls ``dispatch(op_name)`` when ``backend(device) == "ascend"`` (an ``npu`` tensor and torch_npu
importable, or DEEPINFER_DEEP_SELECT_BACKEND=ascend); it returns a drop-in replacement of the reference function
the api calls for that op (same arguments and results; mechanics in ``_core.py``). Every op here stays on the
reference, which is pure PyTorch and runs on the NPU through torch_npu's aten kernels. Operator names and
signatures were checked against the torch_npu / CANN documentation (hiascend.com, op-plugin); no NPU run was made.

* `topk`, `topk_ragged` -> reference (`torch.topk` -> aclnnTopk): the reference ranks unique int64 keys (value bits,
  then the reversed column), so no tie ever reaches the NPU's TopK and the deterministic rule (lower index wins, NaN
  below -inf, -1 padding) holds exactly; aclnnTopk takes INT64 on Atlas A2/A3. No torch_npu top-k operator documents
  our tie rule
* `indexer_scores` -> reference: `npu_lightning_indexer` returns only the selected indices (and values), never the
  [t, n] score matrix; fp32 einsum on the NPU otherwise
* `indexer_topk` (+ `indexer_topk_scores`) -> reference: `npu_lightning_indexer` (DSA: query [t, 64, 128] bf16/fp16,
  key heads 1, PA_BSND / TND layouts) takes bf16/fp16 weights and queries where we compute in fp32, and documents no
  tie rule; ReLU makes many exact-zero ties, so its picks can differ from `topk(indexer_scores(...))`
"""

from __future__ import annotations

from ... import reference as _ref
from ._core import AscendOp, describe, make_dispatch, markdown_table

_TOPK = "reference: torch.topk (aclnnTopk, INT64) over unique int64 keys, so the tie rule holds exactly"
_LI = "reference: npu_lightning_indexer has bf16 inputs, no tie rule and no score output"
_WHY = {
    "topk": _TOPK,
    "topk_ragged": _TOPK,
    "indexer_scores": "reference: fp32 einsum; npu_lightning_indexer never returns the score matrix",
    "indexer_topk": _LI,
    "indexer_topk_scores": _LI,
}

OPS: dict[str, AscendOp] = {name: AscendOp(name, getattr(_ref, name), note=why) for name, why in _WHY.items()}
"""Every public op of deep_select (and the score half of indexer_topk) -> its Ascend entry."""

dispatch = make_dispatch(OPS)

__all__ = ["OPS", "describe", "dispatch", "markdown_table"]
