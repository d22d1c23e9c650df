"""The exact exchange overlapped with the owned rows' share of the aggregation (linear layers, resident halos).

A layer's output rows aggregate over [owned | halo] columns: A X = A_o X_owned
+ A_h X_halo, where A_o holds a row's owned-column entries and A_h its
halo-column ones. The owned rows are known before any byte travels, so the
forward posts the non-blocking exchange of the boundary rows, multiplies
A_o X_owned while they are in flight, waits, and adds A_h X_halo. The backward
does the same the other way round: the halo rows' gradients (rows
[n_owned, n_cols) of A^T times the output gradient) are computed first and
sent back to their owners, and the owned rows' gradient (rows [0, n_owned)
of A^T) is multiplied while they travel.

Nothing of the width [owned | halo] is ever built: the received halo rows are
used and dropped inside the forward, and the backward's halo gradient is
only the halo's rows. An MPI library without a progress thread moves a large
message only inside its own calls, so the owned product runs in row chunks
with a progress call between them.

Both halves read the operator's own arrays: the rows' columns are sorted
(kernels/spmm.py builds them so), so a row's owned entries come first and
`OwnedHaloSplit.mid[r]` is where its halo entries start. The exchange is the
same one `HaloExchanger.exact_forward/backward` make (same rows, codec and
counters), so `wait_s` of the epoch's metrics is the part of the exchange
the product did not hide.

Every rank must take the same path (a blocking collective does not match a
non-blocking one): the choice depends only on the schedule, the device and
GNN_DIST_OVERLAP (0 turns it off, for a side-by-side measurement).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from gnn_dist.halo.shared import next_exchange
from gnn_dist.kernels.spmm import SparseOperator, spmm_into

OVERLAP_ENV = "GNN_DIST_OVERLAP"
# Rows of one piece of an overlapped product: pieces short enough that the transfer gets many progress calls,
# long enough that a call's cost (microseconds) stays far below the piece's (a 256-wide row is about 1 us).
CHUNK_ROWS = 2048


def overlap_enabled() -> bool:
    """Whether exact exchanges overlap the owned product (GNN_DIST_OVERLAP=0 turns it off)."""
    return os.environ.get(OVERLAP_ENV, "1").strip() not in ("0", "off", "false", "no")


def overlaps(schedule_kind: str, attention: bool, sequential: bool, device: str, enabled: bool | None = None) -> bool:
    """Whether a layer's training exchange runs overlapped: an exact exchange of resident halos on the host
    under a linear aggregation (an attention layer needs its [owned | halo] rows whole for its scores), with
    overlap enabled (None: as GNN_DIST_OVERLAP says). The memory plan asks this too."""
    return (schedule_kind == "exact" and not attention and not sequential and device == "cpu"
            and (overlap_enabled() if enabled is None else enabled))


def agreed_overlap(comm) -> bool:
    """GNN_DIST_OVERLAP as every rank sees it; ValueError naming the fix when ranks see it differently (their
    exchanges would not match, blocking against non-blocking, and the job would hang)."""
    seen = comm.allgather_object(overlap_enabled())
    if len(set(seen)) > 1:
        on = [rank for rank, value in enumerate(seen) if value]
        raise ValueError(f"{OVERLAP_ENV} differs across ranks (overlap on at ranks {on}, off at the others): set "
                         f"it alike for every rank (mpiexec -genv {OVERLAP_ENV} 0), or leave it unset")
    return seen[0]


@dataclass(frozen=True)
class OwnedHaloSplit:
    """A part's operator (rows: owned nodes; columns: [owned | halo]) and where each row's owned-column entries
    end: row r's owned entries are [begin[r], mid[r]), its halo entries [mid[r], end[r]).

    Shapes: begin, mid, end: [n_owned] (the operator's index dtype)
    """

    operator: SparseOperator
    n_owned: int
    begin: torch.Tensor
    mid: torch.Tensor
    end: torch.Tensor

    @classmethod
    def of(cls, operator: SparseOperator, n_owned: int) -> OwnedHaloSplit:
        return cls(operator, n_owned, *operator.column_ranges(n_owned))

    def entries_between(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(begin, end) of each row's entries in columns [lo, hi), for n_owned <= lo <= hi: one owner's halo
        columns (the halo is grouped by owner). Found once per operator and boundary."""
        return self.operator.column_ranges(lo)[1], self.operator.column_ranges(hi)[1]

    def halo_gradient_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(begin, end) of the transpose's halo rows [n_owned, n_cols): each halo row's entries."""
        crow_t = self.operator.transpose.crow_indices()
        return crow_t[self.n_owned:-1], crow_t[self.n_owned + 1:]


def overlapped_aggregation(operator: SparseOperator, ex, x_owned: torch.Tensor, bias: torch.Tensor | None,
                           slot: str) -> torch.Tensor:
    """operator @ [x_owned | exact halo rows] (+ bias), the exchange hidden behind the owned product;
    differentiable in x_owned and bias. Shapes: [n_owned, F] -> [n_owned, F]"""
    split = OwnedHaloSplit.of(operator, ex.plan.n_owned)  # the operator keeps its ranges: found once
    return _OverlappedAggregation.apply(x_owned.contiguous(), bias, ex, split, slot)


def _in_chunks(n_rows: int, pending, multiply, shared: bool = False) -> None:
    """multiply(start, stop) over row chunks, letting the transfer advance between them; in one piece when the
    rows go through shared memory (no bytes for MPI to move: its barrier completes in the wait)."""
    step = max(n_rows, 1) if shared else CHUNK_ROWS
    for start in range(0, n_rows, step):
        multiply(start, min(start + step, n_rows))
        pending.progress()


def _forward(ex, split: OwnedHaloSplit, x_owned: torch.Tensor, bias: torch.Tensor | None, slot: str) -> torch.Tensor:
    plan = ex.plan
    width = x_owned.shape[1]
    ex.activity = f"epoch {ex.epoch}: {slot} forward halo exchange"
    shared = next_exchange(ex, width, x_owned.dtype)
    if shared is not None:  # the peers multiply these rows where they lie (gnn_dist.halo.shared)
        torch.index_select(x_owned, 0, plan.send_idx, out=shared.outgoing(plan.rows_sent))
        pending = shared.arrive(ex, plan.send_counts)
    else:
        send = ex.buffer(("send",), plan.rows_sent, width, x_owned.dtype)
        torch.index_select(x_owned, 0, plan.send_idx, out=send)
        halo = torch.empty(plan.n_halo, width, dtype=x_owned.dtype, device=x_owned.device)
        pending = ex.send_rows(send, plan.send_counts, halo, plan.recv_counts, blocking=False)
    out = torch.empty(plan.n_owned, width, dtype=x_owned.dtype, device=x_owned.device)
    matrix = split.operator.matrix
    with torch.profiler.record_function("spmm"):
        _in_chunks(plan.n_owned, pending, lambda a, b: spmm_into(
            matrix, split.begin[a:b], split.mid[a:b], x_owned, out[a:b], bias=bias), shared is not None)
    pending.wait()
    with torch.profiler.record_function("spmm"):
        if shared is None:
            spmm_into(matrix, split.mid, split.end, halo, out, col_offset=plan.n_owned, accumulate=True)
        else:  # each owner's columns from its own region
            for _, first, rows in shared.sent_rows_from_owners():
                lo, hi = split.entries_between(plan.n_owned + first, plan.n_owned + first + rows.shape[0])
                spmm_into(matrix, lo, hi, rows, out, col_offset=plan.n_owned + first, accumulate=True)
            shared.done_reading()
    return out


def _backward(ex, split: OwnedHaloSplit, grad_out: torch.Tensor, slot: str) -> torch.Tensor:
    plan = ex.plan
    width = grad_out.shape[1]
    ex.activity = f"epoch {ex.epoch}: {slot} backward halo exchange"
    transpose = split.operator.transpose
    crow_t = transpose.crow_indices()
    shared = next_exchange(ex, width, grad_out.dtype)
    grad_halo = shared.outgoing(plan.n_halo) if shared is not None \
        else torch.empty(plan.n_halo, width, dtype=grad_out.dtype, device=grad_out.device)
    with torch.profiler.record_function("spmm"):
        spmm_into(transpose, *split.halo_gradient_rows(), grad_out, grad_halo)
    if shared is not None:  # the owners add these gradients from this rank's region (gnn_dist.halo.shared)
        pending = shared.arrive(ex, plan.recv_counts)
    else:
        returned = ex.buffer(("grad_recv",), plan.rows_sent, width, grad_out.dtype)
        pending = ex.send_rows(grad_halo, plan.recv_counts, returned, plan.send_counts, blocking=False)
    grad_owned = torch.empty(plan.n_owned, width, dtype=grad_out.dtype, device=grad_out.device)
    with torch.profiler.record_function("spmm"):
        _in_chunks(plan.n_owned, pending, lambda a, b: spmm_into(
            transpose, crow_t[a:b], crow_t[a + 1:b + 1], grad_out, grad_owned[a:b]), shared is not None)
    pending.wait()
    # one owned row may be in several peers' halos
    if shared is None:
        grad_owned.index_add_(0, plan.send_idx, returned)
    else:
        for _, first, rows in shared.returned_rows_from_readers():
            grad_owned.index_add_(0, plan.send_idx[first:first + rows.shape[0]], rows)
        shared.done_reading()
    return grad_owned


class _OverlappedAggregation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_owned, bias, ex, split, slot):  # type: ignore[override]
        ctx.ex, ctx.split, ctx.slot = ex, split, slot
        return _forward(ex, split, x_owned, bias, slot)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        grad_out = grad_out.contiguous()
        grad_owned = _backward(ctx.ex, ctx.split, grad_out, ctx.slot) if ctx.needs_input_grad[0] else None
        grad_bias = grad_out.sum(0) if ctx.needs_input_grad[1] else None
        return grad_owned, grad_bias, None, None, None
