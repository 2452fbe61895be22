"""Per-step batch metadata: token layout and the attention index lists shared by all layers.

A step runs a flat batch of T tokens made of R chunks (one per sequence: a prompt chunk starting at any
position, or one decode token). Attention reads two KV sources (see `cache/layout.py`):

* the layer's pool tensor (window ring rows + compressed rows), through `main` index lists;
* the step's freshly computed KV rows `[T, D]` (window positions inside the current chunk), through
  `win_new_idx`.

Window and HCA index lists do not depend on the layer's weights, so they are built once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..cache.pool import CachePool


@dataclass
class StepBatch:
    """Token layout of one forward step. All tensors live on the model's device."""

    token_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    tok_seq: torch.Tensor  # [T] int64: chunk index of each token
    slots: torch.Tensor  # [R] int64: cache slot of each chunk
    starts: list[int]  # [R] first position of each chunk (tokens already cached)
    lens: list[int]  # [R] tokens in each chunk
    cu: list[int]  # [R + 1] token offsets of the chunks
    win_ring_idx: torch.Tensor = None  # [T, W] int32 rows of the pool's ring (positions before the chunk)
    win_new_idx: torch.Tensor = None  # [T, W] int32 rows of the step's new KV (positions inside the chunk)
    chunk_end: torch.Tensor = None  # [T] int64: end position (exclusive) of each token's chunk
    comp: dict[int, CompressedView] = field(default_factory=dict)  # per compress ratio
    slot_ids: list[int] = field(default_factory=list)  # [R] host copy of `slots`
    plans: dict = field(default_factory=dict)  # compressor prefill plans, shared by the layers of a step

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass
class CompressedView:
    """Visibility of compressed entries for one compress ratio."""

    ratio: int
    rows_per_block: int
    visible: torch.Tensor  # [T] int32: entries j < floor((p + 1) / ratio) are visible to the token at p
    all_rows: torch.Tensor | None  # [T, max visible] int32 pool rows of every visible entry (HCA), -1 padded


def build_step(
    pool: CachePool,
    token_ids: list[list[int]],
    starts: list[int],
    slots: list[int],
    ratios: set[int],
    static_width: bool = False,
) -> StepBatch:
    """Lay out a step and build the shared index lists for the given compress `ratios` (0 excluded).

    static_width: size the HCA index lists for the longest possible sequence (CUDA graphs need fixed shapes)
    instead of the longest one in this step. Decode steps on the CUDA-graph path are laid out on the host by
    `batch_decode.build_decode_host` instead (same tensors).
    """
    dev = pool.device
    lens = [len(t) for t in token_ids]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    flat = [tok for chunk in token_ids for tok in chunk]
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens)]) if flat else torch.zeros(0)
    tok_seq = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    b = StepBatch(
        token_ids=torch.tensor(flat, dtype=torch.int64, device=dev),
        positions=positions.to(dtype=torch.int64, device=dev),
        tok_seq=tok_seq.to(dev),
        slots=torch.tensor(slots, dtype=torch.int64, device=dev),
        starts=starts,
        lens=lens,
        cu=cu,
        slot_ids=list(slots),
    )
    b.chunk_end = torch.tensor([s + n for s, n in zip(starts, lens)], dtype=torch.int64, device=dev)[b.tok_seq]
    _window_indices(b, pool)
    for r in sorted(ratios):
        b.comp[r] = _compressed_view(b, pool, r, static_width)
    return b


def _window_indices(b: StepBatch, pool: CachePool) -> None:
    """Key positions p-W+1..p: ring rows for those before the chunk, new-KV rows for those inside it."""
    w = pool.window
    p = b.positions[:, None]
    kpos = p - w + 1 + torch.arange(w, device=p.device)[None, :]  # [T, W]
    start = torch.tensor(b.starts, device=p.device)[b.tok_seq][:, None]
    cu = torch.tensor(b.cu[:-1], device=p.device)[b.tok_seq][:, None]
    valid = kpos >= 0
    in_chunk = kpos >= start
    slot = b.slots[b.tok_seq][:, None]
    ring = slot * w + kpos.remainder(w)
    b.win_ring_idx = torch.where(valid & ~in_chunk, ring, -1).to(torch.int32)
    b.win_new_idx = torch.where(valid & in_chunk, cu + (kpos - start), -1).to(torch.int32)


def entry_rows(pool: CachePool, slots: torch.Tensor, entries: torch.Tensor, rows_per_block: int) -> torch.Tensor:
    """Pool rows of compressed entries. slots: [T], entries: [T, k] int (-1 = none)."""
    table = pool.block_table
    valid = entries >= 0
    e = entries.clamp(min=0).long()
    blocks = table[slots[:, None], e // rows_per_block].long()
    rows = pool.ring_rows + blocks * rows_per_block + e % rows_per_block
    return torch.where(valid & (blocks >= 0), rows, -1).to(torch.int32)


def _compressed_view(b: StepBatch, pool: CachePool, ratio: int, static_width: bool) -> CompressedView:
    rpb = pool.block_tokens // ratio
    visible = torch.div(b.positions + 1, ratio, rounding_mode="floor").to(torch.int32)
    all_rows = None
    if ratio != 4:  # HCA attends to every closed entry
        if static_width:
            width = pool.max_blocks_per_seq * rpb
        else:
            width = int(visible.max().item()) if b.num_tokens else 0
        j = torch.arange(width, device=visible.device)[None, :].expand(b.num_tokens, width)
        ent = torch.where(j < visible[:, None], j, -1)
        all_rows = entry_rows(pool, b.slots[b.tok_seq], ent, rpb)
    return CompressedView(ratio, rpb, visible, all_rows)
