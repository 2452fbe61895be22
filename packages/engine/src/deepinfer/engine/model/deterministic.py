"""Run-to-run deterministic alternatives to atomic GPU reductions (`DEEPINFER_DETERMINISTIC`, default on).

On CUDA, `Tensor.index_add_` on floats with repeated indices adds with atomics: the summation order, and so the
rounded result, changes from run to run. The MoE combine (sum over a token's k expert outputs) is such a case;
with random or near-tied logits one flipped bit flips greedy tokens. `combine_rows` sums each token's rows in a
fixed order instead (ascending pair position = ascending expert id, the order CPU index_add_ uses), so it is
bit-equal to the CPU `index_add_` result and identical run to run on the GPU. `combine_weighted` (session 8) does
the MoE case (weighted rows) in one tile_kernels `moe_unpermute` launch plus a sort, with the same bits.
"""

from __future__ import annotations

import os

import torch

from deepinfer import tile_kernels as tk

_GATHER_ALL_MAX = 1 << 24  # src elements (64 MiB fp32) up to which combine_rows gathers all rows at once


def deterministic_enabled() -> bool:
    """True unless DEEPINFER_DETERMINISTIC=0. Read at call time (CUDA graphs bake the choice in at capture)."""
    return os.environ.get("DEEPINFER_DETERMINISTIC", "1") != "0"


def combine_rows(num_rows: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """out[r] = sum of src[p] over p with index[p] == r, in ascending p; fp32 [num_rows, H].

    index: [P] int64 with every row appearing exactly P // num_rows times (MoE: each token has k pairs);
    src: [P, H]. Same value as zeros([num_rows, H]).index_add_(0, index, src) on the CPU, bit for bit, and the
    same bits on every GPU run. Shapes only (no host sync): usable inside CUDA graphs.
    """
    if index.dim() != 1 or src.dim() != 2 or src.shape[0] != index.shape[0]:
        raise ValueError(
            f"combine_rows: expected index [P] and src [P, H], got {tuple(index.shape)}, {tuple(src.shape)}"
        )
    out = torch.zeros(num_rows, src.shape[1], dtype=torch.float32, device=src.device)
    if num_rows == 0 or index.numel() == 0:
        return out
    pos = _pair_positions(num_rows, index, "combine_rows")
    k = pos.shape[1]
    src = src.float()
    # k fixed-order adds (0 + a + b + ...): the same rounding as a sequential index_add_. Small inputs (decode)
    # gather all k rows in one kernel; large ones (prefill) gather one column at a time to bound the extra memory.
    if src.numel() <= _GATHER_ALL_MAX:
        rows = src[pos]  # [num_rows, k, H]
        for j in range(k):
            out += rows[:, j]
    else:
        for j in range(k):
            out += src[pos[:, j]]
    return out


def _pair_positions(num_rows: int, index: torch.Tensor, name: str) -> torch.Tensor:
    """[num_rows, k] int64: row r's pair positions p (index[p] == r) in ascending order (a stable sort by row)."""
    if index.numel() % num_rows:
        raise ValueError(f"{name}: expected P divisible by num_rows={num_rows}, got P={index.numel()}")
    # tile_kernels' rank sort at decode sizes (one launch; torch's radix sort was ~5 % of a decode step)
    return tk.stable_argsort(index).view(num_rows, index.numel() // num_rows)


def combine_weighted(num_rows: int, index: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """out[r] = sum of y[p].float() * w[p] over p with index[p] == r, in ascending p; fp32 [num_rows, H].

    index: [P] int64, every row exactly P // num_rows times; y: [P, H] float (bf16 expert outputs); w: [P] fp32.
    Bit-equal to `combine_rows(num_rows, index, y.float() * w[:, None])` (each product rounded to fp32, then added
    from 0 in ascending p), but without the [P, H] fp32 product tensor and the k separate adds: one stable sort of
    `index` gives each row's pair positions, which tile_kernels' `moe_unpermute` (fixed slot order, no atomics, no
    FMA contraction; Triton on CUDA) reads as its src_map. Shapes only (no host sync): usable inside CUDA graphs.
    """
    if index.dim() != 1 or y.dim() != 2 or w.dim() != 1 or not (y.shape[0] == w.shape[0] == index.shape[0]):
        raise ValueError(
            "combine_weighted: expected index [P], y [P, H], w [P], got "
            f"{tuple(index.shape)}, {tuple(y.shape)}, {tuple(w.shape)}"
        )
    if num_rows == 0 or index.numel() == 0:
        return torch.zeros(num_rows, y.shape[1], dtype=torch.float32, device=y.device)
    pos = _pair_positions(num_rows, index, "combine_weighted")
    return tk.moe_unpermute(y, pos, w.float()[pos], out_dtype=torch.float32)


def add_rows(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """out.index_add_(0, index, src), deterministic on CUDA when the flag is on (see `combine_rows`)."""
    if out.is_cuda and deterministic_enabled():
        return out.add_(combine_rows(out.shape[0], index, src))
    return out.index_add_(0, index, src)
