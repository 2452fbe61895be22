"""The Ascend path of deep_select (`backends/ascend/`) on a machine without an NPU.

NO NPU RUN WAS MADE: these CPU tests check the mapping only. Every deep_select op stays on the reference on
Ascend (reasons in `backends/ascend/__init__.py`), so the tests check that (1) every public op is mapped and
documented, (2) with torch_npu absent `dispatch(op)` is the reference and gives its results on random inputs
(ties, NaN and -inf included), and (3) a fake `torch_npu` that has `npu_lightning_indexer` / `npu_top_k` is
never called: the tie rule cannot depend on an NPU operator.
"""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch

from deepinfer.deep_select import api
from deepinfer.deep_select import reference as ref
from deepinfer.deep_select.backends import ascend
from deepinfer.deep_select.backends.ascend import _core

PUBLIC_OPS = sorted(n for n in api.__all__ if inspect.isfunction(getattr(api, n)))


def _scores(b: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(b, n, generator=g)
    s = torch.where(torch.rand(b, n, generator=g) < 0.3, s.round(), s)  # many exact ties
    s[0, 3], s[1, 5] = float("nan"), float("-inf")
    return s


def _cases() -> dict[str, tuple]:
    g = torch.Generator().manual_seed(3)
    t, h, d, n = 4, 8, 32, 40
    q = torch.randn(t, h, d, generator=g).bfloat16()
    w = torch.rand(t, h, generator=g) + 0.1
    keys = torch.randn(n, d, generator=g).bfloat16()
    visible = torch.tensor([0, 7, 40, 23], dtype=torch.int32)
    table = torch.tensor([[4, 0, 2, 1, 3]], dtype=torch.int32)
    return {
        "topk": (_scores(3, 50, 1), 8, torch.tensor([50, 20, 3], dtype=torch.int32), True),
        "topk_ragged": (_scores(3, 50, 2), 16, torch.tensor([0, 10, 30]), torch.tensor([50, 12, 49]), True),
        "indexer_scores": (q, w, keys),
        "indexer_topk": (q, w, keys, 12, visible, None, table, 8),
        "indexer_topk_scores": (q, w, keys, visible, None, table, 8),
    }


class FakeNpu(types.ModuleType):
    """A torch_npu with the selection operators present; any call is an error."""

    def __init__(self) -> None:
        super().__init__("torch_npu")

    def npu_lightning_indexer(self, *a: object, **k: object) -> None:
        raise AssertionError("deep_select must not call npu_lightning_indexer")

    def npu_top_k(self, *a: object, **k: object) -> None:
        raise AssertionError("deep_select must not call npu_top_k")


def _same(a: object, b: object) -> None:
    if isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif a is None:
        assert b is None
    else:
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.nan_to_num(0.5), b.nan_to_num(0.5))


def test_every_public_op_is_mapped() -> None:
    missing = [n for n in PUBLIC_OPS if n not in ascend.OPS]
    assert not missing, f"ops without an Ascend entry: {missing}"
    for name, entry in ascend.OPS.items():
        assert entry.note and entry.adapter is None and entry.reference is getattr(ref, name)
    assert all(f"`{n}`" in ascend.markdown_table(ascend.OPS) for n in PUBLIC_OPS)
    with pytest.raises(KeyError, match="op_name"):
        ascend.dispatch("sort")


@pytest.mark.parametrize("name", sorted(_cases()))
def test_falls_back_to_reference_without_torch_npu(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # `import torch_npu` raises ImportError
    args = _cases()[name]
    fn = ascend.dispatch(name)
    assert fn is getattr(ref, name)
    _same(fn(*args), getattr(ref, name)(*args))


@pytest.mark.parametrize("name", sorted(_cases()))
def test_npu_selection_operators_are_never_called(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", FakeNpu())
    monkeypatch.setattr(_core, "NPU_DEVICE_TYPES", {"npu", "cpu"})
    args = _cases()[name]
    _same(ascend.dispatch(name)(*args), getattr(ref, name)(*args))


def test_tie_rule_through_dispatch() -> None:
    """All-equal rows: the lower column wins, whatever the device's TopK would do with ties."""
    s = torch.full((2, 10), 0.37)
    idx, vals = ascend.dispatch("topk")(s, 4, None, True)
    assert idx.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]] and torch.equal(vals, torch.full((2, 4), 0.37))
