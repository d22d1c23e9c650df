"""The exact exchange between ranks of one host through shared memory, without MPI copying the rows.

When every rank of the job shares one host (Comm.shared_memory), each rank
writes what it sends into its own region of a shared window: the forward's
boundary rows in its send layout (grouped by peer), the backward's halo-row
gradients in its halo order (grouped by owner). After one barrier, each peer
reads its rows straight from the writer's region: the forward's halo product
multiplies them where they lie, and the backward's owner adds the returned
gradients from there. MPI's alltoallv would copy the same bytes (a single
copy with CMA, two through its own shared buffers) inside the progress calls
of the owned product, on the rank's one core: at P=2 on a 60k-node graph about
7 ms of a 0.31 s epoch, plus posting the exchange.

Each region holds one slot, so an exchange takes two barriers: one after the
rows are written (the readers wait for it), and one after they are read,
posted without waiting, that the next exchange waits for before it writes
(by then it has long completed). Two slots used alternately would need only
the first, but resident set sizes count every page a rank touches, its peers'
slots it reads included: one slot keeps the rank's peak RSS below MPI's
buffers. Every rank makes the same sequence of exchanges with the same row
width (they are collectives), so the capacity of each exchange agrees across
ranks without a message.

The bytes and rows counted are those MPI would have moved: rows to peers
times their width.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from gnn_dist.comm.communicator import Comm, Pending, SharedMemory

SHARED_HALO_ENV = "GNN_DIST_SHARED_HALO"


def shared_halo_enabled() -> bool:
    """Whether a one-host job exchanges halos through shared memory (GNN_DIST_SHARED_HALO=0: through MPI)."""
    return os.environ.get(SHARED_HALO_ENV, "1").strip() not in ("0", "off", "false", "no")


def _starts(counts: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums along the last axis: where each count's rows begin."""
    return np.cumsum(counts, axis=-1) - counts


@dataclass
class SharedHalo:
    """A rank's side of the same-host exchange. rows_between[q, r]: rows rank q sends rank r (its send
    counts), identical on every rank."""

    memory: SharedMemory
    rank: int
    rows_between: np.ndarray
    row_bytes: int = 0          # widest row (bytes) the regions hold so far
    regions: list | None = None
    read: Pending | None = None  # the barrier after the last exchange's rows were read, in flight
    used: bool = False           # whether any exchange went through shared memory (alike on every rank)

    @classmethod
    def open(cls, comm: Comm, send_counts: np.ndarray) -> SharedHalo | None:
        """Collective: this rank's same-host exchange, or None when the job spans hosts, has one rank, or
        GNN_DIST_SHARED_HALO=0. ValueError naming the fix when ranks see that setting differently."""
        seen = comm.allgather_object((shared_halo_enabled(), [int(c) for c in send_counts]))
        if len({enabled for enabled, _ in seen}) > 1:
            on = [rank for rank, (enabled, _) in enumerate(seen) if enabled]
            raise ValueError(f"{SHARED_HALO_ENV} differs across ranks (on at ranks {on}, off at the others): set it "
                             f"alike for every rank (mpiexec -genv {SHARED_HALO_ENV} 0), or leave it unset")
        if comm.size == 1 or not seen[0][0]:
            return None
        memory = comm.shared_memory()
        if memory is None:
            return None
        return cls(memory, comm.rank, np.array([counts for _, counts in seen], dtype=np.int64))

    def slot_rows(self) -> int:
        """Rows of this rank's slot: its send rows or its halo rows, whichever is more."""
        return int(max(self.rows_between[self.rank].sum(), self.rows_between[:, self.rank].sum()))

    def begin(self, width: int, dtype: torch.dtype, counters) -> SharedExchange:
        """Collective: the next exchange, of rows [width] of dtype, once every rank has read the last one (that
        wait counts in `counters`); grows the regions when its rows are wider."""
        if self.read is not None:
            _timed_wait(self.read, counters)
            self.read = None
        row_bytes = width * dtype.itemsize
        if row_bytes > self.row_bytes:
            self.regions = self.memory.allocate(self.slot_rows() * row_bytes)
            self.row_bytes = row_bytes
        self.used = True
        return SharedExchange(self, width, dtype)


    def close(self) -> None:
        """Collective: wait for the last exchange's readers and free the regions (before MPI finalises); a later
        exchange would allocate them again."""
        if self.read is not None:
            self.read.wait()
            self.read = None
        if self.regions is not None:
            self.memory.free()
            self.regions, self.row_bytes = None, 0


