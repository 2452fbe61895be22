"""The Ascend path of tile_kernels (`backends/ascend/`) on a machine without an NPU.

NO NPU RUN WAS MADE: these CPU tests check the mapping and the adapters' plumbing only.

1. With torch_npu absent, every public op (and every reference op) is mapped, and `dispatch(op)` falls back to
   the reference: bit-identical results on random inputs.
2. A FAKE `torch_npu` module (put into sys.modules by monkeypatch) whose operators are small CPU emulations of
   the documented formulas records each call, so the tests check the argument layouts the adapters pass
   (BSND RoPE view, fp32 operands, the gate-first SwiGLU concatenation) and that outputs come back exact. The
   emulations compute in the reference's order of operations, so the comparisons are bitwise: in particular the
   interleaved <-> half-split RoPE permutation around npu_rotary_mul's "half" mode is exact.
3. Inputs outside an operator's range, a missing operator, or an operator that raises fall back to the reference.
"""

from __future__ import annotations

import inspect
import pathlib
import sys
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

from deepinfer.tile_kernels import api
from deepinfer.tile_kernels import reference as ref
from deepinfer.tile_kernels.backends import ascend
from deepinfer.tile_kernels.backends.ascend import _core
from deepinfer.tile_kernels.backends.ascend import ops as ascend_ops

PUBLIC_OPS = sorted(n for n in api.__all__ if inspect.isfunction(getattr(api, n)))
ADAPTED = ("rms_norm", "apply_rope_interleaved", "swiglu_clamp", "swiglu_clamp_fp8", "kv_norm_rope_quant")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    x = torch.randn(*shape, generator=_gen(seed)) * scale
    return (x + 0.01 * torch.sign(x)).to(dtype)  # never exactly zero


