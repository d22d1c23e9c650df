"""Halo plans and the differentiable halo exchange.

A `HaloPlan` is built once from a part file and never changes: which owned
rows each peer needs (send lists) and how many halo rows arrive from each
peer (grouped by owner, in the part file's halo order). The exchange moves
exactly those rows and nothing else.

`HaloExchanger.gather` is an autograd function from owned rows [n_owned, F]
to [owned | halo] rows [n_owned + n_halo, F]. Forward: owners send their
boundary rows. Backward: the halo rows' gradients travel back to their owners,
which sum them into the owned rows' gradients (one node may be in many
peers' halos). Buffers are allocated once per (slot, width, dtype) and reused
every epoch; a slot is the layer that owns it, so two layers never share a
buffer that autograd still holds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from gnn_dist.comm import Comm
from partition.format import PartData


@dataclass(frozen=True)
class HaloPlan:
    rank: int
    num_parts: int
    n_owned: int
    n_halo: int
    send_idx: torch.Tensor    # int64 [S]: owned rows to send, grouped by peer
    send_counts: np.ndarray   # int64 [P]: rows to each peer
    recv_counts: np.ndarray   # int64 [P]: halo rows from each peer (halo is grouped by owner)

    @classmethod
    def from_part(cls, part: PartData) -> "HaloPlan":
        num_parts = part.meta.num_parts
        return cls(
            rank=part.part_id,
            num_parts=num_parts,
            n_owned=part.n_owned,
            n_halo=part.n_halo,
            send_idx=torch.from_numpy(part.send_idx),
            send_counts=np.diff(part.send_ptr).astype(np.int64),
            recv_counts=np.bincount(part.halo_owner, minlength=num_parts).astype(np.int64),
        )

    @property
    def rows_sent(self) -> int:
        return int(self.send_counts.sum())


@dataclass
class TrafficCounters:
    """Bytes and rows this rank sent; the trainer resets and reduces them per epoch."""

    halo_bytes: int = 0
    halo_rows: int = 0
    allreduce_bytes: int = 0  # payload this rank contributed to allreduces (0 on a single rank)
    comm_s: float = 0.0       # wall time inside communication calls

    def reset(self) -> None:
        self.halo_bytes = 0
        self.halo_rows = 0
        self.allreduce_bytes = 0
        self.comm_s = 0.0


@dataclass
class HaloExchanger:
    comm: Comm
    plan: HaloPlan
    counters: TrafficCounters = field(default_factory=TrafficCounters)
    _buffers: dict = field(default_factory=dict)

    def _buffer(self, key: tuple, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        full_key = key + (width, dtype)
        buf = self._buffers.get(full_key)
        if buf is None:
            buf = torch.empty(rows, width, dtype=dtype)
            self._buffers[full_key] = buf
        return buf

    def gather(self, x_owned: torch.Tensor, slot: str) -> torch.Tensor:
        """[owned | halo] rows of x; differentiable. Shapes: [n_owned, F] -> [n_owned + n_halo, F]."""
        if self.plan.num_parts == 1:
            return x_owned  # a single rank has no halo: nothing to copy or send
        return _HaloGather.apply(x_owned, self, slot)

    def allreduce_(self, tensor: torch.Tensor) -> None:
        """Sum a tensor over ranks in place (statistics of distributed layers), counting its bytes."""
        if self.comm.size > 1:
            start = time.perf_counter()
            self.comm.allreduce_(tensor)
            self.counters.comm_s += time.perf_counter() - start
            self.counters.allreduce_bytes += tensor.numel() * tensor.element_size()

    def fetch_once(self, x_owned: torch.Tensor) -> torch.Tensor:
        """Halo rows of a tensor that never changes (input features); not differentiable.

        Shapes: [n_owned, F] -> [n_halo, F]
        """
        with torch.no_grad():
            full = _forward_exchange(self, x_owned.contiguous(), ("fetch_once",), fresh=True)
        return full[self.plan.n_owned:]


def _forward_exchange(ex: HaloExchanger, x_owned: torch.Tensor, key: tuple, fresh: bool = False) -> torch.Tensor:
    plan = ex.plan
    width, dtype = x_owned.shape[1], x_owned.dtype
    send = ex._buffer(key + ("send",), plan.rows_sent, width, dtype)
    torch.index_select(x_owned, 0, plan.send_idx, out=send)
    rows = plan.n_owned + plan.n_halo
    full = torch.empty(rows, width, dtype=dtype) if fresh else ex._buffer(key + ("full",), rows, width, dtype)
    full[:plan.n_owned] = x_owned
    start = time.perf_counter()
    sent = ex.comm.alltoallv(send, plan.send_counts, full[plan.n_owned:], plan.recv_counts)
    ex.counters.comm_s += time.perf_counter() - start
    ex.counters.halo_bytes += sent
    ex.counters.halo_rows += plan.rows_sent - int(plan.send_counts[plan.rank])
    return full


class _HaloGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_owned: torch.Tensor, ex: HaloExchanger, slot: str) -> torch.Tensor:  # type: ignore[override]
        ctx.ex = ex
        ctx.slot = slot
        return _forward_exchange(ex, x_owned.contiguous(), (slot,))

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):  # type: ignore[override]
        ex: HaloExchanger = ctx.ex
        plan = ex.plan
        grad_full = grad_full.contiguous()
        width, dtype = grad_full.shape[1], grad_full.dtype
        # The reverse exchange: what arrived as halo goes back; what was sent comes back summed.
        returned = ex._buffer((ctx.slot, "grad_recv"), plan.rows_sent, width, dtype)
        start = time.perf_counter()
        sent = ex.comm.alltoallv(grad_full[plan.n_owned:], plan.recv_counts, returned, plan.send_counts)
        ex.counters.comm_s += time.perf_counter() - start
        ex.counters.halo_bytes += sent
        ex.counters.halo_rows += plan.n_halo - int(plan.recv_counts[plan.rank])
        grad_owned = grad_full[:plan.n_owned].clone()
        grad_owned.index_add_(0, plan.send_idx, returned)
        return grad_owned, None, None
