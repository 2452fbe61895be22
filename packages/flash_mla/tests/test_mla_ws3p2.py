"""ws3p's balanced "pair" builds (session 11): `sparse_attn_ws(..., variant="ws3p2" / "ws3p2v")` (the same builds) ->
`_C.sparse_decode_ws3p_pair` -> fm_ws3_pair.cuh's ws3p_pair_kernel<false> (BF16 cache, opt 128) or <true> (FP8 cache
with the lane-uniform producer, opt 144). Each consumer warpgroup scores every other 64-row tile (an odd tile count is
padded with a tile of holes), the two hand over a staggered row max and P through shared memory, and each runs half
of every P V; the ring's stages have per-half (256-dim) full / empty barriers. Same math as ws3p1 in another
summation order, so the GPU tests compare with the reference (the probe's bound) and with the API default within bf16
tolerance, not bit for bit.

CPU: the variant table, the wrapper's routing (stand-in `_C`), the binding / header, the sm_90a compile (168
registers, no spills, wgmma not serialised). GPU (`-m gpu`; run this file in its own pytest process): the probe (a
child process with a timeout), then decode b 2..132 x s_q 1 / 2 and prefill t 256 with ragged valid counts, holes of
every kind, all-hole tiles, NaN wherever no index points, auto / 1 / 3 / 4 splits (odd tiles per split), topk 576 (9
tiles), a 7-CTA persistent grid (several items per CTA).
"""

from __future__ import annotations

import importlib
import os
import pathlib
import shutil

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the @triton.jit decorators run
pytest.importorskip("triton")

import mla_checks as mc  # noqa: E402
from test_mla_fp8v import _ragged_inputs  # noqa: E402
from test_mla_split import _fp8  # noqa: E402

from deepinfer.flash_mla import reference  # noqa: E402

_WS = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_ws_decode")
_PROBE = importlib.import_module("deepinfer.flash_mla.backends.cuda._cuda_probe")
_PKG = pathlib.Path(__file__).resolve().parents[1]
_SRC = _PKG / "csrc" / "cuda"
SCALE = 512**-0.5
PAIR = list(_WS.WS3P_PAIR_OPTS)
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
needs_pair = pytest.mark.skipif(not _WS.ws3p_pair_available(), reason="_C without sparse_decode_ws3p_pair (rebuild)")


# ------------------------------------------------------------------------------------------------------ CPU


def test_ws3p2_table() -> None:
    """Opt bits: BF16 kOptPair 128, FP8 128 + kOptVec 16, timing-only ablations + 256 / 512; 64-row tiles."""
    assert _WS.WS3P_PAIR_OPTS == {"ws3p2": (128, 144), "ws3p2v": (128, 144), "ws3p2r": (1152, 144)}
    assert _WS.OPT_PAIR == 128 and _WS.OPT_PAIR | _WS.OPT_VEC == 144
    for v in PAIR:
        want = ("full", "producer") if v == "ws3p2r" else ("full", "producer", "consumer")
        assert _WS.ablations_of(v) == want and _WS.block_rows(v) == 64
        assert v not in _WS.VARIANTS
    assert _WS.PAIR_ABLATION_BITS == {"full": 0, "producer": 256, "consumer": 512}


def test_ws3p2_wrapper_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    """BF16 cache: `_C.sparse_decode_ws3p_pair` with ws3p's arguments, fp8 False and opt 128; FP8: fp8 True, opt 144
    (both names); max_ctas passed; the timing-only ablations add 256 / 512, another ablation is a ValueError; a
    `_C` without the entry point a RuntimeError saying to rebuild."""
    calls: list[tuple] = []

    class Fake:
        sparse_decode_ws3p_pair = staticmethod(lambda *a: calls.append(a))

        @staticmethod
        def ws3_block_rows() -> int:
            return 64

    monkeypatch.setattr(_WS, "_module", lambda: Fake)
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None)
    monkeypatch.setattr(_WS, "combine_splits", lambda *a, **k: None)
    monkeypatch.setattr(_WS.torch.cuda, "current_stream", lambda dev=None: type("S", (), {"cuda_stream": 7})())
    q = torch.randn(256, 64, 512).bfloat16()
    idx = torch.randint(0, 2048, (256, 640), dtype=torch.int32)
    fp8 = torch.randint(0, 256, (2048, 584), dtype=torch.uint8)
    bf16 = torch.randn(2048, 512).bfloat16()
    for v in PAIR:
        for is_fp8 in (False, True):
            _WS.sparse_attn_ws(q, fp8 if is_fp8 else bf16, idx, None, SCALE, variant=v, max_ctas=5)
            args = calls[-1]
            assert args[8:13] == (256, 64, 640, 1, 10), (v, args[8:13])
            want = 144 if is_fp8 else (1152 if v == "ws3p2r" else 128)
            assert args[-4:] == (is_fp8, 5, want, 7), (v, is_fp8, args[-4:])
    for abl, bits in (("producer", 256), ("consumer", 512)):
        _WS.sparse_attn_ws(q, fp8, idx, None, SCALE, variant="ws3p2", ablation=abl)
        assert calls[-1][-2] == 144 + bits, (abl, calls[-1][-4:])
    with pytest.raises(ValueError, match="ws3p2"):
        _WS.sparse_attn_ws(q, bf16, idx, None, SCALE, variant="ws3p2", ablation="no_xchg")
    del Fake.sparse_decode_ws3p_pair
    with pytest.raises(RuntimeError, match="rebuild"):
        _WS.sparse_attn_ws(q, bf16, idx, None, SCALE, variant="ws3p2")


