"""ws3p's kOptDq builds (session 8): `sparse_attn_ws(..., variant="ws3p1s8" | "ws3p1s16" | "ws3p1s24")` ->
`_C.sparse_decode_ws3p_dq` -> fm_ws3s_decode.cu's ws3p_decode_kernel<true, 72 | 136 | 264>: ws3p1 (opt 8) whose consumer
warpgroup 1 dequantises the last R = 8 / 16 / 24 rows of the NEXT FP8 tile while warpgroup 0 scores the current one
(the producer warpgroup does the other 64 - R rows). New barrier protocol: the full barriers count 128 producer + 128
warpgroup-1 arrivals, warpgroup 1 waits on the stage's empty barrier as the producer does, the producer publishes the
next tile's row ids (Smem::xrow) with each full arrival; the CTA's first tile's rows are dequantised by warpgroup 1
before its item loop. Same dequant8, same stage bytes: results BIT-IDENTICAL to ws3p1 (BF16 cache: ws3p1 itself).
The build has a watchdog (FM_WS3_WATCHDOG: a wait stuck for 2^22 polls traps), and every GPU test first runs the
out-of-process probe, so a protocol bug fails instead of hanging. Run this file in its own pytest process on the GPU.

CPU: names / option bits, the wrapper's routing (stand-in `_C`), the .cu / binding instances, the sm_90a compile of
fm_ws3s_decode.cu (168 registers, no spills), the benchmark script's smoke run.
GPU (`-m gpu`): the probe; each build bit-for-bit against ws3p1 and against the reference (loose bound on all tokens,
the package's tight reference / float64-oracle bounds on the first 16) at b 1 / 32 / 128 x s_q 1 / 2 / 4, with 3
splits, with 3 / 7 CTAs (several items per CTA: the next tile is then often the next item's first), ragged top-k
(600, 200, 64: one tile per item), NaN (0xFF) rows in unused slots, ~5 % holes of every kind, a token without any
valid index; FP8 rows of random bytes (every e4m3 code, NaN codes, every scale byte) bit-for-bit against ws3p1.
"""

from __future__ import annotations

import importlib
import importlib.util
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
from mla_checks import poison_unused  # noqa: E402
from test_mla_split import _check, _fp8  # noqa: E402
from test_mla_triton import _holes, _sink  # noqa: E402

from deepinfer.flash_mla import reference  # noqa: E402

_WS = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_ws_decode")
_PROBE = importlib.import_module("deepinfer.flash_mla.backends.cuda._cuda_probe")
_PKG = pathlib.Path(__file__).resolve().parents[1]
_SRC = _PKG / "csrc" / "cuda"
SCALE = 512**-0.5
DQ = list(_WS.WS3P_DQ_OPTS)
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
needs_dq = pytest.mark.skipif(not _WS.ws3p_dq_available(), reason="_C without sparse_decode_ws3p_dq (rebuild)")


# ------------------------------------------------------------------------------------------------------ CPU


def test_ws3p1s_table() -> None:
    """Names, option bits (ws3p1 8 + kOptDq8 64 / kOptDq16 128 / kOptDq24 256), tile rows and base; kept out of
    VARIANTS (the session-6 table) and apart from the session-7 kOptCvt names."""
    assert _WS.WS3P_DQ_OPTS == {"ws3p1s8": 72, "ws3p1s16": 136, "ws3p1s24": 264, "ws3p1s16e": 648, "ws3p1s24e": 776}
    assert _WS.WS3P_DQ_BASE == dict.fromkeys(DQ, "ws3p1")
    assert (_WS.OPT_DQ8, _WS.OPT_DQ16, _WS.OPT_DQ24, _WS.OPT_DQ_EARLY) == (64, 128, 256, 512)
    for v in DQ:
        assert v not in _WS.VARIANTS and v not in _WS.WS3P_CVT_OPTS, v
        assert _WS.block_rows(v) == 64 and _WS.ablations_of(v) == ("full",), v


def _fake_c() -> tuple[type, list]:
    calls: list[tuple[str, tuple]] = []

    class Fake:
        sparse_decode_ws3p = staticmethod(lambda *a: calls.append(("ws3p", a)))
        sparse_decode_ws3p_opt = staticmethod(lambda *a: calls.append(("opt", a)))
        sparse_decode_ws3p_cvt = staticmethod(lambda *a: calls.append(("cvt", a)))
        sparse_decode_ws3p_dq = staticmethod(lambda *a: calls.append(("dq", a)))

        @staticmethod
        def ws3_block_rows() -> int:
            return 64

    return Fake, calls


