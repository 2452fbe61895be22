"""Buffers every rank of one node can write directly, and a barrier: what the intranode fast path moves data with.

- `SymmTransport` (CUDA): one byte buffer per rank from `torch.distributed._symmetric_memory` (CUDA IPC
  mappings, over NVLink between GPUs of one host); peers' buffers are ordinary CUDA tensors of this
  device (`get_buffer`), so torch copies and Triton kernels read and write them; `barrier` is the stream-
  ordered GPU barrier of the symmetric-memory handle (no CPU round trip). Needs torch >= 2.6 built with
  symmetric memory, peer access between the GPUs, and `TORCH_SYMM_MEM_DISABLE_MULTICAST=1` where NVLink
  multicast must stay off.
- `ShmTransport` (CPU): the same over files in /dev/shm mapped by every rank, with a process-group barrier.
  It lets the fast path's logic run in several CPU processes (tests, TRITON_INTERPRET=1).

Both are collectives: every rank constructs them and calls `barrier` / `ensure` in the same order with
the same arguments.
"""

from __future__ import annotations

import abc
import os
import uuid
import warnings

import torch
import torch.distributed as dist

from ._plan import grown_size


class Transport(abc.ABC):
    """Interface: rank, world, `buffer(r)` (rank r's byte buffer, writable from here), `barrier()`, `ensure(n)`."""

    rank: int
    world: int
    nbytes: int

    @abc.abstractmethod
    def buffer(self, r: int) -> torch.Tensor:
        """uint8 [nbytes] view of rank r's buffer."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Every rank's earlier writes (into any buffer) are visible to every rank's later reads."""

    @abc.abstractmethod
    def _alloc(self, nbytes: int) -> None:
        """(Re)allocate this rank's buffer with `nbytes` bytes (collective)."""

    def ensure(self, need: int) -> None:
        """Grow every rank's buffer to hold `need` bytes (collective: every rank passes the same `need`).

        Called only at a point where no rank reads or writes a buffer (after the count exchange), so the
        old buffers are simply replaced; they are kept alive until `close` in case a peer still maps them.
        """
        if need > self.nbytes:
            self._alloc(grown_size(need, self.nbytes))

    @abc.abstractmethod
    def close(self) -> None:
        """Drop the buffers."""


class SymmTransport(Transport):
    """CUDA symmetric memory over an NCCL process group (one GPU per rank, one host)."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, nbytes: int) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self._symm = symm_mem
        self.group, self.device = group, device
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed by torch < 2.9, a deprecated no-op after
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                enable(group.group_name)
        self.nbytes, self._old = 0, []
        self._alloc(nbytes)

    def _alloc(self, nbytes: int) -> None:
        if self.nbytes:
            self._old.append((self._tensor, self._handle, self._views))
        self._tensor = self._symm.empty(nbytes, dtype=torch.uint8, device=self.device)
        self._handle = self._symm.rendezvous(self._tensor, self.group.group_name)
        self._views = [self._handle.get_buffer(r, (nbytes,), torch.uint8, 0) for r in range(self.world)]
        self._views[self.rank] = self._tensor
        self.nbytes = nbytes

    def buffer(self, r: int) -> torch.Tensor:
        return self._views[r]

    def barrier(self) -> None:
        self._handle.barrier(channel=0)

    def close(self) -> None:
        self._old.clear()
        self._views = []


class ShmTransport(Transport):
    """Shared-memory files (one per rank) mapped by every rank of a CPU (gloo) group; for tests."""

    def __init__(self, group: dist.ProcessGroup, nbytes: int) -> None:
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        token = [uuid.uuid4().hex if self.rank == 0 else None]
        dist.broadcast_object_list(token, src=dist.get_global_rank(group, 0), group=group)
        self._token, self._gen, self.nbytes, self._old = token[0], 0, 0, []
        self._alloc(nbytes)

    def _path(self, r: int) -> str:
        return f"/dev/shm/deepinfer_ep_{self._token}_{self._gen}_{r}"

    def _alloc(self, nbytes: int) -> None:
        if self.nbytes:
            self._old.append(self._views)
        self._gen += 1
        mine = self._path(self.rank)
        with open(mine, "wb") as f:
            f.truncate(nbytes)
        dist.barrier(group=self.group)
        try:
            self._views = [
                torch.from_file(self._path(r), shared=True, size=nbytes, dtype=torch.uint8) for r in range(self.world)
            ]
            dist.barrier(group=self.group)  # everyone mapped every file: the names can go
        finally:
            os.unlink(mine)
        self.nbytes = nbytes

    def buffer(self, r: int) -> torch.Tensor:
        return self._views[r]

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def close(self) -> None:
        self._old.clear()
        self._views = []


def make_transport(group: dist.ProcessGroup, device: torch.device, nbytes: int) -> Transport:
    """SymmTransport on a CUDA device, ShmTransport on CPU."""
    if device.type == "cuda":
        return SymmTransport(group, device, nbytes)
    if device.type == "cpu":
        return ShmTransport(group, nbytes)
    raise ValueError(f"device: the intranode fast path runs on 'cuda' (or 'cpu' for tests), got {device.type!r}")
