"""Test helpers for deep_select: adversarial score generators and a top-k property checker.

The checker is written from the contract (api.py docstring), not from the reference's integer-key trick:
it compares values in float64 (exact for fp32/bf16/fp16), treats NaN as ranking below -inf, and checks the
lower-index tie rule on the boundary value.
"""

from __future__ import annotations

import torch

DISTRIBUTIONS = (
    "normal",
    "normal_big",
    "normal_small",
    "bits_tiny",
    "bits_mid",
    "inf",
    "nan_hot",
    "all_equal",
    "few_values",
)
_BITS_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _raw_bits(b: int, n: int, hi: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Random bit patterns 0..hi-1 with a random sign bit: denormals, +-0 and many exact ties."""
    itype = _BITS_VIEW[dtype]
    sign_bit = -(2**31) if itype == torch.int32 else -(2**15)
    mag = torch.randint(0, hi, (b, n), generator=g, dtype=torch.int64)
    neg = torch.rand(b, n, generator=g) < 0.5
    bits = torch.where(neg, mag | sign_bit, mag)
    return bits.to(itype).view(dtype)


def make_scores(dist: str, b: int, n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """[b, n] scores of the named distribution in dtype (fresh random values, never all zeros)."""
    if dist.startswith("bits_"):
        return _raw_bits(b, n, 0x20 if dist == "bits_tiny" else 0x1000, dtype, g)
    x = torch.randn(b, n, generator=g)
    if dist == "normal_big":
        x = x * 1e4 + 3e3
    elif dist == "normal_small":
        x = x * 1e-4
    elif dist == "inf":
        r = torch.rand(b, n, generator=g)
        x = torch.where(r < 0.1, float("inf"), torch.where(r > 0.85, float("-inf"), x))
    elif dist == "nan_hot":
        # Runs of NaN ("hot spots") plus scattered single NaNs.
        start = torch.randint(0, max(n, 1), (b, 1), generator=g)
        col = torch.arange(n)[None, :]
        hot = (col >= start) & (col < start + max(1, n // 4))
        x = torch.where(hot | (torch.rand(b, n, generator=g) < 0.05), float("nan"), x)
    elif dist == "all_equal":
        x = torch.randn(b, 1, generator=g).expand(b, n).clone()
    elif dist == "few_values":
        x = torch.randint(-2, 3, (b, n), generator=g).float() * 0.75
    return x.to(dtype)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(_BITS_VIEW[x.dtype])


def _rank_key(v: float) -> tuple[int, float]:
    """Total order of the contract: NaN below everything, then numeric (-0.0 == +0.0)."""
    return (0, 0.0) if v != v else (1, v)


def _check_ties(row: torch.Tensor, mask: torch.Tensor) -> None:
    """Entries equal to the boundary value: every chosen one has a lower index than every unchosen one."""
    nan = torch.isnan(row)
    cols = torch.arange(row.numel())
    sel_ok, uns_ok = mask & ~nan, ~mask & ~nan
    assert not ((nan & mask).any() and uns_ok.any()), "NaN chosen while a non-NaN entry was left out"
    if sel_ok.any() and uns_ok.any():
        lo, hi = row[sel_ok].min(), row[uns_ok].max()
        assert lo >= hi, f"min(selected)={lo.item()} < max(unselected)={hi.item()}"
        if lo == hi:
            tie = row == lo
            assert cols[tie & mask].max() < cols[tie & ~mask].min(), "tie at boundary not broken by lower index"
    if (nan & mask).any() and (nan & ~mask).any():
        assert cols[nan & mask].max() < cols[nan & ~mask].min(), "NaN ties not broken by lower index"


def _check_sorted(row: torch.Tensor, chosen: torch.Tensor, pad: torch.Tensor) -> None:
    """Descending by (rank key, then ascending index), padding at the end."""
    n_sel = int((~pad).sum())
    assert not pad[:n_sel].any(), "sorted output has padding before a chosen entry"
    keys = [(_rank_key(row[c].item()), -int(c)) for c in chosen.tolist()]
    assert keys == sorted(keys, reverse=True), "sorted=True output is not in descending order"


def check_topk(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None,
    idx: torch.Tensor,
    vals: torch.Tensor | None,
    is_sorted: bool,
) -> None:
    """Assert every property of the contract for one topk result."""
    b, n = scores.shape
    assert idx.dtype == torch.int32 and tuple(idx.shape) == (b, k)
    for r in range(b):
        valid = n if lengths is None else min(max(int(lengths[r]), 0), n)
        row = scores[r, :valid].double()
        pad = idx[r] == -1
        assert int((~pad).sum()) == min(k, valid), f"row {r}: {int((~pad).sum())} chosen, want {min(k, valid)}"
        chosen = idx[r][~pad].long()
        assert bool(((chosen >= 0) & (chosen < valid)).all()), f"row {r}: index out of [0, {valid})"
        assert chosen.unique().numel() == chosen.numel(), f"row {r}: duplicate indices"
        if vals is not None:
            assert vals.dtype == scores.dtype
            assert torch.equal(_bits(vals[r][~pad]), _bits(scores[r, chosen])), f"row {r}: values != input"
            assert bool((vals[r][pad] == float("-inf")).all()), f"row {r}: padding value is not -inf"
        mask = torch.zeros(valid, dtype=torch.bool)
        mask[chosen] = True
        _check_ties(row, mask)
        if is_sorted:
            _check_sorted(scores[r].double(), chosen, pad)