def test_ws3p1s_wrapper_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    """FP8 cache: `_C.sparse_decode_ws3p_dq` with ws3p's arguments, fp8 True and the variant's opt; BF16 cache:
    ws3p1's own call (sparse_decode_ws3p_opt, opt 8); a bad ablation / probe name is a ValueError; a `_C` without the
    entry point is a RuntimeError saying to rebuild."""
    fake, calls = _fake_c()
    monkeypatch.setattr(_WS, "_module", lambda: fake)
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None)
    monkeypatch.setattr(_WS, "combine_splits", lambda *a, **k: None)
    monkeypatch.setattr(_WS.torch.cuda, "current_stream", lambda dev=None: type("S", (), {"cuda_stream": 7})())
    q = torch.randn(256, 64, 512).bfloat16()
    idx = torch.randint(0, 2048, (256, 640), dtype=torch.int32)
    fp8 = torch.randint(0, 256, (2048, 584), dtype=torch.uint8)
    for v, opt in _WS.WS3P_DQ_OPTS.items():
        _WS.sparse_attn_ws(q, fp8, idx, None, SCALE, variant=v, max_ctas=5)
        kind, args = calls[-1]
        assert kind == "dq" and args[8:13] == (256, 64, 640, 1, 10) and args[-4:] == (True, 5, opt, 7), (kind, args)
    _WS.sparse_attn_ws(q, torch.randn(2048, 512).bfloat16(), idx, None, SCALE, variant="ws3p1s16")
    kind, args = calls[-1]
    assert kind == "opt" and args[-4:] == (False, 0, 8, 7), (kind, args[-4:])
    with pytest.raises(ValueError, match="ws3p1s8"):
        _WS.sparse_attn_ws(q, fp8, idx, None, SCALE, variant="ws3p1s8", ablation="producer")
    with pytest.raises(ValueError, match="probe: variant"):
        _WS.probe(variant="ws3p1s16,ws3p1s32")
    del fake.sparse_decode_ws3p_dq
    with pytest.raises(RuntimeError, match="rebuild"):
        _WS.sparse_attn_ws(q, fp8, idx, None, SCALE, variant="ws3p1s16")


def test_ws3p1s_instances_match_wrapper() -> None:
    """fm_ws3s_decode.cu builds exactly the wrapper's opts (via FM_WS3_DQ_TU, with the watchdog), fm_ws3_decode.cu's
    and fm_ws3c_decode.cu's own instance lists do not, and the binding checks fp8 / the same opts."""
    src = (_SRC / "fm_ws3_decode.cu").read_text()
    start = src.index("#ifdef FM_WS3_DQ_TU")
    dq_part = src[start : src.index("#endif", start)]
    for name in ("kOptDq8", "kOptDq16", "kOptDq24", "kOptDq16 | kOptDqEarly", "kOptDq24 | kOptDqEarly"):
        inst = f"launch_persist<true, kOptOneScorer | {name}>"
        assert f"case kOptOneScorer | {name}:" in dq_part and inst in dq_part, name
        assert inst not in src.replace(dq_part, ""), name
    assert "constexpr int kOptDq8 = 64, kOptDq16 = 128, kOptDq24 = 256, kOptDqEarly = 512;" in src
    tu = (_SRC / "fm_ws3s_decode.cu").read_text()
    assert "#define FM_WS3_DQ_TU 1\n#define FM_WS3_WATCHDOG 1" in tu and '#include "fm_ws3_decode.cu"' in tu
    binding = (_SRC / "fm_ws_bindings.cpp").read_text()
    assert "if (opt != 72 && opt != 136 && opt != 264 && opt != 648 && opt != 776)" in binding
    assert '"sparse_decode_ws3p_dq"' in binding
    assert set(_WS.WS3P_DQ_OPTS.values()) == {72, 136, 264, 648, 776}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_ws3s_source_compiles_for_sm90a_without_spills(tmp_path: pathlib.Path) -> None:
    """fm_ws3s_decode.cu: exactly the five kOptDq instances (FP8, opt 72 / 136 / 264 / 648 / 776), 168 registers at 384
    threads, no stack or spills (warpgroup 1 holds O [64, 256] and its dequant batch), wgmma not serialised."""
    out, props, regs = mc.nvcc_sm90a(_SRC / "fm_ws3s_decode.cu", tmp_path / "ws3s.o")
    assert len(props) == 5 and regs == [168] * 5, out[-2000:]
    for opt in (72, 136, 264, 648, 776):
        assert f"ws3p_decode_kernelILb1ELi{opt}E" in out, opt
    assert all(p == ("0", "0", "0") for p in props), props
    assert "serialized" not in out and "C7508" not in out, out[-2000:]


