"""deep_select.topk / topk_ragged: hypothesis property tests plus pinned edge cases.

The property tests run twice on CPU: through the reference and, with TRITON_INTERPRET=1, through the Triton
kernels (backend forced to "triton"); the `gpu` ones run the API on CUDA tensors (the Triton path there).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from unittest import mock

import pytest
import torch
from ds_checks import DISTRIBUTIONS, check_topk, make_scores
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer.deep_select import _backend, api, backend

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_SIZES = st.one_of(st.integers(1, 80), st.sampled_from([255, 511, 512, 513, 1000, 2048, 4096]))


@st.composite
def topk_case(draw: st.DrawFn) -> dict:
    n = draw(_SIZES)
    k = draw(st.sampled_from([1, 64, 512, n, n + draw(st.integers(1, 40))]))
    b = draw(st.integers(1, 4))
    mode = draw(st.sampled_from(["none", "random", "edges"]))
    return dict(
        b=b, n=n, k=k, lengths_mode=mode, dist=draw(st.sampled_from(DISTRIBUTIONS)),
        dtype=draw(st.sampled_from(DTYPES)), sorted=draw(st.booleans()), values=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )  # fmt: skip


def _lengths(mode: str, b: int, n: int, g: torch.Generator) -> torch.Tensor | None:
    if mode == "none":
        return None
    if mode == "random":
        return torch.randint(0, n + 1, (b,), generator=g, dtype=torch.int32)
    # Out-of-range lengths are clamped to [0, n] by contract.
    return torch.tensor([-3, 0, n, n + 7][:b], dtype=torch.int32)


_triton_interp = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton path on CPU needs TRITON_INTERPRET=1"
)


@contextlib.contextmanager
def _path(name: str) -> Iterator[None]:
    """Run the API through `name` ("reference" or "triton", forced through the backend variable)."""
    with mock.patch.dict(os.environ, {_backend.ENV_VAR: name}):
        assert backend("cpu") == name
        yield


def _check_properties(case: dict) -> None:
    g = torch.Generator().manual_seed(case["seed"])
    scores = make_scores(case["dist"], case["b"], case["n"], case["dtype"], g)
    lengths = _lengths(case["lengths_mode"], case["b"], case["n"], g)
    res = api.topk(scores, case["k"], lengths=lengths, sorted=case["sorted"], return_values=case["values"])
    idx, vals = res if case["values"] else (res, None)
    check_topk(scores, case["k"], lengths, idx, vals, case["sorted"])


def _check_ragged(case: dict) -> None:
    g = torch.Generator().manual_seed(case["seed"])
    t, n, k = case["b"], case["n"], case["k"]
    scores = make_scores(case["dist"], t, n, case["dtype"], g)
    starts = torch.randint(-2, n + 1, (t,), generator=g, dtype=torch.int32)
    ends = starts + torch.randint(-1, n + 3, (t,), generator=g, dtype=torch.int32)
    idx, vals = api.topk_ragged(scores, k, starts=starts, ends=ends, sorted=True, return_values=True)
    with _path("reference"):  # the slices' expected results come from the reference
        for r in range(t):
            s, e = int(starts[r]), int(ends[r])
            lo, hi = max(s, 0), min(max(e, 0), n)
            sub = scores[r : r + 1, lo:hi] if hi > lo else scores[r : r + 1, :0]
            want_idx, want_vals = api.topk(sub, k, sorted=True, return_values=True)
            # Column c of the slice is column lo + c of the row: relative id = lo + c - s.
            want_idx = torch.where(want_idx >= 0, want_idx + (lo - s), -1)
            assert torch.equal(idx[r], want_idx[0])
            assert torch.equal(vals[r].isnan(), want_vals[0].isnan())
            assert torch.equal(vals[r].nan_to_num(), want_vals[0].nan_to_num())


@settings(max_examples=150, deadline=None, database=None)
@given(topk_case())
def test_topk_properties(case: dict) -> None:
    with _path("reference"):
        _check_properties(case)


@settings(max_examples=60, deadline=None, database=None)
@given(topk_case())
def test_topk_ragged_equals_topk_on_slices(case: dict) -> None:
    with _path("reference"):
        _check_ragged(case)


# The Triton interpreter is ~50x slower than the reference: fewer examples, same generator.
@_triton_interp
@settings(max_examples=30, deadline=None, database=None)
@given(topk_case())
def test_topk_properties_triton(case: dict) -> None:
    with _path("triton"):
        _check_properties(case)


@_triton_interp
@settings(max_examples=15, deadline=None, database=None)
@given(topk_case())
def test_topk_ragged_triton(case: dict) -> None:
    with _path("triton"):
        _check_ragged(case)


def test_ties_lower_index_wins() -> None:
    x = torch.full((2, 1000), 0.3125)
    x[1, ::3] = 2.5  # 334 equal maxima at 0, 3, 6, ...
    idx = api.topk(x, 64, sorted=True)
    assert idx[0].tolist() == list(range(64))
    assert idx[1].tolist() == list(range(0, 192, 3))


def test_signed_zeros_tie() -> None:
    x = torch.tensor([[-0.0, 0.0, -0.0, -1.0, 0.0]], dtype=torch.bfloat16)
    assert api.topk(x, 3, sorted=True).tolist() == [[0, 1, 2]]


def test_nan_below_minus_inf() -> None:
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[nan, -inf, 1.0, nan, inf]])
    assert api.topk(x, 3, sorted=True).tolist() == [[4, 2, 1]]
    idx, vals = api.topk(x, 7, sorted=True, return_values=True)
    assert idx.tolist() == [[4, 2, 1, 0, 3, -1, -1]]
    assert vals[0, 3].isnan() and vals[0, 4].isnan() and bool((vals[0, 5:] == -inf).all())


def test_lengths_and_padding() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 50, generator=g)
    lengths = torch.tensor([50, 10, 0, -5], dtype=torch.int32)
    idx, vals = api.topk(x, 20, lengths=lengths, sorted=True, return_values=True)
    check_topk(x, 20, lengths, idx, vals, True)
    assert idx[1, 10:].eq(-1).all() and idx[2].eq(-1).all() and idx[3].eq(-1).all()
    assert set(idx[1, :10].tolist()) == set(range(10))


@pytest.mark.parametrize("op", ["topk", "ragged"])
def test_out_buffer_poisoned(op: str) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 40, generator=g)
    out = torch.full((3, 64), 0x7F7F7F7F, dtype=torch.int32)
    if op == "topk":
        lengths = torch.tensor([40, 5, 0], dtype=torch.int32)
        got = api.topk(x, 64, lengths=lengths, sorted=True, out=out)
        want = api.topk(x, 64, lengths=lengths, sorted=True)
    else:
        starts, ends = torch.tensor([0, 7, 30], dtype=torch.int32), torch.tensor([40, 20, 30], dtype=torch.int32)
        got = api.topk_ragged(x, 64, starts=starts, ends=ends, sorted=True, out=out)
        want = api.topk_ragged(x, 64, starts=starts, ends=ends, sorted=True)
    assert got is out
    assert torch.equal(out, want)
    assert not (out == 0x7F7F7F7F).any()


def test_strided_scores() -> None:
    g = torch.Generator().manual_seed(3)
    big = torch.randn(6, 300, generator=g)
    x = big[::2, 10:210]  # non-contiguous view
    assert torch.equal(api.topk(x, 17, sorted=True), api.topk(x.contiguous(), 17, sorted=True))


_BAD = [
    (dict(scores=torch.zeros(4, dtype=torch.float32)), ValueError, "scores"),
    (dict(scores=torch.zeros(2, 4, dtype=torch.int32)), TypeError, "scores"),
    (dict(k=0), ValueError, "k"),
    (dict(k=2.0), TypeError, "k"),
    (dict(lengths=torch.zeros(2, dtype=torch.int64)), TypeError, "lengths"),
    (dict(lengths=torch.zeros(3, dtype=torch.int32)), ValueError, "lengths"),
    (dict(out=torch.zeros(2, 5, dtype=torch.int32)), ValueError, "out"),
    (dict(out=torch.zeros(2, 4, dtype=torch.int64)), TypeError, "out"),
]


@pytest.mark.parametrize(("kwargs", "exc", "name"), _BAD)
def test_topk_rejects_bad_arguments(kwargs: dict, exc: type, name: str) -> None:
    args = dict(scores=torch.randn(2, 4), k=4) | kwargs
    with pytest.raises(exc, match=name):
        api.topk(args.pop("scores"), args.pop("k"), **args)


def test_topk_ragged_rejects_bad_arguments() -> None:
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match="ends"):
        api.topk_ragged(x, 2, starts=torch.zeros(2, dtype=torch.int32), ends=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(TypeError, match="starts"):
        api.topk_ragged(x, 2, starts=torch.zeros(2), ends=torch.zeros(2, dtype=torch.int32))
