"""Run the dispatch / combine scenarios on one rank, and launch them over gloo (CPU) or NCCL (GPU) groups.

`launch` starts one process per rank (torch.multiprocessing, "forkserver"), each of which joins a group on
a free localhost port (NCCL scenarios: rank r on GPU r), runs a scenario and destroys its group. A worker's
exception fails the launch; on a timeout or a failure every worker still alive is killed, so no process
outlives the test.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ep_cases import make_world
from ep_fast import (
    buf_device,
    check_bad_input_raises_everywhere,
    check_fast_vs_reference,
    check_overlap_combine_vs_reference,
    check_worst_vs_reference,
    worst_graph_equals_eager,
)
from ep_ll_fast import check_ll_fast, ll_graph_equals_eager
from ep_low_latency import check_low_latency
from ep_normal import check_normal

from deepinfer.deep_ep import Buffer


def run_all(group: dist.ProcessGroup | None, seed: int) -> None:
    """Every scenario on this process's rank of `group` (None = a single process, world size 1)."""
    buf = Buffer(group)
    world = 1 if group is None else dist.get_world_size(group)
    assert (buf.rank, buf.group_size) == (0 if group is None else dist.get_rank(group), world)
    w = make_world(world, seed)
    check_normal(buf, w, use_fp8=False)
    check_normal(buf, w, use_fp8=True)
    if group is not None:  # num_worst_tokens on the reference: the synced result padded to W rows
        check_worst_vs_reference(buf, seed + 5, 256, 8 * world, 4, [6, 0, 9][:world])
    for use_fp8, round_scale, ue8m0 in ((False, False, False), (True, False, False), (True, True, True)):
        check_low_latency(buf, w, use_fp8, round_scale, ue8m0)


def run_fast(group: dist.ProcessGroup, seed: int) -> None:
    """The fast path against the reference (bit-exact dispatch), then the oracle scenarios through it.

    With the torch movers the buffer starts small (2 MiB) and the second case makes every rank grow it.
    """
    buf = Buffer(group)
    world = dist.get_world_size(group)
    experts = 8 * world
    check_fast_vs_reference(buf, seed, 256, experts, 6, [9, 0, 13, 4][:world])
    check_bad_input_raises_everywhere(buf, experts)
    if os.environ.get("DEEPINFER_DEEP_EP_IMPL") == "torch":  # too slow for Triton's interpreter; same logic
        check_fast_vs_reference(buf, seed + 1, 2048, experts, 4, [300, 90, 5, 0][:world])
        assert buf._fast.transport.nbytes > 2 << 20, "the second case should have grown the buffers"
    else:
        check_fast_vs_reference(buf, seed + 1, 512, experts, 8, [20, 33, 1, 0][:world])  # bf16 rows via Triton
        # the first shape again, new routing: the grown receive capacity and the cached buffer views are reused
        check_fast_vs_reference(buf, seed + 2, 256, experts, 6, [9, 0, 13, 4][:world])
    # num_worst_tokens: no host sync with the Triton movers, the padded synced path with the torch ones
    check_worst_vs_reference(buf, seed + 3, 256, experts, 6, [9, 0, 13, 4][:world])
    w = make_world(world, seed)
    check_normal(buf, w, use_fp8=False)
    check_normal(buf, w, use_fp8=True)
    buf.destroy()


def run_fast_cuda(group: dist.ProcessGroup, seed: int) -> None:
    """On GPUs (NCCL + symmetric memory): V4-Flash shapes, uneven and empty ranks, both row movers."""
    world = dist.get_world_size(group)
    for impl in ("triton", "torch"):
        os.environ["DEEPINFER_DEEP_EP_IMPL"] = impl  # read when a Buffer builds its fast path
        buf = Buffer(group)
        check_fast_vs_reference(buf, seed, 4096, 256, 6, [4096, 1000, 0, 77, 5, 9, 2048, 1][:world])
        check_fast_vs_reference(buf, seed + 1, 7168, 64, 8, [0, 300, 5, 7, 1, 1, 1, 1][:world])
        check_fast_vs_reference(buf, seed + 2, 4096, 256, 6, [1, 1, 1, 1, 1, 1, 1, 1][:world])
        # num_worst_tokens (no host sync with the Triton movers), uneven ranks incl. an empty one
        check_worst_vs_reference(buf, seed + 3, 4096, 256, 6, [4096, 0, 1000, 77, 5, 9, 2048, 1][:world])
        check_worst_vs_reference(buf, seed + 4, 7168, 64, 8, [0, 300, 5, 7, 1, 1, 1, 1][:world])
        if impl == "triton":
            worst_graph_equals_eager(buf, seed + 5, 4096, 256, 6, [4096, 1000, 0, 77, 5, 9, 2048, 1][:world])
        buf.destroy()


