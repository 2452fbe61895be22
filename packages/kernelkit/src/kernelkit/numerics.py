"""Numerical comparison helpers: DeepGEMM-style diff, norm-relative asserts, poisoning, format tolerances.

Tolerances are derived from the number format (its machine epsilon), never picked by hand: a kernel
that rounds its result to bf16 once is within ~u_bf16 = 2^-8 of the exact value in relative norm.
"""

from __future__ import annotations

import math

import torch

# Machine epsilon (gap between 1 and the next representable number) of the formats kernels use.
# e2m1 (FP4) has one mantissa bit: 1.0 -> 1.5.
_EPS: dict[str, float] = {
    "fp64": 2.0**-52,
    "fp32": 2.0**-23,
    "tf32": 2.0**-10,
    "fp16": 2.0**-10,
    "bf16": 2.0**-7,
    "e4m3": 2.0**-3,
    "e5m2": 2.0**-2,
    "e2m1": 2.0**-1,
}
_ALIASES: dict[str, str] = {"fp8": "e4m3", "fp4": "e2m1", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "fp64",
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
}


def _fmt_name(fmt: str | torch.dtype) -> str:
    """Canonical format name of ``fmt`` (a torch dtype or a name like "bf16", "e4m3", "fp4")."""
    if isinstance(fmt, torch.dtype):
        if fmt not in _DTYPES:
            raise ValueError(f"fmt: expected a floating dtype among {list(_DTYPES)}, got {fmt}")
        return _DTYPES[fmt]
    if not isinstance(fmt, str):
        raise TypeError(f"fmt: expected str or torch.dtype, got {type(fmt).__name__}")
    name = _ALIASES.get(fmt.lower(), fmt.lower())
    if name not in _EPS:
        raise ValueError(f"fmt: expected one of {sorted(_EPS) + sorted(_ALIASES)}, got {fmt!r}")
    return name


def format_eps(fmt: str | torch.dtype) -> float:
    """Machine epsilon of ``fmt`` (e.g. bf16: 2^-7, fp32: 2^-23, e4m3: 2^-3, e2m1: 2^-1)."""
    return _EPS[_fmt_name(fmt)]


def unit_roundoff(fmt: str | torch.dtype) -> float:
    """Largest relative error of one round-to-nearest into ``fmt``: eps / 2."""
    return format_eps(fmt) / 2


def rounding_tol(fmt: str | torch.dtype, roundings: int = 1, safety: float = 2.0) -> float:
    """Norm-relative tolerance for a result that went through ``roundings`` roundings into ``fmt``.

    Each rounding adds at most u = eps/2 relative error per element, so the norm-relative error is at
    most roundings * u; ``safety`` covers the reference's own rounding and fp32 accumulation.
    """
    if roundings < 1:
        raise ValueError(f"roundings: expected >= 1, got {roundings}")
    if not safety >= 1:
        raise ValueError(f"safety: expected >= 1, got {safety}")
    return safety * roundings * unit_roundoff(fmt)


def accum_tol(k: int, fmt: str | torch.dtype = "fp32", safety: float = 4.0) -> float:
    """Norm-relative tolerance of a length-``k`` sum accumulated in ``fmt`` with random-sign inputs.

    Rounding errors of independent terms grow like sqrt(k) * u (the probabilistic bound of Higham and
    Mary, 2019), not k * u; ``safety`` covers the tail of that distribution.
    """
    if k < 1:
        raise ValueError(f"k: expected >= 1, got {k}")
    return safety * math.sqrt(k) * unit_roundoff(fmt)


def _check_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected torch.Tensor, got {type(t).__name__}")
    return t


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity distance 1 - 2*sum(x*y) / sum(x*x + y*y), computed in float64.

    x, y: same shape, any floating dtype and device. 0 means identical; it scales like the squared
    relative error (a 1e-3 relative error gives about 5e-7). Two all-zero tensors give 0.
    """
    xd = _check_tensor("x", x).detach().to(torch.float64)
    yd = _check_tensor("y", y).detach().to(torch.float64)
    if xd.shape != yd.shape:
        raise ValueError(f"y: expected shape {tuple(xd.shape)} (that of x), got {tuple(yd.shape)}")
    denom = float((xd * xd + yd * yd).sum())
    if denom == 0.0:
        return 0.0
    return 1.0 - 2.0 * float((xd * yd).sum()) / denom


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_2 / ||ref||_2 in float64 (inf when ref is all zero and out is not, nan on NaN)."""
    od = _check_tensor("out", out).detach().to(torch.float64)
    rd = _check_tensor("ref", ref).detach().to(torch.float64)
    num = float(torch.linalg.vector_norm(od - rd))
    den = float(torch.linalg.vector_norm(rd))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def assert_close_rel(out: torch.Tensor, ref: torch.Tensor, rtol_norm: float, *, name: str = "out") -> float:
    """Assert ||out - ref|| / ||ref|| <= rtol_norm (2-norm over all elements, float64); return the error.

    out, ref: same shape; dtypes may differ (out bf16, ref fp32). Any NaN or inf in either fails,
    so a poisoned output the kernel never wrote cannot pass. Raises AssertionError naming ``name``.
    """
    if not (isinstance(rtol_norm, (int, float)) and 0 < rtol_norm < math.inf):
        raise ValueError(f"rtol_norm: expected a positive finite number, got {rtol_norm!r}")
    _check_tensor("out", out)
    _check_tensor("ref", ref)
    if out.shape != ref.shape:
        raise AssertionError(f"{name}: shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    for label, t in (("out", out), ("ref", ref)):
        bad = int((~torch.isfinite(t.detach().to(torch.float64))).sum())
        if bad:
            raise AssertionError(f"{name}: {bad} non-finite values in {label} (of {t.numel()})")
    err = rel_err(out, ref)
    if not err <= rtol_norm:
        diff = (out.detach().to(torch.float64) - ref.detach().to(torch.float64)).abs()
        where = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)) if diff.numel() else ()
        raise AssertionError(
            f"{name}: relative error {err:.3e} > {rtol_norm:.3e}; largest |diff| {float(diff.max()):.3e} at {where}"
        )
    return err


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` in place with values a kernel never produces: NaN for floating dtypes (0xFF bytes in
    the fp8 / e8m0 formats), all-ones bits (-1, or the max of unsigned types) for integers, True for bool.
    Returns ``t``."""
    _check_tensor("t", t)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        if t.element_size() == 1:  # fp8 / e8m0: 0xFF is NaN in each of them; fill_ of NaN is unsupported
            t.view(torch.uint8).fill_(0xFF)
        else:
            t.fill_(math.nan)
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        info = torch.iinfo(t.dtype)
        t.fill_(-1 if info.min < 0 else info.max)
    return t


def poison_like(t: torch.Tensor) -> torch.Tensor:
    """A new tensor shaped, typed and placed like ``t``, filled by ``poison_`` (NaN / 0xFF bytes)."""
    return poison_(torch.empty_like(_check_tensor("t", t)))


def poisoned_mask(t: torch.Tensor) -> torch.Tensor:
    """Bool mask of elements of ``t`` still holding ``poison_``'s fill (NaN for floats, the fill for ints)."""
    _check_tensor("t", t)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        if t.element_size() == 1:
            return t.view(torch.uint8) == 0xFF
        return torch.isnan(t)
    return t == poison_(torch.empty((), dtype=t.dtype, device=t.device))
