"""The W4A16 API's CUDA routing (`api_w4a16._cuda_choice` / `_run_cuda`): kernel 5 (persistent) by default up to
CUDA_MAX_ROWS rows per group, kernel 4 by name, when `_C` lacks kernel 5 and above CUDA_P_MAX_GROUPS groups.

CPU: the rule (`w4a16_configs.cuda_config`) and the API's choice with `_C`'s availability monkeypatched (as
`test_dg_fp4_cuda.py` does), down to which wrapper the public function calls. `gpu`: the public API at 1, 8, 9
and 16 rows per expert (with and without the `expected_m` hint), empty experts and m = 0 on both V4 expert shapes
vs the reference and bit-identical to the kernel-5 config the rule names; kernel-5 configs by name through the API
(k tails); more groups than CUDA_P_MAX_GROUPS (kernel 4).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from dg_testing import calc_diff, gen  # noqa: E402
from test_dg_fp4_cuda import ALL_CUDA_P, _check_gpu_case, _gpu, _operands  # noqa: E402

import deepinfer.deep_gemm as dg  # noqa: E402
from deepinfer.deep_gemm import api_w4a16  # noqa: E402
from deepinfer.deep_gemm import reference_w4a16 as ref  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import cuda_fp4_grouped as cu  # noqa: E402
from deepinfer.deep_gemm.backends.cuda import w4a16_configs as cfgs  # noqa: E402

NAN = float("nan")
K5_8, K5_16 = cfgs.CUDA_P_BY_TN[8], cfgs.CUDA_P_BY_TN[16]
K4_8, K4_16, K4_64 = cfgs.CUDA_BY_TN[8], cfgs.CUDA_BY_TN[16], cfgs.CUDA_BY_TN[64]

# ---------------------------------------------------------------- CPU: the rule and the routing


def test_default_kernel_configs() -> None:
    """The named defaults are compiled variants of their kernels, and kernel 5 is the default."""
    assert cfgs.CUDA_DEFAULT_KERNEL == 5
    assert K5_8.name == "m8n128k512w4s2cp" and K5_16.name == "m16n64k512w4s2cp"
    for cfg in cfgs.CUDA_P_BY_TN.values():
        assert cfg.kernel == 5 and cfgs.cuda_p_variant(cfg) in cfgs.CUDA_P_VARIANTS
    assert K4_8.name == "m8n64k256w4s4cu"  # kernel 4's default, still reachable by name
    assert cfgs.parse_config(K4_8.name) == K4_8


@pytest.mark.parametrize(
    ("m", "g", "hint", "kernel", "want"),
    [
        (2048, 256, None, None, K5_8),  # 8 rows per group
        (2048, 256, 9, None, K5_16),  # the hint wins: 16-token blocks
        (256 * 16, 256, None, None, K5_16),
        (24, 256, None, None, K5_8),  # decode batch 4: < 1 row per group
        (0, 0, None, None, K5_8),
        (2048, 256, None, 4, K4_8),
        (256 * 16, 256, None, 4, K4_16),
        (256 * (cfgs.CUDA_MAX_ROWS + 1), 256, None, None, None),  # above CUDA_MAX_ROWS: Triton
        (256 * (cfgs.CUDA_MAX_ROWS + 1), 256, None, 4, None),
    ],
)
def test_cuda_config_rule(m: int, g: int, hint: int | None, kernel: int | None, want) -> None:  # noqa: ANN001
    assert cfgs.cuda_config(m, g, hint, kernel=kernel) == want


def test_cuda_config_rejects_other_kernels() -> None:
    with pytest.raises(ValueError, match="kernel: expected 4 or 5"):
        cfgs.cuda_config(8, 1, kernel=3)


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, has_p: bool = True) -> None:
    """Pretend `_C` has kernel 4 (and kernel 5 when `has_p`) and the operands fit it (CPU tensors otherwise)."""
    monkeypatch.setattr(cu, "applies", lambda a, packed, scales: True)
    monkeypatch.setattr(cu, "available_p", lambda: has_p)
    for var in (api_w4a16.IMPL_ENV, "DEEPINFER_DG_W4A16_CONFIG", "DEEPINFER_DEEP_GEMM_BACKEND"):
        monkeypatch.delenv(var, raising=False)


def _choice(counts: list[int], g: int | None = None, config=None, hint: int | None = None):  # noqa: ANN001
    a, packed, scales, _ = _operands(counts, 32, 256, gen(7), extra_rows=0)
    return api_w4a16._cuda_choice(a, packed, scales, g or len(counts), config, hint)


@pytest.mark.parametrize(
    ("impl", "has_p", "counts", "g", "want"),
    [
        ("auto", True, [8] * 4, None, K5_8),
        ("auto", True, [16] * 4, None, K5_16),
        ("auto", True, [1, 0, 0, 0], None, K5_8),  # decode: empty experts
        ("auto", True, [17] * 4, None, None),  # Triton above CUDA_MAX_ROWS
        ("auto", False, [8] * 4, None, K4_8),  # `_C` without kernel 5 (an older build): kernel 4
        ("auto", True, [8] * 4, cfgs.CUDA_P_MAX_GROUPS + 1, K4_8),  # too many groups for kernel 5's offs copy
        ("auto", True, [8] * 4, cfgs.CUDA_P_MAX_GROUPS, K5_8),
        ("cuda", True, [8] * 4, None, K5_8),
        ("cuda", True, [40] * 4, None, K4_64),  # kernel 4's 64-token blocks above CUDA_MAX_ROWS
        ("triton", True, [8] * 4, None, None),
    ],
)
def test_api_choice(impl: str, has_p: bool, counts: list[int], g: int | None, want, monkeypatch) -> None:  # noqa: ANN001
    _fake_cuda(monkeypatch, has_p)
    monkeypatch.setenv(api_w4a16.IMPL_ENV, impl)
    if g is not None:  # only g matters to the rule: the estimate ceil(m / g) is given as the hint
        assert _choice(counts, g=g, hint=counts[0]) == want
    else:
        assert _choice(counts) == want


def test_api_choice_named_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit or env-named kernel-4 / kernel-5 config always runs CUDA (whatever the rule says); a Triton
    config never does; DEEPINFER_DEEP_GEMM_BACKEND=triton keeps the rule off the CUDA kernels."""
    _fake_cuda(monkeypatch)
    assert _choice([40] * 4, config=K4_8) == K4_8  # kernel 4 by name, above CUDA_MAX_ROWS too
    assert _choice([1] * 4, config=K5_16) == K5_16
    assert _choice([1] * 4, config=cfgs.DECODE) is None
    monkeypatch.setenv("DEEPINFER_DG_W4A16_CONFIG", "m8n64k256w4s4cu")
    assert _choice([8] * 4) == K4_8
    monkeypatch.setenv("DEEPINFER_DG_W4A16_CONFIG", "m8n64k512w4s2cp")
    assert _choice([8] * 4) == cfgs.parse_config("m8n64k512w4s2cp")
    monkeypatch.delenv("DEEPINFER_DG_W4A16_CONFIG")
    monkeypatch.setenv("DEEPINFER_DEEP_GEMM_BACKEND", "triton")
    assert _choice([8] * 4) is None


