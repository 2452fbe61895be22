"""ws3p's kOptVec build (session 9): `sparse_attn_ws(..., variant="ws3p1v")` -> `_C.sparse_decode_ws3p_vec` ->
fm_ws3v_decode.cu's ws3p_decode_kernel<true, 24> (ws3p1, opt 8, whose FP8 producer is fp8v_tile: lane u dequantises the
row's 16-byte e4m3 unit u with its own scale byte, no shuffles or divergent branches, a separate RoPE pass; dequant8v:
e4m3 -> f16 -> f32 -> bf16 (exact), then one bf16x2 multiply by bf16x2_scale(sb)). Same math and order as ws3p1, so
its results must be BIT-IDENTICAL to ws3p1 on FP8 caches; on a BF16 cache the wrapper runs ws3p1 itself.

CPU: the emulation of dequant8v against dequant8 on all 256 e4m3 codes x all 256 scale bytes (pack_fp8_kv writes
105..247 and 255: a superset), the wrapper's routing (stand-in `_C`), the .cu / binding instance, the sm_90a compile
of fm_ws3v_decode.cu (168 registers, no spills), the benchmark script's smoke run.
GPU (`-m gpu`; run this file in its own pytest process): the probe, ws3p1v bit-for-bit against ws3p1 on V4 shapes
(b 32 / 128 x s_q 2 with auto / 3 splits / 7 CTAs, prefill 4,096; packed FP8 caches with 0xFF rows wherever no index
points, holes of every kind, ragged valid counts, large / small / random / no sink), within the probe's bound of the
reference; FP8 rows of random bytes (every e4m3 code, NaN codes, every scale byte) and of finite scales 1..134 (bf16
subnormal products) bit-for-bit against ws3p1.
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
from mla_checks import poison_unused  # noqa: E402
from test_mla_split import _fp8  # noqa: E402
from test_mla_triton import _holes, _sink  # noqa: E402

from deepinfer.flash_mla import reference  # noqa: E402
from deepinfer.flash_mla.kv_format import pack_fp8_kv_ref  # noqa: E402

_WS = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_ws_decode")
_PROBE = importlib.import_module("deepinfer.flash_mla.backends.cuda._cuda_probe")
_PKG = pathlib.Path(__file__).resolve().parents[1]
_SRC = _PKG / "csrc" / "cuda"
SCALE = 512**-0.5
VEC = list(_WS.WS3P_VEC_OPTS)
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
needs_vec = pytest.mark.skipif(not _WS.ws3p_vec_available(), reason="_C without sparse_decode_ws3p_vec (rebuild)")


# ------------------------------------------------------------------------------------------------------ CPU


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
    """fm_fp8v.cuh's bf16x2_scale (uint32 per scale byte; moved there from fm_ws3_decode.cu in session 9)."""
    sb = sb.astype(np.uint32)
    return np.where(sb == 255, np.uint32(0x7FC07FC0), (sb << 7) * np.uint32(0x10001)).astype(np.uint32)


def test_ws3p1v_table() -> None:
    """Name, option bits (ws3p1 8 + kOptVec 16), tile rows and base; kept out of VARIANTS (the session-6 table)."""
    assert _WS.WS3P_VEC_OPTS == {"ws3p1v": 24} and _WS.WS3P_VEC_BASE == {"ws3p1v": "ws3p1"}
    assert _WS.WS3P_OPTS["ws3p1"] | _WS.OPT_VEC == 24
    for v in VEC:
        assert v not in _WS.VARIANTS and _WS.block_rows(v) == 64 and _WS.ablations_of(v) == ("full",), v
    assert not hasattr(_WS, "WS3P_CVT_OPTS")  # session 7's ws3p1c / ws3p1h are gone


