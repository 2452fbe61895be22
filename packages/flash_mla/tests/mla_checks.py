"""Test helpers for flash_mla: an independent float64 dense oracle with derived error bounds, and input builders.

The oracle never gathers: it builds a boolean mask [t, n] from the index lists and runs dense attention with
the sink as one extra logit column, all in float64.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
from collections.abc import Callable

import torch

U32 = 2.0**-24  # fp32 unit roundoff
UNIT_ROUNDOFF = {torch.float32: U32, torch.bfloat16: 2.0**-8}


def index_mask(idx: torch.Tensor, n: int) -> torch.Tensor:
    """bool [t, n]: True where slot j appears among row t's valid (0 <= i < n) indices."""
    t = idx.shape[0]
    mask = torch.zeros(t, n + 1, dtype=torch.bool)
    ok = (idx >= 0) & (idx < n)
    mask.scatter_(1, torch.where(ok, idx.long(), n), True)  # invalid ones land in the dropped column n
    return mask[:, :n]


def dense_oracle(
    q: torch.Tensor,
    caches: list[torch.Tensor],
    indices: list[torch.Tensor],
    sink: torch.Tensor | None,
    scale: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 sink attention of q [t, h, d] over the slots named by each (cache [n_i, d], indices [t, k_i]).

    Caches must already be dequantised (any float dtype; NaN allowed in slots no index names).
    Returns (out [t, h, d], lse [t, h], out_tol [t, h, 1], lse_tol [t, h]) where the tolerances bound the error of
    an fp32 computation: logit error Ez <= (d + 2) u |scale| max_j |q_h| . |kv_j|, weights off by <= 2 Ez + O(K u),
    so |out - ref| <= (4 Ez + (K + 8) u) * sum_j p_j |kv_j| plus the final rounding to out_dtype.
    """
    qd = q.double()
    d = q.shape[-1]
    kvs = [c.double().reshape(-1, d) for c in caches]
    mask = torch.cat([index_mask(i, kv.shape[0]) for i, kv in zip(indices, kvs)], dim=1)
    kv = torch.cat(kvs)
    kv = torch.where(mask.any(0)[:, None], kv, 0.0)  # slots nobody names (possibly NaN) are not read
    z = torch.einsum("thd,nd->thn", qd, kv) * scale
    z = z.masked_fill(~mask[:, None, :], float("-inf"))
    if sink is not None:
        z = torch.cat([z, sink.double()[None, :, None].expand(z.shape[0], -1, 1)], dim=-1)
    lse = torch.logsumexp(z, dim=-1)
    p = torch.exp(z - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])[..., : kv.shape[0]]
    out = torch.einsum("thn,nd->thd", p, kv)
    width = sum(i.shape[1] for i in indices)
    ez = (d + 2) * U32 * abs(scale) * torch.einsum("thd,nd->thn", qd.abs(), kv.abs())
    ez = (
        ez.masked_fill(~mask[:, None, :], 0.0).amax(-1, keepdim=True)
        if kv.shape[0]
        else torch.zeros_like(lse)[..., None]
    )
    weight_abs = torch.einsum("thn,nd->thd", p, kv.abs()).amax(-1, keepdim=True)
    out_tol = (4 * ez + (width + 8) * U32) * weight_abs + UNIT_ROUNDOFF[out_dtype] * out.abs().amax(-1, keepdim=True)
    lse_tol = 2 * ez[..., 0] + (width + 8) * U32 + U32 * lse.abs().nan_to_num(posinf=0.0, neginf=0.0)
    return out, lse, out_tol, lse_tol


def assert_attention_close(
    out: torch.Tensor, lse: torch.Tensor, want: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
) -> None:
    """out / lse within the oracle's bounds; -inf lse exactly where the oracle's is -inf."""
    ref_out, ref_lse, out_tol, lse_tol = want
    assert torch.isfinite(out).all(), "output holds NaN/inf"
    err = (out.double() - ref_out).abs()
    assert bool((err <= out_tol).all()), f"out error {float((err - out_tol).max()):.3e} over the bound"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "lse -inf pattern differs"
    fin = torch.isfinite(ref_lse)
    lerr = (lse.double() - ref_lse).abs()[fin]
    assert bool((lerr <= lse_tol[fin]).all()), "lse over the bound"


def ragged_indices(
    t: int, width: int, usable: torch.Tensor, g: torch.Generator, counts: list[int] | None = None
) -> torch.Tensor:
    """int32 [t, width]: row r holds counts[r] distinct slots from `usable` at random positions, -1 elsewhere."""
    rows = []
    for r in range(t):
        c = counts[r] if counts is not None else int(torch.randint(0, width + 1, (1,), generator=g))
        c = min(c, usable.numel())
        picks = usable[torch.randperm(usable.numel(), generator=g)[:c]]
        row = torch.full((width,), -1, dtype=torch.int32)
        row[torch.randperm(width, generator=g)[:c]] = picks.to(torch.int32)
        rows.append(row)
    return torch.stack(rows)


def poison_unused(cache: torch.Tensor, idx_lists: list[torch.Tensor]) -> torch.Tensor:
    """Copy of a float cache with NaN in every slot no index names (must never reach an output)."""
    flat = cache.reshape(-1, cache.shape[-1]).clone()
    used = torch.zeros(flat.shape[0], dtype=torch.bool)
    for idx in idx_lists:
        used |= index_mask(idx.reshape(-1, idx.shape[-1]), flat.shape[0]).any(0)
    flat[~used] = float("nan")
    return flat.reshape(cache.shape)


# ---------------------------------------------------------------- shared by the CUDA kernels' tests


def nvcc_sm90a(src: pathlib.Path, obj: pathlib.Path) -> tuple[str, list[tuple[str, str, str]], list[int]]:
    """Compile one .cu for sm_90a with ptxas -v (nvcc 13 on PATH): asserts it builds, prints the log, returns (log,
    [(stack, spill stores, spill loads) bytes per kernel], [registers per kernel])."""
    proc = subprocess.run(
        ["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c", str(src),
         "-o", str(obj)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    props = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", out)
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", out)]
    print(out)
    return out, props, regs


def assert_empty_token(got: tuple[torch.Tensor, torch.Tensor], sink: torch.Tensor | None, row: int = 1) -> None:
    """Token `row` has no valid index: its output is exactly 0 and its lse exactly the sink (-inf without one: not
    checked then)."""
    assert bool((got[0][row] == 0).all()), f"token {row} max |out| {float(got[0][row].abs().max())}"
    if sink is not None:
        assert torch.equal(got[1][row].cpu(), sink), (got[1][row][:4], sink[:4])


def strided_io(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPU buffers around q [t, h, 512]: (q copied into a zeroed bf16 [t, h, 520], a NaN bf16 [t, h, 520] for out, a
    NaN fp32 [t, h, 2] for lse); pass `[..., :512]` / `[..., 0]` views, then `assert_pad_untouched`."""
    t, h, d = q.shape
    qd = torch.zeros(t, h, d + 8, dtype=torch.bfloat16, device="cuda")
    qd[..., :d] = q.cuda()
    ob = torch.full((t, h, d + 8), float("nan"), dtype=torch.bfloat16, device="cuda")
    lb = torch.full((t, h, 2), float("nan"), device="cuda")
    return qd, ob, lb


def assert_pad_untouched(ob: torch.Tensor, lb: torch.Tensor, d: int = 512) -> None:
    """Nothing outside the [..., :d] out view and the [..., 0] lse view of `strided_io`'s buffers was written."""
    assert bool(torch.isnan(ob[..., d:].float()).all()) and bool(torch.isnan(lb[..., 1]).all())


def check_graph_replay(
    launch: Callable[..., object], fp8: bool, seed: int, replay_seeds: list[int], scale: float
) -> None:
    """CUDA-graph check (GPU) on b = 2, s_q = 2 V4 inputs (`_v4_inputs(False, "random", seed)`): capture
    `launch(q, kv, idx, sink, out, lse)` once on CUDA buffers, then per replay seed s (i-th) write new q (seeded s) and
    the indices rolled by i + 1 into the same buffers, NaN-fill out, replay and check against the reference."""
    from test_mla_split import _check, _fp8  # test modules import this one: imported at call time
    from test_mla_triton import _v4_inputs

    q, caches, lists, sink = _v4_inputs(False, "random", seed)
    used = (_fp8(caches[0]) if fp8 else caches[0]).cuda()
    qd, ld, sd = q[:4].cuda(), lists[0][:4].cuda(), sink.cuda()
    out = torch.empty_like(qd)
    lse = torch.empty(4, 64, device="cuda")
    launch(qd, used, ld, sd, out, lse)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(qd, used, ld, sd, out, lse)
    for rep, s in enumerate(replay_seeds):
        q2 = torch.randn(4, 64, 512, generator=torch.Generator().manual_seed(s)).bfloat16()
        l2 = lists[0].roll(1 + rep, dims=0)[:4]
        qd.copy_(q2.cuda())
        ld.copy_(l2.cuda())
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check((out.cpu(), lse.cpu()), q2, caches[:1], [l2], sink, scale, (fp8,), gpu_p=True)
