"""Scheduler: continuous batching, chunked prefill, preemption, stop rules, max_model_len (fake runner)."""

from __future__ import annotations

import test_llm_fake as _f  # noqa: E402  (the root conftest puts this folder on sys.path)
import torch

from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.scheduler import Scheduler
from deepinfer.engine.sequence import Sequence

FakeRunner, FakeTokenizer, make_llm = _f.FakeRunner, _f.FakeTokenizer, _f.make_llm
assert_cache_clean, random_prompts = _f.assert_cache_clean, _f.random_prompts


def _mixed_params(count: int) -> list[SamplingParams]:
    """Greedy and seeded sampled requests with different filters, lengths and logprobs."""
    params = []
    for i in range(count):
        if i % 4 == 0:
            params.append(SamplingParams(temperature=0, max_tokens=3 + i % 7, logprobs=2))
        else:
            params.append(
                SamplingParams(
                    temperature=0.6 + 0.1 * (i % 5),
                    top_p=0.9,
                    top_k=10 * (i % 3),
                    min_p=0.02,
                    seed=100 + i,
                    max_tokens=4 + i % 9,
                    ignore_eos=i % 2 == 0,
                )
            )
    return params


def _alone(prompts: list[list[int]], params: list[SamplingParams], **runner_kw) -> list:
    return [
        make_llm(FakeRunner(**runner_kw)).generate(prompt_token_ids=[p], sampling_params=s, use_tqdm=False)[0]
        for p, s in zip(prompts, params)
    ]


def _same(a, b) -> None:
    assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
    if a.logprobs is not None:
        assert [{t: lp.logprob for t, lp in d.items()} for d in a.logprobs] == [
            {t: lp.logprob for t, lp in d.items()} for d in b.logprobs
        ]


def test_continuous_batching_matches_running_alone():
    prompts = random_prompts(16, torch.Generator().manual_seed(10), low=1, high=40)
    params = _mixed_params(16)
    alone = _alone(prompts, params)
    runner = FakeRunner()
    llm = make_llm(runner, max_num_seqs=4, max_num_batched_tokens=5)
    together = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    for a, b in zip(alone, together):
        _same(a, b)
    assert max(chunks for chunks, _ in runner.steps) == 4 and max(t for _, t in runner.steps) == 5
    # Prompts longer than the budget must have gone in several chunks.
    assert len(runner.steps) > sum(len(p) for p in prompts) / 5
    assert_cache_clean(runner)


def test_preemption_keeps_outputs_and_leaks_nothing():
    prompts = random_prompts(10, torch.Generator().manual_seed(11), low=4, high=14)
    params = [SamplingParams(temperature=0.9, seed=i, max_tokens=24, ignore_eos=True) for i in range(10)]
    alone = _alone(prompts, params)
    runner = FakeRunner(num_slots=6, num_blocks=14, block_size=4)  # 56 tokens for up to 6 * 37
    llm = make_llm(runner, max_num_batched_tokens=16)
    together = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert llm.scheduler.num_preemptions > 0
    for a, b in zip(alone, together):
        _same(a, b)
    assert_cache_clean(runner)


def test_sequence_too_big_for_the_whole_cache_fails_alone():
    runner = FakeRunner(num_slots=4, num_blocks=4, block_size=4)  # 16 tokens in all
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    out = make_llm(runner).generate(prompt_token_ids=[[5] * 20, [6, 7]], sampling_params=params, use_tqdm=False)
    assert out[0].finish_reason == "error" and "20 tokens need 5 cache blocks" in out[0].error
    # The second grows past the pool while alone: its 17th token cannot be cached, it is preempted and cannot come
    # back; the 15 tokens it made are kept.
    assert out[1].finish_reason == "error" and len(out[1].token_ids) == 15 and "17 tokens need 5" in out[1].error
    assert_cache_clean(runner)


def _greedy_reference(prompt: list[int], n: int, tok: FakeTokenizer) -> tuple[list[int], str]:
    out = make_llm(tokenizer=tok).generate(
        prompt_token_ids=[prompt], use_tqdm=False, sampling_params=SamplingParams(temperature=0, max_tokens=n)
    )[0]
    return out.token_ids, out.text