@pytest.mark.parametrize(("opt", "vec", "fp8", "want"), [
    (True, True, True, "ws3p1v"), (True, False, True, "ws3p1"), (True, True, False, "ws3p1l"),
    (False, True, True, "ws3"),
])  # fmt: skip
@pytest.mark.parametrize("ovl", [False, True])
def test_default_variant_prefers_ws3p1v_on_fp8(
    opt: bool, vec: bool, fp8: bool, want: str, ovl: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From 64 tokens without an extra cache the FP8 default is ws3p1v when `_C` has it (session 9: bit-equal to ws3p1,
    1.14-1.27x), else ws3p1; the BF16 default stays ws3p1l; without the option builds (and no ws3p) it is ws3. Since
    session 10 that holds at 64..127 tokens whatever `_C` has, and from 128 (`WS3P_OVL_MIN_TOKENS`) only for a `_C`
    without the overlap builds (with them: ws3p1voa / ws3p1oa, test_mla_ws3_default.py)."""
    monkeypatch.setattr(_WS, "ws3p_opt_available", lambda: opt)
    monkeypatch.setattr(_WS, "ws3p_vec_available", lambda: vec)
    monkeypatch.setattr(_WS, "ws3p_ovl_available", lambda: ovl)
    monkeypatch.setattr(_WS, "ws3p_vw_available", lambda: False)  # (with it: ws3p1voaw from 64, test_mla_ws3_default)
    monkeypatch.setattr(_WS, "ws3p_thresh_available", lambda: False)  # (session 14's ws3p1oat: the same file)
    monkeypatch.setattr(_WS, "ws3p_available", lambda: False)
    assert _WS.default_variant(127, False, fp8) == want
    big = ("ws3p1voa" if fp8 else "ws3p1oa") if ovl and opt else want
    assert _WS.default_variant(256, False, fp8) == big
    assert _WS.default_variant(32, False, fp8) == "ws3"


def test_pack_fp8_kv_scale_range_is_covered() -> None:
    """pack_fp8_kv writes scale bytes 105 (amax floor 1e-4) .. 247 (fp32 max) and 255 (NaN / inf tiles): all inside
    the 0..255 that the emulation below checks."""
    x = torch.zeros(4, 512)
    x[0, :448] = 1e-9  # floored amax
    x[1, :448] = 3.0e38
    x[2, :448] = float("nan")
    x[3, :448] = torch.linspace(-3, 3, 448)
    sb = pack_fp8_kv_ref(x)[:, 576:583].int()
    assert int(sb[0].min()) == 105 and int(sb[1].max()) == 247 and int(sb[2].min()) == 255, sb


def test_dequant8v_emulation_equals_dequant8() -> None:
    """All 256 codes x 256 scale bytes, dequant8v's chain step by step against dequant8's: (1) e4m3 -> f16 -> f32 ->
    bf16 (pack) is exact, NaN kept, -0 kept; (2) bf16x2_scale's halves are 2^(sb - 127) (0 for sb 0, NaN for 255), as
    dequant8's fp32 scale; (3) the exact product of dequant8v's bf16 operands equals dequant8's fp32 product (or both
    overflow); (4) ONE round-to-nearest-even of that product to bf16 (independent integer rounding: what the bf16x2
    multiply does, no subnormal flush) gives dequant8's bits (its fp32 product rounded by torch, i.e. cvt.rn.bf16x2):
    NaN, inf, signed zeros and subnormals included."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    x = codes.float()  # dequant8: e4m3 -> f16 -> f32 (exact)
    chain = codes.half().float().bfloat16()  # dequant8v: e4m3 -> f16 -> f32 -> bf16 (the pack)
    cf = chain.float()
    assert torch.equal(torch.isnan(cf), torch.isnan(x)) and torch.equal(cf.nan_to_num(), x.nan_to_num())
    num = ~torch.isnan(x)
    assert torch.equal(torch.signbit(cf[num]), torch.signbit(x[num]))  # -0 (0x80) stays -0
    sb = np.arange(256, dtype=np.uint32)
    m = _bf16x2_scale(sb)
    assert np.array_equal(m >> 16, m & 0xFFFF)
    m_val = torch.from_numpy((m & 0xFFFF).astype(np.int16)).view(torch.bfloat16).float()
    s = torch.from_numpy(np.where(sb == 255, 0x7FC00000, sb << 23).astype(np.int32)).view(torch.float32)
    assert torch.equal(torch.isnan(m_val), torch.isnan(s)) and torch.equal(m_val.nan_to_num(), s.nan_to_num())
    prod32 = x[:, None] * s[None, :]  # [code, scale byte]: dequant8's fp32 product
    prod64 = cf.double()[:, None] * m_val.double()[None, :]  # exact product of dequant8v's bf16 operands
    fin = torch.isfinite(prod64) & torch.isfinite(prod32)
    assert torch.equal(prod32.double()[fin], prod64[fin])
    assert bool(((prod64.abs() >= 2.0**128) == torch.isinf(prod32))[~torch.isnan(prod64)].all())
    want = prod32.to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)  # dequant8's bits
    got = _rn_bf16_f64(prod64.numpy())
    nan_w, nan_g = (want & 0x7FFF) > 0x7F80, (got & 0x7FFF) > 0x7F80
    assert np.array_equal(nan_w, nan_g)
    bad = (want != got) & ~nan_w
    assert not bad.any(), [(int(c), int(b), hex(want[c, b]), hex(got[c, b])) for c, b in zip(*np.nonzero(bad))][:8]
    sub = (got & 0x7F80) == 0
    assert int((sub & ((got & 0x7F) != 0)).sum()) > 100  # the subnormal results were exercised
    assert int(nan_g[:, 255].sum()) == 256 and int(nan_g[0x7F].sum()) == 256  # sb 255 and the NaN code: NaN


