"""NPU adapters of deep_gemm ops (each has the reference's signature and contract: fp32 accumulation, one
rounding to out.dtype, `out` written in place and returned)."""

from __future__ import annotations

import torch

from ...dequant import FP4_E2M1_VALUES, fp4_codes
from ...reference_w4a16 import group_bounds
from ._core import Unsupported, npu_op, on_npu, require

GMM_GROUPS_PER_CALL = 32
"""Experts per npu_grouped_matmul call: bounds the dequantised bf16 weights held at once (32 x n x k) and stays
under the operator's 128-tensor list limit."""


def _bf16_only(*tensors: torch.Tensor) -> None:
    """The bf16 fast paths: NPU tensors, bf16 operands and output, no autograd."""
    on_npu(*tensors)
    require(all(t.dtype == torch.bfloat16 for t in tensors), "bf16 operands and output only")
    require(not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)), "autograd wanted")


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
    """aten `a @ b.T` in bf16 on the NPU (the cube accumulates in fp32 and rounds once to bf16) -> out.

    Only bf16 a, b and out without c: an fp32 out or an accumulator C needs the fp32 sum before the rounding,
    which a bf16 matmul cannot give, so those calls run the reference.
    """
    require(c is None, "accumulator C needs the fp32 result")
    _bf16_only(a, b, out)
    y = torch.matmul(a, b.t())
    out.copy_(y)
    return out


def grouped_gemm_nt_bf16(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """aten `bmm(a.transpose(0, 1), b.transpose(1, 2))` in bf16 on the NPU: [g, t, n] -> out [t, g, n]."""
    _bf16_only(a, b, out)
    y = torch.bmm(a.transpose(0, 1), b.transpose(1, 2))
    out.copy_(y.transpose(0, 1))
    return out


def _fp4_weight_kn(packed: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    """One expert's FP4 weight -> bf16 [k, n], exactly (`dequant.dequant_fp4_weight`'s values, transposed).

    packed: int8/uint8 [n, k/2] (low nibble = element 2j); scale_bytes: uint8 [n, k/32], E8M0 2^(byte-127), 255 =
    NaN. Decoded from the raw bytes with uint8 / fp32 ops only (no float8 dtype kernels needed on the NPU).
    """
    codes = fp4_codes(packed).long()
    table = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32, device=packed.device)
    e = scale_bytes.float()
    scale = torch.where(scale_bytes == 255, float("nan"), torch.exp2(e - 127.0))
    w = table[codes] * scale.repeat_interleave(32, dim=-1)
    return w.t().contiguous().to(torch.bfloat16)


def _gmm(op, x: torch.Tensor, weights: list[torch.Tensor], ends: list[int]) -> torch.Tensor:  # noqa: ANN001
    """One npu_grouped_matmul: x [rows, k] split by cumulative `ends`, weights [k, n] each -> y [rows, n] bf16.

    split_item=3: x and y are single tensors (rows of all groups back to back). torch_npu >= 2.5 wants
    group_type=0 (group along m) and takes group_list_type=0 (cumulative ends); older releases reject those
    keywords and group along m by default.
    """
    try:
        ys = op([x], weights, group_list=ends, split_item=3, group_type=0, group_list_type=0)
    except TypeError:
        ys = op([x], weights, group_list=ends, split_item=3)
    require(len(ys) == 1 and tuple(ys[0].shape) == (x.shape[0], weights[0].shape[1]), "unexpected output list")
    return ys[0]


def m_grouped_bf16_fp4_gemm_nt_contiguous(
    a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """torch_npu.npu_grouped_matmul over the non-empty groups, GMM_GROUPS_PER_CALL at a time.

    Each group's FP4 weight is dequantised to bf16 [k, n] (exact: an e2m1 value times a power of two has at most
    two significant bits), so the operator's bf16 x bf16 product with fp32 accumulation is the reference's
    contract. `offs` is read on the host (as the reference does); rows past offs[-1] are left untouched.
    """
    _bf16_only(a, out)
    on_npu(packed, scales, offs)
    op = npu_op("npu_grouped_matmul")
    bounds = [(i, s, e) for i, (s, e) in enumerate(group_bounds(offs, a.shape[0])) if e > s]
    sf = scales.view(torch.uint8)  # raw E8M0 bytes (the api takes float8_e8m0fnu or uint8)
    results = []
    for c in range(0, len(bounds), GMM_GROUPS_PER_CALL):
        chunk = bounds[c : c + GMM_GROUPS_PER_CALL]
        start, stop = chunk[0][1], chunk[-1][2]
        weights = [_fp4_weight_kn(packed[i], sf[i]) for i, _, _ in chunk]
        ends = [e - start for _, _, e in chunk]
        results.append((start, stop, _gmm(op, a[start:stop], weights, ends)))
    for start, stop, y in results:  # write only after every operator call returned (a fallback starts clean)
        out[start:stop] = y
    return out


__all__ = [
    "GMM_GROUPS_PER_CALL",
    "Unsupported",
    "bf16_gemm_nt",
    "grouped_gemm_nt_bf16",
    "m_grouped_bf16_fp4_gemm_nt_contiguous",
]
