"""DIAGNOSTIC ablation builds of `cuda_rs2s4n256` (backends/cuda/cuda_w4a8_rs_ablate.py; kAblate in
csrc/cuda/dg_w4a8_rs.cuh). Their outputs are WRONG by design: only that they launch, finish (the mbarrier waits have
the 2^30-poll watchdog: a broken protocol traps instead of hanging; run this file in its own pytest process) and
leave the rows past offs untouched is checked.

CPU: names / masks, the unknown-name error, an sm_90a nvcc compile check of dg_w4a8_rs_ablate.cu (<= 168 registers,
no spills; skipped without nvcc). `gpu`: every ablation on a small shape with empty groups, partial tiles and few CTAs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import torch
from dg_testing import gen
from test_dg_w4a8_cuda import _CSRC, _operands

from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_grouped as cw
from deepinfer.deep_gemm.backends.cuda import cuda_w4a8_rs_ablate as abl


def test_ablation_names() -> None:
    assert abl.ABLATIONS == {"abl_A_noconv": 1, "abl_B_nopromo": 2, "abl_C_nowgmma": 4, "abl_D_prodonly": 8,
                             "abl_E_mmafeed": 3, "abl_F_nostore": 16, "abl_G_noffma": 32}  # fmt: skip
    for name in abl.ABLATIONS:  # never a user impl name
        with pytest.raises(ValueError):
            cw.parse_variant(name)


def test_ablation_unknown_name() -> None:
    a, sfa, packed, scales, offs = _operands([5, 3], 32, 256, gen(1))
    out = torch.empty(a.shape[0], 32, dtype=torch.bfloat16)
    with pytest.raises(KeyError, match="abl_A_noconv"):
        abl.run_ablation("abl_X", a, sfa, packed, scales, offs, out)


def test_ablation_sm90_compile() -> None:
    """nvcc 13 builds dg_w4a8_rs_ablate.cu for sm_90a: seven ablation kernels + the (unused) pre-pass, <= 168
    registers, no spills, no wgmma serialisation warning (skipped without nvcc)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    cmd = [nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c",
           str(_CSRC / "dg_w4a8_rs_ablate.cu"), "-o", os.devnull]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", res.stderr)]
    stores = [int(x) for x in re.findall(r"(\d+) bytes spill stores", res.stderr)]
    assert len(regs) == len(abl.ABLATIONS) + 1 and max(regs) <= 168, res.stderr[-3000:]
    assert stores == [0] * len(regs), res.stderr[-3000:]
    assert "C7510" not in res.stderr and "C7508" not in res.stderr, res.stderr[-3000:]


# ---------------------------------------------------------------- GPU

needs_ablate = pytest.mark.skipif(not abl.available(), reason="_C built without the rs ablation builds")


@pytest.mark.gpu
@needs_ablate
def test_gpu_ablation_masks_compiled() -> None:
    from deepinfer.deep_gemm._backend import compiled_module

    assert sorted(compiled_module().w4a8_rs_ablate_masks()) == sorted(abl.ABLATIONS.values())


@pytest.mark.gpu
@needs_ablate
@pytest.mark.parametrize("name", list(abl.ABLATIONS))
@pytest.mark.parametrize("ctas", [0, 3])
def test_gpu_ablation_runs(name: str, ctas: int) -> None:
    """Launches and finishes (no trap, no launch error); rows past offs[-1] stay NaN (the store bound is kept).
    Groups: a partial 256-token tile, an empty group, several tiles; ctas=3: several tiles per CTA."""
    counts = [300, 0, 77, 513]
    ops = _operands(counts, 256, 512, gen(11), sb=(118, 127))
    a, sfa, packed, scales, offs = (t.cuda() for t in ops)
    out = torch.full((a.shape[0], packed.shape[1]), float("nan"), dtype=torch.bfloat16, device="cuda")
    abl.run_ablation(name, a, sfa, packed, scales, offs, out, ctas=ctas)
    torch.cuda.synchronize()
    tail = out[sum(counts) :]
    assert tail.shape[0] == 3 and torch.isnan(tail.float()).all(), f"{name}: rows past offs written: {tail}"
