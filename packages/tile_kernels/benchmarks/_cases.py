"""Benchmark cases of tile_kernels on V4-Flash shapes: inputs, the public API call and its reference twin.

A case builds its inputs once; `api` is the public function (Triton on CUDA where wired, else the reference)
and `ref` the PyTorch reference that `x eager` and `x torch.compile` are measured from. Bytes are those truly
read and written by one call: every input element read once, every output element written once (strided views
count their viewed elements only); the path the API took is found at run time (bench_tile_kernels.py).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import deepinfer.tile_kernels as tk
from deepinfer.tile_kernels import reference as ref

HIDDEN, HC, HEADS, HEAD_DIM, ROPE, EXPERTS, TOPK, INTER = 4096, 4, 64, 512, 64, 256, 6, 2048
INDEX_HEADS, INDEX_DIM, VOCAB = 64, 128, 129280


@dataclass
class Case:
    op: str
    shape: str
    make: Callable[[], tuple]  # -> positional args for api / ref
    api: Callable
    ref: Callable
    nbytes: Callable[[tuple, object], int] | None = None  # (args, output) -> bytes, when not all input is read
    # named Triton configs timed side by side with the API's default (same args; "triton:<name>" records)
    variants: dict[str, Callable] = field(default_factory=dict)
    smoke_variants: bool = True  # False: --smoke skips them (a config that is slow in the interpreter)
    compile_baseline: bool = True  # False: no torch.compile baseline for this case


def _launcher(module: str, name: str) -> Callable:
    """The Triton launcher `name` of backends/cuda/<module>.py, imported at first call (triton only when used)."""

    def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        mod = importlib.import_module(f"deepinfer.tile_kernels.backends.cuda.{module}")
        return getattr(mod, name)(*args, **kwargs)

    return call


def _first(fn: Callable) -> Callable:
    """fn's first result (launchers that return (out, None) where the API returns out)."""
    return lambda *a: fn(*a)[0]


_QUANT = _launcher("triton_quant", "fp8_group_quant_triton")
_FUSED_FP8 = _launcher("triton_fused", "swiglu_clamp_fp8_triton")
_KV = _launcher("triton_fused", "kv_norm_rope_quant_triton")
_ROPE = _launcher("triton_rope", "apply_rope_interleaved_triton")
_POOL = _launcher("triton_pool", "softmax_pool_triton")
_HADAMARD = _launcher("triton_hadamard", "hadamard_triton")
_HAD_FP4 = _launcher("triton_hadamard", "hadamard_fp4_triton")
_FP4 = _launcher("triton_fp4", "fp4_group_quant_triton")
_ROUTE = _launcher("triton_route", "moe_route_triton")


# quantiser configs (bit-exact to the default, see triton_quant's docstring): name -> kwargs of the launchers. i32c
# (int32 indexing with groups_per_row a constexpr) is the launchers' default since after session 5's 14:30 run
# (1.00-1.43x the old default at every count), so the API rows time it; pfN: N tiles per program, the next tile's
# load issued before the current tile's stores (grid / N programs); tT_wW: T-element tiles of W warps; lean
# (session 6): triton_quant.quant_tile_store_lean, the same bytes with about half the SASS instructions per element
# (sm_90a, Triton 3.6: 148 against 296 a thread for a [32, 128] bf16 tile of per_token_group_quant_fp8); persistN: a
# persistent grid of N programs per SM striding over the tiles, the next tile's load before the current's stores
# (55-59 registers at 8 warps: 4 programs per SM); leanx: lean with a non-finite group's NaN made by the multiply
# (one select per group instead of one per element: relies on the GPU's canonical positive NaN). The int64
# configs (`i64*`, the session-4 kernels) and i32c_t4096_w4_pf4 / i32c_t2048_w4_pf4 / i32c_pf4 (session 5) are no
# longer timed: they decided the session-5 switch.
_I32C = {"idx32": True, "const_gpr": True}
_LEAN = {**_I32C, "lean": True}
PTGQ_CONFIGS = {
    "i32c_pf2": {**_I32C, "tiles_per_program": 2},
    "lean": _LEAN,
    "lean_pf2": {**_LEAN, "tiles_per_program": 2},
    "lean_w4": {**_LEAN, "num_warps": 4},
    "lean_persist4": {**_LEAN, "persistent": 4},
    "leanx": {**_I32C, "lean": 2},
}
KVQ_CONFIGS = {
    "i32c_pf2": {**_I32C, "tiles_per_program": 2},
    "lean": _LEAN,
    "lean_pf2": {**_LEAN, "tiles_per_program": 2},
    "lean_t8192": {**_LEAN, "tile_elems": 8192},
}
SWIGLU_FP8_CONFIGS = {
    "i32c_pf2": {**_I32C, "tiles_per_program": 2},
    "lean": _LEAN,
    "lean_pf2": {**_LEAN, "tiles_per_program": 2},
    "lean_persist4": {**_LEAN, "persistent": 4},
    "leanx": {**_I32C, "lean": 2},
    "lean_ex2": {**_LEAN, "ftz_exp": True},  # + silu's exp as one ex2.approx.ftz (triton_act._exp_ftz, same bits)
}


