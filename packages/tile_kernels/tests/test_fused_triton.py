"""Fused Triton kernels (`backends/cuda/triton_fused.py`) against `ref/fused.py`, by decomposition.

A fused kernel = an exact quantiser applied to an intermediate the kernel rounds to the activation dtype, so:
(1) the intermediate (the kernel's `store_y` output for SwiGLU+FP8, the `quant_block=None` output for the KV
entry) is checked against the single-op references with the single-op bounds; (2) the quantised output must
equal the bit-exact reference quantiser applied to that intermediate, bit for bit; (3) where the intermediate
equals the reference's bit for bit (for bf16: nearly everywhere), the outputs equal the reference's bit for bit.

Bounds for (1), u = 2^-24: the SwiGLU and RMSNorm steps as in test_norm_rope_act_triton (fp32: 1e-6 relative,
+ |g| u for a GPU's exp; bf16: one ulp). RoPE takes the normed pair (a, b), each within e_a, e_b of the
reference's (one bf16 ulp, or 1e-6 relative in fp32), so the rotated fp32 values differ by <= e_a + e_b
(|c|, |s| <= 1) plus 4u |(a, b)| of rounding order: delta; a bf16 result then within delta + spacing(|ref| + delta).
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

from deepinfer.tile_kernels.ref import fused as ref_fused  # noqa: E402
from deepinfer.tile_kernels.ref import quant as ref_quant  # noqa: E402
from deepinfer.tile_kernels.ref.act import swiglu_clamp  # noqa: E402
from deepinfer.tile_kernels.ref.norm import rms_norm  # noqa: E402
from deepinfer.tile_kernels.ref.rope import apply_rope_interleaved, rope_cos_sin, rope_inv_freq  # noqa: E402

for _m in ("triton_act", "triton_quant", "triton_fused"):  # dependencies first: re-decorate under the interpreter
    _name = f"deepinfer.tile_kernels.backends.cuda.{_m}"
    if not _CUDA and _name in sys.modules:
        importlib.reload(sys.modules[_name])
_F = importlib.import_module("deepinfer.tile_kernels.backends.cuda.triton_fused")
swiglu_clamp_fp8_triton, kv_norm_rope_quant_triton = _F.swiglu_clamp_fp8_triton, _F.kv_norm_rope_quant_triton

DEV = "cuda" if _CUDA else "cpu"
U = 2.0**-24
REL = 1e-6


def _randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(*shape, generator=g) * scale
    v = torch.where(v.abs() < 1e-3 * scale, torch.full_like(v, 1e-3 * scale), v)
    return v.to(dtype).to(DEV)


def _spacing(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of `dtype` just above fp32 magnitudes v (v rounded up to a `dtype` value first), as fp32."""
    vb = v.to(dtype)
    inf = torch.full_like(vb, float("inf"))
    vb = torch.where(vb.float() < v, torch.nextafter(vb, inf), vb)
    return torch.nextafter(vb, inf).float() - vb.float()


def _step_err(ref: torch.Tensor) -> torch.Tensor:
    """How far a single-op kernel result may be from `ref` (fp32: 1e-6 relative; bf16/fp16: one ulp)."""
    a = ref.float().abs()
    return REL * a if ref.dtype == torch.float32 else _spacing(a, ref.dtype)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bitwise equal as values (NaN == NaN)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.float(), want.float()
    assert torch.equal(torch.isnan(g), torch.isnan(w))
    assert torch.equal(g.nan_to_num(), w.nan_to_num()), f"{(g.nan_to_num() != w.nan_to_num()).sum().item()} differ"


# ---------------------------------------------------------------------------------------------- SwiGLU + FP8


