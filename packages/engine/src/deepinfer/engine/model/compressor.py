"""KV compressor (CSA ratio 4 with overlapping windows; HCA ratio m without), any chunk start.

For each token: K = x @ wkv^T and Z = x @ wgate^T + ape[pos % m] (fp32). Window j covers positions
[j*m, (j+1)*m). With overlap (CSA) entry j pools 2m slots per channel: the first channel half of the
previous window's tokens and the second half of its own tokens; without overlap, its m tokens. Pooling is
a per-channel softmax over slots of Z, weighting K. The entry is RMS-normed, RoPE'd at position j*m and
(optionally) quantise-simulated.

A chunk may start anywhere: the K/Z rows of not-yet-pooled positions (the tail) persist per slot in fp32,
row p % tail_rows, from `tail_start(p_next)` on, so the next chunk continues exactly where this one ended.
Prefill steps pool all sequences at once (`run_prefill` with a host-built plan); decode steps use the
sync-free `run_decode`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from deepinfer import tile_kernels as tk

from ..weights import QWeight, linear_fp32
from .compressor_plan import PrefillPlan


class Compressor:
    """Weights and math of one compressor (main KV: dim = head_dim; indexer keys: dim = index_head_dim)."""

    def __init__(
        self,
        wkv: QWeight,
        wgate: QWeight,
        ape: torch.Tensor,
        norm: torch.Tensor,
        ratio: int,
        dim: int,
        eps: float,
    ) -> None:
        self.wkv, self.wgate, self.ape, self.norm = wkv, wgate, ape.float(), norm
        self.ratio, self.dim, self.eps = ratio, dim, eps
        self.overlap = ratio == 4
        self.tail_rows = (2 if self.overlap else 1) * ratio

    def tail_start(self, p_next: int) -> int:
        """First position whose K/Z rows must be kept when `p_next` positions have been seen."""
        closed = p_next // self.ratio
        return max(0, self.ratio * (closed - (1 if self.overlap else 0)))

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [n, hidden] -> K, Z [n, coff * dim] fp32."""
        k = linear_fp32(x, self.wkv)
        z = linear_fp32(x, self.wgate) + self.ape[positions.remainder(self.ratio)]
        return k, z

    def _pool(self, buf_k: torch.Tensor, buf_z: torch.Tensor, has_prev: torch.Tensor, out_dtype: torch.dtype):
        """Entries of windows from their slot rows buf_k, buf_z [w, span, coff*dim] (fp32).

        With overlap the first `ratio` slots are the previous window's first channel half (padding where
        has_prev [w, ratio] is False: score -inf, value 0) and the last `ratio` slots the window's own second
        half. Returns RMS-normed entries [w, dim] in out_dtype (RoPE / simulation are the caller's `finish`).
        """
        if self.overlap:
            m, d, first = self.ratio, self.dim, has_prev[..., None]
            kv = torch.cat((torch.where(first, buf_k[:, :m, :d], 0.0), buf_k[:, m:, d:]), dim=1)
            sc = torch.cat((torch.where(first, buf_z[:, :m, :d], float("-inf")), buf_z[:, m:, d:]), dim=1)
        else:
            kv, sc = buf_k, buf_z
        return tk.rms_norm(tk.softmax_pool(kv, sc).to(out_dtype), self.norm, self.eps)

    def run_prefill(
        self,
        k: torch.Tensor,
        z: torch.Tensor,
        plan: PrefillPlan,
        tail_k: torch.Tensor,
        tail_z: torch.Tensor,
        finish: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        out_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pool every window that closes inside any chunk of the step, in one pass, and update the tails.

        k, z: [T, coff*dim] fp32 for all tokens of the step; plan: from `compressor_plan.plan_prefill`, on the
        device; tail_k, tail_z: [num_slots, tail_rows, coff*dim] (updated in place); finish(entries [w, dim],
        positions [w]) applies RoPE / simulation. Returns (window slots [w], entry ids [w], entries [w, dim]).
        """
        vk = torch.cat((tail_k[plan.tail_slot, plan.tail_row], k))
        vz = torch.cat((tail_z[plan.tail_slot, plan.tail_row], z))
        tail_k[plan.upd_slot, plan.upd_row] = vk[plan.upd_vidx]
        tail_z[plan.upd_slot, plan.upd_row] = vz[plan.upd_vidx]
        if plan.win_j.numel() == 0:
            return plan.win_slot, plan.win_j, k.new_zeros(0, self.dim, dtype=out_dtype)
        idx = plan.win_vidx.clamp(min=0)
        entries = self._pool(vk[idx], vz[idx], plan.win_vidx[:, : self.ratio] >= 0, out_dtype)
        return plan.win_slot, plan.win_j, finish(entries, plan.win_j * self.ratio)

    def run_decode(
        self,
        k: torch.Tensor,
        z: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        tail_k: torch.Tensor,
        tail_z: torch.Tensor,
        finish: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        out_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One new token per sequence, all sequences at once, without host syncs (CUDA-graph safe).

        k, z: [b, coff*dim]; positions, slots: [b]; tail_k, tail_z: [num_slots, tail_rows, coff*dim] (all slots).
        Writes each token into its slot's tail row p % tail_rows (the row it replaces is older than any window
        still open), then pools a window ending at every token. Only tokens that close a window
        ((p + 1) % ratio == 0) hold a real entry: the caller stores the others in the trash row.
        Returns (closes [b] bool, entry ids [b] int64, entries [b, dim]).
        """
        m = self.ratio
        tail_k[slots, positions.remainder(self.tail_rows)] = k
        tail_z[slots, positions.remainder(self.tail_rows)] = z
        closes = (positions + 1).remainder(m) == 0
        j = torch.div(positions, m, rounding_mode="floor")
        span = 2 * m if self.overlap else m
        pos = (j[:, None] + 1) * m - span + torch.arange(span, device=k.device)[None, :]  # [b, span]
        rows = pos.remainder(self.tail_rows)
        entries = self._pool(tail_k[slots[:, None], rows], tail_z[slots[:, None], rows], pos[:, :m] >= 0, out_dtype)
        return closes, j, finish(entries, j * m)
