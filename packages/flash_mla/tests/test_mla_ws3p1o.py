"""ws3p's adaptive overlap builds (session 10; the API default from 128 tokens): `sparse_attn_ws(...,
variant="ws3p1oa" / "ws3p1voa")` (the same builds) -> `_C.sparse_decode_ws3p_ovl` -> fm_ws3_decode.cu's
ws3p_decode_kernel<false, 106> (BF16: ws3p1l + kOptOverlap + kOptOvlAdapt) or <true, 120> (FP8: ws3p1v + the same).
The scoring warpgroup issues S_{i+1} before softmax_i only if its tile has landed, else behind P_i V_i or in ws3p1's
order: the same math in the same order, so the results must be BIT-IDENTICAL to ws3p1l (BF16 cache) / ws3p1v (FP8
cache). Session 11's "ws3p1voaw" (<true, 632>: + kOptVecWide, 12 FP8 rows per producer warp in flight; the FP8 default
from 64 tokens; on a BF16 cache it runs 106) is held to the same bits. (Session 10's blocking "ws3p1o" / "ws3p1vo" and P-mbarrier "ws3p1oam" / "ws3p1voam" builds were measured
slower and removed: the names are refused.)

CPU: the variant table, the wrapper's routing (stand-in `_C`), the .cu / binding instances, the removed code paths,
the benchmark script's smoke run. (The sm_90a compile of the instances:
tests/test_mla_ws.py::test_ws3_source_compiles_for_sm90a_...)
GPU (`-m gpu`; run this file in its own pytest process): the probe (a child process with a timeout: a hang cannot
take the run down), then bit-for-bit against the default on decode b 2..132 x s_q 1 / 2 and prefill t 256 (ragged
valid counts, holes of every kind, all-hole tiles, NaN wherever no index points, auto / 1 / 3 splits, a 7-CTA
persistent grid: several items per CTA), both within the probe's bound of the reference.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the @triton.jit decorators run
pytest.importorskip("triton")

import mla_checks as mc  # noqa: E402
from test_mla_fp8v import _bits_differ, _ragged_inputs  # noqa: E402
from test_mla_split import _fp8  # noqa: E402

from deepinfer.flash_mla import reference  # noqa: E402

_WS = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_ws_decode")
_PROBE = importlib.import_module("deepinfer.flash_mla.backends.cuda._cuda_probe")
_PKG = pathlib.Path(__file__).resolve().parents[1]
_SRC = _PKG / "csrc" / "cuda"
SCALE = 512**-0.5
OVL = list(_WS.WS3P_OVL_OPTS)
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
needs_ovl = pytest.mark.skipif(not _WS.ws3p_ovl_available(), reason="_C without sparse_decode_ws3p_ovl (rebuild)")


# ------------------------------------------------------------------------------------------------------ CPU


def test_ws3p1o_table() -> None:
    """Opt bits: BF16 = ws3p1l (10) + kOptOverlap 32 + kOptOvlAdapt 64, FP8 = ws3p1v (24) + the same; bases per
    cache; the names are accepted by the wrapper's checks (kernel only: no ablation modes) and by probe."""
    assert _WS.WS3P_OVL_OPTS == {"ws3p1oa": (106, 120), "ws3p1voa": (106, 120), "ws3p1voaw": (106, 632)}
    assert _WS.WS3P_OVL_BASE == ("ws3p1l", "ws3p1v")
    both = _WS.OPT_OVL | _WS.OPT_OVL_ADAPT
    assert _WS.WS3P_OPTS["ws3p1l"] | both == 106 and _WS.WS3P_VEC_OPTS["ws3p1v"] | both == 120
    assert not hasattr(_WS, "OPT_PBAR")
    for v in OVL:
        assert _WS.ablations_of(v) == ("full",) and _WS.block_rows(v) == 64
        assert v not in _WS.VARIANTS  # the session-6 table stays as pinned


def _fake_c() -> tuple[type, list]:
    calls: list[tuple[str, tuple]] = []

    class Fake:
        sparse_decode_ws3p_opt = staticmethod(lambda *a: calls.append(("opt", a)))
        sparse_decode_ws3p_vec = staticmethod(lambda *a: calls.append(("vec", a)))
        sparse_decode_ws3p_ovl = staticmethod(lambda *a: calls.append(("ovl", a)))

        @staticmethod
        def ws3_block_rows() -> int:
            return 64

    return Fake, calls


def _patch_wrapper(monkeypatch: pytest.MonkeyPatch) -> tuple[type, list]:
    """The wrapper on a stand-in `_C` (`_fake_c`): shape checks, the combine and the stream stubbed (stream 7)."""
    fake, calls = _fake_c()
    monkeypatch.setattr(_WS, "_module", lambda: fake)
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None)
    monkeypatch.setattr(_WS, "combine_splits", lambda *a, **k: None)
    monkeypatch.setattr(_WS.torch.cuda, "current_stream", lambda dev=None: type("S", (), {"cuda_stream": 7})())
    return fake, calls


