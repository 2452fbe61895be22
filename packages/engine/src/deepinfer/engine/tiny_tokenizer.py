"""Tokenizer of the embedded default checkpoint: a byte-level BPE trained on `tiny_corpus.CORPUS`.

BOS id 0, EOS id 1, plus DeepSeek's user / assistant markers, and a DeepSeek-style chat template.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from deepinfer.engine.tiny_corpus import CORPUS

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
TOKENIZER_VOCAB = 1000

# System messages first, then user / assistant turns; an assistant turn ends with EOS (as DeepSeek's).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for m in messages if m['role'] == 'system' -%}{{ m['content'] }}{{ '\\n\\n' if not loop.last }}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}{{ '" + USER + "' + m['content'] }}"
    "{%- elif m['role'] == 'assistant' -%}{{ '" + ASSISTANT + "' + m['content'] + eos_token }}"
    "{%- elif m['role'] != 'system' -%}{{ raise_exception('Unknown role: ' + m['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '" + ASSISTANT + "' }}{%- endif -%}"
)


def train_tokenizer() -> Tokenizer:
    """Byte-level BPE (vocab `TOKENIZER_VOCAB`) trained on the embedded corpus; BOS id 0, EOS id 1.

    Encoding with special tokens prepends BOS; decoding reverses encoding byte for byte.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=[BOS, EOS, USER, ASSISTANT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, 0)]
    )
    if tok.token_to_id(BOS) != 0 or tok.token_to_id(EOS) != 1:
        raise RuntimeError("train_tokenizer: BOS/EOS did not get ids 0/1")
    return tok


def _tokenizer_config() -> dict[str, Any]:
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
