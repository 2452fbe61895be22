"""ws3p's kOptCvt builds (session 7): `sparse_attn_ws(..., variant="ws3p1c" | "ws3p1h")` ->
`_C.sparse_decode_ws3p_cvt` -> fm_ws3c_decode.cu's ws3p_decode_kernel<true, 24 | 40> (ws3p1, opt 8, whose FP8
producer uses dequant8c: e4m3 -> f16 -> bf16 by exact cvts, then one bf16x2 multiply by the bf16 block scale, instead
of dequant8's f16 -> fp32, fp32 multiply, fp32 -> bf16; ws3p1h: for half of each 8 bytes). Same math and order as
ws3p1, so their results must be BIT-IDENTICAL to ws3p1 on FP8 caches; on a BF16 cache the wrapper runs ws3p1 itself.

CPU: the exactness argument of fm_ws3_decode.cu's dequant8c, checked on all 256 e4m3 codes x all 256 scale bytes
(every e4m3 value is exact in f16 and bf16; dequant8's fp32 product is exact or inf; bf16x2_scale's bits are
2^(sb - 127) / 0 / NaN; one round-to-nearest-even of the exact product to bf16, done here by an independent integer
rounding in float64, equals dequant8's fp32 -> bf16); the wrapper's routing (stand-in `_C`), the .cu / binding
instances, the sm_90a compile of fm_ws3c_decode.cu (168 registers, no spills), the benchmark script's smoke run.
GPU (`-m gpu`): the probe, both builds bit-for-bit against ws3p1 at b 32 / 128 x s_q 2 (auto, 3 splits, 7 CTAs) and
prefill 4,096 on packed FP8 caches with holes, ragged counts and 0xFF rows in unused slots, within the probe's bound
of the reference; FP8 rows of random bytes (every e4m3 code, NaN codes, every scale byte) and of finite scales 1..134
(many bf16 subnormal products) bit-for-bit against ws3p1.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import shutil

import numpy as np
import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the @triton.jit decorators run
pytest.importorskip("triton")

import mla_checks as mc  # noqa: E402
import test_mla_ws3p as _ws3p_tests  # noqa: E402
from test_mla_split import _fp8  # noqa: E402

from deepinfer.flash_mla import reference  # noqa: E402

_WS = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_ws_decode")
_PROBE = importlib.import_module("deepinfer.flash_mla.backends.cuda._cuda_probe")
_PKG = pathlib.Path(__file__).resolve().parents[1]
_SRC = _PKG / "csrc" / "cuda"
SCALE = 512**-0.5
CVT = list(_WS.WS3P_CVT_OPTS)
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
needs_cvt = pytest.mark.skipif(not _WS.ws3p_cvt_available(), reason="_C without sparse_decode_ws3p_cvt (rebuild)")


# ------------------------------------------------------------------------------------------------------ CPU


def _e4m3_values() -> torch.Tensor:
    """float32 [256]: the value of every e4m3 code (NaN for 0x7f / 0xff)."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def _bf16_bits(x: torch.Tensor) -> np.ndarray:
    """uint16 bits of x rounded to bf16 by torch (fp32 -> bf16 round-to-nearest-even: what cvt.rn.bf16x2.f32 does)."""
    return x.to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)


