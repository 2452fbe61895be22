"""ws3p's threshold-rescale builds (session 14): `sparse_attn_ws(..., variant="ws3p1oat")` ->
`_C.sparse_decode_ws3p_ovl` -> fm_ws3_decode.cu's ws3p_decode_kernel<false, 1130> (BF16: the default ws3p1oa, 106, + kOptThresh 1024) or
<true, 1658> (FP8: the default ws3p1voaw, 632, + kOptLazy 2 + kOptThresh). The scoring warpgroup keeps a row's
running max until a tile's max passes it by more than 8 (log2 units), so alpha is exactly 1 on most tiles and the
lazy skip drops both warpgroups' O rescale; exp2 takes the raw score through one FFMA with the scale. Same math as the
defaults, other rounding: NOT bit-equal to them, held to the probe's bound of the reference instead.

CPU: the variant table, the wrapper's routing (stand-in `_C`), the .cu / binding instances. (The sm_90a compile:
tests/test_mla_ws.py::test_ws3_source_compiles_for_sm90a_...)
GPU (`-m gpu`): the probe (a child process with a timeout), then against the reference and the default on decode
b 2..132 x s_q 1 / 2 and prefill t 256 (ragged valid counts, holes of every kind, all-hole tiles, NaN wherever no
index points, auto / 1 / 3 splits, a 7-CTA persistent grid, sinks large and small, scores of std ~3 so the running max
moves past the threshold).
"""

from __future__ import annotations

import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the @triton.jit decorators run
pytest.importorskip("triton")

import mla_checks as mc  # noqa: E402
# the overlap builds' test module: its wrapper stand-in, runner, inputs and module handles serve these builds too
from test_mla_ws3p1o import _PROBE, _SRC, _WS, SCALE, _patch_wrapper, _run, gpu, gpu_inputs  # noqa: E402

from deepinfer.flash_mla import reference  # noqa: E402

needs_t = pytest.mark.skipif(not _WS.ws3p_thresh_available(), reason="_C without the kOptThresh builds (rebuild)")


def test_ws3p1t_table() -> None:
    """Opts: the defaults' builds (BF16 106, FP8 632) + kOptThresh 1024 (FP8 also + kOptLazy 2); one name for both
    caches, kernel only (no ablation modes), 64-row tiles, not in the session-6 table nor among the bit-equal overlap
    builds."""
    assert _WS.OPT_THRESH == 1024 and _WS.WS3P_THRESH_OPTS == {"ws3p1oat": (1130, 1658)}
    bf16_opt, fp8_opt = _WS.WS3P_THRESH_OPTS["ws3p1oat"]
    assert bf16_opt == _WS.WS3P_OVL_OPTS["ws3p1oa"][0] | _WS.OPT_THRESH
    assert fp8_opt == _WS.WS3P_OVL_OPTS["ws3p1voaw"][1] | 2 | _WS.OPT_THRESH
    assert _WS.ablations_of("ws3p1oat") == ("full",) and _WS.block_rows("ws3p1oat") == 64
    assert "ws3p1oat" not in _WS.VARIANTS and "ws3p1oat" not in _WS.WS3P_OVL_OPTS


def test_ws3p1t_wrapper_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    """BF16 cache: `_C.sparse_decode_ws3p_ovl` with fp8 False and opt 1130; FP8 cache: fp8 True and opt 1658; a bad
    ablation is a ValueError naming the variant; the probe accepts the name."""
    _, calls = _patch_wrapper(monkeypatch)
    q = torch.randn(256, 64, 512).bfloat16()
    idx = torch.randint(0, 2048, (256, 640), dtype=torch.int32)
    for kv, is_fp8, opt in (
        (torch.randn(2048, 512).bfloat16(), False, 1130),
        (torch.randint(0, 256, (2048, 584), dtype=torch.uint8), True, 1658),
    ):
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3p1oat", max_ctas=5)
        kind, args = calls[-1]
        assert kind == "ovl" and args[-4:] == (is_fp8, 5, opt, 7), (kind, args[-4:])
    with pytest.raises(ValueError, match="ws3p1oat"):
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3p1oat", ablation="producer")


