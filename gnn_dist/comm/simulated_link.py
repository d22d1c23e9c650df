"""A modelled network (`--simulate-link GBPS[,LATENCY_US]`): what a schedule buys on a slower link than this host's.

Ranks on one host exchange through shared memory, so sending fewer bytes
barely changes the time here. With a link model every halo exchange, feature
fetch and gradient allreduce of training takes at least

    latency + bytes / bandwidth

where bytes are what this rank puts on the wire (an allreduce counts a ring's
2 (P - 1) / P of the buffer): when the real exchange is faster, the rank
sleeps for the rest. A non-blocking exchange (the pipeline schedule) stays
non-blocking: its wait() returns no earlier than the modelled time after it
started, so compute that overlaps it hides the link as it would on a cluster.
Every figure measured under it is labelled "modelled" (the final record's
`simulated_link`, the CLI's final line). The one-off fetch of halo input
features is modelled too; set-up's metadata collectives and the broadcast of
the initial weights are not.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from gnn_dist.comm.communicator import Comm, CommWrapper


@dataclass(frozen=True)
class LinkModel:
    gbps: float
    latency_us: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> LinkModel:
        """'10' (Gb/s) or '10,5' (Gb/s, microseconds); ValueError naming the form otherwise."""
        try:
            values = [float(v) for v in spec.split(",")]
        except ValueError:
            values = []
        if len(values) not in (1, 2) or values[0] <= 0 or (len(values) == 2 and values[1] < 0):
            raise ValueError(f"bad --simulate-link {spec!r}: use GBPS or GBPS,LATENCY_US with GBPS > 0 (e.g. 10 or "
                             f"10,5 for 10 Gb/s and 5 us)")
        return cls(*values)

    def seconds(self, nbytes: int) -> float:
        return self.latency_us * 1e-6 + nbytes * 8 / (self.gbps * 1e9)

    def label(self) -> str:
        return f"{self.gbps:g} Gb/s, {self.latency_us:g} us latency (modelled)"


class _ModelledPending:
    def __init__(self, inner, ready_at: float):
        self.inner = inner
        self.ready_at = ready_at

    def wait(self) -> None:
        self.inner.wait()
        remaining = self.ready_at - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)

    def progress(self) -> None:
        self.inner.progress()


class ModelledLinkComm(CommWrapper):
    """`inner` with every data exchange held to the link model's time (the rest is passed through)."""

    def __init__(self, inner: Comm, link: LinkModel):
        super().__init__(inner)
        self.link = link
        self.modelled_wait_s = 0.0  # time spent sleeping for the model (what the real link did not take)

    def _hold(self, start: float, nbytes: int) -> None:
        remaining = start + self.link.seconds(nbytes) - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
            self.modelled_wait_s += remaining

    def alltoallv(self, send, send_counts, recv, recv_counts) -> int:
        start = time.perf_counter()
        sent = self.inner.alltoallv(send, send_counts, recv, recv_counts)
        self._hold(start, sent)
        return sent

    def ialltoallv(self, send, send_counts, recv, recv_counts):
        start = time.perf_counter()
        pending, sent = self.inner.ialltoallv(send, send_counts, recv, recv_counts)
        return _ModelledPending(pending, start + self.link.seconds(sent)), sent

    def isend(self, send, dest, tag):
        start = time.perf_counter()
        pending = self.inner.isend(send, dest, tag)
        return _ModelledPending(pending, start + self.link.seconds(send.numel() * send.element_size()))

    def irecv(self, recv, source, tag):
        # the bytes arrive no earlier than the link could carry them from the time the receive was posted
        start = time.perf_counter()
        pending = self.inner.irecv(recv, source, tag)
        return _ModelledPending(pending, start + self.link.seconds(recv.numel() * recv.element_size()))

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> None:
        start = time.perf_counter()
        self.inner.allreduce_(tensor, op)
        if self.size > 1:
            self._hold(start, int(2 * (self.size - 1) / self.size * tensor.numel() * tensor.element_size()))
