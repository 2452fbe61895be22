"""Counter-based sampling noise: the Exp(1) draw of (request seed, step, token id), computed for a whole batch.

Session 8 replaced the per-row `torch.Generator` (one generator, one float64 `exponential_` and ~8 launches per
sampled row: 12.0 vs 4.1 ms per decode step at batch 32 on the H200, session 7) with a hash of the counter: token
i of the row with generator seed r draws u = (splitmix64(splitmix64(r) + (i + 1) * G) >> 11 + 1) * 2^-53 in
(0, 1] and E = -log(u). The noise of a row depends on (r, i) only, never on the batch or the device: CPU and CUDA
draw the same bits (integer ops, then one float64 log), so seeded sampling is reproducible across devices too.

torch has no unsigned 64-bit arithmetic, so the hash runs on int64 with two's-complement wrap-around (what torch's
CPU and CUDA multiplications do; `splitmix64_py` is the plain-Python oracle the tests compare against) and with
logical right shifts written as an arithmetic shift plus a mask.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _signed(v: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return v - (1 << 64) if v >= 1 << 63 else v


def splitmix64_py(x: int) -> int:
    """The splitmix64 finaliser on an unsigned 64-bit int (pure Python; the oracle of `_mix`)."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return x ^ (x >> 31)


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits by s (torch's >> on int64 is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 on int64 tensors (bits as unsigned, wrap-around): the same bits as `splitmix64_py`."""
    x = x + _signed(_GOLDEN)
    x = (x ^ _srl(x, 30)) * _signed(_M1)
    x = (x ^ _srl(x, 27)) * _signed(_M2)
    return x ^ _srl(x, 31)


def row_keys(row_seeds: list[int], device: torch.device) -> torch.Tensor:
    """int64 [B]: splitmix64(r) of each row's seed r, as int64 bits (the per-row key of the token hash)."""
    return _mix(torch.tensor([_signed(r & _MASK64) for r in row_seeds], dtype=torch.int64, device=device))


def uniform_bits(row_seeds: list[int], vocab: int, device: torch.device) -> torch.Tensor:
    """int64 [B, vocab] in [0, 2^53): the 53 high bits of splitmix64(splitmix64(r) + (i + 1) * G) per (row r, i)."""
    key = row_keys(row_seeds, device)[:, None]  # [B, 1]
    ids = torch.arange(1, vocab + 1, dtype=torch.int64, device=device) * _signed(_GOLDEN)
    return _srl(_mix(key + ids[None, :]), 11)


def exponential_noise(row_seeds: list[int], vocab: int, device: torch.device) -> torch.Tensor:
    """float64 [B, vocab] Exp(1) draws E = -log(u), u = (bits + 1) * 2^-53 in (0, 1] (E = 0 has probability 2^-53)."""
    u = (uniform_bits(row_seeds, vocab, device) + 1).double() * 2.0**-53
    return -torch.log(u)