def _rn_bf16_f64(v: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits of float64 v rounded ONCE to nearest-even bf16 (integer steps: subnormal quantum 2^-133,
    overflow to inf), independent of torch's conversion. NaN -> 0x7fc0."""
    a = np.abs(v)
    _, e = np.frexp(np.where(np.isfinite(a) & (a > 0), a, 1.0))
    quantum = np.ldexp(1.0, np.maximum(e - 1, -126) - 7)  # bf16: 7 stored mantissa bits, min normal 2^-126
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.rint(a / quantum) * quantum  # np.rint: ties to even
        r = np.where(np.isinf(a) | (r >= 2.0**128), np.inf, r)
    bits = (np.where(np.isnan(a), 0.0, r).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    bits |= np.where(np.signbit(v), 0x8000, 0).astype(np.uint16)
    return np.where(np.isnan(v), np.uint16(0x7FC0), bits)


def _bf16x2_scale(sb: np.ndarray) -> np.ndarray:
    """fm_ws3_decode.cu's bf16x2_scale (uint32 per scale byte)."""
    sb = sb.astype(np.uint32)
    return np.where(sb == 255, np.uint32(0x7FC07FC0), (sb << 7) * np.uint32(0x10001)).astype(np.uint32)


def test_ws3p1c_table() -> None:
    """Name, option bits (ws3p1 8 + kOptCvt 16), tile rows and base; kept out of VARIANTS (the session-6 table)."""
    assert _WS.WS3P_CVT_OPTS == {"ws3p1c": 24, "ws3p1h": 40}
    assert _WS.WS3P_CVT_BASE == {"ws3p1c": "ws3p1", "ws3p1h": "ws3p1"}
    assert _WS.WS3P_OPTS["ws3p1"] | _WS.OPT_CVT == 24 and _WS.WS3P_OPTS["ws3p1"] | _WS.OPT_CVT_HALF == 40
    for v in CVT:
        assert v not in _WS.VARIANTS and _WS.block_rows(v) == 64 and _WS.ablations_of(v) == ("full",), v


def test_dequant8c_premises_every_code_and_scale() -> None:
    """All 256 codes x 256 scale bytes: (1) e4m3 -> f16 -> bf16 is exact (same value as e4m3 -> fp32, NaN kept);
    (2) bf16x2_scale's halves are 2^(sb - 127) (0 for sb 0, NaN for 255), as dequant8's fp32 scale; (3) dequant8's fp32
    product x * s equals the float64 product (exact) or both overflow; (4) the one RN rounding of the exact product to
    bf16 (independent integer rounding) gives dequant8's bits: NaN, inf, signed zeros and subnormals included."""
    x = _e4m3_values()
    chain = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).half().bfloat16().float()
    assert torch.equal(torch.isnan(chain), torch.isnan(x)) and torch.equal(chain.nan_to_num(), x.nan_to_num())
    num = ~torch.isnan(x)
    assert torch.equal(torch.signbit(chain[num]), torch.signbit(x[num]))  # -0 (0x80) stays -0
    sb = np.arange(256, dtype=np.uint32)
    m = _bf16x2_scale(sb)
    assert np.array_equal(m >> 16, m & 0xFFFF)
    m_val = torch.from_numpy((m & 0xFFFF).astype(np.int16)).view(torch.bfloat16).float()
    s = torch.from_numpy(np.where(sb == 255, 0x7FC00000, sb << 23).astype(np.int32)).view(torch.float32)
    assert torch.equal(torch.isnan(m_val), torch.isnan(s)) and torch.equal(m_val.nan_to_num(), s.nan_to_num())
    prod32 = x[:, None] * s[None, :]  # [code, scale byte]: dequant8's fp32 product
    prod64 = x.double()[:, None] * m_val.double()[None, :]  # the exact product of dequant8c's bf16 operands
    fin = torch.isfinite(prod64) & torch.isfinite(prod32)
    assert torch.equal(prod32.double()[fin], prod64[fin])
    assert bool(((prod64.abs() >= 2.0**128) == torch.isinf(prod32))[~torch.isnan(prod64)].all())
    want = _bf16_bits(prod32)  # dequant8's bits (torch's fp32 -> bf16 RN; NaN as one canonical pattern)
    got = _rn_bf16_f64(prod64.numpy())
    nan_w, nan_g = (want & 0x7FFF) > 0x7F80, (got & 0x7FFF) > 0x7F80
    assert np.array_equal(nan_w, nan_g)
    bad = (want != got) & ~nan_w
    assert not bad.any(), [(int(c), int(b), hex(want[c, b]), hex(got[c, b])) for c, b in zip(*np.nonzero(bad))][:8]
    sub = (got & 0x7F80) == 0
    assert int((sub & ((got & 0x7F) != 0)).sum()) > 100  # the subnormal results were exercised


def _fake_c() -> tuple[type, list]:
    calls: list[tuple[str, tuple]] = []

    class Fake:
        sparse_decode_ws3p = staticmethod(lambda *a: calls.append(("ws3p", a)))
        sparse_decode_ws3p_opt = staticmethod(lambda *a: calls.append(("opt", a)))
        sparse_decode_ws3p_cvt = staticmethod(lambda *a: calls.append(("cvt", a)))

        @staticmethod
        def ws3_block_rows() -> int:
            return 64

    return Fake, calls


def test_ws3p1c_wrapper_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    """FP8 cache: `_C.sparse_decode_ws3p_cvt` with ws3p's arguments, fp8 True and opt 24; BF16 cache: ws3p1's own call
    (sparse_decode_ws3p_opt, opt 8); a `_C` without the entry point is a RuntimeError saying to rebuild."""
    fake, calls = _fake_c()
    monkeypatch.setattr(_WS, "_module", lambda: fake)
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None)
    monkeypatch.setattr(_WS, "combine_splits", lambda *a, **k: None)
    monkeypatch.setattr(_WS.torch.cuda, "current_stream", lambda dev=None: type("S", (), {"cuda_stream": 7})())
    q = torch.randn(256, 64, 512).bfloat16()
    idx = torch.randint(0, 2048, (256, 640), dtype=torch.int32)
    fp8 = torch.randint(0, 256, (2048, 584), dtype=torch.uint8)
    _WS.sparse_attn_ws(q, fp8, idx, None, SCALE, variant="ws3p1c", max_ctas=5)
    kind, args = calls[-1]
    assert kind == "cvt" and args[8:13] == (256, 64, 640, 1, 10) and args[-4:] == (True, 5, 24, 7), (kind, args)
    _WS.sparse_attn_ws(q, fp8, idx, None, SCALE, variant="ws3p1h")
    assert calls[-1][0] == "cvt" and calls[-1][1][-4:] == (True, 0, 40, 7), calls[-1]
    _WS.sparse_attn_ws(q, torch.randn(2048, 512).bfloat16(), idx, None, SCALE, variant="ws3p1c")
    kind, args = calls[-1]
    assert kind == "opt" and args[-4:] == (False, 0, 8, 7), (kind, args[-4:])
    with pytest.raises(ValueError, match="ws3p1c"):
        _WS.sparse_attn_ws(q, fp8, idx, None, SCALE, variant="ws3p1c", ablation="producer")
    with pytest.raises(ValueError, match="probe: variant"):
        _WS.probe(variant="ws3p1,ws3p1z")
    del fake.sparse_decode_ws3p_cvt
    with pytest.raises(RuntimeError, match="rebuild"):
        _WS.sparse_attn_ws(q, fp8, idx, None, SCALE, variant="ws3p1c")


