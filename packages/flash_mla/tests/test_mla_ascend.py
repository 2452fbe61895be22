"""The Ascend path of flash_mla (`backends/ascend/`) on a machine without an NPU.

NO NPU RUN WAS MADE: these CPU tests check the mapping only. Every flash_mla op stays on the reference on
Ascend (reasons in `backends/ascend/__init__.py`: npu_sparse_flash_attention has no sink and no lse), so the tests
check that (1) every public op is mapped and documented, (2) with torch_npu absent `dispatch(op)` is the reference
and gives its results on random inputs (-1 holes, NaN in unused slots, a sink, both cache formats), and (3) a fake
`torch_npu` with `npu_sparse_flash_attention` present is never called.
"""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch

from deepinfer.flash_mla import api
from deepinfer.flash_mla import reference as ref
from deepinfer.flash_mla.backends import ascend
from deepinfer.flash_mla.backends.ascend import _core
from deepinfer.flash_mla.metadata import DecodeMetadata

PUBLIC_OPS = sorted(n for n in api.__all__ if inspect.isfunction(getattr(api, n)))


def _attn_args(fp8: bool) -> tuple:
    g = torch.Generator().manual_seed(5 if fp8 else 4)
    t, h, d, n, k = 3, 4, 512, 24, 6
    q = torch.randn(t, h, d, generator=g).bfloat16()
    kv = torch.randn(n, d, generator=g).bfloat16()
    kv[n - 1] = float("nan")  # an unused slot: must never leak
    cache = ref.pack_fp8_kv_ref(kv[: n - 1]) if fp8 else kv
    idx = torch.randint(0, n - 1, (t, k), generator=g, dtype=torch.int32)
    idx[0, 2], idx[2, :] = -1, -1  # holes, and a row with no valid index
    sink = torch.randn(h, generator=g)
    return q, cache, idx, sink, d**-0.5, None, None


def _cases() -> dict[str, tuple]:
    kv = torch.randn(2, 5, 512, generator=torch.Generator().manual_seed(6))
    return {
        "sparse_attn": _attn_args(False),
        "sparse_attn_prefill": _attn_args(True),
        "sparse_attn_decode": _attn_args(False),
        "pack_fp8_kv": (kv,),
        "unpack_fp8_kv": (ref.pack_fp8_kv_ref(kv), torch.float32),
        "get_decode_metadata": (2, 2, 64, 640, 0, None),
    }


class FakeNpu(types.ModuleType):
    """A torch_npu with the attention operators present; any call is an error."""

    def __init__(self) -> None:
        super().__init__("torch_npu")

    def npu_sparse_flash_attention(self, *a: object, **k: object) -> None:
        raise AssertionError("flash_mla must not call npu_sparse_flash_attention (no sink, no lse)")

    def npu_fused_infer_attention_score(self, *a: object, **k: object) -> None:
        raise AssertionError("flash_mla must not call npu_fused_infer_attention_score")


def _same(a: object, b: object) -> None:
    if isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.nan_to_num(0.5, 3.0, -3.0), b.nan_to_num(0.5, 3.0, -3.0))
    else:
        assert a == b


def test_every_public_op_is_mapped() -> None:
    missing = [n for n in PUBLIC_OPS if n not in ascend.OPS]
    assert not missing, f"ops without an Ascend entry: {missing}"
    for entry in ascend.OPS.values():
        assert entry.note and entry.adapter is None
    assert ascend.OPS["get_decode_metadata"].reference is DecodeMetadata
    assert all(f"`{n}`" in ascend.markdown_table(ascend.OPS) for n in PUBLIC_OPS)


@pytest.mark.parametrize("name", sorted(_cases()))
def test_falls_back_to_reference_without_torch_npu(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # `import torch_npu` raises ImportError
    args, entry = _cases()[name], ascend.OPS[name]
    fn = ascend.dispatch(name)
    assert fn is entry.reference
    _same(fn(*args), entry.reference(*args))


@pytest.mark.parametrize("name", ["sparse_attn", "sparse_attn_prefill"])
def test_attention_operators_are_never_called(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", FakeNpu())
    monkeypatch.setattr(_core, "NPU_DEVICE_TYPES", {"npu", "cpu"})
    args = _cases()[name]
    out, lse = ascend.dispatch(name)(*args)
    _same((out, lse), ref.sparse_attn(*args))
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.equal(
        lse[2], args[3]
    )  # empty row: o = 0, lse = sink
    assert torch.isfinite(out).all()  # the NaN slot was never read
