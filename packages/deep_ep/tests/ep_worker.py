"""Run the dispatch / combine scenarios on one rank, and launch them over gloo process groups.

`launch` starts one process per rank (torch.multiprocessing, "forkserver"), each of which joins a gloo group on
a free localhost port, runs every scenario and destroys its group. A worker's exception fails the launch;
on a timeout or a failure every worker still alive is killed, so no process outlives the test.
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
    for use_fp8, round_scale, ue8m0 in ((False, False, False), (True, False, False), (True, True, True)):
        check_low_latency(buf, w, use_fp8, round_scale, ue8m0)


def _worker(rank: int, world_size: int, port: int, seed: int) -> None:
    torch.set_num_threads(1)  # the machine is shared; the payloads are tiny
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=30),  # a collective that hangs fails instead
    )
    try:
        run_all(dist.group.WORLD, seed)
        # Then every smaller world on the first ranks: one set of processes serves several world sizes,
        # since starting a process (importing torch) costs far more than the scenarios.
        for size in range(world_size - 1, 1, -1):
            sub = dist.new_group(list(range(size)))  # collective over all ranks, members or not
            if rank < size:
                run_all(sub, seed + size)
            dist.destroy_process_group(sub)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # success: skip the interpreter teardown (about a second of torch/gloo cleanup per rank)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world_size: int, seed: int, timeout_s: float = 60.0) -> None:
    """Run `run_all` on `world_size` spawned ranks; raise if any fails or the deadline passes."""
    # forkserver: one server process imports torch once and forks the ranks from it, which on a loaded
    # 2-core machine starts 3 ranks in ~1 s instead of ~5 s for 3 concurrent fresh interpreters (spawn).
    multiprocessing.set_forkserver_preload(["torch", "ep_worker"])
    ctx = mp.start_processes(
        _worker, args=(world_size, _free_port(), seed), nprocs=world_size, join=False, start_method="forkserver"
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
