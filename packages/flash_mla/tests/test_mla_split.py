"""The all-heads split-KV Triton kernel (`backends/cuda/triton_split_attn.py`) and the API routing to it.

CPU: the Triton interpreter (TRITON_INTERPRET=1, set before the kernel modules load; fp32 dot operands) on
small shapes, BF16 and FP8 caches, 1..3 splits. GPU: V4 shapes (h = 64, d = 512, 512 + 128 indices), the
auto split plan at decode batch sizes, FP8 rows, the API on CUDA (prefill and decode) and CUDA-graph replay.

Tolerances come from `mla_checks.dense_oracle` (a bound for any fp32 evaluation of this math, see the
docstring of `test_mla_triton.py`): kernel vs reference within twice the bound; on a GPU plus 2 x 2^-9
sum_j p_j |kv_j| for the bf16 rounding of the weights before P @ V. The split path adds three roundings per
element (partial normalisation, weight, final division), inside the bound's (K + 8) u term. FP8 caches are
compared with the reference on the same bytes and with the oracle on the dequantised cache (the kernel's
bf16 dequantisation is exact: e4m3 times a power of two).
"""

from __future__ import annotations

import importlib
import os
import sys
import zlib

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the @triton.jit decorators run
pytest.importorskip("triton")

from mla_checks import dense_oracle, poison_unused, ragged_indices  # noqa: E402
from test_mla_triton import _assert_close_to, _holes, _sink, _v4_inputs, _weight_abs  # noqa: E402

from deepinfer.flash_mla import api, reference  # noqa: E402

_MOD = "deepinfer.flash_mla.backends.cuda.triton_split_attn"
if not _CUDA and _MOD in sys.modules:  # imported earlier without the interpreter: re-decorate
    importlib.reload(sys.modules[_MOD])
_K = importlib.import_module(_MOD)
DEV = "cuda" if _CUDA else "cpu"
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")


def _fp8(cache: torch.Tensor) -> torch.Tensor:
    """FP8 rows of a float cache; rows that hold NaN (never named) become all 0xFF (NaN data and NaN scale)."""
    flat = cache.reshape(-1, cache.shape[-1])
    unused = torch.isnan(flat).any(-1)
    packed = api.pack_fp8_kv(flat.nan_to_num())
    packed[unused] = 0xFF
    return packed.reshape(*cache.shape[:-1], 584)


