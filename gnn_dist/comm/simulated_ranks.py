"""Simulated ranks: P ranks as threads of one process (`run_fake_ranks`), and a communicator of one rank that
never starts MPI (`solo_comm`), with the calls of gnn_dist.comm.communicator.Comm on shared memory and a barrier.

Tests of plans, schedules and training run on them; so do single-process runs of collective code (the
partitioner with one rank).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gnn_dist.comm.communicator import Comm, Pending, SharedMemory, _as_bytes, _offsets, _row_bytes


class _FakeWorld:
    def __init__(self, size: int, timeout: float):
        self.size = size
        self.timeout = timeout
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.slots: list[Any] = [None] * size
        # Point-to-point messages, matched as MPI matches them: the k-th receive posted for a (source, dest, tag)
        # gets the k-th message sent on it, whenever either side waits.
        self.mailbox: dict[tuple[int, int, int, int], np.ndarray] = {}  # (source, dest, tag, k) -> payload
        self.sent: dict[tuple[int, int, int], int] = {}
        self.posted: dict[tuple[int, int, int], int] = {}
        self.mail = threading.Condition()


class _FakeReceive(Pending):
    """A simulated receive: wait() takes the message its posting order matched, once it has arrived."""

    def __init__(self, world: _FakeWorld, key: tuple[int, int, int], recv: torch.Tensor):
        super().__init__()
        self.world, self.key, self.recv, self.done = world, key, recv, False
        with world.mail:
            self.ticket = key + (world.posted.get(key, 0),)
            world.posted[key] = self.ticket[-1] + 1

    def wait(self) -> None:
        if self.done:
            return
        world = self.world
        with world.mail:
            if not world.mail.wait_for(lambda: self.ticket in world.mailbox or world.barrier.broken,
                                       timeout=world.timeout) or world.barrier.broken:
                raise RuntimeError(f"simulated rank {self.key[1]}: no message from rank {self.key[0]} "
                                   f"(tag {self.key[2]}) within {world.timeout} s")
            payload = world.mailbox.pop(self.ticket)
        expected = _as_bytes(self.recv)
        if payload.nbytes != expected.nbytes:
            raise RuntimeError(f"simulated rank {self.key[1]} expects {expected.nbytes} bytes from rank "
                               f"{self.key[0]} (tag {self.key[2]}), which sent {payload.nbytes}")
        expected[:] = payload
        self.done = True


class FakeComm(Comm):
    """One simulated rank of a `_FakeWorld`; every call is collective, like MPI's."""

    def __init__(self, world: _FakeWorld, rank: int):
        self.world = world
        self.rank = rank
        self.size = world.size

    def _exchange(self, item: Any) -> list:
        self.world.slots[self.rank] = item
        self.world.barrier.wait()
        items = list(self.world.slots)
        self.world.barrier.wait()  # nobody overwrites a slot before all have read it
        return items

    def alltoallv(self, send, send_counts, recv, recv_counts) -> int:
        send_counts = np.asarray(send_counts, dtype=np.int64)
        items = self._exchange((send, send_counts))
        recv_offsets = _offsets(np.asarray(recv_counts, dtype=np.int64))
        for q, (their_send, their_counts) in enumerate(items):
            start = int(_offsets(their_counts)[self.rank])
            rows = int(their_counts[self.rank])
            if rows != int(recv_counts[q]):
                raise RuntimeError(f"rank {self.rank} expects {int(recv_counts[q])} rows from rank {q}, which sends {rows}")
            recv[recv_offsets[q]:recv_offsets[q] + rows] = their_send[start:start + rows]
        self.world.barrier.wait()  # senders may reuse their buffers only after everyone copied
        return int((send_counts.sum() - send_counts[self.rank]) * _row_bytes(send))

    def ialltoallv(self, send, send_counts, recv, recv_counts):
        # Simulated ranks complete the exchange at once; the handle is already done.
        return Pending(), self.alltoallv(send, send_counts, recv, recv_counts)

    def isend(self, send, dest, tag):
        payload = _as_bytes(send).copy()  # delivered at once: the sender may reuse its buffer
        key = (self.rank, dest, tag)
        with self.world.mail:
            count = self.world.sent.get(key, 0)
            self.world.mailbox[key + (count,)] = payload
            self.world.sent[key] = count + 1
            self.world.mail.notify_all()
        return Pending()

    def irecv(self, recv, source, tag):
        return _FakeReceive(self.world, (source, self.rank, tag), recv)

    def allreduce_(self, tensor, op="sum") -> None:
        items = self._exchange(tensor.clone())
        stacked = torch.stack(items)
        tensor.copy_(stacked.sum(0) if op == "sum" else stacked.max(0).values)

    def bcast_(self, tensor, root=0) -> None:
        items = self._exchange(tensor.clone())
        tensor.copy_(items[root])

    def allgather_object(self, obj):
        return self._exchange(obj)

    def barrier(self) -> None:
        self.world.barrier.wait()

    def shared_memory(self) -> SharedMemory:
        return _FakeSharedMemory(self)  # threads of one process share all memory

    def abort(self, code=1) -> None:
        self.world.barrier.abort()
        with self.world.mail:
            self.world.mail.notify_all()
        raise RuntimeError(f"simulated rank {self.rank} aborted the job with code {code}")


class _FakeSharedMemory(SharedMemory):
    """Regions of simulated ranks: tensors every thread sees; arrival is the world's barrier."""

    def __init__(self, comm: FakeComm):
        self.comm = comm

    def allocate(self, nbytes: int) -> list[torch.Tensor]:
        return self.comm.allgather_object(torch.zeros(max(int(nbytes), 1), dtype=torch.uint8))

    def arrive(self) -> Pending:
        return _FakeArrival(self.comm.world)

    def free(self) -> None:
        self.comm.barrier()  # every rank is done with the regions; the tensors go with the last reference


class _FakeArrival(Pending):
    def __init__(self, world: _FakeWorld):
        super().__init__()
        self.world = world

    def wait(self) -> None:
        if self.world is not None:
            self.world.barrier.wait()
            self.world = None


def run_fake_ranks(size: int, fn: Callable[[FakeComm], Any], timeout: float = 60.0) -> list:
    """Run fn(comm) on `size` simulated ranks (threads); return their results in rank order.

    The first exception on any rank breaks the barrier for the others and is re-raised here.
    """
    world = _FakeWorld(size, timeout)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def body(rank: int) -> None:
        try:
            results[rank] = fn(FakeComm(world, rank))
        except BaseException as err:  # noqa: BLE001 - handed to the caller below
            errors[rank] = err
            world.barrier.abort()
            with world.mail:
                world.mail.notify_all()  # a rank waiting for this one's message gives up now

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5)
    first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


def solo_comm() -> Comm:
    """A communicator of one rank that never initialises MPI (single-process runs of collective code)."""
    return FakeComm(_FakeWorld(1, 60.0), 0)
