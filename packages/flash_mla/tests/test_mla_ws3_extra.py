"""ws3 with the engine's second cache (session 5 round 4; GPU-run in session 6): `sparse_attn_ws(...,
variant="ws3", extra_kv=, extra_indices=)` (`_C.sparse_decode_ws3_extra`, fm_ws3_decode.cu's EXTRA flag), routed by
kernel="cuda_ws3" or DEEPINFER_FLASH_MLA_WS3_EXTRA=1, never by the default route.

CPU: the routing (off by default, the env flag, forced name, stale `_C`), the wrapper's arguments to a stand-in `_C`
(split plan over both lists, byte strides, the extra entry point), its argument errors, a Python emulation of the
kernel's index space (combined row ids, 64-row tiles straddling the lists, all-hole tiles skipped, split partials
merged with the sink) against the reference, and the probe's check logic with stand-in kernels.
GPU: the probe in a child process; the engine's shapes (decode b = 32 / 128 with 640 + 128 indices, ragged extra lists
from none to all valid; a fresh 4,096-token prompt through the public prefill call with the env flag) and a
600 + 100 list (a tile straddling both lists) under forced splits, BF16 and FP8 caches, holes of every kind, NaN in
unused slots of both caches, NaN-poisoned outputs, a token without any valid index; against the reference, the float64
oracle and the serial kernel; CUDA-graph replay.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the @triton.jit decorators run
pytest.importorskip("triton")

import mla_checks as mc  # noqa: E402
from mla_checks import poison_unused, ragged_indices  # noqa: E402
from test_mla_split import _check, _fp8  # noqa: E402
from test_mla_triton import _holes  # noqa: E402
from test_mla_ws3_default import _Counter, _Recorder, compiled_present  # noqa: E402, F401 (the fixture, by name)

import deepinfer.flash_mla as fm  # noqa: E402
from deepinfer.flash_mla import _dispatch, reference  # noqa: E402
from kernelkit.numerics import unit_roundoff  # noqa: E402

_WS = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_ws_decode")
_CU = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_sparse_decode")
_K = importlib.import_module("deepinfer.flash_mla.backends.cuda.triton_split_attn")
SCALE = 512**-0.5
LOG2E = 1.4426950408889634
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
needs_extra = pytest.mark.skipif(
    not _WS.ws3_extra_available(), reason="_C without sparse_decode_ws3_extra (rebuild with DEEPINFER_DEVICE=cuda)"
)


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).bfloat16()


@pytest.fixture
def extra_present(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """`compiled_present` plus a `_C` with the ws3 extra entry point; the env flag unset."""
    request.getfixturevalue("compiled_present")
    monkeypatch.setattr(_WS, "ws3_extra_available", lambda: True)
    monkeypatch.delenv(_WS.WS3_EXTRA_ENV, raising=False)


# ------------------------------------------------------------------------------------------------------ CPU


@pytest.mark.usefixtures("extra_present")
def test_extra_routing_off_by_default_on_by_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Default route: extra-cache calls run the serial kernel (as before); with DEEPINFER_FLASH_MLA_WS3_EXTRA=1 ws3 at
    t >= 32 (t = 31: serial; mixed formats: neither compiled kernel); calls without an extra cache unchanged."""
    kv, fp8 = _bf16(100, 512), torch.zeros(100, 584, dtype=torch.uint8)
    q = _bf16(32, 64, 512)
    assert _dispatch.kernel_for(q, kv, _bf16(3, 512)) == "cuda"
    assert _dispatch.kernel_for(q, fp8, fp8[:3]) == "cuda"
    assert _dispatch.kernel_for(q, kv, None) == "cuda_ws3" and _dispatch.kernel_for(q[:31], kv, None) == "cuda"
    monkeypatch.setenv(_WS.WS3_EXTRA_ENV, "0")
    assert _dispatch.kernel_for(q, kv, _bf16(3, 512)) == "cuda"
    monkeypatch.setenv(_WS.WS3_EXTRA_ENV, "1")
    assert _dispatch.kernel_for(q, kv, _bf16(3, 512)) == "cuda_ws3"
    assert _dispatch.kernel_for(q, fp8, fp8[:3]) == "cuda_ws3"
    assert _dispatch.kernel_for(q[:31], kv, _bf16(3, 512)) == "cuda"
    assert _dispatch.kernel_for(q, kv, fp8[:3]) == "fused"  # mixed formats: ws3 refuses, the serial stand-in too
    assert _dispatch.kernel_for(q, kv, None) == "cuda_ws3" and _dispatch.kernel_for(q[:31], kv, None) == "cuda"
    monkeypatch.setitem(_K.DEFAULT_KERNELS, "bf16", "cuda_ws3")  # ws3 as the default: any t, extra with the flag
    assert _dispatch.kernel_for(q[:1], kv, _bf16(3, 512)) == "cuda_ws3"
    monkeypatch.setenv(_WS.WS3_EXTRA_ENV, "0")
    assert _dispatch.kernel_for(q[:1], kv, _bf16(3, 512)) == "cuda"


