"""Dispatch + combine (normal and low-latency, BF16 and FP8) on 1 rank in-process and on 2 / 3 gloo ranks."""

from __future__ import annotations

from ep_worker import launch, run_all


def test_world_size_1() -> None:
    run_all(None, seed=11)


def test_gloo_3_and_2_ranks() -> None:
    """Three spawned ranks run every scenario, then ranks 0 and 1 run them again as a 2-rank subgroup."""
    launch(3, seed=20)
