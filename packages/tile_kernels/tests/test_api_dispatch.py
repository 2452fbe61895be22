"""The public API's dispatch: which calls take the Triton kernels and that they return what the reference does.

On CPU the dispatch gate (`_dispatch.triton_ok`, CUDA tensors only) is patched to accept CPU tensors and the
kernels run in the Triton interpreter; on a GPU the real gate is used. Each wired op is called through
`deepinfer.tile_kernels`, a spy checks that its kernel ran, and the result is compared with the reference
(exactly for the bit-exact FP8 quantiser, otherwise within the bounds of the kernel tests: a few fp32 ulps).
Also: DEEPINFER_TILE_KERNELS_BACKEND=reference, float64, autograd and unsupported arguments keep the reference.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the @triton.jit in the kernel modules
pytest.importorskip("triton")

import deepinfer.tile_kernels as tk  # noqa: E402
from deepinfer.tile_kernels import _dispatch  # noqa: E402
from deepinfer.tile_kernels import reference as ref  # noqa: E402

DEV = "cuda" if _CUDA else "cpu"
_KERNELS = {  # module -> launcher the API calls
    "triton_norm": "rms_norm_triton",
    "triton_rope": "apply_rope_interleaved_triton",
    "triton_act": "swiglu_clamp_triton",
    "triton_quant": "fp8_group_quant_triton",
    "triton_pool": "softmax_pool_triton",
    "triton_route": "moe_route_triton",
    "triton_fused": ("swiglu_clamp_fp8_triton", "kv_norm_rope_quant_triton"),
}


def _module(name: str):  # noqa: ANN202 (a module)
    mod = f"deepinfer.tile_kernels.backends.cuda.{name}"
    if not _CUDA and mod in sys.modules:
        importlib.reload(sys.modules[mod])
    return importlib.import_module(mod)


_MODULES = {name: _module(name) for name in _KERNELS}  # triton_fused last: it imports triton_act / triton_quant


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Spy on every launcher; on CPU also let the gate accept CPU tensors. Yields the names of launched kernels."""
    seen: list[str] = []
    for name, fn_names in _KERNELS.items():
        mod = _MODULES[name]
        for fn_name in (fn_names,) if isinstance(fn_names, str) else fn_names:
            real = getattr(mod, fn_name)

            def spy(*args, _real=real, _name=name, **kwargs):  # noqa: ANN002, ANN003, ANN202
                seen.append(_name)
                return _real(*args, **kwargs)

            monkeypatch.setattr(mod, fn_name, spy)
    if not _CUDA:
        monkeypatch.setattr(
            _dispatch,
            "triton_ok",
            lambda x: os.environ.get("DEEPINFER_TILE_KERNELS_BACKEND", "auto").strip().lower() != "reference",
        )
    monkeypatch.delenv("DEEPINFER_TILE_KERNELS_BACKEND", raising=False)
    return seen


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype).to(DEV)


def _close(got: object, want: object, rtol: float = 1e-5) -> None:
    """Tensors (or tuples of them) equal in shape and dtype; fp32 values within rtol of the largest, bf16 within one
    ulp (2^-7 relative), e4m3 (the bit-exact quantiser) and integers exactly."""
    if isinstance(want, tuple):
        for g, w in zip(got, want, strict=True):
            _close(g, w, rtol)
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    if not want.is_floating_point():
        assert torch.equal(got, want)
        return
    if want.dtype == torch.float8_e4m3fn:  # the bit-exact quantiser
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    elif want.dtype == torch.bfloat16:
        torch.testing.assert_close(got.float(), want.float(), rtol=2.0**-7, atol=0.0, equal_nan=True)
    else:  # fp32: relative to the largest output (outputs of sums may cancel to near zero)
        torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * want.float().abs().max().item(), equal_nan=True)


