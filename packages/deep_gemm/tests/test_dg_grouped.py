"""M-grouped (contiguous / masked) MoE GEMMs and the grouped attention output projection vs float64."""

from __future__ import annotations

import os

import pytest
import torch
from dg_testing import act64, assert_gemm_close, calc_diff, gen, rand_float, rand_fp4, rand_fp8, rand_scales, weight64

from deepinfer.deep_gemm import api

G, N, K = 4, 192, 256


def _weights(fp4: bool, e8m0: bool, g: torch.Generator, groups: int = G) -> tuple[torch.Tensor, torch.Tensor]:
    if fp4:
        return rand_fp4((groups, N, K // 2), g), rand_scales((groups, N, K // 32), g, True)
    return rand_fp8((groups, N, K), g), rand_scales((groups, -(-N // 128), K // 128), g, e8m0)


def _acts(lead: tuple[int, ...], e8m0: bool, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return rand_fp8((*lead, K), g), rand_scales((*lead, K // 128), g, e8m0)


@pytest.mark.parametrize("fp4", [False, True])
@pytest.mark.parametrize("e8m0", [False, True])
@pytest.mark.parametrize("m", [0, 1, 300])
def test_contiguous(fp4: bool, e8m0: bool, m: int) -> None:
    g = gen(m + 10 * fp4 + 20 * e8m0)
    a, sfa = _acts((m,), e8m0, g)
    b, sfb = _weights(fp4, e8m0, g)
    # Expert 2 gets no rows; about a fifth of the rows are padding (-1).
    ids = torch.tensor([0, 1, 3, -1, 0], dtype=torch.int32)[torch.randint(0, 5, (m,), generator=g)]
    out = torch.full((m, N), float("nan"), dtype=torch.bfloat16)
    assert api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), out, ids) is out
    a64, w64 = act64(a, sfa), weight64(b, sfb)
    ref = torch.zeros(m, N, dtype=torch.float64)
    mag = torch.zeros(m, N, dtype=torch.float64)
    for e in range(G):
        rows = ids == e
        ref[rows] = a64[rows] @ w64[e].T
        mag[rows] = a64[rows].abs() @ w64[e].abs().T
    assert_gemm_close(out, ref, mag, K, diff_limit=1e-3)
    assert torch.equal(out[ids == -1], torch.zeros_like(out[ids == -1]))  # padding rows are zeroed


def test_contiguous_alias_and_fp32_out() -> None:
    g = gen(77)
    a, sfa = _acts((50,), True, g)
    b, sfb = _weights(True, True, g)
    ids = torch.randint(0, G, (50,), generator=g, dtype=torch.int32)
    out = api.m_grouped_fp8_fp4_gemm_nt_contiguous((a, sfa), (b, sfb), torch.empty(50, N), ids)
    a64, w64 = act64(a, sfa), weight64(b, sfb)
    ref = torch.einsum("mk,mnk->mn", a64, w64[ids.long()])
    mag = torch.einsum("mk,mnk->mn", a64.abs(), w64[ids.long()].abs())
    assert_gemm_close(out, ref, mag, K, diff_limit=1e-3)


@pytest.mark.parametrize("fp4", [False, True])
@pytest.mark.parametrize("e8m0", [False, True])
def test_masked(fp4: bool, e8m0: bool) -> None:
    m_max = 40
    g = gen(200 + 10 * fp4 + e8m0)
    a, sfa = _acts((G, m_max), e8m0, g)
    b, sfb = _weights(fp4, e8m0, g)
    counts = [0, m_max, 17, 1]
    masked_m = torch.tensor(counts, dtype=torch.int32)
    sentinel = 7.0  # rows past masked_m must keep what the buffer held
    out = torch.full((G, m_max, N), sentinel, dtype=torch.bfloat16)
    assert api.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), out, masked_m, expected_m=16) is out
    a64, w64 = act64(a, sfa), weight64(b, sfb)
    for e, cnt in enumerate(counts):
        ref = a64[e, :cnt] @ w64[e].T
        assert_gemm_close(out[e, :cnt], ref, a64[e, :cnt].abs() @ w64[e].abs().T, K, diff_limit=1e-3)
        assert (out[e, cnt:] == sentinel).all()
    fresh = api.m_grouped_fp8_fp4_gemm_nt_masked((a, sfa), (b, sfb), None, masked_m, 16)
    valid = (torch.arange(m_max)[None, :] < masked_m[:, None])[..., None]
    assert torch.equal(fresh, torch.where(valid, out, torch.zeros_like(out)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t", [0, 1, 37])
def test_grouped_gemm_nt_bf16(dtype: torch.dtype, t: int) -> None:
    groups, n, k = 8, 64, 512  # V4-Flash's o projection shape scaled down: [t, 8, 4096] x [8, 1024, 4096]
    g = gen(300 + t)
    a, b = rand_float((t, groups, k), dtype, g), rand_float((groups, n, k), dtype, g)
    out = torch.full((t, groups, n), float("nan"), dtype=dtype)
    assert api.grouped_gemm_nt_bf16(a, b, out) is out
    ref = torch.einsum("tgk,gnk->tgn", a.double(), b.double())
    mag = torch.einsum("tgk,gnk->tgn", a.double().abs(), b.double().abs())
    assert_gemm_close(out, ref, mag, k)


@pytest.mark.parametrize("fp4", [False, True])
def test_grouped_gemm_nt_fp8(fp4: bool) -> None:
    g = gen(400 + fp4)
    a, sfa = _acts((9, G), True, g)
    b, sfb = _weights(fp4, True, g)
    out = api.grouped_gemm_nt_fp8((a, sfa), (b, sfb))
    assert out.dtype == torch.bfloat16
    a64, w64 = act64(a, sfa), weight64(b, sfb)
    ref = torch.einsum("tgk,gnk->tgn", a64, w64)
    assert_gemm_close(out, ref, torch.einsum("tgk,gnk->tgn", a64.abs(), w64.abs()), K, diff_limit=1e-3)


def test_grouped_bad_input() -> None:
    g = gen(500)
    a, sfa = _acts((6,), False, g)
    b, sfb = _weights(False, False, g)
    out = torch.full((6, N), 3.0, dtype=torch.bfloat16)
    for bad in ([0, 1, 4, 0, 0, 0], [0, -2, 1, 1, 1, 1]):
        with pytest.raises(ValueError, match="m_indices: expected group ids"):
            api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), out, torch.tensor(bad, dtype=torch.int32))
    assert (out == 3.0).all()  # nothing written before the error
    with pytest.raises(TypeError, match="m_indices: expected dtype"):
        api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), out, torch.zeros(6, dtype=torch.int64))
    with pytest.raises(ValueError, match="b scales: expected shape"):
        api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb[:2]), out, torch.zeros(6, dtype=torch.int32))
    with pytest.raises(ValueError, match="b: expected 3 dims"):
        api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b[0], sfb[0]), out, torch.zeros(6, dtype=torch.int32))
    am, sfam = _acts((G, 8), False, g)
    with pytest.raises(ValueError, match="masked_m: expected counts"):
        api.m_grouped_fp8_gemm_nt_masked((am, sfam), (b, sfb), None, torch.tensor([0, 9, 1, 1], dtype=torch.int32), 4)
    with pytest.raises(TypeError, match="expected_m: expected an int"):
        api.m_grouped_fp8_gemm_nt_masked((am, sfam), (b, sfb), None, torch.zeros(G, dtype=torch.int32), 4.0)
    with pytest.raises(ValueError, match=r"b: expected shape \[2, \*, \*\]"):  # groups of a and b differ
        api.m_grouped_fp8_gemm_nt_masked((am[:2], sfam[:2]), (b, sfb), None, torch.zeros(G, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="K mismatch"):
        api.grouped_gemm_nt_bf16(torch.randn(2, G, K), torch.randn(G, N, K + 1))
    with pytest.raises(ValueError, match="a: expected a contiguous"):
        api.grouped_gemm_nt_bf16(torch.randn(G, 2, K).transpose(0, 1), torch.randn(G, N, K))


# ------------------------------------------------- FP8 grouped dispatch (CUTLASS / Triton / reference)

_CHOICES = [  # (env, rows per group, cutlass ok, triton ok, expected)
    ("auto", 8, True, True, "triton"),
    ("auto", 1024, True, True, "cutlass"),
    ("auto", 1024, False, True, "triton"),
    ("auto", 8, True, False, "cutlass"),
    ("auto", 8, False, False, "reference"),
    ("cutlass", 8, True, True, "cutlass"),
    ("cutlass", 8, False, True, "triton"),
    ("triton", 1024, True, True, "triton"),
    ("reference", 1024, True, True, "reference"),
]


@pytest.mark.parametrize("case", _CHOICES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in _CHOICES])
def test_fp8_grouped_impl_choice(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from deepinfer.deep_gemm import _dispatch

    env, rows, cutlass_ok, triton_ok, want = case
    monkeypatch.setattr(_dispatch, "FP8_GROUPED_TRITON_MAX_ROWS", 64)  # the rule's logic, whatever the tuned bound
    monkeypatch.setenv(_dispatch.FP8_GROUPED_ENV, env)
    monkeypatch.setattr(_dispatch, "backend", lambda device: "cuda")
    monkeypatch.setattr(_dispatch, "use_triton", lambda device: triton_ok)
    assert _dispatch.fp8_grouped_impl(torch.device("cpu"), rows, cutlass_ok) == want


def test_fp8_grouped_impl_backend_triton_turns_cutlass_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from deepinfer.deep_gemm import _dispatch

    monkeypatch.setenv(_dispatch.FP8_GROUPED_ENV, "cutlass")
    monkeypatch.setattr(_dispatch, "backend", lambda device: "triton")
    monkeypatch.setattr(_dispatch, "use_triton", lambda device: True)
    assert _dispatch.fp8_grouped_impl(torch.device("cpu"), 1024, True) == "triton"
    monkeypatch.setattr(_dispatch, "backend", lambda device: "reference")
    assert _dispatch.fp8_grouped_impl(torch.device("cpu"), 1024, True) == "reference"


def test_fp8_grouped_impl_bad_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from deepinfer.deep_gemm import _dispatch

    monkeypatch.setenv(_dispatch.FP8_GROUPED_ENV, "fast")
    with pytest.raises(ValueError, match="DEEPINFER_DEEP_GEMM_FP8_GROUPED: expected one of"):
        _dispatch.fp8_grouped_impl(torch.device("cpu"), 8, False)


def test_fp8_grouped_cpu_runs_reference() -> None:
    """CPU without a forced backend: the reference, which validates ids (the fast paths cannot: no host sync)."""
    from deepinfer.deep_gemm import _dispatch

    assert _dispatch.fp8_grouped_impl(torch.device("cpu"), 1024, False) == "reference"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
def test_api_grouped_triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """DEEPINFER_DEEP_GEMM_BACKEND=triton on CPU: the API runs the Triton grouped kernels (interpreter)."""
    monkeypatch.setenv("DEEPINFER_DEEP_GEMM_BACKEND", "triton")
    g = gen(600)
    ids = torch.tensor([0] * 5 + [-1] * 3 + [3] * 9, dtype=torch.int32)
    a, sfa = _acts((ids.numel(),), False, g)
    b, sfb = _weights(False, False, g)
    out = api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), None, ids)
    want = torch.zeros(ids.numel(), N, dtype=torch.float64)
    a64, w64 = act64(a, sfa), weight64(b, sfb)
    for e in (0, 3):
        want[ids == e] = a64[ids == e] @ w64[e].T
    assert_gemm_close(out, want, a64.abs() @ w64.abs().amax(0).T, K, diff_limit=1e-3)
    am, sfam = _acts((G, 8), False, g)
    cnt = torch.tensor([0, 8, 3, 1], dtype=torch.int32)
    outm = api.m_grouped_fp8_gemm_nt_masked((am, sfam), (b, sfb), None, cnt, 4)
    a64m = act64(am, sfam)
    for e, c in enumerate(cnt.tolist()):
        assert_gemm_close(outm[e, :c], a64m[e, :c] @ w64[e].T, a64m[e, :c].abs() @ w64[e].abs().T, K, diff_limit=1e-3)
        assert (outm[e, c:] == 0).all()


