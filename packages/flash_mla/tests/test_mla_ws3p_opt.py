"""ws3p's option builds (session 6, GPU-run there): `sparse_attn_ws(..., variant="ws3pw" | "ws3pl" | "ws3pe" |
"ws3px" | "ws3p1" | "ws3p1l")` -> `_C.sparse_decode_ws3p_opt` -> fm_ws3_decode.cu's ws3p_decode_kernel<FP8, OPT>
(OPT bits kOptWideFp8 1, kOptLazy 2, kOptEarlyS 4, kOptOneScorer 8; `cuda_ws_decode.WS3P_OPTS`). The first four keep
ws3p's arithmetic and order, so each must be BIT-IDENTICAL to ws3p (out and lse) on both caches (`WS3P_BIT_EXACT`);
ws3p1 (one scoring warpgroup) sums in another order: checked against the reference and the float64 oracle instead,
and ws3p1l (+ the lazy rescale) bit-for-bit against ws3p1.

CPU: what the wrapper hands the binding (a stand-in `_C`: the option bits, ws3p still on its own entry point, a stale
`_C` refused), that the .cu instantiates exactly the option sets the wrapper can ask for, the probe's comma list, the
benchmark's rows. The sm_90a compile check (168 registers, no spills, for all 21 instances) is test_mla_ws.py::
test_ws3_source_compiles_for_sm90a_without_spills.
GPU (`-m gpu`): the probe (all six builds in one child process), then per case (b 32 x s_q 1 on a 5-CTA grid, b 128 x
s_q 2 auto / 3 splits / a 7-CTA grid, prefill t 4,096) and cache (BF16, FP8): the bit-exact builds bit-for-bit against
ws3p, every build within the probe's bound of the reference, ws3p1's first 64 tokens within the package's tight bounds
of the reference and the float64 oracle; FP8 rows of random bytes (every e4m3 code, NaN codes and every scale byte
included) bit-for-bit against ws3p.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import pathlib
import re
import types

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the @triton.jit decorators run
pytest.importorskip("triton")

import mla_checks as mc  # noqa: E402
import test_mla_ws3p as _ws3p_tests  # noqa: E402
from test_mla_split import _check, _fp8  # noqa: E402

from deepinfer.flash_mla import reference  # noqa: E402

_WS = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_ws_decode")
_PROBE = importlib.import_module("deepinfer.flash_mla.backends.cuda._cuda_probe")
_SRC = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda"
SCALE = 512**-0.5
OPTS = list(_WS.WS3P_OPT_VARIANTS)
EXACT = list(_WS.WS3P_BIT_EXACT)
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
needs_opt = pytest.mark.skipif(not _WS.ws3p_opt_available(), reason="_C without sparse_decode_ws3p_opt (rebuild)")


# ------------------------------------------------------------------------------------------------------ CPU


class _FakeC:
    """Stand-in `_C` (CPU) recording sparse_decode_ws3p[_opt] calls; `old`: built before the option builds."""

    def __init__(self, old: bool = False) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.sparse_decode_ws3p = lambda *a: self.calls.append(("ws3p", a))
        if not old:
            self.sparse_decode_ws3p_opt = lambda *a: self.calls.append(("opt", a))

    def ws3_block_rows(self) -> int:
        return 64

    def sparse_decode_ws(self, *args) -> None:  # noqa: ANN002
        self.calls.append(("ws", args))


def _stub(monkeypatch: pytest.MonkeyPatch, fake: _FakeC) -> None:
    monkeypatch.setattr(_WS, "_module", lambda: fake)
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None)
    monkeypatch.setattr(_WS, "combine_splits", lambda *a, **k: None)
    monkeypatch.setattr(_WS.torch.cuda, "current_stream", lambda dev=None: type("S", (), {"cuda_stream": 7})())


def test_ws3p_opt_table() -> None:
    """The names, option bits and tile rows: six new variants, all 64-row, kernel only (no ablations); all but the
    one-scorer builds are bit-exact."""
    assert _WS.WS3P_OPTS == {"ws3p": 0, "ws3pw": 1, "ws3pl": 2, "ws3pe": 4, "ws3px": 7, "ws3p1": 8, "ws3p1l": 10}
    assert set(OPTS) == set(_WS.WS3P_OPTS) - {"ws3p"} and set(OPTS) <= set(_WS.VARIANTS)
    assert set(EXACT) == set(OPTS) - {"ws3p1", "ws3p1l"}
    for v in OPTS:
        assert _WS.block_rows(v) == 64 and _WS.ablations_of(v) == ("full",), v


def test_ws3p_opt_wrapper_passes_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each option build calls `_C.sparse_decode_ws3p_opt` with ws3p's arguments (same 64-row plan, fp8, max_ctas)
    plus its option bits before the stream; ws3p itself still calls sparse_decode_ws3p (unchanged signature). A `_C`
    without the entry point is a RuntimeError saying to rebuild, before any launch."""
    fake = _FakeC()
    _stub(monkeypatch, fake)
    kv = torch.randn(2048, 512).bfloat16()
    q = torch.randn(256, 64, 512).bfloat16()
    idx = torch.randint(0, 2048, (256, 640), dtype=torch.int32)
    for v in OPTS:
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant=v, max_ctas=7)
        kind, args = fake.calls[-1]
        assert kind == "opt" and args[8:13] == (256, 64, 640, 1, 10), (v, kind, args[8:13])
        assert args[-4:] == (False, 7, _WS.WS3P_OPTS[v], 7), (v, args[-4:])
    _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3p")
    assert fake.calls[-1][0] == "ws3p" and fake.calls[-1][1][-3:] == (False, 0, 7)
    with pytest.raises(ValueError, match="extra_kv"):
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3px", extra_kv=kv, extra_indices=idx)
    n = len(fake.calls)
    _stub(monkeypatch, _FakeC(old=True))
    with pytest.raises(RuntimeError, match="rebuild"):
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3pl")
    assert len(fake.calls) == n


