"""The named benchmark configs of the memory-bound kernels (tile sizes, warps, early loads) give the default's results.

The benchmark times these configs next to the API default so the lead can switch a default from one GPU run; a
switch must not change results. Elementwise kernels (RoPE) and the quantisers (amax is a max: exact in any order)
must match the default bit for bit under any tiling. Early loads (rope `early_rotate`, kv `early_cos_sin`) only
move loads, so those match bit for bit too. Other kv tilings may sum the RMSNorm's squares in another order: the
unquantised entry is then within one ulp of the default's (fp32 sums of 512 squares, then one rounding), and the
quantised entry is the exact FP8 quant-dequant of the config's own unquantised entry. Pooling's slot sums may be
reordered likewise: 1e-5 relative of the column's sum of |p * kv|.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import sys

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the @triton.jit in the kernel modules
pytest.importorskip("triton")

from deepinfer.tile_kernels.api_quant import PTGQ_TILE_ELEMS  # noqa: E402
from deepinfer.tile_kernels.ref import quant as ref_quant  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from _cases import KVQ_CONFIGS, PTGQ_CONFIGS, SWIGLU_FP8_CONFIGS  # noqa: E402  (the benchmark's own configs)


def _kernels(name: str):  # noqa: ANN202 (a module)
    mod = f"deepinfer.tile_kernels.backends.cuda.{name}"
    if not _CUDA and mod in sys.modules:
        importlib.reload(sys.modules[mod])
    return importlib.import_module(mod)


_Q = _kernels("triton_quant")
_F = _kernels("triton_fused")
_R = _kernels("triton_rope")
_P = _kernels("triton_pool")
_RT = _kernels("triton_route")
DEV = "cuda" if _CUDA else "cpu"


def _randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype).to(DEV)


def _equal(got: object, want: object, what: str) -> None:
    """Bitwise equality of tensors (or tuples of them), fp8 compared as bytes; names the first difference."""
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        if g is None:
            continue
        g8, w8 = (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in (g, w))
        diff = (g8 != w8) & ~(torch.isnan(g8.float()) & torch.isnan(w8.float()))
        assert not diff.any(), f"{what}: {int(diff.sum())} differ, first at {diff.nonzero()[0].tolist()}"


def _tables(t: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    ang = torch.rand(t, half, generator=torch.Generator().manual_seed(t)) * 6.28
    return ang.cos().to(DEV), ang.sin().to(DEV)


def check_configs(t: int) -> None:
    """Every benchmark config of quant / SwiGLU+FP8 / RoPE / KV / pooling at t tokens against the default."""
    x = _randn(t, 1024, seed=1, scale=3.0)
    for mode, g in (("pow2", 128), ("dequant", 64)):
        want = _Q.fp8_group_quant_triton(x, g, mode)
        for te, w in ((8192, 8), (2048, 4)):
            _equal(_Q.fp8_group_quant_triton(x, g, mode, tile_elems=te, num_warps=w), want, f"quant {mode} {te}")
    h = _randn(t, 512, seed=2, scale=3.0)
    want = _F.swiglu_clamp_fp8_triton(h[:, :256], h[:, 256:], 10.0, 128)
    for te, w in ((8192, 8), (2048, 4)):
        got = _F.swiglu_clamp_fp8_triton(h[:, :256], h[:, 256:], 10.0, 128, tile_elems=te, num_warps=w)
        _equal(got, want, f"swiglu_fp8 {te}")
    cos, sin = _tables(t, 32)
    for shape in ((t, 512), (t, 4, 512)):
        q = _randn(*shape, seed=3)
        want = _R.apply_rope_interleaved_triton(q, cos, sin, 64)
        for kw in (
            {"early_rotate": True},
            {"early_rotate": False},
            {"block_m": 4, "num_warps": 4},
            {"block_m": 2, "num_warps": 2},
        ):
            _equal(_R.apply_rope_interleaved_triton(q, cos, sin, 64, **kw), want, f"rope {shape} {kw}")
    _check_kv_configs(t, cos, sin)
    check_quant_round2(x, x[:, :448], h[:, :256], h[:, 256:])
    _check_pool_configs(t)
    _check_route_configs(t)


def check_quant_round2(x: torch.Tensor, kv: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> None:
    """The quantiser configs of the benchmark (`i64`: the session-4 int64-indexed kernels; int32 / constexpr
    indexing, tiles per program) give the default's (i32c since after session 5's 14:30 run) bytes: x [m, k] in
    groups of 128 (2^e scales, exponents and amax / 448 scales), kv [t, 448] (a strided view) quant-dequantised in
    blocks of 64, SwiGLU + FP8 of gate / up [rows, n] in groups of 128."""
    for mode in ("pow2", "exp", "fp32"):
        want = _Q.fp8_group_quant_triton(x, 128, mode, tile_elems=PTGQ_TILE_ELEMS)  # per_token_group_quant_fp8's
        for name, kw in PTGQ_CONFIGS.items():
            got = _Q.fp8_group_quant_triton(x, 128, mode, **{"tile_elems": PTGQ_TILE_ELEMS, **kw})
            _equal(got, want, f"ptgq {mode} {name}")
    want = _Q.fp8_group_quant_triton(kv, 64, "dequant")
    for name, kw in KVQ_CONFIGS.items():
        _equal(_Q.fp8_group_quant_triton(kv, 64, "dequant", **kw), want, f"kv quant-dequant {name}")
    want = _F.swiglu_clamp_fp8_triton(gate, up, 10.0, 128)
    for name, kw in SWIGLU_FP8_CONFIGS.items():
        _equal(_F.swiglu_clamp_fp8_triton(gate, up, 10.0, 128, **kw), want, f"swiglu_fp8 {name}")


def _check_pool_configs(t: int) -> None:
    """Pooling configs: HCA-like [2, 128, 64] windows (bc32_w8 / bc64_w4 kind) and the CSA shape [W, 8, 512] with
    the benchmark's bc512_w4 (the default tile with 4 warps instead of 8), W = max(1, t // 4) windows."""
    kv, sc = _randn(2, 128, 64, seed=5, dtype=torch.float32), _randn(2, 128, 64, seed=6, dtype=torch.float32)
    csa = max(1, t // 4)
    kv_c, sc_c = _randn(csa, 8, 512, seed=10, dtype=torch.float32), _randn(csa, 8, 512, seed=11, dtype=torch.float32)
    for (k, s), configs in (((kv, sc), ((32, 4), (64, 8), (16, 4))), ((kv_c, sc_c), ((512, 4), (512, 8)))):
        want = _P.softmax_pool_triton(k, s)
        scale = (torch.softmax(s, 1) * k).abs().sum(1)
        for bc, w in configs:
            err = (_P.softmax_pool_triton(k, s, block_c=bc, num_warps=w) - want).abs()
            assert (err <= 1e-5 * scale).all(), f"pool {list(k.shape)} bc{bc}_w{w}: max err {err.max():.3g}"


def _check_route_configs(t: int) -> None:
    """moe_route with several tokens per program: the same ids; the same weights up to the order of the renorm
    (and softmax) sums, a few fp32 ulps (4 * 2^-24 relative)."""
    logits, bias = _randn(t, 256, seed=8, dtype=torch.float32), _randn(256, seed=9, scale=0.1, dtype=torch.float32)
    for scoring in ("sqrtsoftplus", "softmax"):
        w0, i0 = _RT.moe_route_triton(logits, bias, 6, scoring, 1.5)
        for bt, nw in ((4, 4), (8, 4), (16, 8)):
            w1, i1 = _RT.moe_route_triton(logits, bias, 6, scoring, 1.5, block_t=bt, num_warps=nw)
            _equal(i1, i0, f"route {scoring} bt{bt} ids")
            err = (w1 - w0).abs().max().item()
            assert err <= 4 * 2.0**-24 * 1.5, f"route {scoring} bt{bt}: weights off by {err:.3g}"


def _check_kv_configs(t: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    kv, w = _randn(t, 512, seed=4, scale=3.0), _randn(512, seed=7) + 1.0
    run = _F.kv_norm_rope_quant_triton
    want, plain = run(kv, w, cos, sin, 64, 1e-6, 64), run(kv, w, cos, sin, 64, 1e-6, None)
    _equal(run(kv, w, cos, sin, 64, 1e-6, 64, early_cos_sin=True), want, "kv early_cos_sin")
    ulp = torch.finfo(torch.bfloat16).eps * plain.float().abs() + 1e-30
    tilings = ({"block_t": 4, "num_warps": 4}, {"block_t": 2, "num_warps": 2}, {"block_t": 16, "num_warps": 8})
    for kw in (*tilings, {"block_t": 2, "num_warps": 1}, {"block_t": 4, "num_warps": 1}):
        kw2 = {**kw, "early_cos_sin": kw["block_t"] == 4}
        p = run(kv, w, cos, sin, 64, 1e-6, None, **kw2)
        err = (p.float() - plain.float()).abs()
        assert (err <= ulp).all(), f"kv {kw2} unquantised: max err {err.max():.3g}"
        got = run(kv, w, cos, sin, 64, 1e-6, 64, **kw2)
        _equal(got[:, :448], ref_quant.fp8_quant_dequant_ue8m0(p[:, :448], 64), f"kv {kw2} quantised")
        _equal(got[:, 448:], p[:, 448:], f"kv {kw2} rope dims")


class _Recorder:
    """Stands in for a @triton.jit kernel: records the launch's keyword arguments (no computation)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __getitem__(self, grid: tuple):  # noqa: ANN204
        return lambda *args, **kw: self.calls.append({"grid": grid, **kw})


def test_default_rules_pick_what_they_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults set after session 5's 14:30 run: the quantisers launch the i32c kernel (int32 indices,
    groups_per_row constexpr, one tile per program; `i64` the old kernel), per_token_group_quant_fp8's tile is 4096
    elements, and softmax_pool takes 4 warps on CSA tiles from 1,024 windows up, 8 below."""
    rec, old = _Recorder(), _Recorder()
    monkeypatch.setattr(_Q, "_fp8_group_tiles_kernel", rec)
    monkeypatch.setattr(_Q, "_fp8_group_kernel", old)
    x = _randn(4, 1024, seed=1)
    assert PTGQ_TILE_ELEMS == 4096
    _Q.fp8_group_quant_triton(x, 128, "pow2", tile_elems=PTGQ_TILE_ELEMS)
    _Q.fp8_group_quant_triton(x[:, :448], 64, "dequant")
    _Q.fp8_group_quant_triton(x, 128, "pow2", tile_elems=8192, idx32=False, const_gpr=False)  # the i64_t8192 config
    assert [(c["IDX32"], c["GPR"], c["TILES"], c["grid"]) for c in rec.calls] == [
        (True, 8, 1, (1,)),
        (True, 7, 1, (1,)),
    ]
    assert rec.calls[0]["BLOCK_G"] == 4096 // 128 and len(old.calls) == 1 and old.calls[0]["BLOCK_G"] == 32
    rec_f, old_f = _Recorder(), _Recorder()
    monkeypatch.setattr(_F, "_swiglu_fp8_tiles_kernel", rec_f)
    monkeypatch.setattr(_F, "_swiglu_fp8_kernel", old_f)
    _F.swiglu_clamp_fp8_triton(x[:, :512], x[:, 512:], 10.0, 128)
    _F.swiglu_clamp_fp8_triton(x[:, :512], x[:, 512:], 10.0, 128, idx32=False, const_gpr=False)
    assert [(c["IDX32"], c["GPR"], c["TILES"]) for c in rec_f.calls] == [(True, 4, 1)] and len(old_f.calls) == 1
    pool = _Recorder()
    monkeypatch.setattr(_P, "_pool_kernel", pool)
    for w in (16, 1023, 1024, 4096):
        kv = torch.empty(w, 8, 512, device=DEV)  # never read: the kernel is the recorder
        _P.softmax_pool_triton(kv, kv)
    assert [(c["grid"][0], c["BLOCK_C"], c["num_warps"]) for c in pool.calls] == [
        (16, 512, 8),
        (1023, 512, 8),
        (1024, 512, 4),
        (4096, 512, 4),
    ]


def test_configs_match_default() -> None:
    check_configs(6)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 4096])
