"""Tile configurations of the W4A8 grouped kernel (`triton_fp4_fp8_grouped.py`: FP4 e2m1 weights x FP8 e4m3
activations) and the metadata-only heuristic. No Triton import here (the API, tests and benchmark use it anywhere).

The kernel walks k in 32-deep groups (one FP8 dot per weight-scale group, see the kernel's docstring), so there
is no block_k: a config is the row tile (block_m, the MMA's N side after swap-AB), the weight-row tile (block_n,
the MMA's M side: 64 per warpgroup), warps, pipeline stages and split_k (k splits with fp32 partials).
"""

from __future__ import annotations

import dataclasses
import re

from .w4a16_configs import rows_per_group

__all__ = ["W4A8Config", "W4A8_DECODE", "W4A8_PREFILL", "W4A8_SWEEP", "default_w4a8_config", "parse_w4a8_config"]


@dataclasses.dataclass(frozen=True)
class W4A8Config:
    """block_m, block_n: powers of two >= 16; num_warps 1..16 (power of two); num_stages 1..8; split_k in
    {1, 2, 4, 8} (k must be a multiple of 128 * split_k)."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"{name}: expected a power of two >= 16, got {v!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps: expected 1, 2, 4, 8 or 16, got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"num_stages: expected an int in [1, 8], got {self.num_stages!r}")
        if self.split_k not in (1, 2, 4, 8):
            raise ValueError(f"split_k: expected 1, 2, 4 or 8, got {self.split_k!r}")

    @property
    def name(self) -> str:
        """Short id, e.g. 'a8m16n64w4s3' or 'a8m16n64w4s3x2' (split_k 2); `parse_w4a8_config` reads it back."""
        x = f"x{self.split_k}" if self.split_k > 1 else ""
        return f"a8m{self.block_m}n{self.block_n}w{self.num_warps}s{self.num_stages}{x}"


def parse_w4a8_config(name: str) -> W4A8Config:
    """'a8m16n64w4s3' -> W4A8Config(16, 64, 4, 3); '...x2' -> split_k 2; ValueError for anything else."""
    match = re.fullmatch(r"a8m(\d+)n(\d+)w(\d+)s(\d+)(?:x(\d+))?", name)
    if match is None:
        raise ValueError(f"config: expected a name like 'a8m16n64w4s3' or 'a8m16n64w4s3x2', got {name!r}")
    bm, bn, w, s, x = match.groups()
    return W4A8Config(int(bm), int(bn), int(w), int(s), int(x or 1))


# Untuned starting points (no GPU run yet). Decode: one warpgroup on 64 weight rows x 16 token rows (the smallest
# tl.dot; sm_90a compile, Triton 3.9: 104 registers, no spills). Prefill: 64 weight rows x 128 token rows, 8 warps
# (each weight converted once per 128 rows; 244 registers, no spills).
W4A8_DECODE = W4A8Config(16, 64, num_warps=4, num_stages=4)
W4A8_PREFILL = W4A8Config(128, 64, num_warps=8, num_stages=2)

W4A8_SWEEP: dict[str, tuple[W4A8Config, ...]] = {
    "decode": (
        W4A8_DECODE,
        W4A8Config(16, 128, num_warps=4, num_stages=4),  # twice the weight rows per program: fewer programs
        W4A8Config(16, 128, num_warps=8, num_stages=4),  # the same with two warpgroups (125 registers)
        W4A8Config(16, 64, num_warps=4, num_stages=4, split_k=2),  # twice the programs (few active experts)
    ),
    # The two 128-weight-row tiles spill 32-40 bytes in the sm_90a compile (255 registers): timed anyway.
    # (128 x 128 tiles spill ~400 bytes: left out.)
    "prefill": (
        W4A8_PREFILL,
        W4A8Config(64, 128, num_warps=8, num_stages=3),
        W4A8Config(32, 128, num_warps=4, num_stages=4),
    ),
}


def default_w4a8_config(m: int, g: int, expected_m: int | None = None) -> W4A8Config:
    """<= 16 rows per group (`rows_per_group`: expected_m, else ceil(m / g)): W4A8_DECODE, else W4A8_PREFILL."""
    return W4A8_DECODE if rows_per_group(m, g, expected_m) <= 16 else W4A8_PREFILL
