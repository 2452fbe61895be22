"""tokenizer: the fixture's tokenizer files, BOS rules, EOS ids and chat templates."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from deepinfer.engine.tokenizer import BUILTIN_CHAT_TEMPLATE, load_tokenizer

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "data" / "v4-tiny-official"
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "<t5> <t9>"},
    {"role": "assistant", "content": "<t7>"},
    {"role": "user", "content": "<t11>"},
]


def _tok_dir(tmp_path: Path, config_edit: dict | None = None, extra: dict[str, str] | None = None) -> Path:
    """The fixture's tokenizer files in a temp dir, with tokenizer_config.json edited and extra files added."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "tokenizer.json").symlink_to(FIXTURE / "tokenizer.json")
    cfg = json.loads((FIXTURE / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**cfg, **(config_edit or {})}))
    for name, text in (extra or {}).items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_fixture_tokenizer_roundtrip() -> None:
    tok = load_tokenizer(FIXTURE)
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_ids) == (512, 0, (1,))
    rng = random.Random()  # fresh ids every run
    ids = [rng.randrange(2, 512) for _ in range(50)]
    text = tok.decode(ids)
    assert text == " ".join(f"<t{i}>" for i in ids)
    # The fixture's config does not set add_bos_token and tokenizer.json has no post-processor: no BOS.
    assert tok.encode(text) == ids
    assert tok.decode([0, *ids, 1]) == text  # BOS / EOS are special and skipped
    assert tok.decode([0, *ids, 1], skip_special_tokens=False) == f"<t0> {text} <t1>"


def test_add_bos_token(tmp_path: Path) -> None:
    tok = load_tokenizer(_tok_dir(tmp_path, {"add_bos_token": True}))
    ids = [random.randrange(2, 512) for _ in range(8)]
    text = tok.decode(ids)
    assert tok.encode(text) == [0, *ids]
    assert tok.encode(text, add_special_tokens=False) == ids


def test_eos_from_generation_config_and_added_token_dict(tmp_path: Path) -> None:
    gen = json.dumps({"eos_token_id": [1, 42]})
    cfg = {"eos_token": {"__type": "AddedToken", "content": "<t3>"}}
    tok = load_tokenizer(_tok_dir(tmp_path, cfg, {"generation_config.json": gen}))
    assert tok.eos_token_ids == (3, 1, 42)


def test_builtin_template() -> None:
    tok = load_tokenizer(FIXTURE)
    assert not tok.has_own_chat_template and tok.chat_template == BUILTIN_CHAT_TEMPLATE
    want = "<t0>Be brief.<｜User｜><t5> <t9><｜Assistant｜></think><t7><t1><｜User｜><t11><｜Assistant｜></think>"
    assert tok.apply_chat_template(CHAT) == want
    assert tok.apply_chat_template(CHAT, add_generation_prompt=False) == want.removesuffix("<｜Assistant｜></think>")
    assert tok.apply_chat_template(CHAT, thinking=True).endswith("<｜Assistant｜><think>")
    tool = tok.apply_chat_template([{"role": "tool", "content": "42"}], add_generation_prompt=False)
    assert tool == "<t0><｜User｜><tool_result>42</tool_result>"
    with pytest.raises(ValueError, match="unknown role: robot"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="messages"):
        tok.apply_chat_template([{"content": "no role"}])


def test_template_sources(tmp_path: Path) -> None:
    in_config = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    tok = load_tokenizer(_tok_dir(tmp_path / "a", {"chat_template": in_config}))
    assert tok.has_own_chat_template
    assert tok.apply_chat_template(CHAT[1:3]) == "[user]<t5> <t9>[assistant]<t7>"
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}D"}]
    assert load_tokenizer(_tok_dir(tmp_path / "b", {"chat_template": named})).apply_chat_template(CHAT) == "<t0>D"
    # chat_template.jinja is the newer location and wins over the config's string.
    jinja = "{{ messages | length }}{{ eos_token }}{{ messages[0] | tojson }}"
    tok = load_tokenizer(_tok_dir(tmp_path / "c", {"chat_template": in_config}, {"chat_template.jinja": jinja}))
    assert tok.apply_chat_template(CHAT[:1]) == '1<t1>{"role": "system", "content": "Be brief."}'


def test_matches_transformers(tmp_path: Path) -> None:
    """The oracle: transformers' fast tokenizer on the same files gives the same ids, text and prompt."""
    import transformers  # a test dependency (DESIGN.md); a missing one must fail, not skip

    template = "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    d = _tok_dir(tmp_path, {"add_bos_token": True, "chat_template": template})
    ours, theirs = load_tokenizer(d), transformers.PreTrainedTokenizerFast.from_pretrained(str(d))
    text = " ".join(f"<t{random.randrange(0, 512)}>" for _ in range(30))
    assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
    ids = ours.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.apply_chat_template(CHAT) == theirs.apply_chat_template(CHAT, tokenize=False)


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    tok = load_tokenizer(FIXTURE)
    with pytest.raises(ValueError, match="ids"):
        tok.decode([5, 512])
    with pytest.raises(TypeError, match="text"):
        tok.encode([5])  # type: ignore[arg-type]
