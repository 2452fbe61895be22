"""Where one DeepInfer decode step's time goes, on the V4-Flash-shaped benchmark model (no transformers run).

Prints, per batch size: the step's wall time split into host preparation (index lists built on the host), the
launch of the captured graph, and the wait for the GPU; the GPU time of one graph replay (CUDA events); and an
eager (uncaptured) step profiled with engine regions labelled, so kernel time and kernel counts add up per
region (attention, compressor, indexer, MoE routing / experts, mHC, head). Writes JSON with --out.

    python benchmarks/profile_engine_decode.py --batches 32,256 --out /tmp/profile.json
    python benchmarks/profile_engine_decode.py --smoke      # tiny widths on CPU: checks the script only

Then, per batch, the whole serving loop (LLM.generate) with DEEPINFER_ASYNC_SAMPLING off and on, greedy and seeded,
same runner: decode tokens/s, async x sync, and whether both produced the same tokens (--llm-steps, 0 skips it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine_v4flash import _prompts, _sync, build  # noqa: E402

# (module, attribute path, label): engine functions whose kernels are summed under one label.
REGIONS = [
    ("deepinfer.engine.model.attention", "Attention._project", "attn.project(q,kv,rope)"),
    ("deepinfer.engine.model.attention", "Attention._compress", "attn.compressor"),
    ("deepinfer.engine.model.attention", "Attention._main_indices", "attn.indexer+topk"),
    ("deepinfer.engine.model.attention", "Attention._write_window", "attn.write_window"),
    ("deepinfer.engine.model.attention", "Attention.forward", "attn.total"),
    ("deepinfer.engine.model.moe", "MoE.route", "moe.route"),
    ("deepinfer.engine.model.moe", "MoE.forward", "moe.total"),
    ("deepinfer.engine.model.block", "Block._pre", "mhc.pre"),
    ("deepinfer.engine.model.block", "Block.forward", "block.total"),
    ("deepinfer.engine.model.model", "DeepseekV4.logits", "head(logits)"),
]


def _label(module: str, path: str, label: str) -> None:
    """Wrap module.path (Class.method) in a profiler range named `label`."""
    import importlib

    owner = importlib.import_module(module)
    cls_name, meth = path.split(".")
    cls = getattr(owner, cls_name)
    fn = getattr(cls, meth)

    @functools.wraps(fn)
    def wrapped(*a, **k):
        with torch.profiler.record_function(label):
            return fn(*a, **k)

    setattr(cls, meth, wrapped)


def build_runner(args, dev: torch.device):
    """The benchmark's model (bench_engine_v4flash.build), without keeping the transformers copy."""
    from deepinfer.engine.config_parse import config_from_dict
    from deepinfer.engine.runner import ModelRunner

    model, official, off_cfg = build(args, dev)
    del model
    batches = [int(x) for x in args.batches.split(",")]
    return ModelRunner(
        config_from_dict(off_cfg),
        official,
        dtype=torch.bfloat16,
        device=dev,
        max_num_seqs=max(batches),
        max_model_len=args.prompt_len + max(args.steps, args.llm_steps) + 8,
        gpu_memory_utilization=0.92,
    )