# RoPE kv configs (same bits as the default, tests/test_rope_configs.py): bm4_w4 (4 rows / 4 warps, 0.93x in session
# 5); session 6: cs_rt (the default kernel with the cos / sin strides unspecialised, so that cos / sin load straight
# into the layout of the rotated columns instead of through shared memory and two barriers: one DRAM round trip per
# program instead of three, see triton_rope._rope_kernel_cs_rt), cs_rt_bm4_w4, and row* (triton_rope._rope_row_kernel:
# whole rows as one tile, rotated in registers; rows / warps per program). (bm8_w8 / late_rot: 0.89x / 0.92x in
# sessions 4-5, no longer timed.)
ROPE_KV_CONFIGS = {
    "bm4_w4": {"block_m": 4, "num_warps": 4},
    "cs_rt": {"cs_rt": True},
    "cs_rt_bm4_w4": {"cs_rt": True, "block_m": 4, "num_warps": 4},
    "row": {"row_tile": True},
    "row_bm1_w1": {"row_tile": True, "block_m": 1, "num_warps": 1},
}


def _ptgq(**kw: object) -> Callable:
    return lambda x, g, fmt: _QUANT(x, g, "pow2" if fmt == "ue8m0" else "fp32", **kw)


def _swiglu_fp8(**kw: object) -> Callable:
    return functools.partial(_FUSED_FP8, **kw)


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(dev: str, *shape: int, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0, seed: int = 0):
    """Seeded normal values made on `dev` itself (a CPU draw of the 16,384-token inputs took seconds each)."""
    g = torch.Generator(device=dev).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=dev) * scale).to(dtype)


def _mhc_args(dev: str, t: int, rows: int, nscale: int) -> tuple:
    x = _randn(dev, t, HC, HIDDEN, seed=1)
    fn = _randn(dev, rows, HC * HIDDEN, dtype=torch.float32, scale=(HC * HIDDEN) ** -0.5, seed=2)
    return (
        x,
        fn,
        _randn(dev, nscale, dtype=torch.float32, scale=0.5, seed=3),
        _randn(dev, rows, dtype=torch.float32, scale=0.5, seed=4),
    )


def _mhc_post_args(dev: str, t: int) -> tuple:
    comb = torch.softmax(_randn(dev, t, HC, HC, dtype=torch.float32, seed=5), -1)
    post = 2 * torch.sigmoid(_randn(dev, t, HC, dtype=torch.float32, seed=6))
    return _randn(dev, t, HIDDEN, seed=7), _randn(dev, t, HC, HIDDEN, seed=8), post, comb


def _rope_args(dev: str, x: torch.Tensor) -> tuple:
    t = x.shape[0]
    pos = torch.randint(0, 1 << 16, (t,), generator=_g(9))
    cos, sin = tk.rope_cos_sin(pos, tk.rope_inv_freq(ROPE, 160000.0, 16.0, 65536))
    return x, cos.to(dev), sin.to(dev), ROPE


def _kv_args(dev: str, t: int) -> tuple:
    kv, cos, sin, rope = _rope_args(dev, _randn(dev, t, HEAD_DIM, scale=3.0, seed=29))
    return kv, _randn(dev, HEAD_DIM, seed=30) + 1.0, cos, sin, rope, 1e-6, 64


