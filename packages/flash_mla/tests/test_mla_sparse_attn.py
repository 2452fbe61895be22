"""sparse_attn_prefill / sparse_attn_decode against an independent float64 dense oracle (reference path)."""

from __future__ import annotations

import zlib

import pytest
import torch
from mla_checks import assert_attention_close, dense_oracle, poison_unused, ragged_indices

from deepinfer.flash_mla import api

D = 512
SCALE = D**-0.5


def _sink(mode: str, h: int, g: torch.Generator) -> torch.Tensor | None:
    """None, one dominating every logit (large), one negligible (small), or random."""
    if mode == "none":
        return None
    base = {"large": 14.0, "small": -40.0, "random": 0.0}[mode]
    return base + torch.randn(h, generator=g)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("sink_mode", ["none", "large", "small", "random"])
@pytest.mark.parametrize("with_extra", [False, True])
def test_prefill_vs_dense(dtype: torch.dtype, sink_mode: str, with_extra: bool) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(f"{dtype}{sink_mode}{with_extra}".encode()))
    t, h, n, n2 = 7, 8, 150, 40
    q = (3 * torch.randn(t, h, D, generator=g)).to(dtype)  # spread logits over several units
    kv = torch.randn(n, D, generator=g).to(dtype)
    counts = [32, 0, 1, 17, 5, 32, 9]  # ragged, one row with no main index at all
    idx = ragged_indices(t, 32, torch.arange(n - 30), g, counts)  # last 30 slots never named
    ex_kv = torch.randn(n2, D, generator=g).to(dtype) if with_extra else None
    ex_idx = ragged_indices(t, 16, torch.arange(n2), g, [3, 0, 16, 0, 8, 1, 2]) if with_extra else None
    kv = poison_unused(kv, [idx])
    if ex_kv is not None:
        ex_kv = poison_unused(ex_kv, [ex_idx])
    sink = _sink(sink_mode, h, g)
    out = torch.full((t, h, D), float("nan"), dtype=dtype)  # poisoned: every element must be written
    got, lse = api.sparse_attn_prefill(q, kv, idx, sink, SCALE, extra_kv=ex_kv, extra_indices=ex_idx, out=out)
    assert got is out and lse.dtype == torch.float32 and lse.shape == (t, h)
    caches, lists = [kv], [idx]
    if ex_kv is not None:
        caches, lists = [kv, ex_kv], [idx, ex_idx]
    assert_attention_close(got, lse, dense_oracle(q, caches, lists, sink, SCALE, dtype))


def test_rows_without_valid_index() -> None:
    g = torch.Generator().manual_seed(5)
    t, h = 3, 4
    q = torch.randn(t, h, D, generator=g).bfloat16()
    kv = torch.randn(10, D, generator=g).bfloat16()
    idx = torch.tensor([[-1, -1], [3, -1], [10, -7]], dtype=torch.int32)  # out-of-range values are holes too
    sink = torch.randn(h, generator=g)
    for s in (sink, None):
        out = torch.full((t, h, D), float("nan"), dtype=torch.bfloat16)
        o, lse = api.sparse_attn_prefill(q, kv, idx, s, SCALE, out=out)
        for r in (0, 2):
            assert bool((o[r] == 0).all())
            assert torch.equal(lse[r], sink) if s is not None else bool(torch.isneginf(lse[r]).all())
        assert_attention_close(o, lse, dense_oracle(q, [kv], [idx], s, SCALE, torch.bfloat16))


def test_return_lse_false() -> None:
    g = torch.Generator().manual_seed(6)
    q, kv = torch.randn(2, 4, D, generator=g), torch.randn(8, D, generator=g)
    idx = torch.tensor([[0, 5], [7, -1]], dtype=torch.int32)
    o, lse = api.sparse_attn_prefill(q, kv, idx, None, SCALE, return_lse=False)
    assert lse is None and torch.equal(o, api.sparse_attn_prefill(q, kv, idx, None, SCALE)[0])