def _swz(r: int, c: int) -> int:
    """fm_ws3_decode.cu swz(r, c, 64): byte offset of 16-byte chunk c of row r in the swizzled [64, 512] bf16 stage."""
    return (c >> 3) * 64 * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4)


def test_fp8v_tile_store_layout_model() -> None:
    """A Python mirror of fp8v_tile's address arithmetic (4 warps x 32 lanes, k loop, fp8v_store4's I0 + i rows, the
    first chunk 2u + h with h = (u / 4) % 2, the `^ 16` second chunk, the RoPE pass) against swz: every (row, chunk) of
    the tile written, each from the right 16 source bytes of its row (e4m3 bytes 8c.. for c < 56, RoPE bytes
    448 + 16 (c - 56).. after); lanes that write the same address (28..31 repeat lane 27) write the same bytes; and
    every STS.128's quarter warps (8 lanes: one wavefront) hit 8 different 16-byte bank groups or the same address."""
    writes: dict[int, set[tuple[int, int]]] = {}
    conflicts = []

    def sts(lanes: list[tuple[int, int, int]]) -> None:  # (address, row, source byte) per lane of one STS.128
        for a, r, src in lanes:
            writes.setdefault(a, set()).add((r, src))
        for q in range(4):
            addrs = {a for a, _, _ in lanes[8 * q : 8 * q + 8]}
            if len({(a >> 4) & 7 for a in addrs}) != len(addrs):
                conflicts.append(sorted(hex(a) for a in addrs))

    for w in range(4):
        r0 = 16 * w
        for j in range(4):  # RoPE pass
            lanes = []
            for lane in range(32):
                e, rl = lane & 7, lane >> 3
                r = r0 + rl + 4 * j
                lanes.append((7 * 8192 + r * 128 + ((e ^ ((rl + 4 * j) & 7)) << 4), r, 448 + 16 * e))
            sts(lanes)
        for k in range(2):
            for i0 in (0, 4):
                for i in range(4):
                    first, second = [], []
                    for lane in range(32):
                        u = min(lane, 27)
                        h = (u >> 2) & 1
                        base, l5 = (u >> 2) * 8192 + r0 * 128, ((u & 3) << 5) | (h << 4)
                        assert base & 16 == 0
                        r = r0 + 8 * k + i0 + i
                        a = base + k * 1024 + (i0 + i) * 128 + (l5 ^ (((i0 + i) & 7) << 4))
                        first.append((a, r, 16 * u + 8 * h))  # chunk 2u + h: the lane's lo (bytes at k1)
                        second.append((a ^ 16, r, 16 * u + 8 - 8 * h))  # chunk 2u + 1 - h: hi (bytes at k2)
                    sts(first)
                    sts(second)
    want = {_swz(r, c): (r, 8 * c if c < 56 else 448 + 16 * (c - 56)) for r in range(64) for c in range(64)}
    assert set(writes) == set(want) and len(want) == 64 * 64
    bad = [(hex(a), sorted(v), want[a]) for a, v in writes.items() if v != {want[a]}]
    assert not bad, bad[:8]
    assert not conflicts, conflicts[:4]


