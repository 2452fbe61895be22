"""LLM + scheduler + sampler end to end over a fake runner, cache and tokenizer.

The fakes live here and are imported by test_scheduler.py and test_cli.py. The fake runner's logits are a
deterministic function of the sequence's whole token prefix (a rolling hash seeds the row), so any mistake in
chunking, preemption or re-prefill changes the output; the fake cache counts slots and blocks and the runner
asserts the contract (slot held, start_pos == tokens already fed, tokens reserved, positions < max_model_len).
"""

from __future__ import annotations

import math
import string

import pytest
import torch

from deepinfer.engine.llm import LLM
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.engine.sequence import SeqChunk

_HASH_MOD = (1 << 61) - 1


class FakeTokenizer:
    """Byte-level toy tokenizer: 2 specials, lowercase letters, punctuation, the two UTF-8 bytes of 'é', bigrams."""

    def __init__(self, vocab_size: int = 64, eos_token_ids: tuple[int, ...] = (1,)) -> None:
        pieces = [b"<bos>", b"<eos>"] + [c.encode() for c in string.ascii_lowercase + " :\n."] + [b"\xc3", b"\xa9"]
        letters = "etaoinshr"
        pieces += [(a + b).encode() for a in letters for b in letters if (a + b).encode() not in pieces]
        self.pieces = pieces[:vocab_size]
        self.special = {0, 1}
        self.bos_token_id = 0
        self.eos_token_ids = tuple(eos_token_ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        data, ids = text.encode(), [self.bos_token_id] if add_special_tokens else []
        while data:
            best = max((i for i, p in enumerate(self.pieces) if data.startswith(p)), key=lambda i: len(self.pieces[i]))
            ids.append(best)
            data = data[len(self.pieces[best]) :]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        kept = [self.pieces[i] for i in ids if not (skip_special_tokens and i in self.special)]
        return b"".join(kept).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        body = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return "<bos>" + body + ("assistant:" if add_generation_prompt else "")


class FakeCache:
    """Slots and fixed-size blocks with the CachePool interface; asserts slots are held when used."""

    def __init__(self, num_slots: int, num_blocks: int, block_size: int) -> None:
        self.num_slots, self.num_blocks, self.block_size = num_slots, num_blocks, block_size
        self.held: dict[int, int] = {}  # slot -> blocks held
        self.hashes: dict[int, list[int]] = {}  # slot -> rolling hash after each fed token

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - sum(self.held.values())

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate_slot(self) -> int | None:
        free = [s for s in range(self.num_slots) if s not in self.held]
        if not free:
            return None
        self.held[free[0]], self.hashes[free[0]] = 0, []
        return free[0]

    def reserve(self, slot: int, num_tokens: int) -> bool:
        assert slot in self.held, f"reserve on unallocated slot {slot}"
        need = self.blocks_for(num_tokens) - self.held[slot]
        if need > self.num_free_blocks:
            return False
        self.held[slot] += max(need, 0)
        return True

    def free_slot(self, slot: int) -> None:
        assert slot in self.held, f"free of unallocated slot {slot}"
        del self.held[slot], self.hashes[slot]


class FakeRunner:
    """Logits of a position = fixed function of the sequence's token prefix up to and including it."""

    def __init__(self, vocab_size=64, max_model_len=256, num_slots=8, num_blocks=256, block_size=4, scale=2.5):
        self.vocab_size, self.max_model_len, self.scale = vocab_size, max_model_len, scale
        self.cache = FakeCache(num_slots, num_blocks, block_size)
        self.steps: list[tuple[int, int]] = []  # (chunks, tokens) per forward

    @staticmethod
    def extend_hash(h: int, token: int) -> int:
        return (h * 1_000_033 + token + 1) % _HASH_MOD

    def logits_for_hash(self, h: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(h)
        return torch.randn(self.vocab_size, generator=gen) * self.scale

    def logits_for_prefix(self, tokens: list[int]) -> torch.Tensor:
        """The logits this runner returns after feeding `tokens` (for tests to predict results)."""
        h = 0
        for t in tokens:
            h = self.extend_hash(h, t)
        return self.logits_for_hash(h)

    def forward(self, chunks: list[SeqChunk]) -> list[torch.Tensor | None]:
        assert len({c.slot for c in chunks}) == len(chunks), "a slot appears twice in one step"
        self.steps.append((len(chunks), sum(len(c.token_ids) for c in chunks)))
        return [self._one(c) for c in chunks]

    def _one(self, c: SeqChunk) -> torch.Tensor | None:
        hashes = self.cache.hashes[c.slot]
        assert c.start_pos == len(hashes), f"slot {c.slot}: start_pos {c.start_pos}, {len(hashes)} tokens fed"
        end = c.start_pos + len(c.token_ids)
        assert 0 < len(c.token_ids) and end <= self.max_model_len
        assert self.cache.held[c.slot] * self.cache.block_size >= end, "tokens not reserved before forward"
        rows = []
        for t in c.token_ids:
            assert 0 <= t < self.vocab_size
            hashes.append(self.extend_hash(hashes[-1] if hashes else 0, t))
            rows.append(hashes[-1])
        picked = {"last": rows[-1:], "all": rows, "none": []}[c.want]
        return torch.stack([self.logits_for_hash(h) for h in picked]) if picked else None


def make_llm(runner: FakeRunner | None = None, tokenizer: FakeTokenizer | None = None, **kw) -> LLM:
    return LLM.from_components(runner or FakeRunner(), tokenizer or FakeTokenizer(), **kw)


def random_prompts(count: int, gen: torch.Generator, vocab: int = 64, low: int = 1, high: int = 30):
    lengths = torch.randint(low, high, (count,), generator=gen).tolist()
    return [torch.randint(2, vocab, (n,), generator=gen).tolist() for n in lengths]


def assert_cache_clean(runner: FakeRunner) -> None:
    assert runner.cache.held == {} and runner.cache.num_free_blocks == runner.cache.num_blocks


def test_greedy_follows_the_runner_logits():
    runner = FakeRunner()
    prompt = [5, 9, 13]
    out = make_llm(runner).generate(
        prompt_token_ids=[prompt],
        sampling_params=SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
        use_tqdm=False,
    )[0]
    tokens = list(prompt)
    for _ in range(6):
        tokens.append(int(torch.argmax(runner.logits_for_prefix(tokens))))
    assert out.token_ids == tokens[3:]
    assert out.finish_reason == "length" and out.finished and out.error is None
    assert_cache_clean(runner)


def test_text_prompts_and_chat_use_the_tokenizer():
    tok = FakeTokenizer(eos_token_ids=())
    llm = make_llm(tokenizer=tok)
    params = SamplingParams(temperature=0, max_tokens=4)
    out = llm.generate(["hello there", "tea"], params, use_tqdm=False)
    assert [o.prompt for o in out] == ["hello there", "tea"]
    assert out[0].prompt_token_ids == tok.encode("hello there") and out[0].prompt_token_ids[0] == tok.bos_token_id
    assert out[0].text == tok.decode(out[0].token_ids)
    chats = llm.chat([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "so"}]], params, use_tqdm=False)
    assert chats[0].prompt == "<bos>user: hi\nassistant:"
    assert chats[0].prompt_token_ids == tok.encode(chats[0].prompt, add_special_tokens=False)
    single = llm.chat([{"role": "user", "content": "hi"}], params, use_tqdm=False)
    assert len(single) == 1 and single[0].token_ids == chats[0].token_ids


