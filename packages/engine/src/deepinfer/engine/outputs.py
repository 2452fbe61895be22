"""Results of `LLM.generate`, shaped like vLLM's `RequestOutput` / `CompletionOutput`.

finish_reason is "stop" (EOS, a stop token id or a stop string), "length" (max_tokens or max_model_len) or
"error" (the request could not run; `RequestOutput.error` says why). stop_reason is the matched stop string or
stop token id, None otherwise (EOS included, as in vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    """One token's log-probability under the raw model distribution.

    rank is 1 + the number of vocabulary tokens with a strictly larger logprob (1 = most likely; tied tokens
    share a rank). decoded_token is the token's own text, special tokens included.
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One position's logprobs: token id -> Logprob, holding the chosen (or actual prompt) token plus the top-n.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One generated completion.

    token_ids holds every generated token, the EOS / stop token included; text is their detokenization, cut
    before a matched stop string (and without a stop token's text) unless include_stop_str_in_output.
    logprobs is None unless requested, else one dict per generated token.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None


@dataclass
class RequestOutput:
    """One request's result.

    prompt_logprobs is None unless requested, else a list as long as the prompt: None for position 0 (nothing
    predicts it), then per position the actual prompt token's logprob plus the top-n.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    error: str | None = None

    @property
    def text(self) -> str:
        """outputs[0].text."""
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        """outputs[0].token_ids."""
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        """outputs[0].finish_reason."""
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[PositionLogprobs] | None:
        """outputs[0].logprobs."""
        return self.outputs[0].logprobs
