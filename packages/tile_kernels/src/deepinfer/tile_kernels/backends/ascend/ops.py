"""torch_npu-backed adapters of tile_kernels ops (each has the reference's signature and contract).

Every adapter computes in fp32 like the reference (inputs are upcast before the NPU operator and the result is
rounded once to the input dtype), so the NPU operator's internal precision for bf16 cannot change the result.
"""

from __future__ import annotations

import math

import torch

from ...ref import quant as _quant
from ._core import Unsupported, npu_op, on_npu, require

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
ROPE_MODES = ("interleave", "half")
"""Order in which `apply_rope_interleaved` tries npu_rotary_mul's modes ("interleave" needs a newer torch_npu)."""
_ROPE_MAX_D = 896  # npu_rotary_mul: D < 896
_ROPE_MAX_BN = 1000  # npu_rotary_mul: B * N < 1000


def _float_inputs(*tensors: torch.Tensor | None) -> None:
    """Adapters take NPU fp16/bf16/fp32 tensors without autograd (the reference stays differentiable)."""
    on_npu(*tensors)
    given = [t for t in tensors if t is not None]
    require(all(t.dtype in _FLOATS for t in given), "dtype not fp16/bf16/fp32")
    require(all(t.numel() > 0 for t in given), "empty tensor")
    require(not (torch.is_grad_enabled() and any(t.requires_grad for t in given)), "autograd wanted")


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """torch_npu.npu_rms_norm(x fp32, gamma fp32 [d], epsilon=eps)[0] -> x.dtype. x [..., d] (1-8 dims)."""
    _float_inputs(x, weight)
    require(1 <= x.dim() <= 8, "npu_rms_norm takes 1-8 dims")
    op = npu_op("npu_rms_norm")
    # gamma must share x's dtype; fp32 for both keeps the reference's fp32 math. No weight: gamma = 1 (exact).
    gamma = weight.float() if weight is not None else torch.ones(x.shape[-1], dtype=torch.float32, device=x.device)
    y = op(x.float().contiguous(), gamma.contiguous(), epsilon=float(eps))[0]
    return y.to(x.dtype)


