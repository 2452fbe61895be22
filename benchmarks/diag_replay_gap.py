"""Which kernels take longer inside the decode loop than in a graph replayed alone (session 8's 4.14 vs 2.93 ms)?

Profiles (torch.profiler, CUDA activity) N in-loop greedy decode steps (profile_engine_decode's step loop: new
positions and tokens each step, uploads and prefetch as the server does) and then N replays of the same captured
graph (first with the inputs the loop left: prefetch's token id 0 in every row, then with random token ids, the
"alone" rows), on the V4-Flash-shaped benchmark model; groups kernel time by kernel name and prints per-step
milliseconds of both and their difference, largest first. Writes JSON with --out.

Session 9 finding: the gap was the stale replay's input, not the loop: with token 0 everywhere the hash-routed layers
send every row to the same experts, so the FP4 expert GEMM moved far fewer weights (0.67 vs 1.71 ms per step).

    python benchmarks/diag_replay_gap.py --out /tmp/gap.json     # H200, ~60 s
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_engine_decode import _prefill, _step_loop, build_runner, fill_tokens  # noqa: E402


def _kernel_ms(prof, steps: int) -> dict[str, float]:
    """Kernel name -> device milliseconds per step (self time of every CUDA kernel event)."""
    per: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            per[e.name[:100]] += e.device_time / 1e3 / steps
    return dict(per)


def _profiled(fn) -> object:  # noqa: ANN001
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof


def distinct_experts(runner, slots: list[int], pos: int, tokens: list[int]) -> list[int]:  # noqa: ANN001
    """Distinct routed experts per MoE layer of one EAGER decode step at `pos` with these token ids (the count of
    expert weight sets a grouped expert GEMM reads), by wrapping MoE.route for the call."""
    from deepinfer.engine.model import moe as moe_mod
    from deepinfer.engine.sequence import SeqChunk

    seen: list[int] = []
    orig = moe_mod.MoE.route

    def route(self, x, token_ids):  # noqa: ANN001, ANN202
        w, ids = orig(self, x, token_ids)
        seen.append(int(ids.unique().numel()))
        return w, ids

    moe_mod.MoE.route = route
    try:
        chunks = [SeqChunk(s, [t], pos, "last") for s, t in zip(slots, tokens)]
        with torch.inference_mode():
            runner.model.forward(runner.step_batch(chunks, static_width=True), runner.cache)
    finally:
        moe_mod.MoE.route = orig
    return seen


def run(args: argparse.Namespace) -> dict:
    """Loop steps vs lone replays of batch args.batch; returns the per-kernel comparison."""
    dev = torch.device("cuda")
    runner = build_runner(args, dev)
    b, n = args.batch, args.prompt_len
    slots = _prefill(runner, b, n, dev)
    tok = [5] * b
    _step_loop(runner, slots, n, 4, [], tok)  # warm: capture the bucket's graph, first-step costs
    loop = _kernel_ms(_profiled(lambda: _step_loop(runner, slots, n + 4, args.steps, [], tok)), args.steps)
    graph = runner.graphs.graphs[runner.graphs.bucket(b)][0]
    stale = _kernel_ms(_profiled(lambda: [graph.replay() for _ in range(args.steps)]), args.steps)
    graph = fill_tokens(runner, b)  # the same replay with real (random) token ids instead of prefetch's zeros
    alone = _kernel_ms(_profiled(lambda: [graph.replay() for _ in range(args.steps)]), args.steps)
    gen = torch.Generator().manual_seed(1)
    real = torch.randint(0, runner.vocab_size, (b,), generator=gen).tolist()
    pos = n + 4 + args.steps
    experts = {
        "random_tokens": distinct_experts(runner, slots, pos, real),
        "token_0_everywhere": distinct_experts(runner, slots, pos, [0] * b),
    }
    rows = [{"kernel": k, "loop_ms": loop.get(k, 0.0), "alone_ms": alone.get(k, 0.0)} for k in set(loop) | set(alone)]
    for r in rows:
        r["diff_ms"] = r["loop_ms"] - r["alone_ms"]
    rows.sort(key=lambda r: -abs(r["diff_ms"]))
    return {
        "batch": b,
        "layers": args.layers,
        "steps": args.steps,
        "loop_kernel_ms_per_step": sum(loop.values()),
        "alone_kernel_ms_per_step": sum(alone.values()),
        "alone_stale_tokens_kernel_ms_per_step": sum(stale.values()),
        "distinct_experts_per_moe_layer": experts,
        "kernels": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("GPU only")
    args.batches, args.llm_steps, args.smoke = str(args.batch), 0, False  # what build_runner reads
    res = run(args)
    print(
        f"kernel ms per step: loop {res['loop_kernel_ms_per_step']:.3f}, alone {res['alone_kernel_ms_per_step']:.3f}, "
        f"alone with stale tokens {res['alone_stale_tokens_kernel_ms_per_step']:.3f}"
    )
    print(f"distinct experts per MoE layer: {res['distinct_experts_per_moe_layer']}")
    for r in res["kernels"][:25]:
        print(f"  {r['diff_ms']:+.4f}  loop {r['loop_ms']:.4f}  alone {r['alone_ms']:.4f}  {r['kernel']}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