def run_ll_fast(group: dist.ProcessGroup, seed: int) -> None:
    """The low-latency fast path against reference_ll on CPU (shared memory, Triton interpreter): hidden 512
    (so e8m0 scale rows are whole int32 words), uneven ranks incl. an empty one; then, at hidden 256, the
    oracle scenario's e8m0 case (2-byte scale rows: the fast Buffer must fall back to the reference)."""
    buf = Buffer(group, low_latency_mode=True)
    world = dist.get_world_size(group)
    check_ll_fast(buf, seed, 512, 8 * world, 4, [7, 0, 5, 3][:world], 8)
    check_low_latency(buf, make_world(world, seed), True, True, True, fast=True)
    buf.destroy()


def run_ll_cuda(group: dist.ProcessGroup, seed: int) -> None:
    """On GPUs: V4-Flash shapes (hidden 4096, top-6 of 256) at 1 / 32 / 128 tokens with uneven ranks, then a
    CUDA graph of dispatch + combine replayed 3 times against eager."""
    world = dist.get_world_size(group)
    buf = Buffer(group, low_latency_mode=True)
    check_ll_fast(buf, seed, 4096, 256, 6, [128, 77, 0, 5, 128, 1, 3, 9][:world], 128)
    check_ll_fast(buf, seed + 1, 4096, 256, 6, [1, 0, 1, 1, 1, 1, 1, 1][:world], 1)
    check_ll_fast(buf, seed + 2, 4096, 256, 6, [32, 32, 32, 32, 32, 32, 32, 32][:world], 32)
    ll_graph_equals_eager(buf, seed + 3, 4096, 256, 6, 128, 128)
    buf.destroy()


def run_overlap(group: dist.ProcessGroup, seed: int) -> None:
    """The overlapped no-sync variant against the reference on CPU (shared memory, Triton interpreter): as the
    default (overlap not passed), uneven ranks incl. an empty one; then `overlap=True` on a larger case (the
    variant's buffers grow; hidden 512: the e8m0 scale rows are whole words, so every payload takes it)."""
    buf = Buffer(group)
    world = dist.get_world_size(group)
    check_worst_vs_reference(buf, seed, 256, 8 * world, 6, [9, 0, 13, 4][:world], overlap=None)  # the default
    check_worst_vs_reference(buf, seed + 1, 512, 8 * world, 4, [20, 33, 1, 0][:world], overlap=True)
    assert not buf._fast._overlap_state.timed_out(), "a wait of the overlapped variant gave up"
    buf.destroy()


def run_overlap_cuda(group: dist.ProcessGroup, seed: int) -> None:
    """On GPUs: the overlapped variant at V4-Flash shapes (uneven ranks incl. an empty one) against the NCCL
    reference, then a CUDA graph of it (dispatch bf16 + FP8, cached dispatch, combine) replayed 3 times == eager."""
    world = dist.get_world_size(group)
    os.environ["DEEPINFER_DEEP_EP_IMPL"] = "triton"
    buf = Buffer(group)
    check_worst_vs_reference(buf, seed, 4096, 256, 6, [4096, 0, 1000, 77, 5, 9, 2048, 1][:world], overlap=True)
    check_worst_vs_reference(buf, seed + 1, 7168, 64, 8, [0, 300, 5, 7, 1, 1, 1, 1][:world], overlap=True)
    worst_graph_equals_eager(buf, seed + 2, 4096, 256, 6, [4096, 1000, 0, 77, 5, 9, 2048, 1][:world], overlap=True)
    assert not buf._fast._overlap_state.timed_out(), "a wait of the overlapped variant gave up"
    buf.destroy()


def run_overlap_mixed(group: dist.ProcessGroup, seed: int) -> None:
    """The overlapped variant with the "mixed" dispatch launch order (DEEPINFER_DEEP_EP_OVERLAP_ORDER=mixed, set
    by the test) against the reference: on CPU one case (the interpreter runs the interleave, copy-out last),
    on GPUs (early copy-out programs too) V4-Flash shapes, uneven ranks incl. an empty one, and CUDA-graph
    replays == eager."""
    assert os.environ.get("DEEPINFER_DEEP_EP_OVERLAP_ORDER") == "mixed", "the test sets the order"
    world = dist.get_world_size(group)
    if dist.get_backend(group) == "nccl":
        os.environ["DEEPINFER_DEEP_EP_IMPL"] = "triton"
    buf = Buffer(group)
    if buf_device(buf).type == "cpu":
        check_worst_vs_reference(buf, seed, 256, 8 * world, 6, [9, 0, 13, 4][:world], overlap=True)
    else:
        counts = [4096, 0, 1000, 77, 5, 9, 2048, 1][:world]
        check_worst_vs_reference(buf, seed, 4096, 256, 6, counts, overlap=True)
        check_worst_vs_reference(buf, seed + 1, 7168, 64, 8, [0, 300, 5, 7, 1, 1, 1, 1][:world], overlap=True)
        worst_graph_equals_eager(buf, seed + 2, 4096, 256, 6, [4096, 1000, 0, 77, 5, 9, 2048, 1][:world], overlap=True)
    assert not buf._fast._overlap_state.timed_out(), "a wait of the overlapped variant gave up"
    buf.destroy()


