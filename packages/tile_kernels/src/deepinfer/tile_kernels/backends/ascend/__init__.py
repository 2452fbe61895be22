"""Ascend (Huawei NPU) path of tile_kernels: every public op mapped to a torch_npu operator or the reference.

The api calls ``dispatch(op_name)`` when ``backend(device) == "ascend"`` (an ``npu`` tensor and torch_npu
importable, or DEEPINFER_TILE_KERNELS_BACKEND=ascend); it returns a drop-in replacement of the reference function
(same arguments and results). Adapters upcast to fp32 before the NPU operator and round once, as the reference
does; inputs outside an operator's documented range, a missing operator or missing torch_npu run the reference
(mechanics in ``_core.py``). Operator names and signatures were checked against the torch_npu / CANN API
documentation (hiascend.com, op-plugin); no NPU run was made.

* `rms_norm` -> `torch_npu.npu_rms_norm`: `npu_rms_norm(x.float(), gamma, epsilon=eps)[0].to(x.dtype)`; gamma =
  weight fp32, or ones when weight is None
* `apply_rope_interleaved` -> `torch_npu.npu_rotary_mul`: rope dims viewed BSND `[1, t, N, rope_dim]` fp32, r1/r2
  `[1, t, 1, rope_dim]` = cos/sin repeated per pair, `rotary_mode="interleave"`; older torch_npu: "half" mode around
  the exact (2k, 2k+1) <-> (k, k + d/2) permutation; inverse passes -sin. Needs N < 1000, rope_dim < 896
* `swiglu_clamp` -> `torch_npu.npu_swiglu`: `npu_swiglu(cat(min(gate, limit), clamp(up, +-limit)) fp32,
  dim=-1).to(gate.dtype)` (A = first half = gate)
* `swiglu_clamp_fp8` -> `torch_npu.npu_swiglu`: `swiglu_clamp` above, then the reference FP8 quantiser (bit-exact
  contract)
* `kv_norm_rope_quant` -> `torch_npu.npu_rms_norm` + `npu_rotary_mul`: the two adapters above, then the reference
  FP8 quant-dequant and cache write
* `rope_inv_freq`, `rope_cos_sin` -> reference: table builders (a few hundred floats), no NPU operator needed
* `mhc_pre`, `mhc_post`, `mhc_head`, `sinkhorn` -> reference: no torch_npu operator for mHC / Sinkhorn
* `softmax_pool` -> reference: no fused softmax-gated pooling operator
* `moe_route`, `moe_scores` -> reference: `npu_moe_gating_top_k` has no sqrt-softplus scoring (V4's default), needs
  bias, 256 experts and k_group 4 on A2/A3, renormalises with an eps, and documents no tie rule (ours: lower expert
  id wins)
* `hash_route` -> reference: a table gather plus the scores above
* `moe_permute`, `moe_unpermute` -> reference: a stable sort, row gathers and an fp32 slot-order sum (aten ops,
  which torch_npu runs on the NPU); no torch_npu operator has been checked against this layout (expert
  -> token -> slot order, per-expert block padding, src_map [t, k] with -1 for masked slots)
* `stable_argsort` -> reference: torch.argsort(stable=True), an aten op torch_npu runs on the NPU
* `fp8_quant_ue8m0`, `fp8_quant_dequant_ue8m0`, `per_token_group_quant_fp8`, `fp8_block_quant`, `dequant_fp8_block`
  -> reference: must be bit-exact with UE8M0 power-of-two scales and an amax floor of 1e-4; `npu_dynamic_quant`
  makes one fp32 scale amax/max per row, not per 64/128 group nor a power of two
* `fp4_quant_ue8m0`, `fp4_quant_dequant_ue8m0`, `fp4_pack`, `unpack_fp4` -> reference: e2m1 with E8M0 scales per 32:
  no torch_npu operator with this format on A2/A3
* `hadamard_transform`, `hadamard_fp4_quant_dequant` -> reference: no torch_npu Walsh-Hadamard operator confirmed
"""

from __future__ import annotations

