"""Triton top-k v3 (`triton_filter.py`) and v2 (`triton_select.py`) vs the pure PyTorch reference, exactly.

Same cases as v1's tests, plus: each kernel's fast path and its fallback (small scratches force the fallback
on tie-heavy rows; v3's `path` output says which path served each row), ragged rows (starts / ends, relative
ids), and the API on CUDA tensors. The output order is unspecified: sets and rank-sorted lists are compared,
padding must fill exactly the last slots. Without a GPU the kernels run in Triton's CPU interpreter on tiny rows.
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
from test_ds_topk_triton import _CASES, _lengths, _scores, _valid  # noqa: E402

from deepinfer.deep_select import api  # noqa: E402
from deepinfer.deep_select import reference as ref  # noqa: E402
from deepinfer.deep_select.backends.cuda.triton_filter import topk_triton_v3  # noqa: E402
from deepinfer.deep_select.backends.cuda.triton_select import topk_triton_v2  # noqa: E402
from deepinfer.deep_select.backends.cuda.triton_split import choose_segments, topk_triton_split  # noqa: E402

_HAS_CUDA = torch.cuda.is_available()
_DEV = "cuda" if _HAS_CUDA else "cpu"
gpu = pytest.mark.gpu


def run_kernel(
    kernel: str,
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
    *,
    block: int,
    small: bool,
) -> torch.Tensor:
    """Run v2 / v3 on device copies; `small` picks a tiny scratch (forces the fallback on tie-heavy rows)."""
    dev = [None if t is None else t.to(_DEV) for t in (lengths, starts)]
    if kernel == "v2":
        return topk_triton_v2(scores.to(_DEV), k, lengths=dev[0], starts=dev[1], block=block, cap=16 if small else 256)
    cap, sample = (32, 32) if small else (256, 64)
    return topk_triton_v3(
        scores.to(_DEV), k, lengths=dev[0], starts=dev[1], block=max(block, 32), cap=cap, sample=sample
    )


def assert_same_as_reference(want: torch.Tensor, keys: torch.Tensor, idx: torch.Tensor, cols: torch.Tensor) -> None:
    """want: reference ids [b, k] (rank-sorted, -1 padded); idx: kernel ids (any order); keys: reference
    order keys [b, n] by absolute column; cols: absolute column of each kernel id (same shape as idx)."""
    b, k = want.shape
    assert idx.dtype == torch.int32 and tuple(idx.shape) == (b, k)
    for r in range(b):
        m = int((want[r] >= 0).sum())
        assert bool((idx[r, m:] == -1).all()), f"row {r}: padding is not exactly slots {m}..{k - 1}"
        assert bool((idx[r, :m] >= 0).all()), f"row {r}: -1 among the first {m} slots"
        got = idx[r, :m]
        assert set(got.tolist()) == set(want[r, :m].tolist()), f"row {r}: chosen set differs from reference"
        ranked = got[torch.argsort(keys[r, cols[r, :m].long()], descending=True)]
        assert torch.equal(ranked, want[r, :m]), f"row {r}: rank-sorted list differs"


def check_rowwise(scores: torch.Tensor, k: int, lengths: torch.Tensor | None, idx: torch.Tensor) -> None:
    scores, idx = scores.cpu(), idx.cpu()
    lengths = None if lengths is None else lengths.cpu()
    want, _ = ref.topk(scores, k, lengths)
    keys = ref.order_keys(scores, _valid(*scores.shape, lengths))
    assert_same_as_reference(want, keys, idx, idx)


def check_ragged(scores: torch.Tensor, k: int, starts: torch.Tensor, ends: torch.Tensor, idx: torch.Tensor) -> None:
    scores, idx, starts, ends = scores.cpu(), idx.cpu(), starts.cpu(), ends.cpu()
    want, _ = ref.topk_ragged(scores, k, starts, ends)
    col = torch.arange(scores.shape[1])[None, :]
    valid = (col >= starts.long()[:, None]) & (col < ends.long()[:, None])
    keys = ref.order_keys(scores, valid)
    cols = torch.where(idx >= 0, idx.long() + starts.long()[:, None], 0)
    assert_same_as_reference(want, keys, idx, cols)


@pytest.mark.parametrize("kernel", ["v2", "v3"])
@pytest.mark.parametrize("case", range(len(_CASES)), ids=lambda i: "-".join(map(str, _CASES[i])))
def test_matches_reference(case: int, kernel: str) -> None:
    dist, dtype, b, n, k, mode, block = _CASES[case]
    g = torch.Generator().manual_seed(2000 + case)
    scores = _scores(dist, b, n, dtype, g)
    lengths = _lengths(mode, b, n, g)
    idx = run_kernel(kernel, scores, k, lengths, block=block, small=case % 2 == 0)
    check_rowwise(scores, k, lengths, idx)
    check_topk(scores, k, lengths, idx.cpu(), None, False)


def _ragged_bounds(t: int, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Starts in [-3, n + 2], ends from before the start to past n: empty, inverted and clipped ranges."""
    starts = torch.randint(-3, n + 3, (t,), generator=g, dtype=torch.int32)
    ends = starts + torch.randint(-2, n + 4, (t,), generator=g, dtype=torch.int32)
    return starts, ends


