"""bf16 x FP4 (e2m1, E8M0 per-32 scales) M-grouped contiguous GEMM: reference vs float64, Triton vs reference.

The Triton tests run the kernel in Triton's CPU interpreter (TRITON_INTERPRET=1, set below when there is no
GPU; CI exports it) with CPU tensors and DEEPINFER_DEEP_GEMM_BACKEND=triton. The `gpu` tests run the CUDA path.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import dg_testing as dgt  # noqa: E402
import pytest  # noqa: E402
from dg_testing import assert_gemm_close, fp4_weight64, gen  # noqa: E402

from deepinfer.deep_gemm import reference_w4a16 as ref  # noqa: E402
from deepinfer.deep_gemm.api_w4a16 import m_grouped_bf16_fp4_gemm_nt_contiguous as gemm  # noqa: E402

ENV = "DEEPINFER_DEEP_GEMM_BACKEND"
E8M0 = torch.float8_e8m0fnu
NAN = float("nan")
_rel_fro = dgt.rel_fro  # test_dg_w4a16_v3 imports it from here
interp_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


def _operands(
    counts: list[int], n: int, k: int, g: torch.Generator, extra_rows: int = 3, sb: tuple[int, int] = (120, 130)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """a bf16 [m, k] (m = sum(counts) + extra_rows), packed uint8 [G, n, k/2], E8M0 bytes [G, n, k/32], offs."""
    return dgt.bf16_fp4_operands(counts, n, k, g, extra_rows, sb)


def _exact64(a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, counts: list[int]) -> tuple:
    """float64 result and magnitude (|a| @ |W|^T) of the grouped rows, with dg_testing's independent dequant."""
    return dgt.grouped_exact64(a.double(), packed, scales, counts)


@pytest.mark.parametrize(
    ("counts", "n", "k", "scale_dtype"),
    [
        ([3, 0, 20, 5], 64, 256, torch.uint8),  # empty group; a group of > 16 rows (two row tiles)
        ([0, 17, 1], 32, 128, E8M0),  # leading empty group; e8m0-typed scales
        ([2, 1, 0, 1, 18], 48, 128, torch.uint8),  # n not a multiple of BLOCK_N (masked columns)
    ],
)
def test_reference_vs_float64(counts: list[int], n: int, k: int, scale_dtype: torch.dtype) -> None:
    a, packed, scales, offs = _operands(counts, n, k, gen(sum(counts) + n))
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16)
    assert ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales.view(scale_dtype), offs, out) is out
    val, mag = _exact64(a, packed, scales, counts)
    assert_gemm_close(out[: sum(counts)], val, mag, k)  # fp32 accumulation + one RTNE bf16 rounding
    assert out[sum(counts) :].isnan().all()


@interp_only
@pytest.mark.parametrize(("counts", "n", "k"), [([3, 0, 20, 5], 64, 256), ([0, 17, 1], 32, 128)])
def test_triton_vs_reference(counts: list[int], n: int, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "triton")
    a, packed, scales, offs = _operands(counts, n, k, gen(7 * n + k))
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty(a.shape[0], n).bfloat16())
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16)
    for b0, sf in ((packed, scales), (packed.view(torch.int8), scales.view(E8M0))):  # both accepted dtype pairs
        out.fill_(NAN)
        assert gemm(a, (b0, sf), offs, out) is out
        rows = sum(counts)
        # Both sides hold the same exact fp32 products summed in different orders; what differs is the bf16
        # rounding: the reference rounds to nearest even (error <= 2^-9 relative), Triton's interpreter
        # TRUNCATES fp32 -> bf16 (error < 2^-7 relative; a GPU rounds to nearest). 1e-2 bounds both.
        assert _rel_fro(out[:rows], want[:rows]) < 1e-2
        val, _ = _exact64(a, packed, scales, counts)
        assert _rel_fro(out[:rows], val) < 1e-2
        assert out[rows:].isnan().all(), "rows past offs[-1] must stay untouched"