def _paged(num_blocks: int, bs: int, length: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A shuffled block table for one logical sequence, and slot_of[pos] = block * bs + offset."""
    table = torch.randperm(num_blocks, generator=g)[: -(-length // bs)]
    pos = torch.arange(length)
    return table, table[pos // bs] * bs + pos % bs


def test_paged_cache_equals_logical_sequence() -> None:
    g = torch.Generator().manual_seed(7)
    bs, num_blocks, length, t, h = 64, 8, 300, 5, 8
    table, slot_of = _paged(num_blocks, bs, length, g)
    logical = torch.randn(length, D, generator=g).bfloat16()
    cache = torch.full((num_blocks, bs, D), float("nan"), dtype=torch.bfloat16)
    cache.view(-1, D)[slot_of] = logical
    pos_idx = ragged_indices(t, 48, torch.arange(length), g)
    slots = torch.where(pos_idx >= 0, slot_of[pos_idx.clamp(min=0).long()], -1).to(torch.int32)
    q = torch.randn(t, h, D, generator=g).bfloat16()
    sink = torch.randn(h, generator=g)
    o, lse = api.sparse_attn_prefill(q, cache, slots, sink, SCALE)
    assert_attention_close(o, lse, dense_oracle(q, [logical], [pos_idx], sink, SCALE, torch.bfloat16))
    o2, lse2 = api.sparse_attn_prefill(q, cache.view(-1, D), slots, sink, SCALE)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("s_q", [1, 2, 8])
@pytest.mark.parametrize("fp8", [False, True])
def test_decode_vs_dense(s_q: int, fp8: bool) -> None:
    g = torch.Generator().manual_seed(20 + s_q + 100 * fp8)
    b, h, bs, num_blocks, topk, win = 3, 8, 64, 6, 40, 16
    kv = torch.randn(num_blocks, bs, D, generator=g).bfloat16()
    idx = ragged_indices(b * s_q, topk, torch.arange(num_blocks * bs - 64), g).view(b, s_q, topk)
    ex_kv = torch.randn(b * win, D, generator=g).bfloat16()
    ex_idx = ragged_indices(b * s_q, win, torch.arange(b * win), g).view(b, s_q, win)
    kv, ex_kv = poison_unused(kv, [idx]), poison_unused(ex_kv, [ex_idx])
    cache = api.pack_fp8_kv(kv.nan_to_num()) if fp8 else kv
    if fp8:  # unused FP8 slots: NaN payload and NaN (255) scale bytes
        unused = torch.isnan(kv.view(-1, D)[:, 0])
        cache.view(-1, 584)[unused] = 0xFF
    q = torch.randn(b, s_q, h, D, generator=g).bfloat16()
    sink = torch.randn(h, generator=g)
    meta = api.get_decode_metadata(b, s_q, h, topk, extra_topk=win)
    out = torch.full((b, s_q, h, D), float("nan"), dtype=torch.bfloat16)
    o, lse = api.sparse_attn_decode(
        q, cache, idx, sink, SCALE, extra_kv=ex_kv, extra_indices=ex_idx, metadata=meta, out=out
    )
    assert o is out and o.shape == (b, s_q, h, D) and lse.shape == (b, s_q, h)
    dense_kv = api.unpack_fp8_kv(cache, torch.float32) if fp8 else kv
    want = dense_oracle(
        q.view(-1, h, D), [dense_kv, ex_kv], [idx.view(-1, topk), ex_idx.view(-1, win)], sink, SCALE, torch.bfloat16
    )
    assert_attention_close(o.view(-1, h, D), lse.view(-1, h), want)


def test_fp8_cache_equals_dequantised_bf16_cache() -> None:
    g = torch.Generator().manual_seed(30)
    t, h, n = 6, 8, 200
    kv = (torch.randn(n, D, generator=g) * 2.0 ** torch.randint(-6, 6, (n, 1), generator=g)).bfloat16()
    packed = api.pack_fp8_kv(kv)
    deq = api.unpack_fp8_kv(packed)
    idx = ragged_indices(t, 64, torch.arange(n), g)
    ex_idx = ragged_indices(t, 8, torch.arange(n), g)
    q, sink = torch.randn(t, h, D, generator=g).bfloat16(), torch.randn(h, generator=g)
    a = api.sparse_attn_prefill(q, packed, idx, sink, SCALE, extra_kv=packed, extra_indices=ex_idx)
    b = api.sparse_attn_prefill(q, deq, idx, sink, SCALE, extra_kv=deq, extra_indices=ex_idx)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_decode_metadata_checks() -> None:
    q = torch.randn(2, 3, 4, D)
    kv = torch.randn(16, D)
    idx = torch.zeros(2, 3, 5, dtype=torch.int32)
    with pytest.raises(ValueError, match="metadata"):
        api.sparse_attn_decode(q, kv, idx, None, SCALE, metadata=api.get_decode_metadata(2, 3, 4, 6))
    with pytest.raises(ValueError, match="s_q"):
        api.get_decode_metadata(2, 9, 4, 5)
    with pytest.raises(ValueError, match="query tokens"):
        api.sparse_attn_decode(torch.randn(2, 9, 4, D), kv, torch.zeros(2, 9, 5, dtype=torch.int32), None, SCALE)
    with pytest.raises(TypeError, match="metadata"):
        api.sparse_attn_decode(q, kv, idx, None, SCALE, metadata=(2, 3))


_Q, _KV, _IDX = torch.randn(3, 4, D), torch.randn(10, D), torch.zeros(3, 5, dtype=torch.int32)


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        (dict(q=torch.randn(3, 4, D).half()), TypeError, "q"),
        (dict(kv=torch.randn(10, D - 1)), ValueError, "kv"),
        (dict(kv=torch.zeros(10, 576, dtype=torch.uint8)), ValueError, "kv"),
        (dict(q=torch.randn(3, 4, 256), kv=torch.zeros(10, 584, dtype=torch.uint8)), ValueError, "kv"),
        (dict(indices=torch.zeros(3, 5, dtype=torch.int64)), TypeError, "indices"),
        (dict(indices=torch.zeros(2, 5, dtype=torch.int32)), ValueError, "indices"),
        (dict(sink=torch.zeros(5)), ValueError, "sink"),
        (dict(sink=torch.zeros(4, dtype=torch.float64)), TypeError, "sink"),
        (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
        (dict(softmax_scale=True), TypeError, "softmax_scale"),
        (dict(extra_kv=_KV), ValueError, "extra"),
        (dict(extra_kv=_KV, extra_indices=torch.zeros(2, 5, dtype=torch.int32)), ValueError, "extra_indices"),
        (dict(out=torch.zeros(3, 4, D, dtype=torch.bfloat16)), TypeError, "out"),
    ],
)
def test_prefill_rejects_bad_arguments(kwargs: dict, exc: type, name: str) -> None:
    args = dict(q=_Q, kv=_KV, indices=_IDX, sink=None, softmax_scale=SCALE) | kwargs
    pos = [args.pop(k) for k in ("q", "kv", "indices", "sink", "softmax_scale")]
    with pytest.raises(exc, match=name):
        api.sparse_attn_prefill(*pos, **args)
