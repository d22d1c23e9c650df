"""The only module that touches MPI: a small communicator interface and two implementations.

`MPIComm` wraps an mpi4py communicator and moves tensors with buffer
(uppercase) calls on contiguous memory. `FakeComm` runs P simulated ranks as
threads of one process (see `run_fake_ranks`) for unit tests of plans and
schedules; it implements the same calls with shared memory and a barrier.

Tensors cross ranks as raw bytes, so any dtype (float32, float16, bfloat16,
int8) travels the same way and counted bytes are bytes on the wire.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def launcher_rank() -> int | None:
    """This process's rank as told by the MPI launcher's environment, without initialising MPI.

    Used to print an argument error once rather than once per rank.
    """
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"):
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return None


def _as_bytes(tensor: torch.Tensor) -> np.ndarray:
    if not tensor.is_contiguous():
        raise ValueError("communication buffers must be contiguous")
    if tensor.numel() == 0:  # an empty tensor may have stride 0, which no byte view accepts
        return np.empty(0, dtype=np.uint8)
    return tensor.view(-1).view(torch.uint8).numpy()


def _row_bytes(tensor: torch.Tensor) -> int:
    return math.prod(tensor.shape[1:]) * tensor.element_size()


def _offsets(counts: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=offsets[1:])
    return offsets


class Pending:
    """A communication in flight; wait() completes it (idempotent)."""

    def __init__(self, request=None, keep_alive: tuple = ()):
        self._request = request
        self._keep_alive = keep_alive

    def wait(self) -> None:
        if self._request is not None:
            self._request.Wait()
            self._request = None
        self._keep_alive = ()


class Comm:
    """What the runtime needs from a communicator. Counts are in rows of the given tensors."""

    rank: int
    size: int
    aborts_job = False  # whether abort() ends every process of the job (a watchdog is useful only then)

    def alltoallv(self, send: torch.Tensor, send_counts: np.ndarray, recv: torch.Tensor,
                  recv_counts: np.ndarray) -> int:
        """Rows send[offset_q : offset_q + send_counts[q]] go to rank q; rows from q land in recv likewise.

        Returns the bytes this rank sent to other ranks.
        """
        raise NotImplementedError

    def ialltoallv(self, send: torch.Tensor, send_counts: np.ndarray, recv: torch.Tensor,
                   recv_counts: np.ndarray) -> tuple[Pending, int]:
        """Non-blocking alltoallv: (a handle to wait on, bytes sent). Buffers must stay untouched until wait."""
        raise NotImplementedError

    def isend(self, send: torch.Tensor, dest: int, tag: int) -> Pending:
        """Non-blocking point-to-point send of a contiguous tensor's bytes; keep `send` untouched until wait."""
        raise NotImplementedError

    def irecv(self, recv: torch.Tensor, source: int, tag: int) -> Pending:
        """Non-blocking receive of exactly recv's bytes from `source`. Messages of one (source, tag) arrive in
        the order they were sent (MPI's non-overtaking rule)."""
        raise NotImplementedError

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """In-place reduction over ranks (op: sum or max)."""
        raise NotImplementedError

    def bcast_(self, tensor: torch.Tensor, root: int = 0) -> None:
        raise NotImplementedError

    def allgather_object(self, obj: Any) -> list:
        """Small setup metadata only (pickled)."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def abort(self, code: int = 1) -> None:
        raise NotImplementedError


class MPIComm(Comm):
    aborts_job = True

    def __init__(self, mpi_comm: Any = None):
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    def alltoallv(self, send, send_counts, recv, recv_counts) -> int:
        send_bytes = np.asarray(send_counts, dtype=np.int64) * _row_bytes(send)
        recv_bytes = np.asarray(recv_counts, dtype=np.int64) * _row_bytes(recv)
        byte_type = self._mpi.BYTE
        self.comm.Alltoallv([_as_bytes(send), (send_bytes, _offsets(send_bytes)), byte_type],
                            [_as_bytes(recv), (recv_bytes, _offsets(recv_bytes)), byte_type])
        return int(send_bytes.sum() - send_bytes[self.rank])

    def ialltoallv(self, send, send_counts, recv, recv_counts):
        send_bytes = np.asarray(send_counts, dtype=np.int64) * _row_bytes(send)
        recv_bytes = np.asarray(recv_counts, dtype=np.int64) * _row_bytes(recv)
        byte_type = self._mpi.BYTE
        send_spec = [_as_bytes(send), (send_bytes, _offsets(send_bytes)), byte_type]
        recv_spec = [_as_bytes(recv), (recv_bytes, _offsets(recv_bytes)), byte_type]
        request = self.comm.Ialltoallv(send_spec, recv_spec)
        return Pending(request, (send, recv, send_spec, recv_spec)), int(send_bytes.sum() - send_bytes[self.rank])

    def isend(self, send, dest, tag):
        return Pending(self.comm.Isend([_as_bytes(send), self._mpi.BYTE], dest=dest, tag=tag), (send,))

    def irecv(self, recv, source, tag):
        return Pending(self.comm.Irecv([_as_bytes(recv), self._mpi.BYTE], source=source, tag=tag), (recv,))

    def allreduce_(self, tensor, op="sum") -> None:
        mpi_op = {"sum": self._mpi.SUM, "max": self._mpi.MAX}[op]
        self.comm.Allreduce(self._mpi.IN_PLACE, tensor.numpy(), op=mpi_op)

    def bcast_(self, tensor, root=0) -> None:
        self.comm.Bcast(_as_bytes(tensor), root=root)

    def allgather_object(self, obj):
        return self.comm.allgather(obj)

    def barrier(self) -> None:
        self.comm.Barrier()

    def native(self) -> Any:
        """The mpi4py communicator, for a library that takes one (PT-Scotch's distributed graph)."""
        return self.comm

    def abort(self, code=1) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        # Give the launcher a moment to forward the error line before it tears the job down.
        time.sleep(0.5)
        self.comm.Abort(code)


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

    def abort(self, code=1) -> None:
        self.world.barrier.abort()
        with self.world.mail:
            self.world.mail.notify_all()
        raise RuntimeError(f"simulated rank {self.rank} aborted the job with code {code}")


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


def mpi_versions() -> dict:
    """mpi4py's version and the MPI library's, without initialising MPI in this process."""
    import subprocess

    try:
        import mpi4py
    except ImportError:
        return {"mpi4py": "unavailable", "mpi_library": "unavailable"}
    probe = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                           capture_output=True, text=True, timeout=60)
    library = probe.stdout.strip().splitlines()[0] if probe.stdout.strip() else "unknown"
    return {"mpi4py": mpi4py.__version__, "mpi_library": library}


