"""One kernel call per target inside an NVTX range "prof", for Nsight Compute (`scripts/gpu_quick.sh` part ncu:).

    ncu --nvtx --nvtx-include "prof/" ... python3 benchmarks/ncu_targets.py TARGET [TARGET ...]

Targets (V4-Flash shapes, random data; two warm-up calls each, then the profiled call):
  w4a8_rs     deep_gemm W4A8 `cuda_rs2s4n256`, 64 experts x 1,024 tokens, (n, k) = (4096, 4096)
  fp8_grouped deep_gemm FP8 grouped API, same shape (the 0.85x goal's baseline)
  fm_fp8      flash_mla ws3p1 on the FP8 cache, decode b 128 x s_q 2, topk 640
  fm_fp8v     flash_mla ws3p1v (session 9's lane-uniform FP8 producer, the FP8 default), same case
  fm_bf16     flash_mla ws3p1l on the BF16 cache, same case
  fm_prefill  flash_mla default on a BF16 cache, prefill t 4,096, topk 640
  fp8_db      deep_gemm fp8_db (double-buffered promotion, cp.async producer), same shape as w4a8_rs
  fp8_db_t4   deep_gemm fp8_db with the TMA producer, 4 stages (session 10: is it L2-bound?), same shape
  fp8_wide_t4 deep_gemm fp8_wide (128 x 256 tiles, one temporary; session 12), 4 stages, same shape
  w4a8_wide   deep_gemm W4A8 wide kernel (session 13: prepared FP4 chunks converted by the producer warpgroup, fp8_wide's
              consumers), same shape
  fm_b2       flash_mla public sparse_attn_decode, FP8 cache, b 2 x s_q 2, topk 640 (the "no slower at b = 2" goal)
  fm_fp8_api  flash_mla public sparse_attn_decode, FP8 cache, b 128 x s_q 2, topk 640 (the 1.2x goal's case)
  fm_bf16_api the same on the BF16 cache
  fm_hca1     flash_mla public sparse_attn_decode, BF16 cache, b 1 x s_q 1, HCA at 1M context (128 window + 8,192
              compressed rows): the split kernel and its merge (the 3 TB/s goal's case)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
for _p in ("flash_mla/benchmarks", "deep_gemm/benchmarks"):
    sys.path.insert(0, str(_ROOT / "packages" / _p))

import torch  # noqa: E402

H, D = 64, 512


def _w4a8(impl: str) -> Callable[[], object]:
    import bench_dg_w4a8_ws as ws

    g, tpe, n, k = 64, 1024, 4096, 4096
    op = ws._operands(tpe, n, k, g, "cuda")
    fp8 = (ws._fp8_bytes((g, n, k), "cuda"), torch.rand(g, n // 128, k // 128, device="cuda") + 0.5)
    ws.IMPLS = (impl,) if impl != ws.FP8_API else ()
    calls = ws._calls(op, n, k, g, "cuda", *fp8)
    return calls[impl][0]


def _fp8_db(tma: bool = False, stages: int = 5, wide: bool = False) -> Callable[[], object]:
    import bench_dg_w4a8_ws as ws

    from deepinfer.deep_gemm.backends.cuda import cuda_fp8_db as db

    g, tpe, n, k = 64, 1024, 4096, 4096
    op = ws._operands(tpe, n, k, g, "cuda")
    b = ws._fp8_bytes((g, n, k), "cuda")
    sfb = torch.rand(g, n // 128, k // 128, device="cuda") + 0.5
    out = torch.empty(op["m"], n, device="cuda", dtype=torch.bfloat16)
    kw = dict(stages=stages, tma=tma, wide=wide)
    return lambda: db.m_grouped_fp8_gemm_nt_offsets_db(op["a"], op["sfa"], b, sfb, op["offs"], out, **kw)


def _w4a8_wide() -> Callable[[], object]:
    import bench_dg_w4a8_ws as ws

    from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_wide as ww
    from deepinfer.deep_gemm.backends.cuda import w4a8_wide_pack as wp

    g, tpe, n, k = 64, 1024, 4096, 4096
    op = ws._operands(tpe, n, k, g, "cuda")
    w = wp.prepare_w4a8_wide(op["packed"], op["scales"])
    out = torch.empty(op["m"], n, device="cuda", dtype=torch.bfloat16)
    return lambda: ww.m_grouped_fp8_fp4_gemm_nt_offsets_wide(op["a"], op["sfa"], w, op["offs"], out)


def _hca1() -> Callable[[], object]:
    from bench_flash_mla import decode_indices

    from deepinfer.flash_mla import api

    gen = torch.Generator(device="cuda").manual_seed(0)
    idx = decode_indices(1, 1, 8192, 8192, 128, 8192 + 128, gen)
    kv = torch.randn(8192 + 128, D, generator=gen, device="cuda").bfloat16()
    q = torch.randn(1, 1, H, D, generator=gen, device="cuda").bfloat16()
    sink = torch.randn(H, generator=gen, device="cuda")
    return lambda: api.sparse_attn_decode(q, kv, idx, sink, D**-0.5)


def _attn(cache: str, variant: str | None, prefill: bool, b: int = 128) -> Callable[[], object]:
    from bench_flash_mla import decode_indices, prefill_indices

    from deepinfer.flash_mla import api
    from deepinfer.flash_mla.backends.cuda import cuda_ws_decode as ws

    gen = torch.Generator(device="cuda").manual_seed(0)
    if prefill:
        idx, rows = prefill_indices(4096, 512, 128, gen)
    else:
        idx, rows = decode_indices(b, 2, 16384, 512, 128, 16384 + 128, gen), b * (16384 + 128)
        idx = idx.reshape(2 * b, -1)
    kv = torch.randn(rows, D, generator=gen, device="cuda").bfloat16()
    kv = api.pack_fp8_kv(kv) if cache == "fp8" else kv
    q = torch.randn(idx.shape[0], H, D, generator=gen, device="cuda").bfloat16()
    sink = torch.randn(H, generator=gen, device="cuda")
    if variant == "api":
        q4, idx3 = q.view(b, 2, H, D), idx.view(b, 2, -1)
        return lambda: api.sparse_attn_decode(q4, kv, idx3, sink, D**-0.5)
    if variant is None:
        return lambda: api.sparse_attn_prefill(q, kv, idx, sink, D**-0.5)
    return lambda: ws.sparse_attn_ws(q, kv, idx, sink, D**-0.5, variant=variant)


TARGETS: dict[str, Callable[[], Callable[[], object]]] = {
    "w4a8_rs": lambda: _w4a8("cuda_rs2s4n256"),
    "fp8_grouped": lambda: _w4a8("fp8_grouped_api"),
    "fp8_db": _fp8_db,
    "fp8_db_t4": lambda: _fp8_db(tma=True, stages=4),
    "fp8_wide_t4": lambda: _fp8_db(tma=True, stages=4, wide=True),
    "w4a8_wide": _w4a8_wide,
    "fm_fp8": lambda: _attn("fp8", "ws3p1", False),
    "fm_fp8v": lambda: _attn("fp8", "ws3p1v", False),
    "fm_bf16": lambda: _attn("bf16", "ws3p1l", False),
    "fm_prefill": lambda: _attn("bf16", None, True),
    "fm_b2": lambda: _attn("fp8", "api", False, b=2),
    "fm_fp8_api": lambda: _attn("fp8", "api", False),
    "fm_bf16_api": lambda: _attn("bf16", "api", False),
    "fm_hca1": _hca1,
}


def main(names: list[str]) -> int:
    """Run each named target: two warm-up calls, then one call inside the NVTX range "prof"."""
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        print(f"targets: expected some of {sorted(TARGETS)}, got {names}", file=sys.stderr)
        return 2
    for name in names:
        fn = TARGETS[name]()
        fn(), fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("prof")
        fn()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(f"profiled {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