def test_ws3p1o_wrapper_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    """BF16 cache: `_C.sparse_decode_ws3p_ovl` with ws3p's arguments, fp8 False and opt 106; FP8 cache: fp8 True and
    opt 120 (both names); max_ctas passed; a bad ablation and a removed name are ValueErrors (wrapper and probe); a
    `_C` without the entry point is a RuntimeError saying to rebuild."""
    fake, calls = _patch_wrapper(monkeypatch)
    q = torch.randn(256, 64, 512).bfloat16()
    idx = torch.randint(0, 2048, (256, 640), dtype=torch.int32)
    fp8 = torch.randint(0, 256, (2048, 584), dtype=torch.uint8)
    bf16 = torch.randn(2048, 512).bfloat16()
    want = {(v, is_fp8): (120 if is_fp8 else 106) for v in ("ws3p1oa", "ws3p1voa") for is_fp8 in (False, True)}
    want |= {("ws3p1voaw", False): 106, ("ws3p1voaw", True): 632}
    for (v, is_fp8), opt in want.items():
        _WS.sparse_attn_ws(q, fp8 if is_fp8 else bf16, idx, None, SCALE, variant=v, max_ctas=5)
        kind, args = calls[-1]
        assert kind == "ovl" and args[8:13] == (256, 64, 640, 1, 10), (v, kind, args[8:13])
        assert args[-4:] == (is_fp8, 5, opt, 7), (v, is_fp8, args[-4:])
    with pytest.raises(ValueError, match="ws3p1oa"):
        _WS.sparse_attn_ws(q, bf16, idx, None, SCALE, variant="ws3p1oa", ablation="producer")
    for gone in ("ws3p1o", "ws3p1vo", "ws3p1oam", "ws3p1voam"):  # session 10's losing builds: removed
        with pytest.raises(ValueError, match="variant"):
            _WS.sparse_attn_ws(q, bf16, idx, None, SCALE, variant=gone)
        with pytest.raises(ValueError, match="probe: variant"):
            _WS.probe(variant="ws3p1oa," + gone)
    del fake.sparse_decode_ws3p_ovl
    with pytest.raises(RuntimeError, match="rebuild"):
        _WS.sparse_attn_ws(q, bf16, idx, None, SCALE, variant="ws3p1oa")


def test_ws3p1o_instances_match_wrapper() -> None:
    """fm_ws3_decode.cu instantiates exactly the wrapper's opts per cache (in its own launcher, not in the kOptVec
    translation unit) and no removed one, with per-warpgroup setmaxnreg adding up to the launch allocation; the
    binding checks them; the removed code paths (kOptPBar's mbarrier exchange and its watchdog wait, the blocking
    form's WHEN 0 branch) are gone."""
    src = (_SRC / "fm_ws3_decode.cu").read_text()
    for bf16_opt, fp8_opt in _WS.WS3P_OVL_OPTS.values():
        assert f"case {bf16_opt}: return launch_persist<false, {bf16_opt}>" in src, bf16_opt
        assert f"case {fp8_opt}: return launch_persist<true, {fp8_opt}>" in src, fp8_opt
    for gone in (42, 56, 234, 248):
        assert f"launch_persist<false, {gone}>" not in src and f"launch_persist<true, {gone}>" not in src, gone
    for gone in ("kOptPBar =", "mbar_wait_wd", "p_full", "WHEN", "PBAR"):
        assert gone not in src, gone
    assert "kOvlRegsWg0 = 240, kOvlRegsWg1 = 176" in src and "128 * 88 + 128 * kOvlRegsWg0" in src
    binding = (_SRC / "fm_ws_bindings.cpp").read_text()
    assert '"sparse_decode_ws3p_ovl"' in binding and "fp8 ? (opt == 120 || opt == 632 || opt == 1658)" in binding
    assert "int fm_ws3p_launch_ovl(" in (_SRC / "fm_ws3_decode.h").read_text()


