"""`deepinfer generate` over the fake runner: JSONL round trip, text output, chat, argument errors (exit 2)."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import test_llm_fake as _f  # noqa: E402  (the root conftest puts this folder on sys.path)

from deepinfer.engine import cli
from deepinfer.engine.sampling_params import SamplingParams


@pytest.fixture
def fake_engine(monkeypatch):
    """Make the CLI build an LLM over a fresh fake runner; records the parsed args."""
    seen = {}

    def build(args):
        seen["args"] = args
        runner = _f.FakeRunner(max_model_len=args.max_model_len or 256)
        seen["runner"] = runner
        return _f.make_llm(
            runner,
            _f.FakeTokenizer(eos_token_ids=()),
            seed=args.seed,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
        )

    monkeypatch.setattr(cli, "_make_llm", build)
    return seen


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def test_jsonl_round_trip(tmp_path, fake_engine, capsys):
    rows = [
        {"id": "a", "prompt": "the tea is hot"},
        {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3},
        {"prompt": "so", "temperature": 0.0, "max_tokens": 5, "seed": 9},
        {"prompt": "x" * 40},  # too long for --max-model-len 32: fails alone
    ]
    src, dst = _write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    code = cli.main(
        [
            "generate",
            "--input",
            str(src),
            "--output",
            str(dst),
            "--max-tokens",
            "6",
            "--temperature",
            "0.8",
            "--top-p",
            "0.95",
            "--seed",
            "3",
            "--max-model-len",
            "32",
            "--max-num-batched-tokens",
            "7",
        ]
    )
    assert code == 0
    got = [json.loads(line) for line in dst.read_text(encoding="utf-8").splitlines()]
    assert [g["index"] for g in got] == [0, 1, 2, 3] and got[0]["id"] == "a" and "id" not in got[1]
    # The same requests straight through the API (same engine seed, same order) give the same results.
    llm = _f.make_llm(_f.FakeRunner(max_model_len=32), _f.FakeTokenizer(eos_token_ids=()), seed=3)
    tok = llm.get_tokenizer()
    chat_text = tok.apply_chat_template(rows[1]["messages"])
    params = [
        SamplingParams(max_tokens=6, temperature=0.8, top_p=0.95),
        SamplingParams(max_tokens=3, temperature=0.8, top_p=0.95),
        SamplingParams(max_tokens=5, temperature=0.0, top_p=0.95, seed=9),
        SamplingParams(max_tokens=6, temperature=0.8, top_p=0.95),
    ]
    texts = [rows[0]["prompt"], chat_text, "so", "x" * 40]
    ids = [
        tok.encode(texts[0]),
        tok.encode(chat_text, add_special_tokens=False),
        tok.encode("so"),
        tok.encode(texts[3]),
    ]
    ref = llm.generate(texts, params, prompt_token_ids=ids, use_tqdm=False)
    for g, r in zip(got, ref):
        assert (g["prompt"], g["text"], g["token_ids"], g["finish_reason"]) == (
            r.prompt,
            r.text,
            r.token_ids,
            r.finish_reason,
        )
        assert g["num_prompt_tokens"] == len(r.prompt_token_ids) and g["error"] == r.error
    assert [g["finish_reason"] for g in got] == ["length", "length", "length", "error"]
    assert len(got[1]["token_ids"]) == 3 and "41 tokens" in got[3]["error"]
    out, err = capsys.readouterr()
    assert out == ""
    assert "requests: 4 (1 failed)" in err and "generated tokens: 14" in err and "tok/s" in err


def test_prompts_to_stdout_and_chat(fake_engine, capsys):
    assert cli.main(["generate", "--prompt", "tea", "--prompt", "hot", "--temperature", "0", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert out.count("--- [") == 2 and "requests: 2 (0 failed)" in err
    runner = fake_engine["runner"]
    assert runner.cache.held == {}
    assert cli.main(["generate", "--prompt", "hi", "--chat", "--max-tokens", "4", "--no-progress"]) == 0
    out, _ = capsys.readouterr()
    assert fake_engine["args"].chat and "--- [" not in out and len(out.splitlines()) >= 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate"], "one of the arguments --prompt --input is required"),
        (["generate", "--prompt", "a", "--temperature", "-1"], "temperature must be in"),
        (["generate", "--prompt", "a", "--max-tokens", "0"], "expected an int >= 1, got 0"),
        (["generate", "--prompt", "a", "--top-p", "2"], "top_p must be in"),
        (["generate", "--prompt", "a", "--dtype", "int8"], "invalid choice: 'int8'"),
        (["generate", "--input", "/nonexistent/x.jsonl"], "file not found"),
        (["generate", "--prompt", "a", "--output", "/nonexistent/dir/o.jsonl"], "directory does not exist"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_arguments_exit_2(argv, message, fake_engine, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: invalid JSON"),
        ('{"prompt": "a", "messages": []}', "line 2: expected an object with exactly one of"),
        ('{"prompt": "a", "colour": 1}', "line 2: unknown keys ['colour']"),
        ('{"prompt": "a", "top_k": -5}', "--input line 2: SamplingParams.top_k must be"),
    ],
)
def test_bad_input_lines_exit_2(line, message, tmp_path, fake_engine, capsys):
    src = _write_jsonl(tmp_path / "in.jsonl", [{"prompt": "ok"}, line])
    with pytest.raises(SystemExit) as exc:
        cli.main(["generate", "--input", str(src)])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_module_entry_point_shows_help(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["deepinfer", "generate", "--help"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("deepinfer.engine", run_name="__main__")
    assert exc.value.code == 0 and "--max-tokens" in capsys.readouterr().out
