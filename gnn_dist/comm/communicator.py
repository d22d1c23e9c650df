"""The only module that touches MPI: the communicator interface the runtime uses, and its MPI implementation.

`MPIComm` wraps an mpi4py communicator and moves tensors with buffer
(uppercase) calls on contiguous memory. Simulated ranks (threads of one
process, for tests and single-process runs of collective code) implement the
same interface in gnn_dist.comm.simulated_ranks.

Tensors cross ranks as raw bytes, so any dtype (float32, float16, bfloat16,
int8) travels the same way and counted bytes are bytes on the wire.
"""
from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
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


def _as_bytes(tensor: torch.Tensor):
    """The tensor's bytes as a buffer MPI reads: a numpy view of host memory; a device tensor itself (mpi4py takes
    it through __cuda_array_interface__; only a CUDA-aware MPI gets one, gnn_dist.device)."""
    if not tensor.is_contiguous():
        raise ValueError("communication buffers must be contiguous")
    if tensor.numel() == 0:  # an empty tensor may have stride 0, which no byte view accepts
        return np.empty(0, dtype=np.uint8)
    raw = tensor.view(-1).view(torch.uint8)
    return raw.numpy() if raw.device.type == "cpu" else raw


def _as_values(tensor: torch.Tensor):
    """The tensor's values (not bytes: reductions need their type) as a buffer MPI reads."""
    return tensor.numpy() if tensor.device.type == "cpu" else tensor


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

    def progress(self) -> None:
        """Let the transfer advance without blocking. An MPI library without a progress thread moves a large
        message only inside its own calls, so compute that overlaps a transfer calls this between its pieces."""
        if self._request is not None:
            self._request.Test()  # a completed request becomes MPI_REQUEST_NULL: wait() then returns at once


class SharedMemory:
    """Memory the ranks of one host share (from Comm.shared_memory): a region per rank that every rank of the
    group may read and write, and a barrier that orders what each wrote before it against what any reads after.

    Regions are uint8 tensors indexed by rank (the communicator's ranks: the group is all of them).
    """

    def allocate(self, nbytes: int) -> list[torch.Tensor]:
        """Collective: this rank's region gets nbytes (ranks may ask for different sizes); returns every rank's
        region. Regions allocated before are freed first, once every rank has stopped using them."""
        raise NotImplementedError

    def arrive(self) -> Pending:
        """Collective, non-blocking: what this rank wrote into the regions so far is visible to every rank
        once wait() returns, and so is what every other rank wrote before its own arrive()."""
        raise NotImplementedError

    def free(self) -> None:
        """Collective: free the regions, once every rank has stopped using them."""
        raise NotImplementedError


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

    def local_rank(self) -> int:
        """This rank's index among the ranks on its host (which GPU it takes). Simulated ranks share one host."""
        return self.rank

    def shared_memory(self) -> SharedMemory | None:
        """Collective: memory shared by every rank of the job, or None (ranks on several hosts, a communicator
        that models a link or stages through a device, or none to offer)."""
        return None


class CommWrapper(Comm):
    """A communicator that changes some exchanges of `inner` (a modelled link, device staging) and passes the
    rest through unchanged."""

    def __init__(self, inner: Comm):
        self.inner = inner
        self.rank = inner.rank
        self.size = inner.size
        self.aborts_job = inner.aborts_job

    def alltoallv(self, send, send_counts, recv, recv_counts) -> int:
        return self.inner.alltoallv(send, send_counts, recv, recv_counts)

    def ialltoallv(self, send, send_counts, recv, recv_counts):
        return self.inner.ialltoallv(send, send_counts, recv, recv_counts)

    def isend(self, send, dest, tag):
        return self.inner.isend(send, dest, tag)

    def irecv(self, recv, source, tag):
        return self.inner.irecv(recv, source, tag)

    def allreduce_(self, tensor, op="sum") -> None:
        self.inner.allreduce_(tensor, op)

    def bcast_(self, tensor, root=0) -> None:
        self.inner.bcast_(tensor, root)

    def allgather_object(self, obj):
        return self.inner.allgather_object(obj)

    def barrier(self) -> None:
        self.inner.barrier()

    def abort(self, code: int = 1) -> None:
        self.inner.abort(code)

    def local_rank(self) -> int:
        return self.inner.local_rank()


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
        self.comm.Allreduce(self._mpi.IN_PLACE, _as_values(tensor), op=mpi_op)

    def bcast_(self, tensor, root=0) -> None:
        self.comm.Bcast(_as_bytes(tensor), root=root)

    def allgather_object(self, obj):
        return self.comm.allgather(obj)

    def barrier(self) -> None:
        self.comm.Barrier()

    def local_rank(self) -> int:
        # The ranks that share memory with this one are the ranks of its host.
        if not hasattr(self, "_local_rank"):
            shared = self.comm.Split_type(self._mpi.COMM_TYPE_SHARED, key=self.rank)
            self._local_rank = shared.Get_rank()
            shared.Free()
        return self._local_rank

    def shared_memory(self) -> SharedMemory | None:
        shared = self.comm.Split_type(self._mpi.COMM_TYPE_SHARED, key=self.rank)
        if shared.Get_size() != self.size:  # ranks on several hosts: their halos travel by MPI
            shared.Free()
            return None
        return _MPISharedMemory(self._mpi, shared)

    def native(self) -> Any:
        """The mpi4py communicator, for a library that takes one (PT-Scotch's distributed graph)."""
        return self.comm

    def abort(self, code=1) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        # Give the launcher a moment to forward the error line before it tears the job down.
        time.sleep(0.5)
        self.comm.Abort(code)


class _MPISharedMemory(SharedMemory):
    """An MPI shared-memory window over the host's ranks (its ranks are the job's: key = rank), held in one
    passive epoch (lock_all) so that MPI_Win_sync orders stores and loads around the barrier, the unified
    model's idiom for shared windows."""

    def __init__(self, mpi, shared_comm):
        self._mpi, self._comm, self._window = mpi, shared_comm, None

    def allocate(self, nbytes: int) -> list[torch.Tensor]:
        self.free()
        window = self._mpi.Win.Allocate_shared(max(int(nbytes), 1), 1, comm=self._comm)
        window.Lock_all(self._mpi.MODE_NOCHECK)
        self._window = window
        regions = []
        for q in range(self._comm.Get_size()):
            buffer, _ = window.Shared_query(q)
            regions.append(torch.frombuffer(buffer, dtype=torch.uint8))
        return regions

    def arrive(self) -> Pending:
        self._window.Sync()  # this rank's stores reach the shared memory before it says it arrived
        return _SharedArrival(self._comm.Ibarrier(), self._window)

    def free(self) -> None:
        if self._window is not None:
            self._comm.Barrier()  # every rank is done with the regions before they go
            self._window.Unlock_all()
            self._window.Free()
            self._window = None


class _SharedArrival(Pending):
    """A barrier in flight over shared memory; once it completes, a Win_sync makes the peers' stores visible."""

    def __init__(self, request, window):
        super().__init__(request)
        self._window = window

    def wait(self) -> None:
        if self._window is not None:
            super().wait()
            self._window.Sync()
            self._window = None


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


def make_world_comm() -> Comm:
    """The communicator of a process started by mpiexec (or a single process: size 1)."""
    return MPIComm()


__all__: Sequence[str] = ["Comm", "Pending", "SharedMemory", "MPIComm", "launcher_rank", "make_world_comm", "first_failure",
                           "failure_among", "exchange_rows"]