def _pool_args(dev: str, windows: int, slots: int) -> tuple:
    kv = _randn(dev, windows, slots, HEAD_DIM, dtype=torch.float32, seed=10)
    return kv, _randn(dev, windows, slots, HEAD_DIM, dtype=torch.float32, seed=11)


def _swiglu_args(dev: str, rows: int) -> tuple:
    h = _randn(dev, rows, 2 * INTER, scale=3.0, seed=12)  # the grouped-GEMM output [rows, 2 * inter]
    return h[:, :INTER], h[:, INTER:], 10.0


def _route_args(dev: str, t: int) -> tuple:
    logits = _randn(dev, t, EXPERTS, dtype=torch.float32, seed=13)
    return logits, _randn(dev, EXPERTS, dtype=torch.float32, scale=0.1, seed=14), TOPK, "sqrtsoftplus", 1.5


def _hash_args(dev: str, t: int) -> tuple:
    tid2eid = torch.randint(0, EXPERTS, (VOCAB, TOPK), generator=_g(15)).to(dev)
    ids = torch.randint(0, VOCAB, (t,), generator=_g(16)).to(dev)
    return _randn(dev, t, EXPERTS, dtype=torch.float32, seed=17), ids, tid2eid, "sqrtsoftplus", 1.5


def _hash_bytes(args: tuple, out: object) -> int:
    """Token ids read whole; only the looked-up table rows and, for the elementwise scorings (sqrtsoftplus here),
    only the topk gathered logits of a token (what the Triton kernel reads); outputs written."""
    logits, ids, tid2eid = args[:3]
    gathered = ids.numel() * tid2eid.shape[1]
    return tensor_bytes((ids, out)) + gathered * (tid2eid.element_size() + logits.element_size())


_MHC = _launcher("triton_mhc", "mhc_pre_triton")
_MHC_HEAD = _launcher("triton_mhc", "mhc_head_triton")
# triton_mhc_fused: only its best config of session 4 per size is timed (spin_bt64 at >= 4,096 tokens, spin below;
# the others ran 0.09-0.41x the two launches in sessions 3-4: kept in the code and the GPU tests)
MHC_FUSED_BEST = ("spin_bt64", "spin")
# ops whose named configs run at every token count, not only the largest (RoPE, pooling, the KV entry: is a config
# that wins at 16,384 tokens also no slower at 4,096, 64 and 1?)
KEEP_VARIANTS = (
    "mhc_pre",
    "mhc_head",
    "apply_rope_interleaved",
    "softmax_pool",
    "kv_norm_rope_quant",
    "per_token_group_quant_fp8",
    "fp8_quant_dequant_ue8m0",
    "swiglu_clamp_fp8",
)


def _mhc_variants(fn: Callable, t: int, all_configs: bool = True) -> dict[str, Callable]:
    """The one-launch kernel next to the API's two launches: impl="fused"'s best config of session 4 for the size
    (spin_bt64 from 4,096 tokens when all_configs, i.e. mhc_pre; else spin). (split_finish_rev, the finish launch
    last-first: 1.00x / 0.98x at 16,384 tokens in session 6, removed.)"""
    fused = MHC_FUSED_BEST[0] if all_configs and t >= 4096 else MHC_FUSED_BEST[1]
    return {f"fused_{fused}": functools.partial(fn, impl="fused", config=fused)}


def _routing(dev: str, t: int, seed: int) -> torch.Tensor:
    """V4-Flash routing: top-6 distinct experts of 256 per token (random scores), int32 [t, 6]."""
    g = torch.Generator(device=dev).manual_seed(seed)
    return torch.rand(t, EXPERTS, generator=g, device=dev).topk(TOPK, dim=1).indices.to(torch.int32)


def _permute_args(dev: str, t: int, block: int | None) -> tuple:
    return _randn(dev, t, HIDDEN, seed=40), _routing(dev, t, 41), EXPERTS, block


def _unpermute_args(dev: str, t: int) -> tuple:
    perm = ref.moe_permute(_randn(dev, t, HIDDEN, seed=42), _routing(dev, t, 43), EXPERTS)
    w = torch.rand(t, TOPK, generator=torch.Generator(device=dev).manual_seed(44), device=dev)
    return _randn(dev, perm.x.shape[0], HIDDEN, seed=45), perm.src_map, w