def _prefill(runner, b: int, n: int, dev: torch.device) -> list[int]:
    from deepinfer.engine.sequence import SeqChunk

    slots = [runner.cache.allocate_slot() for _ in range(b)]
    for s in slots:
        assert runner.cache.reserve(s, n + 64), "cache too small"
    ids = _prompts(b, n, runner.vocab_size, dev).tolist()
    per = max(1, 8192 // n)
    for lo in range(0, b, per):
        runner.forward([SeqChunk(slots[i], ids[i], 0, "none") for i in range(lo, min(b, lo + per))])
    return slots


class _ReplayMarks:
    """Context manager: records a CUDA event on the current stream right before every `CUDAGraph.replay` (the
    session-8 split of the in-loop forward span: host work and uploads before the replay vs the replay itself)."""

    def __init__(self) -> None:
        self.events: list[torch.cuda.Event] = []
        self._orig = torch.cuda.CUDAGraph.replay

    def __enter__(self) -> _ReplayMarks:
        marks, orig = self, self._orig

        def replay(graph):  # noqa: ANN001, ANN202
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            marks.events.append(ev)
            return orig(graph)

        torch.cuda.CUDAGraph.replay = replay
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        torch.cuda.CUDAGraph.replay = self._orig


def _split_forward(ev: list, marks: list) -> dict:
    """Medians over steps of (forward start -> replay start) and (replay start -> forward end), GPU ms."""
    if len(marks) != len(ev):
        return {"replay_marks": f"{len(marks)} replays for {len(ev)} steps: not split"}
    pre = sorted(e[0].elapsed_time(m) for e, m in zip(ev, marks))
    rep = sorted(m.elapsed_time(e[1]) for e, m in zip(ev, marks))
    return {"in_loop_pre_replay_gpu_ms_median": pre[len(pre) // 2], "in_loop_replay_gpu_ms_median": rep[len(rep) // 2]}


def time_steps(runner, slots: list[int], n: int, steps: int, dev: torch.device) -> dict:
    """Decode `steps` greedy steps; split each step's wall time into host build, launch and GPU wait."""
    tok = [5] * len(slots)
    # GPU time inside the loop (events around forward + prefetch's uploads, and around argmax): tells a slow
    # replay in situ (different inputs than `replay_gpu_ms`'s) from GPU idle time between steps.
    timed = dev.type == "cuda"
    ev = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(steps)] if timed else []
    _sync(dev)
    marks = _ReplayMarks() if timed else contextlib.nullcontext()
    t_all = time.perf_counter()
    with marks:
        host, launch, wait = _step_loop(runner, slots, n, steps, ev, tok)
    total = time.perf_counter() - t_all
    gpu = {}
    if timed:
        _sync(dev)
        fwd = sorted(e[0].elapsed_time(e[1]) for e in ev)
        span = sorted(e[0].elapsed_time(e[2]) for e in ev)
        gap = sorted(ev[i][2].elapsed_time(ev[i + 1][0]) for i in range(steps - 1)) or [0.0]
        gpu = {
            "in_loop_forward_gpu_ms_median": fwd[len(fwd) // 2],
            "in_loop_forward_gpu_ms_max": fwd[-1],
            "in_loop_step_span_gpu_ms_median": span[len(span) // 2],
            "gpu_idle_between_steps_ms_median": gap[len(gap) // 2],
            **_split_forward(ev, marks.events),
        }
    # forward() rebuilds the batch itself, so host time is counted twice in `total`; subtract one copy.
    ms = lambda v: 1e3 * v / steps  # noqa: E731
    return {
        "step_ms_incl_extra_build": ms(total),
        "step_ms": ms(total - host),
        "host_build_ms": ms(host),
        "forward_and_prefetch_ms": ms(launch),
        "sync_argmax_ms": ms(wait),
        **gpu,
    }


def _step_loop(runner, slots: list[int], n: int, steps: int, ev: list, tok: list[int]) -> tuple[float, float, float]:
    """The greedy decode steps of `time_steps`; returns host build, forward + prefetch and argmax wait seconds."""
    from deepinfer.engine.sequence import SeqChunk

    g, timed = runner.graphs, bool(ev)
    host = launch = wait = 0.0
    for i in range(steps):
        chunks = [SeqChunk(s, [t], n + i, "last") for s, t in zip(slots, tok)]
        t0 = time.perf_counter()
        if g is not None:
            size = g.bucket(len(chunks))
            if size not in g.graphs:
                g._capture(size)
            g._batch(chunks, size, on_host=True)  # what run() builds: timed alone here
        t1 = time.perf_counter()
        if timed:
            ev[i][0].record()
        outs = runner.forward(chunks)
        if timed:
            ev[i][1].record()
        runner.prefetch_next(chunks)
        t2 = time.perf_counter()
        tok = torch.cat(outs).argmax(-1).tolist()
        if timed:
            ev[i][2].record()
        t3 = time.perf_counter()
        host, launch, wait = host + (t1 - t0), launch + (t2 - t1), wait + (t3 - t2)
    return host, launch, wait


class _StubTokenizer:
    """Enough tokenizer for LLM.generate on the random benchmark model: one letter per id, no EOS."""

    eos_token_ids = ()

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + t % 26) for t in ids)


def llm_decode(runner, b: int, n: int, steps: int, dev: torch.device, async_sampling: bool, seeded: bool) -> dict:
    """Decode tokens/s of the whole serving loop (LLM.generate: scheduler, sampler, stop rules, detokenising)
    with DEEPINFER_ASYNC_SAMPLING off or on, b prompts of n tokens, greedy or seeded (temperature 0.8, top-k 50).

    Decode time = time(max_tokens = 1 + steps) - time(max_tokens = 1), best of two each: the prefill and first
    token cancel out. steps_launched_ahead / steps_used_ahead count over both timed runs.
    Also returns the token ids, so the caller can check both settings produced the same tokens."""
    from deepinfer.engine.llm import LLM
    from deepinfer.engine.sampling_params import SamplingParams

    llm = LLM.from_components(runner, _StubTokenizer(), max_num_seqs=b, max_num_batched_tokens=8192)
    llm.async_sampling = async_sampling
    runner.cache.async_uploads = async_sampling
    ids = _prompts(b, n, runner.vocab_size, dev).tolist()
    extra = dict(temperature=0.8, top_k=50, seed=1234) if seeded else dict(temperature=0.0)

    def run(max_tokens: int):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **extra)
        _sync(dev)
        t0 = time.perf_counter()
        out = llm.generate(prompt_token_ids=ids, sampling_params=params, use_tqdm=False)
        _sync(dev)
        return time.perf_counter() - t0, [o.outputs[0].token_ids for o in out]

    run(2)  # warm: this batch's graphs, allocator, pinned buffers
    t1 = min(run(1)[0] for _ in range(2))  # best of two: less noise in the difference
    llm.async_stats.update(launched_ahead=0, used=0)
    (tn, tokens), (tn2, repeat) = run(1 + steps), run(1 + steps)
    tn = min(tn, tn2)
    decode = tn - t1  # <= 0 only when timing noise exceeds the decode time (CPU smoke runs)
    runner.cache.async_uploads = False
    return {
        "async_sampling": async_sampling,
        "seeded": seeded,
        "decode_tok_s": b * steps / decode if decode > 0 else None,
        "step_ms": 1e3 * decode / steps,
        "steps_launched_ahead": llm.async_stats["launched_ahead"],
        "steps_used_ahead": llm.async_stats["used"],
        "tokens": tokens,
        "self_same_frac": _same_frac(tokens, repeat),
    }


def _same_frac(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of sequences whose tokens are identical in two runs."""
    return sum(x == y for x, y in zip(a, b)) / max(len(a), 1)


def compare_llm_loops(runner, b: int, n: int, steps: int, dev: torch.device) -> dict:
    """LLM.generate decode rate, DEEPINFER_ASYNC_SAMPLING off vs on, greedy and seeded, same run and model."""
    rows = {}
    for seeded in (False, True):
        kind = "seeded" if seeded else "greedy"
        for flag in (False, True):
            try:
                rows[f"{kind}_{'async' if flag else 'sync'}"] = llm_decode(runner, b, n, steps, dev, flag, seeded)
            except Exception as e:  # record it: the other rows still run
                rows[f"{kind}_{'async' if flag else 'sync'}"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(
                f"   llm b={b} {kind} async={flag}: "
                + json.dumps({k: v for k, v in rows[f"{kind}_{'async' if flag else 'sync'}"].items() if k != "tokens"}),
                flush=True,
            )
        sync, asy = rows[f"{kind}_sync"], rows[f"{kind}_async"]
        if "tokens" in sync and "tokens" in asy:
            # Sequences with identical tokens, async vs sync; the sync loop against itself (self_same_frac) shows
            # what the model's own run-to-run noise (atomic MoE adds) allows.
            rows[f"{kind}_same_tokens_frac"] = _same_frac(sync["tokens"], asy["tokens"])
            ok = sync["decode_tok_s"] and asy["decode_tok_s"]
            rows[f"{kind}_async_x_sync"] = asy["decode_tok_s"] / sync["decode_tok_s"] if ok else None
            print(
                f"   llm b={b} {kind}: same tokens async vs sync {rows[f'{kind}_same_tokens_frac']:.3f} (sync vs "
                f"sync {sync['self_same_frac']:.3f}), async x sync {rows[f'{kind}_async_x_sync']}",
                flush=True,
            )
    for r in rows.values():
        if isinstance(r, dict):
            r.pop("tokens", None)
    return rows


def fill_tokens(runner, b: int, seed: int = 0) -> torch.cuda.CUDAGraph:
    """The captured graph of batch b, its token ids set to random ones first. After a loop step, prefetch_next has
    left token id 0 in every row (the next step's tokens are not known yet); a replay of that input sends every row
    of the hash-routed layers to the same 6 experts, and times far fewer expert weights than a real step (session 9:
    the FP4 expert GEMM took 0.67 ms per step that way against 1.71 ms in the loop)."""
    g = runner.graphs
    graph, static, _ = g.graphs[g.bucket(b)]
    gen = torch.Generator().manual_seed(seed)
    static.token_ids[:b].copy_(torch.randint(0, runner.vocab_size, (b,), generator=gen))
    return graph


def replay_gpu_ms(runner, slots: list[int], n: int, dev: torch.device) -> float | None:
    """GPU time of one captured decode step (CUDA events around a graph replay)."""
    g = runner.graphs
    if g is None or dev.type != "cuda":
        return None
    graph = fill_tokens(runner, len(slots))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def region_profile(runner, slots: list[int], n: int, dev: torch.device) -> list[dict]:
    """Profile one EAGER decode step with engine regions labelled: kernel time and count per region."""
    from torch.profiler import ProfilerActivity, profile

    from deepinfer.engine.sequence import SeqChunk

    chunks = [SeqChunk(s, [5], n, "last") for s in slots]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with torch.inference_mode():
        b = runner.step_batch(chunks, static_width=True)
        runner.model.logits(runner.model.forward(b, runner.cache))  # warm
        _sync(dev)
        with profile(activities=acts) as prof:
            runner.model.logits(runner.model.forward(b, runner.cache))
            _sync(dev)
    rows = []
    ev = prof.key_averages()
    labels = {r[2] for r in REGIONS}
    for e in ev:
        if e.key in labels:
            rows.append(
                {
                    "region": e.key,
                    "calls": e.count,
                    "device_ms": e.device_time_total / 1e3,
                    "cpu_ms": e.cpu_time_total / 1e3,
                }
            )
    kernels = [e for e in ev if e.self_device_time_total > 0]
    rows.append(
        {
            "region": "ALL kernels",
            "calls": sum(e.count for e in kernels),
            "device_ms": sum(e.self_device_time_total for e in kernels) / 1e3,
            "cpu_ms": None,
        }
    )
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:25]
    for e in top:
        rows.append({"kernel": e.key[:90], "calls": e.count, "device_ms": e.self_device_time_total / 1e3})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batches", default="32,256")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument(
        "--llm-steps",
        type=int,
        default=48,
        help="decode steps of the LLM.generate comparison, DEEPINFER_ASYNC_SAMPLING off vs on (0: skip)",
    )
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.prompt_len, args.steps, args.batches, args.llm_steps = 32, 2, "4", min(args.llm_steps, 3)
    dev = torch.device("cpu" if args.smoke else "cuda")
    for region in REGIONS:
        _label(*region)
    runner = build_runner(args, dev)
    report = {
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "layers": args.layers,
        "prompt_len": args.prompt_len,
        "batches": {},
    }
    for b in (int(x) for x in args.batches.split(",")):
        slots = _prefill(runner, b, args.prompt_len, dev)
        steps = time_steps(runner, slots, args.prompt_len, args.steps, dev)
        steps["graph_replay_gpu_ms"] = replay_gpu_ms(runner, slots, args.prompt_len + args.steps, dev)
        steps["regions"] = region_profile(runner, slots, args.prompt_len + args.steps, dev)
        report["batches"][b] = steps
        print(f"== b={b}: " + json.dumps({k: v for k, v in steps.items() if k != "regions"}), flush=True)
        for r in steps["regions"]:
            print("   ", json.dumps(r), flush=True)
        for s in slots:
            runner.cache.free_slot(s)
        if args.llm_steps > 0:
            steps["llm_loop"] = compare_llm_loops(runner, b, args.prompt_len, args.llm_steps, dev)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
