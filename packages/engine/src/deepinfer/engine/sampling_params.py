"""Per-request sampling settings, named and defaulted as in vLLM's `SamplingParams`.

Choices where vLLM offers more or is ambiguous:
- `temperature < GREEDY_TEMPERATURE` (1e-5, vLLM's epsilon) means greedy: argmax, ties to the lowest token id.
  Dividing logits by a smaller temperature would overflow fp32.
- `top_k` of 0 or -1 disables top-k; `max_tokens=None` means "until max_model_len".
- `logprobs` / `prompt_logprobs` are a top-n count >= 0 (0: only the chosen / actual token). vLLM's -1 (whole
  vocabulary) is not offered: it would build a vocabulary-sized dict per token.
- `stop` is normalised to a list of non-empty strings, `stop_token_ids` to a list of ints.
- `n > 1`, penalties, `min_tokens`, `logit_bias` and structured output are not supported yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GREEDY_TEMPERATURE = 1e-5


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require_number(name: str, value: object, low: float, high: float, low_open: bool = False) -> None:
    """Raise unless `value` is a real number in [low, high] (or (low, high] when `low_open`)."""
    if not _is_number(value):
        raise TypeError(f"SamplingParams.{name} must be a number, got {type(value).__name__} {value!r}")
    ok = (value > low if low_open else value >= low) and value <= high and not math.isnan(value)
    if not ok:
        bracket = "(" if low_open else "["
        raise ValueError(f"SamplingParams.{name} must be in {bracket}{low}, {high}], got {value!r}")


def _require_optional_int(name: str, value: object, minimum: int) -> None:
    """Raise unless `value` is None or an int >= minimum."""
    if value is None:
        return
    if not _is_int(value):
        raise TypeError(f"SamplingParams.{name} must be None or an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"SamplingParams.{name} must be None or an int >= {minimum}, got {value!r}")


def _require_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"SamplingParams.{name} must be a bool, got {type(value).__name__} {value!r}")


@dataclass
class SamplingParams:
    """How to sample one request's completion.

    Args:
        temperature: >= 0; logits are divided by it; < 1e-5 means greedy.
        top_p: in (0, 1]; keep the smallest set of most likely tokens whose probability reaches top_p.
        top_k: 0 or -1 (off) or >= 1; keep the k most likely tokens (all tokens tied with the k-th are kept).
        min_p: in [0, 1]; drop tokens whose probability is below min_p times the most likely one's.
        max_tokens: None or >= 1; most tokens to generate (finish_reason "length").
        seed: None or any int; the request's own random stream. None: one is drawn from the LLM's seed.
        stop: a string or list of non-empty strings that end generation when they appear in the output text.
        stop_token_ids: token ids that end generation (finish_reason "stop", stop_reason = the id).
        ignore_eos: keep generating past the tokenizer's EOS tokens.
        logprobs: None or n >= 0; return the chosen token's logprob plus the top-n per generated token.
        prompt_logprobs: None or n >= 0; return each prompt token's logprob plus the top-n.
        include_stop_str_in_output: keep the matched stop string (or stop token's text) in the output text.
        skip_special_tokens: drop special tokens when detokenizing the output.

    Sampling order: temperature, top-k, top-p, min-p (min-p is relative to the most likely token, so its place
    only matters relative to top-p's renormalisation). Reported logprobs are of the raw model distribution.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int | None = 16
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        _require_number("temperature", self.temperature, 0.0, math.inf)
        if math.isinf(self.temperature):
            raise ValueError(f"SamplingParams.temperature must be finite, got {self.temperature!r}")
        _require_number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _require_number("min_p", self.min_p, 0.0, 1.0)
        if not _is_int(self.top_k):
            raise TypeError(f"SamplingParams.top_k must be an int, got {type(self.top_k).__name__} {self.top_k!r}")
        if self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1, 0 (off) or >= 1, got {self.top_k!r}")
        _require_optional_int("max_tokens", self.max_tokens, 1)
        if self.seed is not None and not _is_int(self.seed):
            raise TypeError(f"SamplingParams.seed must be None or an int, got {type(self.seed).__name__}")
        _require_optional_int("logprobs", self.logprobs, 0)
        _require_optional_int("prompt_logprobs", self.prompt_logprobs, 0)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            _require_bool(name, getattr(self, name))
        self.stop = self._normalise_stop(self.stop)
        self.stop_token_ids = self._normalise_stop_token_ids(self.stop_token_ids)

    @staticmethod
    def _normalise_stop(stop: object) -> list[str]:
        items = [stop] if isinstance(stop, str) else ([] if stop is None else stop)
        if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
            raise TypeError(f"SamplingParams.stop must be None, a str or a list of str, got {stop!r}")
        if any(s == "" for s in items):
            raise ValueError(f"SamplingParams.stop must not contain empty strings, got {stop!r}")
        return list(items)

    @staticmethod
    def _normalise_stop_token_ids(ids: object) -> list[int]:
        items = [] if ids is None else ids
        if not isinstance(items, (list, tuple)) or not all(_is_int(i) for i in items):
            raise TypeError(f"SamplingParams.stop_token_ids must be None or a list of int, got {ids!r}")
        if any(i < 0 for i in items):
            raise ValueError(f"SamplingParams.stop_token_ids must be >= 0, got {ids!r}")
        return list(items)

    @property
    def greedy(self) -> bool:
        """True when this request takes the argmax token (temperature below 1e-5)."""
        return self.temperature < GREEDY_TEMPERATURE