def _permute_api(x: torch.Tensor, idx: torch.Tensor, e: int, block: int | None):  # noqa: ANN202
    return tk.moe_permute(x, idx, e, block=block)


def _permute_ref(x: torch.Tensor, idx: torch.Tensor, e: int, block: int | None):  # noqa: ANN202
    return ref.moe_permute(x, idx, e, block=block)


def _moe_cases(dev: str, t: int, full: bool) -> list[Case]:
    """moe_permute (block None; with full, also DeepGEMM's 128-row padding) and moe_unpermute."""
    blocks = (None, 128) if full else (None,)
    c = [
        Case(
            "moe_permute",
            f"x [{t}, {HIDDEN}] bf16, {EXPERTS} experts, top-{TOPK}" + ("" if b is None else f", block {b}"),
            lambda b=b: _permute_args(dev, t, b),
            _permute_api,
            _permute_ref,
        )
        for b in blocks
    ]
    c.append(
        Case(
            "moe_unpermute",
            f"y [{t * TOPK}, {HIDDEN}] bf16 -> [{t}, {HIDDEN}], top-{TOPK}",
            lambda: _unpermute_args(dev, t),
            tk.moe_unpermute,
            ref.moe_unpermute,
        )
    )
    c.append(  # the engine's MoE pair order (session 10): the Triton rank sort up to 4,096 keys, torch above
        Case(
            "stable_argsort",
            f"keys [{t * TOPK}] int64, {EXPERTS} distinct",
            lambda: (torch.randint(0, EXPERTS, (t * TOPK,), device=dev),),
            tk.stable_argsort,
            ref.stable_argsort,
        )
    )
    return c


def cases(dev: str, tokens: tuple[int, ...]) -> list[Case]:
    """The benchmark list: every op at each token count in `tokens`, in that order. Named Triton configs run at
    the largest count only, except those of KEEP_VARIANTS' ops (the mHC one-launch configs: `_mhc_variants`; RoPE,
    pooling, the KV entry), at every count. Order per count: MoE permutation, KEEP_VARIANTS' ops, then the other ops."""
    out: list[Case] = []
    for t in tokens:
        full = t == max(tokens)
        for case in _moe_cases(dev, t, full) + sorted(_op_cases(dev, t), key=lambda c: c.op not in KEEP_VARIANTS):
            if not full and case.op not in KEEP_VARIANTS:
                case.variants = {}
            # torch.compile (2-8 s a case) only at the largest count and the launch-bound ones (<= 64 tokens):
            # the time box cannot hold every count's; in between the goals are % of copy and x eager
            case.compile_baseline = full or t <= 64
            out.append(case)
    return out


