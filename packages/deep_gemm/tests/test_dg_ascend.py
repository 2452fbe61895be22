"""The Ascend path of deep_gemm (`backends/ascend/`) on a machine without an NPU.

NO NPU RUN WAS MADE: these CPU tests check the mapping and the adapters' plumbing only.

1. With torch_npu absent, every public op (DeepGEMM aliases included) is mapped and `dispatch(op)` falls back to
   the reference: bit-identical results on random inputs.
2. A FAKE `torch_npu` (monkeypatched into sys.modules) whose `npu_grouped_matmul` is a CPU emulation of the
   documented contract (x split along m by cumulative `group_list`, one [k, n] weight per group, split_item=3 ->
   one output) records its calls: the test checks the weights are the exact bf16 dequantisation laid out [k, n],
   the group list skips empty experts, chunking, both operator signatures, and that rows past offs[-1] stay
   untouched. The bf16 GEMMs (aten on the NPU) run on CPU tensors that the test lets through as "NPU" tensors.
3. fp32 out / an accumulator C / fp32 operands keep the reference.
"""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch
from dg_testing import gen, rand_float, rand_fp4, rand_fp8, rand_scales

from deepinfer.deep_gemm import api
from deepinfer.deep_gemm import reference as ref
from deepinfer.deep_gemm import reference_w4a16 as ref_w4a16
from deepinfer.deep_gemm.backends import ascend
from deepinfer.deep_gemm.backends.ascend import _core
from deepinfer.deep_gemm.backends.ascend import ops as ascend_ops
from kernelkit.numerics import accum_tol, unit_roundoff

PUBLIC_OPS = sorted(n for n in api.__all__ if inspect.isfunction(getattr(api, n)))
ADAPTED = ("bf16_gemm_nt", "grouped_gemm_nt_bf16", "m_grouped_bf16_fp4_gemm_nt_contiguous")