def test_ws3p_opt_instances_match_wrapper() -> None:
    """fm_ws3_decode.cu's launch_persist_opt instantiates every option set the wrapper asks for: FP8 all of
    WS3P_OPTS' values, BF16 the same with kOptWideFp8 (1) cleared; the binding accepts opt 0..15."""
    src = (_SRC / "fm_ws3_decode.cu").read_text()
    body = src[src.index("static int launch_persist_opt") :]
    fp8_part, bf16_part = body.split("} else {", 1)
    fp8_pairs = re.findall(r"case (\d+): return launch_persist<true, (\d+)>", fp8_part)
    bf16_pairs = re.findall(r"case (\d+): return launch_persist<false, (\d+)>", bf16_part)
    assert fp8_pairs and bf16_pairs and all(a == b for a, b in fp8_pairs + bf16_pairs), (fp8_pairs, bf16_pairs)
    fp8_cases, bf16_cases = {int(a) for a, _ in fp8_pairs}, {int(a) for a, _ in bf16_pairs}
    want = set(_WS.WS3P_OPTS.values())
    assert want <= fp8_cases, (want, fp8_cases)
    assert {o & ~1 for o in want} <= bf16_cases, bf16_cases
    assert "opt < 0 || opt > 15" in (_SRC / "fm_ws_bindings.cpp").read_text()


