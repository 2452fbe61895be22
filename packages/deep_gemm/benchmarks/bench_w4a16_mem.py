"""W4A16 memory-bound cases of `bench_deep_gemm.py` (session 6): 8 tokens per expert and decode batch 256, and the
FP8-expert comparison timed in alternating rounds.

Why rounds: in the session-5 run the same kernel-5 config at 8 tokens per expert gate+up took 787.5 us in the
`[default]` row and 700.6 us in the `[auto]` row of the same case (p10-p90 of one row: 712-820 us), while the FP8
grouped API's row spread 1048-1055 us: one row per impl, timed minutes apart, made the goal's ratio 1.34x or 1.50x
depending on the row. Here the default, the FP8 grouped API and the candidate W4A16 configs are timed again, one short
`bench_cuda` each, in `ROUNDS` rounds that alternate the order (forward, then reversed): per round every impl runs
within a few hundred milliseconds of the others, so each round's ratio shares its clocks and thermal state, and the
spread of the per-round ratios says how far one row can be trusted. The SM clock, board power and temperature (NVML,
when torch can read them) are recorded per round: an issue-bound kernel (the W4A16 CUDA kernels dequantise in
registers) slows with the clock, a copy-bound one (the FP8 grouped GEMM reads its weights at ~100 % of the copy
bandwidth) does not.

    python packages/deep_gemm/benchmarks/bench_deep_gemm.py --cases w4a16_mem --out RESULT.json   # GPU, ~90 s
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import bench_cases as bc

from kernelkit import bench_cuda

# Layouts whose W4A16 default is timed against the FP8 grouped API in alternating rounds (memory-bound goal cases).
INTERLEAVE_LAYOUTS = ("tpe8", "decode_b256")
SMOKE_LAYOUTS = ("decode_tiny",)
ROUNDS, ROUND_REP = 6, 5  # ~4-5 s per case on an H200 with session 6's 10 impls (5 since kernel 6 left)
DEFAULT = "dg_w4a16[default]"
# Timed in the rounds when the case has them: the default (also by name: the row-to-row spread of one kernel), the
# session-6 candidates (kernel 5's 256-k tiles; session 6's kernel 6 `...cs` lost to kernel 5 and was removed in
# session 9) and the FP8 grouped API (the goal's baseline).
ROUND_IMPLS = (
    DEFAULT, bc.FP8_API, "dg_w4a16[m8n128k512w4s2cp]", "dg_w4a16[m8n128k256w4s4cp]", "dg_w4a16[m8n128k256w4s3cp]",
)  # fmt: skip


def mem_cases(dev: str) -> list[bc.Case]:
    """The two memory-bound goal layouts (8 tokens per expert, decode batch 256), gate+up and down, 256 experts:
    every W4A16 row of `bc.w4a16_cases` (kernels 4 / 5 by name, the API default and auto) and its baselines."""
    layouts = {name: bc.GROUPED[name] for name in INTERLEAVE_LAYOUTS}
    return bc.w4a16_cases(dev, layouts, bc.EXPERT_NK, bc.NUM_EXPERTS)


def _gpu_state() -> dict[str, int | None]:
    """SM clock (MHz), board power (W) and temperature (C) through torch's NVML hooks; None where they cannot be
    read (no pynvml, CPU). Read between rounds: NVML reports the last sample period."""
    import torch

    def read(fn: Callable[[], object], scale: float = 1.0) -> int | None:
        try:
            return int(fn() * scale) if torch.cuda.is_available() else None
        except Exception:  # noqa: BLE001 - optional diagnostics only
            return None

    return {
        "sm_mhz": read(torch.cuda.clock_rate),
        "power_w": read(torch.cuda.power_draw, 1e-3),
        "temp_c": read(torch.cuda.temperature),
    }


def _ratios(num: list[float], den: list[float]) -> dict[str, float]:
    """Per-round num / den: median, min, max."""
    r = [a / b for a, b in zip(num, den) if a and b]
    return {"median": statistics.median(r), "min": min(r), "max": max(r)} if r else {}


def interleaved_rounds(
    impls: dict[str, Callable[[], object]], names: list[str], rounds: int, rep: int
) -> dict[str, object]:
    """Time `names` of `impls` in `rounds` rounds (order forward on even rounds, reversed on odd ones), one
    `bench_cuda(rep=rep)` per impl and round. Returns {"us": {impl: [round medians]}, "median_us": {impl: median},
    "x_vs_fp8_api" / "x_vs_default": {impl: per-round speed-up over that baseline (median, min, max)},
    "gpu_state": [per round: SM MHz, W, C], "errors": {impl: message}}."""
    us: dict[str, list[float]] = {n: [] for n in names}
    errors: dict[str, str] = {}
    states = []
    for r in range(rounds):
        states.append(_gpu_state())
        for name in names if r % 2 == 0 else names[::-1]:
            if name in errors:
                continue
            try:
                us[name].append(bench_cuda(impls[name], warmup=1, rep=rep)["median_us"])
            except Exception as exc:  # noqa: BLE001 - record and go on
                errors[name] = f"{type(exc).__name__}: {exc}"[:300]
    ok = {n: v for n, v in us.items() if len(v) == rounds}
    res: dict[str, object] = {
        "rounds": rounds, "rep": rep, "order": "forward on even rounds, reversed on odd rounds", "us": us,
        "median_us": {n: statistics.median(v) for n, v in ok.items()}, "gpu_state": states, "errors": errors,
    }  # fmt: skip
    for base, key in ((bc.FP8_API, "x_vs_fp8_api"), (DEFAULT, "x_vs_default")):
        if base in ok:
            res[key] = {n: _ratios(ok[base], v) for n, v in ok.items() if n != base}
    return res


def maybe_interleave(case: bc.Case, meta: dict, smoke: bool, log: Callable[[str], None]) -> None:
    """Alternating rounds for a goal case (INTERLEAVE_LAYOUTS; SMOKE_LAYOUTS with 2 rounds x 1 rep in --smoke):
    stored in meta["interleaved"]["<layout>/<weights>"], one summary line logged."""
    layout = (case.shape or {}).get("layout")
    layouts = SMOKE_LAYOUTS if smoke else INTERLEAVE_LAYOUTS
    if case.op != "m_grouped_bf16_fp4_gemm_nt_contiguous" or layout not in layouts:
        return
    names = [n for n in ROUND_IMPLS if n in case.impls]
    if DEFAULT not in names or len(names) < 2:
        return
    res = interleaved_rounds(case.impls, names, 2 if smoke else ROUNDS, 1 if smoke else ROUND_REP)
    meta.setdefault("interleaved", {})[f"{layout}/{case.shape['weights']}"] = res
    x = res.get("x_vs_fp8_api", {}).get(DEFAULT, {})
    if x:
        log(f"    rounds {layout}/{case.shape['weights']}: default x FP8 API median {x['median']:.3f} "
            f"(min {x['min']:.3f}, max {x['max']:.3f}); medians {res['median_us']}")  # fmt: skip


def table_lines(meta: dict) -> list[str]:
    """Markdown of meta["interleaved"]: per case and impl the median of the round medians, its spread, and the
    per-round speed-ups over the FP8 grouped API and over the W4A16 default (median [min, max])."""
    inter = meta.get("interleaved") or {}
    if not inter:
        return []
    lines = [
        "",
        "Alternating rounds (same case, impls timed back to back; x = per-round speed-up, median [min, max]):",
        "",
        "| case | impl | median of rounds (us) | rounds (us) | x FP8 API | x W4A16 default |",
        "|---|---|---|---|---|---|",
    ]
    fmt = lambda d: f"{d['median']:.3f} [{d['min']:.3f}, {d['max']:.3f}]" if d else "-"  # noqa: E731
    for key, res in inter.items():
        for name, v in res["us"].items():
            med = res["median_us"].get(name)
            lines.append(
                f"| {key} | {name} | {med:.1f} | {', '.join(f'{t:.0f}' for t in v)} | "
                f"{fmt(res.get('x_vs_fp8_api', {}).get(name))} | {fmt(res.get('x_vs_default', {}).get(name))} |"
                if med is not None else f"| {key} | {name} | {res['errors'].get(name, 'incomplete')} | | | |"
            )  # fmt: skip
        states = res.get("gpu_state") or []
        if any(st.get("sm_mhz") for st in states):
            per = ", ".join(f"{st.get('sm_mhz')} MHz / {st.get('power_w')} W / {st.get('temp_c')} C" for st in states)
            lines.append(f"| {key} | GPU before each round | {per} | | | |")
    return lines