def _w4a16_args(seed: int, groups: int = 5, m: int = 40, n: int = 32, k: int = 128) -> tuple:
    g = gen(seed)
    a = rand_float((m, k), torch.bfloat16, g)
    packed = rand_fp4((groups, n, k // 2), g)
    scales = rand_scales((groups, n, k // 32), g, e8m0=True)
    offs = torch.tensor([6, 6, 19, 19, 33][:groups], dtype=torch.int32)  # experts 1 and 3 empty; rows 33.. unused
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    return a, packed, scales, offs, out


def _cases() -> dict[str, tuple]:
    g = gen(21)
    m, n, k, groups = 9, 40, 256, 3
    a8, sfa = rand_fp8((m, k), g), rand_scales((m, 2), g, e8m0=False)
    b8, sfb = rand_fp8((n, k), g), rand_scales((1, 2), g, e8m0=True)
    ga8, gsfa = rand_fp8((groups, 4, k), g), rand_scales((groups, 4, 2), g, e8m0=True)
    gb8, gsfb = rand_fp8((groups, n, k), g), rand_scales((groups, 1, 2), g, e8m0=True)
    ids = torch.tensor([0, 0, 2, -1, 1, 2, 2, -1, 0], dtype=torch.int32)
    bf = rand_float((m, k), torch.bfloat16, g), rand_float((n, k), torch.bfloat16, g)
    gbf = rand_float((m, groups, k), torch.bfloat16, g), rand_float((groups, n, k), torch.bfloat16, g)
    return {
        "bf16_gemm_nt": (*bf, torch.empty(m, n, dtype=torch.bfloat16)),
        "grouped_gemm_nt_bf16": (*gbf, torch.empty(m, groups, n, dtype=torch.bfloat16)),
        "m_grouped_bf16_fp4_gemm_nt_contiguous": _w4a16_args(22),
        "fp8_gemm_nt": (
            a8,
            sfa,
            b8,
            sfb,
            torch.empty(m, n, dtype=torch.bfloat16),
            rand_float((m, n), torch.float32, g),
        ),
        "fp8_fp4_gemm_nt": (a8, sfa, rand_fp4((n, k // 2), g), rand_scales((n, k // 32), g, True), torch.empty(m, n)),
        "m_grouped_fp8_gemm_nt_contiguous": (a8, sfa, gb8, gsfb, torch.empty(m, n, dtype=torch.bfloat16), ids),
        "m_grouped_fp8_fp4_gemm_nt_contiguous": (a8, sfa, gb8, gsfb, torch.empty(m, n), ids),
        "m_grouped_fp8_gemm_nt_masked": (
            ga8,
            gsfa,
            gb8,
            gsfb,
            torch.zeros(groups, 4, n),
            torch.tensor([4, 0, 2], dtype=torch.int32),
        ),  # fmt: skip
        "m_grouped_fp8_fp4_gemm_nt_masked": (
            ga8,
            gsfa,
            gb8,
            gsfb,
            torch.zeros(groups, 4, n),
            torch.tensor([1, 4, 3], dtype=torch.int32),
        ),  # fmt: skip
        "grouped_gemm_nt_fp8": (
            rand_fp8((m, groups, k), g),
            rand_scales((m, groups, 2), g, False),
            gb8,
            gsfb,
            torch.empty(m, groups, n),
        ),  # fmt: skip
    }


def _call(fn: object, args: tuple) -> torch.Tensor:
    """Call with fresh copies of the mutable `out` (args[...] cloned), return the result."""
    return fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in args])


class FakeNpu(types.ModuleType):
    """CPU emulation of torch_npu.npu_grouped_matmul (x split along m by cumulative group_list, y single)."""

    def __init__(self, new_signature: bool = True) -> None:
        super().__init__("torch_npu")
        self.calls: list[dict] = []
        self.new_signature = new_signature

    def npu_grouped_matmul(self, x: list, weight: list, *, group_list: list, split_item: int = 0, **kw: int) -> list:
        if kw and not self.new_signature:
            raise TypeError(f"npu_grouped_matmul() got unexpected keyword arguments {sorted(kw)}")
        self.calls.append({"x": x, "weight": weight, "group_list": list(group_list), "split_item": split_item, **kw})
        assert len(x) == 1 and split_item == 3 and len(weight) == len(group_list) <= 128
        ys, start = [], 0
        for w, end in zip(weight, group_list):
            ys.append((x[0][start:end].float() @ w.float()).to(torch.bfloat16))
            start = end
        return [torch.cat(ys)]


@pytest.fixture
def fake_npu(monkeypatch: pytest.MonkeyPatch) -> FakeNpu:
    fake = FakeNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(_core, "NPU_DEVICE_TYPES", {"npu", "cpu"})
    return fake


def test_every_public_op_is_mapped() -> None:
    missing = [n for n in PUBLIC_OPS if n not in ascend.OPS]
    assert not missing, f"ops without an Ascend entry: {missing}"
    for name, entry in ascend.OPS.items():
        assert entry.note and (entry.adapter is not None) == (name in ADAPTED)
    assert (
        ascend.OPS["m_grouped_bf16_fp4_gemm_nt_contiguous"].reference is ref_w4a16.m_grouped_bf16_fp4_gemm_nt_contiguous
    )
    assert ascend.OPS["fp8_fp4_gemm_nt"].reference is ref.fp8_gemm_nt
    assert all(f"`{n}`" in ascend.markdown_table(ascend.OPS) for n in PUBLIC_OPS)


@pytest.mark.parametrize("name", sorted(_cases()))
def test_falls_back_to_reference_without_torch_npu(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # `import torch_npu` raises ImportError
    args, entry = _cases()[name], ascend.OPS[name]
    got, want = _call(ascend.dispatch(name), args), _call(entry.reference, args)
    assert got.dtype == want.dtype and torch.equal(got.float().nan_to_num(9.0), want.float().nan_to_num(9.0))


def _bf16_close(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, k: int) -> None:
    """Both sides round an fp32 sum once to bf16: |d| <= 2 u_bf16 |want| + fp32 accumulation of |a||b|."""
    tol = 2 * unit_roundoff(torch.bfloat16) * want.float().abs() + accum_tol(k) * bound
    assert ((got.float() - want.float()).abs() <= tol).all()


def test_bf16_gemm_adapters(fake_npu: FakeNpu) -> None:
    cases = _cases()
    a, b, out = cases["bf16_gemm_nt"]
    got = ascend.dispatch("bf16_gemm_nt")(a, b, out)
    assert got is out
    _bf16_close(got, ref.bf16_gemm_nt(a, b, torch.empty_like(out)), a.float().abs() @ b.float().abs().T, a.shape[1])
    a, b, out = cases["grouped_gemm_nt_bf16"]
    got = ascend.dispatch("grouped_gemm_nt_bf16")(a, b, out)
    bound = torch.einsum("tgk,gnk->tgn", a.float().abs(), b.float().abs())
    assert got is out
    _bf16_close(got, ref.grouped_gemm_nt_bf16(a, b, torch.empty_like(out)), bound, a.shape[2])


def test_bf16_gemm_keeps_reference_for_fp32_out_or_c(fake_npu: FakeNpu) -> None:
    """fp32 out / C need the fp32 sum: bit-identical to the reference (a bf16 matmul would have rounded it)."""
    a, b, _ = _cases()["bf16_gemm_nt"]
    c = rand_float((a.shape[0], b.shape[0]), torch.float32, gen(23))
    for out, cc in ((torch.empty(a.shape[0], b.shape[0]), None), (torch.empty(a.shape[0], b.shape[0]).bfloat16(), c)):
        got = ascend.dispatch("bf16_gemm_nt")(a, b, out.clone(), cc)
        assert torch.equal(got, ref.bf16_gemm_nt(a, b, out.clone(), cc))


@pytest.mark.parametrize("new_signature", [True, False])
@pytest.mark.parametrize("per_call", [32, 2])
def test_w4a16_grouped_matmul_adapter(monkeypatch: pytest.MonkeyPatch, new_signature: bool, per_call: int) -> None:
    fake = FakeNpu(new_signature)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(_core, "NPU_DEVICE_TYPES", {"npu", "cpu"})
    monkeypatch.setattr(ascend_ops, "GMM_GROUPS_PER_CALL", per_call)
    a, packed, scales, offs, out = _w4a16_args(24)
    got = ascend.dispatch("m_grouped_bf16_fp4_gemm_nt_contiguous")(a, packed, scales, offs, out)
    want = ref_w4a16.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.full_like(out, float("nan")))
    assert got is out and torch.isnan(got[33:]).all()  # rows past offs[-1] untouched
    # The fake multiplies the same exact bf16 weights in fp32 like the reference: equal up to the sum order.
    w = torch.stack([ref_w4a16.dequant_fp4_weight(packed[i], scales[i]) for i in range(packed.shape[0])])
    bound = torch.cat(
        [a[s:e].float().abs() @ w[i].abs().T for i, (s, e) in enumerate(ref_w4a16.group_bounds(offs, 40))]
    )
    _bf16_close(got[:33], want[:33], bound, a.shape[1])
    lists = [c["group_list"] for c in fake.calls]
    assert lists == ([[6, 19, 33]] if per_call == 32 else [[6, 19], [14]])  # empty experts 1 and 3 skipped
    first = fake.calls[0]
    assert ("group_type" in first) == new_signature
    assert all(t.dtype == torch.bfloat16 and t.shape == (128, 32) and t.is_contiguous() for t in first["weight"])
    assert torch.equal(first["weight"][1].float(), w[2].T)  # expert 2's weight, dequantised exactly, laid out [k, n]


def test_w4a16_operator_error_leaves_out_clean(fake_npu: FakeNpu, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> list:
        raise RuntimeError("EZ1001: GroupedMatmul tiling failed")

    monkeypatch.setattr(fake_npu, "npu_grouped_matmul", broken)
    monkeypatch.setattr(_core, "_WARNED", set())
    a, packed, scales, offs, out = _w4a16_args(25)
    with pytest.warns(RuntimeWarning, match="m_grouped_bf16_fp4_gemm_nt_contiguous"):
        got = ascend.dispatch("m_grouped_bf16_fp4_gemm_nt_contiguous")(a, packed, scales, offs, out)
    want = ref_w4a16.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.full_like(out, float("nan")))
    assert torch.equal(got.nan_to_num(9.0), want.nan_to_num(9.0))