def first_failure(comm: Comm, error: str | None) -> tuple[int, str, bool] | None:
    """Collective: each rank's error line (None: it succeeded) -> None when no rank failed, else
    (the first failing rank, its line, whether every rank failed with that same line)."""
    return failure_among(comm.allgather_object(error))


def failure_among(errors: list[str | None]) -> tuple[int, str, bool] | None:
    """first_failure's answer from every rank's error line, for a caller that gathered them with more."""
    failed = [(rank, message) for rank, message in enumerate(errors) if message is not None]
    if not failed:
        return None
    rank, message = failed[0]
    return rank, message, len(failed) == len(errors) and all(m == message for _, m in failed)


def exchange_rows(comm: Comm, send: np.ndarray, counts: np.ndarray,
                  max_message_bytes: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Variable-sized all-to-all of numpy rows: counts first, then the payload.

    `send` holds rows grouped by destination (counts[d] rows for rank d). Returns (the rows received, grouped
    by source; the counts received from each rank; the bytes this rank put on the wire). With
    max_message_bytes, no single message to a peer exceeds it: the payload goes in as many rounds as the
    largest message needs (agreed with one allreduce, since MPI counts are C ints); without it, one round.
    """
    send = np.ascontiguousarray(send)
    counts = np.asarray(counts, dtype=np.int64)
    ones = np.ones(comm.size, dtype=np.int64)
    recv_counts_tensor = torch.empty(comm.size, dtype=torch.int64)
    sent = comm.alltoallv(torch.from_numpy(counts.copy()), ones, recv_counts_tensor, ones)
    recv_counts = recv_counts_tensor.numpy()
    recv = np.empty((int(recv_counts.sum()),) + send.shape[1:], dtype=send.dtype)
    rounds = 1
    if max_message_bytes is not None:
        row_bytes = max(1, send.dtype.itemsize * int(np.prod(send.shape[1:], dtype=np.int64)))
        max_rows = max(1, max_message_bytes // row_bytes)
        longest = torch.tensor([-(-max(int(counts.max(initial=0)), int(recv_counts.max(initial=0))) // max_rows)])
        comm.allreduce_(longest, "max")
        rounds = int(longest[0])
    if rounds <= 1:
        return recv, recv_counts, sent + comm.alltoallv(torch.from_numpy(send), counts, torch.from_numpy(recv),
                                                        recv_counts)
    send_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    recv_start = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
    for t in range(rounds):
        out = np.clip(counts - t * max_rows, 0, max_rows)
        got = np.clip(recv_counts - t * max_rows, 0, max_rows)
        piece = np.concatenate([send[s + t * max_rows:s + t * max_rows + c] for s, c in zip(send_start, out)])
        landing = np.empty((int(got.sum()),) + send.shape[1:], dtype=send.dtype)
        sent += comm.alltoallv(torch.from_numpy(piece), out, torch.from_numpy(landing), got)
        offset = 0
        for s, c in zip(recv_start, got):
            recv[s + t * max_rows:s + t * max_rows + c] = landing[offset:offset + c]
            offset += c
    return recv, recv_counts, sent


def solo_comm() -> Comm:
    """A communicator of one rank that never initialises MPI (single-process runs of collective code)."""
    return FakeComm(_FakeWorld(1, 60.0), 0)


def make_world_comm() -> Comm:
    """The communicator of a process started by mpiexec (or a single process: size 1)."""
    return MPIComm()


__all__: Sequence[str] = ["Comm", "Pending", "MPIComm", "FakeComm", "run_fake_ranks", "launcher_rank", "make_world_comm",
                           "solo_comm", "first_failure", "failure_among", "exchange_rows"]
