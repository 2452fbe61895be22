"""The Triton sparse-attention kernel (`backends/cuda/triton_sparse_attn.py`) against `reference.sparse_attn`.

On a CPU-only machine the kernel runs under the Triton interpreter (TRITON_INTERPRET=1, set here before the
kernel module is imported; its dots then take fp32 operands); with CUDA it runs compiled with bf16 operands.
Every case also checks the kernel against the independent float64 dense oracle of `mla_checks`.

Tolerances. `dense_oracle` returns out_tol / lse_tol, a bound on how far any fp32 evaluation of this math
(fp32 products and sums of the bf16 / fp32 inputs, exp, one division, a final rounding to the output dtype) can
be from the exact value: logit error Ez <= (d + 2) u |scale| max_j |q_h| . |kv_j|, output error
<= (4 Ez + (K + 8) u) sum_j p_j |kv_j| + u_out |out|. The interpreter kernel is such an evaluation (online
softmax only adds a few roundings per tile, covered by the K + 8 term), and so is the reference, so the two
differ by at most twice the bound: that is the CPU tolerance, against the reference; against the oracle, the
bound itself. On a GPU the kernel also rounds each weight p_j to bf16 before the P @ V product (relative error
<= 2^-9 per weight, while the denominator keeps the fp32 sum), which moves the output by at most
2^-9 sum_j p_j |kv_j|; the GPU tolerance adds twice that (factor 2: margin for ex2.approx) to the fp32 one.
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
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the @triton.jit in the kernel module
pytest.importorskip("triton")

from mla_checks import assert_attention_close, dense_oracle, poison_unused, ragged_indices  # noqa: E402

from deepinfer.flash_mla import reference  # noqa: E402

_MOD = "deepinfer.flash_mla.backends.cuda.triton_sparse_attn"
if not _CUDA and _MOD in sys.modules:  # imported earlier without the interpreter: re-decorate the kernel
    importlib.reload(sys.modules[_MOD])
_KERNEL = importlib.import_module(_MOD)
sparse_attn_triton = _KERNEL.sparse_attn_triton

DEV = "cuda" if _CUDA else "cpu"
gpu = pytest.mark.skipif(not _CUDA, reason="needs a CUDA GPU")
_HOLES = (-1, -1, -5, 2**31 - 1)  # hole values; the cache size (out of range by one) is added per case


def _holes(idx: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """Replace the -1 entries of idx by a mix of hole values: -1, negative, n (one past the end), INT32_MAX."""
    vals = torch.tensor([*_HOLES, n], dtype=torch.int32)
    pick = vals[torch.randint(0, len(vals), idx.shape, generator=g)]
    return torch.where(idx == -1, pick, idx)


def _sink(mode: str, h: int, g: torch.Generator) -> torch.Tensor | None:
    """None, one dominating every logit (large), one negligible (small), or random."""
    if mode == "none":
        return None
    return {"large": 14.0, "small": -40.0, "random": 0.0}[mode] + torch.randn(h, generator=g)


def _case(
    t: int, h: int, d: int, topk: int, topk2: int, sink_mode: str, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], torch.Tensor | None]:
    """CPU inputs: q [t, h, d]; caches (NaN in every unnamed slot); index lists (ragged, holes of all kinds,
    token 1 without any valid index when t > 1); sink [h] or None. The second list is present iff topk2 > 0.
    """
    g = torch.Generator().manual_seed(seed)
    q = (3 * torch.randn(t, h, d, generator=g)).to(dtype)  # spread logits over several units
    caches, lists = [], []
    for k, extra in ((topk, 4), (topk2, 3)):
        if k == 0 and caches:
            break
        n = k + extra + 5
        counts = [k, 0, max(1, k // 2)][:t] if t > 1 else [k]
        idx = _holes(ragged_indices(t, k, torch.arange(n - extra), g, counts), n, g)  # last `extra` never named
        kv = torch.randn(n, d, generator=g).to(dtype)
        caches.append(poison_unused(kv, [idx]))
        lists.append(idx)
    return q, caches, lists, _sink(sink_mode, h, g)


def _run(
    q: torch.Tensor,
    caches: list[torch.Tensor],
    lists: list[torch.Tensor],
    sink: torch.Tensor | None,
    scale: float,
    **kw: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel into NaN-poisoned out / lse buffers (every element must be written); checks identity."""
    t, h, d = q.shape
    out = torch.full((t, h, d), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((t, h), float("nan"), device=q.device)
    extra = dict(extra_kv=caches[1], extra_indices=lists[1]) if len(caches) > 1 else {}
    o, s = sparse_attn_triton(q, caches[0], lists[0], sink, scale, out=out, lse_out=lse, **extra, **kw)
    assert o is out and s is lse
    return o, s


def _reference(
    q: torch.Tensor, caches: list[torch.Tensor], lists: list[torch.Tensor], sink: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    ex = (caches[1], lists[1]) if len(caches) > 1 else (None, None)
    return reference.sparse_attn(q, caches[0], lists[0], sink, scale, *ex)


def _assert_close_to(
    got: tuple[torch.Tensor, torch.Tensor],
    ref: tuple[torch.Tensor, torch.Tensor],
    out_tol: torch.Tensor,
    lse_tol: torch.Tensor,
) -> None:
    """|out - ref| <= out_tol ([t, h, 1]); same -inf lse pattern; |lse - ref| <= lse_tol where finite."""
    (o, s), (ro, rs) = got, ref
    assert torch.isfinite(o).all(), "output holds NaN/inf"
    err = (o.double().cpu() - ro.double().cpu()).abs()  # either may live on the GPU
    over = err - out_tol
    worst = tuple(int(i) for i in torch.unravel_index(over.argmax(), over.shape))
    assert bool((over <= 0).all()), (
        f"out error over the bound by {float(over.max()):.3e} at {worst} (max error {float(err.max()):.3e})"
    )
    s, rs = s.cpu().double(), rs.cpu().double()
    assert torch.equal(torch.isneginf(s), torch.isneginf(rs)), "lse -inf pattern differs"
    fin = torch.isfinite(rs)
    assert bool(((s - rs).abs()[fin] <= lse_tol[fin]).all()), f"lse error {float((s - rs).abs()[fin].max()):.3e}"


# (t, h, d, topk, topk2, sink, dtype, block_n): topk / topk2 in {1, 7, 40}; block_n = 16 makes 40 take 3 tiles.
_CPU_CASES = [
    (1, 4, 128, 1, 0, "none", torch.bfloat16, None),
    (3, 16, 128, 7, 0, "large", torch.bfloat16, None),
    (3, 4, 128, 40, 7, "small", torch.bfloat16, 16),
    (1, 16, 512, 40, 0, "random", torch.bfloat16, None),
    (3, 16, 512, 7, 40, "none", torch.bfloat16, 16),
    (3, 4, 512, 40, 1, "large", torch.bfloat16, 16),
    (3, 16, 512, 1, 7, "small", torch.bfloat16, None),
    (3, 16, 128, 40, 40, "random", torch.float32, 16),
    (1, 64, 128, 7, 7, "random", torch.bfloat16, None),  # two head blocks of 32 per token
]


@pytest.mark.parametrize(("t", "h", "d", "topk", "topk2", "sink_mode", "dtype", "block_n"), _CPU_CASES)
def test_kernel_vs_reference(
    t: int, h: int, d: int, topk: int, topk2: int, sink_mode: str, dtype: torch.dtype, block_n: int | None
) -> None:
    seed = zlib.crc32(f"{t}{h}{d}{topk}{topk2}{sink_mode}{dtype}".encode())
    q, caches, lists, sink = _case(t, h, d, topk, topk2, sink_mode, dtype, seed)
    scale = d**-0.5
    dev = [x.to(DEV) for x in (q, *caches, *lists)]
    qd, cd, ld = dev[0], dev[1 : 1 + len(caches)], dev[1 + len(caches) :]
    sd = sink.to(DEV) if sink is not None else None
    got = _run(qd, cd, ld, sd, scale, block_n=block_n)
    want = dense_oracle(q, caches, lists, sink, scale, dtype)
    _assert_close_to(got, _reference(qd, cd, ld, sd, scale), 2 * want[2], 2 * want[3])
    assert_attention_close(got[0].cpu(), got[1].cpu(), want)
    if t > 1:  # token 1 has no valid index in any list
        assert bool((got[0][1] == 0).all())
        assert torch.equal(got[1][1].cpu(), sink) if sink is not None else bool(torch.isneginf(got[1][1]).all())


def test_no_valid_index_anywhere() -> None:
    """Zeros and lse = sink (-inf without one), exactly; an empty cache and an empty second list included."""
    g = torch.Generator().manual_seed(11)
    t, h, d = 3, 4, 128
    q = torch.randn(t, h, d, generator=g).bfloat16().to(DEV)
    kv = torch.full((6, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    idx = torch.tensor([[-1, 6, -2], [7, 2**31 - 1, -1], [-1, -1, -1]], dtype=torch.int32, device=DEV)
    sink = torch.randn(h, generator=g).to(DEV)
    empty = torch.empty(0, d, dtype=torch.bfloat16, device=DEV)
    for s in (sink, None):
        for caches, lists in (
            ([kv], [idx]),
            ([kv, empty], [idx, torch.zeros(t, 2, dtype=torch.int32, device=DEV)]),  # index 0 of 0 rows: a hole
            ([kv, kv], [idx, torch.zeros(t, 0, dtype=torch.int32, device=DEV)]),
        ):
            o, lse = _run(q, caches, lists, s, d**-0.5)
            assert bool((o == 0).all())
            assert torch.equal(lse, s.expand(t, h)) if s is not None else bool(torch.isneginf(lse).all())


def test_paged_cache_strided_buffers_and_duplicates() -> None:
    """A paged [blocks, bs, d] cache equals its flat view; strided q / out / lse give the same bits; a slot
    named twice counts twice (as in the reference); an empty main list with a non-empty second one works.
    """
    g = torch.Generator().manual_seed(12)
    t, h, d, bs = 3, 16, 128, 16
    cache = torch.randn(4, bs, d, generator=g).bfloat16().to(DEV)
    idx = ragged_indices(t, 7, torch.arange(4 * bs), g).to(DEV)
    idx[:, 0] = idx[:, 1] = 5  # a duplicate in every row
    q = torch.randn(t, h, d, generator=g).bfloat16().to(DEV)
    sink = torch.randn(h, generator=g).to(DEV)
    o, lse = _run(q, [cache], [idx], sink, d**-0.5)
    o2, lse2 = _run(q, [cache.view(-1, d)], [idx], sink, d**-0.5)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)

    q_wide = torch.zeros(t, h, 2 * d, dtype=torch.bfloat16, device=DEV)
    q_wide[..., :d] = q
    out_wide = torch.full((t, h, 2 * d), float("nan"), dtype=torch.bfloat16, device=DEV)
    lse_t = torch.full((h, t), float("nan"), device=DEV)
    o3, lse3 = sparse_attn_triton(q_wide[..., :d], cache, idx, sink, d**-0.5, out=out_wide[..., :d], lse_out=lse_t.T)
    assert torch.equal(o3, o) and torch.equal(lse3, lse) and bool(torch.isnan(out_wide[..., d:]).all())

    ref = reference.sparse_attn(q, cache, idx, sink, d**-0.5)
    want = dense_oracle(q.cpu(), [cache.cpu()], [idx.cpu()], sink.cpu(), d**-0.5, torch.bfloat16)
    want = (want[0], want[1], 2 * want[2], 2 * want[3])  # kernel vs reference: twice the fp32 bound (docstring)
    _assert_close_to((o, lse), ref, want[2], want[3])

    none = torch.zeros(t, 0, dtype=torch.int32, device=DEV)
    o4, lse4 = _run(q, [cache, cache], [none, idx], sink, d**-0.5)
    assert torch.equal(o4, o) and torch.equal(lse4, lse)


@pytest.mark.skipif(_CUDA, reason="interpreter only: on a GPU fp32 operands would go through TF32")
def test_gpu_operand_branch_in_interpreter() -> None:
    """dot_fp32=False (the GPU branch: operands in the cache dtype, p cast to it) with fp32 data, which the
    interpreter multiplies correctly: same math, same fp32 bound as the DOT_FP32 branch."""
    q, caches, lists, sink = _case(3, 16, 128, 40, 7, "random", torch.float32, 21)
    got = _run(q, caches, lists, sink, 128**-0.5, dot_fp32=False, block_n=16)
    want = dense_oracle(q, caches, lists, sink, 128**-0.5, torch.float32)
    _assert_close_to(got, _reference(q, caches, lists, sink, 128**-0.5), 2 * want[2], 2 * want[3])


def test_config_and_argument_checks() -> None:
    assert _KERNEL.default_config(64, 512) == (32, 32, 8)
    assert _KERNEL.default_config(4, 128) == (16, 64, 4)
    assert _KERNEL.default_config(64, 512, fp32_gpu=True) == (16, 16, 8)
    q = torch.zeros(1, 4, 128, dtype=torch.bfloat16)
    kv = torch.zeros(2, 128, dtype=torch.bfloat16)
    idx = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="head dim"):
        sparse_attn_triton(torch.zeros(1, 4, 96, dtype=torch.bfloat16), kv, idx, None, 1.0)
    with pytest.raises(ValueError, match="FP8"):
        sparse_attn_triton(q, torch.zeros(2, 584, dtype=torch.uint8), idx, None, 1.0)
    with pytest.raises(ValueError, match="together"):
        sparse_attn_triton(q, kv, idx, None, 1.0, extra_kv=kv)
    with pytest.raises(ValueError, match="block_n"):
        sparse_attn_triton(q, kv, idx, None, 1.0, block_n=24)


def _weight_abs(
    q: torch.Tensor, caches: list[torch.Tensor], lists: list[torch.Tensor], sink: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """float64 [t, h, 1]: max over d of sum_j p_j |kv_j| (p: the exact softmax weights, sink included)."""
    rows, masks = [], []
    for c, i in zip(caches, lists):
        flat = c.reshape(-1, c.shape[-1]).double()
        r, m = reference.gather_kv(flat, i)
        rows.append(r.double())
        masks.append(m)
    kv, valid = torch.cat(rows, 1), torch.cat(masks, 1)  # [t, K, d], [t, K]
    z = (torch.einsum("thd,tkd->thk", q.double(), kv) * scale).masked_fill(~valid[:, None, :], float("-inf"))
    if sink is not None:
        z = torch.cat([z, sink.double()[None, :, None].expand(z.shape[0], -1, 1)], -1)
    p = torch.softmax(z, -1).nan_to_num()[..., : kv.shape[1]]
    return torch.einsum("thk,tkd->thd", p, kv.abs()).amax(-1, keepdim=True)


def _v4_inputs(
    extra: bool, sink_mode: str, seed: int
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], torch.Tensor | None]:
    """V4 decode-batch shapes on the GPU: t 64, h 64, d 512, 640 indices (512 + 128 window, or 640 in one list),
    a paged [32, 64, 512] cache with NaN in unnamed slots, ragged holes (token 1 none valid)."""
    g = torch.Generator().manual_seed(seed)
    t, h, d = 64, 64, 512
    k1, k2 = (512, 128) if extra else (640, 0)
    q = torch.randn(t, h, d, generator=g).bfloat16()
    counts = [k1, 0, *torch.randint(0, k1 + 1, (t - 2,), generator=g).tolist()]
    idx = _holes(ragged_indices(t, k1, torch.arange(32 * 64 - 64), g, counts), 32 * 64, g)
    caches = [poison_unused(torch.randn(32, 64, d, generator=g).bfloat16(), [idx])]
    lists = [idx]
    if extra:
        ex_idx = _holes(ragged_indices(t, k2, torch.arange(200), g, [k2, 0, *[k2] * (t - 2)]), 256, g)
        caches.append(poison_unused(torch.randn(256, d, generator=g).bfloat16(), [ex_idx]))
        lists.append(ex_idx)
    return q, caches, lists, _sink(sink_mode, h, g)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("extra", [False, True])
@pytest.mark.parametrize("sink_mode", ["none", "random", "large"])
def test_v4_shapes_gpu(extra: bool, sink_mode: str) -> None:
    q, caches, lists, sink = _v4_inputs(extra, sink_mode, zlib.crc32(f"v4{extra}{sink_mode}".encode()))
    scale = 512**-0.5
    cuda = [x.cuda() for x in (q, *caches, *lists)]
    qd, cd, ld = cuda[0], cuda[1 : 1 + len(caches)], cuda[1 + len(caches) :]
    sd = sink.cuda() if sink is not None else None
    got = _run(qd, cd, ld, sd, scale)
    want = dense_oracle(q, caches, lists, sink, scale, torch.bfloat16)
    bf16_p = 2 * 2.0**-9 * _weight_abs(q, caches, lists, sink, scale)  # p rounded to bf16 (docstring)
    _assert_close_to(got, _reference(qd, cd, ld, sd, scale), 2 * want[2] + bf16_p, 2 * want[3])
    assert bool((got[0][1] == 0).all())


@gpu
@pytest.mark.gpu
def test_cuda_graph_capture_gpu() -> None:
    """Captured once, replayed on new q / indices / sink values in the same buffers: matches the reference."""
    q, caches, lists, sink = _v4_inputs(True, "random", 77)
    scale = 512**-0.5
    qd, cd, ld = q.cuda(), [c.cuda() for c in caches], [i.cuda() for i in lists]
    sd = sink.cuda()
    out = torch.empty_like(qd)
    lse = torch.empty(qd.shape[:2], device="cuda")
    kw = dict(extra_kv=cd[1], extra_indices=ld[1], out=out, lse_out=lse)
    sparse_attn_triton(qd, cd[0], ld[0], sd, scale, **kw)  # warm-up: compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_attn_triton(qd, cd[0], ld[0], sd, scale, **kw)
    g = torch.Generator().manual_seed(78)  # new values, same shapes, into the captured buffers
    q2 = torch.randn(q.shape, generator=g).bfloat16()
    sink2 = 14.0 + torch.randn(sink.shape, generator=g)
    lists2 = [i.roll(1, dims=0) for i in lists]  # other tokens' rows: only slots without NaN are named
    qd.copy_(q2.cuda())
    sd.copy_(sink2.cuda())
    for dst, src in zip(ld, lists2):
        dst.copy_(src.cuda())
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = dense_oracle(q2, caches, lists2, sink2, scale, torch.bfloat16)
    bf16_p = 2 * 2.0**-9 * _weight_abs(q2, caches, lists2, sink2, scale)
    _assert_close_to((out, lse), _reference(qd, cd, ld, sd, scale), 2 * want[2] + bf16_p, 2 * want[3])


@gpu
@pytest.mark.gpu
def test_fp32_inputs_gpu() -> None:
    """fp32 q and caches: IEEE fp32 dot operands (`default_config(fp32_gpu=True)`), the fp32 bound applies."""
    q, caches, lists, sink = _case(3, 16, 512, 40, 7, "random", torch.float32, 31)
    cuda = [x.cuda() for x in (q, *caches, *lists)]
    got = _run(cuda[0], cuda[1:3], cuda[3:], sink.cuda(), 512**-0.5)
    want = dense_oracle(q, caches, lists, sink, 512**-0.5, torch.float32)
    _assert_close_to(got, _reference(cuda[0], cuda[1:3], cuda[3:], sink.cuda(), 512**-0.5), 2 * want[2], 2 * want[3])