def test_bench_fm_overlap_smoke(tmp_path: pathlib.Path) -> None:
    """The benchmark script's --smoke run (CPU: the reference as a stand-in under every name, every row timed and
    bit-compared) and --table on its JSON (in process: a child interpreter would double the cost)."""
    spec = importlib.util.spec_from_file_location("bench_fm_overlap", _PKG / "benchmarks" / "bench_fm_overlap.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    res = tmp_path / "r.json"
    recs = bench.run(True, str(res))
    assert len(recs) == 8 and not any("error" in r for r in recs), recs
    assert all(r["bit_equal_base"] for r in recs if r["variant"] != r["base"]), recs
    text = bench.table(str(res))
    for v in ("ws3p1l", "ws3p1oa", "ws3p1v", "ws3p1voa"):
        assert text.count(f"| {v} |") == 2, (v, text)
    for gone in ("ws3p1o", "ws3p1oam", "ws3p1vo", "ws3p1voam"):
        assert f"| {gone} |" not in text, (gone, text)


# ------------------------------------------------------------------------------------------------------ GPU


def gpu_inputs(t: int, sink_mode: str, seed: int, cache: str) -> tuple:
    """`_ragged_inputs` with a whole hole tile (64..127) on every 3rd token, on the GPU: (q, kv of the cache format,
    indices, sink or None, the CPU sink for `mc.assert_empty_token`)."""
    q, bf, idx, sink = _ragged_inputs(t, sink_mode, seed)
    idx[::3, 64:128] = -1
    kv = (_fp8(bf) if cache == "fp8" else bf).cuda()
    return q.cuda(), kv, idx.cuda(), sink.cuda() if sink is not None else None, sink


def _run(variant: str, q, kv, idx, sink, **kw) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """One call into NaN-poisoned outputs (every element must be written), synchronised."""
    out = torch.full(tuple(q.shape), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full(tuple(q.shape[:2]), float("nan"), device="cuda")
    o, s = _WS.sparse_attn_ws(q, kv, idx, sink, SCALE, out=out, lse_out=lse, variant=variant, **kw)
    assert o is out and s is lse
    torch.cuda.synchronize()
    return o, s


def _probe_or_skip() -> None:
    ok, why = _WS.probe(variant=",".join(OVL[::2]))  # ws3p1oa (ws3p1voa: the same builds)
    if not ok:
        pytest.skip(f"ws3p1o probe failed (test_ws3p1o_probe_gpu): {why[-300:]}")


@gpu
@needs_ovl
@pytest.mark.gpu
def test_ws3p1o_probe_gpu() -> None:
    """The out-of-process probe (small cases, auto / 1 / 7 splits, each also on a 3-CTA grid, BF16 / FP8, NaN in
    unused slots): no fault, no hang (a child process with a timeout), within the loose bound of the reference."""
    ok, out = _WS.probe(variant=",".join(OVL[::2]))
    print(out)
    assert ok, out


@gpu
@needs_ovl
@pytest.mark.gpu
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
@pytest.mark.parametrize(
    ("t", "splits", "ctas", "sink_mode"),
    [
        (2, None, None, "random"),  # b 2 x s_q 1
        (4, None, None, "large"),  # b 2 x s_q 2 (auto: several splits per token)
        (37, 1, None, "small"),  # b 37 x s_q 1, one split: up to 10 tiles per item
        (128, None, None, "none"),  # b 64 x s_q 2
        (132, 3, None, "random"),  # b 132 x s_q 1, 3 splits
        (264, None, 7, "random"),  # b 132 x s_q 2 on 7 CTAs: many items per CTA (the item boundary)
        (256, None, None, "random"),  # prefill t 256
    ],
    ids=["b2s1", "b2s2", "b37s1_nosplit", "b64s2", "b132s1_split3", "b132s2_ctas7", "prefill256"],
)
def test_ws3p1o_bit_equal_default_gpu(cache: str, t: int, splits: int | None, ctas: int | None, sink_mode: str) -> None:
    """Ragged valid counts (all-hole tiles at every token's tail and a whole hole tile 64..127 on every 3rd token),
    holes of every kind, token 1 without a valid index, NaN / 0xFF rows wherever no index points: the overlap build's
    out / lse bit-for-bit the default's (ws3p1l BF16 / ws3p1v FP8) on the same plan and grid, all within the probe's
    bound of the reference, token 1 exactly 0 / lse = sink."""
    _probe_or_skip()
    qd, kv, ic, sd, sink = gpu_inputs(t, sink_mode, 5100 + t + len(sink_mode), cache)
    kw = {"num_splits": splits, "max_ctas": ctas}
    base_name = _WS.WS3P_OVL_BASE[int(cache == "fp8")]
    base = _run(base_name, qd, kv, ic, sd, **kw)
    got = {v: _run(v, qd, kv, ic, sd, **kw) for v in OVL}
    fails = [f"{v} != {base_name}: {why}" for v in OVL if (why := _bits_differ(got[v], base)) is not None]
    ro, rl = reference.sparse_attn(qd, kv, ic, sd, SCALE)
    for v, r in ((base_name, base), *got.items()):
        why = _PROBE.mismatch(r[0], r[1], ro, rl)
        if why is not None:
            fails.append(f"{v} vs reference: {why}")
    assert not fails, f"{cache} t={t} splits={splits} max_ctas={ctas} sink={sink_mode}: " + "; ".join(fails)
    for v in OVL:
        mc.assert_empty_token((got[v][0].cpu(), got[v][1].cpu()), sink)