@pytest.mark.usefixtures("extra_present")
def test_forced_ws3_takes_extra_and_passes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernel="cuda_ws3" with an extra cache calls ws3 with extra_kv / extra_indices (and out / lse_out / num_splits);
    the env flag routes kernel=None the same way; a `_C` without the extra entry point: kernel="cuda_ws3" raises
    naming extra_kv, the flagged default falls back to the serial kernel."""
    rec = _Recorder(monkeypatch)
    kv, ex = _bf16(100, 512), _bf16(7, 512)
    q, idx, ex_idx = _bf16(32, 64, 512), torch.zeros(32, 8, dtype=torch.int32), torch.zeros(32, 3, dtype=torch.int32)
    out, lse = torch.empty(32, 64, 512, dtype=torch.bfloat16), torch.empty(32, 64)
    kw = dict(extra_kv=ex, extra_indices=ex_idx, out=out, lse_out=lse, num_splits=2)
    o, s = _K.sparse_attn_split_triton(q, kv, idx, None, SCALE, kernel="cuda_ws3", **kw)
    name, t, got = rec.calls[-1]
    assert (name, t) == ("ws3", 32) and o is out and s is lse
    assert got["extra_kv"] is ex and got["extra_indices"] is ex_idx and got["variant"] == "ws3"
    assert got["num_splits"] == 2 and got["out"] is out
    _K.sparse_attn_split_triton(q, kv, idx, None, SCALE, **kw)
    assert rec.calls[-1][0] == "cuda"
    monkeypatch.setenv(_WS.WS3_EXTRA_ENV, "1")
    _K.sparse_attn_split_triton(q, kv, idx, None, SCALE, **kw)
    assert rec.calls[-1][0] == "ws3" and rec.calls[-1][2]["extra_kv"] is ex
    monkeypatch.setattr(_WS, "ws3_extra_available", lambda: False)
    _K.sparse_attn_split_triton(q, kv, idx, None, SCALE, **kw)
    assert rec.calls[-1][0] == "cuda"
    n = len(rec.calls)
    with pytest.raises(ValueError, match="kernel='cuda_ws3'.*extra_kv.*sparse_decode_ws3_extra"):
        _K.sparse_attn_split_triton(q, kv, idx, None, SCALE, kernel="cuda_ws3", **kw)
    assert len(rec.calls) == n


def test_ws3_why_not_extra_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """ws3_why_not: an extra cache is refused unless allowed; allowed, its format must be kv's and `_C` must have the
    extra entry point."""
    q, kv = _bf16(64, 64, 512), _bf16(100, 512)
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None)
    monkeypatch.setattr(_WS, "ws3_available", lambda: True)
    monkeypatch.setattr(_WS, "ws3_extra_available", lambda: True)
    assert "extra_kv" in _WS.ws3_why_not(q, kv, kv)
    assert _WS.ws3_why_not(q, kv, _bf16(3, 512), allow_extra=True) is None
    assert "format" in _WS.ws3_why_not(q, kv, torch.zeros(3, 584, dtype=torch.uint8), allow_extra=True)
    monkeypatch.setattr(_WS, "ws3_extra_available", lambda: False)
    assert "rebuild" in _WS.ws3_why_not(q, kv, _bf16(3, 512), allow_extra=True)


class _FakeC:
    """Stand-in `_C` (CPU) with ws3 and its extra entry point: records the arguments of each launch."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.ws3_block_rows = lambda: 64

    def sparse_decode_ws(self, *args) -> None:  # noqa: ANN002
        self.calls.append(("ws", args))

    def sparse_decode_ws3_extra(self, *args) -> None:  # noqa: ANN002
        self.calls.append(("extra", args))