def run_overlap_combine(group: dist.ProcessGroup, seed: int) -> None:
    """The overlapped combine with each non-default reduce config (DEEPINFER_DEEP_EP_OVERLAP_COMBINE = "wide",
    "wide4": 2x / 4x the tokens per reduce program; session 5, opt-in) against the reference, bit for
    bit: on CPU token counts that give several reduce programs per rank and a partial last one; on GPUs
    V4-Flash shapes with an empty rank, then (wide) CUDA-graph replays == eager."""
    from deepinfer.deep_ep import _overlap

    world = dist.get_world_size(group)
    if dist.get_backend(group) == "nccl":
        os.environ["DEEPINFER_DEEP_EP_IMPL"] = "triton"
    buf = Buffer(group)
    cpu = buf_device(buf).type == "cpu"
    try:
        for i, config in enumerate(("wide", "wide4")):
            os.environ[_overlap.COMBINE_ENV] = config
            if cpu:
                check_overlap_combine_vs_reference(buf, seed + i, 128, 8 * world, 4, [150, 70, 0, 9][:world])
                continue
            if i == 0:  # the whole no-sync check (all payloads, cached dispatch, W too small), then graphs
                check_worst_vs_reference(
                    buf, seed, 4096, 256, 6, [4096, 0, 1000, 77, 5, 9, 2048, 1][:world], overlap=True
                )
                worst_graph_equals_eager(buf, seed + 5, 4096, 256, 6, [4096, 1000, 0, 77, 5, 9, 2048, 1][:world],
                                         overlap=True)  # fmt: skip
            else:  # the combine alone (the only kernel the config changes)
                check_overlap_combine_vs_reference(
                    buf, seed + i, 4096, 256, 6, [1000, 4096, 0, 77, 5, 9, 2048, 1][:world]
                )
        assert not buf._fast._overlap_state.timed_out(), "a wait of the overlapped variant gave up"
    finally:
        os.environ.pop(_overlap.COMBINE_ENV, None)
    buf.destroy()


DISPATCH_CONFIGS = ("early", "fused")  # the session-6 dispatch configs (DEEPINFER_DEEP_EP_OVERLAP_DISPATCH)


def run_overlap_dispatch_configs(group: dist.ProcessGroup, seed: int) -> None:
    """The overlapped dispatch with each session-6 config (`DISPATCH_CONFIGS`, then "base" once more: the
    epochs stay in step whichever launch advances them) against the reference, bit for bit: on CPU one case per
    config, on GPUs V4-Flash shapes (uneven ranks incl. an empty one) and, for fused, 7168 x top-8 of 64 and
    CUDA-graph replays of dispatch + combine == eager (fused advances the epoch inside its one launch)."""
    from deepinfer.deep_ep import _overlap

    world = dist.get_world_size(group)
    for i, config, buf, cpu in _config_sweep(group, _overlap.DISPATCH_ENV, (*DISPATCH_CONFIGS, "base")):
        if cpu:
            check_worst_vs_reference(buf, seed + i, 256, 8 * world, 6, [9, 0, 13, 4][:world], overlap=True)
            continue
        counts = [4096, 0, 1000, 77, 5, 9, 2048, 1][:world]
        check_worst_vs_reference(buf, seed + i, 4096, 256, 6, counts, overlap=True)
        if config == "fused":  # (fused runs every code path of early, and its own: the time budget)
            check_worst_vs_reference(buf, seed + 10 + i, 7168, 64, 8, [0, 300, 5, 7, 1, 1, 1, 1][:world],
                                     overlap=True)  # fmt: skip
            worst_graph_equals_eager(buf, seed + 20 + i, 4096, 256, 6, [4096, 1000, 0, 77, 5, 9, 2048, 1][:world],
                                     overlap=True)  # fmt: skip


def _config_sweep(group: dist.ProcessGroup, env: str, configs: tuple[str, ...]):  # noqa: ANN202 (a generator)
    """Yields (i, config, buffer, on CPU) for each config with the env var `env` set to it, on one overlapped-path
    Buffer (NCCL groups: the Triton movers); after the last config, no wait of the overlapped variant may have timed
    out; then the env var is cleared and the buffer destroyed."""
    if dist.get_backend(group) == "nccl":
        os.environ["DEEPINFER_DEEP_EP_IMPL"] = "triton"
    buf = Buffer(group)
    cpu = buf_device(buf).type == "cpu"
    try:
        for i, config in enumerate(configs):
            os.environ[env] = config
            yield i, config, buf, cpu
        assert not buf._fast._overlap_state.timed_out(), "a wait of the overlapped variant gave up"
    finally:
        os.environ.pop(env, None)
    buf.destroy()