def _op_cases(dev: str, t: int) -> list[Case]:
    """Every op but the MoE permutation at t tokens (V4-Flash shapes)."""
    c = [
        Case(
            "hash_route",
            f"[{t}, {EXPERTS}] fp32, top-{TOPK}",
            lambda: _hash_args(dev, t),
            tk.hash_route,
            ref.hash_route,
            _hash_bytes,
        ),
        Case(
            "fp4_quant_dequant_ue8m0",
            f"indexer q [{t}, {INDEX_HEADS}, {INDEX_DIM}] bf16, block 32",
            lambda: (_randn(dev, t, INDEX_HEADS, INDEX_DIM, seed=27), 32),
            tk.fp4_quant_dequant_ue8m0,
            ref.fp4_quant_dequant_ue8m0,
            variants={
                f"tile{te}_w{w}": _first(lambda x, b, te=te, w=w: _FP4(x, b, "dequant", tile_elems=te, num_warps=w))
                for te, w in ((8192, 8), (2048, 4))
            },
        ),
        Case(
            "hadamard_transform",
            f"[{t}, {INDEX_HEADS}, {INDEX_DIM}] bf16",
            lambda: (_randn(dev, t, INDEX_HEADS, INDEX_DIM, seed=28),),
            tk.hadamard_transform,
            ref.hadamard_transform,
            variants={"dot": lambda x: _HADAMARD(x, impl="dot")},
        ),
        Case(
            "hadamard_fp4_quant_dequant",
            f"indexer q [{t}, {INDEX_HEADS}, {INDEX_DIM}] bf16, block 32 (fused)",
            lambda: (_randn(dev, t, INDEX_HEADS, INDEX_DIM, seed=31),),
            tk.hadamard_fp4_quant_dequant,
            ref.hadamard_fp4_quant_dequant,
            variants={
                f"tile{te}_w{w}": functools.partial(_HAD_FP4, tile_elems=te, num_warps=w)
                for te, w in ((2048, 8), (2048, 4), (8192, 8))
            },
        ),
        Case(
            "rms_norm",
            f"[{t}, {HIDDEN}] bf16, weight",
            lambda: (_randn(dev, t, HIDDEN, seed=20), _randn(dev, HIDDEN, seed=21) + 1.0),
            tk.rms_norm,
            ref.rms_norm,
        ),
        Case(
            "rms_norm",
            f"[{t}, {HEADS}, {HEAD_DIM}] bf16, no weight (q heads)",
            lambda: (_randn(dev, t, HEADS, HEAD_DIM, seed=22), None),
            tk.rms_norm,
            ref.rms_norm,
        ),
        Case(
            "apply_rope_interleaved",
            f"q [{t}, {HEADS}, {HEAD_DIM}] bf16, rope {ROPE}",
            lambda: _rope_args(dev, _randn(dev, t, HEADS, HEAD_DIM, seed=23)),
            tk.apply_rope_interleaved,
            ref.apply_rope_interleaved,
            # the default issues the rotate loads early up to 16M elements (q up to 512 tokens), late above: one
            # of the two configs is the default itself at each count
            variants={
                "early_rot": functools.partial(_ROPE, early_rotate=True),
                "late_rot": functools.partial(_ROPE, early_rotate=False),
                "cs_rt": functools.partial(_ROPE, cs_rt=True),  # session 6: see ROPE_KV_CONFIGS
            },
            smoke_variants=False,  # 512 one-row programs at the smoke shape: ~20 s interpreted
        ),
        Case(
            "apply_rope_interleaved",
            f"kv [{t}, {HEAD_DIM}] bf16, rope {ROPE}",
            lambda: _rope_args(dev, _randn(dev, t, HEAD_DIM, seed=24)),
            tk.apply_rope_interleaved,
            ref.apply_rope_interleaved,
            variants={name: functools.partial(_ROPE, **kw) for name, kw in ROPE_KV_CONFIGS.items()},
        ),
        Case(
            "swiglu_clamp",
            f"h [{t * TOPK}, {2 * INTER}] bf16 halves, limit 10",
            lambda: _swiglu_args(dev, t * TOPK),
            tk.swiglu_clamp,
            ref.swiglu_clamp,
        ),
        Case(
            "per_token_group_quant_fp8",
            f"[{t}, {HIDDEN}] bf16, group 128, ue8m0",
            lambda: (_randn(dev, t, HIDDEN, seed=25), 128, "ue8m0"),
            tk.per_token_group_quant_fp8,
            ref.per_token_group_quant_fp8,
            # round 2: indexing / tiles per program (tile4096_w8 / tile16384_w8, 0.93x / 0.94x in session 5: dropped)
            variants={name: _ptgq(**kw) for name, kw in PTGQ_CONFIGS.items()},
        ),
        Case(
            "fp8_quant_dequant_ue8m0",
            f"kv [{t}, {HEAD_DIM}][:, :448] bf16, block 64",
            lambda: (_randn(dev, t, HEAD_DIM, seed=26)[:, :448], 64),
            tk.fp8_quant_dequant_ue8m0,
            ref.fp8_quant_dequant_ue8m0,
            # round 2 (tile2048_w4, 1.01x in session 5: dropped)
            variants={
                name: _first(lambda x, b, kw=kw: _QUANT(x, b, "dequant", **kw)) for name, kw in KVQ_CONFIGS.items()
            },
        ),
        Case(
            "swiglu_clamp_fp8",
            f"h [{t * TOPK}, {2 * INTER}] bf16 halves, group 128, ue8m0",
            lambda: (*_swiglu_args(dev, t * TOPK), 128, "ue8m0"),
            tk.swiglu_clamp_fp8,
            ref.swiglu_clamp_fp8,
            # round 2 (tile8192_w8, 0.99x in session 5: dropped)
            variants={name: _swiglu_fp8(**kw) for name, kw in SWIGLU_FP8_CONFIGS.items()},
        ),
        Case(
            "kv_norm_rope_quant",
            f"kv [{t}, {HEAD_DIM}] bf16, rope {ROPE}, FP8 blocks of 64",
            lambda: _kv_args(dev, t),
            tk.kv_norm_rope_quant,
            ref.kv_norm_rope_quant,
            # bt*_w1: more rows per 1-warp program (1.04-1.08x from 4,096 tokens up in session 5's 14:30 run; each
            # row keeps the default's sum order: bit-exact, tests/test_kv_rows_exact.py); rows_rule: the size rule
            # triton_fused.KV_ROWS_RULE (bt4_w1 from 16,384 tokens, bt2_w1 from 4,096, one row below; the API's tiling
            # since session 6 run 1, DEEPINFER_TK_KV_ROWS=0 turns it off); bt2_w2 / early_cs: session-3 / -4 configs.
            # (pf2 / pf4 / pf8 / pf4_nocap, a prefetching loop kernel, 0.44-0.93x from 4,096 up: removed)
            variants={
                **{
                    f"bt{bt}_w{w}": functools.partial(_KV, block_t=bt, num_warps=w)
                    for bt, w in ((2, 1), (4, 1), (2, 2))
                },
                "rows_rule": functools.partial(_KV, row_rule=True),
                "early_cs": functools.partial(_KV, early_cos_sin=True),
                # session 6: the API's tiling with the lean quant-dequant (the API default since run 3)
                "lean": functools.partial(_KV, lean=True),
            },
        ),
        Case(
            "softmax_pool",
            f"CSA [{max(1, t // 4)}, 8, {HEAD_DIM}] fp32",
            lambda: _pool_args(dev, max(1, t // 4), 8),
            tk.softmax_pool,
            ref.softmax_pool,
            # the default tile with 4 warps (the default from 1,024 windows up since session 5's 14:30 run, see
            # triton_pool.FEW_WARPS_WINDOWS) and with 8 (the default below): both sides of the size rule
            variants={f"bc512_w{w}": functools.partial(_POOL, block_c=512, num_warps=w) for w in (4, 8)},
        ),
        Case(
            "softmax_pool",
            f"HCA [{max(1, t // 128)}, 128, {HEAD_DIM}] fp32",
            lambda: _pool_args(dev, max(1, t // 128), 128),
            tk.softmax_pool,
            ref.softmax_pool,
            variants={
                f"bc{bc}_w{w}": functools.partial(_POOL, block_c=bc, num_warps=w) for bc, w in ((32, 8), (64, 4))
            },
        ),
        Case(
            "moe_route",
            f"[{t}, {EXPERTS}] fp32, top-{TOPK}, sqrtsoftplus",
            lambda: _route_args(dev, t),
            tk.moe_route,
            ref.moe_route,
            variants={  # several tokens per program (the default: one token, one warp at E = 256)
                f"bt{bt}_w{w}": functools.partial(_ROUTE, block_t=bt, num_warps=w)
                for bt, w in ((4, 4), (8, 4), (16, 8))
            },
        ),
    ]
    c += [
        Case(
            "mhc_pre",
            f"[{t}, {HC}, {HIDDEN}] bf16",
            lambda: _mhc_args(dev, t, (2 + HC) * HC, 3),
            tk.mhc_pre,
            ref.mhc_pre,
            variants=_mhc_variants(_MHC, t),
            smoke_variants=False,  # ~3 s a call interpreted at V4 width; the unit tests cover the kernel
        ),
        Case(
            "mhc_post",
            f"[{t}, {HC}, {HIDDEN}] bf16",
            lambda: _mhc_post_args(dev, t),
            tk.mhc_post,
            ref.mhc_post,
        ),
        Case(
            "mhc_head",
            f"[{t}, {HC}, {HIDDEN}] bf16",
            lambda: _mhc_args(dev, t, HC, 1),
            tk.mhc_head,
            ref.mhc_head,
            variants=_mhc_variants(_MHC_HEAD, t, all_configs=False),
            smoke_variants=False,
        ),
    ]
    return c


def tensor_bytes(obj: object) -> int:
    """Bytes of every tensor in obj (a tensor, or nested tuples / lists of them); other values count 0."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(o) for o in obj)
    return 0
