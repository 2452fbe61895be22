"""V4 attention: low-rank query, one shared 512-d K=V vector, sliding window + compressed rows, sink.

Per token (architecture notes section 3): qr = norm(x Wq_a); q = per-head-normed (qr Wq_b) with RoPE on
the last rope_dim dims; kv = norm(x Wkv) with RoPE (and the FP8 simulation on the other dims). Keys: the
window (positions p-W+1..p) plus, on CSA layers, the indexer's top-k compressed rows, on HCA layers every
closed compressed row. The output gets the inverse RoPE, then the grouped low-rank output projection.
"""

from __future__ import annotations

import torch

from deepinfer import deep_gemm, flash_mla
from deepinfer import tile_kernels as tk

from ..cache.pool import CachePool
from ..config import ModelConfig
from ..weights import linear
from .batch import StepBatch, entry_rows
from .compressor import Compressor
from .compressor_plan import plan_prefill
from .indexer import Indexer
from .rope import Rope


class Attention:
    """One attention layer; `kind` is 'swa', 'csa' or 'hca'."""

    def __init__(self, cfg: ModelConfig, w: dict, kind: str, ratio: int, rope: Rope, qat: bool) -> None:
        self.cfg, self.kind, self.ratio, self.rope, self.qat = cfg, kind, ratio, rope, qat
        self.wq_a, self.q_norm, self.wq_b = w["wq_a"], w["q_norm"], w["wq_b"]
        self.wkv, self.kv_norm, self.sink = w["wkv"], w["kv_norm"], w["attn_sink"].float()
        self.wo_a, self.wo_b = w["wo_a"], w["wo_b"]
        self.compressor: Compressor | None = w.get("compressor")
        self.indexer: Indexer | None = w.get("indexer")
        self.scale = cfg.head_dim**-0.5

    def quant_kv(self, kv: torch.Tensor) -> torch.Tensor:
        """The FP8 simulation of the non-RoPE dims (block 64, UE8M0 scales); RoPE dims untouched."""
        if not self.qat:
            return kv
        nope = self.cfg.nope_dim
        return torch.cat((tk.fp8_quant_dequant_ue8m0(kv[..., :nope], block=64), kv[..., nope:]), dim=-1)

    def _finish_entry(self, entries: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.quant_kv(self.rope.at(entries, positions))

    def _project(self, x: torch.Tensor, cs: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg, t = self.cfg, x.shape[0]
        qr = tk.rms_norm(linear(x, self.wq_a), self.q_norm, cfg.rms_norm_eps)
        q = linear(qr, self.wq_b).view(t, cfg.num_heads, cfg.head_dim)
        q = self.rope.apply(tk.rms_norm(q, None, cfg.rms_norm_eps), cs)
        # One fused pass (bit-exact to rms_norm -> rope -> FP8 quant-dequant of the non-RoPE dims, each step rounded)
        quant_block = 64 if self.qat else None
        kv = tk.kv_norm_rope_quant(
            linear(x, self.wkv), self.kv_norm, cs[0], cs[1], self.rope.rope_dim, cfg.rms_norm_eps, quant_block
        )
        return qr, q, kv

    def _compress(self, x: torch.Tensor, b: StepBatch, pool: CachePool, layer: int) -> None:
        """Run the compressors over every chunk and write closed windows' entries into the pool."""
        comps = [(self.compressor, pool.kv[layer], pool.tail_kv[layer], pool.tail_score[layer], self._finish_entry)]
        if self.indexer is not None:
            ix = self.indexer
            comps.append(
                (
                    ix.compressor,
                    pool.index_keys[layer],
                    pool.index_tail_kv[layer],
                    pool.index_tail_score[layer],
                    ix.finish_keys,
                )
            )
        view = b.comp[self.ratio]
        decode = all(n == 1 for n in b.lens)
        for comp, store, tail_k, tail_z, finish in comps:
            k_all, z_all = comp.project(x, b.positions)
            offset = 0 if store is pool.kv[layer] else pool.ring_rows  # indexer keys have no ring region
            if decode:
                closes, j, ent = comp.run_decode(k_all, z_all, b.positions, b.slots, tail_k, tail_z, finish, x.dtype)
                rows = entry_rows(pool, b.slots, j[:, None], view.rows_per_block)[:, 0].long() - offset
                trash = store.shape[0] - 1
                store[torch.where(closes & (rows >= 0), rows, trash)] = ent.to(store.dtype)
                continue
            key = (comp.ratio, comp.overlap, comp.tail_rows)
            if key not in b.plans:  # same for every layer of this ratio: build and upload once per step
                b.plans[key] = plan_prefill(*key, b.starts, b.lens, b.cu[:-1], b.slot_ids).to(x.device)
            plan = b.plans[key]
            slots, j, ent = comp.run_prefill(k_all, z_all, plan, tail_k, tail_z, finish, x.dtype)
            if j.numel():
                rows = entry_rows(pool, slots, j[:, None], view.rows_per_block)[:, 0].long()
                store[rows - offset] = ent.to(store.dtype)

    def _main_indices(self, x: torch.Tensor, qr: torch.Tensor, b: StepBatch, cs: tuple, pool, layer) -> torch.Tensor:
        if self.kind == "swa":
            return b.win_ring_idx
        view = b.comp[self.ratio]
        if self.kind == "hca":
            comp_rows = view.all_rows
        else:
            local = self.indexer.select(x, qr, b, cs, pool, layer)
            comp_rows = entry_rows(pool, b.slots[b.tok_seq], local, view.rows_per_block)
        return torch.cat((b.win_ring_idx, comp_rows), dim=1)

    def _write_window(self, kv: torch.Tensor, b: StepBatch, pool: CachePool, layer: int) -> None:
        """Store each chunk's last W new KV rows in the slot's ring (row p % W)."""
        w = pool.window
        keep = b.positions >= b.chunk_end - w
        rows = b.slots[b.tok_seq] * w + b.positions.remainder(w)
        trash = pool.kv[layer].shape[0] - 1  # predicated write: no host sync
        pool.kv[layer][torch.where(keep, rows, trash)] = kv.to(pool.dtype)

    def forward(self, x: torch.Tensor, b: StepBatch, cs: tuple, pool: CachePool, layer: int) -> torch.Tensor:
        """x: [T, hidden] attention input (normed). Returns [T, hidden]."""
        cfg, t = self.cfg, x.shape[0]
        qr, q, kv = self._project(x, cs)
        if self.kind != "swa":
            self._compress(x, b, pool, layer)
        main_idx = self._main_indices(x, qr, b, cs, pool, layer)
        o, _ = flash_mla.sparse_attn_prefill(
            q,
            pool.kv[layer],
            main_idx,
            self.sink,
            self.scale,
            extra_kv=kv.to(pool.dtype),
            extra_indices=b.win_new_idx,
        )
        self._write_window(kv, b, pool, layer)
        o = self.rope.apply(o.to(x.dtype), cs, inverse=True)
        g = cfg.o_groups
        o = o.reshape(t, g, -1)
        wo_a = self.wo_a.dequant(x.dtype).view(g, cfg.o_lora_rank, -1)
        u = deep_gemm.grouped_gemm_nt_bf16(o.contiguous(), wo_a)
        return linear(u.reshape(t, -1), self.wo_b)
