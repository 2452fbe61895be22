"""Continuous batching through the public API on the embedded tiny checkpoint (FP8/FP4 official format).

Sixteen prompts of different lengths generated together give exactly the tokens each gives alone (greedy,
fp32, CPU), with a small token budget so prefill is chunked and decode and prefill share steps. A bad
request in the same call fails alone.
"""

from __future__ import annotations

import random

import pytest

from deepinfer.engine import LLM, SamplingParams
from deepinfer.engine.tiny import default_model_path


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(model=str(default_model_path()), dtype="float32", device="cpu", max_model_len=256,
               max_num_seqs=16, max_num_batched_tokens=48)


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(4)
    return [[0] + [rng.randrange(2, vocab) for _ in range(rng.randrange(3, 90))] for _ in range(16)]


def test_sixteen_prompts_together_equal_alone(llm):
    prompts = _prompts(llm.runner.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    together = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    for ids, out in zip(prompts, together):
        alone = llm.generate(prompt_token_ids=[ids], sampling_params=params, use_tqdm=False)[0]
        assert list(out.token_ids) == list(alone.token_ids)
        assert len(out.token_ids) == 10
    cache = llm.runner.cache
    assert cache.num_free_blocks == cache.num_blocks and cache.num_free_slots == cache.num_user_slots


def test_seeded_sampling_is_batch_invariant(llm):
    prompts = _prompts(llm.runner.vocab_size)[:6]
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=100 + i, max_tokens=8, ignore_eos=True)
              for i in range(len(prompts))]
    together = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    for ids, p, out in zip(prompts, params, together):
        alone = llm.generate(prompt_token_ids=[ids], sampling_params=p, use_tqdm=False)[0]
        assert list(out.token_ids) == list(alone.token_ids)


def test_too_long_prompt_fails_alone(llm):
    good = _prompts(llm.runner.vocab_size)[:2]
    bad = [0] + [5] * 300  # longer than max_model_len=256
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=[good[0], bad, good[1]], sampling_params=params, use_tqdm=False)
    assert outs[1].finish_reason == "error" and "256" in outs[1].error and "301" in outs[1].error
    assert [len(o.token_ids) for o in (outs[0], outs[2])] == [4, 4]


def test_text_generation_and_chat(llm):
    out = llm.generate(["The quick brown fox"], SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)[0]
    assert out.prompt_token_ids[0] == 0 and isinstance(out.text, str) and out.finish_reason in ("stop", "length")
    chat = llm.chat([{"role": "user", "content": "Hello there"}], SamplingParams(temperature=0.0, max_tokens=4),
                    use_tqdm=False)[0]
    assert chat.finish_reason in ("stop", "length") and len(chat.token_ids) >= 1
