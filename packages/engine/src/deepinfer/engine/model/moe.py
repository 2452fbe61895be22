"""V4 MoE: router (sqrt-softplus scores, selection bias or hash table), routed experts, shared expert."""

from __future__ import annotations

import torch

from deepinfer import tile_kernels as tk

from ..config import ModelConfig
from ..weights import QWeight, linear, linear_fp32
from .moe_grouped import GroupedExperts, GroupedExpertsFP4, fp4_grouped_available, grouped_available


class Expert:
    """SwiGLU expert with V4's clamp: w2(silu(min(w1 x, L)) * clamp(w3 x, -L, L))."""

    def __init__(self, w1: QWeight, w2: QWeight, w3: QWeight, limit: float | None) -> None:
        self.w1, self.w2, self.w3, self.limit = w1, w2, w3, limit

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(tk.swiglu_clamp(linear(x, self.w1), linear(x, self.w3), self.limit), self.w2)


class MoE:
    """Routed experts (top-k of E) plus shared experts; `tid2eid` given => hash routing by token id."""

    def __init__(
        self,
        cfg: ModelConfig,
        gate: torch.Tensor,
        bias: torch.Tensor | None,
        tid2eid: torch.Tensor | None,
        experts: list[Expert],
        shared: Expert | None,
    ) -> None:
        self.cfg, self.gate, self.bias, self.tid2eid = cfg, gate.float(), bias, tid2eid
        self.gate_q = QWeight(gate)  # the CUDA router: `linear_fp32` (bf16 GEMM, fp32 products and sums)
        self.experts, self.shared = experts, shared
        self.grouped: GroupedExperts | GroupedExpertsFP4 | None = None

    def route(self, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] fp32, expert ids [T, k] int64); the router runs in fp32."""
        cfg = self.cfg
        logits = self._logits(x)
        if self.tid2eid is not None:
            return tk.hash_route(logits, token_ids, self.tid2eid, cfg.scoring_func, cfg.route_scale, cfg.norm_topk_prob)
        return tk.moe_route(
            logits, self.bias, cfg.num_experts_per_tok, cfg.scoring_func, cfg.route_scale, cfg.norm_topk_prob
        )

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 router logits [T, E] = x [T, hidden] @ gate^T with fp32 products and sums."""
        if x.is_cuda:
            return linear_fp32(x, self.gate_q)
        return x.float() @ self.gate.t()  # CPU: the reference's fp32 GEMM as before

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] normed FFN input; token_ids: [T]. Returns [T, hidden] in x.dtype."""
        weights, ids = self.route(x, token_ids)
        flat = ids.flatten()
        order = tk.stable_argsort(flat)  # = torch.argsort(flat, stable=True); one launch at decode sizes
        # scatter-add rather than bincount: bincount sizes its output from the data (a host sync)
        counts = torch.zeros(len(self.experts), dtype=torch.int64, device=x.device).index_add_(
            0, flat, torch.ones_like(flat)
        )
        tok = order // ids.shape[1]
        w = weights.flatten()[order]
        if self.grouped is None and fp4_grouped_available(x, self.experts):
            self.grouped = GroupedExpertsFP4(self.experts)
        elif self.grouped is None and grouped_available(x):
            self.grouped = GroupedExperts(self.experts, x.dtype)
        if self.grouped is not None:
            y = self.grouped(x, tok, w, counts)
        else:
            y = self._loop(x, tok, w, counts.tolist())
        if self.shared is not None:
            y += self.shared(x).float()
        return y.to(x.dtype)

    def _loop(self, x: torch.Tensor, tok: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Reference: one expert at a time over its expert-sorted pairs. Returns fp32 [T, hidden]."""
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        lo = 0
        for e, n in enumerate(counts):
            if n:
                rows = tok[lo : lo + n]
                y.index_add_(0, rows, self.experts[e](x[rows]).float() * w[lo : lo + n, None])
            lo += n
        return y
