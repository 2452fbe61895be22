"""Triton radix-select top-k (`backends/cuda/triton_topk.py`) vs the pure PyTorch reference, exactly.

Every chosen set must equal the reference's, and after sorting by (value desc, index asc) the index lists must
be identical; the kernel's own layout (chosen columns ascending, then -1 padding) is checked too.
Without a GPU the kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1, set below before triton is
imported) on tiny rows (n <= 512); the `gpu` tests (skipped without CUDA) run the real sizes.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from ds_checks import DISTRIBUTIONS, check_topk, make_scores  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from deepinfer.deep_select import reference as ref  # noqa: E402
from deepinfer.deep_select.backends.cuda.triton_topk import topk_triton  # noqa: E402

_HAS_CUDA = torch.cuda.is_available()
_DEV = "cuda" if _HAS_CUDA else "cpu"
gpu = pytest.mark.gpu  # GPU-only: deselected on CPU by `-m "not gpu"`, selected by scripts/gpu_run.sh (-m gpu)
cpu_interp = pytest.mark.skipif(_HAS_CUDA or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter only")


def _scores(dist: str, b: int, n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """[b, n] CPU scores; adds 'signed_zeros' (+-0.0, a few +-1) and 'nan_inf' (NaN, +-inf, few finite)."""
    if dist == "nan_inf":
        r = torch.rand(b, n, generator=g)
        x = torch.randint(-1, 2, (b, n), generator=g).float()
        x = torch.where(
            r < 0.3, float("nan"), torch.where(r < 0.6, float("-inf"), torch.where(r < 0.7, float("inf"), x))
        )
        return x.to(dtype)
    if dist == "signed_zeros":
        r = torch.rand(b, n, generator=g)
        x = torch.where(r < 0.45, -0.0, torch.where(r < 0.9, 0.0, torch.where(r < 0.95, 1.0, -1.0)))
        return x.to(dtype)
    return make_scores(dist, b, n, dtype, g)


def _valid(b: int, n: int, lengths: torch.Tensor | None) -> torch.Tensor:
    col = torch.arange(n)[None, :]
    if lengths is None:
        return torch.ones(b, n, dtype=torch.bool)
    return col < lengths.long().clamp(0, n)[:, None]


def assert_matches_reference(scores: torch.Tensor, k: int, lengths: torch.Tensor | None, idx: torch.Tensor) -> None:
    """idx (any device) against reference.topk: same sets, same rank-sorted lists, ascending columns then -1."""
    scores, idx = scores.cpu(), idx.cpu()
    lengths = None if lengths is None else lengths.cpu()
    b, n = scores.shape
    assert idx.dtype == torch.int32 and tuple(idx.shape) == (b, k)
    want, _ = ref.topk(scores, k, lengths)
    keys = ref.order_keys(scores, _valid(b, n, lengths))
    for r in range(b):
        got_r, want_r = idx[r], want[r]
        m = int((want_r >= 0).sum())
        assert bool((got_r[m:] == -1).all()), f"row {r}: padding is not exactly slots {m}..{k - 1}"
        chosen = got_r[:m].long()
        assert bool((chosen >= 0).all()), f"row {r}: -1 among the first {m} slots"
        assert bool((chosen[1:] > chosen[:-1]).all()), f"row {r}: chosen columns not strictly ascending"
        assert set(chosen.tolist()) == set(want_r[:m].tolist()), f"row {r}: chosen set differs from reference"
        ranked = chosen[torch.argsort(keys[r, chosen], descending=True)]
        assert torch.equal(ranked.to(torch.int32), want_r[:m]), f"row {r}: rank-sorted list differs"


_CASES = [
    # dist, dtype, b, n, k, lengths mode, block
    ("normal", torch.float32, 3, 300, 20, "none", 64),
    ("normal", torch.float32, 2, 512, 512, "none", 128),
    ("normal_big", torch.float32, 2, 257, 64, "random", 64),
    ("normal_small", torch.float16, 2, 200, 33, "none", 1024),
    ("few_values", torch.float32, 3, 300, 1, "none", 64),
    ("few_values", torch.float32, 3, 300, 77, "random", 64),
    ("few_values", torch.bfloat16, 2, 512, 200, "none", 256),
    ("few_values", torch.float16, 2, 100, 99, "edges", 32),
    ("inf", torch.float32, 3, 300, 40, "none", 64),
    ("inf", torch.float32, 2, 300, 290, "random", 128),
    ("inf", torch.bfloat16, 2, 160, 150, "none", 64),
    ("nan_hot", torch.float32, 3, 300, 250, "none", 64),
    ("nan_hot", torch.float32, 2, 300, 30, "random", 64),
    ("nan_hot", torch.bfloat16, 2, 128, 127, "none", 32),
    ("nan_hot", torch.float16, 4, 96, 100, "edges", 32),
    ("nan_inf", torch.float32, 3, 300, 150, "none", 64),
    ("nan_inf", torch.float32, 3, 300, 250, "random", 64),
    ("nan_inf", torch.bfloat16, 2, 200, 180, "none", 32),
    ("all_equal", torch.float32, 2, 300, 17, "none", 64),
    ("all_equal", torch.bfloat16, 3, 300, 299, "random", 128),
    ("signed_zeros", torch.float32, 3, 300, 100, "none", 64),
    ("signed_zeros", torch.bfloat16, 2, 300, 200, "random", 64),
    ("signed_zeros", torch.float16, 2, 64, 40, "none", 16),
    ("bits_tiny", torch.float32, 2, 300, 50, "none", 64),
    ("bits_mid", torch.bfloat16, 2, 300, 150, "none", 64),
    ("bits_tiny", torch.float16, 2, 300, 120, "random", 128),
    ("bits_tiny", torch.bfloat16, 3, 138, 65, "none", 16),  # bf16 denormals (a float widening flushed them)
    ("bits_tiny", torch.bfloat16, 3, 88, 1, "edges", 256),
    ("normal", torch.float32, 4, 37, 50, "edges", 16),
    ("normal", torch.bfloat16, 1, 1, 1, "none", 16),
    ("normal", torch.float32, 1, 1, 3, "none", 16),
    ("few_values", torch.float32, 4, 200, 300, "edges", 64),
]


def _lengths(mode: str, b: int, n: int, g: torch.Generator) -> torch.Tensor | None:
    if mode == "none":
        return None
    if mode == "random":
        return torch.randint(0, n + 1, (b,), generator=g, dtype=torch.int32)
    return torch.tensor([-3, 0, n, n + 7][:b], dtype=torch.int32)  # clamped to [0, n] by contract


@pytest.mark.parametrize("case", range(len(_CASES)), ids=lambda i: "-".join(map(str, _CASES[i])))
def test_topk_triton_matches_reference(case: int) -> None:
    dist, dtype, b, n, k, mode, block = _CASES[case]
    g = torch.Generator().manual_seed(1000 + case)
    scores = _scores(dist, b, n, dtype, g)
    lengths = _lengths(mode, b, n, g)
    idx = topk_triton(scores.to(_DEV), k, lengths=None if lengths is None else lengths.to(_DEV), block=block)
    assert_matches_reference(scores, k, lengths, idx)
    check_topk(scores, k, lengths, idx.cpu(), None, False)


@settings(max_examples=25, deadline=None, database=None)
@given(
    dist=st.sampled_from((*DISTRIBUTIONS, "signed_zeros", "nan_inf")),
    dtype=st.sampled_from((torch.float32, torch.bfloat16, torch.float16)),
    b=st.integers(1, 3),
    n=st.integers(1, 160),
    k_extra=st.integers(-159, 20),
    mode=st.sampled_from(("none", "random", "edges")),
    block=st.sampled_from((16, 64, 256)),
    seed=st.integers(0, 2**31 - 1),
)
def test_topk_triton_random_cases(
    dist: str, dtype: torch.dtype, b: int, n: int, k_extra: int, mode: str, block: int, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    k = max(1, n + k_extra)
    scores = _scores(dist, b, n, dtype, g)
    lengths = _lengths(mode, b, n, g)
    idx = topk_triton(scores.to(_DEV), k, lengths=None if lengths is None else lengths.to(_DEV), block=block)
    assert_matches_reference(scores, k, lengths, idx)


def test_topk_triton_strided_input_and_out_buffer() -> None:
    """A transposed (non-contiguous) score view and a strided out buffer: every slot written, same result."""
    g = torch.Generator().manual_seed(7)
    base = make_scores("few_values", 200, 3, torch.float32, g).to(_DEV)
    scores = base.t()  # [3, 200], strides (1, 3)
    k = 60
    lengths = torch.tensor([200, 150, 5], dtype=torch.int32, device=_DEV)
    big = torch.full((3, 2 * k), 12345, dtype=torch.int32, device=_DEV)
    out = big[:, ::2]
    res = topk_triton(scores, k, lengths=lengths, out=out, block=64)
    assert res.data_ptr() == out.data_ptr()
    assert_matches_reference(scores, k, lengths, out)
    assert bool((big[:, 1::2] == 12345).all()), "wrote outside the out view"


def test_topk_triton_bf16_equals_fp32_of_same_values() -> None:
    """bf16 widens exactly: the bf16 input and its fp32 copy select the same columns."""
    g = torch.Generator().manual_seed(3)
    s16 = make_scores("bits_mid", 2, 256, torch.bfloat16, g).to(_DEV)
    a = topk_triton(s16, 100, block=64)
    b = topk_triton(s16.float(), 100, block=64)
    assert torch.equal(a, b)


def test_topk_triton_empty_batch() -> None:
    out = topk_triton(torch.empty(0, 10, device=_DEV), 4)
    assert tuple(out.shape) == (0, 4) and out.dtype == torch.int32


# ---- GPU only: the real sizes ----


@gpu
@pytest.mark.parametrize(
    "dist", ["normal", "few_values", "inf", "nan_hot", "all_equal", "bits_tiny", "signed_zeros", "nan_inf"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_triton_gpu_large(dist: str, dtype: torch.dtype) -> None:
    b, n, k = 64, 65536, 512
    g = torch.Generator().manual_seed(11)
    scores = _scores(dist, b, n, dtype, g)
    lengths = torch.randint(0, n + 1, (b,), generator=g, dtype=torch.int32)
    lengths[:4] = torch.tensor([0, 100, n, n + 5], dtype=torch.int32)
    for lens in (None, lengths):
        idx = topk_triton(scores.cuda(), k, lengths=None if lens is None else lens.cuda())
        torch.cuda.synchronize()
        assert_matches_reference(scores, k, lens, idx)


@gpu
def test_topk_triton_gpu_long_rows_big_k() -> None:
    b, n, k = 8, 262144, 2048
    g = torch.Generator().manual_seed(12)
    scores = make_scores("bits_mid", b, n, torch.bfloat16, g)
    idx = topk_triton(scores.cuda(), k)
    assert_matches_reference(scores, k, None, idx)


@gpu
def test_topk_triton_gpu_cuda_graph() -> None:
    """No host sync inside: capture once, replay on new data in the same buffers."""
    b, n, k = 16, 8192, 256
    scores = torch.randn(b, n, device="cuda")
    out = torch.empty(b, k, dtype=torch.int32, device="cuda")
    topk_triton(scores, k, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk_triton(scores, k, out=out)
    scores.copy_(torch.randn(b, n, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_reference(scores, k, None, out)


@cpu_interp
def test_runs_in_interpreter() -> None:
    """Guard: the CPU run really uses the interpreter (the kernel cannot compile for CPU tensors otherwise)."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
