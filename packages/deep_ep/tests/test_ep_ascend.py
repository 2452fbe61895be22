"""The Ascend path of deep_ep (`backends/ascend/`) on a machine without an NPU.

NO NPU RUN WAS MADE (and no HCCL group was formed): these CPU tests check the mapping only. Every deep_ep op
stays on the reference on Ascend, whose transport is torch.distributed all_to_all_single (HCCL on an NPU; here
world size 1, the local permutation). The tests check that (1) every public op (the Buffer methods and
`per_token_cast_to_fp8`) is mapped and documented, (2) with torch_npu absent `dispatch(op)` is the reference and a
full dispatch -> combine and low-latency round trip through it equals the reference on random routing with -1
holes, and (3) a fake `torch_npu` with the MoE distribute operators present is never called.
"""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch

from deepinfer.deep_ep import Buffer
from deepinfer.deep_ep import reference as ref
from deepinfer.deep_ep import reference_ll as ref_ll
from deepinfer.deep_ep._comm import Comm
from deepinfer.deep_ep.backends import ascend
from deepinfer.deep_ep.backends.ascend import _core

E, T, K, H = 8, 10, 3, 256
BUFFER_OPS = sorted(n for n, f in inspect.getmembers(Buffer, inspect.isfunction) if not n.startswith("_"))


def _routing(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(T, E, generator=g).argsort(dim=1)[:, :K]
    idx[torch.rand(T, K, generator=g) < 0.3] = -1
    idx[4] = -1  # a token routed nowhere
    x = (torch.randn(T, H, generator=g) + 0.05).bfloat16()
    return x, idx, torch.rand(T, K, generator=g) + 0.1


class FakeNpu(types.ModuleType):
    """A torch_npu with the MoE distribute operators present; any call is an error."""

    def __init__(self) -> None:
        super().__init__("torch_npu")

    def npu_moe_distribute_dispatch(self, *a: object, **k: object) -> None:
        raise AssertionError("deep_ep must not call npu_moe_distribute_dispatch")

    def npu_moe_distribute_combine(self, *a: object, **k: object) -> None:
        raise AssertionError("deep_ep must not call npu_moe_distribute_combine")

    def npu_dynamic_quant(self, *a: object, **k: object) -> None:
        raise AssertionError("deep_ep must not call npu_dynamic_quant")


@pytest.fixture(params=["absent", "fake"])
def npu_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """torch_npu absent (import raises), or a fake one whose operators must not be called."""
    monkeypatch.setitem(sys.modules, "torch_npu", None if request.param == "absent" else FakeNpu())
    monkeypatch.setattr(_core, "NPU_DEVICE_TYPES", {"npu", "cpu"})
    return request.param


def test_every_public_op_is_mapped() -> None:
    wanted = [n for n in BUFFER_OPS if n != "destroy"] + ["cached_dispatch", "per_token_cast_to_fp8"]
    missing = [n for n in wanted if n not in ascend.OPS]
    assert not missing, f"ops without an Ascend entry: {missing}"
    for name, entry in ascend.OPS.items():
        assert entry.note and entry.adapter is None and ascend.dispatch(name) is entry.reference
    assert all(f"`Buffer.{n}`" in ascend.__doc__ or f"/ `{n}`" in ascend.__doc__ for n in BUFFER_OPS if n != "destroy")


def test_normal_round_trip_through_dispatch(npu_env: str) -> None:
    x, idx, w = _routing(1)
    comm, d = Comm(None), ascend.dispatch
    layout = d("get_dispatch_layout")(idx, E, 1)
    assert all(torch.equal(a, b) for a, b in zip(layout, ref.dispatch_layout(idx, E, 1)))
    got = d("dispatch")(comm, x, idx, w, E, None, 2)
    want = ref.dispatch(comm, x, idx, w, E, None, 2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[3] == want[3]
    handle = got[4]
    y = (torch.randn(handle.num_recv_tokens, H, generator=torch.Generator().manual_seed(2)) + 0.05).bfloat16()
    combined, weights = d("combine")(comm, y, handle, got[2])
    ref_combined, ref_weights = ref.combine(comm, y, want[4], want[2])
    assert torch.equal(combined, ref_combined) and torch.equal(weights, ref_weights)
    assert torch.equal(d("cached_dispatch")(comm, x, handle), ref.cached_dispatch(comm, x, want[4]))


@pytest.mark.parametrize("use_fp8", [True, False])
def test_low_latency_round_trip_through_dispatch(npu_env: str, use_fp8: bool) -> None:
    x, idx, w = _routing(3)
    comm, d = Comm(None), ascend.dispatch
    recv, count, handle = d("low_latency_dispatch")(comm, x, idx, 16, E, use_fp8, True, False)
    ref_recv, ref_count, _ = ref_ll.low_latency_dispatch(comm, x, idx, 16, E, use_fp8, True, False)
    got_x, want_x = (recv[0], ref_recv[0]) if use_fp8 else (recv, ref_recv)
    assert torch.equal(got_x.view(torch.uint8), want_x.view(torch.uint8)) and torch.equal(count, ref_count)
    y = (torch.randn(E, 16, H, generator=torch.Generator().manual_seed(4)) + 0.05).bfloat16()
    out = d("low_latency_combine")(comm, y, idx, w, handle, None)
    assert torch.equal(out, ref_ll.low_latency_combine(comm, y, idx, w, handle, None))


def test_per_token_cast_through_dispatch(npu_env: str) -> None:
    x, _, _ = _routing(5)
    got = ascend.dispatch("per_token_cast_to_fp8")(x, True, True)
    want = ref_ll.per_token_cast_to_fp8(x, True, True)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want))