def _rope_interleave(op, rot: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """npu_rotary_mul in "interleave" mode: r1/r2 repeat each pair's cos/sin twice (c0 c0 c1 c1 ...)."""
    shape = (1, rot.shape[1], 1, rot.shape[-1])
    r1 = c.repeat_interleave(2, dim=-1).reshape(shape)
    r2 = s.repeat_interleave(2, dim=-1).reshape(shape)
    return op(rot, r1, r2, rotary_mode="interleave")


def _rope_half(op, rot: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """npu_rotary_mul in "half" mode around an exact permutation: pairs (2k, 2k+1) -> (k, k + d/2) and back."""
    h = rot.shape[-1] // 2
    shape = (1, rot.shape[1], 1, 2 * h)
    xh = torch.cat((rot[..., 0::2], rot[..., 1::2]), dim=-1)  # de-interleave: evens first, then odds
    r1 = torch.cat((c, c), dim=-1).reshape(shape)
    r2 = torch.cat((s, s), dim=-1).reshape(shape)
    out = op(xh, r1, r2)  # rotary_mode defaults to "half" in every torch_npu version (older ones lack the kwarg)
    return torch.stack((out[..., :h], out[..., h:]), dim=-1).flatten(-2)  # re-interleave


def apply_rope_interleaved(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int, inverse: bool = False
) -> torch.Tensor:
    """torch_npu.npu_rotary_mul on the last rope_dim dims viewed BSND [1, t, N, rope_dim] (N = product of the
    middle dims), r1/r2 [1, t, 1, rope_dim] fp32; "interleave" mode, else "half" mode around a permutation."""
    _float_inputs(x, cos, sin)
    require(x.dim() >= 2, "x needs a token dim and a feature dim")
    t = x.shape[0]
    heads = math.prod(x.shape[1:-1])
    require(heads < _ROPE_MAX_BN and rope_dim < _ROPE_MAX_D, "outside npu_rotary_mul's B*N < 1000, D < 896")
    op = npu_op("npu_rotary_mul")
    rot = x[..., -rope_dim:].float().contiguous().reshape(1, t, heads, rope_dim)
    c, s = cos.float(), sin.float()
    if inverse:
        s = -s
    out = _rotate(op, rot, c, s)
    out = out.reshape(*x.shape[:-1], rope_dim).to(x.dtype)
    return torch.cat((x[..., :-rope_dim], out), dim=-1)


_rope_mode_ok: list[str] = []  # the mode that worked last (tried first, so a rejected mode costs one failure)


def _rotate(op, rot: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """Try the modes in ROPE_MODES order; an operator rejecting "interleave" (old torch_npu) falls to "half"."""
    err: Exception | None = None
    for mode in dict.fromkeys([*_rope_mode_ok, *ROPE_MODES]):
        try:
            out = _rope_interleave(op, rot, c, s) if mode == "interleave" else _rope_half(op, rot, c, s)
        except (TypeError, RuntimeError) as exc:
            err = exc
            continue
        _rope_mode_ok[:] = [mode]
        return out
    assert err is not None
    raise err


def swiglu_clamp(gate: torch.Tensor, up: torch.Tensor, limit: float | None = 10.0) -> torch.Tensor:
    """torch_npu.npu_swiglu(cat(min(gate, limit), clamp(up, -limit, limit)) fp32, dim=-1) -> gate.dtype.

    npu_swiglu computes A * sigmoid(A) * B over the two halves of its last dim (A first), which is
    silu(gate) * up; the clamp is applied before, in fp32, exactly as the reference does.
    """
    _float_inputs(gate, up)
    require(limit is None or (isinstance(limit, (int, float)) and not isinstance(limit, bool)), "tensor limit")
    require(gate.dim() <= 8, "npu_swiglu takes 1-8 dims")
    op = npu_op("npu_swiglu")
    g, u = gate.float(), up.float()
    if limit is not None:
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
    return op(torch.cat((g, u), dim=-1), dim=-1).to(gate.dtype)


def swiglu_clamp_fp8(
    gate: torch.Tensor, up: torch.Tensor, limit: float | None = 10.0, group_size: int = 128, scale_fmt: str = "ue8m0"
) -> tuple[torch.Tensor, torch.Tensor]:
    """`swiglu_clamp` (npu_swiglu) rounded to gate.dtype, then the reference's bit-exact FP8 quantiser."""
    return _quant.per_token_group_quant_fp8(swiglu_clamp(gate, up, limit), group_size, scale_fmt)


def kv_norm_rope_quant(
    kv: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope_dim: int = 64,
    eps: float = 1e-6,
    quant_block: int | None = 64,
    out: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """npu_rms_norm then npu_rotary_mul (both rounding to kv.dtype, as the reference composes them), then the
    reference's FP8 quant-dequant of dims [0, d - rope_dim) and the cache write."""
    if out is not None:
        on_npu(out)
    y = apply_rope_interleaved(rms_norm(kv, weight, eps), cos, sin, rope_dim)
    if quant_block is not None:
        nope = kv.shape[-1] - rope_dim
        y = torch.cat((_quant.fp8_quant_dequant_ue8m0(y[..., :nope], quant_block), y[..., nope:]), dim=-1)
    if out is None:
        return y
    idx = torch.arange(kv.shape[0], device=kv.device) if rows is None else rows.long()
    keep = idx >= 0
    out[idx[keep]] = y[keep].to(out.dtype)
    return out


__all__ = [
    "Unsupported",
    "apply_rope_interleaved",
    "kv_norm_rope_quant",
    "rms_norm",
    "swiglu_clamp",
    "swiglu_clamp_fp8",
]
