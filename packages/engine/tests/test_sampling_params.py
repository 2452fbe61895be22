"""SamplingParams: vLLM defaults, normalisation, and errors that name the field, the range and the value."""

from __future__ import annotations

import pytest

from deepinfer.engine.sampling_params import SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens) == (1.0, 1.0, 0, 0.0, 16)
    assert p.seed is None and p.stop == [] and p.stop_token_ids == [] and not p.ignore_eos
    assert p.logprobs is None and p.prompt_logprobs is None and p.skip_special_tokens and not p.greedy


def test_normalisation_and_greedy():
    p = SamplingParams(temperature=0, stop="###", stop_token_ids=(3, 4), top_k=-1, max_tokens=None, seed=-7)
    assert p.greedy and p.stop == ["###"] and p.stop_token_ids == [3, 4] and p.max_tokens is None
    assert SamplingParams(temperature=9e-6).greedy and not SamplingParams(temperature=1e-4).greedy
    assert SamplingParams(stop=["a", "bc"]).stop == ["a", "bc"]


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"temperature": -0.1}, r"temperature must be in \[0.0, inf\], got -0.1"),
        ({"temperature": float("inf")}, r"temperature must be finite"),
        ({"temperature": float("nan")}, r"temperature must be in"),
        ({"top_p": 0.0}, r"top_p must be in \(0.0, 1.0\], got 0.0"),
        ({"top_p": 1.5}, r"top_p must be in \(0.0, 1.0\], got 1.5"),
        ({"min_p": -0.2}, r"min_p must be in \[0.0, 1.0\], got -0.2"),
        ({"top_k": -3}, r"top_k must be -1, 0 \(off\) or >= 1, got -3"),
        ({"max_tokens": 0}, r"max_tokens must be None or an int >= 1, got 0"),
        ({"logprobs": -1}, r"logprobs must be None or an int >= 0, got -1"),
        ({"prompt_logprobs": -2}, r"prompt_logprobs must be None or an int >= 0, got -2"),
        ({"stop": ["ok", ""]}, r"stop must not contain empty strings"),
        ({"stop_token_ids": [1, -4]}, r"stop_token_ids must be >= 0"),
    ],
)
def test_out_of_range_values_raise_value_error(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"temperature": "hot"}, r"temperature must be a number, got str"),
        ({"top_p": True}, r"top_p must be a number, got bool"),
        ({"top_k": 2.5}, r"top_k must be an int, got float"),
        ({"max_tokens": 3.0}, r"max_tokens must be None or an int, got float"),
        ({"seed": "1"}, r"seed must be None or an int, got str"),
        ({"stop": 5}, r"stop must be None, a str or a list of str"),
        ({"stop_token_ids": ["2"]}, r"stop_token_ids must be None or a list of int"),
        ({"ignore_eos": 1}, r"ignore_eos must be a bool, got int"),
    ],
)
def test_wrong_types_raise_type_error(kwargs, pattern):
    with pytest.raises(TypeError, match=pattern):
        SamplingParams(**kwargs)
