"""ws3p, the persistent ws3 (session 5 round 5, GPU-run in s6): `sparse_attn_ws(..., variant="ws3p")` ->
`_C.sparse_decode_ws3p` -> fm_ws3_decode.cu's ws3p_decode_kernel (min(#SMs or max_ctas, work items) CTAs, each looping
over (token, split, head block) items at a static stride).

CPU: what the wrapper hands the binding (a stand-in `_C`), the grid plan, the probe's extra grid-cap cases, the
benchmark's rows. The sm_90a compile check (registers, no spills) is test_mla_ws.py::
test_ws3_source_compiles_for_sm90a_without_spills (21 instances, 13 of them ws3p: 2 plain + 11 option builds).
GPU: against the reference / float64 oracle and bit-for-bit against ws3 (same per-tile instructions, same order) at
b 32 s_q 1, b 128 s_q 2 (auto plan, forced 3 splits, a small grid: several items per CTA) and prefill t 4,096, both
caches, holes of every kind, NaN in every unused cache slot, NaN-poisoned outputs.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pathlib
import types

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
SCALE = 512**-0.5
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
needs_ws3p = pytest.mark.skipif(not _WS.ws3p_available(), reason="_C without sparse_decode_ws3p (rebuild)")


# ------------------------------------------------------------------------------------------------------ CPU


class _FakeC:
    """Stand-in `_C` (CPU) recording sparse_decode_ws3p / sparse_decode_ws calls; `old`: built before ws3p."""

    def __init__(self, old: bool = False) -> None:
        self.calls: list[tuple[str, tuple]] = []
        if not old:
            self.sparse_decode_ws3p = lambda *a: self.calls.append(("ws3p", a))

    def ws3_block_rows(self) -> int:
        return 64

    def ws_block_rows(self) -> int:
        return 32

    def sparse_decode_ws(self, *args) -> None:  # noqa: ANN002
        self.calls.append(("ws", args))


def _stub(monkeypatch: pytest.MonkeyPatch, fake: _FakeC) -> None:
    monkeypatch.setattr(_WS, "_module", lambda: fake)
    monkeypatch.setattr(_WS, "supports", lambda q, kv: None)
    monkeypatch.setattr(_WS, "combine_splits", lambda *a, **k: None)
    monkeypatch.setattr(_WS.torch.cuda, "current_stream", lambda dev=None: type("S", (), {"cuda_stream": 7})())


def test_ws3p_wrapper_passes_plan_and_grid_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """ws3p calls `_C.sparse_decode_ws3p` (never sparse_decode_ws) with ws3's 64-row split plan (640 indices, 1 token:
    5 splits of 2 tiles; 256 tokens: 1 split of 10; forced 3: 3 splits of 4 tiles), then fp8, max_ctas (None -> 0:
    one CTA per SM) and the stream. A `_C` without sparse_decode_ws3p is a RuntimeError saying to rebuild, before any
    launch; max_ctas with another variant or below 1 is a ValueError."""
    fake = _FakeC()
    _stub(monkeypatch, fake)
    kv = torch.randn(2048, 512).bfloat16()
    for t, splits, ctas, want in [(1, None, None, (5, 2)), (256, None, 7, (1, 10)), (4, 3, 1, (3, 4))]:
        q = torch.randn(t, 64, 512).bfloat16()
        idx = torch.randint(0, 2048, (t, 640), dtype=torch.int32)
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3p", num_splits=splits, max_ctas=ctas)
        kind, args = fake.calls[-1]
        assert kind == "ws3p", fake.calls[-1]
        # (q, kv, idx, sink, out, lse, part_o, part_lse, num_tokens, H, topk, num_splits, tiles_per_split, ...)
        assert args[8:13] == (t, 64, 640) + want, (t, args[8:13])
        assert args[-3:] == (False, ctas or 0, 7), args[-3:]
    with pytest.raises(ValueError, match="max_ctas"):
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3", max_ctas=4)
    with pytest.raises(ValueError, match="max_ctas"):
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3p", max_ctas=0)
    with pytest.raises(ValueError, match="extra_kv"):  # the extra cache is ws3's only
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3p", extra_kv=kv, extra_indices=idx)
    n = len(fake.calls)
    _stub(monkeypatch, _FakeC(old=True))
    with pytest.raises(RuntimeError, match="rebuild"):
        _WS.sparse_attn_ws(q, kv, idx, None, SCALE, variant="ws3p")
    assert len(fake.calls) == n


def test_ws3p_grid_plan() -> None:
    """`ws3p_grid` (the launcher's grid, fm_ws3_decode.cu launch_persist): min(SMs or max_ctas, work items), work
    items = tokens x splits x head blocks, and how many items the busiest CTA takes (b 128 s_q 2: 256 items on 132 SMs
    -> 2 each, as ws3's two waves; b 32 s_q 1 -> 32 CTAs of 1)."""
    assert _WS.ws3p_grid(256, 64, 1, 132) == (132, 256, 2)
    assert _WS.ws3p_grid(32, 64, 1, 132) == (32, 32, 1)
    assert _WS.ws3p_grid(4096, 64, 1, 132) == (132, 4096, 32)
    assert _WS.ws3p_grid(256, 64, 3, 132, max_ctas=7) == (7, 768, 110)
    assert _WS.ws3p_grid(1, 128, 5, 132) == (10, 10, 1)
    assert _WS.ws3p_grid(0, 64, 1, 132) == (0, 0, 0)
    with pytest.raises(ValueError, match="max_ctas"):
        _WS.ws3p_grid(4, 64, 1, 132, max_ctas=0)


def test_ws3p_self_check_runs_small_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's check for ws3p adds a 3-CTA grid (4 tokens x splits: several items per CTA) to every case, and
    reports a wrong result with its grid; other variants never get max_ctas."""
    memo: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
    seen: list[tuple[str, int | None]] = []

    def stand_in(q, kv, idx, sink, scale, *, out, lse_out, num_splits=None, variant="ws", max_ctas=None):  # noqa: ANN001, ANN202
        seen.append((variant, max_ctas))
        key = (kv.dtype, idx.shape[1])
        if key not in memo:
            memo[key] = reference.sparse_attn(q, kv, idx, sink, scale)
        out.copy_(memo[key][0])
        lse_out.copy_(memo[key][1])
        if max_ctas == 3 and num_splits == 7 and key == (torch.uint8, 640):
            out.copy_(out.roll(1, dims=1))

    monkeypatch.setattr(_WS, "sparse_attn_ws", stand_in)
    why = _WS.self_check(device="cpu", variant="ws3p")
    assert why.startswith("topk=640 fp8=True splits=7 max_ctas=3: max |out - ref|") and ";" not in why, why
    assert len(seen) == 24 and sum(c == 3 for _, c in seen) == 12, seen  # 2 topk x 2 caches x 3 plans x 2 grids


def _bench_module() -> types.ModuleType:
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_flash_mla.py"
    spec = importlib.util.spec_from_file_location("bench_flash_mla_ws3p", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ws3p_bench_rows() -> None:
    """The benchmark times `cuda_ws3p` / `cuda_ws3p_fp8` next to `cuda_ws3[_fp8]` (same call, variant ws3p) wherever
    ws3 runs, the decode_wave cases included; ws3p has no ablation rows."""
    bench = _bench_module()
    bench._PROBE.update(ws3=None, ws3p=None)  # names only: no probe child process even where a GPU is present
    impls = bench._ws_impls(torch.zeros(1), (), ("ws3", "ws3p"), ("ws3", "ws3p"))
    assert {"cuda_ws3", "cuda_ws3_fp8", "cuda_ws3p", "cuda_ws3p_fp8"} <= set(impls), sorted(impls)
    assert not [k for k in impls if k.startswith("cuda_ws3p_abl")], sorted(impls)
    assert {"cuda_ws3p", "cuda_ws3p_fp8"} <= set(bench._WAVE_ROWS)
    assert '("ws3", "ws3p")' in pathlib.Path(bench.__file__).read_text()  # run_case's default ws rows
    assert {"cuda_ws3p", "cuda_ws3p_fp8"} <= set(bench._L2HOT)  # b 128 s_q 2 with every row in L2


def test_ws3p_summary_columns(tmp_path: pathlib.Path) -> None:
    """`--summary` adds the ws3p columns (time, ws3 time / ws3p time, both caches) when the run has ws3p rows."""
    bench = _bench_module()

    def rec(impl: str, us: float) -> dict:
        return {"op": "decode", "shape": "b=128 s_q=2 k=640", "impl": impl, "b": 128, "s_q": 2, "median_us": us,
                "tflops": 1.0, "gbps": 1.0}  # fmt: skip

    rows = [rec("cuda", 92.0), rec("cuda_ws3", 87.0), rec("cuda_ws3p", 80.0), rec("cuda_ws3_fp8", 115.0)]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"records": rows}))
    text = bench.summary(str(path))
    assert "`cuda_ws3p` BF16 | ws3p x | `cuda_ws3p_fp8` | ws3p x FP8" in text, text
    assert "| 80.0 (1.0) | 1.09 |  |  |" in text, text


# ------------------------------------------------------------------------------------------------------ GPU


def _inputs(t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """CPU inputs: q [t, 64, 512] bf16; a 16,384-row BF16 cache with NaN in every slot no index names; int32 [t, 640]
    distinct slots per token with ~5 % holes of every kind (-1, negative, one past the end, INT32_MAX), token 1 none
    valid; a random sink."""
    g = torch.Generator().manual_seed(seed)
    n, k = 16384, 640
    q = (3 * torch.randn(t, 64, 512, generator=g)).bfloat16()
    idx = torch.rand(t, n - 64, generator=g).topk(k, dim=-1).indices.to(torch.int32)
    idx[torch.rand(t, k, generator=g) < 0.05] = -1
    idx[1] = -1
    idx = _holes(idx, n, g)
    cache = poison_unused(torch.randn(n, 512, generator=g).bfloat16(), [idx])
    return q, cache, idx, _sink("random", 64, g)


def _run(variant: str, q, used, idx, sink, **kw) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """One call into NaN-poisoned outputs (every element must be written), synchronised."""
    out = torch.full(tuple(q.shape), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full(tuple(q.shape[:2]), float("nan"), device="cuda")
    o, s = _WS.sparse_attn_ws(q, used, idx, sink, SCALE, out=out, lse_out=lse, variant=variant, **kw)
    assert o is out and s is lse
    torch.cuda.synchronize()
    return o, s


@gpu
@needs_ws3p
@pytest.mark.gpu
def test_ws3p_probe_gpu() -> None:
    """The out-of-process probe (small cases, auto / 1 / 7 splits, each also on a 3-CTA grid): no fault, no hang."""
    ok, out = _WS.probe(variant="ws3p")
    print(out)
    assert ok, out


@gpu
@needs_ws3p
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("t", "splits", "ctas"),
    [(32, None, None), (32, None, 5), (256, None, None), (256, 3, None), (256, None, 7), (4096, None, None)],
    ids=["b32s1", "b32s1_ctas5", "b128s2", "b128s2_split3", "b128s2_ctas7", "prefill4096"],
)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_ws3p_vs_reference_and_ws3_gpu(t: int, splits: int | None, ctas: int | None, fp8: bool) -> None:
    """Every token against the reference (loose bound: layout / protocol bugs), the first 64 tokens against the
    reference and the float64 oracle (the package's tight bounds), token 1 (no valid index) exactly 0 / lse = sink, and
    all of out / lse bit-for-bit equal to ws3's on the same plan (ws3p runs ws3's per-tile code in the same order; a
    difference is a scheduling bug: wrong item, stage or Q)."""
    ok, why = _WS.probe(variant="ws3p")
    if not ok:
        pytest.skip(f"ws3p probe failed (test_ws3p_probe_gpu): {why[-300:]}")
    q, cache, idx, sink = _inputs(t, 7000 + t + 10 * (splits or 0) + (ctas or 0) + fp8)
    used = (_fp8(cache) if fp8 else cache).cuda()
    qd, ic, sd = q.cuda(), idx.cuda(), sink.cuda()
    kw = {"num_splits": splits}
    got = _run("ws3p", qd, used, ic, sd, max_ctas=ctas, **kw)
    n_splits = _WS.split_plan(t, 64, 640, _WS.device_sms(qd.device), splits, 64)[0]
    grid = _WS.ws3p_grid(t, 64, n_splits, _WS.device_sms(qd.device), ctas)
    print(f"t={t} fp8={fp8} splits={splits} -> {n_splits}, max_ctas={ctas}: (CTAs, items, items per CTA) {grid}")
    fails = []
    for lo in range(0, t, 512):  # the reference in chunks (its gather is [tokens, 640, 512] fp32)
        ro, rl = reference.sparse_attn(qd[lo : lo + 512], used, ic[lo : lo + 512], sd, SCALE)
        why = _PROBE.mismatch(got[0][lo : lo + 512], got[1][lo : lo + 512], ro, rl)
        if why is not None:
            fails.append(f"tokens {lo}..: {why}")
    assert not fails, "; ".join(fails)
    m = 64
    _check((got[0][:m], got[1][:m]), q[:m], [cache], [idx[:m]], sink, SCALE, (fp8,), gpu_p=True)
    mc.assert_empty_token((got[0].cpu(), got[1].cpu()), sink)
    want = _run("ws3", qd, used, ic, sd, **kw)
    d_out = float((got[0].float() - want[0].float()).abs().nan_to_num(float("inf")).max())
    d_lse = float((got[1] - want[1]).abs().nan_to_num(float("inf")).max())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (
        f"ws3p != ws3: max |out diff| {d_out:.3e}, max |lse diff| {d_lse:.3e}"
    )
