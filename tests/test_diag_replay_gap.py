"""benchmarks/diag_replay_gap.distinct_experts on the CPU smoke-sized V4 model: the mechanism behind session 9's
"replay gap" finding (token id 0 in every row sends every row of a hash-routed layer to the same experts)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_hash_layers_route_identical_tokens_to_one_expert_set() -> None:
    import profile_engine_decode as ped
    from diag_replay_gap import distinct_experts

    args = argparse.Namespace(layers=4, batches="4", prompt_len=32, steps=2, llm_steps=0, smoke=True)
    runner = ped.build_runner(args, torch.device("cpu"))
    slots = ped._prefill(runner, 4, 32, torch.device("cpu"))
    k = runner.model.cfg.num_experts_per_tok
    hashed = sum(1 for blk in runner.model.blocks if blk.moe.tid2eid is not None)
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randperm(runner.vocab_size, generator=gen)[:4].tolist()
    same = distinct_experts(runner, slots, 32, [tokens[0]] * 4)
    varied = distinct_experts(runner, slots, 32, tokens)
    assert hashed >= 1 and len(same) == len(varied) == len(runner.model.blocks)
    assert same[:hashed] == [k] * hashed, same  # one token id -> one expert set per hash layer
    assert all(v >= s for v, s in zip(varied[:hashed], same[:hashed])) and sum(varied[:hashed]) > k * hashed, varied