def test_stop_strings_cut_the_text_and_span_tokens():
    tok = FakeTokenizer(eos_token_ids=())
    prompt = [9, 20, 31]
    ids, text = _greedy_reference(prompt, 14, tok)
    plain = [t >= 2 and tok.pieces[t].isascii() for t in ids]
    # A stop string made of the end of one token's text and the start of the next one's.
    k = next(i for i in range(3, len(ids) - 1) if plain[i] and plain[i + 1])
    stop = tok.decode([ids[k]])[-1] + tok.decode([ids[k + 1]])[0]
    at = text.find(stop)
    upto = next(i for i in range(len(ids)) if stop in tok.decode(ids[: i + 1]))
    llm = make_llm(tokenizer=tok)
    for include in (False, True):
        params = SamplingParams(temperature=0, max_tokens=14, stop=["zzzz", stop], include_stop_str_in_output=include)
        out = llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)[0]
        assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
        assert out.text == text[: at + len(stop) if include else at]
        assert out.token_ids == ids[: upto + 1]


def test_eos_and_stop_token_ids():
    prompt = [12, 2, 44]
    ids, text = _greedy_reference(prompt, 10, FakeTokenizer(eos_token_ids=()))
    k = 4
    first = ids.index(ids[k])
    tok = FakeTokenizer(eos_token_ids=(ids[k],))
    llm = make_llm(tokenizer=tok)
    out = llm.generate(
        prompt_token_ids=[prompt], sampling_params=SamplingParams(temperature=0, max_tokens=10), use_tqdm=False
    )[0]
    assert out.token_ids == ids[: first + 1] and out.finish_reason == "stop" and out.outputs[0].stop_reason is None
    assert out.text == tok.decode(ids[:first])
    out = llm.generate(
        prompt_token_ids=[prompt],
        sampling_params=SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert out.token_ids == ids and out.finish_reason == "length"
    out = llm.generate(
        prompt_token_ids=[prompt],
        sampling_params=SamplingParams(
            temperature=0, max_tokens=10, ignore_eos=True, stop_token_ids=[ids[k]], include_stop_str_in_output=True
        ),
        use_tqdm=False,
    )[0]
    assert out.outputs[0].stop_reason == ids[k] and out.text == tok.decode(ids[: first + 1])


def test_max_model_len_caps_prompt_plus_output():
    runner = FakeRunner(max_model_len=20)
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    out = make_llm(runner).generate(
        prompt_token_ids=[[3] * 15, [4] * 20, [5] * 21], sampling_params=params, use_tqdm=False
    )
    assert [len(o.token_ids) for o in out] == [5, 1, 0]
    assert [o.finish_reason for o in out] == ["length", "length", "error"]
    assert_cache_clean(runner)


def test_incremental_detokenization_waits_for_whole_characters():
    tok = FakeTokenizer()
    seq = Sequence("0", None, [5, 6], SamplingParams(), seed=0)
    deltas = []
    e_acute = [tok.pieces.index(b"\xc3"), tok.pieces.index(b"\xa9")]  # the two UTF-8 bytes of 'é'
    for t in [tok.encode("a", False)[0], *e_acute, tok.encode("b", False)[0]]:
        seq.append_token(t)
        deltas.append(seq.detokenize_next(tok))
    assert deltas == ["a", "", "é", "b"] and seq.text == "aéb"
    seq.append_token(e_acute[0])
    assert seq.detokenize_next(tok) == "" and seq.text == "aéb"
    seq.flush_text(tok)  # at finish, a dangling byte shows as U+FFFD like tokenizer.decode does
    assert seq.text == "aéb\ufffd" == tok.decode(seq.output_token_ids)


def test_schedule_respects_budget_and_fcfs_admission():
    runner = FakeRunner(num_slots=2)
    sched = Scheduler(
        runner.cache, FakeTokenizer(), vocab_size=64, max_model_len=64, max_num_seqs=2, max_num_batched_tokens=6
    )
    seqs = [Sequence(str(i), None, [2 + i] * n, SamplingParams(), seed=i) for i, n in enumerate((4, 9, 3))]
    for s in seqs:
        sched.add(s)
    batch = sched.schedule()
    assert [(b.seq.request_id, b.chunk.start_pos, len(b.chunk.token_ids), b.chunk.want) for b in batch] == [
        ("0", 0, 4, "last"),
        ("1", 0, 2, "none"),
    ]
    assert [b.samples for b in batch] == [True, False] and list(sched.waiting) == [seqs[2]]
    sched.update(batch, runner.forward([b.chunk for b in batch]))
    batch = sched.schedule()  # seq 0 decodes one token, seq 1 continues its prefill; no slot for seq 2
    assert [(b.seq.request_id, b.chunk.start_pos, len(b.chunk.token_ids)) for b in batch] == [("0", 4, 1), ("1", 2, 5)]
