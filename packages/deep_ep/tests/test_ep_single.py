"""Single-process (world size 1) properties of Buffer: the FP8 quantiser, edge cases and bad input."""

from __future__ import annotations

import pytest
import torch
from ep_low_latency import scales64

from deepinfer.deep_ep import Buffer, DispatchHandle, LowLatencyHandle, per_token_cast_to_fp8

E = 8


def _topk(t: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(t, E, generator=g).argsort(dim=1)[:, :k]
    idx[torch.rand(t, k, generator=g) < 0.3] = -1
    return idx, torch.rand(t, k, generator=g) + 0.1


@pytest.mark.parametrize("round_scale,ue8m0", [(False, False), (True, False), (True, True)])
def test_per_token_cast_to_fp8_error_bound(round_scale: bool, ue8m0: bool) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 512, generator=g) * torch.exp2(torch.randint(-8, 8, (7, 1), generator=g).float())
    x[2, 128:256] = 0  # an all-zero block: the amax floor keeps its scale finite
    values, sf = per_token_cast_to_fp8(x.bfloat16(), round_scale, ue8m0)
    assert values.dtype == torch.float8_e4m3fn and sf.shape == (7, 4)
    assert sf.dtype == (torch.float8_e8m0fnu if ue8m0 else torch.float32)
    s = scales64(sf)
    if round_scale:
        assert torch.equal(torch.log2(s), torch.log2(s).round())  # powers of two
    xb = x.bfloat16().double()
    # e4m3: 3 mantissa bits -> relative error <= 2^-4; below 2^-6 the spacing is 2^-9 -> absolute 2^-10.
    bound = 2.0**-4 * xb.abs() + 2.0**-10 * s.repeat_interleave(128, dim=1)
    err = (values.double() * s.repeat_interleave(128, dim=1) - xb).abs()
    assert bool((err <= bound).all())
    amax = xb.abs().unflatten(1, (4, 128)).amax(dim=2)
    ratio = (amax / s)[amax > 0]  # the scale maps the block's amax to (just under) 448, or 224..448 if rounded
    assert bool((ratio <= 448 * (1 + 2**-23)).all()) and bool((ratio >= (224 if round_scale else 447.99)).all())


def test_layout_counts_tokens_once_per_rank_and_expert() -> None:
    idx = torch.tensor([[0, 1, -1], [-1, -1, -1], [7, 3, 2]])
    per_rank, per_expert, in_rank = Buffer(None).get_dispatch_layout(idx, E)
    assert per_rank.tolist() == [2] and in_rank.tolist() == [[True], [False], [True]]
    assert per_expert.tolist() == [1, 1, 1, 1, 0, 0, 0, 1]


def test_normal_dispatch_world1_is_a_permutation() -> None:
    idx, w = _topk(12, 3, 1)
    idx[4] = -1  # routed nowhere
    x = torch.randn(12, 64).bfloat16()
    buf = Buffer(None)
    recv_x, recv_idx, recv_w, counts, handle = buf.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=E)
    sent = (idx >= 0).any(dim=1)
    assert torch.equal(recv_x, x[sent]) and torch.equal(recv_idx, idx[sent])
    assert torch.equal(recv_w, torch.where(idx >= 0, w, 0.0)[sent])
    assert counts == [int((idx == e).any(dim=1).sum()) for e in range(E)]
    assert isinstance(handle, DispatchHandle) and handle.num_recv_tokens == int(sent.sum())
    y = torch.randn(handle.num_recv_tokens, 64).bfloat16()
    combined = buf.combine(y, handle)
    assert torch.equal(combined[sent], y) and not combined[~sent].any()


def test_empty_inputs() -> None:
    buf = Buffer(None)
    idx, w = torch.empty(0, 6, dtype=torch.int64), torch.empty(0, 6)
    recv_x, recv_idx, _, counts, handle = buf.dispatch(torch.empty(0, 128).bfloat16(), None, None, None,
                                                       torch.zeros(E, dtype=torch.int32), idx, w)  # fmt: skip
    assert recv_x.shape == (0, 128) and recv_idx.shape == (0, 6) and counts == [0] * E
    assert buf.combine(torch.empty(0, 128).bfloat16(), handle).shape == (0, 128)
    (vals, sf), count, ll_handle, hook = buf.low_latency_dispatch(torch.empty(0, 128).bfloat16(), idx, 4, E)
    hook()
    assert vals.shape == (E, 4, 128) and sf.shape == (E, 4, 1) and not count.any()
    combined, _ = buf.low_latency_combine(torch.randn(E, 4, 128).bfloat16(), idx, w, ll_handle)
    assert combined.shape == (0, 128)


