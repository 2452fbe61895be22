"""The KV / state cache pool: fixed per-sequence state slots plus paged compressed-row blocks.

Layout per layer: see `layout.py`. A sequence holds one slot (window rings and compressor tails of
every layer) and a list of blocks (compressed rows of every compressed layer for `block_tokens`
positions each). `reserve` grows the block list; `free_slot` returns everything. Nothing else
allocates, so `num_free_blocks + sum(blocks held) == num_blocks` always (tested).
"""

from __future__ import annotations

import torch

from ..async_sampling import async_sampling_enabled
from ..config import ModelConfig
from .layout import LayerCacheSpec, block_tokens_for, bytes_per_block, bytes_per_slot, layer_specs


class CachePool:
    """Owns every cache tensor of the model and the slot / block bookkeeping."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        num_slots: int,
        num_blocks: int,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_slots < 1 or num_blocks < 0:
            raise ValueError(f"num_slots must be >= 1 and num_blocks >= 0, got {num_slots} and {num_blocks}")
        self.cfg, self.dtype, self.device = cfg, dtype, torch.device(device)
        self.num_blocks = num_blocks
        # One extra slot that is never handed out: CUDA-graph batches are padded with it. It owns no blocks, so
        # padded tokens see no compressed rows and write only to its own ring / tails and the trash rows.
        self.dummy_slot = num_slots
        num_slots += 1
        self.num_slots = num_slots
        self.window = cfg.window_size
        self.block_tokens = block_tokens_for(cfg)
        self.max_blocks_per_seq = -(-max_model_len // self.block_tokens)
        self.specs: list[LayerCacheSpec] = layer_specs(cfg)
        self.ring_rows = num_slots * self.window
        # The last row of every KV / index-key tensor is a trash row: predicated writes (decode steps that run
        # without host syncs, CUDA-graph padding) send the rows they must not store there.
        self.kv = [self._alloc(self.ring_rows + num_blocks * s.rows_per_block + 1, cfg.head_dim) for s in self.specs]
        self.index_keys = [
            self._alloc(num_blocks * s.rows_per_block + 1, cfg.index_head_dim) if s.kind == "csa" else None
            for s in self.specs
        ]
        self.tail_kv = [self._tail(s.tail_rows, s.tail_width) for s in self.specs]
        self.tail_score = [self._tail(s.tail_rows, s.tail_width) for s in self.specs]
        self.index_tail_kv = [self._tail(s.tail_rows, s.index_tail_width) for s in self.specs]
        self.index_tail_score = [self._tail(s.tail_rows, s.index_tail_width) for s in self.specs]
        self.block_table = torch.full((num_slots, self.max_blocks_per_seq), -1, dtype=torch.int32, device=device)
        # A host copy, kept equal: step metadata for CUDA graphs is built on the host without device round trips.
        self.block_table_host = torch.full((num_slots, self.max_blocks_per_seq), -1, dtype=torch.int32)
        # Bumped whenever a slot changes owner (allocate / free): a step layout built earlier for the same slots
        # and positions is still valid iff the version is unchanged (reserve only appends blocks past the
        # entries a layout reads).
        self.version = 0
        self._free_blocks = list(range(num_blocks - 1, -1, -1))
        self._free_slots = list(range(num_slots - 2, -1, -1))  # the dummy slot is not free
        self._slot_blocks: dict[int, list[int]] = {}
        self.async_uploads = async_sampling_enabled()  # see `reserve`

    def _alloc(self, rows: int, width: int) -> torch.Tensor:
        # NaN-filled so a read of a row nothing wrote shows up in tests instead of passing as zeros.
        return torch.full((rows, width), float("nan"), dtype=self.dtype, device=self.device)

    def _tail(self, rows: int, width: int) -> torch.Tensor | None:
        if rows == 0 or width == 0:
            return None
        return torch.zeros(self.num_slots, rows, width, dtype=torch.float32, device=self.device)

    # ----- sizing -------------------------------------------------------------------------------------

    @staticmethod
    def plan(
        cfg: ModelConfig,
        *,
        max_num_seqs: int,
        max_model_len: int,
        elem_bytes: int,
        budget_bytes: int | None,
    ) -> tuple[int, int]:
        """(num_slots, num_blocks) for a byte budget (None: enough blocks for every slot at full length).

        Raises ValueError when the budget cannot hold one sequence of `max_model_len` tokens.
        """
        bt = block_tokens_for(cfg)
        per_seq_blocks = -(-max_model_len // bt)
        want_blocks = max_num_seqs * per_seq_blocks
        if budget_bytes is None:
            return max_num_seqs, want_blocks
        slot_b, block_b = bytes_per_slot(cfg, elem_bytes), max(bytes_per_block(cfg, elem_bytes), 1)
        slots = max_num_seqs
        while slots > 1 and slots * slot_b + per_seq_blocks * block_b > budget_bytes:
            slots //= 2
        blocks = min(want_blocks, (budget_bytes - slots * slot_b) // block_b)
        if blocks < per_seq_blocks:
            need = slot_b + per_seq_blocks * block_b
            raise ValueError(
                f"cache budget of {budget_bytes / 2**20:.1f} MiB cannot hold one sequence of max_model_len="
                f"{max_model_len} tokens ({need / 2**20:.1f} MiB); lower max_model_len or raise "
                "gpu_memory_utilization"
            )
        return slots, int(blocks)

    # ----- bookkeeping --------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    @property
    def num_user_slots(self) -> int:
        """Slots that sequences can hold (the padding slot excluded)."""
        return self.num_slots - 1

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks a sequence of `num_tokens` tokens holds."""
        return -(-num_tokens // self.block_tokens)

    def allocate_slot(self) -> int | None:
        """Take a free state slot (None when all are in use)."""
        if not self._free_slots:
            return None
        slot = self._free_slots.pop()
        self._slot_blocks[slot] = []
        self.version += 1
        return slot

    def reserve(self, slot: int, num_tokens: int) -> bool:
        """Grow `slot`'s blocks to cover `num_tokens` positions. False (nothing taken) when they do not fit."""
        blocks = self._slot_blocks[slot]
        need = self.blocks_for(num_tokens) - len(blocks)
        if num_tokens > self.max_blocks_per_seq * self.block_tokens:
            return False
        if need <= 0:
            return True
        if need > len(self._free_blocks):
            return False
        first = len(blocks)
        for _ in range(need):
            blocks.append(self._free_blocks.pop())
        new = torch.tensor(blocks[first:], dtype=torch.int32)
        self.block_table_host[slot, first : len(blocks)] = new
        # A blocking upload waits for the whole stream (the step in flight); with async sampling the copy is
        # queued instead (stream order still puts it before the next step that reads the table).
        self.block_table[slot, first : len(blocks)].copy_(new, non_blocking=self.async_uploads)
        return True

    def free_slot(self, slot: int) -> None:
        """Return the slot and all its blocks to the pool."""
        blocks = self._slot_blocks.pop(slot)
        self._free_blocks.extend(reversed(blocks))
        self.block_table[slot].fill_(-1)
        self.block_table_host[slot].fill_(-1)
        self._free_slots.append(slot)
        self.version += 1

    def held_blocks(self) -> int:
        return sum(len(b) for b in self._slot_blocks.values())