def _cases() -> list[tuple[str, object, tuple]]:
    """(kernel module, API function, args) for every wired op at small shapes."""
    pos = torch.arange(6)
    cos, sin = tk.rope_cos_sin(pos, tk.rope_inv_freq(16, 10000.0))
    h = _randn(6, 64, seed=3, scale=4.0)
    return [
        ("triton_norm", tk.rms_norm, (_randn(6, 96, seed=1), _randn(96, seed=2) + 1.0)),
        ("triton_rope", tk.apply_rope_interleaved, (_randn(6, 3, 40, seed=4), cos.to(DEV), sin.to(DEV), 16)),
        ("triton_act", tk.swiglu_clamp, (h[:, :32], h[:, 32:], 10.0)),
        ("triton_quant", tk.fp8_quant_ue8m0, (_randn(4, 128, seed=5, scale=30.0), 64)),
        ("triton_quant", tk.fp8_quant_dequant_ue8m0, (_randn(4, 512, seed=6)[:, :448], 64)),
        ("triton_quant", tk.per_token_group_quant_fp8, (_randn(4, 256, seed=7), 128, "ue8m0")),
        ("triton_quant", tk.per_token_group_quant_fp8, (_randn(4, 256, seed=8), 128, "fp32")),
        (
            "triton_pool",
            tk.softmax_pool,
            (_randn(3, 8, 32, seed=9, dtype=torch.float32), _randn(3, 8, 32, seed=10, dtype=torch.float32)),
        ),
        (
            "triton_route",
            tk.moe_route,
            (
                _randn(5, 64, seed=11, dtype=torch.float32, scale=3.0),
                _randn(64, seed=12, dtype=torch.float32, scale=0.1),
                6,
                "sqrtsoftplus",
                1.5,
            ),
        ),
    ]


@pytest.mark.parametrize("i", range(9))
def test_api_calls_kernel_and_matches_reference(i: int, calls: list[str]) -> None:
    name, fn, args = _cases()[i]
    got = fn(*args)
    assert calls == [name], f"{fn.__name__} ran {calls}, expected {name}"
    _close(got, getattr(ref, fn.__name__)(*args))


def _close_fp8(deq: torch.Tensor, deq_ref: torch.Tensor, y_ref: torch.Tensor, s: torch.Tensor) -> None:
    """Dequantised FP8 outputs of a fused op whose bf16 intermediate may be one ulp (2^-7 relative) off the
    reference's y_ref: each side is within half an e4m3 step of its input (2^-4 relative, or 2^-10 s in the
    subnormal range, s the larger block scale, at most 2x the other), so
    |deq - deq_ref| <= 2^-7 |y| + 2^-4 (2 + 2^-7) |y| + 2^-9 s <= 0.135 |y| + 2^-9 s."""
    bound = 0.135 * y_ref.float().abs() + 2.0**-9 * s
    assert ((deq.float() - deq_ref.float()).abs() <= bound).all()


def test_api_fused_ops(calls: list[str]) -> None:
    """swiglu_clamp_fp8 and kv_norm_rope_quant (also writing into a cache) run the fused kernel."""
    h = _randn(6, 256, seed=30, scale=4.0)
    gate, up = h[:, :128], h[:, 128:]
    q, s = tk.swiglu_clamp_fp8(gate, up, 10.0, 64)
    q_ref, s_ref = ref.swiglu_clamp_fp8(gate, up, 10.0, 64)
    assert q.dtype == q_ref.dtype and s.shape == s_ref.shape
    s_max = torch.maximum(s, s_ref).repeat_interleave(64, -1)
    deq, deq_ref = q.float() * s.repeat_interleave(64, -1), q_ref.float() * s_ref.repeat_interleave(64, -1)
    _close_fp8(deq, deq_ref, ref.swiglu_clamp(gate, up, 10.0), s_max)
    kv, w = _randn(5, 128, seed=31, scale=3.0), _randn(128, seed=32) + 1.0
    cos, sin = tk.rope_cos_sin(torch.arange(5), tk.rope_inv_freq(32, 10000.0))
    cos, sin = cos.to(DEV), sin.to(DEV)
    cache = torch.zeros(8, 128, dtype=torch.bfloat16, device=DEV)
    rows = torch.tensor([7, 0, -1, 3, 4], device=DEV)
    got = tk.kv_norm_rope_quant(kv, w, cos, sin, 32, 1e-6, 32, out=cache, rows=rows)
    want = ref.kv_norm_rope_quant(kv, w, cos, sin, 32, 1e-6, 32, out=torch.zeros_like(cache), rows=rows)
    plain = ref.kv_norm_rope_quant(kv, w, cos, sin, 32, 1e-6, None, out=torch.zeros_like(cache), rows=rows)
    amax = plain[:, :96].float().abs().unflatten(-1, (3, 32)).amax(-1).clamp_min(1e-4)
    s_max = 2 * torch.exp2(torch.ceil(torch.log2(amax / 448))).repeat_interleave(32, -1)
    assert got is cache and calls == ["triton_fused", "triton_fused"]
    _close_fp8(got[:, :96], want[:, :96], plain[:, :96], s_max)
    _close(got[:, 96:], want[:, 96:])