def test_gpu_configs_match_default(t: int) -> None:
    check_configs(t)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 64, 4096, 16384])
def test_gpu_quant_round2_configs_v4(t: int) -> None:
    """The round-2 quantiser configs at the benchmark's V4-Flash shapes (x [t, 4096], kv [t, 512][:, :448], SwiGLU
    halves of h [6t, 4096]) against the default, bit for bit, and the default against the reference."""

    def dev_randn(*shape: int, seed: int) -> torch.Tensor:  # drawn on the GPU (a CPU draw of h takes seconds)
        return (torch.randn(*shape, generator=torch.Generator(DEV).manual_seed(seed), device=DEV) * 3.0).bfloat16()

    x, kv, h = dev_randn(t, 4096, seed=21), dev_randn(t, 512, seed=22)[:, :448], dev_randn(6 * t, 4096, seed=23)
    check_quant_round2(x, kv, h[:, :2048], h[:, 2048:])
    q, s = _Q.fp8_group_quant_triton(x, 128, "pow2", tile_elems=PTGQ_TILE_ELEMS)
    _equal((q, s), ref_quant.per_token_group_quant_fp8(x, 128, "ue8m0"), "ptgq default vs reference")
    _equal(_Q.fp8_group_quant_triton(kv, 64, "dequant")[0], ref_quant.fp8_quant_dequant_ue8m0(kv, 64), "kv vs ref")
