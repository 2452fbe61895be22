"""Per-request state the scheduler moves between waiting, running and finished, and the runner's chunk type."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .outputs import CompletionOutput, PositionLogprobs, RequestOutput
from .sampling_params import SamplingParams

# Prompt tokens decoded together with the first output tokens so that tokenizers which treat a sequence's first
# token specially (leading-space handling) detokenize the output as it reads after the prompt.
_DETOK_CONTEXT = 5

WANTS = ("last", "all", "none")


@dataclass
class SeqChunk:
    """A run of new tokens of one sequence for one `ModelRunner.forward` call.

    slot: the sequence's state slot from `runner.cache.allocate_slot()`.
    token_ids: the new tokens (a prompt chunk or one decode token).
    start_pos: tokens of this sequence already in the cache (the first new token's position).
    want: logits rows to return: "last" (1 row), "all" (len(token_ids) rows) or "none" (no logits).
    """

    slot: int
    token_ids: list[int]
    start_pos: int
    want: str = "last"


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request's tokens, progress and output.

    all_token_ids = prompt_token_ids + output_token_ids. num_cached counts the leading tokens whose state is in the
    runner's cache; the tokens still to feed are all_token_ids[num_cached:]. Preemption frees the slot and resets
    num_cached to 0, so the prompt plus generated tokens are prefilled again; sampling continues identically
    because the sampler's step is len(output_token_ids).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    slot: int | None = None
    num_cached: int = 0
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    prefix_offset: int = 0
    read_offset: int = 0

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)
        if self.params.logprobs is not None:
            self.logprobs = []
            self.cumulative_logprob = 0.0
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]
        self.read_offset = len(self.prompt_token_ids)
        self.prefix_offset = max(0, self.read_offset - _DETOK_CONTEXT)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.all_token_ids)

    @property
    def num_pending(self) -> int:
        """Tokens not yet fed to the model (1 for a sequence in decode)."""
        return len(self.all_token_ids) - self.num_cached

    @property
    def wants_prompt_logprobs(self) -> bool:
        """True while some prompt position still lacks its logprobs."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        """Record a generated token (its text is added separately by `detokenize_next`)."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def detokenize_next(self, tokenizer: Any) -> str:
        """Append the text the newest token completes to `self.text` and return it ("" while incomplete).

        Incremental: decodes only the window from `prefix_offset`, and emits the difference to the previous
        window's text once it no longer ends in an incomplete UTF-8 character (U+FFFD), so multi-token characters
        come out whole. The cost per token is independent of the output length.
        """
        skip = self.params.skip_special_tokens
        ids = self.all_token_ids
        prefix_text = tokenizer.decode(ids[self.prefix_offset : self.read_offset], skip_special_tokens=skip)
        full_text = tokenizer.decode(ids[self.prefix_offset :], skip_special_tokens=skip)
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        delta = full_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(ids)
        self.text += delta
        return delta

    def flush_text(self, tokenizer: Any, end: int | None = None) -> None:
        """At finish: append the text of tokens up to `end` (default: all) still held back by `detokenize_next`.

        A character left incomplete by the last tokens shows as U+FFFD, as in `tokenizer.decode` of the output.
        """
        end = len(self.all_token_ids) if end is None else end
        if end <= self.read_offset:
            return
        skip = self.params.skip_special_tokens
        ids = self.all_token_ids
        prefix_text = tokenizer.decode(ids[self.prefix_offset : self.read_offset], skip_special_tokens=skip)
        full_text = tokenizer.decode(ids[self.prefix_offset : end], skip_special_tokens=skip)
        self.text += full_text[len(prefix_text) :]
        self.read_offset = end

    def find_stop_string(self, delta_len: int) -> tuple[int, str] | None:
        """(start index in self.text, stop string) of a stop string ending in the last `delta_len` characters.

        Earlier text was searched when it was new, so only matches overlapping the new text count. Of several
        matches the one starting first wins (then the one listed first in params.stop).
        """
        best: tuple[int, str] | None = None
        for stop in self.params.stop:
            start = max(0, len(self.text) - delta_len - len(stop) + 1)
            idx = self.text.find(stop, start)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, stop)
        return best

    def finish(self, reason: str, stop_reason: int | str | None = None, error: str | None = None) -> None:
        """Mark finished; the scheduler frees the slot."""
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.error = error

    def to_output(self) -> RequestOutput:
        """The request's result (one completion, index 0)."""
        completion = CompletionOutput(
            index=0,
            text=self.text,
            token_ids=list(self.output_token_ids),
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            logprobs=self.logprobs,
            cumulative_logprob=self.cumulative_logprob,
        )
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=list(self.prompt_token_ids),
            prompt_logprobs=self.prompt_logprobs,
            outputs=[completion],
            finished=self.is_finished,
            error=self.error,
        )