def _one_hot_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """a = identity rows per group (out[start + j] = W_i[:, j]), E8M0 bytes over [2, 252]; and W^T in float64."""
    k, n, g = 128, 32, 2
    gen_ = gen(3)
    packed = torch.randint(0, 256, (g, n, k // 2), generator=gen_, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(2, 253, (g, n, k // 32), generator=gen_, dtype=torch.int32).to(torch.uint8)
    scales[0, 0, :2] = torch.tensor([2, 252], dtype=torch.uint8)  # the domain's ends
    a = torch.eye(k, dtype=torch.bfloat16).repeat(g, 1)
    offs = torch.tensor([k, 2 * k], dtype=torch.int32)
    w64 = fp4_weight64(packed.view(torch.int8), scales.view(E8M0))
    return a, packed, scales, offs, torch.cat([w64[0].T, w64[1].T])


@interp_only
def test_triton_dequant_bit_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """One-hot rows pick single weights, so the output is the dequantised weight, exactly."""
    monkeypatch.setenv(ENV, "triton")
    a, packed, scales, offs, want = _one_hot_case()
    assert torch.equal(gemm(a, (packed, scales), offs).double(), want)


@pytest.mark.gpu
@pytest.mark.parametrize("use_asm", [True, False])
def test_gpu_dequant_bit_exact(use_asm: bool) -> None:
    """The same on the GPU, for both dequantisers (inline PTX and plain integer ops)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from deepinfer.deep_gemm.backends.cuda.triton_fp4_grouped import m_grouped_bf16_fp4_gemm_nt_contiguous_triton

    a, packed, scales, offs, want = (t.cuda() for t in _one_hot_case())
    out = torch.empty(a.shape[0], packed.shape[1], dtype=torch.bfloat16, device="cuda")
    m_grouped_bf16_fp4_gemm_nt_contiguous_triton(a, packed, scales, offs, out, use_asm=use_asm)
    assert torch.equal(out.double(), want)


@interp_only
def test_triton_misaligned_a(monkeypatch: pytest.MonkeyPatch) -> None:
    """a starting at an odd bf16 offset (the launcher's int32 view of a needs a copy) still works."""
    monkeypatch.setenv(ENV, "triton")
    a, packed, scales, offs = _operands([2, 3], 32, 128, gen(13))
    flat = torch.empty(a.numel() + 1, dtype=torch.bfloat16)
    flat[1:] = a.flatten()
    a_odd = flat[1:].view(a.shape)
    assert a_odd.is_contiguous() and a_odd.storage_offset() == 1
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty(a.shape[0], 32).bfloat16())
    out = gemm(a_odd, (packed, scales), offs)
    assert _rel_fro(out[:5], want[:5]) < 1e-2  # see test_triton_vs_reference for the bound


@interp_only
def test_triton_rows_past_offs_and_all_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "triton")
    a, packed, scales, offs = _operands([0, 0, 0], 32, 128, gen(11), extra_rows=5)
    out = torch.full((5, 32), NAN, dtype=torch.bfloat16)
    gemm(a, (packed, scales), offs, out)
    assert out.isnan().all()


def test_cpu_default_is_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    a, packed, scales, offs = _operands([2, 0, 3], 32, 128, gen(5))
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.zeros(a.shape[0], 32).bfloat16())
    got = gemm(a, (packed, scales), offs, torch.zeros(a.shape[0], 32, dtype=torch.bfloat16))
    assert torch.equal(got, want)


def test_forced_triton_without_interpreter_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    a, packed, scales, offs = _operands([1], 32, 128, gen(1))
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        gemm(a, (packed, scales), offs)


def _good() -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]:
    a, packed, scales, offs = _operands([2, 3], 32, 128, gen(2), extra_rows=1)
    return a, (packed, scales), offs, torch.empty(6, 32, dtype=torch.bfloat16)