@pytest.mark.parametrize(
    ("config", "counts", "k", "wrapper", "want"),
    [
        (None, [3, 0, 5, 8], 256, "p", K5_8),  # the default: kernel 5
        (None, [12, 0, 16, 16], 384, "p", K5_16),  # k % 512 != 0: kernel 5 zero-fills the k tail
        (K4_8, [3, 0, 5, 8], 384, "4", K4_8),  # kernel 4 by name
        (cfgs.parse_config("m8n128k512w4s2cp"), [2, 2], 640, "p", K5_8),  # block_k 512 need not divide k
    ],
)
def test_api_calls_the_chosen_wrapper(config, counts: list[int], k: int, wrapper: str, want, monkeypatch) -> None:  # noqa: ANN001
    """The public function hands validated operands to the wrapper of the chosen kernel (recorded here: no GPU),
    and returns what the wrapper returns."""
    _fake_cuda(monkeypatch)
    monkeypatch.setattr(api_w4a16, "use_triton", lambda device: True)
    calls = []

    def record(name: str):  # noqa: ANN202
        def run(a, packed, scales, offs, out, cfg):  # noqa: ANN001, ANN202
            calls.append((name, cfg))
            return ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, out)

        return run

    monkeypatch.setattr(cu, "m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_p", record("p"))
    monkeypatch.setattr(cu, "m_grouped_bf16_fp4_gemm_nt_contiguous_cuda", record("4"))
    a, packed, scales, offs = _operands(counts, 32, k, gen(k))
    out = torch.full((a.shape[0], 32), NAN, dtype=torch.bfloat16)
    got = dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a, (packed, scales), offs, out, config=config)
    assert got is out and calls == [(wrapper, want)]
    rows = sum(counts)
    want_out = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    assert torch.equal(out[:rows], want_out[:rows]) and out[rows:].isnan().all()


# ---------------------------------------------------------------- GPU: the public API on the default path

needs_p_kernel = pytest.mark.skipif(not cu.available_p(), reason="_C built without the persistent FP4 kernel")


def _api_counts(rows: int) -> list[int]:
    """8 experts: `rows` in most, two empty, one with 1 row and one with rows - 1 (token-block tails)."""
    return [rows, 0, rows, 1, 0, rows, rows, max(rows - 1, 1)]


