"""deep_ep benchmark (issue 7): normal-mode dispatch / combine over NVLink, fast path vs the NCCL reference.

    python packages/deep_ep/benchmarks/bench_deep_ep.py --out RESULT.json    # 2 GPUs: starts its own 2 ranks
    torchrun --nproc-per-node 2 packages/deep_ep/benchmarks/bench_deep_ep.py --out RESULT.json   # the same
    python packages/deep_ep/benchmarks/bench_deep_ep.py --smoke              # 2 gloo ranks on CPU, tiny shapes
    python packages/deep_ep/benchmarks/bench_deep_ep.py --table RESULT.json  # the README's markdown table

V4-Flash shapes: 4096 tokens per rank, hidden 4096, top-6 of 256 experts (uniform random routing). Records,
one per (op, impl): median / p10 / p90 us (CUDA events, L2 flushed, the slowest rank's median), GB/s of the
bytes that cross NVLink (`crossing_bytes_per_rank`, the mean over ranks of rows sent to OTHER ranks x bytes
per row: in dispatch x (+ FP8 scales) + the row's metadata (local top-k ids int64, weights fp32, token index
int64: 12 k + 8 bytes); in cached dispatch x only; in combine the bf16 rows returned; the bare all_to_all
rows count x only, which is all they move; the exchanged count rows, a few KB, are not counted), % of the 393
GB/s peer copy, and the speed-up vs the NCCL reference path (`reference.py`: layout + all_to_all_single,
what the Buffer ran before) and vs a bare `all_to_all_single` of the same payload (no layout, no packing)
timed in the same run. `matches_reference` says whether the fast path's outputs were bit-identical to the
reference's on these inputs. Impls: `fast-triton` (the default, synced: one host read of the counts),
`fast-nosync` (`num_worst_tokens` = t * R: no host sync, counts on the GPU; eager calls) and
`fast-nosync-graph` (the same calls replayed from a CUDA graph: GPU time only), `fast-overlap` /
`fast-overlap-graph` (the overlapped variant, `overlap=True`: the no-sync default since session 5),
`fast-overlap2` / `fast-overlap2-graph` (the same with DEEPINFER_DEEP_EP_OVERLAP_ORDER=mixed: the dispatch
launch's programs reordered, session 5), `fast-overlapc-graph` / `fast-overlapc4-graph` (the overlapped
combine with DEEPINFER_DEEP_EP_OVERLAP_COMBINE=wide / wide4: 2x / 4x the tokens per reduce program, session 5,
run last under a hard timeout; set beside `fast-overlap-graph`), `fast-torch` (fallback movers), `nccl-reference`,
`nccl-a2a-only`. Session 6 (opt-in variants, each under its own timeout, set beside the defaults of the same run):
`fast-overlape` / `fast-overlape-graph` (the mixed order with DEEPINFER_DEEP_EP_OVERLAP_DISPATCH=early: the count
column flagged before the rest of the row), `fast-overlapf` / `fast-overlapf-graph` (=fused: early + the layout
scan inside the dispatch launch), both beside `fast-overlap2-graph` (the default dispatch), and in the
`overlapc` case `fast-overlapcb-graph` (the default "base" combine again, same buffer: the noise floor),
`fast-overlapcf-graph` ("fold": the epoch bump folded into the one combine launch), `fast-overlapcwf-graph`
("wide_fold"), `fast-overlapcs2-graph` ("send2": 2x the send programs), `fast-overlapcwfs2-graph`
("wide_fold_send2"); `dispatch layout scan` / `fast-overlap-layout-graph` (the layout launch alone); case `diag`
(last): `dispatch bf16 diag` / `fast-overlap2-{no_self,no_copyout,push_only}-graph`, the default dispatch with
roles doing nothing (WRONG results, timing only). `--cases` runs a subset (e.g. `--cases nosync,reference,overlap`).
The JSON (rank 0) is written after every case, so a partial run leaves a file; each rank exits after
DEADLINE_S (170 s).
Low-latency mode at 1 / 32 / 128 tokens per rank: dispatch bf16 / FP8, combine, and dispatch (FP8) +
combine, through the fast path (`fast-ll`: eager calls; `fast-ll-graph`: the pair replayed from a CUDA graph,
GPU time only, how decode runs it) and the NCCL reference (`reference_ll`); GB/s counts the (token, expert)
rows sent to other ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import socket
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

_SRC = Path(__file__).resolve().parent.parent / "src"
if str(_SRC) not in sys.path:  # this checkout's package before any installed copy
    sys.path.insert(0, str(_SRC))

if "--smoke" in sys.argv:  # before triton is imported: the interpreter is chosen at @triton.jit time
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("DEEPINFER_DEEP_EP_BACKEND", "triton")
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)  # NVLink multicast must stay off on the benchmark machine

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from deepinfer.deep_ep import Buffer  # noqa: E402
from deepinfer.deep_ep import reference as ref  # noqa: E402
from deepinfer.deep_ep._comm import Comm  # noqa: E402
from kernelkit import H200_CEILINGS, bench_cuda, gbps, pct_of, write_results_json  # noqa: E402

DEADLINE_S = 170.0  # a rank still running then exits (a hung collective must not eat the GPU session)
FULL = {"tokens": 4096, "hidden": 4096, "experts": 256, "topk": 6, "ll_tokens": (1, 32, 128)}
SMOKE = {"tokens": 48, "hidden": 256, "experts": 16, "topk": 4, "ll_tokens": (4,)}
CEILING = H200_CEILINGS["nvlink_peer_copy_gbps"]
CASES = ("ll", "fast", "nosync", "reference", "overlap", "torch", "overlap2", "overlape", "overlapc", "diag")
CASE_TIMEOUT_S = 60.0  # "overlape" / "overlapc" (last, opt-in): a rank still in one then saves and exits
# the combine configs of the "overlapc" case (DEEPINFER_DEEP_EP_OVERLAP_COMBINE) -> impl name of their rows
COMBINE_ROWS = {
    "wide": "fast-overlapc",
    "wide4": "fast-overlapc4",
    "base": "fast-overlapcb",
    "fold": "fast-overlapcf",
    "wide_fold": "fast-overlapcwf",
    "send2": "fast-overlapcs2",
    "wide_fold_send2": "fast-overlapcwfs2",
}
CASES_ENV = "DEEPINFER_EP_BENCH_CASES"  # how --cases reaches the rank processes


def log(msg: str) -> None:
    print(msg, flush=True)


class Run:
    """One rank's state: group, device, inputs, and the records rank 0 writes."""

    def __init__(self, smoke: bool, out: str | None, warmup: int, rep: int) -> None:
        self.cfg, self.smoke, self.out, self.warmup, self.rep = (SMOKE if smoke else FULL), smoke, out, warmup, rep
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.group = dist.group.WORLD
        self.device = torch.device("cpu") if smoke else torch.device("cuda", torch.cuda.current_device())
        self.records: list[dict] = []
        self.comm = Comm(self.group)
        self.inputs()

    def inputs(self) -> None:
        c, g = self.cfg, torch.Generator().manual_seed(1234 + self.rank)
        t, e, k, h = c["tokens"], c["experts"], c["topk"], c["hidden"]
        self.idx = torch.rand(t, e, generator=g).argsort(dim=1)[:, :k].to(self.device)
        self.w = (torch.rand(t, k, generator=g) + 0.1).to(self.device)
        self.x = torch.randn(t, h, generator=g).bfloat16().to(self.device)
        sf = torch.exp2(torch.randint(-3, 4, (t, h // 128), generator=g).float()).to(self.device)
        self.x8 = ((self.x.float() / sf.repeat_interleave(128, dim=1)).to(torch.float8_e4m3fn), sf)
        per_rank, _, _ = ref.dispatch_layout(self.idx, e, self.world)
        self.sent = per_rank.tolist()  # rows to each rank
        self.cross_rows = sum(n for r, n in enumerate(self.sent) if r != self.rank)

    def time(self, fn, mode: str = "events") -> dict:
        """Median etc. of fn on every rank; the slowest rank's median (the op ends when every rank is done).

        mode "events" (eager calls, host launch cost included; NCCL collectives cannot be captured) or
        "graph" (replays of a captured CUDA graph: the LL fast path, as decode runs it)."""
        if mode == "graph":
            stats = _graph_stats(fn, self.warmup, self.rep)
        else:
            stats = bench_cuda(fn, warmup=self.warmup, rep=self.rep, mode=mode)
        everyone = [None] * self.world
        dist.all_gather_object(everyone, stats["median_us"], group=self.group)
        return {**stats, "median_us": max(everyone), "rank_median_us": everyone}

    def host_us(self, fn, reps: int = 5) -> float:
        """Median wall time of the Python call alone (the GPU may still be busy after it returns).

        Close to median_us: the call is bound by its host-side launches and synchronisation, not by NVLink.
        """
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
        return sorted(times)[reps // 2]

    def cross_bytes(self, row_bytes: int, combine: bool = False) -> float:
        """Mean over ranks of the payload bytes one rank sends to other ranks."""
        rows = self.recv_cross_rows if combine else self.cross_rows
        everyone = [None] * self.world
        dist.all_gather_object(everyone, rows * row_bytes, group=self.group)
        return sum(everyone) / self.world

    def header(self, op: str, impl: str, **extra) -> dict:
        """A new record: what ran and on which shapes (extra: more fields, or overrides)."""
        return {"op": op, "impl": impl, "ranks": self.world, "tokens_per_rank": self.cfg["tokens"],
                "hidden": self.cfg["hidden"], "topk": self.cfg["topk"], "experts": self.cfg["experts"],
                "error": None, **extra}  # fmt: skip

    def record(self, op: str, impl: str, nbytes: float | None, fn, **extra) -> dict:
        rec = self.header(op, impl, **extra)
        mode = rec.pop("timer_mode", "events")
        with _case(self, rec):
            st = self.time(fn, mode)
            rec.update(median_us=st["median_us"], p10_us=st["p10"], p90_us=st["p90"], timer=st["timer"])
            rec["rank_median_us"] = st["rank_median_us"]
            if mode == "events":
                rec["host_us"] = self.host_us(fn, 1 if self.smoke else 5)
            if nbytes is not None:
                rec["crossing_bytes_per_rank"] = nbytes
                rec["gbps"] = gbps(nbytes, st["median_us"])
                rec["pct_of_ceiling"] = pct_of(rec["gbps"], CEILING)
        us = rec.get("median_us")
        if self.rank == 0:
            log(f"[{time.strftime('%X')}] {op:<26} {impl:<14} " + (f"{us:9.1f} us" if us else rec["error"] or ""))
        return rec

    def save(self) -> None:
        if self.rank != 0 or not self.out:
            return
        _speedups(self.records)
        meta = {"package": "deep_ep", "issue": 7, "config": {k: v for k, v in self.cfg.items()},
                "smoke": self.smoke, "ceiling": "nvlink_peer_copy_gbps", "ceiling_gbps": CEILING,
                "baselines": ["nccl-reference", "nccl-a2a-only"]}  # fmt: skip
        write_results_json(self.out, self.records, meta)


@contextlib.contextmanager
def _case(run: Run, rec: dict, cleanup=None):
    """Fill rec in the block: an exception there becomes rec["error"] (one failing case must not lose the
    run); then cleanup() if given, and rec joins the run's records, saved at once (a partial run keeps it)."""
    try:
        yield rec
    except Exception as exc:  # noqa: BLE001
        rec["error"] = f"{type(exc).__name__}: {exc}"
        log(traceback.format_exc())
    finally:
        if cleanup is not None:
            cleanup()
    run.records.append(rec)
    run.save()


def _compare(name: str, check) -> bool | None:
    """check() (a comparison with the reference, on every rank), or None when it raised (logged)."""
    try:
        return check()
    except Exception as exc:  # noqa: BLE001
        log(f"{name}: reference comparison failed: {type(exc).__name__}: {exc}")
        log(traceback.format_exc())
        return None


def _isolated_calls(run: Run, fn, reps: int, sleep_cycles: int = 0, after=None) -> None:
    """reps calls of fn, each isolated: device synced and ranks aligned before it (then, with sleep_cycles,
    the GPU sleeps while the host queues the call), device synced after it, then after() if given."""
    for _ in range(reps):
        _sync(run)
        dist.barrier(group=run.group)
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        fn()
        _sync(run)
        if after is not None:
            after()


def _graph_stats(fn, warmup: int, rep: int, calls: int = 8) -> dict:
    """GPU time per call of fn replayed from CUDA graphs, as kernelkit.bench_cuda(mode="graph") measures it
    (a graph of `calls` x (L2 flush, fn) minus a graph of the flushes alone), but captured thread-locally:
    the NCCL watchdog thread may query events meanwhile, which a global-mode capture refuses. Every rank
    makes exactly the same calls (the LL kernels wait for each other), so no rank can fall out of step."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    flush = torch.empty(256 << 18, dtype=torch.int32, device="cuda")  # 256 MiB: more than the L2

    def capture(body) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(calls):
                flush.zero_()
                body()
        return graph

    work, only = capture(fn), capture(lambda: None)
    ev = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(rep)]
    for e0, e1, e2 in ev:
        e0.record()
        work.replay()
        e1.record()
        only.replay()
        e2.record()
    torch.cuda.synchronize()
    us = sorted(max(0.0, (e0.elapsed_time(e1) - e1.elapsed_time(e2)) * 1e3 / calls) for e0, e1, e2 in ev)
    pick = lambda q: us[min(len(us) - 1, int(q * len(us)))]  # noqa: E731
    return {"median_us": pick(0.5), "p10": pick(0.1), "p90": pick(0.9), "timer": "cuda_graph"}


def _speedups(records: list[dict]) -> None:
    """speedup_vs[baseline] = baseline median / this median, per op, for every record with a time."""
    for r in records:
        if r.get("median_us") is None:
            continue
        r["speedup_vs"] = {
            b["impl"]: b["median_us"] / r["median_us"]
            for b in records
            if b["op"] == r["op"] and b["impl"].startswith("nccl") and b.get("median_us") and b is not r
        }


def _matches(run: Run, buf: Buffer) -> bool:
    """Fast dispatch (bf16, FP8) and combine bit-identical to the reference on this run's inputs, every rank."""
    c, ok = run.cfg, True
    for payload in (run.x, run.x8):
        got = buf.dispatch(payload, topk_idx=run.idx, topk_weights=run.w, num_experts=c["experts"])
        want = ref.dispatch(run.comm, payload, run.idx, run.w, c["experts"], None, 1)
        pairs = [(got[0], want[0])] if not isinstance(payload, tuple) else list(zip(got[0], want[0]))
        ok &= all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in pairs)
        ok &= torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]) and got[3] == want[3]
    y = torch.randn(want[4].num_recv_tokens, c["hidden"], device=run.device).bfloat16()
    ok &= torch.equal(buf.combine(y, got[4]), ref.combine(run.comm, y, want[4], None)[0])
    everyone = [None] * run.world
    dist.all_gather_object(everyone, bool(ok), group=run.group)
    return all(everyone)


def _meta_bytes(run: Run) -> int:
    """Metadata bytes that travel with each dispatched row: local top-k ids (int64), weights (fp32), token index."""
    return 12 * run.cfg["topk"] + 8


def _matches_worst(run: Run, buf: Buffer, worst: int, overlap: bool = False) -> bool:
    """No-sync dispatch (bf16, FP8): the received rows equal the reference's bit for bit; combine too; every rank.
    overlap: through the overlapped variant (and it must have run)."""
    c, ok = run.cfg, True
    args = {"topk_idx": run.idx, "topk_weights": run.w, "num_experts": c["experts"], "num_worst_tokens": worst,
            "overlap": overlap}  # fmt: skip
    for payload in (run.x, run.x8):
        got = buf.dispatch(payload, **args)
        want = ref.dispatch(run.comm, payload, run.idx, run.w, c["experts"], None, 1)
        n = want[1].shape[0]
        pairs = [(got[0], want[0])] if not isinstance(payload, tuple) else list(zip(got[0], want[0]))
        ok &= all(torch.equal(a[:n].view(torch.uint8), b.view(torch.uint8)) for a, b in pairs)
        ok &= torch.equal(got[1][:n], want[1]) and torch.equal(got[2][:n], want[2]) and got[3].tolist() == want[3]
        ok &= got[4].device_counts is not None and got[4].overlap == overlap  # the no-sync path (variant) ran
    y = torch.randn(worst, c["hidden"], device=run.device).bfloat16()
    ok &= torch.equal(buf.combine(y, got[4]), ref.combine(run.comm, y[:n], want[4], None)[0])
    everyone = [None] * run.world
    dist.all_gather_object(everyone, bool(ok), group=run.group)
    return all(everyone)


def bench_nosync(run: Run) -> None:
    """dispatch(num_worst_tokens=t * R): no host sync (counts stay on the GPU), eager (CUDA events: the host's
    launch cost included) and replayed from a CUDA graph (GPU time, possible only without the host sync)."""
    os.environ["DEEPINFER_DEEP_EP_IMPL"] = "triton"
    c = run.cfg
    worst = c["tokens"] * run.world  # the bound DeepEP users pass: every token of every rank
    buf = Buffer(run.group)
    # (not in the smoke run: the interpreter is slow, and the CPU tests compare the same)
    matches = None if run.smoke else _compare("fast-nosync", lambda: _matches_worst(run, buf, worst))
    used = f"{type(buf._fast).__name__}/{buf._fast.impl}/nosync" if buf._fast else "reference (fast path unavailable)"
    kw = {"matches_reference": matches, "path": used, "num_worst_tokens": worst}
    # overlap=False: the session-4 no-sync kernels (the overlapped default is `bench_overlap`)
    args = {"topk_idx": run.idx, "topk_weights": run.w, "num_experts": c["experts"], "num_worst_tokens": worst,
            "overlap": False}  # fmt: skip
    h, meta = c["hidden"], _meta_bytes(run)
    recv_x, _, _, _, handle = buf.dispatch(run.x, **args)
    ops = {
        "dispatch bf16": (lambda: buf.dispatch(run.x, **args), run.cross_bytes(2 * h + meta)),
        "dispatch fp8": (lambda: buf.dispatch(run.x8, **args), run.cross_bytes(h + h // 32 + meta)),
        "cached dispatch bf16": (lambda: buf.dispatch(run.x, handle), run.cross_bytes(2 * h)),
        "combine bf16": (lambda: buf.combine(recv_x, handle), run.cross_bytes(2 * h, combine=True)),
    }
    for op, (fn, nbytes) in ops.items():
        if run.smoke and op not in ("dispatch bf16", "combine bf16"):  # the interpreter is slow
            continue
        run.record(op, "fast-nosync", nbytes, fn, **kw)
    if buf._fast and buf._fast.impl == "triton" and not run.smoke:  # no-sync ran; the interpreter has no graphs
        for op, (fn, nbytes) in ops.items():
            run.record(op, "fast-nosync-graph", nbytes, fn, timer_mode="graph", **kw)
        for op in ("dispatch bf16", "combine bf16"):
            bench_stages(run, ops[op][0], op, "fast-nosync", **kw)
    buf.destroy()


@contextlib.contextmanager
def _watchdog(run: Run, name: str, seconds: float):
    """A case that must not stall the GPU session (a wait spinning to its limit): past `seconds` this rank
    saves the JSON and exits."""
    timer = threading.Timer(seconds, lambda: (log(f"{name}: over {seconds} s, exiting"), run.save(), os._exit(3)))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def bench_overlap_dispatch_configs(run: Run) -> None:
    """The overlapped dispatch with the mixed order (the default) and each session-6 config of
    DEEPINFER_DEEP_EP_OVERLAP_DISPATCH (opt-in): "early" (rows `fast-overlape`, `fast-overlape-graph`, GPU stages)
    and "fused" (`fast-overlapf`, `fast-overlapf-graph`, GPU stages); beside `fast-overlap2-graph` (the default)."""
    from deepinfer.deep_ep import _overlap

    if not run.smoke:  # the interpreter has no graphs
        bench_layout_scan(run)
    try:
        with _watchdog(run, "overlape", 2 * CASE_TIMEOUT_S):
            for config, impl in (("early", "fast-overlape"), ("fused", "fast-overlapf")):
                if run.smoke and config != "fused":  # the interpreter is slow; fused takes early's paths too
                    continue
                os.environ[_overlap.DISPATCH_ENV] = config
                bench_overlap(run, "mixed", impl=impl)
    finally:
        os.environ.pop(_overlap.DISPATCH_ENV, None)


def bench_dispatch_diag(run: Run) -> None:
    """Diagnostics (WRONG results, timing only): the session-5 dispatch (mixed order, base config pinned), own-block
    copy and / or the copy-out programs doing nothing (DEEPINFER_DEEP_EP_OVERLAP_DIAG, `overlap.DIAGS`), dispatch
    bf16 replayed from a CUDA graph: rows `dispatch bf16 diag` with impl `fast-overlap2-<diag>-graph`, to set
    beside `fast-overlap2-graph` (all roles): what the own-block copy and the copy-out add to the push."""
    from deepinfer.deep_ep import _overlap

    os.environ["DEEPINFER_DEEP_EP_IMPL"] = "triton"
    c = run.cfg
    worst = c["tokens"] * run.world
    buf = Buffer(run.group)
    args = {"topk_idx": run.idx, "topk_weights": run.w, "num_experts": c["experts"], "num_worst_tokens": worst,
            "overlap": True}  # fmt: skip
    try:
        with _watchdog(run, "diag", CASE_TIMEOUT_S):
            for diag in ("no_self", "no_copyout", "push_only"):
                if run.smoke and diag != "push_only":  # the interpreter is slow; push_only skips both roles
                    continue
                os.environ[_overlap.DIAG_ENV] = diag
                os.environ[_overlap.DISPATCH_ENV] = "base"  # what the diag roles were written against
                kw = {"matches_reference": None, "path": f"overlap/mixed/diag-{diag} (wrong results: timing only)"}
                fn = lambda: buf.dispatch(run.x, **args)  # noqa: E731
                try:
                    handle = fn()[4]  # grows the buffers outside the graph
                except Exception as exc:  # noqa: BLE001 - recorded; the next diag still runs
                    log(traceback.format_exc())
                    run.records.append(run.header("dispatch bf16 diag", f"fast-overlap2-{diag}", error=repr(exc), **kw))
                    continue
                if run.smoke or not handle.overlap:  # the interpreter has no graphs
                    run.record("dispatch bf16 diag", f"fast-overlap2-{diag}", None, fn, **kw)
                    continue
                run.record("dispatch bf16 diag", f"fast-overlap2-{diag}-graph", None, fn, timer_mode="graph", **kw)
    finally:
        os.environ.pop(_overlap.DIAG_ENV, None)
        os.environ.pop(_overlap.DISPATCH_ENV, None)
    buf.destroy()


def bench_layout_scan(run: Run) -> None:
    """Row `dispatch layout scan` / `fast-overlap-layout-graph`: the overlapped dispatch's layout launch alone
    (`overlap.layout` on this run's top-k ids, its own scratch and epoch counter), replayed from a CUDA graph: what
    the "fused" dispatch config can save at most, with the kernel boundary it removes."""
    from deepinfer.deep_ep.backends.triton import overlap as ov

    c, dev = run.cfg, run.device
    t, e = c["tokens"], c["experts"]
    idx = run.idx.to(torch.int64).contiguous()
    nb = ov.num_blocks(t)
    scratch = {n: torch.empty(m, dtype=torch.int64, device=dev) for n, m in
               {"bcnt": run.world * nb, "bstat": nb * (2 + run.world), "bexp": nb * e}.items()}  # fmt: skip
    lpos = torch.empty((run.world, t), dtype=torch.int64, device=dev)
    lay = torch.empty((t, run.world), dtype=torch.bool, device=dev)
    ctr = torch.zeros(4, dtype=torch.int64, device=dev)
    fn = lambda: ov.layout(idx, None, lay, lpos, scratch, ctr, e)  # noqa: E731
    run.record("dispatch layout scan", "fast-overlap-layout-graph", None, fn, timer_mode="graph")


def bench_overlap(run: Run, order: str = "serial", impl: str | None = None) -> None:
    """The overlapped no-sync variant (the no-sync default since session 5), dispatch(num_worst_tokens=t * R,
    overlap=True) and its combine: rows `fast-overlap` (eager) and `fast-overlap-graph` (CUDA-graph replays) to
    set beside fast-nosync(-graph), and its GPU stages (dispatch: layout, overlap; combine: overlap). Cached
    dispatch is the no-sync one (not timed). order "mixed" (DEEPINFER_DEEP_EP_OVERLAP_ORDER, the dispatch
    launch's program order): rows `fast-overlap2`, `fast-overlap2-graph` (combine is the same kernel). Both pin
    the dispatch config "base" (DEEPINFER_DEEP_EP_OVERLAP_DISPATCH; the default is "early" since session 6, timed
    in `fast-overlape`), so the rows keep measuring what they measured before."""
    from deepinfer.deep_ep import _overlap

    os.environ["DEEPINFER_DEEP_EP_IMPL"] = "triton"
    os.environ[_overlap.ORDER_ENV] = order
    os.environ[_overlap.DISPATCH_ENV] = "base"
    try:
        _bench_overlap(run, impl or ("fast-overlap" if order == "serial" else "fast-overlap2"))
    finally:
        os.environ.pop(_overlap.ORDER_ENV, None)
        os.environ.pop(_overlap.DISPATCH_ENV, None)


def _bench_overlap(run: Run, impl: str) -> None:
    c = run.cfg
    worst = c["tokens"] * run.world
    buf = Buffer(run.group)
    t0 = time.time()
    matches = None if run.smoke else _compare(impl, lambda: _matches_worst(run, buf, worst, overlap=True))
    args = {"topk_idx": run.idx, "topk_weights": run.w, "num_experts": c["experts"], "num_worst_tokens": worst,
            "overlap": True}  # fmt: skip
    h, meta = c["hidden"], _meta_bytes(run)
    recv_x, _, _, _, handle = buf.dispatch(run.x, **args)
    used = "reference (fast path unavailable)"
    if buf._fast:
        used = f"{type(buf._fast).__name__}/{buf._fast.impl}/" + ("overlap" if handle.overlap else "nosync")
        used += "/mixed" if handle.overlap and impl != "fast-overlap" else ""
        used += {"fast-overlape": "/early", "fast-overlapf": "/fused"}.get(impl, "") if handle.overlap else ""
    kw = {"matches_reference": matches, "path": used, "num_worst_tokens": worst}
    if run.rank == 0:
        log(f"{impl}: compiled + checked in {time.time() - t0:.1f} s ({used})")
    ops = {
        "dispatch bf16": (lambda: buf.dispatch(run.x, **args), run.cross_bytes(2 * h + meta)),
        "dispatch fp8": (lambda: buf.dispatch(run.x8, **args), run.cross_bytes(h + h // 32 + meta)),
        "combine bf16": (lambda: buf.combine(recv_x, handle), run.cross_bytes(2 * h, combine=True)),
    }
    for op, (fn, nbytes) in ops.items():
        if run.smoke and op == "dispatch fp8":  # the interpreter is slow
            continue
        run.record(op, impl, nbytes, fn, **kw)
    if handle.overlap and not run.smoke:  # the interpreter has no graphs
        for op, (fn, nbytes) in ops.items():
            run.record(op, f"{impl}-graph", nbytes, fn, timer_mode="graph", **kw)
        for op in ("dispatch bf16", "combine bf16"):
            bench_stages(run, ops[op][0], op, impl, **kw)
        if buf._fast._overlap_state.timed_out():  # garbage rows: say so in the JSON
            log(f"{impl}: a wait gave up (timeout flag set)")
            run.records.append({"op": "overlap waits", "impl": impl, "error": "a wait timed out"})
            run.save()
    buf.destroy()


def bench_overlap_combine(run: Run) -> None:
    """The overlapped combine with its configs (DEEPINFER_DEEP_EP_OVERLAP_COMBINE, `overlap.COMBINE_CONFIGS`): rows
    `<COMBINE_ROWS[config]>-graph` (wide, wide4; session 6: base again, fold, wide_fold, send2, wide_fold_send2),
    combine bf16 replayed from a CUDA graph, each checked bit for bit against the reference first, and its GPU
    stages; to set beside `fast-overlap-graph` / `fast-overlap2-graph` ("base", the default) of the same run and
    `fast-overlapcb-graph` (base in this case's buffer). Last in the run, under 2 x CASE_TIMEOUT_S: a hang
    (a wait spinning to its limit) saves the JSON and exits this rank instead of stalling the GPU session."""
    from deepinfer.deep_ep import _overlap

    os.environ["DEEPINFER_DEEP_EP_IMPL"] = "triton"
    watchdog = threading.Timer(2 * CASE_TIMEOUT_S, lambda: (log(f"overlapc: over {2 * CASE_TIMEOUT_S} s, exiting"),
                                                        run.save(), os._exit(3)))  # fmt: skip
    watchdog.daemon = True
    watchdog.start()
    c = run.cfg
    worst = c["tokens"] * run.world
    buf = Buffer(run.group)
    args = {"topk_idx": run.idx, "topk_weights": run.w, "num_experts": c["experts"], "num_worst_tokens": worst,
            "overlap": True}  # fmt: skip
    try:
        for config, impl in COMBINE_ROWS.items():
            if run.smoke and config not in ("wide", "wide_fold_send2"):  # the interpreter is slow
                continue
            os.environ[_overlap.COMBINE_ENV] = config
            t0 = time.time()
            matches = None if run.smoke else _compare(impl, lambda: _matches_worst(run, buf, worst, overlap=True))
            recv_x, _, _, _, handle = buf.dispatch(run.x, **args)
            used = "overlap/combine-" + config if buf._fast and handle.overlap else "not the overlapped variant"
            kw = {"matches_reference": matches, "path": used, "num_worst_tokens": worst}
            if run.rank == 0:
                log(f"{impl}: compiled + checked in {time.time() - t0:.1f} s ({used})")
            fn = lambda recv_x=recv_x, handle=handle: buf.combine(recv_x, handle)  # noqa: E731
            # (the rows an earlier case counted; None when --cases skipped those cases)
            nbytes = run.cross_bytes(2 * c["hidden"], combine=True) if hasattr(run, "recv_cross_rows") else None
            if run.smoke or not handle.overlap:  # the interpreter has no graphs
                run.record("combine bf16", impl, nbytes, fn, **kw)
                continue
            run.record("combine bf16", f"{impl}-graph", nbytes, fn, timer_mode="graph", **kw)
            bench_stages(run, fn, "combine bf16", impl, **kw)
            if buf._fast._overlap_state.timed_out():
                log(f"{impl}: a wait gave up (timeout flag set)")
                run.records.append({"op": "overlap waits", "impl": impl, "error": "a wait timed out"})
                run.save()
                break
    finally:
        os.environ.pop(_overlap.COMBINE_ENV, None)
        watchdog.cancel()
    buf.destroy()


def bench_stages(run: Run, fn, op: str, impl: str, reps: int = 7, **kw) -> None:
    """GPU time of each stage of one no-sync call (`_nosync.STAGES` events): the GPU first sleeps ~10 ms so
    that the host has queued the whole call before it starts, so the gaps between the events are GPU time,
    not launch latency. Ranks are aligned before each call; a barrier stage includes waiting for the peer.
    Stages (median us): dispatch = layout, exchange (count rows + barrier), plan, push, barrier, copy_out;
    combine = barrier0, send, barrier1, reduce (the overlapped variant: dispatch = layout, overlap; combine =
    overlap). median_us = their sum."""
    import deepinfer.deep_ep._nosync as nosync

    nosync.STAGES = []
    with _case(run, run.header(f"{op} gpu stages", impl, **kw), lambda: setattr(nosync, "STAGES", None)) as rec:
        _isolated_calls(run, fn, reps, sleep_cycles=20_000_000)  # ~10 ms of GPU cycles: the host queues the call
        per: dict[str, list[float]] = {}
        for entry in nosync.STAGES:
            for (_, a), (name, b) in zip(entry, entry[1:]):
                per.setdefault(name, []).append(a.elapsed_time(b) * 1e3)
        med = {n: statistics.median(v) for n, v in per.items()}
        rec.update(median_us=sum(med.values()), stages_us=med, timer="CUDA events between stages, GPU queued ahead")
        if run.rank == 0:
            log(f"{op} gpu stages ({impl}): " + ", ".join(f"{n} {v:.1f} us" for n, v in med.items()))


def bench_fast(run: Run, impl: str) -> None:
    """Dispatch (bf16, FP8, cached) and combine through the Buffer's fast path with one row mover."""
    os.environ["DEEPINFER_DEEP_EP_IMPL"] = impl  # read when the Buffer builds its fast path
    c, name = run.cfg, f"fast-{impl}"
    buf = Buffer(run.group)
    matches = _compare(name, lambda: _matches(run, buf))
    # "IntranodeNormal/triton" = the fused kernels ran; ".../torch" under fast-triton = their probe failed
    used = f"{type(buf._fast).__name__}/{buf._fast.impl}" if buf._fast else "reference (fast path unavailable)"
    kw = {"matches_reference": matches, "path": used}
    args = {"topk_idx": run.idx, "topk_weights": run.w, "num_experts": c["experts"]}
    h2, meta = c["hidden"] * 2, _meta_bytes(run)
    run.record("dispatch bf16", name, run.cross_bytes(h2 + meta), lambda: buf.dispatch(run.x, **args), **kw)
    run.record("dispatch fp8", name, run.cross_bytes(c["hidden"] + c["hidden"] // 32 + meta),
               lambda: buf.dispatch(run.x8, **args), **kw)  # fmt: skip
    recv_x, _, _, _, handle = buf.dispatch(run.x, **args)
    run.recv_cross_rows = handle.num_recv_tokens - handle.recv_counts[run.rank]
    run.record("cached dispatch bf16", name, run.cross_bytes(h2), lambda: buf.dispatch(run.x, handle), **kw)
    run.record("combine bf16", name, run.cross_bytes(h2, combine=True), lambda: buf.combine(recv_x, handle), **kw)
    if buf._fast:
        bench_push(run, buf, handle, name, **kw)
        if buf._fast.impl == "triton":
            for label, payload in (("bf16", run.x), ("fp8", run.x8))[: 1 if run.smoke else 2]:
                call = lambda p=payload: buf.dispatch(p, **args)  # noqa: E731
                bench_phases(run, call, f"dispatch {label}", name, reps=2 if run.smoke else 7, **kw)
    buf.destroy()


def bench_phases(run: Run, fn, op: str, impl: str, reps: int = 7, **kw) -> None:
    """Where the host time of one fused dispatch goes (isolated calls: device synced and ranks aligned
    before each). Phases (median us): queued = start -> layout and pre-sync work launched; wait = the count
    read (GPU layout + exchange + barrier + copy latency); push = counts -> peer pushes launched (the GPU
    idles meanwhile); rest = -> return; gpu_tail = return -> GPU done. median_us = start -> GPU done."""
    import deepinfer.deep_ep._fused as fused

    fused.PHASES = []
    with _case(run, run.header(f"{op} host phases", impl, **kw), lambda: setattr(fused, "PHASES", None)) as rec:
        _isolated_calls(run, fn, reps, after=lambda: fused.PHASES[-1].update(done=time.perf_counter()))
        steps = [("queued", "start", "queued"), ("wait", "queued", "synced"), ("push", "synced", "pushed"),
                 ("rest", "pushed", "returned"), ("gpu_tail", "returned", "done"),
                 ("total", "start", "done")]  # fmt: skip
        med = {n: statistics.median((e[b] - e[a]) * 1e6 for e in fused.PHASES) for n, a, b in steps}
        rec.update(median_us=med["total"], phases_us=med, timer="host perf_counter, synced calls")
        if run.rank == 0:
            log(f"{op} phases ({impl}): " + ", ".join(f"{n} {v:.0f} us" for n, v in med.items()))


def _sync(run: Run) -> None:
    if run.device.type == "cuda":
        torch.cuda.synchronize()


def bench_push(run: Run, buf: Buffer, handle, name: str, **kw) -> None:
    """The bare transfer of dispatch: x rows gathered straight into the peers' buffers, then a barrier.

    What NVLink gives the row mover, without layout, count exchange, host sync or copy-out.
    """
    from deepinfer.deep_ep._plan import Plan
    from deepinfer.deep_ep.intranode import COUNTS_BYTES, _gather, _region, _words

    fast, plan, rank = buf._fast, Plan.of(handle.count_matrix), run.rank
    words, rb = _words(run.x), run.x.shape[1] * 2
    fast.transport.ensure(COUNTS_BYTES + plan.dispatch_cap() * rb)
    moves = []
    for d in range(run.world):
        n, so = plan.matrix[rank][d], plan.send_off(rank, d)
        if d != rank and n:
            dst = _region(fast.transport.buffer(d), COUNTS_BYTES + plan.recv_off(rank, d) * rb, n, rb)
            moves.append((handle.send_token_idx[so : so + n], dst))

    def push() -> None:
        for idx, dst in moves:
            _gather(words, idx, dst, fast.impl)
        fast.transport.barrier()

    run.record("nvlink push bf16", name, run.cross_bytes(run.x.shape[1] * 2), push, **kw)


def bench_reference(run: Run) -> None:
    """The NCCL path the Buffer ran before (layout included), and a bare all_to_all_single of the payload."""
    c, comm, e = run.cfg, run.comm, run.cfg["experts"]
    h2, meta = c["hidden"] * 2, _meta_bytes(run)
    run.record("dispatch bf16", "nccl-reference", run.cross_bytes(h2 + meta),
               lambda: ref.dispatch(comm, run.x, run.idx, run.w, e, None, 1))  # fmt: skip
    run.record("dispatch fp8", "nccl-reference", run.cross_bytes(c["hidden"] + c["hidden"] // 32 + meta),
               lambda: ref.dispatch(comm, run.x8, run.idx, run.w, e, None, 1))  # fmt: skip
    recv_x, _, _, _, handle = ref.dispatch(comm, run.x, run.idx, run.w, e, None, 1)
    run.recv_cross_rows = handle.num_recv_tokens - handle.recv_counts[run.rank]
    run.record("cached dispatch bf16", "nccl-reference", run.cross_bytes(h2),
               lambda: ref.cached_dispatch(comm, run.x, handle))  # fmt: skip
    run.record("combine bf16", "nccl-reference", run.cross_bytes(h2, combine=True),
               lambda: ref.combine(comm, recv_x, handle, None))  # fmt: skip
    send = run.x[handle.send_token_idx]
    out = torch.empty((handle.num_recv_tokens, c["hidden"]), dtype=run.x.dtype, device=run.device)
    a2a = lambda: dist.all_to_all_single(out, send, handle.recv_counts, handle.send_counts)  # noqa: E731
    run.record("dispatch bf16", "nccl-a2a-only", run.cross_bytes(h2), a2a)
    back = lambda: dist.all_to_all_single(send, out, handle.send_counts, handle.recv_counts)  # noqa: E731
    run.record("combine bf16", "nccl-a2a-only", run.cross_bytes(h2, combine=True), back)


def _ll_inputs(run: Run, t: int) -> tuple:
    """The first t tokens of this rank, and random expert outputs [E_local, t * R, hidden] (bf16)."""
    c = run.cfg
    e_local = c["experts"] // run.world
    g = torch.Generator().manual_seed(99 + run.rank)
    y = torch.randn(e_local, t * run.world, c["hidden"], generator=g).bfloat16().to(run.device)
    return run.x[:t].contiguous(), run.idx[:t].contiguous(), run.w[:t].contiguous(), y


def _ll_cross_bytes(run: Run, idx: torch.Tensor, row_bytes: int) -> float:
    """Mean over ranks of the (token, expert) rows a rank sends to OTHER ranks, x row_bytes."""
    owner = idx // (run.cfg["experts"] // run.world)
    rows = int(((idx >= 0) & (owner != run.rank)).sum())
    everyone = [None] * run.world
    dist.all_gather_object(everyone, rows * row_bytes, group=run.group)
    return sum(everyone) / run.world


def _ll_matches(run: Run, buf: Buffer, t: int) -> bool:
    """Fast LL dispatch (FP8) rows / counts equal reference_ll's, combine within 1 bf16 ulp + fp32 order, all ranks."""
    from deepinfer.deep_ep import reference_ll as ref_ll

    c = run.cfg
    x, idx, w, y = _ll_inputs(run, t)
    got = buf.low_latency_dispatch(x, idx, t, c["experts"], use_fp8=True)
    want = ref_ll.low_latency_dispatch(run.comm, x, idx, t, c["experts"], True, False, False)
    count = want[1].cpu()
    ok = torch.equal(got[1].cpu(), count)
    keep = torch.arange(t * run.world)[None, :] < count[:, None]
    for a, b in zip(got[0], want[0]):
        ok &= torch.equal(a.cpu()[keep].view(torch.uint8), b.cpu()[keep].view(torch.uint8))
    out = buf.low_latency_combine(y, idx, w, got[2])[0].float().cpu()
    ref_out = ref_ll.low_latency_combine(run.comm, y, idx, w, want[2], None).float().cpu()
    mag = ref_ll.low_latency_combine(run.comm, y.float().abs(), idx, w, want[2], None).cpu()
    ok &= bool(((out - ref_out).abs() <= 2.0**-7 * mag + 2 * (c["topk"] + 1) * 2.0**-24 * mag).all())
    everyone = [None] * run.world
    dist.all_gather_object(everyone, bool(ok), group=run.group)
    return all(everyone)


def _ll_ops(run: Run, buf: Buffer, t: int) -> dict:
    """op name -> (callable, crossing bytes) for one token count: dispatch bf16 / FP8, combine, both."""
    c = run.cfg
    h, e = c["hidden"], c["experts"]
    x, idx, w, y = _ll_inputs(run, t)
    _, _, handle, _ = buf.low_latency_dispatch(x, idx, t, e, use_fp8=True)
    b_bf16, b_fp8 = _ll_cross_bytes(run, idx, 2 * h), _ll_cross_bytes(run, idx, h + h // 32)

    def both() -> None:
        _, _, hd, _ = buf.low_latency_dispatch(x, idx, t, e, use_fp8=True)
        buf.low_latency_combine(y, idx, w, hd)

    return {
        f"ll dispatch bf16 t={t}": (lambda: buf.low_latency_dispatch(x, idx, t, e, use_fp8=False), b_bf16),
        f"ll dispatch fp8 t={t}": (lambda: buf.low_latency_dispatch(x, idx, t, e, use_fp8=True), b_fp8),
        f"ll combine t={t}": (lambda: buf.low_latency_combine(y, idx, w, handle), b_bf16),
        f"ll dispatch+combine t={t}": (both, b_fp8 + b_bf16),
    }


def bench_low_latency(run: Run) -> None:
    """Low-latency dispatch / combine at decode batch sizes: the fast path (eager, and replayed from a CUDA
    graph: how decode runs it) and the NCCL reference (`reference_ll`), in the same run."""
    fast = Buffer(run.group, low_latency_mode=True)
    fast._ll_path(run.device)  # start the fast path now (a collective + probe), so `path` below is known
    nccl = Buffer(run.group)  # low_latency_mode=False: the reference
    for t in run.cfg["ll_tokens"]:
        # (not in the smoke run: the interpreter is slow, and the CPU tests compare the same)
        matches = None if run.smoke else _compare(f"ll t={t}", lambda t=t: _ll_matches(run, fast, t))
        path = f"{type(fast._ll).__name__}/quant-{fast._ll.quant}" if fast._ll else "reference (fast path unavailable)"
        kw = {"matches_reference": matches, "path": path, "tokens_per_rank": t}
        for op, (fn, nbytes) in _ll_ops(run, fast, t).items():
            if run.smoke and "+" not in op:  # the interpreter is slow: the pair covers every kernel
                continue
            run.record(op, "fast-ll", nbytes, fn, **kw)
            if op.startswith("ll dispatch+combine") and not run.smoke and fast._ll:  # NCCL: no graph
                run.record(op, "fast-ll-graph", nbytes, fn, timer_mode="graph", **kw)
                if fast._ll.quant == "triton":  # the same with the torch quantiser (8 small kernels)
                    fast._ll.quant = "torch"
                    kw_t = {**kw, "path": f"{type(fast._ll).__name__}/quant-torch"}
                    run.record(op, "fast-ll-graph-torchq", nbytes, fn, timer_mode="graph", **kw_t)
                    fast._ll.quant = "triton"
        for op, (fn, nbytes) in _ll_ops(run, nccl, t).items():
            run.record(op, "nccl-reference", nbytes, fn, tokens_per_rank=t)
    fast.destroy()


def rank_main(smoke: bool, out: str | None, warmup: int, rep: int) -> None:
    """Everything one rank runs (its process group is initialised)."""
    timer = threading.Timer(DEADLINE_S, lambda: (log(f"deadline {DEADLINE_S} s: exiting"), os._exit(3)))
    timer.daemon = True
    timer.start()
    run = Run(smoke, out, warmup, rep)
    log(f"rank {run.rank}/{run.world} on {run.device}: {run.cfg}")
    cases = set(os.environ.get(CASES_ENV, ",".join(CASES)).split(","))
    if "ll" in cases:
        bench_low_latency(run)
    if "fast" in cases:
        bench_fast(run, "triton")
    if "nosync" in cases:
        bench_nosync(run)  # issue 7's open goal: dispatch / combine >= 300 GB/s
    if "reference" in cases:
        bench_reference(run)
    if "overlap" in cases:
        bench_overlap(run)  # the no-sync default since session 5
    if "torch" in cases:
        bench_fast(run, "torch")  # the fallback movers: among the first things to lose to the deadline
    if "overlap2" in cases:  # last (opt-in order): a hang (the deadline exits) loses no other row
        bench_overlap(run, "mixed")  # the overlapped dispatch with the "mixed" launch order (session 5)
    if "overlape" in cases:  # opt-in (session 6), under its own timeout
        bench_overlap_dispatch_configs(run)  # the overlapped dispatch's session-6 configs (early, fused)
    if "overlapc" in cases:  # last too (opt-in configs), under its own timeout
        bench_overlap_combine(run)  # the overlapped combine's reduce configs (session 5, round 2)
    if "diag" in cases:  # the very last (benchmark-only kernels, wrong results), under its own timeout
        bench_dispatch_diag(run)  # the default dispatch with the own-block copy / copy-out doing nothing
    run.save()
    if run.rank == 0 and out:
        log(f"wrote {out}")
    timer.cancel()


def _child(rank: int, world: int, port: int, smoke: bool, out: str | None, warmup: int, rep: int) -> None:
    if not smoke:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if smoke else "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=90))  # fmt: skip
    try:
        rank_main(smoke, out, warmup, rep)
    finally:
        dist.destroy_process_group()


def launch(smoke: bool, out: str | None, warmup: int, rep: int) -> None:
    """Start 2 ranks (this script again, as processes) unless torchrun already did."""
    if "RANK" in os.environ:  # torchrun
        if not smoke:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("gloo" if smoke else "nccl", timeout=datetime.timedelta(seconds=90))
        try:
            rank_main(smoke, out, warmup, rep)
        finally:
            dist.destroy_process_group()
        return
    if not smoke and torch.cuda.device_count() < 2:
        msg = f"needs 2 CUDA GPUs, found {torch.cuda.device_count()}"
        log(msg)
        if out:
            write_results_json(out, [{"op": "all", "impl": "all", "error": msg}], {"package": "deep_ep"})
        return
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_child, args=(2, port, smoke, out, warmup, rep), nprocs=2, start_method="spawn")


def table(path: str) -> str:
    """Markdown table of a saved run (the README's)."""
    doc = json.loads(Path(path).read_text())
    lines = ["| op | ranks | tokens x hidden | impl | time (us) | GB/s over NVLink | % of 393 GB/s | x NCCL reference "
             "| x bare all_to_all | bit-exact |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["records"]:
        if r.get("median_us") is None:
            lines.append(f"| {r['op']} | {r.get('ranks', '')} | | {r['impl']} | error: {r.get('error')} | | | | | |")
            continue
        sp = r.get("speedup_vs") or {}
        fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
        lines.append(
            f"| {r['op']} | {r['ranks']} | {r['tokens_per_rank']} x {r['hidden']} | {r['impl']} "
            f"| {r['median_us']:.1f} | {fmt(r.get('gbps'), '.0f')} | {fmt(r.get('pct_of_ceiling'), '.0f')} "
            f"| {fmt(sp.get('nccl-reference'), '.2f')} | {fmt(sp.get('nccl-a2a-only'), '.2f')} "
            f"| {'' if r.get('matches_reference') is None else r['matches_reference']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the JSON results here (rank 0)")
    p.add_argument("--smoke", action="store_true", help="2 gloo ranks on CPU, tiny shapes (Triton interpreter)")
    p.add_argument("--table", metavar="JSON", help="print the markdown table of a saved run and exit")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rep", type=int, default=20)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    args = p.parse_args(argv)
    bad = set(args.cases.split(",")) - set(CASES)
    if bad:
        p.error(f"--cases: expected names from {','.join(CASES)}, got {sorted(bad)}")
    os.environ[CASES_ENV] = args.cases
    if args.table:
        print(table(args.table))
        return
    t0 = time.time()
    launch(args.smoke, args.out, 1 if args.smoke else args.warmup, 2 if args.smoke else args.rep)
    log(f"done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