def _fake_c() -> tuple[type, list]:
    calls: list[tuple[str, tuple]] = []

    class Fake:
        sparse_decode_ws3p = staticmethod(lambda *a: calls.append(("ws3p", a)))
        sparse_decode_ws3p_opt = staticmethod(lambda *a: calls.append(("opt", a)))
        sparse_decode_ws3p_vec = staticmethod(lambda *a: calls.append(("vec", a)))

        @staticmethod
        def ws3_block_rows() -> int:
            return 64

    return Fake, calls


def test_ws3p1v_wrapper_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    """FP8 cache: `_C.sparse_decode_ws3p_vec` with ws3p's arguments, fp8 True and opt 24; BF16 cache: ws3p1's own call
    (sparse_decode_ws3p_opt, opt 8); a `_C` without the entry point is a RuntimeError saying to rebuild."""
    fake, calls = _fake_c()
    monkeypatch.setattr(_WS, "_module", lambda: fake)
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None)
    monkeypatch.setattr(_WS, "combine_splits", lambda *a, **k: None)
    monkeypatch.setattr(_WS.torch.cuda, "current_stream", lambda dev=None: type("S", (), {"cuda_stream": 7})())
    q = torch.randn(256, 64, 512).bfloat16()
    idx = torch.randint(0, 2048, (256, 640), dtype=torch.int32)
    fp8 = torch.randint(0, 256, (2048, 584), dtype=torch.uint8)
    _WS.sparse_attn_ws(q, fp8, idx, None, SCALE, variant="ws3p1v", max_ctas=5)
    kind, args = calls[-1]
    assert kind == "vec" and args[8:13] == (256, 64, 640, 1, 10) and args[-4:] == (True, 5, 24, 7), (kind, args)
    _WS.sparse_attn_ws(q, torch.randn(2048, 512).bfloat16(), idx, None, SCALE, variant="ws3p1v")
    kind, args = calls[-1]
    assert kind == "opt" and args[-4:] == (False, 0, 8, 7), (kind, args[-4:])
    with pytest.raises(ValueError, match="ws3p1v"):
        _WS.sparse_attn_ws(q, fp8, idx, None, SCALE, variant="ws3p1v", ablation="producer")
    with pytest.raises(ValueError, match="probe: variant"):
        _WS.probe(variant="ws3p1,ws3p1c")
    del fake.sparse_decode_ws3p_vec
    with pytest.raises(RuntimeError, match="rebuild"):
        _WS.sparse_attn_ws(q, fp8, idx, None, SCALE, variant="ws3p1v")