def test_low_latency_out_buffer_and_fp32() -> None:
    buf = Buffer(None)
    idx, w = _topk(5, 2, 2)
    x = torch.randn(5, 96)
    recv_x, count, handle, _ = buf.low_latency_dispatch(x, idx, 8, E, use_fp8=False)
    assert isinstance(handle, LowLatencyHandle) and recv_x.dtype == torch.float32
    out = torch.full((5, 96), float("nan"))
    combined, _ = buf.low_latency_combine(recv_x * 2, idx, w, handle, out=out)
    want = 2 * x * torch.where(idx >= 0, w, 0.0).sum(dim=1, keepdim=True)
    # Same-sign terms (w > 0): a few float32 roundings on each side, each <= 2^-24 of the result.
    assert combined is out and torch.allclose(out, want, rtol=8 * 2**-24, atol=0)


def test_bad_input() -> None:
    buf = Buffer(None)
    idx, w = _topk(4, 2, 5)
    x = torch.randn(4, 128).bfloat16()
    with pytest.raises(TypeError, match="group: expected"):
        Buffer("world")
    with pytest.raises(ValueError, match="num_nvl_bytes: expected an int >= 0"):
        Buffer(None, num_nvl_bytes=-1)
    with pytest.raises(ValueError, match="topk_idx: expected expert ids"):
        buf.get_dispatch_layout(torch.tensor([[0, E]]), E)
    with pytest.raises(TypeError, match="topk_idx: expected dtype"):
        buf.get_dispatch_layout(idx.float(), E)
    with pytest.raises(ValueError, match="topk_weights: expected shape"):
        buf.dispatch(x, topk_idx=idx, topk_weights=w[:, :1], num_experts=E)
    with pytest.raises(ValueError, match="num_experts: required"):
        buf.dispatch(x, topk_idx=idx, topk_weights=w)
    with pytest.raises(TypeError, match=r"x\[1\] \(scales\): expected dtype"):
        buf.dispatch((x.to(torch.float8_e4m3fn), torch.ones(4, 1).half()), topk_idx=idx, topk_weights=w, num_experts=E)
    handle = buf.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=E)[4]
    with pytest.raises(ValueError, match="x: expected shape"):
        buf.combine(torch.randn(handle.num_recv_tokens + 1, 128).bfloat16(), handle)
    with pytest.raises(ValueError, match="x: expected 4 tokens"):
        buf.dispatch(x[:3], handle)
    with pytest.raises(ValueError, match="same expert twice"):
        buf.low_latency_dispatch(x, torch.tensor([[1, 1]] * 4), 4, E)
    with pytest.raises(ValueError, match="num_max_dispatch_tokens_per_rank: expected an int >= 4"):
        buf.low_latency_dispatch(x, idx, 3, E)
    with pytest.raises(ValueError, match="hidden % 128"):
        buf.low_latency_dispatch(torch.randn(4, 96).bfloat16(), idx, 4, E)
    with pytest.raises(ValueError, match="use_ue8m0: requires round_scale"):
        buf.low_latency_dispatch(x, idx, 4, E, use_ue8m0=True)
    recv, _, ll_handle, _ = buf.low_latency_dispatch(x, idx, 4, E, use_fp8=False)
    with pytest.raises(NotImplementedError, match="use_logfmt"):
        buf.low_latency_combine(recv, idx, w, ll_handle, use_logfmt=True)
    with pytest.raises(ValueError, match="topk_idx: differs"):
        buf.low_latency_combine(recv, torch.where(idx >= 0, (idx + 1) % E, -1), w, ll_handle)
    with pytest.raises(TypeError, match="handle: expected a LowLatencyHandle"):
        buf.low_latency_combine(recv, idx, w, handle)