@pytest.mark.gpu
@needs_p_kernel
@pytest.mark.parametrize("hint", [True, False], ids=["hint", "estimate"])
@pytest.mark.parametrize("rows", [1, 8, 9, 16])
@pytest.mark.parametrize("nk", [(4096, 4096), (4096, 2048)], ids=["gate_up", "down"])
def test_gpu_api_default_is_kernel5(rows: int, nk: tuple[int, int], hint: bool, monkeypatch) -> None:  # noqa: ANN001
    """The public API without config on V4 expert shapes: vs the reference (GPU, fp32) and bit-identical to the
    kernel-5 config the rule names (rows per expert = `rows` as hint, or the ceil(m / g) estimate)."""
    for var in (api_w4a16.IMPL_ENV, "DEEPINFER_DG_W4A16_CONFIG", "DEEPINFER_DEEP_GEMM_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    n, k = nk
    counts = _api_counts(rows)
    a, packed, scales, offs = _gpu(*_operands(counts, n, k, gen(n + k + rows)))
    expected_m = rows if hint else None
    cfg = cfgs.cuda_config(a.shape[0], len(counts), expected_m)
    assert cfg.kernel == 5, cfg
    out = torch.full((a.shape[0], n), NAN, dtype=torch.bfloat16, device="cuda")
    got = dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a, (packed, scales), offs, out, expected_m=expected_m)
    direct = cu.m_grouped_bf16_fp4_gemm_nt_contiguous_cuda_p(a, packed, scales, offs, None, cfg)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(out))
    total = sum(counts)
    d = calc_diff(got[:total], want[:total])
    same = torch.equal(got[:total], direct[:total])
    assert got is out and d < 1e-5 and same, f"{cfg.name} rows={rows} n={n} k={k}: calc_diff {d:.3e}, same {same}"
    assert out[total:].isnan().all(), f"{cfg.name}: rows past offs[-1] were written"


@pytest.mark.gpu
@needs_p_kernel
@pytest.mark.parametrize("nk", [(4096, 4096), (4096, 2048)], ids=["gate_up", "down"])
def test_gpu_api_m0_and_all_empty(nk: tuple[int, int]) -> None:
    """m = 0 returns an empty [0, n] result; all-empty experts with rows past offs[-1] write nothing."""
    n, k = nk
    packed = torch.randint(0, 256, (4, n, k // 2), dtype=torch.uint8, device="cuda")
    scales = torch.randint(118, 131, (4, n, k // 32), dtype=torch.uint8, device="cuda")
    a0 = torch.empty((0, k), dtype=torch.bfloat16, device="cuda")
    offs0 = torch.zeros(4, dtype=torch.int32, device="cuda")
    got = dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a0, (packed, scales), offs0)
    torch.cuda.synchronize()
    assert got.shape == (0, n)
    a = torch.randn((5, k), dtype=torch.bfloat16, device="cuda")
    out = torch.full((5, n), NAN, dtype=torch.bfloat16, device="cuda")
    dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a, (packed, scales), offs0, out)
    torch.cuda.synchronize()
    assert out.isnan().all(), f"{int((~out.isnan()).sum())} outputs written with every expert empty"


@pytest.mark.gpu
@needs_p_kernel
@pytest.mark.parametrize("cfg", ALL_CUDA_P, ids=lambda c: c.name)
def test_gpu_api_kernel5_by_name(cfg: cfgs.W4A16Config) -> None:
    """Every kernel-5 config through the API's `config=` on the odd case (k = 384: a k tail of both stage sizes,
    n below the CTA's rows, two token blocks) vs the float64 oracle."""
    _check_gpu_case(lambda a, p, s, o, out: dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a, (p, s), o, out, config=cfg),
                    cfg, "odd")  # fmt: skip


@pytest.mark.gpu
@needs_p_kernel
def test_gpu_api_many_groups_runs_kernel4(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above CUDA_P_MAX_GROUPS groups the default runs kernel 4: bit-identical to its config, close to the
    reference."""
    monkeypatch.delenv(api_w4a16.IMPL_ENV, raising=False)
    g = cfgs.CUDA_P_MAX_GROUPS + 7
    counts = [0] * g
    for e, c in ((0, 3), (5, 8), (g // 2, 1), (g - 1, 6)):
        counts[e] = c
    a, packed, scales, offs = _gpu(*_operands(counts, 64, 256, gen(g)))
    got = dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a, (packed, scales), offs, expected_m=8)
    k4 = dg.m_grouped_bf16_fp4_gemm_nt_contiguous(a, (packed, scales), offs, config=K4_8)
    want = ref.m_grouped_bf16_fp4_gemm_nt_contiguous(a, packed, scales, offs, torch.empty_like(got))
    rows = sum(counts)
    d = calc_diff(got[:rows], want[:rows])
    assert torch.equal(got[:rows], k4[:rows]) and d < 1e-5, f"g={g}: calc_diff {d:.3e} vs the reference"
