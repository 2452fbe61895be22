"""CUDA graphs of the decode step: one graph per batch-size bucket, replayed with new inputs.

A decode step (one token per sequence) launches thousands of small kernels; on a GPU the host cannot keep
up, so the step costs far more than its kernels. Capturing the whole step (layers + head) once per bucket
and replaying it removes that overhead. The step must not sync with the host and must have fixed shapes:
the forward path is written that way (predicated writes to trash rows, fixed-width index lists), batches are
padded up to the bucket with the cache's dummy slot, and inputs are copied into the graph's static tensors.
"""

from __future__ import annotations

import os
from dataclasses import fields

import torch

from .model.batch import StepBatch
from .model.batch_decode import build_decode_host
from .sequence import SeqChunk

_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
_HOST_FIELDS = ("starts", "lens", "cu", "comp", "slot_ids", "plans")
_TENSOR_FIELDS = [f.name for f in fields(StepBatch) if f.name not in _HOST_FIELDS]


def graphs_enabled(model, device: torch.device) -> bool:
    """CUDA graphs need a decode step without host syncs: on CUDA, every MoE layer must run a grouped expert
    path (the per-expert reference loop syncs). Call after the runner's warm-up, which picks those paths."""
    # Only the main blocks: the captured step (forward + logits) does not run the MTP block(s).
    return (
        device.type == "cuda"
        and all(b.moe.grouped is not None for b in model.blocks)
        and os.environ.get("DEEPINFER_CUDA_GRAPHS", "1") != "0"
    )


def bucket_sizes(max_batch: int) -> list[int]:
    """Padded batch sizes that get a graph: the standard buckets below `max_batch`, then `max_batch` itself."""
    return sorted({b for b in _BUCKETS if b < max_batch} | {max_batch})


class DecodeGraphs:
    """Captured decode steps of a ModelRunner, keyed by padded batch size."""

    def __init__(self, runner, max_batch: int) -> None:
        self.runner = runner
        self.buckets = bucket_sizes(max_batch)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, StepBatch, torch.Tensor]] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self._ready: tuple | None = None  # (bucket, layout key) uploaded by `prefetch` and not yet replayed

    def capture_all(self) -> None:
        """Capture every bucket now, largest first (the smaller graphs then reuse the largest one's memory pool).

        Done at start-up, as vLLM and SGLang do: a first capture inside the serving loop costs as much as
        dozens of decode steps (warm-up run + capture of thousands of kernels)."""
        for size in sorted(self.buckets, reverse=True):
            if size not in self.graphs:
                self._capture(size)

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def _batch(self, chunks: list[SeqChunk], size: int, on_host: bool = False) -> StepBatch:
        dummy = self.runner.cache.dummy_slot
        pad = [SeqChunk(dummy, [0], 0, "last")] * (size - len(chunks))
        if on_host:  # the per-step path: numpy, a few vectorised ops (same tensors as step_batch builds)
            every = [*chunks, *pad]
            return build_decode_host(
                self.runner.cache,
                [c.token_ids[0] for c in every],
                [c.start_pos for c in every],
                [c.slot for c in every],
                self.runner.model.compress_ratios,
            )
        return self.runner.step_batch([*chunks, *pad], static_width=True)

    def _capture(self, size: int) -> None:
        model, cache = self.runner.model, self.runner.cache
        static = self._batch([], size)  # all padding: the warm-up writes only the dummy slot and trash rows
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up fills lazy caches (dequantised weights) outside the capture
            model.logits(model.forward(static, cache))
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = model.logits(model.forward(static, cache))
        self.graphs[size] = (graph, static, out)

    @staticmethod
    def _upload(static: StepBatch, new: StepBatch) -> None:
        """Copy a host-built layout into a graph's static inputs (queued on the stream: after earlier replays)."""
        for name in _TENSOR_FIELDS:
            getattr(static, name).copy_(getattr(new, name), non_blocking=True)
        for r, view in static.comp.items():
            view.visible.copy_(new.comp[r].visible, non_blocking=True)
            if view.all_rows is not None:
                view.all_rows.copy_(new.comp[r].all_rows, non_blocking=True)

    def _key(self, chunks: list[SeqChunk]) -> tuple:
        return (tuple(c.slot for c in chunks), tuple(c.start_pos for c in chunks), self.runner.cache.version)

    @torch.inference_mode()
    def prefetch(self, chunks: list[SeqChunk]) -> None:
        """Build and upload the layout of the step after `chunks` (same sequences, one position on), so that step
        only copies its token ids before its replay. Called while the GPU still runs the step of `chunks`: the
        host work overlaps it, and the uploads are queued behind that step's replay, which has read its inputs.
        """
        size = self.bucket(len(chunks))
        if size is None or size not in self.graphs:
            return
        nxt = [SeqChunk(c.slot, [0], c.start_pos + 1, c.want) for c in chunks]
        self._upload(self.graphs[size][1], self._batch(nxt, size, on_host=True))
        self._ready = (size, self._key(nxt))

    @torch.inference_mode()
    def run(self, chunks: list[SeqChunk], device_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits [len(chunks), vocab] of a decode step (every chunk is one token).

        device_tokens: optional int64 [len(chunks)] on the device (the previous step's samples): the step's input
        ids, copied device to device (the chunks' own token_ids are then ignored)."""
        size = self.bucket(len(chunks))
        if size not in self.graphs:
            self._capture(size)
        graph, static, out = self.graphs[size]
        ready, self._ready = self._ready, None
        if device_tokens is not None:
            if ready != (size, self._key(chunks)):
                self._upload(static, self._batch(chunks, size, on_host=True))
            static.token_ids[: len(chunks)].copy_(device_tokens, non_blocking=True)
        elif ready == (size, self._key(chunks)):  # layout already uploaded by prefetch: only the tokens are new
            tokens = torch.tensor([c.token_ids[0] for c in chunks], dtype=torch.int64)
            static.token_ids[: len(chunks)].copy_(tokens, non_blocking=True)
        else:
            self._upload(static, self._batch(chunks, size, on_host=True))  # built on the host, one copy a tensor
        graph.replay()
        return out[: len(chunks)]