def test_seedless_requests_repeat_with_a_fresh_llm_of_the_same_seed():
    prompts = random_prompts(4, torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    first = make_llm(seed=7).generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    again = make_llm(seed=7).generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    other = make_llm(seed=8).generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert [o.token_ids for o in first] != [o.token_ids for o in other]


def test_logprobs_are_of_the_raw_distribution():
    runner = FakeRunner()
    prompt = [7, 3, 22, 40]
    params = SamplingParams(temperature=0.7, top_k=5, seed=3, max_tokens=5, ignore_eos=True, logprobs=3)
    out = make_llm(runner).generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)[0]
    assert len(out.logprobs) == 5
    total = 0.0
    for i, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        ref = torch.log_softmax(runner.logits_for_prefix(prompt + out.token_ids[:i]), -1)
        assert len(entry) in (3, 4) and tok in entry
        assert math.isclose(entry[tok].logprob, float(ref[tok]), rel_tol=0, abs_tol=1e-6)
        assert entry[tok].rank == int((ref > ref[tok]).sum()) + 1
        top3 = torch.topk(ref, 3).indices.tolist()
        assert all(t in entry for t in top3) and entry[top3[0]].rank == 1
        assert entry[tok].decoded_token == FakeTokenizer().decode([tok], skip_special_tokens=False)
        total += entry[tok].logprob
    assert math.isclose(out.outputs[0].cumulative_logprob, total, abs_tol=1e-5)


