"""When decode steps may be captured as CUDA graphs (logic only: runs without a GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from deepinfer.engine.graphs import DecodeGraphs, bucket_sizes, graphs_enabled


def _model(grouped: list[bool], mtp_grouped: bool = False) -> SimpleNamespace:
    block = lambda g: SimpleNamespace(moe=SimpleNamespace(grouped=object() if g else None))  # noqa: E731
    return SimpleNamespace(blocks=[block(g) for g in grouped], mtp=[SimpleNamespace(block=block(mtp_grouped))])


def test_gate(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.delenv("DEEPINFER_CUDA_GRAPHS", raising=False)
    assert graphs_enabled(_model([True, True]), cuda)  # MTP blocks are not part of the captured step
    assert not graphs_enabled(_model([True, False]), cuda)  # a host-synced expert loop cannot be captured
    assert not graphs_enabled(_model([True, True]), torch.device("cpu"))
    monkeypatch.setenv("DEEPINFER_CUDA_GRAPHS", "0")
    assert not graphs_enabled(_model([True, True]), cuda)


def test_buckets_cover_every_batch_size():
    g = DecodeGraphs.__new__(DecodeGraphs)  # bucket logic only: no CUDA needed
    g.buckets = bucket_sizes(100)
    assert g.buckets[0] == 1 and g.buckets[-1] == 100 and g.buckets == sorted(set(g.buckets))
    assert [g.bucket(n) for n in (1, 3, 17, 33, 100)] == [1, 4, 24, 48, 100]
    assert g.bucket(101) is None
