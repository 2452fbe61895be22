"""`deepinfer generate`: offline generation from the command line.

    deepinfer generate --prompt "Hello" --max-tokens 32
    deepinfer generate --input prompts.jsonl --output out.jsonl --temperature 0.7

--input holds one JSON object per line with "prompt" (text) or "messages" (a chat conversation), optional "id"
(copied to the output) and optional SamplingParams fields ("max_tokens", "temperature", "stop", "seed", ...), which
override the command-line sampling flags for that line. --seed seeds the engine's stream of per-request seeds
(as vLLM's --seed); a line's own "seed" pins that request. Results go to stdout as text, or with --output as one
JSON object per request in input order; a progress bar and a throughput summary go to stderr. Requests that
fail on their own (too long, empty) are reported with finish_reason "error" and do not change the exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from .sampling_params import SamplingParams

_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))
_FLAG_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The `deepinfer` argument parser (subcommand `generate`)."""
    return _build_parsers()[0]


def _build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """(the `deepinfer` parser, its `generate` subparser, which reports errors about generate's arguments)."""
    parser = argparse.ArgumentParser(prog="deepinfer", description="DeepInfer: offline DeepSeek-V4 inference")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser(
        "generate", help="complete prompts", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    gen.add_argument("--model", default=None, help="checkpoint dir or hub id (default: the embedded tiny model)")
    gen.add_argument("--tokenizer", default=None, help="tokenizer dir (default: the model's)")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    source.add_argument("--input", type=Path, help="JSONL file of requests")
    gen.add_argument("--output", type=Path, help="write results as JSONL here instead of text to stdout")
    gen.add_argument("--chat", action="store_true", help="wrap text prompts as user messages (chat template)")
    gen.add_argument("--max-tokens", type=_positive_int, default=None, help="tokens to generate (default 16)")
    gen.add_argument("--temperature", type=float, default=None, help="0 = greedy (default 1.0)")
    gen.add_argument("--top-p", type=float, default=None, help="nucleus mass in (0, 1] (default 1.0)")
    gen.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens; 0 or -1 = off")
    gen.add_argument("--min-p", type=float, default=None, help="drop tokens below min_p * max prob (default 0)")
    gen.add_argument("--seed", type=int, default=0, help="engine seed for requests without their own (default 0)")
    gen.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    gen.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    gen.add_argument("--max-model-len", type=_positive_int, default=None, help="most tokens per sequence")
    gen.add_argument("--max-num-seqs", type=_positive_int, default=256, help="most sequences running at once")
    gen.add_argument("--max-num-batched-tokens", type=_positive_int, default=2048, help="most tokens per step")
    gen.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser, gen


def _flag_sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in _FLAG_FIELDS if getattr(args, name) is not None}