def test_prompt_logprobs_across_prefill_chunks():
    runner = FakeRunner()
    prompt = random_prompts(1, torch.Generator().manual_seed(4), low=11, high=12)[0]
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1, ignore_eos=True)
    out = make_llm(runner, max_num_batched_tokens=3).generate(
        prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False
    )[0]
    assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
    for pos in range(1, len(prompt)):
        ref = torch.log_softmax(runner.logits_for_prefix(prompt[:pos]), -1)
        entry = out.prompt_logprobs[pos]
        assert math.isclose(entry[prompt[pos]].logprob, float(ref[prompt[pos]]), abs_tol=1e-6)
        assert int(torch.argmax(ref)) in entry
    assert max(tokens for _, tokens in runner.steps) <= 3


def test_error_requests_fail_alone():
    runner = FakeRunner(max_model_len=20)
    gen = torch.Generator().manual_seed(5)
    good = random_prompts(2, gen, high=10)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    alone = [
        make_llm(FakeRunner(max_model_len=20))
        .generate(prompt_token_ids=[p], sampling_params=params, use_tqdm=False)[0]
        .token_ids
        for p in good
    ]
    batch = [good[0], [], [3] * 21, [3, 64, 2], good[1]]
    out = make_llm(runner).generate(prompt_token_ids=batch, sampling_params=params, use_tqdm=False)
    assert [o.finish_reason for o in out] == ["length", "error", "error", "error", "length"]
    assert [out[0].token_ids, out[4].token_ids] == alone
    assert "empty" in out[1].error and "21 tokens" in out[2].error and "max_model_len=20" in out[2].error
    assert "[0, 64)" in out[3].error and out[3].token_ids == [] and out[3].finished
    assert_cache_clean(runner)


def test_runner_failure_frees_the_cache_and_the_llm_stays_usable():
    runner = FakeRunner()
    llm = make_llm(runner)
    real_forward = runner.forward

    def broken(chunks):
        raise RuntimeError("device lost")

    runner.forward = broken
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate(prompt_token_ids=[[4, 5], [6]], use_tqdm=False)
    assert_cache_clean(runner)
    runner.forward = real_forward
    assert len(llm.generate(prompt_token_ids=[[4, 5]], use_tqdm=False)[0].token_ids) >= 1


def test_bad_arguments_are_named():
    llm = make_llm()
    assert llm.generate([], use_tqdm=False) == []
    with pytest.raises(ValueError, match="prompts or prompt_token_ids"):
        llm.generate(use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params has 1 entries for 2 prompts"):
        llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)
    with pytest.raises(TypeError, match="prompts must be"):
        llm.generate([1, 2], use_tqdm=False)
    with pytest.raises(ValueError, match="same length"):
        llm.generate(["a"], prompt_token_ids=[[1], [2]], use_tqdm=False)