def _check_swiglu_fp8(gate: torch.Tensor, up: torch.Tensor, limit: float | None, group: int, fmt: str) -> None:
    y, _ = swiglu_clamp_fp8_triton(gate, up, limit, group, fmt, store_y=True)
    y_ref = swiglu_clamp(gate, up, limit)
    gclamp = gate.float() if limit is None else gate.float().clamp(max=limit)
    bound = _step_err(y_ref) * (1 + gclamp.abs() * U / REL if _CUDA else 1)  # + |g| u for a GPU's exp
    assert ((y.float() - y_ref.float()).abs() <= bound).all(), "SwiGLU intermediate out of bounds"
    q, s = swiglu_clamp_fp8_triton(gate, up, limit, group, fmt)
    q_y, s_y = ref_quant.per_token_group_quant_fp8(y, group, fmt)
    _same(q, q_y)  # (2): the exact quantiser of the kernel's own intermediate
    _same(s, s_y)
    q_ref, s_ref = ref_fused.swiglu_clamp_fp8(gate, up, limit, group, fmt)
    same_y = (y.float() == y_ref.float()).reshape(*y.shape[:-1], -1, group).all(-1)  # [..., groups]
    if y.dtype != torch.float32:  # fp32 intermediates a few ulps apart are rarely equal over a whole group
        assert same_y.float().mean() > 0.5, "intermediate differs in most groups"
    _same(s[same_y], s_ref[same_y])  # (3)
    qg, qr = q.float().reshape(*same_y.shape, group), q_ref.float().reshape(*same_y.shape, group)
    assert torch.equal(qg[same_y], qr[same_y])


@pytest.mark.parametrize("fmt", ["ue8m0", "fp32"])
@pytest.mark.parametrize(
    ("shape", "group", "limit"), [((4, 256), 128, 10.0), ((2, 3, 128), 64, 1.5), ((3, 64), 32, None)]
)
def test_swiglu_fp8(shape: tuple[int, ...], group: int, limit: float | None, fmt: str) -> None:
    gate = _randn(*shape, seed=group, scale=4.0, dtype=torch.bfloat16)
    up = _randn(*shape, seed=group + 1, scale=4.0, dtype=torch.bfloat16)
    _check_swiglu_fp8(gate, up, limit, group, fmt)


def test_swiglu_fp8_fused_layout_fp32_and_bad_inputs() -> None:
    """The grouped-GEMM layout h [rows, 2n] read in place; fp32 gate; argument errors."""
    h = _randn(5, 512, seed=3, scale=4.0, dtype=torch.bfloat16)
    _check_swiglu_fp8(h[:, :256], h[:, 256:], 10.0, 128, "ue8m0")
    g32 = _randn(2, 128, seed=4, scale=4.0)
    _check_swiglu_fp8(g32, _randn(2, 128, seed=5, scale=4.0), 10.0, 128, "fp32")
    with pytest.raises(ValueError, match="group_size"):
        swiglu_clamp_fp8_triton(g32, g32, 10.0, 96)
    with pytest.raises(ValueError, match="scale_fmt"):
        swiglu_clamp_fp8_triton(g32, g32, 10.0, 128, "e8m0")
    with pytest.raises(ValueError, match="one shape"):
        swiglu_clamp_fp8_triton(g32, g32[:1])


# ------------------------------------------------------------------------------------ KV norm + RoPE + quant