@settings(max_examples=25, deadline=None, database=None)
@given(
    dist=st.sampled_from((*DISTRIBUTIONS, "signed_zeros", "nan_inf")),
    dtype=st.sampled_from((torch.float32, torch.bfloat16, torch.float16)),
    b=st.integers(1, 3),
    n=st.integers(1, 160),
    k_extra=st.integers(-159, 20),
    ragged=st.booleans(),
    block=st.sampled_from((16, 64, 256)),
    kernel=st.sampled_from(("v2", "v3")),
    small=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_cases(
    dist: str,
    dtype: torch.dtype,
    b: int,
    n: int,
    k_extra: int,
    ragged: bool,
    block: int,
    kernel: str,
    small: bool,
    seed: int,
) -> None:
    g = torch.Generator().manual_seed(seed)
    k = max(1, n + k_extra)
    scores = _scores(dist, b, n, dtype, g)
    if ragged:
        starts, ends = _ragged_bounds(b, n, g)
        idx = run_kernel(kernel, scores, k, ends, starts, block=block, small=small)
        check_ragged(scores, k, starts, ends, idx)
    else:
        lengths = _lengths("random", b, n, g)
        idx = run_kernel(kernel, scores, k, lengths, block=block, small=small)
        check_rowwise(scores, k, lengths, idx)


@pytest.mark.parametrize("kernel", ["v2", "v3"])
def test_ragged_prefill_causal(kernel: str) -> None:
    """The prefill shape: token i of a chunk sees the first visible[i] entries of its sequence (a causal,
    increasing prefix), entries of several sequences laid out back to back."""
    g = torch.Generator().manual_seed(21)
    seq_len, t, k = 120, 10, 16
    scores = _scores("few_values", t, 2 * seq_len, torch.float32, g)
    seq_start = torch.tensor([0] * 5 + [seq_len] * 5, dtype=torch.int32)
    visible = torch.tensor([1, 15, 16, 17, 120, 0, 3, 40, 100, 120], dtype=torch.int32)
    starts, ends = seq_start, seq_start + visible
    idx = run_kernel(kernel, scores, k, ends, starts, block=32, small=True)
    check_ragged(scores, k, starts, ends, idx)
    for r in range(t):  # exactly min(k, visible) picked, all inside the visible prefix
        chosen = idx[r][idx[r] >= 0].cpu()
        assert chosen.numel() == min(k, int(visible[r])) and bool((chosen < visible[r]).all())


@pytest.mark.parametrize("kernel", ["v2", "v3"])
def test_strided_input_and_out_buffer(kernel: str) -> None:
    g = torch.Generator().manual_seed(8)
    base = make_scores("normal", 200, 3, torch.float32, g).to(_DEV)
    scores = base.t()  # [3, 200], strides (1, 3)
    k = 60
    lengths = torch.tensor([200, 150, 5], dtype=torch.int32, device=_DEV)
    big = torch.full((3, 2 * k), 12345, dtype=torch.int32, device=_DEV)
    out = big[:, ::2]
    if kernel == "v2":
        res = topk_triton_v2(scores, k, lengths=lengths, out=out, block=64, cap=64)
    else:
        res = topk_triton_v3(scores, k, lengths=lengths, out=out, block=64, cap=64, sample=64)
    assert res.data_ptr() == out.data_ptr()
    check_rowwise(scores, k, lengths, out)
    assert bool((big[:, 1::2] == 12345).all()), "wrote outside the out view"


@settings(max_examples=12, deadline=None, database=None)
@given(
    dist=st.sampled_from((*DISTRIBUTIONS, "signed_zeros", "nan_inf")),
    dtype=st.sampled_from((torch.float32, torch.bfloat16, torch.float16)),
    n=st.integers(1, 200),
    k_extra=st.integers(-199, 10),
    segments=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_split_random_cases(dist: str, dtype: torch.dtype, n: int, k_extra: int, segments: int, seed: int) -> None:
    """Split rows: segment picks + a second selection over the candidates equal the reference exactly (ties
    included: candidates keep column order among equal keys)."""
    g = torch.Generator().manual_seed(seed)
    k = max(1, n + k_extra)
    scores = _scores(dist, 2, n, dtype, g)
    lengths = _lengths("random", 2, n, g)
    idx = topk_triton_split(scores.to(_DEV), k, segments, lengths=lengths.to(_DEV), block=32, cap=32, sample=32)
    check_rowwise(scores, k, lengths, idx)


@pytest.mark.parametrize("dist", ["few_values", "all_equal", "normal"])
def test_split_ties_across_segments(dist: str) -> None:
    g = torch.Generator().manual_seed(42)
    scores = _scores(dist, 2, 400, torch.float32, g)
    idx = topk_triton_split(scores.to(_DEV), 37, 5, block=64, cap=64, sample=32)
    check_rowwise(scores, 37, None, idx)


def test_choose_segments() -> None:
    assert choose_segments(256, 65536, 512, 132) == 1  # enough rows
    assert choose_segments(1, 8192, 512, 132) == 1  # short rows
    assert choose_segments(1, 262144, 2048, 132) == 32  # segments of 8,192 >= 4k
    assert choose_segments(64, 65536, 512, 132) == 5


def test_empty_batch() -> None:
    for fn in (topk_triton_v2, topk_triton_v3):
        out = fn(torch.empty(0, 10, device=_DEV), 4)
        assert tuple(out.shape) == (0, 4) and out.dtype == torch.int32


@pytest.mark.parametrize(
    ("dist", "dtype", "want_fast"),
    [
        ("normal", torch.float32, True),
        ("normal_big", torch.bfloat16, True),
        ("all_equal", torch.float32, False),  # every key >= T0: the scratch overflows
        ("few_values", torch.bfloat16, False),
    ],
)
def test_v3_path_taken(dist: str, dtype: torch.dtype, want_fast: bool) -> None:
    """The one-read path serves smooth rows; tie-heavy rows overflow the scratch and take the fallback.
    Either way the result is exact."""
    g = torch.Generator().manual_seed(41)
    b, n, k = 3, 4096, 32
    scores = _scores(dist, b, n, dtype, g)
    path = torch.full((b,), 7, dtype=torch.int32, device=_DEV)
    idx = topk_triton_v3(scores.to(_DEV), k, block=1024, cap=512, sample=256, path=path)
    check_rowwise(scores, k, None, idx)
    assert path.tolist() == [int(want_fast)] * b


# ---- GPU only: the real sizes, and the public API on CUDA tensors (the Triton path there) ----


@gpu
@pytest.mark.parametrize(
    "dist", ["normal", "normal_small", "few_values", "inf", "nan_hot", "all_equal", "bits_tiny", "nan_inf"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_large(dist: str, dtype: torch.dtype) -> None:
    b, n, k = 64, 65536, 512
    g = torch.Generator().manual_seed(31)
    scores = _scores(dist, b, n, dtype, g)
    lengths = torch.randint(0, n + 1, (b,), generator=g, dtype=torch.int32)
    lengths[:4] = torch.tensor([0, 100, n, n + 5], dtype=torch.int32)
    for fn in (topk_triton_v2, topk_triton_v3):
        for lens in (None, lengths):
            idx = fn(scores.cuda(), k, lengths=None if lens is None else lens.cuda())
            torch.cuda.synchronize()
            check_rowwise(scores, k, lens, idx)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_long_rows_big_k_and_ragged(dtype: torch.dtype) -> None:
    b, n, k = 8, 262144, 2048
    g = torch.Generator().manual_seed(32)
    scores = make_scores("normal", b, n, dtype, g)
    starts, ends = _ragged_bounds(b, n, g)
    for fn in (topk_triton_v2, topk_triton_v3):
        check_rowwise(scores, k, None, fn(scores.cuda(), k))
        idx = fn(scores.cuda(), k, lengths=ends.cuda(), starts=starts.cuda())
        check_ragged(scores, k, starts, ends, idx)


@gpu
@pytest.mark.parametrize(("b", "n", "k"), [(1, 262144, 2048), (1, 129280, 50), (16, 65536, 512), (64, 262144, 512)])
@pytest.mark.parametrize("dist", ["normal", "few_values", "nan_hot"])
def test_gpu_split_rows(b: int, n: int, k: int, dist: str) -> None:
    """Few long rows: the split path (what the API runs for them) against the reference."""
    g = torch.Generator().manual_seed(36)
    scores = _scores(dist, b, n, torch.float32, g)
    lengths = torch.randint(n // 2, n + 1, (b,), generator=g, dtype=torch.int32)
    segments = choose_segments(b, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    assert segments > 1
    idx = topk_triton_split(scores.cuda(), k, segments, lengths=lengths.cuda())
    check_rowwise(scores, k, lengths, idx)
    res = api.topk(scores.cuda(), k, lengths=lengths.cuda(), sorted=True, return_values=True)
    check_topk(scores, k, lengths, res[0].cpu(), res[1].cpu(), True)


@gpu
@pytest.mark.parametrize(("b", "n", "k"), [(256, 65536, 512), (64, 262144, 2048), (64, 129280, 50), (4, 4096, 2048)])
def test_gpu_v3_one_read_path_on_benchmark_shapes(b: int, n: int, k: int) -> None:
    """On the benchmark's normal scores every row takes v3's one-read path (else its speed claim is void)."""
    scores = torch.randn(b, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(35))
    path = torch.zeros(b, dtype=torch.int32, device="cuda")
    idx = topk_triton_v3(scores, k, path=path)
    assert int(path.sum()) == b, f"{b - int(path.sum())} of {b} rows fell back to v2"
    check_rowwise(scores[:8], k, None, idx[:8])


@gpu
@pytest.mark.parametrize("kernel", ["v2", "v3"])
def test_gpu_cuda_graph(kernel: str) -> None:
    fn = topk_triton_v2 if kernel == "v2" else topk_triton_v3
    b, n, k = 16, 8192, 256
    scores = torch.randn(b, n, device="cuda")
    out = torch.empty(b, k, dtype=torch.int32, device="cuda")
    fn(scores, k, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(scores, k, out=out)
    scores.copy_(torch.randn(b, n, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    check_rowwise(scores, k, None, out)


@gpu
@pytest.mark.parametrize("dist", ["normal", "few_values", "nan_hot", "bits_tiny"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_api_gpu_properties(dist: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """api.topk / topk_ragged on CUDA through Triton (forced: a build with _C would run the CUDA kernel): every
    contract property, sorted and unsorted, with values."""
    monkeypatch.setenv("DEEPINFER_DEEP_SELECT_BACKEND", "triton")
    assert api.backend("cuda") == "triton"
    b, n, k = 6, 5000, 512
    g = torch.Generator().manual_seed(33)
    scores = make_scores(dist, b, n, dtype, g)
    lengths = torch.tensor([n, 0, 100, 511, 513, n + 9], dtype=torch.int32)
    for is_sorted in (False, True):
        idx, vals = api.topk(scores.cuda(), k, lengths=lengths.cuda(), sorted=is_sorted, return_values=True)
        check_topk(scores, k, lengths, idx.cpu(), vals.cpu(), is_sorted)
    starts, ends = _ragged_bounds(b, n, g)
    res = api.topk_ragged(scores.cuda(), k, starts=starts.cuda(), ends=ends.cuda(), sorted=True, return_values=True)
    idx, vals = res
    want_idx, want_vals = ref.topk_ragged(scores, k, starts, ends, return_values=True)
    assert torch.equal(idx.cpu(), want_idx)
    assert torch.equal(vals.cpu().nan_to_num(), want_vals.nan_to_num())


@gpu
def test_api_gpu_indexer_topk_matches_reference() -> None:
    """indexer_topk on CUDA (reference scores + Triton selection) selects the reference's set."""
    g = torch.Generator().manual_seed(34)
    t, h, n, d, k = 16, 8, 3000, 128, 512
    q = torch.randint(0, 4, (t, h, d), generator=g).to(torch.bfloat16)
    keys = torch.randint(-3, 4, (n, d), generator=g).to(torch.bfloat16)  # exact sums: many ReLU zeros, ties
    w = 2.0 ** torch.randint(-3, 3, (t, h), generator=g).float()
    visible = torch.randint(0, n + 1, (t,), generator=g, dtype=torch.int32)
    got = api.indexer_topk(q.cuda(), w.cuda(), keys.cuda(), k, visible=visible.cuda())
    want = ref.indexer_topk(q, w, keys, k, visible, None, None, None)
    assert torch.equal(torch.sort(got.cpu(), dim=1).values, torch.sort(want, dim=1).values)