def test_ws3p_opt_self_check_comma_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe checks several variants in one child process (comma list): each gets ws3p's extra 3-CTA grid and a
    failure names its variant; probe() refuses an unknown name in the list."""
    memo: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
    seen: list[tuple[str, int | None]] = []

    def stand_in(q, kv, idx, sink, scale, *, out, lse_out, num_splits=None, variant="ws", max_ctas=None):  # noqa: ANN001, ANN202
        seen.append((variant, max_ctas))
        key = (kv.dtype, idx.shape[1])
        if key not in memo:
            memo[key] = reference.sparse_attn(q, kv, idx, sink, scale)
        out.copy_(memo[key][0])
        lse_out.copy_(memo[key][1])
        if variant == "ws3pe" and max_ctas == 3 and num_splits == 1 and key == (torch.bfloat16, 600):
            out.copy_(out.roll(1, dims=1))

    monkeypatch.setattr(_WS, "sparse_attn_ws", stand_in)
    why = _WS.self_check(device="cpu", variant=",".join(OPTS))
    assert why.startswith("ws3pe topk=600 fp8=False splits=1 max_ctas=3: max |out - ref|") and ";" not in why, why
    assert len(seen) == 24 * len(OPTS) and {v for v, _ in seen} == set(OPTS), len(seen)
    with pytest.raises(ValueError, match="variant"):
        _WS.probe(variant="ws3pl,nope")


def _bench_module() -> types.ModuleType:
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_flash_mla.py"
    spec = importlib.util.spec_from_file_location("bench_flash_mla_ws3p_opt", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ws3p_opt_bench_rows() -> None:
    """The default run times the option builds next to ws3 / ws3p at b = 32 / 128 / 256 x s_q = 2 and prefill 4,096:
    `cuda_ws3p{l,e,x,1,1l}[_fp8]` and `cuda_ws3pw_fp8` (no BF16 ws3pw row: that is ws3p's kernel); all share one
    probe."""
    bench = _bench_module()
    key = ",".join(OPTS)
    bench._PROBE.update({"ws3": None, "ws3p": None, key: None})  # names only: no probe child process
    impls = bench._ws_impls(torch.zeros(1), (), (), ("ws3", "ws3p", *OPTS))
    want = {"cuda_ws3pl", "cuda_ws3pe", "cuda_ws3px", "cuda_ws3pw_fp8", "cuda_ws3pl_fp8", "cuda_ws3pe_fp8"}
    want |= {"cuda_ws3p1", "cuda_ws3p1_fp8", "cuda_ws3p1l", "cuda_ws3p1l_fp8"}
    assert want | {"cuda_ws3px_fp8", "cuda_ws3p", "cuda_ws3p_fp8"} <= set(impls), sorted(impls)
    assert "cuda_ws3pw" not in impls
    want_cases = {("decode", 32, 2), ("decode", 128, 2), ("decode", 256, 2), ("prefill", 4096, 1)}
    assert set(bench._WS3P_OPT_CASES) == want_cases
    assert {"cuda_ws3px", "cuda_ws3px_fp8"} <= set(bench._L2HOT)
    text = pathlib.Path(bench.__file__).read_text()
    assert 'ws_vars += ("ws3pw", "ws3pl", "ws3pe", "ws3px", "ws3p1", "ws3p1l")' in text


# ------------------------------------------------------------------------------------------------------ GPU


# the same inputs and NaN-poisoned call as test_mla_ws3p's GPU tests, cached: every build runs the same data
_inputs = functools.cache(_ws3p_tests._inputs)
_run = _ws3p_tests._run


def _bits_differ(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> str | None:
    """None when out and lse are bit-identical (NaN payloads and signed zeros included), else how they differ."""
    o_eq = torch.equal(got[0].view(torch.int16), want[0].view(torch.int16))
    l_eq = torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))
    if o_eq and l_eq:
        return None
    d_out = float((got[0].float() - want[0].float()).abs().nan_to_num(float("inf")).max())
    d_lse = float((got[1] - want[1]).abs().nan_to_num(float("inf")).max())
    n_out = int((got[0].view(torch.int16) != want[0].view(torch.int16)).sum())
    return f"out bits equal {o_eq} ({n_out} differ, max |diff| {d_out:.3e}), lse bits equal {l_eq} (max {d_lse:.3e})"


def _probe_or_skip() -> None:
    ok, why = _WS.probe(variant=",".join(OPTS))
    if not ok:
        pytest.skip(f"ws3p option probe failed (test_ws3p_opt_probe_gpu): {why[-300:]}")


@gpu
@needs_opt
@pytest.mark.gpu
def test_ws3p_opt_probe_gpu() -> None:
    """The out-of-process probe, all six builds in one child (small cases, auto / 1 / 7 splits, each also on a 3-CTA
    grid, BF16 / FP8, NaN in unused slots): no fault, no hang, within the loose bound of the reference."""
    ok, out = _WS.probe(variant=",".join(OPTS))
    print(out)
    assert ok, out


@gpu
@needs_opt
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("t", "splits", "ctas"),
    [(32, None, 5), (256, None, None), (256, 3, None), (256, None, 7), (4096, None, None)],
    ids=["b32s1_ctas5", "b128s2", "b128s2_split3", "b128s2_ctas7", "prefill4096"],
)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_ws3p_opt_bit_equal_ws3p_gpu(t: int, splits: int | None, ctas: int | None, fp8: bool) -> None:
    """The bit-exact option builds: out / lse bit-for-bit equal to ws3p on the same plan and grid; every build (ws3p
    too: a shared bug would otherwise pass) within the probe's bound of the reference on every token; ws3p1's first
    64 tokens within the package's tight bounds (reference and float64 oracle) and token 1 (no valid index) exactly
    0 / lse = sink; ws3p1l bit-for-bit equal to ws3p1 (the lazy rescale changes no bits)."""
    _probe_or_skip()
    q, cache, idx, sink = _inputs(t, 9100 + t)
    kv = (_fp8(cache) if fp8 else cache).cuda()
    qd, ic, sd = q.cuda(), idx.cuda(), sink.cuda()
    kw = {"num_splits": splits, "max_ctas": ctas}
    base = _run("ws3p", qd, kv, ic, sd, **kw)
    got = {v: _run(v, qd, kv, ic, sd, **kw) for v in OPTS}
    fails = [f"{v} != ws3p: {why}" for v in EXACT if (why := _bits_differ(got[v], base)) is not None]
    for lo in range(0, t, 512):  # the reference in chunks (its gather is [tokens, 640, 512] fp32)
        ro, rl = reference.sparse_attn(qd[lo : lo + 512], kv, ic[lo : lo + 512], sd, SCALE)
        for v, r in [("ws3p", base), *got.items()]:
            why = _PROBE.mismatch(r[0][lo : lo + 512], r[1][lo : lo + 512], ro, rl)
            if why is not None:
                fails.append(f"{v} tokens {lo}..: {why}")
    assert not fails, f"t={t} fp8={fp8} splits={splits} max_ctas={ctas}: " + "; ".join(fails)
    one = got["ws3p1"]
    d = float((one[0].float() - base[0].float()).abs().nan_to_num(float("inf")).max())
    print(f"t={t} fp8={fp8}: ws3p1 vs ws3p max |out diff| {d:.3e}")
    m = 64
    _check((one[0][:m], one[1][:m]), q[:m], [cache], [idx[:m]], sink, SCALE, (fp8,), gpu_p=True)
    mc.assert_empty_token((one[0].cpu(), one[1].cpu()), sink)
    why = _bits_differ(got["ws3p1l"], one)
    assert why is None, f"ws3p1l != ws3p1: {why}"


@gpu
@needs_opt
@pytest.mark.gpu
@pytest.mark.parametrize("topk", [64, 200, 640])
def test_ws3p_opt_fp8_every_code_bit_equal_gpu(topk: int) -> None:
    """FP8 rows of uniformly random bytes (every e4m3 code incl. the NaN codes 0x7f / 0xff, every scale byte 0..255,
    random RoPE bits): the producers' dequantisation paths (ws3pw's one-batch store, the others' two batches) must give
    ws3p's bits exactly, whatever NaN / inf / subnormal values come out (compared as raw bits; bit-exact builds only).
    Plus a run whose
    scale bytes are all in 1..134 and RoPE dims finite (no NaN / inf: many subnormal products) with a small q, compared
    the same way."""
    _probe_or_skip()
    g = torch.Generator().manual_seed(topk)
    t, n = 256, 4096
    rows = torch.randint(0, 256, (n, 584), generator=g, dtype=torch.uint8)
    idx = torch.rand(t, n, generator=g).topk(topk, dim=-1).indices.to(torch.int32)
    idx[torch.rand(t, topk, generator=g) < 0.05] = -1
    q = torch.randn(t, 64, 512, generator=g).bfloat16()
    finite = rows.clone()
    finite[:, 576:583] = torch.randint(1, 135, (n, 7), generator=g, dtype=torch.uint8)
    finite[:, :448][(finite[:, :448] & 0x7F) == 0x7F] = 0x3C  # no NaN codes
    finite[:, 448:576] = torch.randn(n, 64, generator=g).bfloat16().view(torch.uint8).reshape(n, 128)  # finite RoPE
    fails = []
    for name, kv, qq in (("random bytes", rows, q), ("finite scales", finite, (q.float() * 1e-3).bfloat16())):
        kvd, qd, ic = kv.cuda(), qq.cuda(), idx.cuda()
        base = _run("ws3p", qd, kvd, ic, None)
        for v in EXACT:
            why = _bits_differ(_run(v, qd, kvd, ic, None), base)
            if why is not None:
                fails.append(f"{name} {v}: {why}")
    assert not fails, f"topk={topk}: " + "; ".join(fails)


def test_ws3p_opt_summary_table(tmp_path: pathlib.Path) -> None:
    """`--opt-summary` prints, per case and cache, ws3 / ws3p and every option build with "x ws3p" (ws3p time / this
    time); cases without option rows are left out."""
    bench = _bench_module()

    def rec(impl: str, us: float, shape: str = "b=128 s_q=2 k=640") -> dict:
        return {"op": "decode", "shape": shape, "impl": impl, "b": 128, "s_q": 2, "median_us": us, "tflops": 2.0,
                "gbps": 1.0}  # fmt: skip

    rows = [rec("cuda_ws3", 87.7), rec("cuda_ws3p", 86.0), rec("cuda_ws3pl", 80.0), rec("cuda_ws3px_fp8", 100.0),
            rec("cuda_ws3p_fp8", 110.0), rec("cuda_ws3p", 10.0, "b=1 s_q=1 k=640")]  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"records": rows}))
    text = bench.opt_summary(str(path))
    lines = text.splitlines()
    assert len(lines) == 4, text  # header, rule, BF16 and FP8 rows of the one case with option rows
    assert "| decode | b=128 s_q=2 k=640 | BF16 | 87.7 (2.0) | 86.0 (2.0) |" in text, text
    assert "80.0 (2.0) (1.07)" in text and "100.0 (2.0) (1.10)" in text, text