def test_ws3p1v_instances_match_wrapper() -> None:
    """fm_ws3v_decode.cu builds opt 24 only (via FM_WS3_VEC_TU), fm_ws3_decode.cu's own instance lists are untouched
    by it, the session-7 kOptCvt sources are gone, and the binding checks fp8 / opt 24."""
    src = (_SRC / "fm_ws3_decode.cu").read_text()
    vec_part = src[src.index("#ifdef FM_WS3_VEC_TU") : src.index("#endif", src.index("#ifdef FM_WS3_VEC_TU"))]
    for opt in _WS.WS3P_VEC_OPTS.values():
        assert f"case {opt}: return launch_persist<true, {opt}>" in vec_part, opt
        assert f"launch_persist<true, {opt}>" not in src.replace(vec_part, ""), opt
    assert '#define FM_WS3_VEC_TU 1\n#include "fm_ws3_decode.cu"' in (_SRC / "fm_ws3v_decode.cu").read_text()
    assert not (_SRC / "fm_ws3c_decode.cu").exists() and "dequant8c(" not in src and "kOptCvtHalf =" not in src
    binding = (_SRC / "fm_ws_bindings.cpp").read_text()
    assert "opt != 24" in binding and '"sparse_decode_ws3p_vec"' in binding and "ws3p_cvt" not in binding


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_ws3v_source_compiles_for_sm90a_without_spills(tmp_path: pathlib.Path) -> None:
    """fm_ws3v_decode.cu: exactly the kOptVec instance (FP8, opt 24), 168 registers at 384 threads, no stack or
    spills (the producer's 88 registers after setmaxnreg hold two 4-row batches and the RoPE pass), wgmma not
    serialised."""
    out, props, regs = mc.nvcc_sm90a(_SRC / "fm_ws3v_decode.cu", tmp_path / "ws3v.o")
    assert len(props) == 1 and regs == [168], out[-2000:]
    assert "ws3p_decode_kernelILb1ELi24E" in out
    assert all(p == ("0", "0", "0") for p in props), props
    assert "serialized" not in out and "C7508" not in out, out[-2000:]


