"""Benchmark cases of the compiled W4A8 FP8-wgmma kernel (`bench_deep_gemm.py --cases w4a8_cuda`): the W4A8 API's
Triton default, each CUDA variant through the API (`impl=`), and the FP8 grouped API (the goal's baseline: FP4
experts at >= 0.85x FP8 experts where compute-bound), on the V4 expert shapes at 64 / 256 / 1024 tokens per expert.

Every dg_w4a8 row writes the case's shared `out`: bench_deep_gemm records each row's calc_diff vs the first row
(the Triton default), so a wrong CUDA result shows as ~1 next to its time.
"""

from __future__ import annotations

import bench_cases as bc
import torch

from deepinfer.deep_gemm import api_w4a8 as dg_w4a8
from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_grouped as cw
from deepinfer.deep_gemm.backends.cuda.w4a8_configs import default_w4a8_config

OP = "m_grouped_fp8_fp4_gemm_nt_offsets"
W4A8_TPE = (64, 256, 1024)
FP8 = torch.float8_e4m3fn


def _impls(a8, sfa, w, offs, out) -> tuple[dict, dict]:  # noqa: ANN001
    """Triton default + every CUDA variant (through the API: it falls back to Triton when `_C` lacks the kernel,
    so the config column says which ran)."""
    gemm = dg_w4a8.m_grouped_fp8_fp4_gemm_nt_offsets
    m, g = a8.shape[0], offs.numel()
    impls = {"dg_w4a8[default]": lambda: gemm((a8, sfa), w, offs, out, impl="triton")}
    config = {"dg_w4a8[default]": default_w4a8_config(m, g).name}
    built = cw.compiled_variants()
    for v in cw.W4A8_CUDA_VARIANTS:
        if v in cw.WS_VARIANTS or v in cw.RS_VARIANTS:  # measured by bench_dg_w4a8_ws.py / bench_dg_w4a8_rs.py
            continue
        name = cw.variant_name(v)
        impls[f"dg_w4a8[{name}]"] = lambda name=name: gemm((a8, sfa), w, offs, out, impl=name)
        config[f"dg_w4a8[{name}]"] = name if v in built else f"{name} (not built: Triton ran)"
    return impls, config


def w4a8_cuda_cases(dev: str, tpes: tuple[int, ...], nks: dict[str, tuple[int, int]], g: int) -> list[bc.Case]:
    """W4A8 at `tpe` rows per expert (uniform, all g experts) vs the FP8 grouped API on FP8 weights."""
    cases = []
    for wname, (n, k) in nks.items():
        packed, scales = bc._fp4_weights(g, n, k, dev)
        w_fp8 = (torch.randn(g, n, k, device=dev) * 4).to(FP8)
        sfb_fp8 = torch.rand(g, n // 128, k // 128, device=dev) + 0.5
        for tpe in tpes:
            counts = bc.group_counts("uniform", tpe, g)
            m = int(counts.sum())
            offs = counts.cumsum(0).to(torch.int32).to(dev)
            a8 = (torch.randn(m, k, device=dev) * 4).to(FP8)
            sfa = torch.rand(m, k // 128, device=dev) + 0.5
            out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            impls = {bc.FP8_API: bc._fp8_grouped_api_call(a8, w_fp8, sfb_fp8, counts)}  # timed first: the baseline
            w4a8, config = _impls(a8, sfa, (packed, scales), offs, out)
            impls.update(w4a8)
            shape = {"layout": f"a8_tpe{tpe}", "weights": wname, "m": m, "n": n, "k": k, "groups": g, "active": g}
            nbytes = g * (n * k // 2 + n * k // 32) + m * k + 4 * m * (k // 128) + 2 * m * n + 4 * g
            case = bc.Case(OP, shape, impls, 2.0 * m * n * k, nbytes, "fp8_tflops", config,
                           compare_to=(bc.FP8_API, "dg_w4a8[default]"), out=out)  # fmt: skip
            case.impl_bytes = bc._impl_bytes(impls, g, m, n, k, g)
            cases.append(case)
    return cases
