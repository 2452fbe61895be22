"""The fast path's index arithmetic, simulated for R ranks in one process (no communication, no tensors).

Each simulated rank writes its rows into the others' buffers at the offsets `Plan` gives; the result must
be exactly the reference's all-to-all (blocks by source rank, each in the sender's order), and combine's
writes must land back in each sender's send order, with no two writes to one slot.
"""

from __future__ import annotations

import random

import pytest

from deepinfer.deep_ep._plan import Plan, align_up, field_offsets, grown_size, word_bytes


def _random_sends(world: int, rng: random.Random) -> list[list[list[tuple[int, int]]]]:
    """sends[s][d] = the rows (source, token) rank s sends to d, in send order; some empty, some ranks idle."""
    sends = []
    for s in range(world):
        tokens = rng.choice([0, 1, 5, 17])
        per_dst = [[(s, t) for t in range(tokens) if rng.random() < 0.6] for _ in range(world)]
        sends.append(per_dst)
    return sends


@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_dispatch_and_combine_offsets_simulated(world: int) -> None:
    rng = random.Random(world)
    for _ in range(20):
        sends = _random_sends(world, rng)
        plan = Plan.of([[len(sends[s][d]) for d in range(world)] for s in range(world)])
        # Dispatch: s writes its block for d at recv_off(s, d) of d's buffer.
        bufs = [[None] * plan.dispatch_cap() for _ in range(world)]
        for s in range(world):
            for d in range(world):
                for i, row in enumerate(sends[s][d]):
                    slot = plan.recv_off(s, d) + i
                    assert bufs[d][slot] is None, "two rows written to one slot"
                    bufs[d][slot] = row
        for d in range(world):
            want = [row for s in range(world) for row in sends[s][d]]  # the reference's all_to_all order
            assert bufs[d][: plan.recv_total(d)] == want
            assert all(v is None for v in bufs[d][plan.recv_total(d) :])
        # Combine: d returns received row j of source s to s's buffer at send_off(s, d) + (j - recv_off(s, d)).
        back = [[None] * plan.combine_cap() for _ in range(world)]
        for d in range(world):
            for s in range(world):
                for j in range(plan.matrix[s][d]):
                    row = bufs[d][plan.recv_off(s, d) + j]
                    slot = plan.send_off(s, d) + j
                    assert back[s][slot] is None
                    back[s][slot] = (d, row)
        for s in range(world):
            want = [(d, row) for d in range(world) for row in sends[s][d]]  # s's send order, tagged by dest
            assert back[s][: plan.send_total(s)] == want


def test_plan_validates_and_sizes() -> None:
    plan = Plan.of([[1, 2], [3, 0]])
    assert (plan.send_off(0, 1), plan.recv_off(1, 0), plan.recv_off(1, 1)) == (1, 1, 2)
    assert (plan.dispatch_cap(), plan.combine_cap(), plan.send_total(1), plan.recv_total(1)) == (4, 3, 3, 2)
    with pytest.raises(ValueError, match="square"):
        Plan.of([[1, 2]])
    with pytest.raises(ValueError, match="non-negative"):
        Plan.of([[1, -2], [0, 0]])


def test_field_offsets_words_and_growth() -> None:
    offs, total = field_offsets([8192, 80, 3], 10)
    assert offs == [0, 81920, align_up(81920 + 800)] and total == align_up(offs[2] + 30)
    assert all(o % 256 == 0 for o in offs)
    assert [word_bytes(b) for b in (8192, 6, 3)] == [4, 2, 1]
    assert grown_size(10, 100) == 100
    assert grown_size(101, 100) == 1 << 24 and grown_size(100 << 20, 96 << 20) == 128 << 20