# GPU: the API on CUDA with each forced path and auto; DeepGEMM's shapes scaled down. calc_diff < 1e-3 vs fp32.
_GPU_CONTIG = [  # counts per expert (DeepGEMM layout: each padded with -1 rows to a multiple of 128), n, k
    ([1, 0, 130, 77, 0, 256], 4096, 2048),
    ([1024, 1024, 0, 1024], 4096, 4096),
    ([5, 300, 0, 0, 129, 64, 1, 255], 2048, 7168),
    ([8] * 32, 1024, 1024),
]


def _contig_ids(counts: list[int]) -> torch.Tensor:
    ids = []
    for e, c in enumerate(counts):
        ids += [e] * c + [-1] * (-(-c // 128) * 128 - c)
    return torch.tensor(ids, dtype=torch.int32, device="cuda")


def _fp8_ops(lead: tuple[int, ...], g: int, n: int, k: int, seed: int):
    gg = gen(seed)
    a, sfa = rand_fp8((*lead, k), gg).cuda(), rand_scales((*lead, k // 128), gg, False).cuda()
    b, sfb = rand_fp8((g, n, k), gg).cuda(), rand_scales((g, -(-n // 128), k // 128), gg, False).cuda()
    return a, sfa, b, sfb


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl", ["auto", "cutlass", "triton"])
@pytest.mark.parametrize(("counts", "n", "k"), _GPU_CONTIG)
def test_gpu_api_contiguous(impl: str, counts: list[int], n: int, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from deepinfer.deep_gemm import reference as ref

    monkeypatch.setenv("DEEPINFER_DEEP_GEMM_FP8_GROUPED", impl)
    ids = _contig_ids(counts)
    a, sfa, b, sfb = _fp8_ops((ids.numel(),), len(counts), n, k, seed=sum(counts) + n)
    out = torch.full((ids.numel(), n), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert api.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), out, ids) is out
    want = ref.m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, torch.empty(ids.numel(), n, device="cuda"), ids)
    torch.cuda.synchronize()
    pad = ids < 0
    assert torch.equal(out[pad], torch.zeros_like(out[pad])), f"{impl}: padding rows must be zero"
    diff = calc_diff(out, want)
    assert diff < 1e-3, f"{impl} counts={counts} n={n} k={k}: calc_diff {diff:.3e}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl", ["auto", "cutlass", "triton"])
@pytest.mark.parametrize(
    ("counts", "m_max", "expected_m"), [([0, 128, 37, 1], 128, 64), ([200, 0, 256, 129], 256, 256)]
)
def test_gpu_api_masked(impl: str, counts: list[int], m_max: int, expected_m: int, monkeypatch) -> None:
    from deepinfer.deep_gemm import reference as ref

    monkeypatch.setenv("DEEPINFER_DEEP_GEMM_FP8_GROUPED", impl)
    g, n, k = len(counts), 4096, 2048
    a, sfa, b, sfb = _fp8_ops((g, m_max), g, n, k, seed=sum(counts) + m_max)
    cnt = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = torch.full((g, m_max, n), 7.0, dtype=torch.bfloat16, device="cuda")
    api.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), out, cnt, expected_m)
    want = ref.m_grouped_fp8_gemm_nt_masked(a, sfa, b, sfb, torch.zeros(g, m_max, n, device="cuda"), cnt)
    torch.cuda.synchronize()
    for e, c in enumerate(counts):
        assert (out[e, c:] == 7.0).all(), f"{impl}: expert {e} rows >= {c} were written"
        if c:
            diff = calc_diff(out[e, :c], want[e, :c])
            assert diff < 1e-3, f"{impl} expert {e} ({c} of {m_max} rows): calc_diff {diff:.3e}"
