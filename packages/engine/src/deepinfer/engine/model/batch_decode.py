"""Host-side layout of a decode step (one token per sequence), built with numpy for the CUDA-graph path.

Built with torch ops on the host (as `build_step` would on a CPU pool), the same tensors took a few dozen small
ops, each with several microseconds of dispatch overhead: 1-2.6 ms per step on the GPU machines, serialised with
the GPU work of every decode step. A decode step's layout is simple enough (chunk i is token i at position p_i) to build
in a handful of vectorised numpy operations; the result is identical (tests/test_batch_decode.py).
"""

from __future__ import annotations

import numpy as np
import torch

from ..cache.pool import CachePool
from .batch import CompressedView, StepBatch


def _entry_rows(pool: CachePool, table: np.ndarray, slots: np.ndarray, ent: np.ndarray, rpb: int) -> np.ndarray:
    """numpy twin of batch.entry_rows: pool rows of entries ent [T, k] (-1 = none) of the sequences in slots."""
    valid = ent >= 0
    e = np.maximum(ent, 0)
    blocks = table[slots[:, None], e // rpb].astype(np.int64)
    rows = pool.ring_rows + blocks * rpb + e % rpb
    return np.where(valid & (blocks >= 0), rows, -1).astype(np.int32)


def build_decode_host(
    pool: CachePool, token_ids: list[int], positions: list[int], slots: list[int], ratios: set[int]
) -> StepBatch:
    """StepBatch (CPU tensors, fixed HCA width) of a decode step: token i at positions[i] of the sequence in
    slots[i]. Equal to `build_step(pool, [[t] for t in token_ids], positions, slots, ratios, True)` on a CPU pool."""
    t = len(token_ids)
    pos = np.asarray(positions, dtype=np.int64)
    slot = np.asarray(slots, dtype=np.int64)
    idx = np.arange(t, dtype=np.int64)
    w = pool.window
    kpos = pos[:, None] - w + 1 + np.arange(w, dtype=np.int64)[None, :]  # [T, W]; the last column is p itself
    ring = np.where(kpos[:, :-1] >= 0, slot[:, None] * w + kpos[:, :-1] % w, -1)
    win_ring = np.concatenate((ring, np.full((t, 1), -1)), axis=1).astype(np.int32)
    win_new = np.full((t, w), -1, dtype=np.int32)
    win_new[:, -1] = idx
    b = StepBatch(
        token_ids=torch.tensor(token_ids, dtype=torch.int64),
        positions=torch.from_numpy(pos),
        tok_seq=torch.from_numpy(idx),
        slots=torch.from_numpy(slot),
        starts=list(positions),
        lens=[1] * t,
        cu=list(range(t + 1)),
        slot_ids=list(slots),
        win_ring_idx=torch.from_numpy(win_ring),
        win_new_idx=torch.from_numpy(win_new),
        chunk_end=torch.from_numpy(pos + 1),
    )
    table = pool.block_table_host.numpy()
    for r in sorted(ratios):
        rpb = pool.block_tokens // r
        visible = ((pos + 1) // r).astype(np.int32)
        all_rows = None
        if r != 4:  # HCA attends to every closed entry: fixed width for the graph
            j = np.arange(pool.max_blocks_per_seq * rpb, dtype=np.int64)[None, :]
            ent = np.where(j < visible[:, None], j, -1)
            all_rows = torch.from_numpy(_entry_rows(pool, table, slot, ent, rpb))
        b.comp[r] = CompressedView(r, rpb, torch.from_numpy(visible), all_rows)
    return b