def _read_requests(path: Path, parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    """Parse --input: a list of request dicts, each with exactly one of "prompt" / "messages"."""
    if not path.is_file():
        parser.error(f"--input: file not found: {path}")
    requests = []
    for num, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            parser.error(f"--input {path} line {num}: invalid JSON ({exc.msg})")
        if not isinstance(obj, dict) or ("prompt" in obj) == ("messages" in obj):
            parser.error(f"--input {path} line {num}: expected an object with exactly one of 'prompt' or 'messages'")
        unknown = set(obj) - _SAMPLING_FIELDS - {"prompt", "messages", "id"}
        if unknown:
            parser.error(
                f"--input {path} line {num}: unknown keys {sorted(unknown)}; allowed: prompt, messages, "
                f"id and SamplingParams fields"
            )
        obj["_line"] = num
        requests.append(obj)
    if not requests:
        parser.error(f"--input {path}: no requests in the file")
    return requests


def _sampling_params(
    base: dict[str, Any], req: dict[str, Any], where: str, parser: argparse.ArgumentParser
) -> SamplingParams:
    fields = {**base, **{k: v for k, v in req.items() if k in _SAMPLING_FIELDS}}
    try:
        return SamplingParams(**fields)
    except (TypeError, ValueError) as exc:
        parser.error(f"{where}: {exc}")


def _encode(llm: Any, req: dict[str, Any], chat: bool) -> tuple[str, list[int]]:
    """(prompt text, token ids): chat requests go through the chat template and are encoded without specials."""
    tok = llm.get_tokenizer()
    messages = req.get("messages")
    if messages is None and chat:
        messages = [{"role": "user", "content": req["prompt"]}]
    if messages is None:
        return req["prompt"], list(tok.encode(req["prompt"], add_special_tokens=True))
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    return text, list(tok.encode(text, add_special_tokens=False))


def _make_llm(args: argparse.Namespace) -> Any:
    """Build the engine (tests replace this to inject a fake runner)."""
    from .llm import LLM

    model = args.model
    if model is None:
        from .tiny import default_model_path

        model = str(default_model_path())
    return LLM(
        model,
        tokenizer=args.tokenizer,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        seed=args.seed,
        show_progress=not args.no_progress,
    )


def _record(req: dict[str, Any], out: Any, index: int) -> dict[str, Any]:
    record: dict[str, Any] = {"index": index}
    if "id" in req:
        record["id"] = req["id"]
    record.update(
        prompt=out.prompt,
        text=out.text,
        token_ids=out.token_ids,
        finish_reason=out.finish_reason,
        stop_reason=out.outputs[0].stop_reason,
        num_prompt_tokens=len(out.prompt_token_ids),
        error=out.error,
    )
    return record


def _write_results(requests: list[dict[str, Any]], outputs: list[Any], path: Path | None) -> None:
    if path is not None:
        with path.open("w", encoding="utf-8") as fh:
            for i, (req, out) in enumerate(zip(requests, outputs)):
                fh.write(json.dumps(_record(req, out, i), ensure_ascii=False) + "\n")
        return
    for i, out in enumerate(outputs):
        if len(outputs) > 1:
            print(f"--- [{i}] finish_reason={out.finish_reason}")
        print(out.error if out.error else out.text)


def _summary(outputs: list[Any], seconds: float) -> str:
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    gen_tokens = sum(len(o.token_ids) for o in outputs)
    errors = sum(o.finish_reason == "error" for o in outputs)
    secs = max(seconds, 1e-9)
    return (
        f"requests: {len(outputs)} ({errors} failed), prompt tokens: {prompt_tokens} "
        f"({prompt_tokens / secs:.1f} tok/s), generated tokens: {gen_tokens} ({gen_tokens / secs:.1f} tok/s), "
        f"time: {seconds:.2f} s"
    )


def main(argv: list[str] | None = None) -> int:
    """Run `deepinfer ...`; returns the exit code (argument errors exit with 2 through argparse)."""
    parser, gen_parser = _build_parsers()
    args = parser.parse_args(argv)
    if args.output is not None and not args.output.parent.is_dir():
        gen_parser.error(f"--output: directory does not exist: {args.output.parent}")
    base = _flag_sampling(args)
    _sampling_params(base, {}, "sampling flags", gen_parser)
    requests = _read_requests(args.input, gen_parser) if args.input else [{"prompt": p} for p in args.prompt]
    params = [_sampling_params(base, r, f"--input line {r.get('_line')}", gen_parser) for r in requests]
    try:
        llm = _make_llm(args)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:  # RuntimeError: hub download failed / offline
        gen_parser.error(str(exc))
    encoded = [_encode(llm, r, args.chat) for r in requests]
    outputs = llm.generate(
        [t for t, _ in encoded], params, prompt_token_ids=[i for _, i in encoded], use_tqdm=not args.no_progress
    )
    for i, out in enumerate(outputs):
        if out.error:
            print(f"request {i}: error: {out.error}", file=sys.stderr)
    _write_results(requests, outputs, args.output)
    print(_summary(outputs, llm.last_run_seconds), file=sys.stderr)
    return 0