def test_reference_kept(calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The env switch, float64, autograd and arguments outside a kernel's limits keep the reference."""
    x = _randn(4, 64, seed=20, dtype=torch.float32)
    tk.rms_norm(x.double())
    tk.rms_norm(x.clone().requires_grad_(True))
    tk.moe_route(_randn(2, 32, seed=21, dtype=torch.float32), None, 20)  # topk > 16
    tk.fp8_quant_ue8m0(_randn(2, 96, seed=22), 48)  # block not a power of two
    tk.swiglu_clamp(x, x, torch.tensor(10.0))  # a tensor limit
    monkeypatch.setenv("DEEPINFER_TILE_KERNELS_BACKEND", "reference")
    tk.rms_norm(x)
    tk.softmax_pool(x.view(2, 2, 64), x.view(2, 2, 64))
    assert calls == []


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_api_dispatch(calls: list[str]) -> None:
    """On the H200 the real gate sends CUDA tensors to every wired kernel (same checks as on CPU)."""
    for i in range(9):
        calls.clear()
        test_api_calls_kernel_and_matches_reference(i, calls)
    calls.clear()
    test_api_fused_ops(calls)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_cuda_graph_replay_new_kernels() -> None:
    """The new launchers have no host sync: capture the KV FP8 simulation, pooling, routing and both fused ops
    through the API in one CUDA graph, refill the inputs, replay, compare with eager API calls."""
    kv_full, w = _randn(16, 512, seed=40), _randn(512, seed=41) + 1.0
    kv_pool, sc_pool = _randn(4, 8, 512, seed=42, dtype=torch.float32), _randn(4, 8, 512, seed=43, dtype=torch.float32)
    logits, bias = _randn(16, 256, seed=44, dtype=torch.float32), _randn(256, seed=45, dtype=torch.float32)
    h = _randn(96, 4096, seed=46, scale=3.0)
    cos, sin = tk.rope_cos_sin(torch.arange(16), tk.rope_inv_freq(64, 160000.0))
    cos, sin = cos.to(DEV), sin.to(DEV)
    rows = torch.arange(16, device=DEV) * 2
    cache = torch.zeros(32, 512, dtype=torch.bfloat16, device=DEV)

    def step() -> tuple:
        return (
            tk.fp8_quant_dequant_ue8m0(kv_full[:, :448], 64),
            tk.softmax_pool(kv_pool, sc_pool),
            *tk.moe_route(logits, bias, 6, "sqrtsoftplus", 1.5),
            *tk.swiglu_clamp_fp8(h[:, :2048], h[:, 2048:], 10.0, 128),
            tk.kv_norm_rope_quant(kv_full, w, cos, sin, 64, 1e-6, 64, out=cache, rows=rows),
        )

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for t, seed in ((kv_full, 50), (kv_pool, 51), (sc_pool, 52), (logits, 53), (h, 54)):
        t.copy_(_randn(*t.shape, seed=seed, dtype=t.dtype))
    graph.replay()
    torch.cuda.synchronize()
    captured = [o.clone() for o in outs]
    for got, want in zip(captured, step(), strict=True):
        assert torch.equal(
            got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
            want.view(torch.uint8) if want.dtype == torch.float8_e4m3fn else want,
        )