def test_ws3p2_sources() -> None:
    """fm_ws3pair_decode.cu includes fm_ws3_decode.cu under FM_WS3_PAIR_TU (which drops that file's own exported
    launchers and option instances there) and launches only opts 128 / 144; the binding checks them; setmaxnreg adds up
    to the launch allocation; four one-sided named-barrier hand-overs."""
    tu = (_SRC / "fm_ws3pair_decode.cu").read_text()
    assert '#define FM_WS3_PAIR_TU 1\n#include "fm_ws3_decode.cu"\n#include "fm_ws3_pair.cuh"' in tu
    src = (_SRC / "fm_ws3_decode.cu").read_text()
    assert "#elif !defined(FM_WS3_PAIR_TU)" in src and "#if !defined(FM_WS3_VEC_TU) && !defined(FM_WS3_PAIR_TU)" in src
    hdr = (_SRC / "fm_ws3_pair.cuh").read_text()
    assert "constexpr int kOptPair = 128;" in hdr and "128 * 88 + 128 * kPairRegsWg0 + 128 * kPairRegsWg1" in hdr
    for bar in ("kBarM0", "kBarM1", "kBarP0", "kBarP1"):
        assert hdr.count(f"named_arrive({bar}, kConsumers)") == 1 and hdr.count(f"named_bar({bar}, kConsumers)") == 1
    binding = (_SRC / "fm_ws_bindings.cpp").read_text()
    assert '"sparse_decode_ws3p_pair"' in binding and "rel == 0 || rel == 256 || rel == 512 || (!fp8 && (rel == 1024 || rel == 1280))" in binding
    assert "int fm_ws3p_launch_pair(" in (_SRC / "fm_ws3_decode.h").read_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_ws3p2_source_compiles_for_sm90a_without_spills(tmp_path: pathlib.Path) -> None:
    """fm_ws3pair_decode.cu: the two pair instances and their four timing-only ablation builds, 168 registers at 384 threads, no stack or spills, wgmma
    not serialised and no warpgroup.arrive injected by ptxas."""
    out, props, regs = mc.nvcc_sm90a(_SRC / "fm_ws3pair_decode.cu", tmp_path / "pair.o")
    assert len(props) == 8 and regs == [168] * 8, out[-2000:]
    for fp8 in (0, 1):
        for mode in (0, 256, 512):
            assert f"ws3p_pair_kernelILb{fp8}ELi{mode}ELb0EE" in out, (fp8, mode)
    for mode in (0, 256):  # the register-staged BF16 producer (kPairRegStage)
        assert f"ws3p_pair_kernelILb0ELi{mode}ELb1EE" in out, mode
    assert all(p == ("0", "0", "0") for p in props), props
    assert "serialized" not in out and "C7508" not in out and "C7519" not in out, out[-2000:]


# ------------------------------------------------------------------------------------------------------ GPU


