"""Cache pool bookkeeping: admission, growth, release, no leaks, sizing from a byte budget."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from deepinfer.engine.cache.layout import block_tokens_for, bytes_per_block, bytes_per_slot, layer_specs
from deepinfer.engine.cache.pool import CachePool
from deepinfer.engine.config_parse import load_config

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "data" / "v4-tiny-official"


@pytest.fixture(scope="module")
def cfg():
    return load_config(FIXTURE)


def test_layout_matches_v4_rules(cfg):
    specs = layer_specs(cfg)
    assert [s.kind for s in specs] == ["swa", "csa", "hca", "csa", "hca", "csa", "swa"]  # 6 layers + MTP
    assert block_tokens_for(cfg) == 128
    csa = specs[1]
    assert (csa.rows_per_block, csa.tail_rows, csa.tail_width) == (32, 8, 2 * cfg.head_dim)
    assert (specs[2].rows_per_block, specs[2].tail_rows) == (1, 128)
    # per block: 3 CSA layers x 32 rows x (256 + 128) + 2 HCA layers x 1 row x 256, in bf16
    assert bytes_per_block(cfg, 2) == (3 * 32 * (256 + 128) + 2 * 256) * 2


def test_random_admission_never_leaks(cfg):
    pool = CachePool(cfg, num_slots=4, num_blocks=10, max_model_len=1024, dtype=torch.float32, device="cpu")
    rng = random.Random(0)
    live: dict[int, int] = {}
    for _ in range(500):
        if live and rng.random() < 0.3:
            slot = rng.choice(sorted(live))
            pool.free_slot(slot)
            del live[slot]
        elif live and rng.random() < 0.5:
            slot = rng.choice(sorted(live))
            want = live[slot] + rng.randint(1, 300)
            before = pool.num_free_blocks
            if pool.reserve(slot, want):
                live[slot] = want
            else:
                assert pool.num_free_blocks == before  # a failed reserve takes nothing
        else:
            slot = pool.allocate_slot()
            if slot is None:
                assert len(live) == 4
                continue
            live[slot] = 0
        assert pool.num_free_blocks + pool.held_blocks() == pool.num_blocks
        assert pool.num_free_slots + len(live) == pool.num_user_slots
        for slot, n in live.items():
            held = (pool.block_table[slot] >= 0).sum().item()
            assert held == pool.blocks_for(n)
    for slot in list(live):
        pool.free_slot(slot)
    assert pool.num_free_blocks == pool.num_blocks and pool.num_free_slots == pool.num_user_slots
    assert (pool.block_table == -1).all()


def test_reserve_past_max_model_len_fails(cfg):
    pool = CachePool(cfg, num_slots=1, num_blocks=8, max_model_len=256, dtype=torch.float32, device="cpu")
    slot = pool.allocate_slot()
    assert pool.reserve(slot, 256)
    assert not pool.reserve(slot, 257)


def test_plan_fits_budget(cfg):
    slot_b, block_b = bytes_per_slot(cfg, 2), bytes_per_block(cfg, 2)
    budget = 3 * slot_b + 40 * block_b
    slots, blocks = CachePool.plan(cfg, max_num_seqs=3, max_model_len=1024, elem_bytes=2, budget_bytes=budget)
    assert slots == 3 and blocks == 24  # capped at what 3 full-length sequences need
    slots, blocks = CachePool.plan(cfg, max_num_seqs=64, max_model_len=1024, elem_bytes=2, budget_bytes=budget)
    assert slots * slot_b + blocks * block_b <= budget and blocks >= 8
    with pytest.raises(ValueError, match="max_model_len"):
        CachePool.plan(cfg, max_num_seqs=1, max_model_len=1 << 20, elem_bytes=2, budget_bytes=budget)