def test_ws3p1c_instances_match_wrapper() -> None:
    """fm_ws3c_decode.cu builds opt 24 only (via FM_WS3_CVT_TU), fm_ws3_decode.cu's own instance lists are untouched
    by it, and the binding checks fp8 / opt 24."""
    src = (_SRC / "fm_ws3_decode.cu").read_text()
    cvt_part = src[src.index("#ifdef FM_WS3_CVT_TU") : src.index("#endif", src.index("#ifdef FM_WS3_CVT_TU"))]
    for opt in _WS.WS3P_CVT_OPTS.values():
        assert f"case {opt}: return launch_persist<true, {opt}>" in cvt_part, opt
        assert f"launch_persist<true, {opt}>" not in src.replace(cvt_part, ""), opt
    assert '#define FM_WS3_CVT_TU 1\n#include "fm_ws3_decode.cu"' in (_SRC / "fm_ws3c_decode.cu").read_text()
    binding = (_SRC / "fm_ws_bindings.cpp").read_text()
    assert "if (opt != 24 && opt != 40)" in binding and '"sparse_decode_ws3p_cvt"' in binding
    assert set(_WS.WS3P_CVT_OPTS.values()) == {24, 40}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_ws3c_source_compiles_for_sm90a_without_spills(tmp_path: pathlib.Path) -> None:
    """fm_ws3c_decode.cu: exactly the two kOptCvt instances (FP8, opt 24 and 40), 168 registers at 384 threads, no
    stack or spills, wgmma not serialised, setmaxnreg honoured."""
    out, props, regs = mc.nvcc_sm90a(_SRC / "fm_ws3c_decode.cu", tmp_path / "ws3c.o")
    assert len(props) == 2 and regs == [168, 168], out[-2000:]
    assert "ws3p_decode_kernelILb1ELi24E" in out and "ws3p_decode_kernelILb1ELi40E" in out
    assert all(p == ("0", "0", "0") for p in props), props
    assert "serialized" not in out and "C7508" not in out, out[-2000:]