from ... import reference as _ref
from . import ops as _ops
from ._core import AscendOp, describe, make_dispatch, markdown_table

_NPU = {
    "rms_norm": ("npu_rms_norm", _ops.rms_norm, "npu_rms_norm(x fp32, gamma fp32, epsilon)[0] -> x.dtype"),
    "apply_rope_interleaved": (
        "npu_rotary_mul",
        _ops.apply_rope_interleaved,
        "BSND [1, t, N, rope_dim] fp32, r1/r2 = cos/sin per pair; interleave mode, else half mode + permutation",
    ),
    "swiglu_clamp": ("npu_swiglu", _ops.swiglu_clamp, "npu_swiglu(cat(clamped gate, clamped up) fp32, dim=-1)"),
    "swiglu_clamp_fp8": ("npu_swiglu", _ops.swiglu_clamp_fp8, "npu_swiglu, then the reference FP8 quantiser"),
    "kv_norm_rope_quant": (
        "npu_rms_norm",
        _ops.kv_norm_rope_quant,
        "npu_rms_norm + npu_rotary_mul, then the reference FP8 quant-dequant and cache write",
    ),
}

_WHY = {
    "rope_inv_freq": "table builder, no NPU operator needed",
    "rope_cos_sin": "table builder, no NPU operator needed",
    "mhc_pre": "no torch_npu operator for mHC / Sinkhorn",
    "mhc_post": "no torch_npu operator for mHC",
    "mhc_head": "no torch_npu operator for mHC",
    "mhc_head_weights": "no torch_npu operator for mHC",
    "sinkhorn": "no torch_npu operator for Sinkhorn",
    "softmax_pool": "no fused softmax-gated pooling operator",
    "moe_route": "npu_moe_gating_top_k: no sqrt-softplus, 256 experts / k_group 4 on A2/A3, eps renorm, no tie rule",
    "moe_scores": "plain elementwise scoring (aten)",
    "hash_route": "table gather plus the reference scores",
    "moe_permute": "stable sort + row gather (aten); no torch_npu operator checked against this layout",
    "moe_unpermute": "fp32 slot-order weighted sum of gathered rows (aten); no torch_npu operator checked",
    "stable_argsort": "torch.argsort(stable=True) (aten, which torch_npu runs on the NPU)",
    "fp8_quant_ue8m0": "bit-exact UE8M0 contract; npu_dynamic_quant has per-row non-power-of-two scales",
    "fp8_quant_dequant_ue8m0": "bit-exact UE8M0 contract; npu_dynamic_quant has per-row non-power-of-two scales",
    "per_token_group_quant_fp8": "bit-exact UE8M0 / 1e-4 floor contract; npu_dynamic_quant differs",
    "fp8_block_quant": "bit-exact 128x128 UE8M0 contract; no matching operator",
    "dequant_fp8_block": "exact elementwise dequantisation (aten)",
    "fp4_quant_ue8m0": "e2m1 + E8M0 per 32: no torch_npu operator on A2/A3",
    "fp4_quant_dequant_ue8m0": "e2m1 + E8M0 per 32: no torch_npu operator on A2/A3",
    "fp4_pack": "e2m1 + E8M0 per 32: no torch_npu operator on A2/A3",
    "unpack_fp4": "exact table lookup (aten)",
    "hadamard_transform": "no torch_npu Walsh-Hadamard operator confirmed",
    "hadamard_fp4_quant_dequant": "no torch_npu Walsh-Hadamard operator confirmed; e2m1 + E8M0 per 32 neither",
}


def _build() -> dict[str, AscendOp]:
    table = {
        name: AscendOp(name, getattr(_ref, name), npu_op=op, adapter=fn, note=note)
        for name, (op, fn, note) in _NPU.items()
    }
    table.update({name: AscendOp(name, getattr(_ref, name), note=why) for name, why in _WHY.items()})
    return table


OPS: dict[str, AscendOp] = _build()
"""Every public op (and every reference op) of tile_kernels -> its Ascend entry."""

dispatch = make_dispatch(OPS)

__all__ = ["OPS", "describe", "dispatch", "markdown_table"]