def _tables(t: int, rope_dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.randint(0, 1 << 20, (t,), generator=torch.Generator().manual_seed(seed))
    cos, sin = rope_cos_sin(pos, rope_inv_freq(rope_dim, 160000.0, 16.0, 65536))
    return cos.to(DEV), sin.to(DEV)


def _check_kv_unquantised(got: torch.Tensor, kv: torch.Tensor, w: torch.Tensor, cos, sin, rope_dim: int) -> None:
    """(1): the norm + RoPE output against the composite reference, bounds of the module docstring."""
    normed = rms_norm(kv, w)
    ref = apply_rope_interleaved(normed, cos, sin, rope_dim)
    nope = kv.shape[1] - rope_dim
    err = (got.float() - ref.float()).abs()
    assert (err[:, :nope] <= _step_err(ref[:, :nope])).all(), "norm dims out of bounds"
    pairs = normed[:, nope:].float().unflatten(-1, (-1, 2))
    e_in = _step_err(normed[:, nope:]).unflatten(-1, (-1, 2)).sum(-1)
    delta = (e_in + 4 * U * (1 + 2.0**-20) * pairs.norm(dim=-1)).repeat_interleave(2, dim=-1)
    r = ref[:, nope:]
    bound = delta + (REL * r.abs() if r.dtype == torch.float32 else _spacing(r.float().abs() + delta, r.dtype))
    assert (err[:, nope:] <= bound).all(), f"rope dims out of bounds by {(err[:, nope:] - bound).max().item():.3g}"


def _check_kv(kv: torch.Tensor, w: torch.Tensor, rope_dim: int, qb: int, eps: float = 1e-6) -> torch.Tensor:
    cos, sin = _tables(kv.shape[0], rope_dim, seed=kv.shape[1])
    plain = kv_norm_rope_quant_triton(kv, w, cos, sin, rope_dim, eps, None)
    _check_kv_unquantised(plain, kv, w, cos, sin, rope_dim) if eps == 1e-6 else None
    got = kv_norm_rope_quant_triton(kv, w, cos, sin, rope_dim, eps, qb)
    nope = kv.shape[1] - rope_dim
    _same(got[:, :nope], ref_quant.fp8_quant_dequant_ue8m0(plain[:, :nope], qb))  # (2)
    _same(got[:, nope:], plain[:, nope:])
    want = ref_fused.kv_norm_rope_quant(kv, w, cos, sin, rope_dim, eps, qb)
    want_plain = ref_fused.kv_norm_rope_quant(kv, w, cos, sin, rope_dim, eps, None)
    blocks = (plain[:, :nope] == want_plain[:, :nope]).unflatten(-1, (-1, qb)).all(-1)
    if kv.dtype != torch.float32:
        assert blocks.float().mean() > 0.5, "intermediate differs in most blocks"
    assert torch.equal(got[:, :nope].unflatten(-1, (-1, qb))[blocks], want[:, :nope].unflatten(-1, (-1, qb))[blocks])
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "d", "rope_dim", "qb"), [(3, 512, 64, 64), (2, 96, 32, 16), (4, 40, 8, 32)])
def test_kv_matches_reference(t: int, d: int, rope_dim: int, qb: int, dtype: torch.dtype) -> None:
    """V4's [t, 512] (rope 64, blocks of 64), a non-power-of-two width, blocks wider than half the nope dims."""
    kv = _randn(t, d, seed=d, scale=3.0, dtype=dtype)
    _check_kv(kv, _randn(d, seed=d + 1, dtype=dtype) + 1.0, rope_dim, qb)


def test_kv_paged_write_strides_and_errors() -> None:
    """rows scatter into a NaN-poisoned cache (a negative row skips its token), a strided kv view, a wider-row
    cache view as out, and argument errors."""
    t, d = 4, 128
    kv = _randn(t, 2 * d, seed=1, scale=2.0, dtype=torch.bfloat16)[:, ::2]  # column stride 2
    w = _randn(d, seed=2, dtype=torch.bfloat16) + 1.0
    cos, sin = _tables(t, 32, seed=d)
    want = kv_norm_rope_quant_triton(kv, w, cos, sin, 32, 1e-6, 32)
    cache = torch.full((6, d + 16), float("nan"), dtype=torch.bfloat16, device=DEV)
    view = cache[:, :d]  # row stride d + 16
    rows = torch.tensor([5, -1, 0, 2], device=DEV)
    assert kv_norm_rope_quant_triton(kv, w, cos, sin, 32, 1e-6, 32, out=view, rows=rows) is view
    for i, r in enumerate(rows.tolist()):
        if r >= 0:
            _same(view[r], want[i])
    assert torch.isnan(view[[1, 3, 4]]).all() and torch.isnan(cache[:, d:]).all()
    ref_out = ref_fused.kv_norm_rope_quant(kv, w, cos, sin, 32, 1e-6, 32, torch.zeros(6, d, device=DEV), rows)
    assert ref_out[[1, 3, 4]].eq(0).all()
    with pytest.raises(ValueError, match="quant_block"):
        kv_norm_rope_quant_triton(kv, w, cos, sin, 32, 1e-6, 24)
    with pytest.raises(ValueError, match="rope_dim"):
        kv_norm_rope_quant_triton(kv, w, cos, sin, 31)
    with pytest.raises(ValueError, match="out must be"):
        kv_norm_rope_quant_triton(kv, w, cos, sin, 32, 1e-6, 32, out=torch.empty(2, d, device=DEV))


