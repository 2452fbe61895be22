"""Index arithmetic of the intranode fast path (pure Python: no tensors, unit-tested on CPU).

`M[s][d]` = rows rank s sends to rank d in one normal-mode dispatch (its tokens that have an expert on d).
Every rank knows the whole matrix after one exchange, so every rank derives the same offsets and
capacities without further communication:

- rank s's send order is grouped by destination rank: d's block starts at `send_off(s, d)`;
- rank d's receive order is grouped by source rank: s's block starts at `recv_off(s, d)`;
- in dispatch, rank s writes its block for d straight into d's buffer at `recv_off(s, d)`; in combine,
  rank d writes back the same rows into s's buffer at `send_off(s, d)`, i.e. in s's send order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALIGN = 256  # byte alignment of every field region inside a buffer (vector loads, any dtype view)


def align_up(n: int, a: int = ALIGN) -> int:
    """Smallest multiple of `a` >= n."""
    return -(-n // a) * a


@dataclass(frozen=True)
class Plan:
    """Offsets of one exchange from the count matrix M [R][R] (M[s][d] = rows s sends to d)."""

    matrix: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(matrix: Sequence[Sequence[int]]) -> Plan:
        """Validate a square matrix of non-negative ints."""
        m = tuple(tuple(int(v) for v in row) for row in matrix)
        r = len(m)
        if r == 0 or any(len(row) != r for row in m):
            raise ValueError(f"matrix: expected a square [R][R] matrix, got row lengths {[len(x) for x in m]}")
        if any(v < 0 for row in m for v in row):
            raise ValueError("matrix: expected non-negative counts")
        return Plan(m)

    @property
    def world(self) -> int:
        return len(self.matrix)

    def send_off(self, s: int, d: int) -> int:
        """Position of destination d's block in rank s's send order."""
        return sum(self.matrix[s][:d])

    def recv_off(self, s: int, d: int) -> int:
        """Position of source s's block in rank d's receive order."""
        return sum(self.matrix[q][d] for q in range(s))

    def send_total(self, s: int) -> int:
        return sum(self.matrix[s])

    def recv_total(self, d: int) -> int:
        return sum(self.matrix[q][d] for q in range(self.world))

    def dispatch_cap(self) -> int:
        """Rows the largest receiver gets (every rank sizes its dispatch regions for it)."""
        return max(self.recv_total(d) for d in range(self.world))

    def combine_cap(self) -> int:
        """Rows the largest sender gets back in combine."""
        return max(self.send_total(s) for s in range(self.world))


def field_offsets(row_bytes: Sequence[int], cap_rows: int) -> tuple[list[int], int]:
    """Byte offset of each field's region [cap_rows, row_bytes[i]] in a buffer, and the total bytes."""
    offs, at = [], 0
    for w in row_bytes:
        offs.append(at)
        at = align_up(at + cap_rows * w)
    return offs, at


def word_bytes(row_bytes: int) -> int:
    """Widest of 4 / 2 / 1 bytes that divides a row: rows move as int32 words when they can."""
    for w in (4, 2):
        if row_bytes % w == 0:
            return w
    return 1


def grown_size(need: int, have: int, granule: int = 1 << 24) -> int:
    """New buffer size for `need` bytes: at least 1.25x `have` (fewer regrowths), in 16 MiB granules."""
    if need <= have:
        return have
    return align_up(max(need, have + have // 4), granule)