def _bad_cases() -> list[tuple[str, object, type[Exception], str]]:
    a, (p, s), offs, out = _good()
    return [
        ("a float32", (a.float(), (p, s), offs, out), TypeError, "a: expected dtype"),
        ("a not contiguous", (a.t().contiguous().t(), (p, s), offs, out), ValueError, "contiguous"),
        ("a 1-D", (a[0], (p, s), offs, out), ValueError, "2 dims"),
        ("b not a pair", (a, p, offs, out), TypeError, "pair"),
        ("packed dtype", (a, (p.float(), s), offs, out), TypeError, "packed FP4"),
        ("K mismatch", (a, (p[:, :, :32].contiguous(), s), offs, out), ValueError, "K mismatch"),
        (
            "K % 128",
            (a[:, :64].contiguous(), (p[:, :, :32].contiguous(), s[:, :, :2].contiguous()), offs, out),
            ValueError,
            "multiple of 128",
        ),
        (
            "N % 16",
            (a, (p[:, :24].contiguous(), s[:, :24].contiguous()), offs, out[:, :24].contiguous()),
            ValueError,
            "multiple of 16",
        ),
        ("scales float32", (a, (p, s.float()), offs, out), TypeError, "E8M0 scales"),
        ("scales shape", (a, (p, s[:, :, :2].contiguous()), offs, out), ValueError, "E8M0 scales"),
        ("offs int64", (a, (p, s), offs.long(), out), TypeError, "offs"),
        ("offs shape", (a, (p, s), offs[:1].contiguous(), out), ValueError, "offs"),
        ("out float32", (a, (p, s), offs, out.float()), TypeError, "out"),
        ("out shape", (a, (p, s), offs, out[:5]), ValueError, "out"),
        ("device mismatch", (a, (p, s), offs.to("meta"), out), ValueError, "one device"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_inputs(case: tuple[str, tuple, type[Exception], str]) -> None:
    _, args, exc, match = case
    with pytest.raises(exc, match=match):
        gemm(*args)


@pytest.mark.parametrize(("ends", "match"), [([3, 2], "non-decreasing"), ([-1, 2], "negative"), ([2, 7], "past")])
def test_reference_rejects_bad_offs(ends: list[int], match: str) -> None:
    a, b, _, out = _good()
    out.fill_(NAN)
    with pytest.raises(ValueError, match=match):
        gemm(a, b, torch.tensor(ends, dtype=torch.int32), out)
    assert out.isnan().all(), "nothing is written before offs is validated"


def test_bad_backend_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "bogus")
    a, b, offs, out = _good()
    with pytest.raises(ValueError, match=ENV):
        gemm(a, b, offs, out)


@pytest.mark.gpu
@pytest.mark.parametrize("counts", [[0, 1, 2, 0, 1, 0, 0, 3], [40, 0, 129, 7]], ids=["decode", "prefill"])
def test_gpu_vs_reference(counts: list[int]) -> None:
    """CUDA Triton path vs the reference on the GPU (bf16 dot operands)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    a, packed, scales, offs = (t.cuda() for t in _operands(counts, 512, 1024, gen(17)))
    out = torch.full((a.shape[0], 512), NAN, dtype=torch.bfloat16, device="cuda")
    gemm(a, (packed, scales), offs, out)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    rows = sum(counts)
    # fp32 accumulation in both; both round to nearest on the GPU: a few bf16 ulps at most after reordering.
    assert _rel_fro(out[:rows], want[:rows]) < 4e-3
    val, mag = _exact64(a.cpu(), packed.cpu(), scales.cpu(), counts)
    assert_gemm_close(out[:rows].cpu(), val, mag, 1024)
    assert out[rows:].isnan().all()


@pytest.mark.gpu
def test_gpu_cuda_graph_replay() -> None:
    """Captured once, replayed with new offs values: the launcher must not read offs on the host."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    a, packed, scales, _ = (t.cuda() for t in _operands([4, 4, 4, 4], 256, 512, gen(23), extra_rows=0))
    out, offs = dgt.replay_with_new_offs(lambda a, p, s, o, out: gemm(a, (p, s), o, out), a, packed, scales)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    assert _rel_fro(out[:9], want[:9]) < 4e-3
    assert out[9:].isnan().all()
