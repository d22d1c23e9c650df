"""Sequential halo aggregation (`--halo-memory sequential`): one block of halo rows alive at a time.

Resident aggregation (gnn_dist.halo.exchange) receives a layer's whole halo into an
[owned | halo] tensor and multiplies it by the part's operator, and its
backward builds the whole [owned | halo] gradient. On graphs whose halo is
as large as the owned set, that is the whole graph again per rank. Here the
operator is split by columns instead (SAR's sequential aggregation):

    out = A_owned @ X_owned + sum over blocks b of A_b @ X_b

where block b is a contiguous range of halo columns: the rows one peer sends,
cut into pieces of at most `--halo-block-rows` rows. Each block is received,
multiplied into the owned output and freed before the next one travels.

No halo rows are needed in the backward pass, so none are fetched again:
for GCN and GraphSAGE the aggregation is linear with a constant operator, so
dX_b = A_b^T dY is computed block by block from the output gradient alone
and sent back to the block's owner. Sequential mode therefore sends exactly
the rows and bytes of resident mode; only the number of messages grows.

Steps: in round r every rank sends to (rank + r) % P and receives from
(rank - r) % P; a round whose largest block exceeds the row bound is cut
into sub-rounds, agreed once at set-up from the P x P matrix of send counts.
Blocks travel point to point (Isend/Irecv, only between ranks that share
rows, no collective per round), and each exchange's transfer starts one exchange
ahead, so the next block is on the wire while this one is multiplied.

Schedules: what a block carries, and what it is aggregated with, is the
schedule's (its `BlockPass`): the rows just received (exact), a cache of the
rows last received (stale, adaptive), last epoch's rows while this epoch's
travel (pipeline), or the sampled rows only (bns). Each keeps its state per
block range of one halo-sized buffer at most, never an [owned | halo] tensor.

`ex` below is the rank's gnn_dist.halo.exchange.HaloExchanger (this module sits beneath it: the exchanger's
exact schedule builds a BlockPass, so naming its class here would make the two modules import each other).

Shapes:
    BlockedOperator.owned: [n_owned, n_owned] (a typed layer's: [its relation rows, n_owned]);
    block.operator: [rows_b, cols_b] over its nonempty rows
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gnn_dist.comm.communicator import Pending
from gnn_dist.kernels.spmm import SparseOperator, csr_matmul, spmm


@dataclass(frozen=True)
class HaloBlock:
    """Halo columns [col_start, col_stop) (indices into the halo) and their share of the operator.

    rows: the owned rows with an entry in these columns (int64, ascending);
    operator: [len(rows), cols] forward, with its transpose for the backward.
    """

    col_start: int
    col_stop: int
    rows: torch.Tensor
    operator: SparseOperator


@dataclass(frozen=True)
class BlockExchange:
    """One collective: send rows send_idx[send_start:send_stop] to dest, receive halo block `block` from src."""

    dest: int
    send_start: int
    send_stop: int
    src: int
    block: HaloBlock


@dataclass(frozen=True)
class BlockedOperator:
    """A part's operator split into its owned columns and blocks of halo columns, with its block exchanges."""

    owned: SparseOperator
    exchanges: tuple[BlockExchange, ...]

    @property
    def blocks(self) -> tuple[HaloBlock, ...]:
        return tuple(exchange.block for exchange in self.exchanges)