def _inputs(t: int, h: int, d: int, k1: int, k2: int, sink_mode: str, seed: int):
    """q [t, h, d] bf16; caches (NaN in unnamed slots) and ragged index lists with holes of every kind; token 1
    (when t > 1) names no valid slot."""
    g = torch.Generator().manual_seed(seed)
    q = (3 * torch.randn(t, h, d, generator=g)).bfloat16()
    caches, lists = [], []
    for k in (k1, k2)[: 2 if k2 else 1]:
        n = k + 9
        counts = [k, 0, max(1, k // 2)][:t]
        idx = _holes(ragged_indices(t, k, torch.arange(n - 4), g, counts), n, g)
        caches.append(poison_unused(torch.randn(n, d, generator=g).bfloat16(), [idx]))
        lists.append(idx)
    return q, caches, lists, _sink(sink_mode, h, g)


def _check(got, q, caches, lists, sink, scale, fp8: tuple[bool, ...], gpu_p: bool) -> None:
    """got vs the reference on the same (possibly FP8) caches and vs the oracle on dequantised ones."""
    dev = got[0].device
    got = (got[0].cpu(), got[1].cpu())
    used = [_fp8(c) if f else c for c, f in zip(caches, fp8)]
    dense = [api.unpack_fp8_kv(u, torch.float32) if f else c for u, c, f in zip(used, caches, fp8)]
    ex = (used[1].to(dev), lists[1].to(dev)) if len(used) > 1 else (None, None)
    ref = reference.sparse_attn(q.to(dev), used[0].to(dev), lists[0].to(dev), _on(sink, dev), scale, *ex)
    ref = (ref[0].cpu(), ref[1].cpu())
    want = dense_oracle(q, dense, lists, sink, scale, torch.bfloat16)
    extra = 2 * 2.0**-9 * _weight_abs(q, dense, lists, sink, scale) if gpu_p else 0.0
    _assert_close_to(got, ref, 2 * want[2] + extra, 2 * want[3])
    _assert_close_to(got, (want[0], want[1]), want[2] + extra, want[3])


def _on(x: torch.Tensor | None, dev: torch.device | str) -> torch.Tensor | None:
    return x.to(dev) if x is not None else None


def _call(q, caches, lists, sink, scale, fp8, **kw):
    """The split kernel into NaN-poisoned buffers (every element must be written)."""
    used = [(_fp8(c) if f else c).to(DEV) for c, f in zip(caches, fp8)]
    t, h, d = q.shape
    out = torch.full((t, h, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    lse = torch.full((t, h), float("nan"), device=DEV)
    ex = dict(extra_kv=used[1], extra_indices=lists[1].to(DEV)) if len(used) > 1 else {}
    o, s = _K.sparse_attn_split_triton(
        q.to(DEV), used[0], lists[0].to(DEV), _on(sink, DEV), scale, out=out, lse_out=lse, **ex, **kw
    )
    assert o is out and s is lse
    return o, s


# (t, h, d, topk, topk2, sink, fp8 of each cache, splits, block_n): block_n 16 makes 40 indices three tiles
_CPU_CASES = [
    (3, 16, 128, 40, 7, "random", (False, False), 1, 16),
    (3, 16, 128, 40, 7, "large", (False, False), 3, 16),
    (3, 16, 128, 7, 40, "none", (False, False), 2, 16),
    (3, 16, 512, 40, 0, "small", (True,), 3, 16),
    (3, 16, 512, 40, 7, "random", (True, False), 2, 16),
    (1, 64, 128, 7, 7, "random", (False, False), 2, 16),
]


@pytest.mark.parametrize(("t", "h", "d", "k1", "k2", "sink_mode", "fp8", "splits", "block_n"), _CPU_CASES)
def test_split_kernel_vs_reference(t, h, d, k1, k2, sink_mode, fp8, splits, block_n) -> None:
    q, caches, lists, sink = _inputs(t, h, d, k1, k2, sink_mode, zlib.crc32(f"{t}{h}{d}{k1}{k2}{sink_mode}".encode()))
    if any(fp8) and d != 512:
        pytest.skip("FP8 rows hold d = 512")
    cfg = (max(16, min(64, h)), block_n, 4, 1)
    got = _call(q, caches, lists, sink, d**-0.5, fp8, num_splits=splits, config=cfg)
    _check((got[0].cpu(), got[1].cpu()), q, caches, lists, sink, d**-0.5, fp8, gpu_p=False)
    if t > 1:  # token 1: no valid index anywhere -> zeros and lse = sink (-inf without one), exactly
        assert bool((got[0][1] == 0).all())
        assert torch.equal(got[1][1].cpu(), sink) if sink is not None else bool(torch.isneginf(got[1][1]).all())


# The chunked (d = 512 only) and deferred kernels: FP8 main cache with a BF16 extra cache, BF16 alone, split
# and unsplit; 16-row tiles make 40 indices three tiles (the deferred kernel's owed P @ V crosses tiles, splits
# and the switch between the two lists).
_VARIANT_CASES = [
    (3, 16, 40, 7, "random", (True, False), 2),
    (3, 16, 40, 0, "large", (False,), 1),
    (2, 16, 7, 40, "none", (True, True), 3),
]


@pytest.mark.parametrize("kernel", ["chunked", "deferred"])
@pytest.mark.parametrize(("t", "h", "k1", "k2", "sink_mode", "fp8", "splits"), _VARIANT_CASES)
def test_variant_kernels_vs_reference(kernel, t, h, k1, k2, sink_mode, fp8, splits) -> None:
    q, caches, lists, sink = _inputs(t, h, 512, k1, k2, sink_mode, zlib.crc32(f"ck{t}{h}{k1}{k2}{sink_mode}".encode()))
    got = _call(q, caches, lists, sink, 512**-0.5, fp8, num_splits=splits, config=(16, 16, 4, 1), kernel=kernel)
    _check((got[0].cpu(), got[1].cpu()), q, caches, lists, sink, 512**-0.5, fp8, gpu_p=False)
    if t > 1:  # token 1 names no valid slot
        assert bool((got[0][1] == 0).all())
        assert torch.equal(got[1][1].cpu(), sink) if sink is not None else bool(torch.isneginf(got[1][1]).all())


def test_deferred_kernel_small_d() -> None:
    """The deferred kernel is not tied to d = 512: d = 128, BF16 caches, one split."""
    q, caches, lists, sink = _inputs(3, 16, 128, 40, 7, "random", 5)
    got = _call(
        q, caches, lists, sink, 128**-0.5, (False, False), num_splits=1, config=(16, 16, 4, 1), kernel="deferred"
    )
    _check((got[0].cpu(), got[1].cpu()), q, caches, lists, sink, 128**-0.5, (False, False), gpu_p=False)


def test_default_kernel_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernel=None follows DEFAULT_KERNELS per cache format (what the lead switches); chunked needs d = 512."""
    assert _K._pick_kernel(None, 512, True) == _K.DEFAULT_KERNELS["fp8"]
    monkeypatch.setitem(_K.DEFAULT_KERNELS, "fp8", "chunked")
    monkeypatch.setitem(_K.DEFAULT_KERNELS, "bf16", "deferred")
    assert _K._pick_kernel(None, 512, True) == "chunked"
    assert _K._pick_kernel(None, 128, True) == "fused"
    assert _K._pick_kernel(None, 128, False) == "deferred"
    assert _K._pick_kernel("fused", 512, True) == "fused"


def test_chunked_kernel_argument_checks() -> None:
    q = torch.randn(1, 16, 128).bfloat16()
    kv = torch.randn(8, 128).bfloat16()
    idx = torch.zeros(1, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="d = 512"):
        _K.sparse_attn_split_triton(q, kv, idx, None, 0.1, kernel="chunked")
    with pytest.raises(ValueError, match="kernel: expected one of"):
        _K.sparse_attn_split_triton(q, kv, idx, None, 0.1, kernel="wgmma")


def test_plan_num_splits() -> None:
    assert _K.plan_num_splits(1, 1, 20, 132) == 10  # b = 1: two tiles per program
    assert _K.plan_num_splits(1, 1, 20, 132, min_tiles=1) == 20
    assert _K.plan_num_splits(1, 1, 260, 132) == 130  # HCA at 1M context
    assert _K.plan_num_splits(32, 1, 20, 132) == 4  # 128 programs, one wave
    assert _K.plan_num_splits(64, 1, 20, 132) == 2
    assert _K.plan_num_splits(128, 1, 20, 132) == 1  # the tokens fill the GPU
    assert _K.plan_num_splits(4096, 1, 20, 132) == 1
    assert _K.plan_num_splits(16, 1, 20, 132) == 7  # 8 splits would leave one split short: rebalanced to 3 tiles
    assert _K.plan_num_splits(3, 1, 3, 132) == 1 and _K.plan_num_splits(0, 1, 20, 132) == 1
    for t in range(1, 70):  # never an empty split, never more programs than SMs unless t alone exceeds them
        s = _K.plan_num_splits(t, 1, 20, 132)
        per = -(-20 // s)
        assert (s - 1) * per < 20 and (s == 1 or (t * s <= 132 and per >= 2))


def test_split_kernel_argument_checks() -> None:
    q = torch.zeros(1, 4, 128, dtype=torch.bfloat16)
    kv = torch.zeros(2, 128, dtype=torch.bfloat16)
    idx = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="head dim"):
        _K.sparse_attn_split_triton(torch.zeros(1, 4, 96, dtype=torch.bfloat16), kv, idx, None, 1.0)
    with pytest.raises(ValueError, match="584"):
        _K.sparse_attn_split_triton(q, torch.zeros(2, 584, dtype=torch.uint8), idx, None, 1.0)
    with pytest.raises(ValueError, match="together"):
        _K.sparse_attn_split_triton(q, kv, idx, None, 1.0, extra_kv=kv)
    with pytest.raises(ValueError, match="sink"):
        _K.sparse_attn_split_triton(q, kv, idx, torch.zeros(3), 1.0)


def test_launch_retries_with_fewer_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of shared memory at compile time: the launcher retries with fewer stages and remembers the count."""
    from triton.runtime.errors import OutOfResources

    tried: list[int] = []

    class FakeKernel:
        def __init__(self, fail_all: bool = False) -> None:
            self.fail_all = fail_all

        def __getitem__(self, grid):
            def launch(*args, num_warps: int, num_stages: int, **consts) -> None:
                tried.append(num_stages)
                if num_stages > 2 or self.fail_all:
                    raise OutOfResources(200000, 232448, "shared memory")

            return launch

    monkeypatch.setattr(_K, "_split_attn_kernel", FakeKernel())
    monkeypatch.setattr(_K, "_STAGES_CAP", {})
    _K._launch((1,), (), {"D": 512}, 8, 4)
    _K._launch((1,), (), {"D": 512}, 8, 4)
    assert tried == [4, 3, 2, 2]
    monkeypatch.setattr(_K, "_split_attn_kernel", FakeKernel(fail_all=True))
    with pytest.raises(OutOfResources):  # nothing fits: the error reaches the caller
        _K._launch((1,), (), {"D": 1024}, 8, 3)


def _api_case(seed: int, fp8: bool):
    g = torch.Generator().manual_seed(seed)
    b, s_q, h, d, topk, win = 2, 2, 16, 512, 24, 8
    kv = torch.randn(4, 16, d, generator=g).bfloat16()
    idx = ragged_indices(b * s_q, topk, torch.arange(48), g, [topk, 0, 5, 17])
    ex_kv = torch.randn(12, d, generator=g).bfloat16()
    ex_idx = ragged_indices(b * s_q, win, torch.arange(10), g, [win, 0, 3, 1])
    kv, ex_kv = poison_unused(kv, [idx]), poison_unused(ex_kv, [ex_idx])
    q = torch.randn(b, s_q, h, d, generator=g).bfloat16()
    sink = torch.randn(h, generator=g)
    return q, [kv, ex_kv], [idx, ex_idx], sink, (fp8, False)


@pytest.mark.parametrize("fp8", [False, True])
def test_api_routes_to_triton(monkeypatch: pytest.MonkeyPatch, fp8: bool) -> None:
    """The public decode / prefill calls on the Triton backend (forced here: CPU interpreter; auto on CUDA)."""
    monkeypatch.setenv("DEEPINFER_FLASH_MLA_BACKEND", "triton")
    from deepinfer.flash_mla import _dispatch

    q, caches, lists, sink, fp8s = _api_case(40 + fp8, fp8)
    b, s_q, h, d = q.shape
    used = [(_fp8(c) if f else c).to(DEV) for c, f in zip(caches, fp8s)]
    assert _dispatch.route(q.to(DEV), used[0], used[1]) == "split"
    out = torch.full((b, s_q, h, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    idx, ex_idx = lists[0].view(b, s_q, -1).to(DEV), lists[1].view(b, s_q, -1).to(DEV)
    meta = api.get_decode_metadata(b, s_q, h, idx.shape[-1], extra_topk=ex_idx.shape[-1])
    o, lse = api.sparse_attn_decode(
        q.to(DEV), used[0], idx, sink.to(DEV), d**-0.5, extra_kv=used[1], extra_indices=ex_idx, metadata=meta, out=out
    )
    assert o is out and lse.shape == (b, s_q, h)
    q3 = q.view(-1, h, d)
    _check((o.view(-1, h, d).cpu(), lse.view(-1, h).cpu()), q3, caches, lists, sink, d**-0.5, fp8s, gpu_p=_CUDA)
    o2, lse2 = api.sparse_attn_prefill(
        q3.to(DEV), used[0], lists[0].to(DEV), sink.to(DEV), d**-0.5, extra_kv=used[1], extra_indices=lists[1].to(DEV)
    )
    _check((o2.cpu(), lse2.cpu()), q3, caches, lists, sink, d**-0.5, fp8s, gpu_p=_CUDA)


def test_api_route_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    from deepinfer.flash_mla import _dispatch

    q = torch.zeros(1, 4, 512, dtype=torch.bfloat16)
    kv = torch.zeros(2, 512, dtype=torch.bfloat16)
    monkeypatch.setenv("DEEPINFER_FLASH_MLA_BACKEND", "reference")
    assert _dispatch.route(q, kv, None) == "reference"
    monkeypatch.setenv("DEEPINFER_FLASH_MLA_BACKEND", "auto")
    assert _dispatch.route(q, kv, None) == ("split" if _CUDA else "reference")  # auto never interprets on CPU
    monkeypatch.setenv("DEEPINFER_FLASH_MLA_BACKEND", "triton")
    assert _dispatch.route(torch.zeros(1, 4, 96), torch.zeros(2, 96), None) == "reference"  # d not a power of 2


# ------------------------------------------------------------------------------------------------------ GPU


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4, 64])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("extra", [False, True])
def test_v4_shapes_split_gpu(t: int, fp8: bool, extra: bool) -> None:
    """V4 shapes (64 heads, d 512, 640 indices) at decode token counts: t = 1 and 4 run split-KV (20 tiles over
    20 / 20 programs per token), t = 64 two splits; FP8 main cache against the same bytes and the dequantised one.
    """
    q, caches, lists, sink = _v4_inputs(extra, "random", zlib.crc32(f"split{t}{fp8}{extra}".encode()))
    q, lists = q[:t], [i[:t] for i in lists]
    fp8s = (fp8, False)[: len(caches)]
    got = _call(q, caches, lists, sink, 512**-0.5, fp8s)
    _check(got, q, caches, lists, sink, 512**-0.5, fp8s, gpu_p=True)
    if t > 1:
        assert bool((got[0][1] == 0).all())


_GPU_VARIANTS = [  # (kernel, config): every (kernel, config) pair the benchmark times
    ("chunked", None),
    ("chunked", (64, 64, 8, 2)),
    ("chunked", (64, 64, 8, 3)),
    ("deferred", None),
    ("deferred", (64, 32, 8, 2)),
    ("deferred", (64, 16, 8, 4)),
]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 64])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("kernel_config", _GPU_VARIANTS)
def test_v4_shapes_variant_kernels_gpu(t: int, fp8: bool, kernel_config) -> None:
    """The chunked and deferred kernels on V4 shapes (512 + 128 indices, NaN in unused slots, NaN-poisoned
    output), split (t = 1) and 2 splits (t = 64), both cache formats for the main list, the benchmark's configs."""
    kernel, config = kernel_config
    q, caches, lists, sink = _v4_inputs(True, "random", zlib.crc32(f"{kernel}{t}{fp8}{config}".encode()))
    q, lists = q[:t], [i[:t] for i in lists]
    got = _call(q, caches, lists, sink, 512**-0.5, (fp8, False), config=config, kernel=kernel)
    _check(got, q, caches, lists, sink, 512**-0.5, (fp8, False), gpu_p=True)


@gpu
@pytest.mark.gpu
def test_split_matches_unsplit_gpu() -> None:
    """Split-KV and one program per token agree within the bound (same math, other summation order)."""
    q, caches, lists, sink = _v4_inputs(True, "large", 91)
    a = _call(q[:8], caches, [i[:8] for i in lists], sink, 512**-0.5, (False, False), num_splits=1)
    b = _call(q[:8], caches, [i[:8] for i in lists], sink, 512**-0.5, (False, False), num_splits=5)
    want = dense_oracle(q[:8], caches, [i[:8] for i in lists], sink, 512**-0.5, torch.bfloat16)
    bf16_p = 2 * 2.0**-9 * _weight_abs(q[:8], caches, [i[:8] for i in lists], sink, 512**-0.5)
    _assert_close_to(a, (b[0].cpu(), b[1].cpu()), 2 * (want[2] + bf16_p), 2 * want[3])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_api_decode_cuda_graph_gpu(fp8: bool) -> None:
    """api.sparse_attn_decode captured in a CUDA graph (b = 2, s_q = 2: the split path with its workspace and
    combine kernel), replayed on new q / sink / index values in the same buffers."""
    q, caches, lists, sink = _v4_inputs(True, "random", 93 + fp8)
    b, s_q = 2, 2
    used = [(_fp8(caches[0]) if fp8 else caches[0]).cuda(), caches[1].cuda()]
    qd = q[: b * s_q].view(b, s_q, 64, 512).cuda()
    ld = [i[: b * s_q].view(b, s_q, -1).cuda() for i in lists]
    sd = sink.cuda()
    out = torch.empty_like(qd)
    meta = api.get_decode_metadata(b, s_q, 64, ld[0].shape[-1], extra_topk=ld[1].shape[-1], device="cuda")

    def call() -> torch.Tensor:
        return api.sparse_attn_decode(
            qd, used[0], ld[0], sd, 512**-0.5, extra_kv=used[1], extra_indices=ld[1], metadata=meta, out=out
        )[1]

    call()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lse = call()
    g = torch.Generator().manual_seed(95)
    q2 = torch.randn(qd.shape, generator=g).bfloat16()
    lists2 = [i.roll(1, dims=0)[: b * s_q] for i in lists]
    qd.copy_(q2.cuda())
    sd.copy_((14.0 + torch.randn(64, generator=g)).cuda())
    for dst, src in zip(ld, lists2):
        dst.copy_(src.view(dst.shape).cuda())
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    got = (out.view(-1, 64, 512), lse.view(-1, 64))
    _check(got, q2.view(-1, 64, 512), caches, lists2, sd.cpu(), 512**-0.5, (fp8, False), gpu_p=True)


@gpu
@pytest.mark.gpu
def test_api_prefill_fp32_routes_legacy_gpu() -> None:
    """fp32 q on CUDA: the older kernel with fp32 dot operands; the fp32 bound applies (no bf16 weights)."""
    from deepinfer.flash_mla import _dispatch

    q, caches, lists, sink = _inputs(3, 16, 512, 40, 7, "random", 97)
    q = q.float()
    caches = [c.float() for c in caches]
    assert _dispatch.route(q.cuda(), caches[0].cuda(), caches[1].cuda()) == "legacy"
    o, lse = api.sparse_attn_prefill(
        q.cuda(), caches[0].cuda(), lists[0].cuda(), sink.cuda(), 512**-0.5, extra_kv=caches[1].cuda(),
        extra_indices=lists[1].cuda(),
    )  # fmt: skip
    want = dense_oracle(q, caches, lists, sink, 512**-0.5, torch.float32)
    ref = reference.sparse_attn(q, caches[0], lists[0], sink, 512**-0.5, caches[1], lists[1])
    _assert_close_to((o.cpu(), lse.cpu()), ref, 2 * want[2], 2 * want[3])