def test_bench_fm_fp8v_smoke(tmp_path: pathlib.Path) -> None:
    """The benchmark script's --smoke run (CPU: the reference as a stand-in under both names, every row timed and
    bit-compared) and --table on its JSON (in process: a child interpreter would double the cost)."""
    spec = importlib.util.spec_from_file_location("bench_fm_fp8v", _PKG / "benchmarks" / "bench_fm_fp8v.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    res = tmp_path / "r.json"
    recs = bench.run(True, str(res))
    assert len(recs) == 4 and not any("error" in r for r in recs), recs
    assert all(r["bit_equal_base"] for r in recs if r["variant"] != "ws3p1"), recs
    text = bench.table(str(res))
    assert all(text.count(f"| {v} |") == 2 for v in ("ws3p1", "ws3p1v")), text


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
    ok, why = _WS.probe(variant=",".join(["ws3p1", *VEC]))
    if not ok:
        pytest.skip(f"ws3p1v probe failed (test_ws3p1v_probe_gpu): {why[-300:]}")


def _ragged_inputs(t: int, sink_mode: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, object]:
    """CPU inputs: q [t, 64, 512] bf16; a 16,384-row cache with NaN wherever no index points (0xFF FP8 rows); int32
    [t, 640] distinct slots, each token's valid count ragged (its tail after a random length are holes of every kind,
    plus ~5 % holes inside), token 1 none valid; the sink of `sink_mode`."""
    g = torch.Generator().manual_seed(seed)
    n, k = 16384, 640
    q = (3 * torch.randn(t, 64, 512, generator=g)).bfloat16()
    idx = torch.rand(t, n - 64, generator=g).topk(k, dim=-1).indices.to(torch.int32)
    valid = torch.randint(1, k + 1, (t, 1), generator=g)
    idx[torch.arange(k)[None, :] >= valid] = -1
    idx[torch.rand(t, k, generator=g) < 0.05] = -1
    idx[1] = -1
    idx = _holes(idx, n, g)
    cache = poison_unused(torch.randn(n, 512, generator=g).bfloat16(), [idx])
    return q, cache, idx, _sink(sink_mode, 64, g)


@gpu
@needs_vec
@pytest.mark.gpu
def test_ws3p1v_probe_gpu() -> None:
    """The out-of-process probe (small cases, auto / 1 / 7 splits, each also on a 3-CTA grid, BF16 / FP8, NaN in
    unused slots): no fault, no hang (a child process with a timeout), within the loose bound of the reference."""
    ok, out = _WS.probe(variant=",".join(VEC))
    print(out)
    assert ok, out


@gpu
@needs_vec
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("t", "splits", "ctas", "sink_mode"),
    [
        (64, None, None, "random"),
        (256, None, None, "large"),
        (256, 1, None, "small"),
        (256, 3, None, "none"),
        (256, None, 7, "random"),
        (4096, None, None, "random"),
    ],
    ids=["b32s2", "b128s2_bigsink", "b128s2_nosplit_smallsink", "b128s2_split3_nosink", "b128s2_ctas7", "prefill4096"],
)
def test_ws3p1v_bit_equal_ws3p1_fp8_gpu(t: int, splits: int | None, ctas: int | None, sink_mode: str) -> None:
    """Packed FP8 cache (0xFF rows wherever no index points, ragged valid counts, holes of every kind, token 1 without
    a valid index): ws3p1v's out / lse bit-for-bit ws3p1's on the same plan and grid, both within the probe's bound of
    the reference, token 1 exactly 0 / lse = sink."""
    _probe_or_skip()
    q, cache, idx, sink = _ragged_inputs(t, sink_mode, 9900 + t + len(sink_mode))
    kv, qd, ic = _fp8(cache).cuda(), q.cuda(), idx.cuda()
    sd = sink.cuda() if sink is not None else None
    kw = {"num_splits": splits, "max_ctas": ctas}
    base = _ws3p_tests._run("ws3p1", qd, kv, ic, sd, **kw)
    got = {v: _ws3p_tests._run(v, qd, kv, ic, sd, **kw) for v in VEC}
    fails = [f"{v} != ws3p1: {why}" for v in VEC if (why := _bits_differ(got[v], base)) is not None]
    for lo in range(0, t, 512):  # the reference in chunks (its gather is [tokens, 640, 512] fp32)
        ro, rl = reference.sparse_attn(qd[lo : lo + 512], kv, ic[lo : lo + 512], sd, SCALE)
        for v, r in (("ws3p1", base), *got.items()):
            why = _PROBE.mismatch(r[0][lo : lo + 512], r[1][lo : lo + 512], ro, rl)
            if why is not None:
                fails.append(f"{v} tokens {lo}..: {why}")
    assert not fails, f"t={t} splits={splits} max_ctas={ctas} sink={sink_mode}: " + "; ".join(fails)
    for v in VEC:
        mc.assert_empty_token((got[v][0].cpu(), got[v][1].cpu()), sink)


@gpu
@needs_vec
@pytest.mark.gpu
@pytest.mark.parametrize("topk", [64, 200, 640])
def test_ws3p1v_every_code_bit_equal_gpu(topk: int) -> None:
    """FP8 rows of uniformly random bytes (every e4m3 code incl. NaN codes 0x7f / 0xff, every scale byte 0..255,
    random RoPE bits), then rows with scale bytes in 1..134, no NaN codes and finite RoPE with a small q (many bf16
    subnormal products: catches a flush-to-zero in the bf16 multiply): ws3p1v's bits equal ws3p1's."""
    _probe_or_skip()
    g = torch.Generator().manual_seed(900 + topk)
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
        for v in VEC:
            why = _bits_differ(_ws3p_tests._run(v, qd, kvd, ic, None), base)
            if why is not None:
                fails.append(f"{name} {v}: {why}")
    assert not fails, f"topk={topk}: " + "; ".join(fails)