def test_ws3p1t_instances() -> None:
    """fm_ws3_decode.cu instantiates both opts in the overlap launcher, with kOptThresh's static check (only with the
    lazy skip) and the threshold constant; the binding accepts them and lists them in ws3p_ovl_opts."""
    src = (_SRC / "fm_ws3_decode.cu").read_text()
    assert "case 1130: return launch_persist<false, 1130>" in src
    assert "case 1658: return launch_persist<true, 1658>" in src
    assert "kOptThresh = 1024" in src and "constexpr float kThreshLog2 = 8.f;" in src
    assert 'static_assert(!kThresh || kLazy, "kOptThresh: with kOptLazy' in src
    binding = (_SRC / "fm_ws_bindings.cpp").read_text()
    assert "(opt == 120 || opt == 632 || opt == 1658) : (opt == 106 || opt == 1130)" in binding
    assert "pybind11::make_tuple(106, 120, 632, 1130, 1658)" in binding


def _probe_or_skip() -> None:
    ok, why = _WS.probe(variant="ws3p1oat")
    if not ok:
        pytest.skip(f"ws3p1oat probe failed (test_ws3p1t_probe_gpu): {why[-300:]}")


@gpu
@needs_t
@pytest.mark.gpu
def test_ws3p1t_probe_gpu() -> None:
    """The out-of-process probe (small cases, auto / 1 / 7 splits, each also on a 3-CTA grid, BF16 / FP8, NaN in
    unused slots): no fault, no hang, within the loose bound of the reference."""
    ok, out = _WS.probe(variant="ws3p1oat")
    print(out)
    assert ok, out


@gpu
@needs_t
@pytest.mark.gpu
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
@pytest.mark.parametrize(
    ("t", "splits", "ctas", "sink_mode"),
    [
        (4, None, None, "large"),  # b 2 x s_q 2 (auto: several splits per token)
        (37, 1, None, "small"),  # b 37 x s_q 1, one split: up to 10 tiles per item
        (128, None, None, "none"),  # b 64 x s_q 2
        (132, 3, None, "random"),  # b 132 x s_q 1, 3 splits
        (264, None, 7, "random"),  # b 132 x s_q 2 on 7 CTAs: many items per CTA
        (256, None, None, "random"),  # prefill t 256
    ],
    ids=["b2s2", "b37s1_nosplit", "b64s2", "b132s1_split3", "b132s2_ctas7", "prefill256"],
)
def test_ws3p1t_matches_reference_gpu(cache: str, t: int, splits: int | None, ctas: int | None, sink_mode: str) -> None:
    """Ragged valid counts, holes of every kind (a whole hole tile 64..127 on every 3rd token), token 1 without a valid
    index, NaN / 0xFF rows wherever no index points, outputs poisoned with NaN: ws3p1oat within the probe's bound of
    the reference and of the default build (same plan and grid); token 1 exactly 0 / lse = sink."""
    _probe_or_skip()
    qd, kv, ic, sd, sink = gpu_inputs(t, sink_mode, 7100 + t + len(sink_mode), cache)
    kw = {"num_splits": splits, "max_ctas": ctas}
    got = _run("ws3p1oat", qd, kv, ic, sd, **kw)
    default = _run("ws3p1voaw" if cache == "fp8" else "ws3p1oa", qd, kv, ic, sd, **kw)
    ro, rl = reference.sparse_attn(qd, kv, ic, sd, SCALE)
    fails = [f"{name}: {why}" for name, (o, lse) in (("reference", (ro, rl)), ("default", default))
             if (why := _PROBE.mismatch(got[0], got[1], o, lse)) is not None]  # fmt: skip
    assert not fails, f"{cache} t={t} splits={splits} max_ctas={ctas} sink={sink_mode}: " + "; ".join(fails)
    mc.assert_empty_token((got[0].cpu(), got[1].cpu()), sink)