def next_exchange(ex, width: int, dtype: torch.dtype) -> SharedExchange | None:
    """Collective: the exchanger `ex`'s next overlapped exchange in shared memory, or None when it goes through
    its communicator (no shared memory, or a codec that changes the rows on the wire)."""
    if ex.shared is None or not ex.codec.identity:
        return None
    return ex.shared.begin(width, dtype, ex.counters)


@dataclass
class SharedExchange:
    """One exchange's slot in every rank's region."""

    halo: SharedHalo
    width: int
    dtype: torch.dtype

    def rows_of(self, rank: int, start: int, count: int) -> torch.Tensor:
        """Rows [start, start + count) of rank's slot. Shapes: -> [count, width]"""
        row_bytes = self.width * self.dtype.itemsize
        raw = self.halo.regions[rank][start * row_bytes:(start + count) * row_bytes]
        return raw.view(self.dtype).view(count, self.width)

    def outgoing(self, count: int) -> torch.Tensor:
        """This rank's slot, for the rows it sends. Shapes: -> [count, width]"""
        return self.rows_of(self.halo.rank, 0, count)

    def arrive(self, ex, send_counts: np.ndarray) -> Pending:
        """Collective, non-blocking: this rank's rows are written (send_counts[q] of them for rank q); wait()
        returns once every rank's are. Counts, in the exchanger `ex`, what MPI would have moved: the rows to
        peers, at their width; the time in the barrier as communication."""
        ex.beat(ex.activity)
        with torch.profiler.record_function("halo exchange"):
            pending = TimedArrival(self.halo.memory, ex.counters)
        rows = int(np.sum(send_counts) - send_counts[self.halo.rank])
        ex.counters.halo_rows += rows
        ex.counters.halo_bytes += rows * self.width * self.dtype.itemsize
        return pending

    def done_reading(self) -> None:
        """Collective, non-blocking: this rank has read its peers' rows; the next exchange writes once all have."""
        self.halo.read = self.halo.memory.arrive()

    def sent_rows_from_owners(self) -> list[tuple[int, int, torch.Tensor]]:
        """Forward: (owner, first halo row, the rows it sent this rank) for each owner that sends any: the
        owner's boundary rows in this rank's halo order."""
        rows, me = self.halo.rows_between, self.halo.rank
        halo_starts = _starts(rows[:, me])
        send_starts = _starts(rows)
        return [(q, int(halo_starts[q]), self.rows_of(q, int(send_starts[q, me]), int(rows[q, me])))
                for q in range(len(rows)) if rows[q, me] > 0]

    def returned_rows_from_readers(self) -> list[tuple[int, int, torch.Tensor]]:
        """Backward: (reader, first send row, the gradients it returns) for each rank that reads this rank's
        rows: the gradients of this rank's send rows to it, in the send layout's order."""
        rows, me = self.halo.rows_between, self.halo.rank
        send_starts = _starts(rows[me])
        halo_starts = _starts(rows.T)  # [r, q]: where owner q's rows begin in rank r's halo
        return [(r, int(send_starts[r]), self.rows_of(r, int(halo_starts[r, me]), int(rows[me, r])))
                for r in range(len(rows)) if rows[me, r] > 0]


class TimedArrival(Pending):
    """An arrival whose posting, progress and wait count as communication time (wait also as waiting)."""

    def __init__(self, memory: SharedMemory, counters):
        super().__init__()
        self.counters = counters
        start = time.perf_counter()
        self.inner = memory.arrive()
        counters.comm_s += time.perf_counter() - start

    def progress(self) -> None:
        start = time.perf_counter()
        self.inner.progress()
        self.counters.comm_s += time.perf_counter() - start

    def wait(self) -> None:
        _timed_wait(self.inner, self.counters)


def _timed_wait(pending: Pending, counters) -> None:
    start = time.perf_counter()
    with torch.profiler.record_function("wait"):
        pending.wait()
    counters.waited(time.perf_counter() - start)
