"""Argument checks shared by the public GEMM functions.

Only metadata is checked here (type, dtype, rank, shape, device, contiguity): these checks cost no device
synchronisation, so a fast path can run behind them. Checks that read tensor values (index ranges) live in
the reference, which reads the values anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

FP8 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
SCALE_DTYPES = (torch.float32, E8M0)
FP4_PACKED = torch.int8


def ceil_div(x: int, y: int) -> int:
    """Return ceil(x / y) for non-negative x and positive y."""
    return -(-x // y)


def _fmt_dtypes(dtypes: Sequence[torch.dtype]) -> str:
    return " or ".join(str(d) for d in dtypes)


def check_tensor(
    name: str,
    t: object,
    dtypes: Sequence[torch.dtype],
    shape: Sequence[int | None],
    *,
    contiguous: bool = True,
) -> torch.Tensor:
    """Check that `t` is a tensor with one of `dtypes` and `shape` (None = any size); return it.

    Raises TypeError for a non-tensor or wrong dtype, ValueError for a wrong rank, size or layout.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_fmt_dtypes(dtypes)}, got {t.dtype}")
    if t.dim() != len(shape):
        raise ValueError(f"{name}: expected {len(shape)} dims {_fmt_shape(shape)}, got shape {tuple(t.shape)}")
    for want, got in zip(shape, t.shape):
        if want is not None and want != got:
            raise ValueError(f"{name}: expected shape {_fmt_shape(shape)}, got {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous (row-major) tensor, got strides {t.stride()}")
    return t


def _fmt_shape(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_pair(name: str, pair: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Check that `pair` is a (values, scales) 2-sequence of tensors and return it as a tuple."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"{name}: expected a (tensor, scale_factors) pair, got {type(pair).__name__}")
    for i, t in enumerate(pair):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}[{i}]: expected a torch.Tensor, got {type(t).__name__}")
    return pair[0], pair[1]


def check_fp8_act(name: str, pair: object, lead: tuple[int | None, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Check an FP8 activation pair: float8_e4m3fn [*lead, m, k] with scales [*lead, m, ceil(k/128)]."""
    a, sfa = check_pair(name, pair)
    check_tensor(name, a, (FP8,), [*lead, None, None])
    lead = tuple(a.shape[:-2])
    m, k = a.shape[-2], a.shape[-1]
    check_tensor(f"{name} scales", sfa, SCALE_DTYPES, [*lead, m, ceil_div(k, 128)])
    return a, sfa


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """Raise ValueError when the given tensors (None entries ignored) are not all on one device."""
    present = {k: v.device for k, v in tensors.items() if v is not None}
    if len(set(present.values())) > 1:
        listing = ", ".join(f"{k} on {d}" for k, d in present.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def check_k(name_a: str, k_a: int, name_b: str, k_b: int) -> None:
    """Raise ValueError when the reduction sizes of the two operands differ."""
    if k_a != k_b:
        raise ValueError(f"K mismatch: {name_a} has K={k_a} but {name_b} has K={k_b}")


def check_weight_scales(name: str, b: torch.Tensor, sfb: torch.Tensor, lead: tuple[int | None, ...]) -> int:
    """Check a weight operand `b` and its scales `sfb`; return the logical K.

    Two formats are accepted, told apart by `b.dtype`:
      * FP8: b float8_e4m3fn [*lead, n, k], sfb float32 or float8_e8m0fnu [*lead, ceil(n/128), ceil(k/128)];
      * FP4: b int8 [*lead, n, k/2] (two e2m1 codes a byte, low nibble first),
        sfb float8_e8m0fnu or float32 [*lead, n, k/32].
    """
    check_tensor(name, b, (FP8, FP4_PACKED), [*lead, None, None])
    lead = tuple(b.shape[:-2])  # the scales must match b's leading (group) sizes, also where lead had None
    n, kb = b.shape[-2], b.shape[-1]
    if b.dtype == FP8:
        check_tensor(f"{name} scales", sfb, SCALE_DTYPES, [*lead, ceil_div(n, 128), ceil_div(kb, 128)])
        return kb
    k = 2 * kb
    if k % 32 != 0:
        raise ValueError(f"{name}: FP4 weights need K % 32 == 0 (K = 2 * {kb} = {k})")
    check_tensor(f"{name} scales", sfb, SCALE_DTYPES, [*lead, n, k // 32])
    return k


def check_out(
    out: torch.Tensor | None, shape: Sequence[int], dtypes: Sequence[torch.dtype], ref: torch.Tensor
) -> torch.Tensor | None:
    """Check a caller-provided output buffer (same device as `ref`); None passes through."""
    if out is None:
        return None
    check_tensor("out", out, dtypes, list(shape))
    check_same_device(a=ref, out=out)
    return out
