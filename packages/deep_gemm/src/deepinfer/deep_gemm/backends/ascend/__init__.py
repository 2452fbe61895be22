"""Ascend (Huawei NPU) path of deep_gemm: every public op mapped to an NPU implementation or the reference.

The api calls ``dispatch(op_name)`` when ``backend(device) == "ascend"`` (an ``npu`` tensor and torch_npu
importable, or DEEPINFER_DEEP_GEMM_BACKEND=ascend); it returns a drop-in replacement of the reference function the
api calls for that op (same arguments, `out` filled and returned; mechanics in ``_core.py``). Operator names and
signatures were checked against the torch_npu / CANN documentation (hiascend.com, op-plugin); no NPU run was made.

* `bf16_gemm_nt` -> aten on the NPU: `out.copy_(a @ b.T)` in bf16 (cube: fp32 accumulation, one rounding) when a, b,
  out are bf16 and c is None; fp32 operands, fp32 out or C: reference (the fp32 sum must precede the rounding)
* `grouped_gemm_nt_bf16` -> aten on the NPU: `bmm(a.transpose(0, 1), b.transpose(1, 2))` in bf16 -> out [t, g, n];
  same conditions
* `m_grouped_bf16_fp4_gemm_nt_contiguous` -> `torch_npu.npu_grouped_matmul`: non-empty groups, 32 per call:
  `npu_grouped_matmul([a[rows]], [W_i bf16 [k, n], ...], group_list=cumulative ends, split_item=3, group_type=0,
  group_list_type=0)`; W_i = FP4 dequantised to bf16 (exact); the operator's int4 path is integer int4, not e2m1, so
  it is not used
* `fp8_gemm_nt` (= `fp8_fp4_gemm_nt`) -> reference: Atlas A2/A3 have no FP8 matmul: `npu_quant_matmul` takes
  int8/int4 there; FP8 (MX, per-32 E8M0 along K) exists only on Ascend 950 and is not DeepGEMM's 1x128 / 128x128
  scaling
* `m_grouped_fp8_gemm_nt_contiguous`, `m_grouped_fp8_gemm_nt_masked` (and the `_fp8_fp4_` aliases) -> reference:
  same: `npu_grouped_matmul`'s quantised modes are int8 per-channel / per-token, not FP8 block scales
* `grouped_gemm_nt_fp8` -> reference: same
* `m_grouped_fp8_fp4_gemm_nt_offsets` (W4A8, offsets layout) -> reference: same
* `prepare_w4a8_wide` (weight preparation for the CUDA W4A8 wide kernel) -> itself: pure PyTorch on any device; a
  prepared weight passed to the W4A8 call runs the reference on its original operands
"""

from __future__ import annotations

from ... import reference as _ref
from ... import reference_w4a8 as _ref_w4a8
from ..cuda.w4a8_wide_pack import prepare_w4a8_wide as _prepare_w4a8_wide
from ... import reference_w4a16 as _ref_w4a16
from . import ops as _ops
from ._core import AscendOp, describe, make_dispatch, markdown_table

_FP8 = "reference: no FP8 matmul on Atlas A2/A3 (npu_quant_matmul is int8/int4); 950's MX FP8 scaling differs"
_GFP8 = "reference: npu_grouped_matmul quantises int8 per channel / per token, not FP8 block scales"


def _build() -> dict[str, AscendOp]:
    t = {
        "bf16_gemm_nt": AscendOp(
            "bf16_gemm_nt", _ref.bf16_gemm_nt, adapter=_ops.bf16_gemm_nt, note="bf16 a @ b.T (aten), c None, bf16 out"
        ),
        "grouped_gemm_nt_bf16": AscendOp(
            "grouped_gemm_nt_bf16",
            _ref.grouped_gemm_nt_bf16,
            adapter=_ops.grouped_gemm_nt_bf16,
            note="bf16 bmm (aten) over the groups, bf16 out",
        ),
        "m_grouped_bf16_fp4_gemm_nt_contiguous": AscendOp(
            "m_grouped_bf16_fp4_gemm_nt_contiguous",
            _ref_w4a16.m_grouped_bf16_fp4_gemm_nt_contiguous,
            npu_op="npu_grouped_matmul",
            adapter=_ops.m_grouped_bf16_fp4_gemm_nt_contiguous,
            note="FP4 -> bf16 [k, n] per non-empty group, group_list = cumulative ends, split_item=3, 32 groups a call",
        ),
        "grouped_gemm_nt_fp8": AscendOp("grouped_gemm_nt_fp8", _ref.grouped_gemm_nt_fp8, note=_FP8),
        "m_grouped_fp8_fp4_gemm_nt_offsets": AscendOp(
            "m_grouped_fp8_fp4_gemm_nt_offsets", _ref_w4a8.m_grouped_fp8_fp4_gemm_nt_offsets, note=_GFP8
        ),
        "prepare_w4a8_wide": AscendOp(
            "prepare_w4a8_wide", _prepare_w4a8_wide,
            note="pure PyTorch weight preparation (any device); the W4A8 call then runs the reference on its originals",
        ),  # fmt: skip
    }
    for name in ("fp8_gemm_nt", "fp8_fp4_gemm_nt"):
        t[name] = AscendOp(name, _ref.fp8_gemm_nt, note=_FP8)
    for layout in ("contiguous", "masked"):
        fn = getattr(_ref, f"m_grouped_fp8_gemm_nt_{layout}")
        for name in (f"m_grouped_fp8_gemm_nt_{layout}", f"m_grouped_fp8_fp4_gemm_nt_{layout}"):
            t[name] = AscendOp(name, fn, note=_GFP8)
    return t


OPS: dict[str, AscendOp] = _build()
"""Every public op of deep_gemm (DeepGEMM aliases included) -> its Ascend entry."""

dispatch = make_dispatch(OPS)

__all__ = ["OPS", "describe", "dispatch", "markdown_table"]
