"""Argument checks of the Buffer methods (metadata only: no tensor values are read here)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT_X = (torch.bfloat16, torch.float16, torch.float32)
SCALES = (torch.float32, torch.float8_e8m0fnu)
TOPK_IDX = (torch.int64, torch.int32)


def check_tensor(name: str, t: object, dtypes: Sequence[torch.dtype], shape: Sequence[int | None]) -> torch.Tensor:
    """Check that `t` is a tensor of one of `dtypes` with `shape` (None = any size); return it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.dim() != len(shape) or any(w is not None and w != g for w, g in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {tuple(t.shape)}")
    return t


def check_int(name: str, v: object, minimum: int) -> int:
    """Check that `v` is an int (not a bool) >= minimum; return it."""
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {v}")
    return v


def check_num_experts(num_experts: object, world_size: int) -> int:
    """num_experts must be a positive multiple of the world size (experts split evenly over ranks)."""
    check_int("num_experts", num_experts, 1)
    if num_experts % world_size != 0:
        raise ValueError(f"num_experts: expected a multiple of the world size {world_size}, got {num_experts}")
    return num_experts


def check_x(x: object) -> int:
    """Check a dispatch payload and return its token count.

    x: [t, hidden] bfloat16 / float16 / float32, or a pair (float8_e4m3fn [t, hidden],
    scales float32 | float8_e8m0fnu [t, ceil(hidden/128)]).
    """
    if isinstance(x, tuple):
        if len(x) != 2:
            raise TypeError(f"x: expected a tensor or an (fp8 values, scales) pair, got a tuple of {len(x)}")
        check_tensor("x[0]", x[0], (torch.float8_e4m3fn,), [None, None])
        t, hidden = x[0].shape
        check_tensor("x[1] (scales)", x[1], SCALES, [t, -(-hidden // 128)])
        check_same_device(x_values=x[0], x_scales=x[1])
        return t
    check_tensor("x", x, FLOAT_X, [None, None])
    return x.shape[0]


def x_device(x: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> torch.device:
    """Device of a dispatch payload."""
    return x[0].device if isinstance(x, tuple) else x.device


def check_topk(
    topk_idx: object, topk_weights: object | None, num_tokens: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """topk_idx int64 | int32 [t, k] (-1 = masked slot); topk_weights float32 [t, k] when given."""
    idx = check_tensor("topk_idx", topk_idx, TOPK_IDX, [num_tokens, None])
    if topk_weights is None:
        return idx, None
    w = check_tensor("topk_weights", topk_weights, (torch.float32,), list(idx.shape))
    return idx, w


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """Raise ValueError when the given tensors (None ignored) are not all on one device."""
    present = {k: v.device for k, v in tensors.items() if v is not None}
    if len(set(present.values())) > 1:
        raise ValueError(
            "all tensors must be on one device, got " + ", ".join(f"{k} on {d}" for k, d in present.items())
        )
