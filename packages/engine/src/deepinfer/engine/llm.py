"""The offline API: `LLM(model=...).generate(prompts, SamplingParams(...))` and `LLM.chat(...)`, as in vLLM.

Choices (vLLM's where it has one):
- Text prompts are encoded with the tokenizer's special tokens (BOS); chat prompts are rendered by the chat
  template, which already holds them, so they are encoded without adding more.
- A request without `SamplingParams.seed` gets one drawn from the LLM's own random stream (seeded by `seed`) when
  it is queued, in input order. A fresh LLM with the same seed therefore repeats its results exactly, and a
  request's tokens never depend on the other requests of the call.
- Requests whose prompt cannot run (empty, longer than max_model_len, ids outside the vocabulary) come back with
  finish_reason "error" and `error` set; the rest of the call still runs.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from collections.abc import Sequence as SequenceABC
from typing import Any

import torch

from .async_sampling import TokenReadback, async_sampling_enabled, device_sampling_ok, sample_on_device
from .outputs import RequestOutput
from .sampling_params import SamplingParams
from .scheduler import ScheduledChunk, Scheduler
from .sequence import Sequence

_DTYPES = dict.fromkeys(("float32", "fp32", "float"), torch.float32)
_DTYPES.update(dict.fromkeys(("bfloat16", "bf16"), torch.bfloat16))
_DTYPES.update(dict.fromkeys(("float16", "fp16", "half"), torch.float16))

Conversation = list[dict[str, Any]]


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when available else 'cpu'; other names must parse as a torch device."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a str such as 'auto', 'cpu' or 'cuda:0', got {type(device).__name__}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from exc
    return device


def resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    """'auto' -> float32 on CPU, bfloat16 elsewhere; else one of float32/bfloat16/float16 (or aliases)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


