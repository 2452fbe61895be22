"""The API default's choice between the warp-specialised ws3 kernel and the serial CUDA kernel (session 5).

`sparse_attn_split_triton(kernel=None)` (so `sparse_attn_decode` / `sparse_attn_prefill`) runs
`cuda_ws_decode.sparse_attn_ws(..., variant="ws3")` for calls without an extra cache of at least
`WS3_MIN_TOKENS` (32) flattened query tokens, the serial kernel otherwise; kernel="cuda" keeps meaning the serial
kernel, kernel="cuda_ws3" forces ws3; `_dispatch.kernel_for` names what runs.

CPU: the routing decision with stand-in kernels (availability / supports monkeypatched, as test_mla_cuda.py's
kernel_for test does): thresholds, extra cache, formats, stale `_C`, forced names, out / lse_out / num_splits passed
through, the public decode / prefill forms.
Session 10: from `WS3P_OVL_MIN_TOKENS` (128) tokens the default is the adaptive overlap build (ws3p1oa on a BF16
cache, ws3p1voa on FP8) when `_C` has it; 64..127 tokens keep ws3p1l / ws3p1v; a stale `_C` keeps today's choice.
GPU: the public API at t >= 32 (decode b 32 x s_q 1 and b 16 x s_q 2, prefill t 64; BF16 and FP8 caches; holes of
every kind, NaN in unused slots, NaN-poisoned out, a token without any valid index) runs ws3 once and matches the
reference and the float64 oracle; t = 31 and extra-cache calls run the serial kernel, correctly; 128 heads (two head
blocks) through ws3; from 128 tokens (decode b 64 x s_q 2, prefill t 200) the overlap build runs once, bit-equal to
its base called directly and within the probe's bound of the reference.
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
from test_mla_triton import _holes, _v4_inputs  # noqa: E402

import deepinfer.flash_mla as fm  # noqa: E402
from deepinfer.flash_mla import _dispatch  # noqa: E402

_WS = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_ws_decode")
_CU = importlib.import_module("deepinfer.flash_mla.backends.cuda.cuda_sparse_decode")
_K = importlib.import_module("deepinfer.flash_mla.backends.cuda.triton_split_attn")
SCALE = 512**-0.5
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
needs_ws3 = pytest.mark.skipif(not _WS.ws3_available(), reason="_C without ws3 (test_ws_extension_built_gpu)")


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).bfloat16()


@pytest.fixture
def compiled_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend (CPU) that `_C` has both kernels and the GPU route is taken: availability and `supports` of both
    kernels patched to their format rules (the device check left out), TRITON_INTERPRET unset."""
    monkeypatch.setattr(_dispatch, "backend", lambda device: "cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(_CU, "available", lambda: True)
    monkeypatch.setattr(_CU, "supports", lambda q, kv, ex: None if q.shape[-1] == 512 and q.dtype == torch.bfloat16
                        and (ex is None or ex.dtype == kv.dtype) else "format")  # fmt: skip
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None if q.shape[1] % 64 == 0 and q.shape[-1] == 512
                        and q.dtype == torch.bfloat16 else "shape")  # fmt: skip
    monkeypatch.setattr(_WS, "ws3_available", lambda: True)
    # a `_C` with ws3 but without the persistent ws3p family (`test_mla_ws3_extra.py` routes that family), so these
    # CPU tests do not depend on the `_C` of the machine that runs them
    monkeypatch.setattr(_WS, "ws3p_available", lambda: False)
    monkeypatch.setattr(_WS, "ws3p_opt_available", lambda: False)
    monkeypatch.setattr(_WS, "ws3p_vec_available", lambda: False)
    monkeypatch.setattr(_WS, "ws3p_ovl_available", lambda: False)