def exchange_rounds(send_counts: np.ndarray, block_rows: int) -> list[tuple[int, int]]:
    """(round r, sub-round s) of every collective, the same list on every rank.

    send_counts: int64 [P, P], rows rank i sends to rank j. block_rows 0 means
    one sub-round per round (a peer's whole block at once).
    """
    num_parts = send_counts.shape[0]
    rounds = []
    for r in range(1, num_parts):
        largest = max(int(send_counts[i, (i + r) % num_parts]) for i in range(num_parts))
        subs = 1 if block_rows <= 0 or largest == 0 else -(-largest // block_rows)
        rounds += [(r, s) for s in range(subs)]
    return rounds


def build_blocked_operator(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, n_owned: int,
                           rank: int, send_counts_matrix: np.ndarray, recv_counts: np.ndarray,
                           block_rows: int, n_rows: int | None = None) -> BlockedOperator:
    """Split the COO entries of a part's normalised operator (columns over [owned | halo]) into blocks.

    recv_counts[q]: halo rows owned by q (the halo is grouped by owner, so q's
    rows are one contiguous column range). n_rows: the operator's rows, n_owned by default (a typed layer's
    stacked relation blocks have a row per (relation, node reached): gnn_dist.hetero.typed_part).
    """
    num_parts = send_counts_matrix.shape[0]
    owned_mask = cols < n_owned
    owned = SparseOperator.from_coo(rows[owned_mask], cols[owned_mask], values[owned_mask],
                                    (n_owned if n_rows is None else n_rows, n_owned))
    halo_rows, halo_cols, halo_values = rows[~owned_mask], cols[~owned_mask] - n_owned, values[~owned_mask]
    del owned_mask
    order = torch.argsort(halo_cols, stable=True)
    halo_rows, halo_cols, halo_values = halo_rows[order], halo_cols[order], halo_values[order]
    del order
    recv_start = np.concatenate([[0], np.cumsum(recv_counts)])
    send_start = np.concatenate([[0], np.cumsum(send_counts_matrix[rank])])
    exchanges = []
    for r, s in exchange_rounds(send_counts_matrix, block_rows):
        dest, src = (rank + r) % num_parts, (rank - r) % num_parts
        sent = int(send_counts_matrix[rank, dest])
        received = int(recv_counts[src])
        width = block_rows if block_rows > 0 else max(sent, received, 1)
        s_lo, s_hi = min(s * width, sent), min((s + 1) * width, sent)
        c_lo = int(recv_start[src]) + min(s * width, received)
        c_hi = int(recv_start[src]) + min((s + 1) * width, received)
        lo, hi = (int(v) for v in torch.searchsorted(halo_cols, torch.tensor([c_lo, c_hi], device=halo_cols.device)))
        block_rows_of = halo_rows[lo:hi]
        row_ids, compact_rows = torch.unique(block_rows_of, sorted=True, return_inverse=True)
        operator = SparseOperator.from_coo(compact_rows, halo_cols[lo:hi] - c_lo, halo_values[lo:hi],
                                           (int(row_ids.shape[0]), c_hi - c_lo))
        exchanges.append(BlockExchange(dest, int(send_start[dest]) + s_lo, int(send_start[dest]) + s_hi, src,
                          HaloBlock(c_lo, c_hi, row_ids, operator)))
    return BlockedOperator(owned=owned, exchanges=tuple(exchanges))


def row_masses(operator: SparseOperator | BlockedOperator, column_weights: torch.Tensor) -> torch.Tensor:
    """Each owned row's sum of its entries weighted by column: A @ w, from a part's whole operator (resident
    halos) or from its column blocks (sequential halos). Not differentiated (a schedule's constant).

    Shapes: column_weights [n_owned + n_halo] -> [n_owned]
    """
    weights = column_weights.reshape(-1, 1)
    with torch.no_grad():
        if isinstance(operator, SparseOperator):
            return csr_matmul(operator.matrix, weights).reshape(-1)
        n_owned = operator.owned.shape[0]
        masses = csr_matmul(operator.owned.matrix, weights[:n_owned])
        for block in operator.blocks:
            if block.rows.numel():
                columns = weights[n_owned + block.col_start:n_owned + block.col_stop]
                masses.index_add_(0, block.rows, csr_matmul(block.operator.matrix, columns))
        return masses.reshape(-1)


FORWARD_ROWS, BACKWARD_GRADIENTS, ROWS_AGAIN = 0, 1, 2  # what a block message carries (its MPI tag's low bits)


def message_tag(slot: str, purpose: int) -> int:
    """The point-to-point tag of slot's messages of one purpose: messages of one (peer, tag) arrive in the order
    they were sent, so a layer's blocks, and a pipelined layer's epochs, never mix."""
    return int(slot.removeprefix("layer")) * 4 + purpose


class BlockPass:
    """How a schedule moves one layer's halo blocks in one pass (this base: the exact exchange).

    The driver (`aggregate_exchanged`) owns the transfers; for every block exchange, in order, it asks
        out_rows(exchange)              rows to send to exchange.dest (None: nothing travels)
        in_buffer(exchange)             where exchange's block from exchange.src lands (None: nothing travels)
        block_rows(exchange, got)       the rows the block is aggregated with (got: what arrived, or None)
    and in the backward
        begin_backward()
        out_gradients(exchange, g)      the gradient rows of exchange's block to send to exchange.src (None: nothing)
        in_gradients(exchange, like)    (buffer, the owned rows they belong to) for what exchange.dest returns, or None
        finish_backward(grad_x)     anything left to add (a pipeline's gradients of the epoch before)
    A pass that `defers` leaves its transfers in flight when it returns: the driver hands each one to
    keep(), and the schedule waits for them itself (next epoch, or in drain()).
    """

    defers = False

    def __init__(self, ex, x_owned: torch.Tensor | None):
        self.ex = ex
        self.plan = ex.plan
        self.x_owned = x_owned
        # what the backward may allocate alike (width, dtype, device): the autograd context keeps this pass
        # until the backward, and keeping x_owned itself would hold a whole [n_owned, F] input per layer
        # alive through the rest of the forward, which a linear aggregation's backward never reads
        self.like = x_owned.new_empty(0, x_owned.shape[1]) if x_owned is not None else None

    def end_forward(self) -> None:
        """The forward's last use of x_owned: let it go."""
        self.x_owned = None

    def send_range(self, exchange: BlockExchange) -> torch.Tensor:
        return self.plan.send_idx[exchange.send_start:exchange.send_stop]

    def out_rows(self, exchange: BlockExchange) -> torch.Tensor | None:
        return self.x_owned.index_select(0, self.send_range(exchange))

    def in_buffer(self, exchange: BlockExchange) -> torch.Tensor | None:
        block = exchange.block
        return self.x_owned.new_empty(block.col_stop - block.col_start, self.x_owned.shape[1])

    def block_rows(self, exchange: BlockExchange, received: torch.Tensor | None) -> torch.Tensor | None:
        return received

    def begin_backward(self) -> None:
        pass

    def out_gradients(self, exchange: BlockExchange, grad_block: torch.Tensor) -> torch.Tensor | None:
        return grad_block

    def in_gradients(self, exchange: BlockExchange, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        rows = self.send_range(exchange)
        return like.new_empty(rows.shape[0], like.shape[1]), rows

    def finish_backward(self, grad_x: torch.Tensor) -> None:
        pass

    def keep(self, pending: Pending) -> None:
        raise RuntimeError(f"{type(self).__name__} defers no transfer")


def aggregate_exchanged(blocked: BlockedOperator, exchanger, x_owned: torch.Tensor,
                        bias: torch.Tensor | None, slot: str) -> torch.Tensor:
    """A @ [X_owned | X_halo] (+ bias), the halo rows arriving block by block; differentiable in X and bias.

    The schedule in force (exchanger.active_schedule) decides what each block's transfer carries and what the
    block is aggregated with (its BlockPass: received rows, or its own cached ones).

    Shapes: x_owned [n_owned, F] -> [n_owned, F]
    """
    return _SequentialAggregate.apply(x_owned.contiguous(), bias, blocked, exchanger, slot)


def aggregate_local(blocked: BlockedOperator, owned_source: torch.Tensor, halo_source, bias: torch.Tensor | None
                    ) -> torch.Tensor:
    """A @ [owned_source | halo rows] with halo rows known locally (the cached input features): no exchange.

    halo_source(start, stop) returns the source rows of halo columns [start, stop),
    made only when their block is aggregated (dropout and the layer's transform
    run per block). Differentiable through both sources.

    Shapes: owned_source [n_owned, F] -> [n_owned, F]
    """
    out = spmm(blocked.owned, owned_source, bias)
    for block in blocked.blocks:
        if block.col_stop == block.col_start:
            continue
        contribution = spmm(block.operator, halo_source(block.col_start, block.col_stop))
        out = out.index_add(0, block.rows, contribution) if contribution.requires_grad or out.requires_grad \
            else out.index_add_(0, block.rows, contribution)
    return out


def post_transfers(transfers: BlockPass, rows: torch.Tensor | None, dest: int, buffer: torch.Tensor | None, src: int,
          tag: int) -> tuple[list[Pending], Pending | None]:
    """Start one exchange's transfers: (the sends to wait for within the pass, the receive to wait for, or None).
    A deferring pass keeps them all in flight instead."""
    ex = transfers.ex
    pendings = []
    if rows is not None and rows.shape[0]:
        pendings.append(ex.send_block(rows, dest, tag))
    receive = ex.receive_block(buffer, src, tag) if buffer is not None and buffer.shape[0] else None
    if transfers.defers:
        for pending in pendings + ([receive] if receive is not None else []):
            transfers.keep(pending)
        return [], None
    return pendings, receive


class _SequentialAggregate(torch.autograd.Function):
    """Each exchange's transfers start one exchange ahead, so the next block travels while this one is multiplied:
    point-to-point messages, only between ranks that share halo rows."""

    @staticmethod
    def forward(ctx, x_owned, bias, blocked: BlockedOperator, ex, slot: str):  # type: ignore[override]
        transfers = ex.active_schedule(slot).block_pass(ex, slot, x_owned)
        ctx.blocked, ctx.ex, ctx.slot, ctx.has_bias, ctx.transfers = blocked, ex, slot, bias is not None, transfers
        ex.activity = f"epoch {ex.epoch}: {slot} sequential forward halo exchange"
        tag = message_tag(slot, FORWARD_ROWS)

        def post(exchange: BlockExchange):
            buffer = transfers.in_buffer(exchange) if exchange.block.col_stop > exchange.block.col_start else None
            rows = transfers.out_rows(exchange) if exchange.send_stop > exchange.send_start else None
            sends, receive = post_transfers(transfers, rows, exchange.dest, buffer, exchange.src, tag)
            return sends, receive, buffer

        exchanges = blocked.exchanges
        ahead = post(exchanges[0]) if exchanges else None
        out = csr_matmul(blocked.owned.matrix, x_owned, bias)  # the owned columns, while the first block travels
        for k, exchange in enumerate(exchanges):
            sends, receive, buffer = ahead
            ahead = post(exchanges[k + 1]) if k + 1 < len(exchanges) else None
            if receive is not None:
                receive.wait()
            rows = transfers.block_rows(exchange, buffer if receive is not None else None)
            if rows is not None and rows.shape[0] and exchange.block.rows.numel():
                out.index_add_(0, exchange.block.rows, csr_matmul(exchange.block.operator.matrix, rows))
            del rows, buffer
            for sending in sends:
                sending.wait()
        transfers.end_forward()
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        blocked, ex, transfers = ctx.blocked, ctx.ex, ctx.transfers
        grad_out = grad_out.contiguous()
        ex.activity = f"epoch {ex.epoch}: {ctx.slot} sequential backward halo exchange"
        tag = message_tag(ctx.slot, BACKWARD_GRADIENTS)
        transfers.begin_backward()

        def post_receive(exchange: BlockExchange):
            incoming = transfers.in_gradients(exchange, grad_out) if exchange.send_stop > exchange.send_start else None
            _, receive = post_transfers(transfers, None, exchange.dest, incoming[0] if incoming else None, exchange.dest, tag)
            return receive, incoming

        exchanges = blocked.exchanges
        ahead = post_receive(exchanges[0]) if exchanges else None
        grad_x = csr_matmul(blocked.owned.transpose, grad_out)
        for k, exchange in enumerate(exchanges):
            block = exchange.block
            receive, incoming = ahead
            ahead = post_receive(exchanges[k + 1]) if k + 1 < len(exchanges) else None
            sends = []
            if block.col_stop > block.col_start:
                # The gradient of the halo rows we received from src goes back to src; dest returns ours.
                grad_block = csr_matmul(block.operator.transpose, grad_out.index_select(0, block.rows)) \
                    if block.rows.numel() else grad_out.new_zeros(block.col_stop - block.col_start, grad_out.shape[1])
                sends, _ = post_transfers(transfers, transfers.out_gradients(exchange, grad_block), exchange.src, None,
                                          exchange.src, tag)
                del grad_block
            if receive is not None:
                receive.wait()
                grad_x.index_add_(0, incoming[1], incoming[0])
            del incoming
            for sending in sends:
                sending.wait()
        transfers.finish_backward(grad_x)
        grad_bias = grad_out.sum(0) if ctx.has_bias and ctx.needs_input_grad[1] else None
        return grad_x, grad_bias, None, None, None