@pytest.fixture
def fake_c(monkeypatch: pytest.MonkeyPatch) -> _FakeC:
    fake = _FakeC()
    monkeypatch.setattr(_WS, "_module", lambda: fake)
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None)
    monkeypatch.setattr(_WS, "combine_splits", lambda *a, **k: None)
    monkeypatch.setattr(_WS.torch.cuda, "current_stream", lambda dev=None: type("S", (), {"cuda_stream": 7})())
    return fake


def test_ws3_extra_wrapper_arguments(fake_c: _FakeC) -> None:
    """What `sparse_attn_ws` hands `sparse_decode_ws3_extra`: topk / topk2, the split plan over both lists' 64-row
    tiles (640 + 128 = 12 tiles: 1 token -> 6 splits of 2, 256 tokens -> 1 split of 12), both caches' row counts, the
    extra index row stride and the extra cache's row stride in bytes, the FP8 flag and the stream; without an extra
    cache the single-cache entry point as before."""
    kv, ex = _bf16(2048, 512), _bf16(300, 512)
    for t, want in [(1, (6, 2)), (256, (1, 12))]:
        q = _bf16(t, 64, 512)
        idx = torch.randint(0, 2048, (t, 640), dtype=torch.int32)
        ex_idx = torch.randint(-1, 300, (t, 128), dtype=torch.int32)
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3", extra_kv=ex, extra_indices=ex_idx)
        name, a = fake_c.calls[-1]
        # (q, kv, idx, kv2, idx2, sink, out, lse, part_o, part_lse, t, H, topk, topk2, splits, per, scale, n_rows,
        #  n_rows2, stride_it, stride_it2, stride_qt, stride_qh, stride_kv, stride_kv2 (bytes), stride_ot, stride_oh,
        #  stride_lt, stride_lh, fp8, stream)
        assert name == "extra" and len(a) == 31, (name, len(a))
        assert a[3] == ex.data_ptr() and a[4] == ex_idx.data_ptr()
        assert a[10:16] == (t, 64, 640, 128) + want, a[10:16]
        assert abs(a[16] - SCALE * LOG2E) < 1e-6
        assert a[17:21] == (2048, 300, 640, 128) and a[23:25] == (512, 1024), a[17:25]
        assert a[-2:] == (False, 7)
    fp8, fp8_ex = torch.zeros(64, 584, dtype=torch.uint8), torch.zeros(5, 584, dtype=torch.uint8)
    idx1 = torch.zeros(1, 700, dtype=torch.int32)
    _WS.sparse_attn_ws(_bf16(1, 64, 512), fp8, idx1, None, SCALE, variant="ws3", extra_kv=fp8_ex,
                       extra_indices=torch.zeros(1, 100, dtype=torch.int32))  # fmt: skip
    name, a = fake_c.calls[-1]
    assert name == "extra" and a[12:14] == (700, 100) and a[24] == 584 and a[-2] is True
    assert a[14] * a[15] >= 13 and (a[14] - 1) * a[15] < 13  # 800 indices = 13 tiles, no empty split
    _WS.sparse_attn_ws(_bf16(1, 64, 512), kv, idx1, None, SCALE, variant="ws3")
    assert fake_c.calls[-1][0] == "ws"


