"""Dispatch + combine scenarios checked against a single-process computation.

Every rank builds the inputs of ALL ranks from one seed, runs its part through a `Buffer`, and checks what
it received and what combine returned against values computed locally from the global inputs. The same
code runs with world size 1 in the test process and with gloo process groups in spawned workers.
Experts are toy per-channel affine maps f_e(v) = v * s_e + b_e (cheap, and distinct per expert).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

K, HIDDEN = 6, 256
BF16_REL = 2.0**-8  # largest relative error of one rounding to bfloat16


@dataclass
class World:
    """The global inputs: per-rank x / topk, and the experts."""

    x: list[torch.Tensor]  # [t_r, HIDDEN] float32 values (exactly representable in bf16)
    topk_idx: list[torch.Tensor]  # [t_r, K] int64, -1 holes, distinct experts per row
    weights: list[torch.Tensor]  # [t_r, K] float32
    scale: torch.Tensor  # [E, HIDDEN]
    bias: torch.Tensor  # [E, HIDDEN]

    @property
    def num_experts(self) -> int:
        """E: 32, or 33 for 3 ranks (experts are split evenly over ranks)."""
        return self.scale.shape[0]


def make_world(world_size: int, seed: int) -> World:
    """Random inputs for every rank; rank 1 has no tokens, and some rows are fully masked."""
    g = torch.Generator().manual_seed(seed)
    num_experts = -(-32 // world_size) * world_size
    counts = [9, 0, 13, 4][:world_size] if world_size > 1 else [11]
    xs, idxs, ws = [], [], []
    for t in counts:
        xs.append(torch.randn(t, HIDDEN, generator=g).bfloat16().float())
        idx = torch.rand(t, num_experts, generator=g).argsort(dim=1)[:, :K]  # distinct experts per row
        idx[torch.rand(t, K, generator=g) < 0.25] = -1
        if t > 2:
            idx[1] = -1  # a token routed nowhere
        idxs.append(idx)
        ws.append(torch.rand(t, K, generator=g) + 0.1)
    experts = (torch.randn(num_experts, HIDDEN, generator=g), torch.randn(num_experts, HIDDEN, generator=g))
    return World(xs, idxs, ws, *experts)


def expert(w: World, e: int, v: torch.Tensor) -> torch.Tensor:
    """f_e(v) in the precision of v."""
    return v * w.scale[e].to(v.dtype) + w.bias[e].to(v.dtype)


def moe_oracle(w: World, x: torch.Tensor, idx: torch.Tensor, wt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 sum_k w_k f_k(x) per token (masked slots skipped) and its magnitude sum_k |w_k f_k(x)|."""
    ref = torch.zeros(x.shape, dtype=torch.float64)
    mag = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(idx.shape[1]):
            e = int(idx[t, k])
            if e >= 0:
                term = float(wt[t, k]) * expert(w, e, x[t].double())
                ref[t] += term
                mag[t] += term.abs()
    return ref, mag


def assert_within(got: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor, what: str) -> None:
    """Element-wise |got - ref| <= tol, with a message naming the worst excess."""
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    excess = (got.double() - ref).abs() - tol
    assert torch.isfinite(got.double()).all(), f"{what}: non-finite values"
    assert excess.numel() == 0 or float(excess.max()) <= 0, f"{what}: error exceeds bound by {float(excess.max()):.3e}"


def fp8_pair(x: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """An independent FP8 encoding of x: random power-of-two-ish per-128 scales, e4m3 values."""
    scales = torch.exp2(torch.randint(-2, 3, (x.shape[0], HIDDEN // 128), generator=g).float())
    values = (x / scales.repeat_interleave(128, dim=1)).to(torch.float8_e4m3fn)
    return values, scales


def fp8_dequant64(pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """float64 value of an (e4m3 [n, h], fp32 scales [n, h/128]) pair."""
    return pair[0].double() * pair[1].double().repeat_interleave(128, dim=1)


def expected_recv(w: World, rank: int, world_size: int) -> tuple[list[tuple[int, int]], torch.Tensor]:
    """(source rank, token) of every row this rank should receive, in order, and the rows' local top-k ids."""
    per_rank = w.num_experts // world_size
    rows, local = [], []
    for src in range(world_size):
        for t in range(w.x[src].shape[0]):
            ids = w.topk_idx[src][t]
            mine = (ids >= rank * per_rank) & (ids < (rank + 1) * per_rank)
            if bool(mine.any()):
                rows.append((src, t))
                local.append(torch.where(mine, ids - rank * per_rank, -1))
    return rows, torch.stack(local) if local else torch.empty(0, K, dtype=torch.int64)
