"""Run-to-run determinism of the engine on the V4-Flash-shaped benchmark model (GPU, < 90 s; --smoke on CPU).

(a) eager (no CUDA graphs): one prefill + a few decode steps, twice on identical inputs, with the engine's
    functions wrapped (attention / indexer / compressor / MoE / block / head); outputs compared BITWISE; reports
    the first function (in return order, innermost first) whose output differs, and its max abs diff;
(b) the same decode steps through the captured CUDA graphs (logits only: Python does not run inside a replay);
(c) LLM.generate twice (greedy and seeded) -> share of sequences with identical tokens, decode tok/s; and once
    more with the KV / index caches filled with NaN and the compressor tails with random values between the
    runs (a changed result then means a read of a stale slot: a correctness bug, not FP order).
Each part runs with DEEPINFER_DETERMINISTIC=0 (old atomic MoE combine) and =1 (fixed-order combine).

    python benchmarks/diag_engine_determinism.py --out /tmp/det.json
    python benchmarks/diag_engine_determinism.py --smoke
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The engine from this tree even where an older copy is installed (it has no compiled code; the kernel packages,
# which do, still come from their installs).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "engine" / "src"))
from bench_engine_v4flash import build  # noqa: E402
from profile_engine_decode import _prompts, _sync, llm_decode  # noqa: E402

# (module, Class.method): engine functions whose tensor outputs are recorded, in return order.
TRACED = [
    ("deepinfer.engine.model.model", "DeepseekV4._embed"),
    ("deepinfer.engine.model.block", "Block._pre"),
    ("deepinfer.engine.model.attention", "Attention._project"),
    ("deepinfer.engine.model.compressor", "Compressor.project"),
    ("deepinfer.engine.model.compressor", "Compressor.run_prefill"),
    ("deepinfer.engine.model.compressor", "Compressor.run_decode"),
    ("deepinfer.engine.model.indexer", "Indexer.select"),
    ("deepinfer.engine.model.attention", "Attention._main_indices"),
    ("deepinfer.engine.model.attention", "Attention.forward"),
    ("deepinfer.engine.model.moe", "MoE.route"),
    ("deepinfer.engine.model.moe_grouped", "GroupedExperts.__call__"),
    ("deepinfer.engine.model.moe_grouped", "GroupedExpertsFP4.__call__"),
    ("deepinfer.engine.model.moe", "MoE.forward"),
    ("deepinfer.engine.model.block", "Block.forward"),
    ("deepinfer.engine.model.model", "DeepseekV4.logits"),
]
_REC: list | None = None  # (label, [tensors]) while recording, else None


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out.detach().clone()]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def _wrap(module: str, path: str) -> None:
    cls_name, meth = path.split(".")
    cls = getattr(importlib.import_module(module), cls_name, None)
    fn = getattr(cls, meth, None) if cls is not None else None
    if fn is None:
        print(f"   (not traced: {module}.{path} not found)", flush=True)
        return

    @functools.wraps(fn)
    def wrapped(*a, **k):
        out = fn(*a, **k)
        if _REC is not None:
            rec = out
            if path == "Compressor.run_decode":  # only closing tokens hold real entries (others: junk, by design)
                rec = (out[0], out[1], out[2][out[0]])
            _REC.append((path, _tensors(rec)))
        return out

    setattr(cls, meth, wrapped)


def build_runner(args, dev: torch.device, utilization: float):
    """profile_engine_decode's runner, with a smaller cache share: the eager run's recorded outputs need memory."""
    from deepinfer.engine.config_parse import config_from_dict
    from deepinfer.engine.runner import ModelRunner

    model, official, off_cfg = build(args, dev)
    del model
    return ModelRunner(
        config_from_dict(off_cfg),
        official,
        dtype=torch.bfloat16,
        device=dev,
        max_num_seqs=args.batch,
        max_model_len=args.prompt_len + max(args.steps, args.llm_steps) + 16,
        gpu_memory_utilization=utilization,
    )


def _set_flag(on: bool) -> None:
    os.environ["DEEPINFER_DETERMINISTIC"] = "1" if on else "0"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().flatten().view(torch.uint8) if t.numel() else t.flatten().to(torch.uint8)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float | None:
    if a.shape != b.shape:
        return None
    if a.is_floating_point():
        d = (a.float() - b.float()).abs()
        d = d[~(a.float().isnan() & b.float().isnan())]
        m = float(d.max()) if d.numel() else 0.0
        return m if m == m and m != float("inf") else None  # NaN in one run only: no finite diff
    return float((a.long() - b.long()).abs().max()) if a.numel() else 0.0


def _compare(r1: list, r2: list) -> dict:
    """First differing record (label, index, max abs diff) and the count of differing records."""
    first, ndiff, labels = None, 0, []
    for i, ((l1, t1), (l2, t2)) in enumerate(zip(r1, r2)):
        bad = (
            l1 != l2
            or len(t1) != len(t2)
            or any(x.shape != y.shape or not torch.equal(_bits(x), _bits(y)) for x, y in zip(t1, t2))
        )
        if bad:
            ndiff += 1
            if len(labels) < 12:
                labels.append(f"{l1}#{i}")
            if first is None:
                diffs = [_diff(x, y) for x, y in zip(t1, t2)]
                first = {"record": i, "label": l1, "label2": l2, "max_abs_diff": diffs}
    return {
        "records": len(r1),
        "records2": len(r2),
        "differing": ndiff,
        "first_diff": first,
        "differing_labels": labels,
    }


def _steps(runner, b: int, n: int, steps: int, dev, record: bool) -> tuple[list, list[torch.Tensor]]:
    """Prefill b prompts, decode `steps` fixed tokens; returns (records, per-step logits). Frees the slots."""
    global _REC
    from deepinfer.engine.sequence import SeqChunk

    cache = runner.cache
    # Restored after the run: the next run gets the same slots and blocks (same physical rows, same indices).
    free = (list(cache._free_blocks), list(cache._free_slots))
    slots = [cache.allocate_slot() for _ in range(b)]
    for s in slots:
        assert cache.reserve(s, n + steps + 8), "cache too small"
    ids = _prompts(b, n, runner.vocab_size, dev).tolist()
    _REC = [] if record else None
    logits = []
    try:
        with torch.inference_mode():
            runner.forward([SeqChunk(slots[i], ids[i], 0, "last") for i in range(b)])
            for i in range(steps):
                tok = [(7 + 13 * j + 31 * i) % runner.vocab_size for j in range(b)]
                outs = runner.forward([SeqChunk(s, [t], n + i, "last") for s, t in zip(slots, tok)])
                logits.append(torch.cat(outs).clone())
        _sync(dev)
        rec = _REC or []
    finally:
        _REC = None
        for s in slots:
            cache.free_slot(s)
        cache._free_blocks[:], cache._free_slots[:] = free
    return rec, logits


def _logit_cmp(l1: list, l2: list) -> dict:
    eq = [bool(torch.equal(_bits(a), _bits(b))) for a, b in zip(l1, l2)]
    return {"steps_equal": eq, "max_abs_diff": [_diff(a, b) for a, b in zip(l1, l2)]}


def part_a(runner, args, dev) -> dict:
    graphs, runner.graphs = runner.graphs, None
    try:
        r1, l1 = _steps(runner, args.batch, args.prompt_len, args.steps, dev, True)
        r2, l2 = _steps(runner, args.batch, args.prompt_len, args.steps, dev, True)
        return {**_compare(r1, r2), "logits": _logit_cmp(l1, l2)}
    finally:
        runner.graphs = graphs


def part_b(runner, args, dev) -> dict:
    if runner.graphs is None:
        return {"skipped": "no CUDA graphs"}
    _, l1 = _steps(runner, args.batch, args.prompt_len, args.steps, dev, False)
    _, l2 = _steps(runner, args.batch, args.prompt_len, args.steps, dev, False)
    return {"logits": _logit_cmp(l1, l2)}


def _garbage(cache) -> None:
    """NaN into every KV / index-key row (their initial state), random values into the compressor tails."""
    for group in (cache.kv, cache.index_keys):
        for t in group:
            if t is not None:
                t.fill_(float("nan"))
    for group in (cache.tail_kv, cache.tail_score, cache.index_tail_kv, cache.index_tail_score):
        for t in group:
            if t is not None:
                t.normal_(0.0, 30.0)


def part_c(runner, args, dev) -> dict:
    from profile_engine_decode import _same_frac, _StubTokenizer

    from deepinfer.engine.llm import LLM
    from deepinfer.engine.sampling_params import SamplingParams

    rows = {}
    for seeded in (False, True):
        kind = "seeded" if seeded else "greedy"
        r = llm_decode(runner, args.batch, args.prompt_len, args.llm_steps, dev, False, seeded)
        rows[kind] = {k: r[k] for k in ("decode_tok_s", "step_ms", "self_same_frac")}
    llm = LLM.from_components(runner, _StubTokenizer(), max_num_seqs=args.batch, max_num_batched_tokens=8192)
    llm.async_sampling = False
    ids = _prompts(args.batch, args.prompt_len, runner.vocab_size, dev).tolist()
    params = SamplingParams(max_tokens=1 + args.llm_steps, ignore_eos=True, temperature=0.0)

    def gen():
        out = llm.generate(prompt_token_ids=ids, sampling_params=params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in out]

    a = gen()
    b = gen()
    _garbage(runner.cache)
    c = gen()
    rows["garbage"] = {"plain_same_frac": _same_frac(a, b), "after_garbage_same_frac": _same_frac(a, c)}
    return rows


def combine_cost(dev: torch.device, smoke: bool) -> dict:
    """GPU time (kernelkit.bench_cuda, graph mode) of the MoE combine: atomic index_add_ vs combine_rows, same
    inputs; decode (T = 32) and prefill (T = 8192) sizes, k = 6, hidden 4096 (V4-Flash)."""
    from deepinfer.engine.model.deterministic import combine_rows
    from kernelkit import bench_cuda

    rows = {}
    h = 256 if smoke else 4096
    for t in (4,) if smoke else (32, 8192):
        k = 6
        g = torch.Generator(device="cpu").manual_seed(t)
        order = torch.argsort(torch.rand(t, 64, generator=g).argsort(1)[:, :k].flatten(), stable=True)
        tok, src = (order // k).to(dev), torch.randn(t * k, h, generator=g).to(dev)
        kw = dict(rep=5, warmup=1) if smoke else dict(rep=30)
        old = bench_cuda(lambda t=t, tok=tok, src=src: torch.zeros(t, h, device=dev).index_add_(0, tok, src), **kw)
        new = bench_cuda(lambda t=t, tok=tok, src=src: combine_rows(t, tok, src), **kw)
        rows[f"T{t}"] = {
            "index_add_us": old["median_us"],
            "combine_rows_us": new["median_us"],
            "x_index_add": old["median_us"] / new["median_us"],
            "timer": new["timer"],
        }
    return rows


def _run(name: str, fn, *a) -> dict:
    t0 = time.perf_counter()
    try:
        r = fn(*a)
    except Exception as e:  # record it: the other parts still run
        r = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    r["seconds"] = round(time.perf_counter() - t0, 2)
    print(f"   {name}: " + json.dumps(r)[:1500], flush=True)
    return r


def _recapture(runner) -> None:
    """Graphs bake the flag in at capture: capture them again after changing it."""
    if runner.graphs is not None:
        from deepinfer.engine.graphs import DecodeGraphs

        runner.graphs = None
        torch.cuda.empty_cache()
        runner.graphs = DecodeGraphs(runner, runner.cache.num_slots)
        runner.graphs.capture_all()


def verdict(report: dict) -> list[str]:
    lines = []
    for flag in ("off", "on"):
        r = report.get(flag, {})
        a = r.get("a_eager", {})
        fd = a.get("first_diff")
        lines.append(
            f"flag {flag}: eager differing records {a.get('differing')}/{a.get('records')}, first "
            f"{fd['label'] + ' #' + str(fd['record']) + ' diff ' + str(fd['max_abs_diff']) if fd else None}; "
            f"graph logits equal {r.get('b_graphs', {}).get('logits', {}).get('steps_equal')}; "
            f"llm {json.dumps(r.get('c_llm', {}))[:400]}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--llm-steps", type=int, default=24)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.batch, args.prompt_len, args.steps, args.llm_steps = 2, 16, 2, 2
    dev = torch.device("cpu" if args.smoke else "cuda")
    for m, p in TRACED:
        _wrap(m, p)
    _set_flag(False)  # the runner captures its graphs with the old combine; one recapture for the flag on
    t0 = time.perf_counter()
    runner = build_runner(args, dev, 0.5)
    print(f"== built in {time.perf_counter() - t0:.1f} s", flush=True)
    report = {
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "layers": args.layers,
    }
    try:
        report["combine_cost"] = _run("combine_cost", combine_cost, dev, args.smoke)
        for on in (False, True):
            _set_flag(on)
            if on:
                _run("recapture", lambda: (_recapture(runner), {})[1])
            name = "on" if on else "off"
            print(f"== DEEPINFER_DETERMINISTIC={int(on)}", flush=True)
            report[name] = {
                "a_eager": _run("a_eager", part_a, runner, args, dev),
                "b_graphs": _run("b_graphs", part_b, runner, args, dev),
                "c_llm": _run("c_llm", part_c, runner, args, dev),
            }
        report["verdict"] = verdict(report)
        print("== verdict", flush=True)
        for line in report["verdict"]:
            print("   " + line, flush=True)
    finally:
        if args.out:
            from kernelkit import write_results_json

            records = [{"flag": f, "part": k, **v} for f in ("off", "on") for k, v in report.get(f, {}).items()]
            records.append({"part": "combine_cost", **report.get("combine_cost", {})})
            meta = {k: v for k, v in report.items() if k not in ("off", "on", "combine_cost")}
            write_results_json(args.out, records, meta)
            print(f"== wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
