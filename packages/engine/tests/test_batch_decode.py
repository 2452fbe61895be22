"""The numpy decode-step builder equals build_step (on a CPU pool) field by field."""

from __future__ import annotations

import random

import torch

from deepinfer.engine.cache.pool import CachePool
from deepinfer.engine.config_parse import config_from_dict
from deepinfer.engine.model.batch import build_step
from deepinfer.engine.model.batch_decode import build_decode_host
from deepinfer.engine.tiny import tiny_config_dict


def _pool() -> tuple[CachePool, set[int]]:
    cfg = config_from_dict(tiny_config_dict())
    pool = CachePool(cfg, num_slots=6, num_blocks=40, max_model_len=700, dtype=torch.float32, device="cpu")
    return pool, {r for r in cfg.compress_ratios if r}


def _same(a, b) -> None:
    for name in ("token_ids", "positions", "tok_seq", "slots", "win_ring_idx", "win_new_idx", "chunk_end"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert (a.starts, a.lens, a.cu, a.slot_ids) == (b.starts, b.lens, b.cu, b.slot_ids)
    assert a.comp.keys() == b.comp.keys()
    for r, v in a.comp.items():
        w = b.comp[r]
        assert (v.ratio, v.rows_per_block) == (w.ratio, w.rows_per_block)
        assert v.visible.dtype == w.visible.dtype and torch.equal(v.visible, w.visible)
        assert (v.all_rows is None) == (w.all_rows is None)
        if v.all_rows is not None:
            assert v.all_rows.dtype == w.all_rows.dtype and torch.equal(v.all_rows, w.all_rows)


def test_decode_builder_matches_build_step() -> None:
    rng = random.Random(0)
    pool, ratios = _pool()
    slots = [pool.allocate_slot() for _ in range(5)]
    lengths = [1, 3, 130, 257, 699]  # inside the window, past it, past HCA windows, near max_model_len
    for s, n in zip(slots, lengths):
        assert pool.reserve(s, n)
    for trial in range(4):
        order = rng.sample(range(5), k=5 - trial % 2)
        pos = [lengths[i] - 1 - rng.randint(0, min(2, lengths[i] - 1)) for i in order]
        toks = [rng.randint(0, 50) for _ in order]
        sl = [slots[i] for i in order] + [pool.dummy_slot]
        pos.append(0)
        toks.append(0)
        want = build_step(pool, [[t] for t in toks], pos, sl, ratios, static_width=True)  # CPU pool
        _same(build_decode_host(pool, toks, pos, sl, ratios), want)