def test_bench_fm_ws3p_dq_smoke(tmp_path: pathlib.Path) -> None:
    """The benchmark script's --smoke run (CPU: the reference as a stand-in under every name, every row timed and
    bit-compared) and --table on its JSON (in process: a child interpreter would double the cost)."""
    spec = importlib.util.spec_from_file_location("bench_fm_ws3p_dq", _PKG / "benchmarks" / "bench_fm_ws3p_dq.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    res = tmp_path / "r.json"
    recs = bench.run(True, str(res))
    assert len(recs) == (1 + len(DQ)) * 2 and not any("error" in r for r in recs), recs
    assert all(r["bit_equal_ws3p1"] for r in recs if r["variant"] != "ws3p1"), recs
    text = bench.table(str(res))
    assert all(text.count(f"| {v} |") == 2 for v in ("ws3p1", *DQ)), text


# ------------------------------------------------------------------------------------------------------ GPU


def _inputs(t: int, topk: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """CPU inputs: q [t, 64, 512] bf16; a 16,384-row BF16 cache with NaN in every slot no index names (0xFF rows once
    packed); int32 [t, topk] distinct slots per token with ~5 % holes of every kind (-1, negative, one past the end,
    INT32_MAX), token 1 (when t > 1) none valid; a random sink."""
    g = torch.Generator().manual_seed(seed)
    n = 16384
    q = (3 * torch.randn(t, 64, 512, generator=g)).bfloat16()
    idx = torch.rand(t, n - 64, generator=g).topk(topk, dim=-1).indices.to(torch.int32)
    idx[torch.rand(t, topk, generator=g) < 0.05] = -1
    if t > 1:
        idx[1] = -1
    idx = _holes(idx, n, g)
    cache = poison_unused(torch.randn(n, 512, generator=g).bfloat16(), [idx])
    return q, cache, idx, _sink("random", 64, g)


def _run(variant: str, q, kv, idx, sink, **kw) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """One call into NaN-poisoned outputs (every element must be written), synchronised."""
    out = torch.full(tuple(q.shape), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full(tuple(q.shape[:2]), float("nan"), device="cuda")
    o, s = _WS.sparse_attn_ws(q, kv, idx, sink, SCALE, out=out, lse_out=lse, variant=variant, **kw)
    assert o is out and s is lse
    torch.cuda.synchronize()
    return o, s


def _bits_differ(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> str | None:
    """None when out and lse are bit-identical (NaN payloads and signed zeros included), else how they differ."""
    o_eq = torch.equal(got[0].view(torch.int16), want[0].view(torch.int16))
    l_eq = torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))
    if o_eq and l_eq:
        return None
    d_out = float((got[0].float() - want[0].float()).abs().nan_to_num(float("inf")).max())
    n_out = int((got[0].view(torch.int16) != want[0].view(torch.int16)).sum())
    bad = (got[0].view(torch.int16) != want[0].view(torch.int16)).nonzero()[:4].tolist()
    return f"out bits equal {o_eq} ({n_out} differ at e.g. {bad}, max |diff| {d_out:.3e}), lse bits equal {l_eq}"


def _probe_or_skip() -> None:
    ok, why = _WS.probe(variant=",".join(DQ))  # the probe test's child process (cached per process)
    if not ok:
        pytest.skip(f"ws3p1s probe failed (test_ws3p1s_probe_gpu): {why[-300:]}")


@gpu
@needs_dq
@pytest.mark.gpu
def test_ws3p1s_probe_gpu() -> None:
    """The out-of-process probe (small cases, auto / 1 / 7 splits, each also on a 3-CTA grid, BF16 / FP8, NaN in
    unused slots): no fault, no hang (the watchdog traps), within the loose bound of the reference."""
    ok, out = _WS.probe(variant=",".join(DQ))
    print(out)
    assert ok, out


_CASES = [
    # (b, s_q, topk, splits, max_ctas)
    (1, 1, 640, None, None),
    (1, 2, 640, None, None),
    (1, 4, 640, None, None),
    (32, 1, 640, None, None),
    (32, 2, 640, None, None),
    (32, 4, 640, None, None),
    (128, 1, 640, None, None),
    (128, 2, 640, None, None),
    (128, 4, 640, None, None),
    (128, 2, 640, 3, None),
    (128, 2, 640, None, 7),
    (32, 2, 600, None, 3),
    (32, 2, 200, None, 5),
    (32, 2, 64, None, 5),
    (1, 1, 64, None, None),
]


@gpu
@needs_dq
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("b", "s_q", "topk", "splits", "ctas"), _CASES, ids=[f"b{c[0]}s{c[1]}k{c[2]}sp{c[3]}c{c[4]}" for c in _CASES]
)
def test_ws3p1s_bit_equal_ws3p1_fp8_gpu(b: int, s_q: int, topk: int, splits: int | None, ctas: int | None) -> None:
    """Packed FP8 cache (0xFF rows wherever no index points, ~5 % holes of every kind, token 1 without a valid index):
    every kOptDq build's out / lse bit-for-bit ws3p1's on the same plan and grid; all within the probe's bound of the
    reference on every token and the package's tight bounds (reference, float64 oracle) on the first 16 tokens;
    token 1 exactly 0 / lse = sink."""
    _probe_or_skip()
    t = b * s_q  # decode: the b x s_q query tokens flattened
    q, cache, idx, sink = _inputs(t, topk, 9800 + 17 * t + topk)
    kv, qd, ic, sd = _fp8(cache).cuda(), q.cuda(), idx.cuda(), sink.cuda()
    kw = {"num_splits": splits, "max_ctas": ctas}
    base = _run("ws3p1", qd, kv, ic, sd, **kw)
    got = {v: _run(v, qd, kv, ic, sd, **kw) for v in DQ}
    fails = [f"{v} != ws3p1: {why}" for v in DQ if (why := _bits_differ(got[v], base)) is not None]
    for lo in range(0, t, 512):  # the reference in chunks (its gather is [tokens, topk, 512] fp32)
        ro, rl = reference.sparse_attn(qd[lo : lo + 512], kv, ic[lo : lo + 512], sd, SCALE)
        for v, r in (("ws3p1", base), *got.items()):
            why = _PROBE.mismatch(r[0][lo : lo + 512], r[1][lo : lo + 512], ro, rl)
            if why is not None:
                fails.append(f"{v} tokens {lo}..: {why}")
    assert not fails, f"b={b} s_q={s_q} topk={topk} splits={splits} max_ctas={ctas}: " + "; ".join(fails)
    m = min(t, 16)  # tight bounds for one build: the others are bit-equal to ws3p1, hence to it (asserted above)
    one = got["ws3p1s16"]
    _check((one[0][:m], one[1][:m]), q[:m], [cache], [idx[:m]], sink, SCALE, (True,), gpu_p=True)
    for v in DQ:
        if t > 1:
            mc.assert_empty_token((got[v][0].cpu(), got[v][1].cpu()), sink)


@gpu
@needs_dq
@pytest.mark.gpu
@pytest.mark.parametrize("topk", [64, 640])
def test_ws3p1s_every_code_bit_equal_gpu(topk: int) -> None:
    """FP8 rows of uniformly random bytes (every e4m3 code incl. NaN codes 0x7f / 0xff, every scale byte 0..255,
    random RoPE bits) in the rows warpgroup 1 dequantises as in the producer's: every kOptDq build's bits equal
    ws3p1's, with 3 CTAs (several items each) and one CTA per SM."""
    _probe_or_skip()
    g = torch.Generator().manual_seed(800 + topk)
    t, n = 256, 4096
    rows = torch.randint(0, 256, (n, 584), generator=g, dtype=torch.uint8)
    idx = torch.rand(t, n, generator=g).topk(topk, dim=-1).indices.to(torch.int32)
    idx[torch.rand(t, topk, generator=g) < 0.05] = -1
    q = torch.randn(t, 64, 512, generator=g).bfloat16()
    kvd, qd, ic = rows.cuda(), q.cuda(), idx.cuda()
    fails = []
    for ctas in (None, 3):
        base = _run("ws3p1", qd, kvd, ic, None, max_ctas=ctas)
        for v in DQ:
            why = _bits_differ(_run(v, qd, kvd, ic, None, max_ctas=ctas), base)
            if why is not None:
                fails.append(f"max_ctas={ctas} {v}: {why}")
    assert not fails, f"topk={topk}: " + "; ".join(fails)