def test_bench_fm_ws3p_fp8_smoke(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The benchmark script's --smoke run (CPU: the reference as a stand-in under both names, every row timed and
    bit-compared) and --table on its JSON (in process: a child interpreter would double the cost)."""
    spec = importlib.util.spec_from_file_location("bench_fm_ws3p_fp8", _PKG / "benchmarks" / "bench_fm_ws3p_fp8.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    res = tmp_path / "r.json"
    recs = bench.run(True, str(res))
    assert len(recs) == 6 and not any("error" in r for r in recs), recs
    assert all(r["bit_equal_ws3p1"] for r in recs if r["variant"] != "ws3p1"), recs
    text = bench.table(str(res))
    assert all(text.count(f"| {v} |") == 2 for v in ("ws3p1", "ws3p1c", "ws3p1h")), text


# ------------------------------------------------------------------------------------------------------ GPU


def _bits_differ(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> str | None:
    """None when out and lse are bit-identical (NaN payloads and signed zeros included), else how they differ."""
    o_eq = torch.equal(got[0].view(torch.int16), want[0].view(torch.int16))
    l_eq = torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))
    if o_eq and l_eq:
        return None
    d_out = float((got[0].float() - want[0].float()).abs().nan_to_num(float("inf")).max())
    n_out = int((got[0].view(torch.int16) != want[0].view(torch.int16)).sum())
    return f"out bits equal {o_eq} ({n_out} differ, max |diff| {d_out:.3e}), lse bits equal {l_eq}"


def _probe_or_skip() -> None:
    ok, why = _WS.probe(variant=",".join(["ws3p1", *CVT]))
    if not ok:
        pytest.skip(f"ws3p1c probe failed (test_ws3p1c_probe_gpu): {why[-300:]}")


@gpu
@needs_cvt
@pytest.mark.gpu
def test_ws3p1c_probe_gpu() -> None:
    """The out-of-process probe (small cases, auto / 1 / 7 splits, each also on a 3-CTA grid, BF16 / FP8, NaN in
    unused slots): no fault, no hang, within the loose bound of the reference."""
    ok, out = _WS.probe(variant=",".join(CVT))
    print(out)
    assert ok, out


@gpu
@needs_cvt
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("t", "splits", "ctas"),
    [(64, None, None), (256, None, None), (256, 3, None), (256, None, 7), (4096, None, None)],
    ids=["b32s2", "b128s2", "b128s2_split3", "b128s2_ctas7", "prefill4096"],
)
def test_ws3p1cvt_bit_equal_ws3p1_fp8_gpu(t: int, splits: int | None, ctas: int | None) -> None:
    """Packed FP8 cache (0xFF rows wherever no index points, ~5 % holes of every kind, token 1 without a valid index):
    ws3p1c's and ws3p1h's out / lse bit-for-bit ws3p1's on the same plan and grid, all within the probe's bound of the
    reference,
    token 1 exactly 0 / lse = sink."""
    _probe_or_skip()
    q, cache, idx, sink = _ws3p_tests._inputs(t, 9700 + t)
    kv, qd, ic, sd = _fp8(cache).cuda(), q.cuda(), idx.cuda(), sink.cuda()
    kw = {"num_splits": splits, "max_ctas": ctas}
    base = _ws3p_tests._run("ws3p1", qd, kv, ic, sd, **kw)
    got = {v: _ws3p_tests._run(v, qd, kv, ic, sd, **kw) for v in CVT}
    fails = [f"{v} != ws3p1: {why}" for v in CVT if (why := _bits_differ(got[v], base)) is not None]
    for lo in range(0, t, 512):  # the reference in chunks (its gather is [tokens, 640, 512] fp32)
        ro, rl = reference.sparse_attn(qd[lo : lo + 512], kv, ic[lo : lo + 512], sd, SCALE)
        for v, r in (("ws3p1", base), *got.items()):
            why = _PROBE.mismatch(r[0][lo : lo + 512], r[1][lo : lo + 512], ro, rl)
            if why is not None:
                fails.append(f"{v} tokens {lo}..: {why}")
    assert not fails, f"t={t} splits={splits} max_ctas={ctas}: " + "; ".join(fails)
    for v in CVT:
        mc.assert_empty_token((got[v][0].cpu(), got[v][1].cpu()), sink)


@gpu
@needs_cvt
@pytest.mark.gpu
@pytest.mark.parametrize("topk", [64, 200, 640])
def test_ws3p1cvt_every_code_bit_equal_gpu(topk: int) -> None:
    """FP8 rows of uniformly random bytes (every e4m3 code incl. NaN codes 0x7f / 0xff, every scale byte 0..255,
    random RoPE bits), then rows with scale bytes in 1..134, no NaN codes and finite RoPE with a small q (many bf16
    subnormal products: catches a flush-to-zero in the bf16 multiply): ws3p1c's and ws3p1h's bits equal ws3p1's."""
    _probe_or_skip()
    g = torch.Generator().manual_seed(700 + topk)
    t, n = 256, 4096
    rows = torch.randint(0, 256, (n, 584), generator=g, dtype=torch.uint8)
    idx = torch.rand(t, n, generator=g).topk(topk, dim=-1).indices.to(torch.int32)
    idx[torch.rand(t, topk, generator=g) < 0.05] = -1
    q = torch.randn(t, 64, 512, generator=g).bfloat16()
    finite = rows.clone()
    finite[:, 576:583] = torch.randint(1, 135, (n, 7), generator=g, dtype=torch.uint8)
    finite[:, :448][(finite[:, :448] & 0x7F) == 0x7F] = 0x3C  # no NaN codes
    finite[:, 448:576] = torch.randn(n, 64, generator=g).bfloat16().view(torch.uint8).reshape(n, 128)
    fails = []
    for name, kv, qq in (("random bytes", rows, q), ("finite scales", finite, (q.float() * 1e-3).bfloat16())):
        kvd, qd, ic = kv.cuda(), qq.cuda(), idx.cuda()
        base = _ws3p_tests._run("ws3p1", qd, kvd, ic, None)
        for v in CVT:
            why = _bits_differ(_ws3p_tests._run(v, qd, kvd, ic, None), base)
            if why is not None:
                fails.append(f"{name} {v}: {why}")
    assert not fails, f"topk={topk}: " + "; ".join(fails)
