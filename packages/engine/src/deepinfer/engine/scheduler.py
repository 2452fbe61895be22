"""Continuous batching with chunked prefill, admission, preemption and stop rules.

Each `schedule()` builds one runner step:
1. every running sequence with one token to feed (decode, or the last token of a prefill) gets it, in admission
   order; before that its cache must hold one more token (`reserve(slot, num_cached + 1)`); when that fails the
   most recently admitted running sequence is preempted (slot freed, sent to the front of the waiting queue to be
   prefilled again with prompt + generated tokens) until it fits or the sequence itself was the victim;
2. the remaining token budget (`max_num_batched_tokens`) goes to running sequences still prefilling, then to
   waiting sequences in arrival order, while fewer than `max_num_seqs` run. Admission takes a slot
   (`allocate_slot()`) and reserves the whole prompt (`reserve(slot, len)`); the first request that cannot be
   admitted stops admission (first come, first served), and none is admitted in a step that preempted while
   other sequences still run (the victim would likely be admitted and preempted again). A request that cannot
   fit even into an idle cache finishes with finish_reason "error" (keeping any tokens it generated).
A prefill chunk asks for logits only when it ends the sequence's pending tokens ("last") or when prompt logprobs
are still owed ("all"); otherwise "none". `update()` samples, applies the stop rules and frees finished slots.

Stop rules, checked after each token in this order: EOS (unless ignore_eos) or a stop_token_id => "stop"; a stop
string in the text => "stop" (text cut before it unless include_stop_str_in_output); max_tokens generated or
prompt + output reaching max_model_len => "length". A stop token's text is not appended unless
include_stop_str_in_output (as vLLM). Prompts that are empty, longer than max_model_len or hold ids outside
[0, vocab_size) finish at once with "error".
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from .outputs import Logprob, PositionLogprobs
from .sampler import TokenLogprobs, sample, token_logprobs
from .sequence import SeqChunk, Sequence, SequenceStatus


@dataclass
class ScheduledChunk:
    """A chunk of `seq` in this step; `samples` when its last logits row yields the sequence's next token."""

    seq: Sequence
    chunk: SeqChunk
    samples: bool


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class Scheduler:
    """Owns the waiting / running queues of one engine and turns logits into tokens.

    Args:
        cache: the runner's cache (`allocate_slot`, `reserve`, `free_slot`, `num_free_blocks`, `blocks_for`).
        tokenizer: object with `decode(ids, skip_special_tokens=...)` and `eos_token_ids`.
        vocab_size: logits columns; prompt ids must be below it.
        max_model_len: most tokens (prompt + output) a sequence may hold.
        max_num_seqs: most sequences running at once.
        max_num_batched_tokens: most tokens fed per step.
    """

    def __init__(
        self,
        cache: Any,
        tokenizer: Any,
        *,
        vocab_size: int,
        max_model_len: int,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
    ) -> None:
        self.cache = cache
        self.tokenizer = tokenizer
        self.vocab_size = _positive_int("vocab_size", vocab_size)
        self.max_model_len = _positive_int("max_model_len", max_model_len)
        self.max_num_seqs = _positive_int("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = _positive_int("max_num_batched_tokens", max_num_batched_tokens)
        self.eos_token_ids = frozenset(tokenizer.eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._finished: list[Sequence] = []
        self._piece_cache: dict[int, str] = {}
        self.num_preemptions = 0

    # ----------------------------------------------------------------- queues
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence, or finish it at once with "error" when its prompt cannot run."""
        problem = self._prompt_problem(seq.prompt_token_ids)
        if problem is not None:
            self._finish(seq, "error", error=f"request {seq.request_id}: {problem}")
            return
        self.waiting.append(seq)

    def _prompt_problem(self, ids: list[int]) -> str | None:
        if len(ids) == 0:
            return "the prompt is empty (0 tokens); at least 1 token is needed"
        if len(ids) > self.max_model_len:
            return f"the prompt has {len(ids)} tokens, more than max_model_len={self.max_model_len}"
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            return f"prompt token ids must be ints in [0, {self.vocab_size}), got {bad[:5]}"
        return None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def take_finished(self) -> list[Sequence]:
        """Sequences finished since the last call, in finishing order."""
        done, self._finished = self._finished, []
        return done

    def abort_all(self) -> None:
        """Free every slot and forget all queued work (after an exception, so the cache stays usable)."""
        for seq in self.running:
            self.cache.free_slot(seq.slot)
            seq.slot = None
        self.running.clear()
        self.waiting.clear()

    # ------------------------------------------------------------- scheduling
    def schedule(self) -> list[ScheduledChunk]:
        """Choose this step's chunks (see the module docstring); empty only when nothing can run."""
        budget = self.max_num_batched_tokens
        batch: list[ScheduledChunk] = []
        preemptions_before = self.num_preemptions
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or seq.num_pending != 1:
                continue
            if not self._reserve_or_preempt(seq):
                continue
            batch.append(self._chunk(seq, 1))
            budget -= 1
        for seq in self.running:
            if budget > 0 and seq.num_pending > 1:
                take = min(budget, seq.num_pending)
                batch.append(self._chunk(seq, take))
                budget -= take
        # After a preemption, admit nothing while others run: the victim would be re-admitted and preempted again.
        hold = self.num_preemptions > preemptions_before and bool(batch)
        while budget > 0 and not hold and self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self._admit(seq):
                if seq.is_finished:
                    continue
                break
            take = min(budget, seq.num_pending)
            batch.append(self._chunk(seq, take))
            budget -= take
        return batch

    def _reserve_or_preempt(self, seq: Sequence) -> bool:
        """Grow `seq`'s blocks by one token, preempting newer sequences; False when `seq` itself was preempted."""
        while not self.cache.reserve(seq.slot, seq.num_cached + 1):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.cache.free_slot(seq.slot)
        self.running.remove(seq)
        seq.slot = None
        seq.num_cached = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _admit(self, seq: Sequence) -> bool:
        """Give the head of the waiting queue a slot and its whole pending prompt; False when it must wait."""
        slot = self.cache.allocate_slot()
        if slot is None:
            return False
        if not self.cache.reserve(slot, seq.num_tokens):
            self.cache.free_slot(slot)
            if not self.running:  # nothing will free blocks: it can never fit
                self._fail_unfittable(seq)
            return False
        self.waiting.popleft()
        seq.slot = slot
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return True

    def _fail_unfittable(self, seq: Sequence) -> None:
        self.waiting.popleft()
        need = self.cache.blocks_for(seq.num_tokens)
        error = (
            f"request {seq.request_id}: {seq.num_tokens} tokens need {need} cache blocks, more than the "
            f"{self.cache.num_free_blocks} free in an idle cache (or the per-sequence limit); lower the prompt "
            "length or raise gpu_memory_utilization"
        )
        self._finish(seq, "error", error=error)

    def _chunk(self, seq: Sequence, take: int) -> ScheduledChunk:
        start = seq.num_cached
        samples = take == seq.num_pending
        want = "all" if seq.wants_prompt_logprobs else ("last" if samples else "none")
        chunk = SeqChunk(seq.slot, seq.all_token_ids[start : start + take], start, want)
        return ScheduledChunk(seq, chunk, samples)

    # ---------------------------------------------------------------- results
    def update(self, batch: list[ScheduledChunk], logits: list[torch.Tensor | None]) -> None:
        """Consume one step's logits (fp32 [rows, V] per chunk, as asked by `chunk.want`): sample, stop, free."""
        if len(logits) != len(batch):
            raise ValueError(f"runner returned {len(logits)} logits entries for {len(batch)} chunks")
        rows: list[torch.Tensor] = []
        sampling: list[Sequence] = []
        for item, out in zip(batch, logits):
            item.seq.num_cached += len(item.chunk.token_ids)
            if item.chunk.want == "none":
                continue
            self._check_logits(item.chunk, out)
            if item.chunk.want == "all":
                self._record_prompt_logprobs(item.seq, item.chunk, out)
            if item.samples:
                rows.append(out[-1])
                sampling.append(item.seq)
        if sampling:
            result = sample(
                torch.stack(rows).float(),
                [s.params for s in sampling],
                [s.seed for s in sampling],
                [len(s.output_token_ids) for s in sampling],
            )
            for seq, tok, lp in zip(sampling, result.token_ids, result.logprobs):
                self._append(seq, tok, lp)

    def update_tokens(self, batch: list[ScheduledChunk], tokens: list[int]) -> None:
        """`update` for a step sampled elsewhere (`sample_on_device`): every chunk samples, tokens[i] is chunk i's
        new token, no logprobs. The same bookkeeping, stop rules and frees as `update`, in the same order."""
        if len(tokens) != len(batch) or not all(item.samples and item.chunk.want == "last" for item in batch):
            raise ValueError(f"update_tokens needs one sampling 'last' chunk per token, got {len(batch)} chunks")
        for item in batch:
            item.seq.num_cached += len(item.chunk.token_ids)
        for item, tok in zip(batch, tokens):
            self._append(item.seq, tok, None)

    def plan_ahead(self, batch: list[ScheduledChunk]) -> list[ScheduledChunk] | None:
        """Guess the step after `batch` before its tokens are known, and reserve its cache rows; None if unsure.

        Only for a decode step (every chunk one sampling token, no logprobs) of every running sequence, in
        running order: the next `schedule()` then returns the same sequences one position on unless one stops
        (length stops are known now and leave the guess; EOS / stop strings make it wrong, which the caller sees
        by comparing) or a waiting request is admitted (then no guess). The chunks' token ids are placeholders
        (0): the caller feeds the sampled ids on the device. Reserving early takes no block the next
        `schedule()` would not take (sequences that stop free theirs first), so scheduling is unchanged.
        """
        seqs = [item.seq for item in batch]
        if seqs != self.running or not all(
            item.samples and item.chunk.want == "last" and len(item.chunk.token_ids) == 1 for item in batch
        ):
            return None
        if any(s.params.logprobs is not None or s.wants_prompt_logprobs for s in seqs):
            return None
        going = [s for s in seqs if not self._stops_by_length(s)]
        if not going or len(going) > self.max_num_batched_tokens:
            return None
        if self.waiting and len(going) < self.max_num_seqs:
            return None  # an admission (and a prefill chunk) may join the next step
        for s in going:
            if not self.cache.reserve(s.slot, s.num_cached + 2):
                return None
        return [ScheduledChunk(s, SeqChunk(s.slot, [0], s.num_cached + 1, "last"), True) for s in going]

    def _stops_by_length(self, seq: Sequence) -> bool:
        """True when the token being sampled now is the sequence's last (max_tokens or max_model_len)."""
        cap = seq.params.max_tokens
        return (cap is not None and len(seq.output_token_ids) + 1 >= cap) or seq.num_tokens + 1 >= self.max_model_len

    def _check_logits(self, chunk: SeqChunk, out: torch.Tensor | None) -> None:
        rows = len(chunk.token_ids) if chunk.want == "all" else 1
        if out is None or out.dim() != 2 or out.shape[0] != rows or out.shape[1] != self.vocab_size:
            got = None if out is None else tuple(out.shape)
            raise ValueError(f"runner logits for slot {chunk.slot}: expected [{rows}, {self.vocab_size}], got {got}")

    def _record_prompt_logprobs(self, seq: Sequence, chunk: SeqChunk, out: torch.Tensor) -> None:
        """Row j predicts position start_pos + j + 1; record the prompt positions not yet recorded, in order."""
        assert seq.prompt_logprobs is not None
        num_top = seq.params.prompt_logprobs or 0
        for j in range(out.shape[0]):
            pos = chunk.start_pos + j + 1
            if pos == len(seq.prompt_logprobs) and pos < len(seq.prompt_token_ids):
                lp = token_logprobs(out[j], seq.prompt_token_ids[pos], num_top)
                seq.prompt_logprobs.append(self._position_logprobs(lp))

    def _append(self, seq: Sequence, token: int, lp: TokenLogprobs | None) -> None:
        seq.append_token(token)
        if lp is not None and seq.logprobs is not None:
            seq.logprobs.append(self._position_logprobs(lp))
            seq.cumulative_logprob = (seq.cumulative_logprob or 0.0) + lp.logprob
        params = seq.params
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            # The stop token's own text is dropped unless asked for (as vLLM).
            keep = seq.num_tokens if params.include_stop_str_in_output else seq.num_tokens - 1
            seq.flush_text(self.tokenizer, end=keep)
            self._finish(seq, "stop", stop_reason=token if token in params.stop_token_ids else None)
            return
        delta = seq.detokenize_next(self.tokenizer)
        if delta and params.stop and self._check_stop_strings(seq, len(delta)):
            return
        out_cap = params.max_tokens is not None and len(seq.output_token_ids) >= params.max_tokens
        if out_cap or seq.num_tokens >= self.max_model_len:
            seq.flush_text(self.tokenizer)
            self._finish(seq, "length")

    def _check_stop_strings(self, seq: Sequence, delta_len: int) -> bool:
        """Finish `seq` when a stop string ends inside its newest text, cutting the text; True when it stopped."""
        match = seq.find_stop_string(delta_len)
        if match is None:
            return False
        idx, stop = match
        seq.text = seq.text[: idx + len(stop) if seq.params.include_stop_str_in_output else idx]
        self._finish(seq, "stop", stop_reason=stop)
        return True

    def _position_logprobs(self, lp: TokenLogprobs) -> PositionLogprobs:
        entries: PositionLogprobs = {lp.token_id: Logprob(lp.logprob, lp.rank, self._piece(lp.token_id))}
        for tid, val, rank in lp.top:
            entries.setdefault(tid, Logprob(val, rank, self._piece(tid)))
        return entries

    def _piece(self, token_id: int) -> str:
        piece = self._piece_cache.get(token_id)
        if piece is None:
            piece = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._piece_cache[token_id] = piece
        return piece

    def _finish(
        self, seq: Sequence, reason: str, stop_reason: int | str | None = None, error: str | None = None
    ) -> None:
        if seq.slot is not None:
            self.cache.free_slot(seq.slot)
            seq.slot = None
        if seq in self.running:
            self.running.remove(seq)
        seq.finish(reason, stop_reason=stop_reason, error=error)
        self._finished.append(seq)
