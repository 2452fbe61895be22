"""Benchmark cases of `bench_deep_gemm.py`: operands, the implementations to time, FLOPs and bytes.

A case is (op, shape, {impl name: zero-argument callable}, flops, bytes, ceilings); impls whose name starts with
"dg" are this package's, the others are baselines from the same run (torch._scaled_mm, torch.matmul,
torch._grouped_mm). Operands are random (never zeros); values do not matter for time, so the baselines get their
own random weights of the same shapes rather than dequantised copies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from deepinfer import deep_gemm as dg
from deepinfer.deep_gemm import api_w4a8 as dg_w4a8
from deepinfer.deep_gemm.backends.cuda.w4a8_configs import W4A8Config, default_w4a8_config
from deepinfer.deep_gemm.backends.cuda.w4a16_configs import (
    DECODE,
    MID,
    PREFILL,
    PREFILL_256,
    V3_DECODE,
    W4A16Config,
    cuda_config,
    default_config,
    parse_config,
)

FP8 = torch.float8_e4m3fn

# V4-Flash dense linear (n, k) shapes and token counts (issue 6).
DENSE_NK = [(1024, 4096), (32768, 1024), (512, 4096), (4096, 8192), (4096, 2048), (2048, 4096), (8192, 1024)]
DENSE_M = [1, 64, 128, 4096, 16384]
# MoE experts: gate+up fused (n = 2 x 2048, k = 4096) and down (the engine's shape: n = 4096, k = 2048).
EXPERT_NK = {"gate_up": (4096, 4096), "down": (4096, 2048)}
NUM_EXPERTS, TOP_K = 256, 6
# Grouped row layouts: the engine's decode / prefill (random top-6 routing) and uniform tokens per expert.
GROUPED = {
    "decode_b4": ("random", 4, "decode"),  # small-batch decode: ~24 active experts, where split-K should matter
    "decode_b32": ("random", 32, "decode"),
    "decode_b256": ("random", 256, "decode"),
    "tpe8": ("uniform", 8, "decode"),
    "tpe64": ("uniform", 64, "mid"),  # the top of the memory-bound regime (the CUDA W4A16 kernel's range)
    "prefill_32x256": ("random", 32 * 256, "prefill"),
    "tpe256": ("uniform", 256, "prefill"),
}


@dataclasses.dataclass
class Case:
    op: str
    shape: dict
    impls: dict[str, Callable[[], object]]
    flops: float
    nbytes: float  # minimum bytes moved by this package's implementation (weights read once, a, out)
    compute_ceiling: str  # key of kernelkit.H200_CEILINGS
    config: dict[str, str] = dataclasses.field(default_factory=dict)  # impl -> config name
    compare_to: tuple[str, ...] = ()  # package impls that also count as baselines (FP8-expert vs FP4-expert)
    out: torch.Tensor | None = None  # the buffer every `dg_w4a16[...]` impl writes: results are cross-checked
    # bytes an impl really reads / writes when they differ from `nbytes` (FP8 weights, FP8 activations): the
    # GB/s column of those impls uses these
    impl_bytes: dict[str, float] = dataclasses.field(default_factory=dict)


SMALL_M = [1, 32, 64]  # decode rows of a dense linear (bf16 weights, the engine's path today)


def bf16_smallm_cases(dev: str, ms: list[int], nks: list[tuple[int, int]]) -> list[Case]:
    """bf16_gemm_nt at decode row counts (the small-m split-K Triton path) vs cuBLAS (torch.matmul)."""
    cases = []
    for n, k in nks:
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        for m in ms:
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            impls = {
                "dg_bf16_gemm_nt": lambda a=a, w=w, out=out: dg.bf16_gemm_nt(a, w, out),
                "torch_matmul_bf16": lambda a=a, w=w: torch.matmul(a, w.t()),
            }
            nbytes = 2 * (m * k + n * k + m * n)
            cases.append(Case("bf16_gemm_nt", {"m": m, "n": n, "k": k}, impls, 2.0 * m * n * k, nbytes, "bf16_tflops"))
    return cases


def _fp8_pair(rows: int, k: int, dev: str, block_rows: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Random e4m3 values and positive fp32 scales: [rows, k/128] (1x128) or [rows/128, k/128] (128x128)."""
    x = (torch.randn(rows, k, device=dev) * 4).to(FP8)
    srows = -(-rows // 128) if block_rows else rows
    return x, torch.rand(srows, -(-k // 128), device=dev) + 0.5


def dense_fp8_cases(dev: str, ms: list[int], nks: list[tuple[int, int]]) -> list[Case]:
    """fp8_gemm_nt (1x128 x 128x128 block scales) vs torch._scaled_mm (row-wise) and bf16 torch.matmul."""
    cases = []
    for n, k in nks:
        b = _fp8_pair(n, k, dev, block_rows=True)
        b_bf16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        sb_row = torch.rand(1, n, device=dev) + 0.5
        for m in ms:
            a = _fp8_pair(m, k, dev, block_rows=False)
            a_bf16 = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            sa_row = torch.rand(m, 1, device=dev) + 0.5
            out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            impls = {
                "dg_fp8_gemm_nt": lambda a=a, b=b, out=out: dg.fp8_gemm_nt(a, b, out),  # auto: CUTLASS or Triton
                "dg_fp8_triton": _triton_fp8_call(a, b, out),
                "torch_scaled_mm_rowwise": lambda a=a, b=b, sa=sa_row, sb=sb_row: torch._scaled_mm(
                    a[0], b[0].t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16
                ),
                "torch_matmul_bf16": lambda x=a_bf16, w=b_bf16: torch.matmul(x, w.t()),
            }
            cut_out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            impls.update(_cutlass_fp8_impls(a, b, m, n, cut_out))
            nbytes = m * k + n * k + 2 * m * n + 4 * (m + n // 128 + 1) * (k // 128)
            cases.append(Case("fp8_gemm_nt", {"m": m, "n": n, "k": k}, impls, 2.0 * m * n * k, nbytes, "fp8_tflops",
                              compare_to=("dg_fp8_gemm_nt", "dg_fp8_triton"), out=cut_out))  # fmt: skip
    return cases


def _triton_fp8_call(a: tuple, b: tuple, out: torch.Tensor) -> Callable[[], object]:
    """The Triton FP8 GEMM forced (the API's auto choice may run CUTLASS); the reference off CUDA."""
    if not a[0].is_cuda:
        return lambda: dg.fp8_gemm_nt(a, b, out)
    from deepinfer.deep_gemm.backends.cuda.triton_fp8_gemm import fp8_gemm_nt_triton

    return lambda: fp8_gemm_nt_triton(a[0], a[1], b[0], b[1], out)


# CUTLASS variants timed per shape: (name, config, knobs); configs 2-4 only when `_C` has them. "dp" = data-parallel
# (no stream-K fix-up), "sk" = forced stream-K, "splitk4" = split-K by 4, "swzN" = tile swizzle N, "rN"/"rM" =
# raster along N/M (cutlass_fp8 module docstring).
_CUTLASS_ALL = [("coop", 0, {}), ("pingpong", 1, {}), ("coop_k", 2, {}), ("pingpong_k", 4, {})]
_CUTLASS_SMALL_M = [("coop_k,splitk4", 2, {"decomposition": 2, "splits": 4}), ("coop_k,sk", 2, {"decomposition": 3})]
_CUTLASS_LARGE_M = [
    ("coop_k,dp", 2, {"decomposition": 1}),
    ("coop_k,dp,swz4", 2, {"decomposition": 1, "swizzle": 4}),
    ("coop_k,dp,rN", 2, {"decomposition": 1, "raster": 2}),
    ("coop_k_2x1", 3, {}),
    ("coop_k_2x1,dp", 3, {"decomposition": 1}),
    ("coop_k_2x1,dp,rM", 3, {"decomposition": 1, "raster": 1}),
    ("coop_k_2x2", 5, {}),
    ("coop_k_2x2,dp", 5, {"decomposition": 1}),
    ("pingpong_k,swz4", 4, {"swizzle": 4}),
]


def _cutlass_fp8_impls(a: tuple, b: tuple, m: int, n: int, out: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The CUTLASS FP8 GEMM per config / scheduler variant (when `_C` was built with CUTLASS), all into `out`, plus
    config 0 with the A scales already M-major (the per-call sfa transpose skipped: its cost is the difference)."""
    from deepinfer.deep_gemm.backends.cuda import cutlass_fp8 as cf

    if not (a[0].is_cuda and cf.available()):
        return {}
    sfa_t = cf.sfa_mn_major(a[1])
    variants = _CUTLASS_ALL + (_CUTLASS_SMALL_M if m <= 128 else _CUTLASS_LARGE_M)
    impls = {
        f"dg_fp8_cutlass[{name}]": lambda cfg=cfg, kw=kw: cf.fp8_gemm_nt_cutlass(
            a[0], a[1], b[0], b[1], out, config=cfg, **kw
        )
        for name, cfg, kw in variants
        if cfg < cf.built_configs()
    }
    impls["dg_fp8_cutlass[coop,sfa_mn]"] = lambda: cf.fp8_gemm_nt_cutlass(
        a[0], sfa_t, b[0], b[1], out, config=0, sfa_is_mn_major=True
    )
    return impls


def group_counts(kind: str, size: int, g: int, seed: int = 0) -> torch.Tensor:
    """Rows per group (int64 [g], CPU): 'random' = top-6 routing of `size` tokens, 'uniform' = `size` each."""
    if kind == "uniform":
        return torch.full((g,), size, dtype=torch.int64)
    scores = torch.rand(size, g, generator=torch.Generator().manual_seed(seed))
    experts = scores.topk(min(TOP_K, g), dim=1).indices.flatten()
    return torch.bincount(experts, minlength=g)


def _fp4_weights(g: int, n: int, k: int, dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    packed = torch.randint(0, 256, (g, n, k // 2), device=dev, dtype=torch.uint8)
    scales = torch.randint(118, 128, (g, n, k // 32), device=dev, dtype=torch.uint8)
    return packed, scales


def _scaled_mm_loop(a: torch.Tensor, sa: torch.Tensor, w: torch.Tensor, sw: torch.Tensor, counts: list[int]):
    """The issue's grouped FP8 baseline: one row-wise-scaled torch._scaled_mm per non-empty expert."""

    def run() -> None:
        start = 0
        for e, c in enumerate(counts):
            if c:
                torch._scaled_mm(
                    a[start : start + c], w[e].t(), scale_a=sa[start : start + c], scale_b=sw[e],
                    out_dtype=torch.bfloat16,
                )  # fmt: skip
            start += c

    return run


FP8_GROUPED = "dg_fp8_grouped_triton"


def _fp8_grouped_call(a8: torch.Tensor, w: torch.Tensor, sfb: torch.Tensor, per_group: int, g: int):
    """The Triton grouped FP8 GEMM (128x128 weight scales) on `per_group` rows per group: the masked layout for
    decode sizes (<= 64 rows), DeepGEMM's aligned contiguous layout otherwise (per_group % 128 == 0 there)."""
    from deepinfer.deep_gemm.backends.cuda import triton_fp8_grouped as fg

    k = a8.shape[1]
    sfa = torch.rand(a8.shape[0], -(-k // 128), device=a8.device) + 0.5
    out = torch.empty(a8.shape[0], w.shape[1], device=a8.device, dtype=torch.bfloat16)
    if per_group <= 64:
        a3, sfa3, out3 = a8.view(g, per_group, k), sfa.view(g, per_group, -1), out.view(g, per_group, -1)
        cnt = torch.full((g,), per_group, dtype=torch.int32, device=a8.device)
        return lambda: fg.m_grouped_fp8_masked_triton(a3, sfa3, w, sfb, out3, cnt, per_group)
    ids = torch.arange(g, device=a8.device, dtype=torch.int32).repeat_interleave(per_group)
    return lambda: fg.m_grouped_fp8_contiguous_triton(a8, sfa, w, sfb, out, ids, expected_m=per_group)


FP8_API = "dg_fp8_grouped_api"  # the FP8 grouped API, contiguous layout: CUTLASS (the fastest FP8 grouped path)


def _fp8_grouped_api_call(a8: torch.Tensor, w: torch.Tensor, sfb: torch.Tensor, counts: torch.Tensor):
    """The FP8-expert baseline the FP4 goals are measured against: `m_grouped_fp8_gemm_nt_contiguous` (the API,
    contiguous layout: CUTLASS grouped on CUDA, config by rows per expert, the same kernels as the
    `dg_fp8_grouped_cutlass[pingpong]` / `[coop_2x1]` rows of bench_fp8_dense.py) on the case's per-expert counts
    (rows expert-sorted, no padding; empty experts have no rows)."""
    k, dev = a8.shape[1], a8.device
    sfa = torch.rand(a8.shape[0], -(-k // 128), device=dev) + 0.5
    out = torch.empty(a8.shape[0], w.shape[1], device=dev, dtype=torch.bfloat16)
    ids = torch.arange(counts.numel(), dtype=torch.int32).repeat_interleave(counts).to(dev)
    return lambda: dg.m_grouped_fp8_gemm_nt_contiguous((a8, sfa), (w, sfb), out, ids)


def _fp8_masked_counts_call(w: torch.Tensor, sfb: torch.Tensor, counts: torch.Tensor, k: int):
    """The masked Triton FP8 grouped GEMM on ragged per-expert row counts (decode routing: the FP8-expert
    kernel the W4A16 decode path is compared with): a [g, max count, k], masked_m = counts."""
    from deepinfer.deep_gemm.backends.cuda import triton_fp8_grouped as fg

    g, m_max, dev = counts.numel(), max(int(counts.max()), 1), w.device
    a3 = (torch.randn(g, m_max, k, device=dev) * 4).to(FP8)
    sfa3 = torch.rand(g, m_max, -(-k // 128), device=dev) + 0.5
    out3 = torch.empty(g, m_max, w.shape[1], device=dev, dtype=torch.bfloat16)
    cnt = counts.to(torch.int32).to(dev)
    rows = -(-int(counts.sum()) // max(int((counts > 0).sum()), 1))  # rows per active expert: the tile hint
    return lambda: fg.m_grouped_fp8_masked_triton(a3, sfa3, w, sfb, out3, cnt, rows)


def _w4a16_call(a: torch.Tensor, w: tuple, offs: torch.Tensor, out: torch.Tensor, cfg: W4A16Config | None):
    """The package's W4A16 grouped GEMM with a fixed config (None: the shape heuristic)."""
    return lambda: dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a, w, offs, out, config=cfg)


# Triton W4A16 tiles timed per regime ("mid": 17-96 rows per group, the 64-tokens-per-expert case). Trimmed in
# session 5 to the defaults and the configs that were ever fastest (the full SWEEP is every config's GPU test):
# at decode sizes the CUDA kernels beat every Triton tile by 1.4-2x in the session-4 and -5 runs, so only the
# decode default and kernel 3 on its tiles stay; at prefill the 256-row tiles (the default) and 128-row kernel 2.
W4A16_SWEEP = {"decode": (DECODE, V3_DECODE), "mid": (MID, DECODE), "prefill": (PREFILL_256, PREFILL)}
# W4A8 (its default is timed as well, `dg_w4a8[default]`): the session-5 run's fastest tile per regime.
W4A8_SWEEP_ALL = {
    "decode": (W4A8Config(16, 128, num_warps=4, num_stages=4),),
    "mid": (W4A8Config(64, 128, num_warps=8, num_stages=3),),
    "prefill": (W4A8Config(64, 128, num_warps=8, num_stages=3),),
}
# CUDA W4A16 variants timed per regime, by name: kernel 5 (`...cp`, persistent; the API's default up to 16 rows per
# group) next to kernel 4 (`...cu`, its default variants only: the 128-row, 8-warp and 6-stage kernel-4 variants
# lost to them in sessions 4 and 5). Mid (64 per expert): kernel 4's fastest there next to kernel 5 with 16, 32 and
# 64 tokens per block (the 32 / 64 variants are new in session 5: not GPU-run before; the API does not pick them).
# Session 6: kernel 5's 128-row tile with 256-k stages (`m8n128k256w4s4cp`) next to the default (`m8n128k512w4s2cp`).
CUDA_NAMES = {
    "decode": (
        "m8n64k256w4s4cu", "m16n64k256w4s4cu",
        "m8n64k256w4s4cp", "m8n64k512w4s2cp", "m8n128k512w8s2cp", "m8n128k256w4s3cp", "m8n128k512w4s2cp",
        "m8n64k256w4s3cp", "m16n64k256w4s4cp", "m16n64k512w4s2cp", "m8n128k256w4s4cp",
    ),
    "mid": (
        "m64n128k256w8s3cu",
        "m16n64k512w4s2cp", "m32n64k256w4s4cp", "m32n128k256w4s3cp", "m32n128k512w8s2cp", "m64n128k256w8s3cp",
    ),
    "prefill": (),
}  # fmt: skip


def _w4a16_impl_call(a: torch.Tensor, w: tuple, offs: torch.Tensor, out: torch.Tensor, impl: str):
    """The W4A16 API with env DEEPINFER_DG_W4A16_IMPL = `impl` (auto: CUDA kernel at <= `CUDA_MAX_ROWS` rows per
    group when `_C` has it, else Triton) around the call, so the rows time the API's own dispatch."""
    import os

    from deepinfer.deep_gemm import api_w4a16

    def run() -> object:
        old = os.environ.get(api_w4a16.IMPL_ENV)
        os.environ[api_w4a16.IMPL_ENV] = impl
        try:
            return dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a, w, offs, out)
        finally:
            if old is None:
                del os.environ[api_w4a16.IMPL_ENV]
            else:
                os.environ[api_w4a16.IMPL_ENV] = old

    return run


def _api_config_name(a: torch.Tensor, g: int) -> str:
    """Name of the config the W4A16 API runs without `config=` (impl auto) for a [m, k] over g groups: the CUDA
    rule where `_C` has the kernels and `a` is on CUDA, else the Triton default."""
    from deepinfer.deep_gemm.backends.cuda import cuda_fp4_grouped as cu
    from deepinfer.deep_gemm.backends.cuda import w4a16_configs as cfgs

    m = a.shape[0]
    if a.is_cuda and cu.available():
        kernel = cfgs.CUDA_DEFAULT_KERNEL if cu.available_p() and g <= cfgs.CUDA_P_MAX_GROUPS else 4
        auto = cuda_config(m, g, kernel=kernel)
        if auto is not None:
            return auto.name
    return default_config(m, g).name


def _w4a16_cuda_impls(a, w: tuple, offs, out, regime: str) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """The CUDA W4A16 kernels per name of CUDA_NAMES[regime] (through the API with `config=`; names `_C` was built
    without are left out) and the API's auto choice (only where `_C` has kernel 4 and the operands are on CUDA:
    elsewhere the rows would only repeat the Triton ones)."""
    from deepinfer.deep_gemm.backends.cuda import cuda_fp4_grouped as cu
    from deepinfer.deep_gemm.backends.cuda.w4a16_configs import cuda_p_variant, cuda_variant

    if not (a.is_cuda and cu.available()):
        return {}, {}
    built = {4: set(cu.compiled_variants()), 5: set(cu.compiled_p_variants())}
    impls, config = {}, {}
    for name in CUDA_NAMES.get(regime, ()):
        cfg = parse_config(name)
        if (cuda_variant(cfg) if cfg.kernel == 4 else cuda_p_variant(cfg)) in built[cfg.kernel]:
            impls[f"dg_w4a16[{name}]"] = _w4a16_call(a, w, offs, out, cfg)
            config[f"dg_w4a16[{name}]"] = name
    if CUDA_NAMES.get(regime):
        impls["dg_w4a16[auto]"] = _w4a16_impl_call(a, w, offs, out, "auto")
        config["dg_w4a16[auto]"] = _api_config_name(a, offs.numel())
    return impls, config


# Opt-in W4A16 path prepared in session 5 (not yet GPU-run): dequantise chunks of experts to bf16, then CUTLASS's
# grouped bf16 GEMM (backends/cuda/cutlass_w4a16_dq.py). Timed at >= 64 rows per expert ("mid" / "prefill" regimes)
# per config, and through the API (`DEEPINFER_DG_W4A16_IMPL=cutlass_dq`) as `dg_w4a16[impl=cutlass_dq]`.
DQ_REGIMES = ("mid", "prefill")


def _w4a16_dq_impls(a, w: tuple, offs, out, regime: str) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """The dequantise-then-CUTLASS-grouped-bf16 W4A16 path per config, into `out` (none without `_C` support)."""
    from deepinfer.deep_gemm.backends.cuda import cutlass_w4a16_dq as dq

    if regime not in DQ_REGIMES or not (a.is_cuda and dq.available()):
        return {}, {}
    impls, config = {}, {}
    for cfg, cname in dq.CONFIGS.items():
        name = f"dg_w4a16[cutlass_dq,{cname}]"
        impls[name] = lambda cfg=cfg: dq.m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq(
            a, w[0], w[1], offs, out, config=cfg
        )
        config[name] = f"cutlass_dq,{cname}"
    impls["dg_w4a16[impl=cutlass_dq]"] = _w4a16_impl_call(a, w, offs, out, "cutlass_dq")
    rows = -(-a.shape[0] // max(offs.numel(), 1))
    config["dg_w4a16[impl=cutlass_dq]"] = f"cutlass_dq,{dq.CONFIGS[dq.auto_config(rows)]}"
    return impls, config


# Tokens per expert of the dedicated W4A16-vs-FP8 cases (`w4a16_dq_cases`): the brief's 64 / 256 / 1024.
DQ_TPE = (64, 256, 1024)


def w4a16_dq_cases(dev: str, tpes: tuple[int, ...], nks: dict[str, tuple[int, int]], g: int) -> list[Case]:
    """W4A16 at `tpe` rows per expert (uniform, all g experts): the API default (`dg_w4a16[default]`), the
    dequantise-then-CUTLASS path per config and through the API, vs torch._grouped_mm on bf16 weights and the FP8
    grouped API (the goal's baseline), all from one run. Lighter than `w4a16_cases` (no Triton / W4A8 sweep)."""
    cases = []
    for wname, (n, k) in nks.items():
        packed, scales = _fp4_weights(g, n, k, dev)
        w_bf16 = torch.randn(g, n, k, device=dev, dtype=torch.bfloat16)
        w_fp8, sfb_fp8 = _fp8_weights3(g, n, k, dev)
        for tpe in tpes:
            counts = group_counts("uniform", tpe, g)
            m = int(counts.sum())
            offs = counts.cumsum(0).to(torch.int32).to(dev)
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            impls = {"dg_w4a16[default]": _w4a16_call(a, (packed, scales), offs, out, None)}
            config = {"dg_w4a16[default]": _api_config_name(a, g)}
            dq_impls, dq_config = _w4a16_dq_impls(a, (packed, scales), offs, out, "prefill")
            impls.update(dq_impls)
            config.update(dq_config)
            if dq_impls:  # one expert per chunk: is a chunk whose bf16 copy may stay in L2 worth 3 launches each?
                from deepinfer.deep_gemm.backends.cuda import cutlass_w4a16_dq as dq

                impls["dg_w4a16[cutlass_dq,coop,chunk1]"] = lambda a=a, p=packed, s=scales, o=offs, out=out: (
                    dq.m_grouped_bf16_fp4_gemm_nt_contiguous_cutlass_dq(a, p, s, o, out, config=0, chunk=1)
                )
                config["dg_w4a16[cutlass_dq,coop,chunk1]"] = "cutlass_dq,coop,chunk1"
            bt = w_bf16.transpose(-2, -1)
            impls["torch_grouped_mm_bf16"] = lambda a=a, o=offs, bt=bt: torch._grouped_mm(a, bt, offs=o)
            impls[FP8_API] = _fp8_grouped_api_call((a * 4).to(FP8), w_fp8, sfb_fp8, counts)
            nbytes = g * (n * k // 2 + n * k // 32) + 2 * m * k + 2 * m * n + 4 * g
            shape = {"layout": f"dq_tpe{tpe}", "weights": wname, "m": m, "n": n, "k": k, "groups": g, "active": g}
            case = Case("m_grouped_bf16_fp4_gemm_nt_contiguous", shape, impls, 2.0 * m * n * k, nbytes,
                        "bf16_tflops", config, compare_to=(FP8_API, "dg_w4a16[default]"), out=out)  # fmt: skip
            case.impl_bytes = _impl_bytes(impls, g, m, n, k, g)
            cases.append(case)
    return cases


def _impl_bytes(impls: dict, active: int, m: int, n: int, k: int, g: int) -> dict[str, float]:
    """Minimum bytes per impl where they differ from the W4A16 count: W4A8 reads FP4 weights + FP8 activations
    (+ their fp32 per-128 scales); the FP8 baselines read FP8 weights of the active experts; torch's bf16 grouped
    GEMM reads bf16 weights."""
    fp4_w = active * (n * k // 2 + n * k // 32)
    act8 = m * k + 4 * m * (k // 128)
    fp8_w = active * (n * k + 4 * (n // 128) * (k // 128))
    out = 2 * m * n
    table = {"dg_w4a8": fp4_w + act8 + out + 4 * g, FP8_GROUPED: fp8_w + act8 + out + 4 * g,
             FP8_API: fp8_w + act8 + out + 4 * m,
             "torch_scaled_mm_loop_fp8": active * n * k + m * k + 4 * (m + active * n) + out,
             "torch_grouped_mm_bf16": active * 2 * n * k + 2 * m * k + out}  # fmt: skip
    return {name: table[key] for name in impls for key in table if name == key or name.startswith(key + "[")}


def _w4a8_impls(
    a8: torch.Tensor, w: tuple, offs: torch.Tensor, n: int, sweep: tuple[W4A8Config, ...]
) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """The FP8-activation x FP4-weight grouped GEMM (W4A8) per swept config + its default, one shared output."""
    m, k = a8.shape
    sfa = torch.rand(m, k // 128, device=a8.device) + 0.5
    out = torch.empty(m, n, device=a8.device, dtype=torch.bfloat16)
    gemm = dg_w4a8.m_grouped_fp8_fp4_gemm_nt_offsets
    impls, config = {}, {}
    for cfg in (*sweep, None):
        name = f"dg_w4a8[{'default' if cfg is None else cfg.name}]"
        impls[name] = lambda cfg=cfg: gemm((a8, sfa), w, offs, out, config=cfg)
        config[name] = (cfg or default_w4a8_config(m, offs.numel())).name
    return impls, config


def w4a16_cases(
    dev: str, layouts: dict[str, tuple[str, int, str]], nks: dict[str, tuple[int, int]], g: int,
    sweep: dict[str, tuple[W4A16Config, ...]] = W4A16_SWEEP, baselines: bool = True,
    sweep_a8: dict[str, tuple[W4A8Config, ...]] = W4A8_SWEEP_ALL,
) -> list[Case]:  # fmt: skip
    """m_grouped_bf16_fp4_gemm_nt_contiguous for every swept config (+ the default), the W4A8 grouped GEMM (FP8
    activations, `sweep_a8` + its default), vs torch._grouped_mm (bf16 weights), a per-expert torch._scaled_mm
    loop (FP8 weights) and the Triton FP8 grouped kernel."""
    cases = []
    for wname, (n, k) in nks.items():
        packed, scales = _fp4_weights(g, n, k, dev)
        w_bf16 = torch.randn(g, n, k, device=dev, dtype=torch.bfloat16) if baselines else None
        w_fp8 = (torch.randn(g, n, k, device=dev) * 4).to(FP8) if baselines else None
        sw = torch.rand(g, 1, n, device=dev) + 0.5 if baselines else None
        sfb_fp8 = torch.rand(g, n // 128, k // 128, device=dev) + 0.5 if baselines else None
        for lname, (kind, size, regime) in layouts.items():
            counts = group_counts(kind, size, g)
            m = int(counts.sum())
            offs = counts.cumsum(0).to(torch.int32).to(dev)
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            impls, config = {}, {}
            for cfg in sweep[regime]:
                impls[f"dg_w4a16[{cfg.name}]"] = _w4a16_call(a, (packed, scales), offs, out, cfg)
                config[f"dg_w4a16[{cfg.name}]"] = cfg.name
            impls["dg_w4a16[default]"] = _w4a16_call(a, (packed, scales), offs, out, None)
            config["dg_w4a16[default]"] = _api_config_name(a, g)
            cu_impls, cu_config = _w4a16_cuda_impls(a, (packed, scales), offs, out, regime)
            impls.update(cu_impls)
            config.update(cu_config)
            dq_impls, dq_config = _w4a16_dq_impls(a, (packed, scales), offs, out, regime)
            impls.update(dq_impls)
            config.update(dq_config)
            a8 = (a * 4).to(FP8)
            w4a8, cfg_a8 = _w4a8_impls(a8, (packed, scales), offs, n, sweep_a8[regime])
            impls.update(w4a8)
            config.update(cfg_a8)
            if baselines:
                bt = w_bf16.transpose(-2, -1)
                impls["torch_grouped_mm_bf16"] = lambda a=a, o=offs, bt=bt: torch._grouped_mm(a, bt, offs=o)
                sa = torch.rand(m, 1, device=dev) + 0.5
                impls["torch_scaled_mm_loop_fp8"] = _scaled_mm_loop(a8, sa, w_fp8, sw, counts.tolist())
                if kind == "uniform":
                    impls[FP8_GROUPED] = _fp8_grouped_call(a8, w_fp8, sfb_fp8, size, g)
                elif regime == "decode":  # random routing: the masked FP8 kernel on the same per-expert counts
                    impls[FP8_GROUPED] = _fp8_masked_counts_call(w_fp8, sfb_fp8, counts, k)
                impls[FP8_API] = _fp8_grouped_api_call(a8, w_fp8, sfb_fp8, counts)
            active = int((counts > 0).sum())
            nbytes = active * (n * k // 2 + n * k // 32) + 2 * m * k + 2 * m * n + 4 * g
            shape = {"layout": lname, "weights": wname, "m": m, "n": n, "k": k, "groups": g, "active": active}
            case = Case("m_grouped_bf16_fp4_gemm_nt_contiguous", shape, impls, 2.0 * m * n * k, nbytes,
                        "bf16_tflops", config, compare_to=(FP8_GROUPED, FP8_API, "dg_w4a16[default]"),
                        out=out)  # fmt: skip
            case.impl_bytes = _impl_bytes(impls, active, m, n, k, g)
            cases.append(case)
    return cases


# ---------------------------------------------------------------- FP8 grouped (contiguous and masked)

FP8_GROUPED_TPE = [8, 64, 256, 1024]  # the tokens per expert, over NUM_EXPERTS experts
FP8_GROUPED_MASKED_TPE = (8, 64)  # decode sizes: also the masked layout (DeepEP low-latency)
# CUTLASS grouped variants (name, config, knobs): every config everywhere; scheduler knobs at >= 256 rows per
# expert (raster 2 = along N, swizzle = CUTLASS's tile swizzle).
_GROUPED_KNOBS = [
    ("coop,rN", 0, {"raster": 2}),
    ("coop,swz2", 0, {"swizzle": 2}),
    ("coop_2x1,rN", 1, {"raster": 2}),
    ("coop_2x2,rN", 4, {"raster": 2}),
]


def _grouped_cutlass_impls(run, tpe: int) -> dict[str, Callable[[], object]]:
    """`run(config, **knobs)` per CUTLASS grouped variant built into `_C` (none without it)."""
    from deepinfer.deep_gemm.backends.cuda import cutlass_fp8_grouped as cg

    if not cg.available():
        return {}
    variants = [(name, cfg, {}) for cfg, name in cg.CONFIGS.items()] + (_GROUPED_KNOBS if tpe >= 256 else [])
    return {
        f"dg_fp8_grouped_cutlass[{name}]": (lambda cfg=cfg, kw=kw: run(cfg, **kw))
        for name, cfg, kw in variants
        if cfg < cg.built_configs()
    }


def fp8_grouped_cases(
    dev: str, tpes: list[int], nks: dict[str, tuple[int, int]], g: int, masked_tpes: tuple[int, ...] = ()
) -> list[Case]:
    """m_grouped_fp8_gemm_nt_contiguous (and _masked for `masked_tpes`) at `tpe` rows per expert for all g experts:
    the API default, each CUTLASS variant, the Triton kernel and the per-expert torch._scaled_mm loop. Contiguous
    rows are expert-sorted without padding (what the CUTLASS kernel and the loop both take). Every dg impl writes
    `case.out` (cross-checked against the Triton kernel by bench_fp8_dense.py)."""
    cases = []
    for wname, (n, k) in nks.items():
        w, sfb = _fp8_weights3(g, n, k, dev)
        sw_row = torch.rand(g, 1, n, device=dev) + 0.5
        for tpe in tpes:
            rows = tpe * g
            a, sfa = _fp8_pair(rows, k, dev, block_rows=False)
            out = torch.empty(rows, n, device=dev, dtype=torch.bfloat16)
            ids = torch.arange(g, device=dev, dtype=torch.int32).repeat_interleave(tpe)
            impls = _contiguous_impls(a, sfa, w, sfb, out, ids, tpe)
            sa_row = torch.rand(rows, 1, device=dev) + 0.5
            impls["torch_scaled_mm_loop_fp8"] = _scaled_mm_loop(a, sa_row, w, sw_row, [tpe] * g)
            cases.append(_grouped_case("m_grouped_fp8_gemm_nt_contiguous", f"tpe{tpe}", wname, rows, n, k, g, impls,
                                       out))  # fmt: skip
            if tpe in masked_tpes:
                cases.append(_masked_case(a, sfa, w, sfb, wname, tpe, g))
            del a, sfa, out, ids
    return cases


def _contiguous_impls(a, sfa, w, sfb, out, ids, tpe: int) -> dict[str, Callable[[], object]]:
    """API, Triton and each CUTLASS variant on one contiguous layout, all writing `out`."""
    from deepinfer.deep_gemm.backends.cuda import cutlass_fp8_grouped as cg
    from deepinfer.deep_gemm.backends.cuda import triton_fp8_grouped as fg

    impls = {
        "dg_fp8_grouped": lambda: dg.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (w, sfb), out, ids),
        "dg_fp8_grouped_triton": lambda: fg.m_grouped_fp8_contiguous_triton(a, sfa, w, sfb, out, ids, expected_m=tpe),
    }
    impls.update(_grouped_cutlass_impls(
        lambda cfg, **kw: cg.m_grouped_fp8_gemm_nt_contiguous_cutlass(a, sfa, w, sfb, out, ids, config=cfg, **kw),
        tpe))  # fmt: skip
    return impls


def _fp8_weights3(g: int, n: int, k: int, dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random e4m3 expert weights [g, n, k] and 128x128 block scales [g, n/128, k/128]."""
    w = torch.empty(g, n, k, device=dev, dtype=FP8)
    for e in range(g):  # one expert at a time: no [g, n, k] fp32 temporary
        w[e] = (torch.randn(n, k, device=dev) * 4).to(FP8)
    return w, torch.rand(g, -(-n // 128), k // 128, device=dev) + 0.5


def _grouped_case(op: str, layout: str, wname: str, rows: int, n: int, k: int, g: int, impls: dict, out) -> Case:
    nbytes = rows * k + g * n * k + 2 * rows * n + 4 * rows * (k // 128) + 4 * g * (n // 128) * (k // 128)
    shape = {"layout": layout, "weights": wname, "m": rows, "n": n, "k": k, "groups": g}
    config = {name: name[name.index("[") + 1 : -1] for name in impls if "[" in name}
    return Case(op, shape, impls, 2.0 * rows * n * k, nbytes, "fp8_tflops", config,
                compare_to=("dg_fp8_grouped", "dg_fp8_grouped_triton"), out=out)  # fmt: skip


def _masked_case(a: torch.Tensor, sfa: torch.Tensor, w: torch.Tensor, sfb: torch.Tensor, wname: str, tpe: int,
                 g: int) -> Case:  # fmt: skip
    """The masked layout of the same rows: a [g, tpe, k], every count = tpe (m_max = tpe)."""
    from deepinfer.deep_gemm.backends.cuda import cutlass_fp8_grouped as cg
    from deepinfer.deep_gemm.backends.cuda import triton_fp8_grouped as fg

    n, k = w.shape[1], w.shape[2]
    a3, sfa3 = a.view(g, tpe, k), sfa.view(g, tpe, -1)
    out3 = torch.empty(g, tpe, n, device=a.device, dtype=torch.bfloat16)
    cnt = torch.full((g,), tpe, dtype=torch.int32, device=a.device)
    impls = {
        "dg_fp8_grouped": lambda: dg.m_grouped_fp8_gemm_nt_masked((a3, sfa3), (w, sfb), out3, cnt, tpe),
        "dg_fp8_grouped_triton": lambda: fg.m_grouped_fp8_masked_triton(a3, sfa3, w, sfb, out3, cnt, tpe),
    }
    impls.update(_grouped_cutlass_impls(
        lambda cfg, **kw: cg.m_grouped_fp8_gemm_nt_masked_cutlass(a3, sfa3, w, sfb, out3, cnt, tpe, config=cfg, **kw),
        tpe))  # fmt: skip
    return _grouped_case("m_grouped_fp8_gemm_nt_masked", f"masked{tpe}", wname, g * tpe, n, k, g, impls,
                         out3.view(g * tpe, n))  # fmt: skip
