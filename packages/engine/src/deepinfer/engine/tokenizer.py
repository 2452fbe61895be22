"""Tokenizer and chat template of a checkpoint, without transformers at run time.

Reads `tokenizer.json` with the `tokenizers` library, special tokens and `add_bos_token` from
`tokenizer_config.json`, extra EOS ids from `generation_config.json`, and the chat template from
`chat_template.jinja` or `tokenizer_config.json["chat_template"]` (rendered with a sandboxed jinja2).

Checkpoints without a template (DeepSeek-V4 ships a Python prompt encoder instead of one) get
`BUILTIN_CHAT_TEMPLATE`, a DeepSeek-style layout:
``{bos}{system}<｜User｜>{user}<｜Assistant｜></think>{answer}{eos}<｜User｜>...<｜Assistant｜></think>``
where the assistant header is followed by ``<think>`` instead when the template variable `thinking` is true;
tool results go into a user turn as ``<tool_result>...</tool_result>``. It approximates DeepSeek's encoder for
plain chat; it does not render tool calls or reasoning-effort prefixes.

A rendered template already starts with the BOS token: encode it with `add_special_tokens=False`.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer

BUILTIN_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for m in messages if m['role'] == 'system' %}{{ m['content'] }}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{%- elif m['role'] == 'tool' %}<｜User｜><tool_result>{{ m['content'] }}</tool_result>"
    "{%- elif m['role'] == 'assistant' %}<｜Assistant｜></think>{{ m['content'] }}{{ eos_token }}"
    "{%- elif m['role'] != 'system' %}{{ raise_exception('unknown role: ' ~ m['role']) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<｜Assistant｜>{{ '<think>' if thinking else '</think>' }}{%- endif %}"
)


class Tokenizer:
    """A checkpoint's tokenizer: `encode`, `decode`, special ids and `apply_chat_template`."""

    def __init__(
        self,
        backend: _HFTokenizer,
        bos_token: str | None,
        eos_tokens: list[str],
        extra_eos_ids: list[int],
        add_bos_token: bool | None,
        chat_template: str | None,
    ) -> None:
        self._tok = backend
        # Mark bos/eos special (as transformers does) so decode(skip_special_tokens=True) drops them.
        backend.add_special_tokens([t for t in [bos_token, *eos_tokens] if t is not None])
        self.bos_token, self.eos_token = bos_token, (eos_tokens[0] if eos_tokens else None)
        self.bos_token_id: int | None = None if bos_token is None else backend.token_to_id(bos_token)
        ids = [backend.token_to_id(t) for t in eos_tokens] + extra_eos_ids
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in ids if i is not None))
        self.add_bos_token = add_bos_token
        self.chat_template = chat_template or BUILTIN_CHAT_TEMPLATE
        self.has_own_chat_template = chat_template is not None
        self._env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
        self._env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (str). With add_special_tokens, BOS is prepended when `add_bos_token` is true in
        tokenizer_config.json; when the config does not say, tokenizer.json's own post-processor decides."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        if self.add_bos_token is None:
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids `ids` (ints in [0, vocab_size)); special tokens dropped when skip_special_tokens."""
        ids = list(ids)
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids: expected ints in [0, {self.vocab_size}), got {bad[:5]}")
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render `messages` ([{"role": str, "content": str}, ...]) with the chat template to a prompt string.

        Extra keyword arguments become template variables (e.g. `thinking=True` for the built-in template).
        """
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError(f"messages: expected a list of dicts with a 'role' key, got {messages!r:.200}")
        try:
            template = self._env.from_string(self.chat_template)
            return template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **kwargs,
            )
        except TemplateError as e:
            raise ValueError(f"chat template failed to render: {e}") from e


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    """Load the tokenizer of the checkpoint in `model_dir` (needs tokenizer.json; the other files are optional)."""
    root = Path(model_dir)
    path = root / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"model_dir: expected {path} (a `tokenizers` tokenizer.json), not found")
    try:
        backend = _HFTokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on parse errors
        raise ValueError(f"{path}: not a valid tokenizer.json ({e})") from e
    cfg = _read_json(root / "tokenizer_config.json")
    gen = _read_json(root / "generation_config.json")
    eos = gen.get("eos_token_id")
    extra_eos = [eos] if isinstance(eos, int) else [i for i in (eos or []) if isinstance(i, int)]
    eos_token = _token_text(cfg.get("eos_token"))
    add_bos = cfg.get("add_bos_token")
    return Tokenizer(
        backend,
        bos_token=_token_text(cfg.get("bos_token")),
        eos_tokens=[eos_token] if eos_token is not None else [],
        extra_eos_ids=extra_eos,
        add_bos_token=add_bos if isinstance(add_bos, bool) else None,
        chat_template=_find_template(root, cfg),
    )


def _find_template(root: Path, cfg: dict[str, Any]) -> str | None:
    """chat_template.jinja first (the newer location), then tokenizer_config's string or named-list form."""
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
    return tpl if isinstance(tpl, str) else None


def _token_text(tok: Any) -> str | None:
    """A special token from tokenizer_config: a string or an AddedToken dict {"content": ...}."""
    if isinstance(tok, dict):
        tok = tok.get("content")
    return tok if isinstance(tok, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(d).__name__}")
    return d


def _raise(message: str) -> None:
    raise TemplateError(message)