def test_ws3_extra_wrapper_errors(fake_c: _FakeC) -> None:
    """Clear errors before any launch: extra_kv without extra_indices, another variant or an ablation, a cache of
    another format, extra_indices of the wrong dtype / shape."""
    kv, q, idx = _bf16(100, 512), _bf16(2, 64, 512), torch.zeros(2, 64, dtype=torch.int32)
    ex, ex_idx = _bf16(5, 512), torch.zeros(2, 8, dtype=torch.int32)
    cases = [
        (dict(extra_kv=ex), "together"),
        (dict(extra_kv=ex, extra_indices=ex_idx, variant="ws2"), "ws3"),
        (dict(extra_kv=ex, extra_indices=ex_idx, ablation="producer"), "ws3"),
        (dict(extra_kv=torch.zeros(5, 584, dtype=torch.uint8), extra_indices=ex_idx), "format"),
        (dict(extra_kv=ex, extra_indices=ex_idx.long()), "int32"),
        (dict(extra_kv=ex, extra_indices=ex_idx[:1]), "int32"),
    ]
    for kw, match in cases:
        kw = {"variant": "ws3", **kw}
        with pytest.raises(ValueError, match=match):
            _WS.sparse_attn_ws(q, kv, idx, None, SCALE, **kw)
    assert fake_c.calls == []