def _c_has(
    monkeypatch: pytest.MonkeyPatch,
    opt: bool,
    vec: bool,
    ovl: bool,
    ws3p: bool = True,
    vw: bool | None = None,
    thresh: bool = False,
) -> None:
    """Pretend `_C` has (or lacks) the ws3p family's builds: plain ws3p, the option builds, kOptVec, the overlap, the
    FP8 kOptVecWide overlap build (vw; None: as ovl, i.e. a session-11 `_C` when it has the overlap builds), the
    session-14 threshold builds (thresh; off unless asked: the older tables below model `_C`s before them)."""
    monkeypatch.setattr(_WS, "ws3p_thresh_available", lambda: thresh)
    monkeypatch.setattr(_WS, "ws3p_available", lambda: ws3p)
    monkeypatch.setattr(_WS, "ws3p_opt_available", lambda: opt)
    monkeypatch.setattr(_WS, "ws3p_vec_available", lambda: vec)
    monkeypatch.setattr(_WS, "ws3p_ovl_available", lambda: ovl)
    monkeypatch.setattr(_WS, "ws3p_vw_available", lambda: ovl if vw is None else vw)


class _Recorder:
    """Stand-ins for `sparse_attn_ws` / `sparse_attn_cuda`: record (kernel, t, kwargs), fill out / lse_out with
    recognisable values and return them (allocating like the real ones when not given)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int, dict]] = []
        monkeypatch.setattr(_WS, "sparse_attn_ws", self._make("ws3"))
        monkeypatch.setattr(_CU, "sparse_attn_cuda", self._make("cuda"))

    def _make(self, name: str):  # noqa: ANN202
        def fn(q, kv, idx, sink, scale, *, out=None, lse_out=None, **kw):  # noqa: ANN001, ANN202
            t, h, d = q.shape
            self.calls.append((name, t, dict(kw, out=out, lse_out=lse_out)))
            out = torch.empty(t, h, d, dtype=q.dtype) if out is None else out
            lse_out = torch.empty(t, h) if lse_out is None else lse_out
            out.fill_(1.0 if name == "ws3" else 2.0)
            lse_out.fill_(3.0)
            return out, lse_out

        return fn


# ------------------------------------------------------------------------------------------------------ CPU


def test_ws3_min_tokens_is_32() -> None:
    """The measured threshold (session 5: ws3 faster from b 32 x s_q 1 up, the serial kernel at 1..4 tokens)."""
    assert _WS.WS3_MIN_TOKENS == 32
    assert "cuda_ws3" in _K.KERNELS and "cuda" in _K.KERNELS and set(_K.COMPILED_KERNELS) == {"cuda", "cuda_ws3"}


def test_ws3p_ovl_min_tokens_is_128() -> None:
    """Session 10 (2026-12-01-s10-bench-fm_overlap.json): the overlap builds 0.994 / 0.999x their base at 64 tokens,
    1.006-1.022x from 128: the default switches at 128."""
    assert _WS.WS3P_OVL_MIN_TOKENS == 128 and _WS.WS3P_MIN_TOKENS == 64 < _WS.WS3P_OVL_MIN_TOKENS


@pytest.mark.parametrize(("fp8", "vw"), [(False, True), (True, False), (True, True)])
def test_default_variant_overlap_from_128_tokens(fp8: bool, vw: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `_C` with the overlap builds: ws3 below 64 tokens and with an extra cache, ws3p1l / ws3p1v at 64..127 tokens,
    ws3p1oa / ws3p1voa from 128 (prefill sizes too); on an FP8 cache with the session-11 kOptVecWide build, that one
    ("ws3p1voaw") from 64 tokens."""
    _c_has(monkeypatch, opt=True, vec=True, ovl=True, vw=vw)
    base, ovl = ("ws3p1v", "ws3p1voa") if fp8 else ("ws3p1l", "ws3p1oa")
    if fp8 and vw:
        base = ovl = "ws3p1voaw"
    want = {32: "ws3", 63: "ws3", 64: base, 127: base, 128: ovl, 129: ovl, 256: ovl, 4096: ovl, 16384: ovl}
    assert {t: _WS.default_variant(t, False, fp8) for t in want} == want
    assert _WS.default_variant(4096, True, fp8) == "ws3"  # the engine's extra-cache call: no ws3p form
    assert ovl in _WS.WS3P_OVL_OPTS and (vw and fp8 or base == _WS.WS3P_OVL_BASE[int(fp8)])  # names the wrapper runs