def test_kv_default_blocks() -> None:
    """Default: 1 token / 1 warp at d = 512 (H200: 19.7 us vs 23.9 for 2 / 2 and 36.7 for 8 / 8 at kv [16384, 512])."""
    assert _F._kv_block_t(16384, 512) == 1
    assert _F._kv_block_t(16384, 128) == 4  # a 512-element tile at smaller d
    assert _F._kv_block_t(4, 512) == 1


@pytest.mark.parametrize("paged", [False, True], ids=["new", "paged"])
def test_kv_token_blocks(paged: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several tokens per program (the GPU's large-t blocking; small t on CPU would shrink it to one): a partial
    last block, and with rows a skipped token inside a block."""
    monkeypatch.setattr(_F, "KV_TARGET_PROGRAMS", 1)
    monkeypatch.setattr(_F, "KV_TILE_ELEMS", 4096)
    t, d = 11, 128
    assert _F._kv_block_t(t, d) == 32  # one program, 11 of its 32 token slots used
    kv = _randn(t, d, seed=21, scale=3.0, dtype=torch.bfloat16)
    w = _randn(d, seed=22, dtype=torch.bfloat16) + 1.0
    if not paged:
        _check_kv(kv, w, 32, 32)
        return
    monkeypatch.setattr(_F, "KV_TILE_ELEMS", 4 * d)  # 4 tokens per program: 3 programs
    cos, sin = _tables(t, 32, seed=d)
    want = kv_norm_rope_quant_triton(kv, w, cos, sin, 32, 1e-6, 32)
    rows = torch.tensor([3, 12, -1, 0, 7, 1, 9, -5, 2, 10, 4], device=DEV)
    cache = torch.full((13, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    kv_norm_rope_quant_triton(kv, w, cos, sin, 32, 1e-6, 32, out=cache, rows=rows)
    for i, r in enumerate(rows.tolist()):
        if r >= 0:
            _same(cache[r], want[i])
    assert torch.isnan(cache[[5, 6, 8, 11]]).all()


# --------------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_gpu_v4_flash_shapes(t: int) -> None:
    """SwiGLU+FP8 of the routed experts' [t * 6, 2 * 2048] output (group 128, both formats); the KV entry
    [t, 512] bf16 (rope 64, FP8 blocks of 64) returned and scattered into a cache."""
    h = _randn(t * 6, 4096, seed=t, scale=3.0, dtype=torch.bfloat16)
    for fmt in ("ue8m0", "fp32"):
        _check_swiglu_fp8(h[:, :2048], h[:, 2048:], 10.0, 128, fmt)
    kv = _randn(t, 512, seed=t + 1, scale=3.0, dtype=torch.bfloat16)
    w = _randn(512, seed=t + 2, dtype=torch.bfloat16) + 1.0
    got = _check_kv(kv, w, 64, 64)
    cos, sin = _tables(t, 64, seed=512)
    cache = torch.full((2 * t, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    rows = torch.randperm(2 * t, device=DEV)[:t]
    kv_norm_rope_quant_triton(kv, w, cos, sin, 64, 1e-6, 64, out=cache, rows=rows)
    _same(cache[rows], got)
