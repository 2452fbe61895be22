"""Bit-exact checks of the FP8/FP4 quantisers against the official-format fixture (v4-tiny-official).

The fixture's vectors were produced by DeepSeek's reference arithmetic (README step 2); the weight
dequantisations must match the golden exactly because FP8/FP4 values times powers of two are exact in fp32.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from deepinfer.tile_kernels.api_quant import (
    dequant_fp8_block,
    fp4_pack,
    fp4_quant_dequant_ue8m0,
    fp4_quant_ue8m0,
    fp8_quant_dequant_ue8m0,
    fp8_quant_ue8m0,
    hadamard_transform,
    unpack_fp4,
)

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "data" / "v4-tiny-official"


@pytest.fixture(scope="module")
def golden() -> dict[str, torch.Tensor]:
    path = FIXTURE / "golden.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"fixture missing: {path}")
    return load_file(str(path))


def _checkpoint_tensor(name: str) -> torch.Tensor:
    weight_map = json.loads((FIXTURE / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(FIXTURE / weight_map[name]), "pt") as f:
        return f.get_tensor(name)


def _assert_bit_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want), f"{int((got != want).sum())} of {want.numel()} values differ"
    # The golden keeps CUDA's sign of zero; ours must too.
    assert torch.equal(torch.signbit(got), torch.signbit(want))


@pytest.mark.parametrize("prefix", ["qat_kv_fp8", "qat_kv_fp8_edge"])
def test_fp8_kv_qat_vectors(golden: dict[str, torch.Tensor], prefix: str) -> None:
    x = golden[f"{prefix}_input"]
    q, e = fp8_quant_ue8m0(x, block=64)
    assert q.dtype == torch.float8_e4m3fn and e.dtype == torch.int32
    assert torch.equal(e, golden[f"{prefix}_scale_exp"])
    _assert_bit_equal(fp8_quant_dequant_ue8m0(x, block=64), golden[f"{prefix}_output"])


@pytest.mark.parametrize(
    ("prefix", "input_name"),
    [("qat_index_fp4", "qat_index_fp4_post_hadamard"), ("qat_fp4_edge", "qat_fp4_edge_input")],
)
def test_fp4_qat_vectors(golden: dict[str, torch.Tensor], prefix: str, input_name: str) -> None:
    x = golden[input_name]
    codes, e = fp4_quant_ue8m0(x, block=32)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert torch.equal(e, golden[f"{prefix}_scale_exp"])
    _assert_bit_equal(fp4_quant_dequant_ue8m0(x, block=32), golden[f"{prefix}_output"])


def test_hadamard_then_fp4_matches_golden(golden: dict[str, torch.Tensor]) -> None:
    pre, post = golden["qat_index_fp4_pre_hadamard"], golden["qat_index_fp4_post_hadamard"]
    h = hadamard_transform(pre)
    # Golden is the float64 transform rounded to fp32; 7 fp32 butterfly stages stay within a few ulps
    # of the row's largest value.
    row_max = post.abs().amax(dim=-1, keepdim=True)
    assert ((h - post).abs() / row_max).max() <= 8 * torch.finfo(torch.float32).eps
    out = fp4_quant_dequant_ue8m0(h, block=32)
    # A value sitting exactly on a rounding boundary may flip (README step 2); none do today.
    assert int((out != golden["qat_index_fp4_output"]).sum()) <= 2


def test_dequant_fixture_fp8_weight(golden: dict[str, torch.Tensor]) -> None:
    name = "layers.1.attn.wkv"
    w, s = _checkpoint_tensor(f"{name}.weight"), _checkpoint_tensor(f"{name}.scale")
    assert w.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu
    assert torch.equal(dequant_fp8_block(w, s), golden[f"dequant.{name}.weight"])


def test_dequant_fixture_fp4_weight(golden: dict[str, torch.Tensor]) -> None:
    name = "layers.1.ffn.experts.3.w2"
    w, s = _checkpoint_tensor(f"{name}.weight"), _checkpoint_tensor(f"{name}.scale")
    assert w.dtype == torch.int8 and s.dtype == torch.float8_e8m0fnu
    deq = unpack_fp4(w, s)
    assert torch.equal(deq, golden[f"dequant.{name}.weight"])
    # Re-packing exact FP4 values reproduces the codes wherever the block's largest code is +-6
    # (otherwise the re-derived scale is legitimately smaller).
    packed, scale = fp4_pack(deq)
    same = s.view(torch.uint8) == scale.view(torch.uint8)
    assert bool(same.any())
    assert bool((scale.view(torch.uint8)[~same] < s.view(torch.uint8)[~same]).all())
    per_block = (w.shape[0], s.shape[1], -1)  # 16 bytes per 32-element block
    assert torch.equal(packed.view(per_block)[same], w.view(per_block)[same])


def test_dequant_row_and_col_sums(golden: dict[str, torch.Tensor]) -> None:
    names = [k[len("dequant_rowsum.") :] for k in golden if k.startswith("dequant_rowsum.")]
    assert len(names) >= 8
    for name in names:
        base = name.removesuffix(".weight")
        w, s = _checkpoint_tensor(f"{base}.weight"), _checkpoint_tensor(f"{base}.scale")
        deq = unpack_fp4(w, s) if w.dtype == torch.int8 else dequant_fp8_block(w, s)
        for kind, dim in (("rowsum", 1), ("colsum", 0)):
            want = golden[f"dequant_{kind}.{name}"]
            got = deq.double().sum(dim=dim)
            tol = 1e-9 * want.abs().max().item() + 1e-12
            assert (got - want).abs().max().item() <= tol, f"{kind} of {name}"