@pytest.mark.parametrize("fp8", [False, True])
def test_default_variant_thresh(fp8: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Session 14: a `_C` with the threshold builds runs "ws3p1oat" on an FP8 cache from 64 tokens (in place of
    ws3p1voaw) and on BF16 from 128 (in place of ws3p1oa; ws3p1l at 64..127); ws3 below 64 and with an extra cache."""
    _c_has(monkeypatch, opt=True, vec=True, ovl=True, vw=True, thresh=True)
    mid = "ws3p1oat" if fp8 else "ws3p1l"
    want = {32: "ws3", 63: "ws3", 64: mid, 127: mid, 128: "ws3p1oat", 4096: "ws3p1oat", 16384: "ws3p1oat"}
    assert {t: _WS.default_variant(t, False, fp8) for t in want} == want
    assert _WS.default_variant(4096, True, fp8) == "ws3"


@pytest.mark.parametrize(("opt", "vec", "ovl", "ws3p", "want_bf16", "want_fp8"), [
    (True, True, False, True, "ws3p1l", "ws3p1v"),  # a session-9 `_C` (no overlap builds): today's choice
    (True, False, False, True, "ws3p1l", "ws3p1"),  # a session-6..8 `_C`
    (False, False, False, True, "ws3p", "ws3p"),  # only the persistent ws3p
    (False, False, False, False, "ws3", "ws3"),  # ws3 only
    (False, False, True, False, "ws3", "ws3"),  # (inconsistent: the overlap builds need the option builds' base)
])  # fmt: skip
def test_default_variant_stale_c_falls_back(
    opt: bool, vec: bool, ovl: bool, ws3p: bool, want_bf16: str, want_fp8: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `_C` without the overlap builds keeps the pre-session-10 default at every size from 64 tokens."""
    _c_has(monkeypatch, opt=opt, vec=vec, ovl=ovl, ws3p=ws3p, vw=False)
    for t in (64, 127, 128, 4096):
        assert _WS.default_variant(t, False, False) == want_bf16, t
        assert _WS.default_variant(t, False, True) == want_fp8, t


@pytest.mark.usefixtures("compiled_present")
def test_kernel_for_names_overlap_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatcher's routing table (`_dispatch.kernel_for`, the name `sparse_attn_split_triton` runs) at 64 / 127 /
    128 / 4096 tokens for both caches with a current `_C`, and with a stale one (no overlap builds)."""
    kv, fp8 = _bf16(100, 512), torch.zeros(100, 584, dtype=torch.uint8)
    _c_has(monkeypatch, opt=True, vec=True, ovl=True)
    table = {64: ("cuda_ws3p1l", "cuda_ws3p1voaw"), 127: ("cuda_ws3p1l", "cuda_ws3p1voaw"),
             128: ("cuda_ws3p1oa", "cuda_ws3p1voaw"), 4096: ("cuda_ws3p1oa", "cuda_ws3p1voaw")}  # fmt: skip
    q = {t: torch.empty(t, 64, 512, dtype=torch.bfloat16) for t in (*table, 31)}  # shapes only: no values read
    for t, (want_bf16, want_fp8) in table.items():
        assert _dispatch.kernel_for(q[t], kv, None) == want_bf16, t
        assert _dispatch.kernel_for(q[t], fp8, None) == want_fp8, t
    assert _dispatch.kernel_for(q[31], kv, None) == "cuda"
    assert _dispatch.kernel_for(q[128], kv, _bf16(3, 512)) == "cuda"  # extra cache: the serial kernel
    monkeypatch.setattr(_WS, "ws3p_ovl_available", lambda: False)  # a stale `_C`
    monkeypatch.setattr(_WS, "ws3p_vw_available", lambda: False)
    for t in table:
        assert _dispatch.kernel_for(q[t], kv, None) == "cuda_ws3p1l", t
        assert _dispatch.kernel_for(q[t], fp8, None) == "cuda_ws3p1v", t


@pytest.mark.usefixtures("compiled_present")
def test_split_triton_runs_overlap_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sparse_attn_split_triton(kernel=None)` at 128 tokens hands `sparse_attn_ws` variant="ws3p1oa" (BF16) /
    "ws3p1voaw" (FP8, session 11) once, with the caller's out / lse_out / num_splits."""
    _c_has(monkeypatch, opt=True, vec=True, ovl=True)
    seen: list[tuple[str, int | None]] = []

    def fake_ws(q, kv, idx, sink, scale, *, out=None, lse_out=None, num_splits=None, variant="ws", **kw):  # noqa: ANN001, ANN202
        seen.append((variant, num_splits))
        return out, lse_out

    monkeypatch.setattr(_WS, "sparse_attn_ws", fake_ws)
    q, idx = _bf16(128, 64, 512), torch.randint(-1, 100, (128, 24), dtype=torch.int32)
    for kv, want in ((_bf16(100, 512), "ws3p1oa"), (torch.zeros(100, 584, dtype=torch.uint8), "ws3p1voaw")):
        out, lse = torch.empty(128, 64, 512, dtype=torch.bfloat16), torch.empty(128, 64)
        o, s = _K.sparse_attn_split_triton(q, kv, idx, None, SCALE, out=out, lse_out=lse, num_splits=2)
        assert o is out and s is lse and seen[-1] == (want, 2), seen
    assert len(seen) == 2


@pytest.mark.usefixtures("compiled_present")
def test_kernel_for_routes_by_token_count_and_extra_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernel_for: "cuda_ws3" at t >= 32 without an extra cache (BF16 and FP8 caches), "cuda" at t = 31, with an
    extra cache, for h % 64 != 0 or a `_C` without ws3; "fused" where neither compiled kernel fits (d = 256)."""
    kv, fp8 = _bf16(100, 512), torch.zeros(100, 584, dtype=torch.uint8)
    for t in (32, 33, 64, 4096):
        assert _dispatch.kernel_for(_bf16(t, 64, 512), kv, None) == "cuda_ws3", t
        assert _dispatch.kernel_for(_bf16(t, 64, 512), fp8, None) == "cuda_ws3", t
    for t in (1, 4, 31):
        assert _dispatch.kernel_for(_bf16(t, 64, 512), kv, None) == "cuda", t
    assert _dispatch.kernel_for(_bf16(64, 64, 512), kv, _bf16(3, 512)) == "cuda"  # the engine's call
    assert _dispatch.kernel_for(_bf16(64, 64, 512), fp8, fp8[:3]) == "cuda"
    assert _dispatch.kernel_for(_bf16(64, 96, 512), kv, None) == "cuda"  # ws3: 64 heads per CTA, no partial block
    assert _dispatch.kernel_for(_bf16(64, 4, 256), _bf16(9, 256), None) == "fused"
    monkeypatch.setattr(_WS, "ws3_available", lambda: False)  # a _C built before ws3
    assert _dispatch.kernel_for(_bf16(64, 64, 512), kv, None) == "cuda"


@pytest.mark.usefixtures("compiled_present")
def test_default_kernels_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """DEFAULT_KERNELS "cuda_ws3": ws3 wherever it takes the call (t = 1 too), the serial kernel for an extra
    cache; a Triton name: that kernel, whatever t."""
    kv = _bf16(100, 512)
    monkeypatch.setitem(_K.DEFAULT_KERNELS, "bf16", "cuda_ws3")
    assert _dispatch.kernel_for(_bf16(1, 64, 512), kv, None) == "cuda_ws3"
    assert _dispatch.kernel_for(_bf16(64, 64, 512), kv, _bf16(3, 512)) == "cuda"
    monkeypatch.setitem(_K.DEFAULT_KERNELS, "bf16", "fused")
    assert _dispatch.kernel_for(_bf16(64, 64, 512), kv, None) == "fused"


@pytest.mark.usefixtures("compiled_present")
def test_split_triton_runs_ws3_and_passes_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernel=None at t = 32 calls ws3 (variant "ws3") with out / lse_out / num_splits as given; t = 31, an extra
    cache and kernel="cuda" call the serial kernel; kernel="cuda_ws3" forces ws3 at t = 1."""
    rec = _Recorder(monkeypatch)
    kv, ex = _bf16(100, 512), _bf16(7, 512)
    for t, kw, want in [
        (32, {}, "ws3"),
        (31, {}, "cuda"),
        (32, dict(extra_kv=ex, extra_indices=torch.zeros(32, 3, dtype=torch.int32)), "cuda"),
        (32, dict(kernel="cuda"), "cuda"),
        (1, dict(kernel="cuda_ws3"), "ws3"),
    ]:
        q = _bf16(t, 64, 512)
        out, lse = torch.empty(t, 64, 512, dtype=torch.bfloat16), torch.empty(t, 64)
        idx = torch.randint(-1, 100, (t, 40), dtype=torch.int32)
        o, s = _K.sparse_attn_split_triton(q, kv, idx, None, SCALE, out=out, lse_out=lse, num_splits=3, **kw)
        name, got_t, got_kw = rec.calls[-1]
        assert (name, got_t) == (want, t), (kw.keys(), name, got_t)
        assert o is out and s is lse and got_kw["out"] is out and got_kw["lse_out"] is lse
        assert got_kw["num_splits"] == 3
        if want == "ws3":
            assert got_kw["variant"] == "ws3" and "ablation" not in got_kw
        else:
            assert got_kw["extra_kv"] is kw.get("extra_kv")
    assert len(rec.calls) == 5


@pytest.mark.usefixtures("compiled_present")
def test_forced_ws3_refuses_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernel="cuda_ws3" raises ValueError naming the reason (extra cache, head count, Triton-only options); the
    default then takes the serial kernel (or, with config, the Triton kernel: `compiled_kernel_for` says so)."""
    # a `_C` without the ws3 extra entry point (else ws3 takes the extra cache), whatever `_C` this machine has
    monkeypatch.setattr(_WS, "ws3_extra_available", lambda: False)
    kv, q = _bf16(100, 512), _bf16(32, 64, 512)
    idx = torch.zeros(32, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="kernel='cuda_ws3'.*extra_kv"):
        _K.sparse_attn_split_triton(q, kv, idx, None, SCALE, kernel="cuda_ws3", extra_kv=kv, extra_indices=idx)
    with pytest.raises(ValueError, match="kernel='cuda_ws3'.*shape"):
        _K.sparse_attn_split_triton(_bf16(32, 96, 512), kv, idx, None, SCALE, kernel="cuda_ws3")
    assert _K.compiled_kernel_for("cuda_ws3", q, kv, None, tuned=True) == (None, "config / dot_fp32 do not apply")
    assert _K.compiled_kernel_for(None, q, kv, None, tuned=True) == (None, "config / dot_fp32 do not apply")
    assert _K.compiled_kernel_for(None, q, kv, None) == ("cuda_ws3", None)
    assert _K.compiled_kernel_for("cuda", q, kv, None) == ("cuda", None)
    assert _K.compiled_kernel_for("fused", q, kv, None) == (None, None)


def test_ws3_why_not_without_c() -> None:
    """The real checks on this machine (no `_C`): ws3 is refused with the reason, so the default never picks it; an
    extra cache is named as the reason once everything else fits."""
    q, kv = _bf16(64, 64, 512), _bf16(100, 512)
    why = _WS.ws3_why_not(q, kv, None)
    assert why is not None and ("_C" in why or "CUDA" in why), why
    assert not _WS.ws3_default_for(q, kv, None)


def test_ws3_why_not_extra_and_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    q, kv = _bf16(64, 64, 512), _bf16(100, 512)
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None)
    monkeypatch.setattr(_WS, "ws3_available", lambda: True)
    assert _WS.ws3_why_not(q, kv, None) is None and _WS.ws3_default_for(q, kv, None)
    assert not _WS.ws3_default_for(q[:31], kv, None)
    assert "extra_kv" in _WS.ws3_why_not(q, kv, kv)
    monkeypatch.setattr(_WS, "ws3_available", lambda: False)
    assert "rebuild" in _WS.ws3_why_not(q, kv, None)


@pytest.mark.usefixtures("compiled_present")
@pytest.mark.parametrize(("form", "b", "s_q", "want"), [
    ("decode", 32, 1, "ws3"), ("decode", 16, 2, "ws3"), ("decode", 31, 1, "cuda"), ("decode", 4, 8, "ws3"),
    ("prefill", 64, 1, "ws3"), ("prefill", 31, 1, "cuda"),
])  # fmt: skip
def test_public_api_routes(monkeypatch: pytest.MonkeyPatch, form: str, b: int, s_q: int, want: str) -> None:
    """`sparse_attn_decode` (t = b * s_q flattened) and `sparse_attn_prefill` reach the chosen kernel once, with the
    caller's out buffer (decode: a [b * s_q, h, d] view of it) and the kernel's values returned."""
    rec = _Recorder(monkeypatch)
    t = b * s_q
    kv = _bf16(100, 512)
    if form == "decode":
        q, idx = _bf16(b, s_q, 64, 512), torch.randint(-1, 100, (b, s_q, 24), dtype=torch.int32)
        out = torch.full((b, s_q, 64, 512), float("nan"), dtype=torch.bfloat16)
        o, lse = fm.sparse_attn_decode(q, kv, idx, None, SCALE, out=out)
        assert lse.shape == (b, s_q, 64)
    else:
        q, idx = _bf16(t, 64, 512), torch.randint(-1, 100, (t, 24), dtype=torch.int32)
        out = torch.full((t, 64, 512), float("nan"), dtype=torch.bfloat16)
        o, lse = fm.sparse_attn_prefill(q, kv, idx, None, SCALE, out=out)
    assert [c[:2] for c in rec.calls] == [(want, t)]
    assert o is out and rec.calls[0][2]["out"].data_ptr() == out.data_ptr()
    assert bool((o == (1.0 if want == "ws3" else 2.0)).all()) and bool((lse == 3.0).all())


# ------------------------------------------------------------------------------------------------------ GPU


class _Counter:
    """Counts the real kernels' calls (GPU): wraps `sparse_attn_ws` / `sparse_attn_cuda` in place."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        ws, cu = _WS.sparse_attn_ws, _CU.sparse_attn_cuda

        def ws_fn(*a, **k):  # noqa: ANN002, ANN003, ANN202
            self.names.append(f"ws:{k.get('variant')}")
            return ws(*a, **k)

        def cu_fn(*a, **k):  # noqa: ANN002, ANN003, ANN202
            self.names.append("cuda")
            return cu(*a, **k)

        monkeypatch.setattr(_WS, "sparse_attn_ws", ws_fn)
        monkeypatch.setattr(_CU, "sparse_attn_cuda", cu_fn)


def _probed() -> None:
    """Skip when a kernel's out-of-process probe failed (test_ws_probe_gpu / test_probe_gpu report it)."""
    for ok, out in (_WS.probe(variant="ws3"), _CU.probe()):
        if not ok:
            pytest.skip(f"kernel probe failed: {out[-300:]}")


def _api(form: str, q, caches, lists, sink, b: int, s_q: int, fp8: bool):  # noqa: ANN001, ANN202
    """The public call on the GPU into a NaN-poisoned out ([b, s_q, h, d] or [t, h, d]); returns (out [t, h, d],
    lse [t, h], the q [t, h, d] on the GPU, the main cache as the kernel got it)."""
    t = q.shape[0]
    used = [(_fp8(c) if fp8 else c).cuda() for c in caches]
    qd, sd = q.cuda(), sink.cuda() if sink is not None else None
    kw = dict(extra_kv=used[1], extra_indices=lists[1].cuda()) if len(used) > 1 else {}
    if form == "decode":
        out = torch.full((b, s_q, 64, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        kw = {k: (v.view(b, s_q, -1) if k == "extra_indices" else v) for k, v in kw.items()}
        o, lse = fm.sparse_attn_decode(qd.view(b, s_q, 64, 512), used[0], lists[0].cuda().view(b, s_q, -1), sd,
                                       SCALE, out=out, **kw)  # fmt: skip
    else:
        out = torch.full((t, 64, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        o, lse = fm.sparse_attn_prefill(qd, used[0], lists[0].cuda(), sd, SCALE, out=out, **kw)
    torch.cuda.synchronize()
    assert o is out
    return o.view(t, 64, 512), lse.reshape(t, 64), qd, used


@gpu
@needs_ws3
@pytest.mark.gpu
@pytest.mark.parametrize(("form", "b", "s_q"), [
    ("decode", 32, 1), ("decode", 16, 2), ("prefill", 64, 1), ("decode", 32, 2),
])  # fmt: skip
@pytest.mark.parametrize("fp8", [False, True])
def test_api_default_runs_ws3_gpu(form: str, b: int, s_q: int, fp8: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """t = b * s_q >= 32 without an extra cache: kernel_for names `default_variant`'s kernel (ws3 below 64 tokens, the
    ws3p family from 64: ws3p1l on BF16, ws3p1v on FP8 since session 9; from 128 the overlap builds:
    test_api_default_runs_overlap_gpu), it runs exactly once (the serial kernel never), and
    the result matches the reference and the float64 oracle (640 indices, holes of every kind, NaN in unused slots,
    token 1 without any valid index: exact zeros and lse = sink)."""
    _probed()
    want = _WS.default_variant(b * s_q, False, fp8)
    ok, out = _WS.probe(variant=want)
    if not ok:
        pytest.skip(f"{want} probe failed: {out[-300:]}")
    q, caches, lists, sink = _v4_inputs(False, "random", 5100 + 10 * b + s_q + fp8)
    t = b * s_q
    q, lists = q[:t], [i[:t] for i in lists]
    cnt = _Counter(monkeypatch)
    o, lse, qd, used = _api(form, q, caches, lists, sink, b, s_q, fp8)
    kind = _dispatch.kernel_for(qd, used[0], None)
    print(f"{form} b={b} s_q={s_q} fp8={fp8}: kernel_for={kind} calls={cnt.names}")
    assert kind == f"cuda_{want}", _WS.ws3_why_not(qd, used[0], None)
    assert cnt.names == [f"ws:{want}"], cnt.names
    _check((o, lse), q, caches, lists, sink, SCALE, (fp8,), gpu_p=True)
    mc.assert_empty_token((o, lse), sink)


@gpu
@needs_ws3
@pytest.mark.gpu
@pytest.mark.parametrize(("form", "b", "s_q", "extra"), [
    ("prefill", 31, 1, False), ("decode", 31, 1, False), ("prefill", 64, 1, True), ("decode", 16, 2, True),
])  # fmt: skip
@pytest.mark.parametrize("fp8", [False, True])
def test_api_serial_below_min_or_extra_gpu(
    form: str, b: int, s_q: int, extra: bool, fp8: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """t = 31 tokens, or an extra cache (512 + 128 indices, both caches of one format) at t >= 32: kernel_for says
    "cuda", the serial kernel runs once (ws3 never), and the result matches the reference and the oracle."""
    _probed()
    q, caches, lists, sink = _v4_inputs(extra, "random", 5200 + 10 * b + s_q + 2 * extra + fp8)
    t = b * s_q
    q, lists = q[:t], [i[:t] for i in lists]
    cnt = _Counter(monkeypatch)
    o, lse, qd, used = _api(form, q, caches, lists, sink, b, s_q, fp8)
    kind = _dispatch.kernel_for(qd, used[0], used[1] if extra else None)
    print(f"{form} b={b} s_q={s_q} extra={extra} fp8={fp8}: kernel_for={kind} calls={cnt.names}")
    assert kind == "cuda" and cnt.names == ["cuda"], (kind, cnt.names)
    _check((o, lse), q, caches, lists, sink, SCALE, (fp8,) * len(caches), gpu_p=True)
    mc.assert_empty_token((o, lse), sink)


@gpu
@needs_ws3
@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_api_default_ws3_two_head_blocks_gpu(fp8: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """h = 128 (two 64-head blocks per token: ws3's grid has num_hb = 2; the other ws3 tests use 64 heads) at t = 32
    through `sparse_attn_prefill`: ws3 runs (4 splits per token) and matches the reference and the oracle; token 1
    has no valid index."""
    _probed()
    g = torch.Generator().manual_seed(5300 + fp8)
    t, h, n, k = 32, 128, 1500, 300
    q = torch.randn(t, h, 512, generator=g).bfloat16()
    counts = [k, 0, *torch.randint(0, k + 1, (t - 2,), generator=g).tolist()]
    idx = _holes(ragged_indices(t, k, torch.arange(n - 8), g, counts), n, g)
    cache = poison_unused(torch.randn(n, 512, generator=g).bfloat16(), [idx])
    sink = torch.randn(h, generator=g)
    used = (_fp8(cache) if fp8 else cache).cuda()
    out = torch.full((t, h, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    cnt = _Counter(monkeypatch)
    o, lse = fm.sparse_attn_prefill(q.cuda(), used, idx.cuda(), sink.cuda(), SCALE, out=out)
    torch.cuda.synchronize()
    kind = _dispatch.kernel_for(q.cuda(), used, None)
    print(f"h={h} fp8={fp8}: kernel_for={kind} calls={cnt.names}")
    assert o is out and kind == "cuda_ws3" and cnt.names == ["ws:ws3"], (kind, cnt.names)
    _check((o, lse), q, [cache], [idx], sink, SCALE, (fp8,), gpu_p=True)
    mc.assert_empty_token((o, lse), sink)


@gpu
@needs_ws3
@pytest.mark.gpu
@pytest.mark.parametrize(("form", "b", "s_q"), [("decode", 64, 2), ("prefill", 200, 1)])
@pytest.mark.parametrize("fp8", [False, True])
def test_api_default_runs_overlap_gpu(form: str, b: int, s_q: int, fp8: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Session 10: t = b * s_q >= WS3P_OVL_MIN_TOKENS (128) without an extra cache: the public call runs the overlap
    build (ws3p1oa BF16 / ws3p1voa FP8, ws3p1voaw with a session-11 `_C`) exactly once, its out / lse bit-for-bit those of its base (ws3p1l / ws3p1v)
    called directly on the same plan, within the probe's bound of the reference (640 ragged indices into 16,384 rows,
    holes of every kind, NaN wherever no index points, NaN-poisoned out, token 1 without a valid index: exact zeros
    and lse = sink)."""
    from test_mla_fp8v import _bits_differ, _ragged_inputs

    from deepinfer.flash_mla import reference

    probe = importlib.import_module("deepinfer.flash_mla.backends.cuda._cuda_probe")
    if not _WS.ws3p_ovl_available():
        pytest.skip("_C without sparse_decode_ws3p_ovl (rebuild)")
    t = b * s_q
    fp8_build = "ws3p1voaw" if _WS.ws3p_vw_available() else "ws3p1voa"  # (session 11: the kOptVecWide build)
    want, base = (fp8_build, "ws3p1v") if fp8 else ("ws3p1oa", "ws3p1l")
    thresh = _WS.ws3p_thresh_available()  # session 14: ws3p1oat, not bit-equal to the base (within the bound below)
    want = "ws3p1oat" if thresh else want
    assert _WS.default_variant(t, False, fp8) == want
    ok, out = _WS.probe(variant=f"{base},{want}")
    if not ok:
        pytest.skip(f"{base} / {want} probe failed: {out[-300:]}")
    q, bf, idx, sink = _ragged_inputs(t, "random", 5400 + t + fp8)
    cnt = _Counter(monkeypatch)
    o, lse, qd, used = _api(form, q, [bf], [idx], sink, b, s_q, fp8)
    kind = _dispatch.kernel_for(qd, used[0], None)
    print(f"{form} b={b} s_q={s_q} fp8={fp8}: kernel_for={kind} calls={cnt.names}")
    assert kind == f"cuda_{want}" and cnt.names == [f"ws:{want}"], (kind, cnt.names)
    ic, sd = idx.cuda(), sink.cuda()
    ref_base = _WS.sparse_attn_ws(qd, used[0], ic, sd, SCALE, variant=base)
    torch.cuda.synchronize()
    why = probe.mismatch(o, lse, *ref_base) if thresh else _bits_differ((o, lse), ref_base)
    assert why is None, f"{want} via the API != {base}: {why}"
    ro, rl = reference.sparse_attn(qd, used[0], ic, sd, SCALE)
    why = probe.mismatch(o, lse, ro, rl)
    assert why is None, f"{want} vs reference: {why}"
    mc.assert_empty_token((o.cpu(), lse.cpu()), sink)
