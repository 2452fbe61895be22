"""DecodeGraphs.prefetch: the next step's layout uploaded early equals the one a full upload gives (logic only,
on CPU tensors with a stand-in graph: no GPU here; the GPU test compares graph and eager decode end to end)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from deepinfer.engine.cache.pool import CachePool
from deepinfer.engine.config_parse import config_from_dict
from deepinfer.engine.graphs import DecodeGraphs
from deepinfer.engine.model.batch import build_step
from deepinfer.engine.sequence import SeqChunk
from deepinfer.engine.tiny import tiny_config_dict

FIELDS = ("token_ids", "positions", "tok_seq", "slots", "win_ring_idx", "win_new_idx", "chunk_end")


class _Graph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


@pytest.fixture
def graphs() -> DecodeGraphs:
    cfg = config_from_dict(tiny_config_dict())
    ratios = {r for r in cfg.compress_ratios if r}
    pool = CachePool(cfg, num_slots=6, num_blocks=40, max_model_len=600, dtype=torch.float32, device="cpu")
    runner = SimpleNamespace(cache=pool, model=SimpleNamespace(compress_ratios=ratios))
    runner.step_batch = lambda chunks, static_width=False: build_step(  # noqa: E731
        pool,
        [c.token_ids for c in chunks],
        [c.start_pos for c in chunks],
        [c.slot for c in chunks],
        ratios,
        static_width,
    )
    g = DecodeGraphs.__new__(DecodeGraphs)
    g.runner, g.buckets, g._ready = runner, [4], None
    static = g._batch([], 4)  # what _capture builds: all padding
    g.graphs = {4: (_Graph(), static, torch.zeros(4, 3))}
    return g


def _expect(g: DecodeGraphs, chunks: list[SeqChunk]):
    return g._batch(chunks, 4, on_host=True)


def _assert_static(g: DecodeGraphs, want) -> None:
    static = g.graphs[4][1]
    for name in FIELDS:
        assert torch.equal(getattr(static, name), getattr(want, name)), name
    for r, view in static.comp.items():
        assert torch.equal(view.visible, want.comp[r].visible)
        if view.all_rows is not None:
            assert torch.equal(view.all_rows, want.comp[r].all_rows)


def _seqs(g: DecodeGraphs, lengths: list[int]) -> list[int]:
    slots = [g.runner.cache.allocate_slot() for _ in lengths]
    for s, n in zip(slots, lengths):
        assert g.runner.cache.reserve(s, n + 2)
    return slots


def test_prefetched_layout_equals_a_full_upload(graphs: DecodeGraphs) -> None:
    slots = _seqs(graphs, [130, 257, 17])
    step = [SeqChunk(s, [7], p, "last") for s, p in zip(slots, [130, 257, 17])]
    graphs.run(step)
    graphs.prefetch(step)
    nxt = [SeqChunk(s, [t], p + 1, "last") for s, t, p in zip(slots, [3, 4, 5], [130, 257, 17])]
    assert graphs._ready is not None
    graphs.run(nxt)  # only the tokens are copied now
    _assert_static(graphs, _expect(graphs, nxt))
    assert graphs._ready is None and graphs.graphs[4][0].replays == 2


def test_wrong_guess_or_new_owner_rebuilds(graphs: DecodeGraphs) -> None:
    slots = _seqs(graphs, [40, 50])
    step = [SeqChunk(s, [1], p, "last") for s, p in zip(slots, [40, 50])]
    graphs.run(step)
    graphs.prefetch(step)
    other = [SeqChunk(slots[0], [2], 41, "last")]  # one sequence finished: a different batch
    graphs.run(other)
    _assert_static(graphs, _expect(graphs, other))
    graphs.prefetch(other)
    graphs.runner.cache.free_slot(slots[1])
    new = graphs.runner.cache.allocate_slot()  # a slot changed owner since the prefetch
    assert graphs.runner.cache.reserve(new, 10)
    builds = []
    real = graphs._batch
    graphs._batch = lambda c, size, on_host=False: builds.append(len(c)) or real(c, size, on_host)
    nxt = [SeqChunk(slots[0], [3], 42, "last")]
    graphs.run(nxt)
    assert builds == [1], "the layout must be rebuilt after a slot changed owner"
    _assert_static(graphs, _expect(graphs, nxt))
    graphs.prefetch(nxt)
    builds.clear()
    graphs.run([SeqChunk(slots[0], [4], 43, "last")])
    assert builds == [], "a matching prefetch must not rebuild"
