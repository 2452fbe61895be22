"""DeepInfer vs transformers' DeepseekV4ForCausalLM on tiny random checkpoints (fp32, CPU, no simulation).

Each config is saved with `save_pretrained` (transformers names) and converted to DeepSeek's official names;
both load through the same `LLM` API. prompt_logprobs must equal transformers' log-softmax within 1e-4 and
greedy generations must be identical.
"""

from __future__ import annotations

import pytest
import torch
from hf_tiny import (  # noqa: E402
    CONFIGS,
    build_hf_model,
    hf_logits,
    random_prompt,
    save_hf_checkpoint,
    save_official_checkpoint,
)

from deepinfer.engine import LLM, SamplingParams  # noqa: E402

PROMPT_LEN = {"a": 45, "b": 70, "c": 290}  # past the window and several windows of both compress ratios


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request, tmp_path_factory):
    name = request.param
    model = build_hf_model(name, seed=7)
    root = tmp_path_factory.mktemp(f"oracle_{name}")
    return {
        "name": name,
        "model": model,
        "hf_dir": save_hf_checkpoint(model, root / "hf"),
        "official_dir": save_official_checkpoint(model, root / "official"),
    }


@pytest.mark.parametrize("naming", ["hf", "official"])
def test_prompt_logprobs_match_transformers(case, naming):
    model, vocab = case["model"], case["model"].config.vocab_size
    ids = random_prompt(vocab, PROMPT_LEN[case["name"]], seed=11)
    ref = torch.log_softmax(hf_logits(model, ids), dim=-1)
    llm = LLM(model=str(case[f"{naming}_dir"]), dtype="float32", device="cpu", max_model_len=512)
    out = llm.generate(prompt_token_ids=[ids], sampling_params=SamplingParams(max_tokens=1, prompt_logprobs=2,
                                                                               temperature=0.0), use_tqdm=False)[0]
    assert out.prompt_logprobs[0] is None
    worst = 0.0
    for pos in range(1, len(ids)):
        entry = out.prompt_logprobs[pos]
        worst = max(worst, abs(entry[ids[pos]].logprob - ref[pos - 1, ids[pos]].item()))
        top = torch.topk(ref[pos - 1], 2).indices.tolist()
        assert set(top) <= set(entry), f"position {pos}: top-2 {top} missing from {sorted(entry)}"
        for t in top:
            worst = max(worst, abs(entry[t].logprob - ref[pos - 1, t].item()))
    assert worst <= 1e-4


def test_greedy_generation_matches_transformers(case):
    model, vocab = case["model"], case["model"].config.vocab_size
    prompts = [random_prompt(vocab, n, seed=20 + n) for n in (5, PROMPT_LEN[case["name"]] // 2)]
    llm = LLM(model=str(case["official_dir"]), dtype="float32", device="cpu", max_model_len=512)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            # An explicit mask: BOS is id 0, which generate would otherwise take for padding.
            x = torch.tensor([ids])
            hf = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False,
                                min_new_tokens=12, eos_token_id=None, pad_token_id=1)
        assert list(out.token_ids) == hf[0, len(ids):].tolist()