def _cos_sin(t: int, rope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.randint(0, 4096, (t,), generator=_gen(7))
    return ref.rope_cos_sin(pos, ref.rope_inv_freq(rope_dim, 10000.0))


@pytest.fixture(autouse=True)
def _fresh_rope_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget which npu_rotary_mul mode worked (each test brings its own fake operator)."""
    monkeypatch.setattr(ascend_ops, "_rope_mode_ok", [])


@pytest.fixture
def no_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_npu absent: `import torch_npu` raises ImportError."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)


class FakeNpu(types.ModuleType):
    """CPU emulations of the torch_npu operators the adapters call, recording (name, args, kwargs)."""

    def __init__(self, with_mode: bool = True) -> None:
        super().__init__("torch_npu")
        self.calls: list[tuple[str, tuple, dict]] = []
        self.with_mode = with_mode

    def npu_rms_norm(self, x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6):  # noqa: ANN201
        self.calls.append(("npu_rms_norm", (x, gamma), {"epsilon": epsilon}))
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon)
        return gamma * (x * rstd), rstd

    def npu_rotary_mul(self, x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, **kw: str) -> torch.Tensor:
        if kw and not self.with_mode:
            raise TypeError("npu_rotary_mul() got an unexpected keyword argument 'rotary_mode'")
        mode = kw.get("rotary_mode", "half")
        self.calls.append(("npu_rotary_mul", (x, r1, r2), {"rotary_mode": mode}))
        assert x.dim() == 4 and r1.dim() == 4 and r2.dim() == 4, "npu_rotary_mul takes 4-D tensors"
        if mode == "half":
            x1, x2 = torch.chunk(x, 2, -1)
            x_new = torch.cat((-x2, x1), dim=-1)
        else:
            x_new = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
        return r1 * x + r2 * x_new

    def npu_swiglu(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        self.calls.append(("npu_swiglu", (x,), {"dim": dim}))
        a, b = torch.chunk(x, 2, dim=dim)
        return F.silu(a) * b


@pytest.fixture
def fake_npu(monkeypatch: pytest.MonkeyPatch) -> FakeNpu:
    """A fake torch_npu in sys.modules, and CPU tensors accepted as 'NPU' tensors by the adapters."""
    fake = FakeNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(_core, "NPU_DEVICE_TYPES", {"npu", "cpu"})
    return fake


# ---- the mapping ----


def test_every_public_op_is_mapped() -> None:
    missing = [n for n in [*PUBLIC_OPS, *ref.__all__] if n not in ascend.OPS]
    assert not missing, f"ops without an Ascend entry: {missing}"
    for name, entry in ascend.OPS.items():
        assert entry.note, f"{name}: document the operator mapping or why it stays on the reference"
        assert entry.reference is getattr(ref, name)
        assert (entry.adapter is None) == (name not in ADAPTED)
    table = ascend.markdown_table(ascend.OPS)
    assert all(f"`{n}`" in table for n in PUBLIC_OPS)


def test_reference_entries_are_the_reference(no_npu: None) -> None:
    for name, entry in ascend.OPS.items():
        if entry.adapter is None:
            assert ascend.dispatch(name) is entry.reference
    with pytest.raises(KeyError, match="op_name"):
        ascend.dispatch("no_such_op")


def test_core_is_identical_in_every_package() -> None:
    root = pathlib.Path(__file__).resolve().parents[2]
    copies = sorted(root.glob("*/src/deepinfer/*/backends/ascend/_core.py"))
    assert len(copies) >= 1
    assert len({p.read_text() for p in copies}) == 1, f"backends/ascend/_core.py differs between {copies}"


# ---- torch_npu absent: the reference runs ----


def _cases() -> dict[str, tuple[tuple, dict]]:
    t, d = 5, 256
    cos, sin = _cos_sin(t, 64)
    kv, w = _randn(t, d, dtype=torch.bfloat16, seed=1), _randn(d, seed=2)
    return {
        "rms_norm": ((_randn(t, 3, d, dtype=torch.bfloat16, seed=3), w), {"eps": 1e-6}),
        "apply_rope_interleaved": ((_randn(t, 4, d, seed=4), cos, sin, 64), {"inverse": True}),
        "swiglu_clamp": ((_randn(t, d, seed=5, scale=8.0), _randn(t, d, seed=6, scale=8.0)), {"limit": 10.0}),
        "swiglu_clamp_fp8": ((_randn(t, d, dtype=torch.bfloat16, seed=8), _randn(t, d, seed=9).bfloat16()), {}),
        "kv_norm_rope_quant": ((kv, w, cos, sin), {"rope_dim": 64, "quant_block": 64}),
    }


def _same(a: object, b: object) -> None:
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(
        a.view(torch.uint8) if a.dtype.itemsize == 1 else a, b.view(torch.uint8) if b.dtype.itemsize == 1 else b
    )


@pytest.mark.parametrize("name", ADAPTED)
def test_adapted_ops_fall_back_without_torch_npu(no_npu: None, name: str) -> None:
    args, kw = _cases()[name]
    _same(ascend.dispatch(name)(*args, **kw), getattr(ref, name)(*args, **kw))


@pytest.mark.parametrize("name", ADAPTED)
def test_cpu_tensors_never_reach_the_npu_operator(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    fake = FakeNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)  # torch_npu present, but the tensors are on the CPU
    args, kw = _cases()[name]
    _same(ascend.dispatch(name)(*args, **kw), getattr(ref, name)(*args, **kw))
    assert fake.calls == []


# ---- a fake torch_npu: layouts and exact conversions ----


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_adapter(fake_npu: FakeNpu, dtype: torch.dtype, weighted: bool) -> None:
    x = _randn(6, 2, 128, dtype=dtype, seed=11)
    w = _randn(128, dtype=dtype, seed=12) if weighted else None
    out = ascend.dispatch("rms_norm")(x, w, 1e-5)
    ((name, (xa, gamma), kw),) = fake_npu.calls
    assert xa.dtype == torch.float32 and gamma.dtype == torch.float32 and gamma.shape == (128,)
    assert kw == {"epsilon": 1e-5}
    assert torch.equal(gamma, w.float() if weighted else torch.ones(128))
    _same(out, ref.rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("with_mode", [True, False], ids=["interleave", "half+permutation"])
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("shape", [(7, 512), (7, 3, 512), (7, 2, 2, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_adapter_is_exact(
    monkeypatch: pytest.MonkeyPatch, with_mode: bool, inverse: bool, shape: tuple, dtype: torch.dtype
) -> None:
    fake = FakeNpu(with_mode=with_mode)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(_core, "NPU_DEVICE_TYPES", {"npu", "cpu"})
    x = _randn(*shape, dtype=dtype, seed=13, scale=3.0)
    cos, sin = _cos_sin(shape[0], 64)
    out = ascend.dispatch("apply_rope_interleaved")(x, cos, sin, 64, inverse)
    _same(out, ref.apply_rope_interleaved(x, cos, sin, 64, inverse))
    xa, r1, r2 = fake.calls[-1][1]
    heads = 1
    for s in shape[1:-1]:
        heads *= s
    assert xa.shape == (1, shape[0], heads, 64) and xa.dtype == torch.float32
    assert r1.shape == r2.shape == (1, shape[0], 1, 64)
    assert fake.calls[-1][2]["rotary_mode"] == ("interleave" if with_mode else "half")
    if with_mode:  # r1 / r2 repeat each pair's cos / sin: c0 c0 c1 c1 ...
        assert torch.equal(r1[0, :, 0, 0::2], cos) and torch.equal(r1[0, :, 0, 1::2], cos)
    else:  # half mode: cos twice, then the permutation maps (2k, 2k+1) to (k, k + 32)
        assert torch.equal(r1[0, :, 0, :32], cos) and torch.equal(r1[0, :, 0, 32:], cos)
        assert torch.equal(xa[0, :, 0, :32], x.reshape(shape[0], -1, shape[-1])[:, 0, -64::2].float())


def test_rope_mode_is_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator without "interleave" is asked once; later calls go straight to "half"."""
    fake = FakeNpu(with_mode=False)
    attempts: list[bool] = []
    real = fake.npu_rotary_mul

    def counting(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, **kw: str) -> torch.Tensor:
        attempts.append(bool(kw))
        return real(x, r1, r2, **kw)

    fake.npu_rotary_mul = counting  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(_core, "NPU_DEVICE_TYPES", {"npu", "cpu"})
    x, (cos, sin) = _randn(4, 2, 128, seed=20), _cos_sin(4, 64)
    for _ in range(3):
        _same(ascend.dispatch("apply_rope_interleaved")(x, cos, sin, 64), ref.apply_rope_interleaved(x, cos, sin, 64))
    assert attempts == [True, False, False, False]


def test_rope_permutation_round_trip() -> None:
    """The half-mode permutation and its inverse are exact inverses (the adapter relies on it)."""
    v = _randn(3, 64, seed=14)
    half = torch.cat((v[..., 0::2], v[..., 1::2]), dim=-1)
    back = torch.stack((half[..., :32], half[..., 32:]), dim=-1).flatten(-2)
    assert torch.equal(back, v)


@pytest.mark.parametrize("limit", [10.0, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_adapter(fake_npu: FakeNpu, limit: float | None, dtype: torch.dtype) -> None:
    gate, up = _randn(4, 3, 96, dtype=dtype, seed=15, scale=12.0), _randn(4, 3, 96, dtype=dtype, seed=16, scale=12.0)
    out = ascend.dispatch("swiglu_clamp")(gate, up, limit)
    ((name, (xa,), kw),) = fake_npu.calls
    assert xa.shape == (4, 3, 192) and xa.dtype == torch.float32 and kw == {"dim": -1}
    want_gate = gate.float().clamp(max=limit) if limit is not None else gate.float()
    assert torch.equal(xa[..., :96], want_gate)  # gate first: npu_swiglu applies silu to the first half
    _same(out, ref.swiglu_clamp(gate, up, limit))


def test_fused_adapters(fake_npu: FakeNpu) -> None:
    cases = _cases()
    for name in ("swiglu_clamp_fp8", "kv_norm_rope_quant"):
        args, kw = cases[name]
        _same(ascend.dispatch(name)(*args, **kw), getattr(ref, name)(*args, **kw))
    assert {c[0] for c in fake_npu.calls} == {"npu_swiglu", "npu_rms_norm", "npu_rotary_mul"}
    kv, w, cos, sin = cases["kv_norm_rope_quant"][0]
    cache, rows = torch.full((9, kv.shape[1]), float("nan")), torch.tensor([4, -1, 0, 8, 2])
    want = ref.kv_norm_rope_quant(kv, w, cos, sin, out=cache.clone(), rows=rows)
    got = ascend.dispatch("kv_norm_rope_quant")(kv, w, cos, sin, out=cache, rows=rows)
    assert got is cache and torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))


# ---- fallbacks ----


def test_outside_operator_range_runs_reference(fake_npu: FakeNpu) -> None:
    x = _randn(2, 1000, 64, seed=17)  # N = 1000 heads: npu_rotary_mul needs B * N < 1000
    cos, sin = _cos_sin(2, 64)
    _same(ascend.dispatch("apply_rope_interleaved")(x, cos, sin, 64), ref.apply_rope_interleaved(x, cos, sin, 64))
    x16 = _randn(3, 64, seed=18).double()  # fp64: not an operator dtype
    _same(ascend.dispatch("rms_norm")(x16, None), ref.rms_norm(x16, None))
    assert fake_npu.calls == []


def test_missing_operator_runs_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))  # an old torch_npu without the ops
    monkeypatch.setattr(_core, "NPU_DEVICE_TYPES", {"npu", "cpu"})
    args, kw = _cases()["swiglu_clamp"]
    _same(ascend.dispatch("swiglu_clamp")(*args, **kw), ref.swiglu_clamp(*args, **kw))


def test_operator_error_falls_back_with_warning(fake_npu: FakeNpu, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        raise RuntimeError("EZ9999: aclnnSwiGlu failed")

    monkeypatch.setattr(fake_npu, "npu_swiglu", broken)
    monkeypatch.setattr(_core, "_WARNED", set())
    args, kw = _cases()["swiglu_clamp"]
    with pytest.warns(RuntimeWarning, match="swiglu_clamp"):
        _same(ascend.dispatch("swiglu_clamp")(*args, **kw), ref.swiglu_clamp(*args, **kw))
    monkeypatch.setenv(_core.STRICT_ENV, "1")
    with pytest.raises(RuntimeError, match="EZ9999"), warnings.catch_warnings():
        warnings.simplefilter("error")
        ascend.dispatch("swiglu_clamp")(*args, **kw)


def test_autograd_keeps_the_reference(fake_npu: FakeNpu) -> None:
    x = _randn(3, 64, seed=19).requires_grad_(True)
    y = ascend.dispatch("rms_norm")(x, None)
    y.sum().backward()
    assert x.grad is not None and fake_npu.calls == []
