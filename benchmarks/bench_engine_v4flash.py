"""Engine throughput on a V4-Flash-shaped model (4 layers, random weights) vs transformers, same run.

Measures, for batch B in {1, 32, 256}: prefill tokens/s (B prompts of L tokens) and greedy decode tokens/s
(S steps after the prefill), for transformers' DeepseekV4ForCausalLM (bf16, eager, its default experts loop)
and for DeepInfer's ModelRunner (bf16 activations; FP4 experts stay FP4, FP8 linears dequantised to bf16 once;
decode steps replay CUDA graphs captured at start-up). Each (batch, length) runs once untimed first (Triton
compiles, allocator and cuBLAS heuristics warm for both engines). Also checks that both produce close logits
(bf16 noise) on the same prompt. Writes JSON.

    python benchmarks/bench_engine_v4flash.py --out benchmarks/results/engine_v4flash_h200.json
    python benchmarks/bench_engine_v4flash.py --smoke      # tiny widths on CPU: checks the script only
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from v4flash_model import hf_config, official_config, quantise_to_official, randomise_  # noqa: E402

SMOKE = dict(
    vocab_size=512,
    hidden_size=256,
    num_attention_heads=4,
    head_dim=128,
    q_lora_rank=64,
    o_groups=2,
    o_lora_rank=64,
    index_n_heads=8,
    index_topk=16,
    n_routed_experts=16,
    moe_intermediate_size=128,
)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _prompts(b: int, n: int, vocab: int, dev: torch.device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(b * 7919 + n)
    ids = torch.randint(2, vocab, (b, n), generator=g)
    ids[:, 0] = 0
    return ids.to(dev)


def _hf_cache(out):
    """transformers >= 5.2x returns `.cache`; earlier 5.x `.past_key_values` (and takes that keyword)."""
    return out.cache if hasattr(out, "cache") else out.past_key_values


def _hf_step(model, tok, mask, cache):
    key = "cache" if "cache" in model.forward.__code__.co_varnames else "past_key_values"
    return model(input_ids=tok, attention_mask=mask, use_cache=True, logits_to_keep=1, **{key: cache})


@torch.no_grad()
def bench_hf(model, b: int, n: int, steps: int, dev: torch.device) -> dict:
    ids = _prompts(b, n, model.config.vocab_size, dev)
    mask = torch.ones_like(ids)
    _sync(dev)
    t0 = time.perf_counter()
    out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
    _sync(dev)
    t1 = time.perf_counter()
    cache, tok, first = _hf_cache(out), out.logits[:, -1].argmax(-1, keepdim=True), out.logits[0, -1].float()
    for _ in range(steps):
        mask = torch.cat((mask, torch.ones_like(tok)), dim=1)
        out = _hf_step(model, tok, mask, cache)
        cache, tok = _hf_cache(out), out.logits[:, -1].argmax(-1, keepdim=True)
    _sync(dev)
    t2 = time.perf_counter()
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "first_logits": first.cpu()}


@torch.no_grad()
def bench_ours(runner, b: int, n: int, steps: int, dev: torch.device, step_tokens: int) -> dict:
    from deepinfer.engine.sequence import SeqChunk

    ids = _prompts(b, n, runner.vocab_size, dev).tolist()
    slots = [runner.cache.allocate_slot() for _ in range(b)]
    for s in slots:
        assert runner.cache.reserve(s, n + steps), "cache too small for the benchmark"
    per_step = max(1, step_tokens // n)
    _sync(dev)
    t0 = time.perf_counter()
    last = []
    for lo in range(0, b, per_step):
        chunks = [SeqChunk(slots[i], ids[i], 0, "last") for i in range(lo, min(b, lo + per_step))]
        last += runner.forward(chunks)
    _sync(dev)
    t1 = time.perf_counter()
    first = last[0][0].float()
    tok = torch.cat(last).argmax(-1).tolist()
    for i in range(steps):
        chunks = [SeqChunk(s, [t], n + i, "last") for s, t in zip(slots, tok)]
        outs = runner.forward(chunks)
        runner.prefetch_next(chunks)  # as LLM.generate does: next layout while the GPU runs this step
        tok = torch.cat(outs).argmax(-1).tolist()
    _sync(dev)
    t2 = time.perf_counter()
    for s in slots:
        runner.cache.free_slot(s)
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "first_logits": first.cpu()}


def _rates(r: dict, b: int, n: int, steps: int) -> dict:
    return {
        "prefill_tok_s": b * n / r["prefill_s"],
        "decode_tok_s": b * steps / r["decode_s"],
        "prefill_s": r["prefill_s"],
        "decode_s": r["decode_s"],
    }


def build(args, dev: torch.device):
    from transformers import DeepseekV4ForCausalLM

    cfg = hf_config(args.layers, **(SMOKE if args.smoke else {}))
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = DeepseekV4ForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    randomise_(model, seed=0)
    official = quantise_to_official(model)
    return model, official, official_config(cfg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--step-tokens", type=int, default=8192, help="max prefill tokens per DeepInfer step")
    ap.add_argument("--smoke", action="store_true", help="tiny widths on CPU (checks the script, not speed)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--profile", action="store_true", help="profile one DeepInfer decode step at the largest batch")
    ap.add_argument(
        "--llm-loop",
        type=int,
        default=0,
        metavar="STEPS",
        help="also time LLM.generate decode (STEPS steps) with DEEPINFER_ASYNC_SAMPLING off vs on",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cpu" if args.smoke else "cuda")
    batches = [int(x) for x in args.batches.split(",")]
    model, official, off_cfg = build(args, dev)
    results: dict = {"hf": {}, "deepinfer": {}}
    warm = dict(b=1, n=16, steps=2)
    if not args.skip_hf:
        bench_hf(model, warm["b"], warm["n"], warm["steps"], dev)
        for b in batches:
            try:
                bench_hf(model, b, args.prompt_len, 1, dev)  # untimed: same shapes once (allocator, heuristics)
                r = bench_hf(model, b, args.prompt_len, args.steps, dev)
            except torch.OutOfMemoryError as e:  # record it: transformers' eager path may not fit large batches
                results["hf"][b] = {"error": f"out of memory: {str(e)[:200]}"}
                torch.cuda.empty_cache()
                continue
            results["hf"][b] = {**_rates(r, b, args.prompt_len, args.steps)}
            if b == 1:
                hf_first = r["first_logits"]
            print(f"hf b={b}: {results['hf'][b]}", flush=True)
    del model
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    from deepinfer.engine.config_parse import config_from_dict
    from deepinfer.engine.runner import ModelRunner

    runner = ModelRunner(
        config_from_dict(off_cfg),
        official,
        dtype=torch.bfloat16,
        device=dev,
        max_num_seqs=max(batches),
        max_model_len=args.prompt_len + max(args.steps, args.llm_loop) + 8,
        gpu_memory_utilization=0.92,
    )
    del official
    bench_ours(runner, warm["b"], warm["n"], warm["steps"], dev, args.step_tokens)
    for b in batches:
        bench_ours(runner, b, args.prompt_len, 1, dev, args.step_tokens)  # untimed: compiles this shape's kernels
        r = bench_ours(runner, b, args.prompt_len, args.steps, dev, args.step_tokens)
        results["deepinfer"][b] = _rates(r, b, args.prompt_len, args.steps)
        if b == 1 and not args.skip_hf:
            a, c = r["first_logits"], hf_first
            results["logits_check_b1"] = {
                "max_abs_diff": (a - c).abs().max().item(),
                "cosine": torch.nn.functional.cosine_similarity(a, c, dim=0).item(),
                "same_argmax": bool(a.argmax() == c.argmax()),
            }
        print(f"deepinfer b={b}: {results['deepinfer'][b]}", flush=True)
        if args.llm_loop > 0:  # the serving loop, sync vs async sampling (same runner, same run)
            from profile_engine_decode import compare_llm_loops

            try:
                results.setdefault("deepinfer_llm_loop", {})[b] = compare_llm_loops(
                    runner, b, args.prompt_len, args.llm_loop, dev
                )
            except Exception as e:  # keep the rest of the benchmark
                results.setdefault("deepinfer_llm_loop", {})[b] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    if args.profile:
        profile_decode(runner, max(batches), args.prompt_len, dev)
    _report(results, args, dev)
    return 0


def profile_decode(runner, b: int, n: int, dev: torch.device) -> None:
    """Print where one decode step's time goes (CUDA time vs host time, kernel counts)."""

    from deepinfer.engine.sequence import SeqChunk

    slots = [runner.cache.allocate_slot() for _ in range(b)]
    for s in slots:
        runner.cache.reserve(s, n + 2)
    ids = _prompts(b, n, runner.vocab_size, dev).tolist()
    step = max(1, 8192 // n)
    for lo in range(0, b, step):
        runner.forward([SeqChunk(slots[i], ids[i], 0, "none") for i in range(lo, min(b, lo + step))])
    chunks = [SeqChunk(s, [5], n, "last") for s in slots]
    _profile_step(runner, chunks, dev, f"decode b={b}")
    for s in slots:
        runner.cache.free_slot(s)
    slots = [runner.cache.allocate_slot() for _ in range(min(step, b))]
    for s in slots:
        runner.cache.reserve(s, n)
    chunks = [SeqChunk(s, ids[i], 0, "last") for i, s in enumerate(slots)]
    _profile_step(runner, chunks, dev, f"prefill {len(slots)}x{n}")
    for s in slots:
        runner.cache.free_slot(s)


def _profile_step(runner, chunks, dev: torch.device, label: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    _sync(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        runner.forward(chunks)
        _sync(dev)
        wall = time.perf_counter() - t0
    ev = prof.key_averages()
    cuda_us = sum(e.self_device_time_total for e in ev)
    print(
        f"PROFILE {label}: wall {wall * 1e3:.2f} ms, summed kernel time {cuda_us / 1e3:.2f} ms, "
        f"kernel launches {sum(e.count for e in ev if e.self_device_time_total > 0)}"
    )
    print(ev.table(sort_by="self_device_time_total", row_limit=22, max_name_column_width=60))


def _report(results: dict, args, dev: torch.device) -> None:
    for b in results["deepinfer"]:
        if "decode_tok_s" in results["hf"].get(b, {}):
            for k in ("prefill_tok_s", "decode_tok_s"):
                results["deepinfer"][b][f"{k}_x_hf"] = results["deepinfer"][b][k] / results["hf"][b][k]
    meta = {
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "layers": args.layers,
        "prompt_len": args.prompt_len,
        "decode_steps": args.steps,
        "command": " ".join(sys.argv),
        "smoke": args.smoke,
    }
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        pass
    doc = {"meta": meta, "results": results}
    print(json.dumps(doc, indent=1, default=str))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