def _emulate_ws3_extra(q, kv, idx, kv2, idx2, sink, scale, num_splits):  # noqa: ANN001, ANN202
    """Python model of fm_ws3_decode.cu with EXTRA (fp32): per token, the index space main list + extra list, row ids
    [0, n) = kv and n + v = kv2 row v, 64-entry tiles, split s owns tiles [s * per, ...), a tile of holes only is
    skipped; each split's partial (acc / l, base-2 lse) merged with the sink as the Triton combine does."""
    t, h, _ = q.shape
    n, n2 = kv.shape[0], kv2.shape[0]
    rows = torch.cat([kv.float(), kv2.float()])
    main = torch.where((idx >= 0) & (idx < n), idx, -1)
    ids = torch.cat([main, torch.where((idx2 >= 0) & (idx2 < n2), idx2 + n, -1)], dim=1)
    tiles = -(-ids.shape[1] // 64)
    per = -(-tiles // num_splits)
    out, lse = torch.zeros(t, h, 512), torch.zeros(t, h)
    for i in range(t):
        parts = []
        for s in range(-(-tiles // per)):
            m = torch.full((h,), -torch.inf)
            acc, l_sum = torch.zeros(h, 512), torch.zeros(h)
            for tile in range(s * per, min((s + 1) * per, tiles)):
                r = ids[i, 64 * tile : 64 * tile + 64]
                if not bool((r >= 0).any()):
                    continue  # the kernel's skip: exact
                v = torch.where((r >= 0)[:, None], rows[r.clamp(min=0)], 0.0)  # holes: zero rows, never read
                z = (q[i].float() @ v.T) * scale * LOG2E
                z[:, r < 0] = -torch.inf
                m_new = torch.maximum(m, z.max(1).values)
                m_use = torch.where(m_new == -torch.inf, 0.0, m_new)
                alpha, p = torch.exp2(m - m_use), torch.exp2(z - m_use[:, None])
                acc = acc * alpha[:, None] + p @ v
                l_sum, m = l_sum * alpha + p.sum(1), m_new
            ok = l_sum > 0
            parts.append((torch.where(ok[:, None], acc / l_sum.clamp(min=1e-30)[:, None], 0.0),
                          torch.where(ok, m + torch.log2(l_sum.clamp(min=1e-30)), -torch.inf)))  # fmt: skip
        lses = torch.stack([p[1] for p in parts] + ([sink * LOG2E] if sink is not None else []))
        mx = lses.max(0).values
        mx = torch.where(mx == -torch.inf, 0.0, mx)
        w = torch.exp2(lses - mx)
        den = w.sum(0)
        out[i] = sum(w[j][:, None] * parts[j][0] for j in range(len(parts))) / den.clamp(min=1e-30)[:, None]
        lse[i] = (mx + torch.log2(den)) / LOG2E
        if sink is not None:
            lse[i] = torch.where(den > 0, lse[i], sink)
    return out, lse


@pytest.mark.parametrize(("k1", "k2", "splits"), [(640, 128, 1), (640, 128, 5), (600, 100, 3), (40, 100, 2)])
def test_ws3_extra_index_space_emulation(k1: int, k2: int, splits: int) -> None:
    """The kernel's index space (combined row ids, tiles straddling the lists, all-hole tiles skipped, split merge)
    modelled in Python gives the reference's answer: fresh-prompt main lists (first 128 holes), holes of every kind
    and out-of-range values in both lists, a token without any valid index, NaN in unused slots of both caches."""
    g = torch.Generator().manual_seed(k1 * 7 + k2 + splits)
    t, h, n, n2 = 3, 8, 700, 150
    q = torch.randn(t, h, 512, generator=g).bfloat16()
    idx = _holes(ragged_indices(t, k1, torch.arange(n), g, [k1, 0, k1 // 2]), n, g)
    idx2 = _holes(ragged_indices(t, k2, torch.arange(n2), g, [1, 0, k2]), n2, g)
    if k1 >= 128:
        idx[:, :128] = -1
    kv = poison_unused(torch.randn(n, 512, generator=g).bfloat16(), [idx])
    kv2 = poison_unused(torch.randn(n2, 512, generator=g).bfloat16(), [idx2])
    sink = torch.randn(h, generator=g)
    got = _emulate_ws3_extra(q, kv, idx, kv2, idx2, sink, SCALE, splits)
    want = reference.sparse_attn(q.float(), kv.float(), idx, sink, SCALE, kv2.float(), idx2)
    tol = 64 * unit_roundoff(torch.float32)  # fp32 sums of <= 768 terms in another order
    assert torch.allclose(got[0], want[0].float(), atol=tol * 8, rtol=tol * 8), float((got[0] - want[0]).abs().max())
    assert torch.allclose(got[1], want[1].float(), atol=tol * 8, rtol=tol * 8), float((got[1] - want[1]).abs().max())
    assert bool((got[0][1] == 0).all()) and torch.allclose(got[1][1], sink, rtol=tol, atol=tol)


def test_self_check_extra_logic_with_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's check (`self_check_extra`) passes a correct kernel (stand-in: the reference) and reports one that
    ignores the extra cache, naming the case."""
    memo: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
    drop = {"on": False}

    def stand_in(q, kv, idx, sink, scale, *, out, lse_out, num_splits=None, variant="ws", extra_kv=None,  # noqa: ANN001
                 extra_indices=None):  # noqa: ANN001, ANN202  # fmt: skip
        key = (kv.dtype, idx.shape[1], drop["on"])
        if key not in memo:
            ex = (None, None) if drop["on"] else (extra_kv, extra_indices)
            memo[key] = reference.sparse_attn(q, kv, idx, sink, scale, *ex)
        out.copy_(memo[key][0])
        lse_out.copy_(memo[key][1])

    monkeypatch.setattr(_WS, "sparse_attn_ws", stand_in)
    assert _WS.self_check_extra(device="cpu") == ""
    drop["on"] = True
    why = _WS.self_check_extra(device="cpu")
    assert "k=640+128 fp8=False splits=None" in why and "k=600+100" in why, why


def test_bench_engine_rows_include_ws3_extra() -> None:
    """The benchmark's engine cases time `cuda_ws3_extra` (kernel="cuda_ws3" with the extra cache) next to `cuda`;
    without `_C` (this machine) its call raises a clear ValueError, which the benchmark records as the row's error."""
    from test_mla_ws import _bench_module

    bench = _bench_module()
    bench._PROBE.update({"err": None, "ws3_extra": None})  # names only: no probe child process
    kv, ex = _bf16(100, 512), _bf16(4, 512)
    fns = bench._extra_impls(ex, torch.zeros(2, 3, dtype=torch.int32), True)
    assert {"split", "cuda", "cuda_ws3_extra", "reference"} <= set(fns), sorted(fns)
    if not _WS.ws3_extra_available():
        with pytest.raises(ValueError, match="kernel='cuda_ws3'"):
            fns["cuda_ws3_extra"](_bf16(2, 64, 512), kv, torch.zeros(2, 8, dtype=torch.int32), None)
    bench._PROBE["ws3_extra"] = "probe failed: x"
    with pytest.raises(RuntimeError, match="probe failed"):
        bench._extra_impls(ex, torch.zeros(2, 3, dtype=torch.int32), False)["cuda_ws3_extra"](None, None, None, None)


# ------------------------------------------------------------------------------------------------------ GPU


def _probed() -> None:
    """Skip when the extra kernel's out-of-process probe failed (test_ws3_extra_probe_gpu reports it): a fault would
    take every later GPU test of this process with it."""
    ok, out = _WS.probe_extra()
    if not ok:
        pytest.skip(f"ws3 extra probe failed (see test_ws3_extra_probe_gpu): {out[-300:]}")


def _engine_inputs(t: int, n2: int, prefill: bool, seed: int, k1: int = 640, k2: int = 128):  # noqa: ANN202
    """Engine-like inputs (CPU): q [t, 64, 512]; the pool (4,096 rows, NaN where unnamed) with k1 main indices (up to
    1/8 holes of every kind; prefill: the first 128, the ring window, all holes); the fresh rows [n2, 512] (decode: n2 >
    t, so some are unnamed: NaN) with k2 extra
    slots (prefill: the causal 128-row window kpos = i - 127 + j; decode: ragged, token 0 all valid, token 2 only its
    own row as the engine has, the rest 0..k2); token 1 has no valid index in either list; a sink."""
    g = torch.Generator().manual_seed(seed)
    n = 4096
    q = torch.randn(t, 64, 512, generator=g).bfloat16()
    counts = [k1, 0, *[int(c) for c in torch.randint(k1 - k1 // 8, k1 + 1, (t - 2,), generator=g)]]
    idx = ragged_indices(t, k1, torch.arange(n - 64), g, counts)
    if prefill:
        idx[:, :128] = -1
    if prefill:
        kpos = torch.arange(t)[:, None] - (k2 - 1) + torch.arange(k2)[None, :]
        idx2 = torch.where(kpos >= 0, kpos, -1).to(torch.int32)
        idx2[1] = -1
    else:
        counts2 = [k2, 0, 0, *[int(c) for c in torch.randint(0, k2 + 1, (t - 3,), generator=g)]]
        idx2 = ragged_indices(t, k2, torch.arange(n2), g, counts2)
        idx2[2, -1] = 2  # the engine's decode: only the token's own fresh row
    idx, idx2 = _holes(idx, n, g), _holes(idx2, n2, g)
    kv = poison_unused(torch.randn(n, 512, generator=g).bfloat16(), [idx])
    kv2 = poison_unused(torch.randn(n2, 512, generator=g).bfloat16(), [idx2])
    return q, [kv, kv2], [idx, idx2], torch.randn(64, generator=g)


def _run_forced(q, caches, lists, sink, fp8: bool, **kw):  # noqa: ANN001, ANN202
    """kernel="cuda_ws3" (or kw's kernel) on the GPU into NaN-poisoned out / lse; returns (out, lse) on the GPU."""
    used = [(_fp8(c) if fp8 else c).cuda() for c in caches]
    t = q.shape[0]
    out = torch.full((t, 64, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((t, 64), float("nan"), device="cuda")
    kw = {"kernel": "cuda_ws3", **kw}
    o, s = _K.sparse_attn_split_triton(q.cuda(), used[0], lists[0].cuda(), sink.cuda(), SCALE, out=out, lse_out=lse,
                                       extra_kv=used[1], extra_indices=lists[1].cuda(), **kw)  # fmt: skip
    torch.cuda.synchronize()
    assert o is out and s is lse
    return o, s


def _vs_serial(got, q, caches, lists, sink, fp8: bool, **kw) -> None:  # noqa: ANN001
    """ws3 against the serial kernel on the same call: both round P and out to bf16 (two roundings each of values
    bounded by the largest |row value|); lse: a bf16 rounding of P in the row sum at most, plus fp32 sums."""
    want = _run_forced(q, caches, lists, sink, fp8, kernel="cuda", **kw)
    vmax = max(float(c.float().nan_to_num().abs().max()) for c in caches)
    tol = 4 * unit_roundoff(torch.bfloat16) * vmax
    err = float((got[0].float() - want[0].float()).abs().max())
    fin = torch.isfinite(want[1])
    lerr = float((got[1] - want[1])[fin].abs().max())
    ltol = 2 * unit_roundoff(torch.bfloat16) + 64 * unit_roundoff(torch.float32) * float(want[1][fin].abs().max())
    print(f"vs serial: max |out diff| {err:.3e} (tol {tol:.3e}), max |lse diff| {lerr:.3e} (tol {ltol:.3e})")
    assert err <= tol, (err, tol)
    assert lerr <= ltol, (lerr, ltol)
    assert torch.equal(torch.isfinite(got[1]), torch.isfinite(want[1]))


@gpu
@pytest.mark.gpu
def test_ws3_extra_built_gpu() -> None:
    """The GPU install built `_C` with ws3's extra entry point; its shared memory (16 B more than ws3's: the skip
    flags) still fits one CTA per SM."""
    assert _WS.ws3_extra_available(), "_C.sparse_decode_ws3_extra missing: rebuild with DEEPINFER_DEVICE=cuda"
    mod = _WS._module()
    print("ws3 smem bytes", mod.ws3_smem_bytes(False), "with the extra cache", mod.ws3_smem_bytes_extra())
    assert mod.ws3_smem_bytes_extra() == mod.ws3_smem_bytes(False) + 16
    assert mod.ws3_smem_bytes_extra() <= 227 * 1024


@gpu
@needs_extra
@pytest.mark.gpu
def test_ws3_extra_probe_gpu() -> None:
    """`self_check_extra` in a child process (BF16 / FP8, 640 + 128 with two all-hole tiles, 600 + 100 straddling,
    splits auto / 1 / 3, holes, NaN slots, an empty token): no fault, no hang, results match the reference."""
    ok, out = _WS.probe_extra()
    print(out)
    assert ok, out


@gpu
@needs_extra
@pytest.mark.gpu
@pytest.mark.parametrize("b", [32, 128])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("splits", [None, 3])
def test_ws3_extra_engine_decode_gpu(b: int, fp8: bool, splits: int | None) -> None:
    """The engine's decode call (640 pool indices + 128 fresh-row slots, s_q = 1) on ws3 (kernel="cuda_ws3"): matches
    the reference, the float64 oracle and the serial kernel; token 1 (no valid index) gives 0 / the sink."""
    _probed()
    q, caches, lists, sink = _engine_inputs(b, b + 16, False, 6100 + b + 2 * fp8 + (splits or 0))
    got = _run_forced(q, caches, lists, sink, fp8, num_splits=splits)
    print(f"b={b} fp8={fp8} splits={splits}")
    _check((got[0].cpu(), got[1].cpu()), q, caches, lists, sink, SCALE, (fp8, fp8), gpu_p=True)
    mc.assert_empty_token(got, sink)
    _vs_serial(got, q, caches, lists, sink, fp8, num_splits=splits)


@gpu
@needs_extra
@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("splits", [1, 4, 7])
def test_ws3_extra_straddling_tiles_gpu(fp8: bool, splits: int) -> None:
    """600 + 100 indices (tile 9 holds main entries 576..599 and extra entries 0..39; 11 tiles) on 16 tokens under
    forced split counts whose boundaries fall inside the main list, the straddling tile and the extra list."""
    _probed()
    q, caches, lists, sink = _engine_inputs(16, 300, False, 6200 + 2 * fp8 + splits, k1=600, k2=100)
    got = _run_forced(q, caches, lists, sink, fp8, num_splits=splits)
    _check((got[0].cpu(), got[1].cpu()), q, caches, lists, sink, SCALE, (fp8, fp8), gpu_p=True)
    mc.assert_empty_token(got, sink)
    _vs_serial(got, q, caches, lists, sink, fp8, num_splits=splits)


@gpu
@needs_extra
@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_ws3_extra_engine_prefill_env_flag_gpu(fp8: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh 4,096-token prompt through the public `sparse_attn_prefill` with DEEPINFER_FLASH_MLA_WS3_EXTRA=1:
    kernel_for says "cuda_ws3" and ws3 runs once (without the flag: "cuda"); the whole grid matches the serial kernel,
    three 32-token slices the reference and the oracle."""
    _probed()
    t = 4096
    q, caches, lists, sink = _engine_inputs(t, t, True, 6300 + fp8)
    used = [(_fp8(c) if fp8 else c).cuda() for c in caches]
    qd = q.cuda()
    monkeypatch.delenv(_WS.WS3_EXTRA_ENV, raising=False)
    assert _dispatch.kernel_for(qd, used[0], used[1]) == "cuda"
    monkeypatch.setenv(_WS.WS3_EXTRA_ENV, "1")
    kind = _dispatch.kernel_for(qd, used[0], used[1])
    cnt = _Counter(monkeypatch)
    out = torch.full((t, 64, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    o, lse = fm.sparse_attn_prefill(qd, used[0], lists[0].cuda(), sink.cuda(), SCALE, extra_kv=used[1],
                                    extra_indices=lists[1].cuda(), out=out)  # fmt: skip
    torch.cuda.synchronize()
    print(f"fp8={fp8}: kernel_for={kind} calls={cnt.names}")
    assert o is out and kind == "cuda_ws3" and cnt.names == ["ws:ws3"], (kind, cnt.names)
    for lo in (0, 2000, t - 32):
        sl = slice(lo, lo + 32)
        _check((o[sl].cpu(), lse[sl].cpu()), q[sl], caches, [i[sl] for i in lists], sink, SCALE, (fp8, fp8),
               gpu_p=True)  # fmt: skip
    mc.assert_empty_token((o, lse), sink)
    monkeypatch.delenv(_WS.WS3_EXTRA_ENV)
    _vs_serial((o, lse), q, caches, lists, sink, fp8)


@gpu
@needs_extra
@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_ws3_extra_graph_replay_gpu(fp8: bool) -> None:
    """Captured once (b = 32 engine decode, auto plan), replayed on new q and rolled index lists in the same buffers:
    matches the reference each time (the launcher reads shapes and pointers only)."""
    _probed()
    q, caches, lists, sink = _engine_inputs(32, 48, False, 6400 + fp8)
    used = [(_fp8(c) if fp8 else c).cuda() for c in caches]
    qd, i1, i2, sd = q.cuda(), lists[0].cuda(), lists[1].cuda(), sink.cuda()
    out, lse = torch.empty_like(qd), torch.empty(32, 64, device="cuda")

    def launch() -> None:
        _K.sparse_attn_split_triton(qd, used[0], i1, sd, SCALE, kernel="cuda_ws3", extra_kv=used[1], extra_indices=i2,
                                    out=out, lse_out=lse)  # fmt: skip

    launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    for rep in range(2):
        q2 = torch.randn(32, 64, 512, generator=torch.Generator().manual_seed(6410 + rep)).bfloat16()
        l2 = [li.roll(1 + rep, dims=0) for li in lists]
        qd.copy_(q2.cuda())
        i1.copy_(l2[0].cuda())
        i2.copy_(l2[1].cuda())
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check((out.cpu(), lse.cpu()), q2, caches, l2, sink, SCALE, (fp8, fp8), gpu_p=True)


@pytest.mark.usefixtures("extra_present")
def test_default_runs_ws3p_family_from_64_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Session 6: the default route runs the ws3p family from WS3P_MIN_TOKENS (64) query tokens without an extra
    cache: ws3p1l on BF16, ws3p1 on FP8 (plain ws3p when `_C` lacks the option builds, ws3 when it lacks ws3p); ws3
    below and with an extra cache under the flag."""
    monkeypatch.setattr(_WS, "ws3p_available", lambda: True)
    monkeypatch.setattr(_WS, "ws3p_opt_available", lambda: True)
    kv, fp8 = _bf16(100, 512), torch.zeros(100, 584, dtype=torch.uint8)
    q = _bf16(_WS.WS3P_MIN_TOKENS, 64, 512)
    assert _WS.WS3P_MIN_TOKENS == 64
    assert _dispatch.kernel_for(q, kv, None) == "cuda_ws3p1l"
    assert _dispatch.kernel_for(q, fp8, None) == "cuda_ws3p1"
    assert _dispatch.kernel_for(q[:-1], kv, None) == "cuda_ws3"
    monkeypatch.setenv(_WS.WS3_EXTRA_ENV, "1")
    assert _dispatch.kernel_for(q, kv, _bf16(3, 512)) == "cuda_ws3"
    monkeypatch.setattr(_WS, "ws3p_opt_available", lambda: False)
    assert _dispatch.kernel_for(q, kv, None) == "cuda_ws3p"
    monkeypatch.setattr(_WS, "ws3p_available", lambda: False)
    assert _dispatch.kernel_for(q, kv, None) == "cuda_ws3"