def _run(variant: str, q, kv, idx, sink, **kw) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """One call into NaN-poisoned outputs (every element must be written), synchronised."""
    out = torch.full(tuple(q.shape), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full(tuple(q.shape[:2]), float("nan"), device="cuda")
    o, s = _WS.sparse_attn_ws(q, kv, idx, sink, SCALE, out=out, lse_out=lse, variant=variant, **kw)
    assert o is out and s is lse
    torch.cuda.synchronize()
    return o, s


def _probe_or_skip() -> None:
    ok, why = _WS.probe(variant="ws3p2,ws3p2r")
    if not ok:
        pytest.skip(f"ws3p2 probe failed (test_ws3p2_probe_gpu): {why[-300:]}")


@gpu
@needs_pair
@pytest.mark.gpu
def test_ws3p2_probe_gpu() -> None:
    """The out-of-process probe (small cases, auto / 1 / 7 splits, each also on a 3-CTA grid, BF16 / FP8, NaN in
    unused slots): no fault, no hang (a child process with a timeout), within the loose bound of the reference."""
    ok, out = _WS.probe(variant="ws3p2,ws3p2r")
    print(out)
    assert ok, out


@gpu
@needs_pair
@pytest.mark.gpu
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
@pytest.mark.parametrize(
    ("t", "splits", "ctas", "sink_mode", "topk"),
    [
        (2, None, None, "random", 640),  # b 2 x s_q 1
        (4, None, None, "large", 640),  # b 2 x s_q 2 (auto: several splits per token)
        (37, 1, None, "small", 640),  # b 37 x s_q 1, one split: 10 tiles (5 pairs) per item
        (40, 1, None, "random", 576),  # 9 tiles: the last pair padded with a tile of holes
        (128, 4, None, "none", 640),  # 4 splits of 3, 3, 3, 1 tiles: odd counts per item
        (132, 3, None, "random", 640),  # b 132 x s_q 1, 3 splits
        (264, None, 7, "random", 640),  # b 132 x s_q 2 on 7 CTAs: many items per CTA (the item boundary)
        (256, None, None, "random", 640),  # prefill t 256
    ],
    ids=["b2s1", "b2s2", "b37s1_nosplit", "topk576", "split4_odd", "b132s1_split3", "b132s2_ctas7", "prefill256"],
)
def test_ws3p2_matches_reference_gpu(
    cache: str, t: int, splits: int | None, ctas: int | None, sink_mode: str, topk: int
) -> None:
    """Ragged valid counts (all-hole tiles at every token's tail and a whole hole tile 64..127 on every 3rd token),
    holes of every kind, token 1 without a valid index, NaN / 0xFF rows wherever no index points: both names' out / lse
    within the probe's bound of the reference, and of the one-scorer base (ws3p1l BF16 / ws3p1v FP8) on the same plan;
    token 1 exactly 0 / lse = sink; every output element written (NaN-poisoned buffers)."""
    _probe_or_skip()
    q, bf, idx, sink = _ragged_inputs(t, sink_mode, 7100 + t + len(sink_mode))
    idx = idx[:, :topk].contiguous()
    idx[::3, 64:128] = -1
    kv = (_fp8(bf) if cache == "fp8" else bf).cuda()
    qd, ic = q.cuda(), idx.cuda()
    sd = sink.cuda() if sink is not None else None
    kw = {"num_splits": splits, "max_ctas": ctas}
    base_name = ("ws3p1l", "ws3p1v")[int(cache == "fp8")]
    base = _run(base_name, qd, kv, ic, sd, **kw)
    got = {v: _run(v, qd, kv, ic, sd, **kw) for v in PAIR}
    ro, rl = reference.sparse_attn(qd, kv, ic, sd, SCALE)
    fails = []
    for v, r in got.items():
        for name, (wo, wl) in (("reference", (ro, rl)), (base_name, base)):
            why = _PROBE.mismatch(r[0], r[1], wo, wl)
            if why is not None:
                fails.append(f"{v} vs {name}: {why}")
    # tighter than the probe's bound: no worse than the accepted one-scorer kernel's error (x 2, + 1 bf16 ulp of
    # max |ref|: both round P and out to bf16, in other orders)
    base_err = float((base[0].float() - ro).abs().max())
    ulp = float(ro.abs().max()) * 2.0**-8
    for v, r in got.items():
        err = float((r[0].float() - ro).abs().max())
        if not err <= 2 * base_err + ulp:
            fails.append(f"{v}: max |out - ref| {err:.3e} > 2 x {base_name}'s {base_err:.3e} + {ulp:.3e}")
    assert not fails, f"{cache} t={t} splits={splits} max_ctas={ctas} topk={topk} sink={sink_mode}: " + "; ".join(fails)
    for v in PAIR:
        mc.assert_empty_token((got[v][0].cpu(), got[v][1].cpu()), sink)
