"""ModelRunner: owns the model and the cache pool, runs one step over a list of sequence chunks."""

from __future__ import annotations

import torch

from .cache.layout import bytes_per_block
from .cache.pool import CachePool
from .config import ModelConfig
from .graphs import DecodeGraphs, graphs_enabled
from .model.batch import StepBatch, build_step
from .model.model import DeepseekV4
from .sequence import SeqChunk

__all__ = ["ModelRunner", "SeqChunk"]


def _cache_budget(device: torch.device, utilization: float) -> int | None:
    """Bytes the cache may take on a CUDA device: free memory minus what must stay unused. None on CPU."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int(free - (1.0 - utilization) * total)


class ModelRunner:
    """Runs steps of the V4 model over chunks of many sequences (continuous batching's engine room)."""

    def __init__(
        self,
        cfg: ModelConfig,
        weights: dict[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        max_num_seqs: int = 16,
        max_model_len: int = 4096,
        gpu_memory_utilization: float = 0.9,
        qat: bool = False,
        num_blocks: int | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if max_model_len < 1 or max_num_seqs < 1:
            raise ValueError(f"max_model_len and max_num_seqs must be >= 1, got {max_model_len}, {max_num_seqs}")
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        self.max_model_len = max_model_len
        self.model = DeepseekV4(cfg, weights, dtype=dtype, device=self.device, qat=qat)
        self._warmup()  # build lazy weight copies now, so the cache is sized from what is really left
        elem = torch.tensor([], dtype=dtype).element_size()
        slots, blocks = CachePool.plan(
            cfg,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            elem_bytes=elem,
            budget_bytes=_cache_budget(self.device, gpu_memory_utilization),
        )
        if num_blocks is not None:
            blocks = num_blocks
        self.cache = CachePool(
            cfg, num_slots=slots, num_blocks=blocks, max_model_len=max_model_len, dtype=dtype, device=self.device
        )
        self.cache_bytes = blocks * bytes_per_block(cfg, elem)
        use_graphs = cuda_graphs and graphs_enabled(self.model, self.device)
        self.graphs = DecodeGraphs(self, self.cache.num_slots) if use_graphs else None
        if self.graphs is not None:
            self.graphs.capture_all()

    @torch.inference_mode()
    def _warmup(self) -> None:
        """One token through every layer on a one-block scratch pool.

        The model builds some weight copies on first use (dequantised linears, stacked experts); doing that
        before `CachePool.plan` reads free device memory keeps them inside `gpu_memory_utilization`.
        """
        scratch = CachePool(self.cfg, num_slots=1, num_blocks=1, max_model_len=1, dtype=self.dtype, device=self.device)
        b = build_step(scratch, [[0]], [0], [scratch.dummy_slot], self.model.compress_ratios)
        self.model.logits(self.model.forward(b, scratch))
        del scratch, b
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def _check(self, chunks: list[SeqChunk]) -> None:
        for c in chunks:
            if not c.token_ids:
                raise ValueError(f"chunk for slot {c.slot} has no tokens")
            end = c.start_pos + len(c.token_ids)
            if end > self.max_model_len:
                raise ValueError(f"slot {c.slot}: positions up to {end} exceed max_model_len={self.max_model_len}")
            have = len(self.cache._slot_blocks.get(c.slot, [])) * self.cache.block_tokens
            if end > have:
                raise ValueError(f"slot {c.slot}: reserve({end}) tokens before forward (holds {have})")
            if c.want not in ("last", "all", "none"):
                raise ValueError(f"want must be 'last', 'all' or 'none', got {c.want!r}")

    def step_batch(self, chunks: list[SeqChunk], static_width: bool = False) -> StepBatch:
        return build_step(
            self.cache,
            [c.token_ids for c in chunks],
            [c.start_pos for c in chunks],
            [c.slot for c in chunks],
            self.model.compress_ratios,
            static_width,
        )

    @torch.inference_mode()
    def forward_hidden(self, chunks: list[SeqChunk]) -> tuple[StepBatch, torch.Tensor]:
        """Run the main layers; returns the step layout and the final residual [T, hc, hidden]."""
        self._check(chunks)
        b = self.step_batch(chunks)
        return b, self.model.forward(b, self.cache)

    @torch.inference_mode()
    def forward(self, chunks: list[SeqChunk]) -> list[torch.Tensor | None]:
        """Per chunk: fp32 logits [1, vocab] ("last"), [len, vocab] ("all") or None ("none")."""
        if self.graphs is not None and chunks and all(len(c.token_ids) == 1 for c in chunks):
            self._check(chunks)
            if self.graphs.bucket(len(chunks)) is not None:
                logits = self.graphs.run(chunks)
                return [None if c.want == "none" else logits[i : i + 1] for i, c in enumerate(chunks)]
        b, resid = self.forward_hidden(chunks)
        rows, spans = [], []
        for c, lo, n in zip(chunks, b.cu, b.lens):
            if c.want == "none":
                spans.append(None)
                continue
            take = range(lo, lo + n) if c.want == "all" else range(lo + n - 1, lo + n)
            spans.append((len(rows), len(take)))
            rows.extend(take)
        if not rows:
            return [None] * len(chunks)
        logits = self.model.logits(resid[torch.tensor(rows, device=resid.device)])
        return [None if s is None else logits[s[0] : s[0] + s[1]] for s in spans]

    @torch.inference_mode()
    def forward_decode(self, chunks: list[SeqChunk], token_ids: torch.Tensor) -> torch.Tensor:
        """A decode step whose input ids are already on the device: fp32 logits [len(chunks), vocab].

        chunks: one token each (its value is ignored: a placeholder), want "last"; token_ids: int64
        [len(chunks)] on this runner's device, e.g. the previous step's `sample_on_device` result. On the
        CUDA-graph path the ids are copied device to device, so the host never waits for them; otherwise the
        ids are read and the step runs through `forward` (the same logits)."""
        if len(token_ids) != len(chunks) or any(len(c.token_ids) != 1 or c.want != "last" for c in chunks):
            raise ValueError(
                f"forward_decode needs one 'last' token per chunk and one id per chunk, got {len(chunks)} chunks "
                f"and {len(token_ids)} ids"
            )
        if self.graphs is not None and chunks and self.graphs.bucket(len(chunks)) is not None:
            self._check(chunks)
            return self.graphs.run(chunks, token_ids.to(torch.int64))
        real = [SeqChunk(c.slot, [t], c.start_pos, c.want) for c, t in zip(chunks, token_ids.tolist())]
        return torch.cat(self.forward(real))

    def prefetch_next(self, chunks: list[SeqChunk]) -> None:
        """Hint after a decode step's `forward`, before reading its logits: the next step is likely the same
        sequences one position on; on the CUDA-graph path its layout is built and uploaded now, overlapping the
        GPU. A wrong guess costs nothing but this host work (the next `forward` rebuilds)."""
        if self.graphs is not None and chunks and all(len(c.token_ids) == 1 for c in chunks):
            self.graphs.prefetch(chunks)

    @torch.inference_mode()
    def mtp_logits(self, i: int, resid: torch.Tensor, chunks: list[SeqChunk]) -> torch.Tensor:
        """MTP block i over chunks whose token_ids are the NEXT tokens of `resid`'s positions.

        resid: [T, hc, hidden] main residual of the same positions. Returns fp32 logits [T, vocab] (predicting
        position + 2). The MTP block keeps its own window state in the same slots.
        """
        self._check(chunks)
        b = self.step_batch(chunks)
        return self.model.mtp_logits(i, self.model.mtp_forward(i, resid, b, self.cache))