FOLD_CONFIGS = ("fold", "wide_fold", "send2", "wide_fold_send2")  # the session-6 combine configs, in this order
# (a folding config after a bumping one and back: the epochs must stay in step whichever launch advances them)


def run_overlap_fold(group: dist.ProcessGroup, seed: int) -> None:
    """The overlapped combine with each session-6 config (`FOLD_CONFIGS`) against the reference, bit for bit: on
    CPU token counts that give several send / reduce programs and a partial last one, then the default once more
    (epochs in step); on GPUs V4-Flash shapes with an empty rank, and for wide_fold_send2 CUDA-graph replays of
    dispatch + combine == eager (the folded epoch must advance on every replay)."""
    from deepinfer.deep_ep import _overlap

    world = dist.get_world_size(group)
    for i, config, buf, cpu in _config_sweep(group, _overlap.COMBINE_ENV, (*FOLD_CONFIGS, "base")):
        if cpu:
            check_overlap_combine_vs_reference(buf, seed + i, 128, 8 * world, 4, [150, 70, 0, 9][:world])
            continue
        counts = [1000, 4096, 0, 77, 5, 9, 2048, 1][:world]
        check_overlap_combine_vs_reference(buf, seed + i, 4096, 256, 6, counts)
        if config == "wide_fold_send2":  # (every code path of fold, wide_fold and send2: the time budget)
            worst_graph_equals_eager(buf, seed + 10 + i, 4096, 256, 6, [4096, 1000, 0, 77, 5, 9, 2048, 1][:world],
                                     overlap=True)  # fmt: skip


# name -> (scenario, torch.distributed backend)
SCENARIOS = {
    "all": (run_all, "gloo"),
    "fast": (run_fast, "gloo"),
    "cuda": (run_fast_cuda, "nccl"),
    "llfast": (run_ll_fast, "gloo"),
    "llcuda": (run_ll_cuda, "nccl"),
    "overlap": (run_overlap, "gloo"),
    "overlapcuda": (run_overlap_cuda, "nccl"),
    "overlapmixed": (run_overlap_mixed, "gloo"),
    "overlapmixedcuda": (run_overlap_mixed, "nccl"),
    "overlapcomb": (run_overlap_combine, "gloo"),
    "overlapcombcuda": (run_overlap_combine, "nccl"),
    "overlapdisp": (run_overlap_dispatch_configs, "gloo"),
    "overlapdispcuda": (run_overlap_dispatch_configs, "nccl"),
    "overlapfold": (run_overlap_fold, "gloo"),
    "overlapfoldcuda": (run_overlap_fold, "nccl"),
}


def _worker(
    rank: int, world_size: int, port: int, seed: int, env: dict[str, str] | None = None, scenario: str = "all"
) -> None:
    torch.set_num_threads(1)  # the machine is shared; the payloads are tiny
    os.environ.update(env or {})  # e.g. force the fast path (the forkserver's environment is fixed)
    run, backend = SCENARIOS[scenario]
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        # a collective that hangs fails instead (GPU: leave room for Triton compiling on one rank)
        timeout=datetime.timedelta(seconds=30 if backend == "gloo" else 180),
    )
    try:
        run(dist.group.WORLD, seed)
        # Then every smaller world on the first ranks: one set of processes serves several world sizes,
        # since starting a process (importing torch) costs far more than the scenarios.
        for size in range(world_size - 1, 1, -1):
            sub = dist.new_group(list(range(size)))  # collective over all ranks, members or not
            if rank < size:
                run(sub, seed + size)
            dist.destroy_process_group(sub)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # success: skip the interpreter teardown (about a second of torch/gloo cleanup per rank)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    world_size: int, seed: int, timeout_s: float = 60.0, env: dict[str, str] | None = None, scenario: str = "all"
) -> None:
    """Run `run_all` on `world_size` spawned ranks (with `env` set in each); raise if any fails or times out."""
    # forkserver: one server process imports torch once and forks the ranks from it, which on a loaded
    # 2-core machine starts 3 ranks in ~1 s instead of ~5 s for 3 concurrent fresh interpreters (spawn).
    multiprocessing.set_forkserver_preload(["torch", "ep_worker"])
    ctx = mp.start_processes(
        _worker,
        args=(world_size, _free_port(), seed, env, scenario),
        nprocs=world_size,
        join=False,
        start_method="forkserver",
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=0.5):  # raises ProcessRaisedException / ProcessExitedException on failure
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world_size}-rank dispatch/combine test did not finish in {timeout_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()