class LLM:
    """An offline generator over one DeepSeek-V4 checkpoint.

    Args:
        model: local checkpoint directory or hub id.
        tokenizer: tokenizer directory (default: the model's).
        dtype: "auto" (float32 on CPU, bfloat16 on CUDA), "float32", "bfloat16" or "float16".
        device: "auto" (CUDA when available), "cpu", "cuda" or "cuda:N".
        max_model_len: most tokens (prompt + output) per sequence; None: min(max_position_embeddings, 4096).
        gpu_memory_utilization: share of the GPU the runner may fill, weights and cache included.
        max_num_seqs: most sequences running at once.
        max_num_batched_tokens: most tokens fed to the model per step (chunked prefill splits longer prompts).
        qat: simulate DeepSeek's FP8 (KV) / FP4 (indexer) quantisation in the forward; None: on for quantised
            (official-format) checkpoints, off for unquantised ones (what transformers computes).
        seed: seed of the stream that gives seedless requests their seeds.
        revision: hub branch, tag or commit.
        show_progress: show the weight-loading progress bar.
    """

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        dtype: str = "auto",
        device: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        qat: bool | None = None,
        seed: int = 0,
        revision: str | None = None,
        show_progress: bool = True,
    ) -> None:
        from .config_parse import load_config
        from .loader import load_weights, resolve_model_path
        from .runner import ModelRunner
        from .tokenizer import load_tokenizer

        device = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, device)
        model_dir = resolve_model_path(model, revision=revision)
        tok_dir = model_dir if tokenizer is None else resolve_model_path(tokenizer)
        cfg = load_config(model_dir)
        weights = load_weights(model_dir, cfg, device=device, progress=show_progress)
        runner = ModelRunner(
            cfg,
            weights,
            dtype=torch_dtype,
            device=device,
            max_num_seqs=max_num_seqs,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len or min(cfg.max_position_embeddings, 4096),
            # DeepSeek's reference simulates FP8/FP4 on the KV path of its quantised (official) checkpoints.
            qat=(cfg.quant.fmt is not None) if qat is None else qat,
        )
        self._setup(runner, load_tokenizer(tok_dir), max_num_seqs, max_num_batched_tokens, seed)

    @classmethod
    def from_components(
        cls,
        runner: Any,
        tokenizer: Any,
        *,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        seed: int = 0,
    ) -> LLM:
        """An LLM over an existing runner (`forward`, `cache`, `vocab_size`, `max_model_len`) and tokenizer."""
        llm = cls.__new__(cls)
        llm._setup(runner, tokenizer, max_num_seqs, max_num_batched_tokens, seed)
        return llm

    def _setup(self, runner: Any, tokenizer: Any, max_num_seqs: int, max_num_batched_tokens: int, seed: int) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.runner = runner
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(
            runner.cache,
            tokenizer,
            vocab_size=runner.vocab_size,
            max_model_len=runner.max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        self._seed_stream = random.Random(seed)
        # DEEPINFER_ASYNC_SAMPLING (default on, 0 = off): sample on the device and launch the next decode step
        # before reading tokens.
        self.async_sampling = async_sampling_enabled()
        self._readback = TokenReadback()
        self.async_stats = {"launched_ahead": 0, "used": 0}  # steps launched before their tokens were known
        self._next_request = 0
        self.last_run_seconds = 0.0

    def get_tokenizer(self) -> Any:
        """The tokenizer (vLLM's accessor name)."""
        return self.tokenizer

    # ------------------------------------------------------------------ API
    def generate(
        self,
        prompts: str | list[str] | None = None,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        prompt_token_ids: list[list[int]] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Complete every prompt; returns one RequestOutput per prompt, in input order.

        Args:
            prompts: one text or a list; encoded with the tokenizer's special tokens.
            sampling_params: one for all prompts, one per prompt, or None (SamplingParams() defaults).
            prompt_token_ids: token ids per prompt, used instead of encoding. Given together with `prompts` (same
                length), the ids run and the texts are only reported as `RequestOutput.prompt`.
            use_tqdm: show a progress bar on stderr.
        """
        texts, ids = self._normalise_prompts(prompts, prompt_token_ids)
        params = self._normalise_params(sampling_params, len(ids))
        return self._run(texts, ids, params, use_tqdm)

    def chat(
        self,
        messages: Conversation | list[Conversation],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"} dicts) or a list of them, in input order.

        Each conversation is rendered with the tokenizer's chat template (RequestOutput.prompt is the rendered
        text) and encoded without adding special tokens, since the template holds them.
        """
        conversations = self._normalise_conversations(messages)
        texts: list[str | None] = []
        ids: list[list[int]] = []
        for conv in conversations:
            text = self.tokenizer.apply_chat_template(conv, add_generation_prompt=add_generation_prompt)
            texts.append(text)
            ids.append(list(self.tokenizer.encode(text, add_special_tokens=False)))
        return self._run(texts, ids, self._normalise_params(sampling_params, len(ids)), use_tqdm)

    # ------------------------------------------------------------ internals
    def _normalise_prompts(
        self, prompts: str | list[str] | None, prompt_token_ids: list[list[int]] | None
    ) -> tuple[list[str | None], list[list[int]]]:
        if isinstance(prompts, str):
            prompts = [prompts]
        if prompts is not None and (not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts)):
            raise TypeError(f"prompts must be a str or a list of str, got {type(prompts).__name__}")
        if prompt_token_ids is None:
            if prompts is None:
                raise ValueError("generate needs prompts or prompt_token_ids, got neither")
            return list(prompts), [list(self.tokenizer.encode(p, add_special_tokens=True)) for p in prompts]
        if not isinstance(prompt_token_ids, list) or not all(isinstance(p, (list, tuple)) for p in prompt_token_ids):
            raise TypeError("prompt_token_ids must be a list of lists of ints")
        if prompts is not None and len(prompts) != len(prompt_token_ids):
            raise ValueError(
                f"prompts and prompt_token_ids must have the same length, got {len(prompts)} and "
                f"{len(prompt_token_ids)}"
            )
        texts: list[str | None] = list(prompts) if prompts is not None else [None] * len(prompt_token_ids)
        return texts, [list(p) for p in prompt_token_ids]

    @staticmethod
    def _normalise_params(
        sampling_params: SamplingParams | list[SamplingParams] | None, count: int
    ) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams() for _ in range(count)]
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        if not isinstance(sampling_params, SequenceABC) or not all(
            isinstance(p, SamplingParams) for p in sampling_params
        ):
            raise TypeError("sampling_params must be a SamplingParams, a list of them, or None")
        if len(sampling_params) != count:
            raise ValueError(f"sampling_params has {len(sampling_params)} entries for {count} prompts")
        return list(sampling_params)

    @staticmethod
    def _normalise_conversations(messages: Conversation | list[Conversation]) -> list[Conversation]:
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts or a list of those")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        for conv in conversations:
            if not isinstance(conv, list) or not all(isinstance(m, dict) for m in conv):
                raise TypeError("each conversation must be a list of {'role', 'content'} dicts")
        return conversations

    def _make_sequence(self, text: str | None, ids: list[int], params: SamplingParams) -> Sequence:
        seed = params.seed if params.seed is not None else self._seed_stream.getrandbits(63)
        request_id = str(self._next_request)
        self._next_request += 1
        return Sequence(request_id=request_id, prompt=text, prompt_token_ids=ids, params=params, seed=seed)

    def _run(
        self, texts: list[str | None], ids: list[list[int]], params: list[SamplingParams], use_tqdm: bool
    ) -> list[RequestOutput]:
        """Queue every request, step until all finish, and return outputs in input order."""
        seqs = [self._make_sequence(t, i, p) for t, i, p in zip(texts, ids, params)]
        from tqdm.auto import tqdm

        bar = tqdm(total=len(seqs), desc="Generating", unit="req", disable=not use_tqdm, dynamic_ncols=True)
        start = time.perf_counter()
        try:
            for seq in seqs:
                self.scheduler.add(seq)
            self._loop(bar, start)
        except BaseException:
            self.scheduler.abort_all()  # keep the cache usable for the next call
            raise
        finally:
            bar.close()
            self.last_run_seconds = time.perf_counter() - start
        return [seq.to_output() for seq in seqs]

    def _batches(self, bar: Any, start: float) -> Iterator[list[ScheduledChunk]]:
        """The scheduler's batches until no request is left, counting finished requests on the progress bar between
        steps (a step that only failed requests that can never fit yields nothing)."""
        counts = [0, 0]  # prompt tokens, generated tokens of the finished requests
        while True:
            self._count_finished(bar, counts, start)
            if not self.scheduler.has_unfinished():
                return
            batch = self._schedule()
            if batch:
                yield batch

    def _schedule(self) -> list[ScheduledChunk]:
        """The scheduler's next batch; empty only when that step failed requests that can never fit (nothing
        left to run); raises when requests wait but nothing can be scheduled."""
        batch = self.scheduler.schedule()
        if not batch and self.scheduler.has_unfinished():
            raise RuntimeError(
                f"no sequence could be scheduled: {len(self.scheduler.waiting)} waiting, none running and no "
                "free cache slot; the cache's slot bookkeeping is inconsistent"
            )
        return batch

    def _loop(self, bar: Any, start: float) -> None:
        if self.async_sampling:
            self._loop_async(bar, start)
            return
        for batch in self._batches(bar, start):
            chunks = [item.chunk for item in batch]
            logits = self.runner.forward(chunks)
            prefetch = getattr(self.runner, "prefetch_next", None)  # fakes in tests may lack it
            if prefetch is not None:
                prefetch(chunks)  # next step's layout while the GPU runs this one
            self.scheduler.update(batch, logits)

    def _loop_async(self, bar: Any, start: float) -> None:
        """`_loop` with sampling on the device and the next decode step launched before this one's tokens are
        read (DEEPINFER_ASYNC_SAMPLING, on by default; see async_sampling.py). Same tokens as `_loop`."""
        ahead: tuple[list[ScheduledChunk], torch.Tensor] | None = None  # launched step and its logits
        for batch in self._batches(bar, start):
            launched, ahead = ahead, None
            params = [item.seq.params for item in batch]
            if not (all(item.samples and item.chunk.want == "last" for item in batch) and device_sampling_ok(params)):
                self._sync_step(batch)
                continue
            if launched is not None and _same_step(launched[0], batch):
                logits = launched[1]
                self.async_stats["used"] += 1
            else:  # no guess, or a wrong one (its step is dropped: see async_sampling.py)
                outs = self.runner.forward([item.chunk for item in batch])
                logits = torch.cat([o[-1:] for o in outs]).float()
            seqs = [item.seq for item in batch]
            tokens, nan = sample_on_device(
                logits, params, [s.seed for s in seqs], [len(s.output_token_ids) for s in seqs]
            )
            pending = self._readback.start(tokens, nan)
            ahead = self._launch_ahead(batch, tokens)
            self.scheduler.update_tokens(batch, pending.wait())

    def _launch_ahead(
        self, batch: list[ScheduledChunk], tokens: torch.Tensor
    ) -> tuple[list[ScheduledChunk], torch.Tensor] | None:
        """Reserve and launch the guessed next step (`Scheduler.plan_ahead`) with `tokens` [len(batch)] (device)
        as its input ids; None when there is no guess or the runner cannot take device ids (`forward_decode`:
        a runner without it keeps its cache contract, e.g. the test fakes, and only samples on the device)."""
        forward_decode = getattr(self.runner, "forward_decode", None)
        if forward_decode is None:
            return None
        nxt = self.scheduler.plan_ahead(batch)
        if nxt is None:
            return None
        keep = {id(item.seq): i for i, item in enumerate(batch)}
        rows = [keep[id(item.seq)] for item in nxt]
        # Integer indexing makes views; stacking them is one kernel, with no host-built index tensor to upload.
        ids = tokens if len(rows) == len(batch) else torch.stack([tokens[i] for i in rows])
        chunks = [item.chunk for item in nxt]
        self.async_stats["launched_ahead"] += 1
        return nxt, forward_decode(chunks, ids).float()

    def _sync_step(self, batch: list[ScheduledChunk]) -> None:
        """One step of the synchronous loop: forward, prefetch hint, host sampling."""
        chunks = [item.chunk for item in batch]
        logits = self.runner.forward(chunks)
        prefetch = getattr(self.runner, "prefetch_next", None)
        if prefetch is not None:
            prefetch(chunks)
        self.scheduler.update(batch, logits)

    def _count_finished(self, bar: Any, counts: list[int], start: float) -> None:
        """Advance the progress bar by the newly finished requests and show the token rates so far."""
        done = self.scheduler.take_finished()
        if not done:
            return
        counts[0] += sum(len(s.prompt_token_ids) for s in done)
        counts[1] += sum(len(s.output_token_ids) for s in done)
        elapsed = max(time.perf_counter() - start, 1e-9)
        bar.set_postfix_str(f"in {counts[0] / elapsed:.1f} tok/s, out {counts[1] / elapsed:.1f} tok/s", refresh=False)
        bar.update(len(done))


def _same_step(launched: list[ScheduledChunk], batch: list[ScheduledChunk]) -> bool:
    """True when `batch` (just scheduled) is the step launched ahead: same sequences, order and positions."""
    return len(launched) == len(batch) and all(
        a.seq is b.seq
        and a.chunk.slot == b.chunk.slot
        and a.chunk.start_pos == b.chunk.start_pos
        and len(b.chunk.token_ids) == 1
        and b.chunk.want == "last"
        and b.samples
        for a, b in zip(launched, batch)
    )
