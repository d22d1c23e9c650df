"""Device tensors through host memory: a communicator wrapper for ranks that compute on a GPU.

MPI reads and writes host memory unless it is CUDA-aware. `StagedComm` wraps
any `Comm` so the runtime can hand it device tensors all the same: each
exchange copies the device rows into a page-locked ("pinned") host buffer,
runs the inner exchange on host buffers, and copies what arrived back to the
device. The copies run on a side CUDA stream, ordered after the compute that
produced the rows (an event on the compute stream) and before the compute
that reads them (the compute stream waits on the side stream's event), so a
non-blocking exchange (the pipeline schedule) still overlaps compute: the
copy back is queued when its `wait()` is called, not before.

Host buffers are kept and reused every epoch (the smallest free one that fits), like the
workspace allocator does for the host heap: the steady state pins no new
memory (pinning is slow, and pinned pages cannot be swapped).

`GNN_DIST_STAGING=always` stages host tensors too (through separate host
buffers), so the copy-in / copy-out logic runs, and is tested, on a machine
without a GPU: the results must be bit-identical to the unstaged run.
"""
from __future__ import annotations

import os

import torch

from gnn_dist.comm.communicator import Comm, CommWrapper, Pending

STAGING_ENV = "GNN_DIST_STAGING"
# Headroom of a host buffer made to replace one too small: payload sizes vary from step to step (bns, adaptive,
# sampled batches), and pinning memory is slow.
GROWTH = 1.25


def staging_forced() -> bool:
    """GNN_DIST_STAGING=always: stage host tensors too (tests of the staged path without a GPU)."""
    value = os.environ.get(STAGING_ENV, "")
    if value not in ("", "auto", "always"):
        raise ValueError(f"bad {STAGING_ENV}={value!r}: use auto (stage device tensors only) or always")
    return value == "always"


class _Buffers:
    """Host buffers reused across exchanges and epochs; pinned when a GPU is there to copy from.

    A request takes the smallest free buffer that holds it. When none does, the largest free one (too small)
    is dropped and a new buffer made in its place, with GROWTH headroom if it replaces one: bns, adaptive and
    sampled mode send a different number of rows every epoch, and a pool keyed by exact size would keep a
    buffer for every size it ever saw, pinned, for the whole run. This way the pool holds at most as many
    buffers as were ever in use at once, each at most GROWTH times the largest payload it served.
    """

    def __init__(self, pin: bool):
        self.pin = pin
        self._free: list[torch.Tensor] = []  # raw uint8 buffers
        self.held_bytes = 0  # every buffer the pool owns, free or in use: what it adds to the host's memory
        self.buffers = 0
        self.made = 0  # buffers allocated (pinned, on a GPU) over the run: few once the sizes have been seen

    def take(self, like: torch.Tensor) -> torch.Tensor:
        nbytes = like.numel() * like.element_size()
        fits = [k for k, raw in enumerate(self._free) if raw.numel() >= nbytes]
        if fits:
            raw = self._free.pop(min(fits, key=lambda k: self._free[k].numel()))
        else:
            size = nbytes
            if self._free:
                replaced = self._free.pop(max(range(len(self._free)), key=lambda k: self._free[k].numel()))
                self.held_bytes -= replaced.numel()
                self.buffers -= 1
                size = int(nbytes * GROWTH)
            raw = torch.empty(size, dtype=torch.uint8, device="cpu", pin_memory=self.pin)
            self.held_bytes += size
            self.buffers += 1
            self.made += 1
        return raw[:nbytes].view(like.dtype).view(like.shape)

    def give_back(self, buffer: torch.Tensor) -> None:
        whole = buffer.untyped_storage()
        self._free.append(torch.empty(0, dtype=torch.uint8).set_(whole))


class _Streams:
    """The side stream the copies run on, and the ordering against the compute stream (no-ops on host)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device) if self.cuda else None

    def to_host(self, source: torch.Tensor, host: torch.Tensor) -> None:
        if not self.cuda:
            host.copy_(source)
            return
        self.side.wait_stream(torch.cuda.current_stream(source.device))  # the rows are computed
        with torch.cuda.stream(self.side):
            host.copy_(source, non_blocking=True)
        self.side.synchronize()  # MPI reads the host buffer next

    def to_device(self, host: torch.Tensor, target: torch.Tensor) -> None:
        if not self.cuda:
            target.copy_(host)
            return
        with torch.cuda.stream(self.side):
            target.copy_(host, non_blocking=True)
            target.record_stream(self.side)
        torch.cuda.current_stream(target.device).wait_stream(self.side)  # compute reads them after the copy

    def settle(self) -> None:
        """Wait until the copies queued so far have read their host buffers, so the buffers may be reused (MPI
        writes into a reused buffer from the host, which no stream orders)."""
        if self.cuda:
            self.side.synchronize()


class _StagedPending(Pending):
    """Completes the inner exchange, then copies the received rows back and returns the host buffers."""

    def __init__(self, staged: StagedComm, inner: Pending, landing: list[tuple[torch.Tensor, torch.Tensor]],
                 held: list[torch.Tensor]):
        super().__init__()
        self._staged = staged
        self._inner = inner
        self._landing = landing
        self._held = held

    def wait(self) -> None:
        if self._inner is None:
            return
        self._inner.wait()
        self._inner = None
        for host, target in self._landing:
            self._staged.streams.to_device(host, target)
        if self._landing:
            self._staged.streams.settle()
        for buffer in self._held:
            self._staged.buffers.give_back(buffer)
        self._landing, self._held = [], []

    def progress(self) -> None:
        if self._inner is not None:
            self._inner.progress()


class StagedComm(CommWrapper):
    """`inner` with device tensors staged through reusable host buffers (module docstring)."""

    def __init__(self, inner: Comm, device: torch.device, always: bool = False):
        super().__init__(inner)
        self.device = device
        self.always = always
        self.buffers = _Buffers(pin=device.type == "cuda")
        self.streams = _Streams(device)
        self.staged_bytes = 0  # bytes copied between device and host (both directions)

    def _stages(self, tensor: torch.Tensor) -> bool:
        return self.always or tensor.device.type != "cpu"

    def _out(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of `tensor` to send from (the tensor itself when it need not be staged)."""
        if not self._stages(tensor):
            return tensor
        host = self.buffers.take(tensor)
        self.streams.to_host(tensor, host)
        self.staged_bytes += host.numel() * host.element_size()
        return host

    def _in(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.buffers.take(tensor) if self._stages(tensor) else tensor

    def _back(self, host: torch.Tensor, target: torch.Tensor) -> None:
        if host is not target:
            self.streams.to_device(host, target)
            self.staged_bytes += host.numel() * host.element_size()
            self.streams.settle()
            self.buffers.give_back(host)

    def _release(self, host: torch.Tensor, original: torch.Tensor) -> None:
        if host is not original:
            self.buffers.give_back(host)

    def alltoallv(self, send, send_counts, recv, recv_counts) -> int:
        send_host, recv_host = self._out(send), self._in(recv)
        sent = self.inner.alltoallv(send_host, send_counts, recv_host, recv_counts)
        self._release(send_host, send)
        self._back(recv_host, recv)
        return sent

    def ialltoallv(self, send, send_counts, recv, recv_counts):
        send_host, recv_host = self._out(send), self._in(recv)
        pending, sent = self.inner.ialltoallv(send_host, send_counts, recv_host, recv_counts)
        return self._pending(pending, [(recv_host, recv)], [send_host], [send]), sent

    def isend(self, send, dest, tag):
        send_host = self._out(send)
        return self._pending(self.inner.isend(send_host, dest, tag), [], [send_host], [send])

    def irecv(self, recv, source, tag):
        recv_host = self._in(recv)
        return self._pending(self.inner.irecv(recv_host, source, tag), [(recv_host, recv)], [], [])

    def _pending(self, inner: Pending, landing: list, sent_hosts: list, originals: list) -> Pending:
        staged_landing = [(host, target) for host, target in landing if host is not target]
        held = [host for host, original in zip(sent_hosts, originals) if host is not original]
        held += [host for host, _ in staged_landing]
        if not staged_landing and not held:
            return inner
        self.staged_bytes += sum(host.numel() * host.element_size() for host, _ in staged_landing)
        return _StagedPending(self, inner, staged_landing, held)

    def allreduce_(self, tensor, op="sum") -> None:
        host = self._out(tensor)
        self.inner.allreduce_(host, op)
        self._back(host, tensor)

    def bcast_(self, tensor, root=0) -> None:
        host = self._out(tensor)
        self.inner.bcast_(host, root)
        self._back(host, tensor)


class BatchMover:
    """A sampled batch's host tensors to the device: through host buffers kept from step to step (pinned when a
    GPU is there), copied on the side stream without blocking, so that the copies of the next batch overlap the
    device's compute of this one (gnn_dist.steps.mini_batch prepares it while this one trains).

    One buffer per tensor position of a batch (features, node ids, each block's edges), grown by a quarter when
    a batch needs more and never shrunk: batches differ in size every step, and pinning memory is slow. Active
    on a GPU, and with GNN_DIST_STAGING=always (on the host, so the tests exercise it); otherwise it hands the
    tensors back untouched."""

    def __init__(self, device: torch.device, always: bool = False):
        self.device = device
        self.active = device.type == "cuda" or always
        self.pin = device.type == "cuda"
        self.streams = _Streams(device)
        self.host: list[torch.Tensor] = []  # raw bytes, one buffer per tensor position
        self.moved_bytes = 0

    def move(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self.active:
            return list(tensors)
        self.streams.settle()  # the last batch's copies have read the buffers that are refilled now
        moved = []
        for position, tensor in enumerate(tensors):
            nbytes = tensor.numel() * tensor.element_size()
            if position == len(self.host):
                self.host.append(torch.empty(0, dtype=torch.uint8, device="cpu"))
            if self.host[position].numel() < nbytes:
                self.host[position] = torch.empty(int(nbytes * GROWTH), dtype=torch.uint8, device="cpu",
                                                  pin_memory=self.pin)
            host = self.host[position][:nbytes].view(tensor.dtype).view(tensor.shape)
            host.copy_(tensor)
            target = torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device)
            self.streams.to_device(host, target)
            self.moved_bytes += nbytes
            moved.append(target)
        return moved


def staging_host_bytes(comm: Comm, mover: BatchMover | None = None) -> int | None:
    """The host buffers a rank's staging holds (pinned on a GPU): its communicator's pool and its batch
    mover's; None when nothing is staged (CPUs)."""
    pool = comm.buffers.held_bytes if isinstance(comm, StagedComm) else None
    moved = sum(raw.numel() for raw in mover.host) if mover is not None and mover.active else None
    if pool is None and moved is None:
        return None
    return (pool or 0) + (moved or 0)
