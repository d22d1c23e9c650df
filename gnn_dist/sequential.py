"""Sequential halo aggregation (`--halo-memory sequential`): one block of halo rows alive at a time.

Resident aggregation (gnn_dist.halo) receives a layer's whole halo into an
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
the rows and bytes of resident mode (the `exact` schedule); only the number
of messages grows (P - 1 rounds per layer and direction instead of one).

Rounds: in round r every rank sends to (rank + r) % P and receives from
(rank - r) % P, one alltoallv with a single non-zero count each, so every
rank takes part in every collective. A round whose largest block exceeds the
row bound is cut into sub-rounds; how many is agreed once at set-up from the
P x P matrix of send counts.

Shapes:
    BlockedOperator.owned: [n_owned, n_owned]; block.operator: [rows_b, cols_b] over its nonempty rows
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gnn_dist.halo import HaloExchanger
from gnn_dist.kernels.spmm import SparseOperator, _matmul, spmm
from gnn_dist.schedules import StaleSchedule

HALO_MEMORY_MODES = ("resident", "sequential")
# Rows per block by default: 16 MiB per block at width 256, where one peer's whole block can be most of the
# halo (P=2). Each extra sub-round costs one more collective per layer and direction.
DEFAULT_HALO_BLOCK_ROWS = 16384


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
class Step:
    """One collective: send rows send_idx[send_start:send_stop] to dest, receive halo block `block` from src."""

    dest: int
    send_start: int
    send_stop: int
    src: int
    block: HaloBlock


@dataclass(frozen=True)
class BlockedOperator:
    """A part's operator split into its owned columns and blocks of halo columns, with the exchange steps."""

    owned: SparseOperator
    steps: tuple[Step, ...]

    @property
    def blocks(self) -> tuple[HaloBlock, ...]:
        return tuple(step.block for step in self.steps)


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
                           block_rows: int) -> BlockedOperator:
    """Split the COO entries of a part's normalised operator (columns over [owned | halo]) into blocks.

    recv_counts[q]: halo rows owned by q (the halo is grouped by owner, so q's
    rows are one contiguous column range).
    """
    num_parts = send_counts_matrix.shape[0]
    owned_mask = cols < n_owned
    owned = SparseOperator.from_coo(rows[owned_mask], cols[owned_mask], values[owned_mask], (n_owned, n_owned))
    halo_rows, halo_cols, halo_values = rows[~owned_mask], cols[~owned_mask] - n_owned, values[~owned_mask]
    del owned_mask
    order = torch.argsort(halo_cols, stable=True)
    halo_rows, halo_cols, halo_values = halo_rows[order], halo_cols[order], halo_values[order]
    del order
    recv_start = np.concatenate([[0], np.cumsum(recv_counts)])
    send_start = np.concatenate([[0], np.cumsum(send_counts_matrix[rank])])
    steps = []
    for r, s in exchange_rounds(send_counts_matrix, block_rows):
        dest, src = (rank + r) % num_parts, (rank - r) % num_parts
        sent = int(send_counts_matrix[rank, dest])
        received = int(recv_counts[src])
        width = block_rows if block_rows > 0 else max(sent, received, 1)
        s_lo, s_hi = min(s * width, sent), min((s + 1) * width, sent)
        c_lo = int(recv_start[src]) + min(s * width, received)
        c_hi = int(recv_start[src]) + min((s + 1) * width, received)
        lo, hi = (int(v) for v in torch.searchsorted(halo_cols, torch.tensor([c_lo, c_hi])))
        block_rows_of = halo_rows[lo:hi]
        row_ids, compact_rows = torch.unique(block_rows_of, sorted=True, return_inverse=True)
        operator = SparseOperator.from_coo(compact_rows, halo_cols[lo:hi] - c_lo, halo_values[lo:hi],
                                           (int(row_ids.shape[0]), c_hi - c_lo))
        steps.append(Step(dest, int(send_start[dest]) + s_lo, int(send_start[dest]) + s_hi, src,
                          HaloBlock(c_lo, c_hi, row_ids, operator)))
    return BlockedOperator(owned=owned, steps=tuple(steps))


def aggregate_exchanged(blocked: BlockedOperator, exchanger: HaloExchanger, x_owned: torch.Tensor,
                        bias: torch.Tensor | None, slot: str) -> torch.Tensor:
    """A @ [X_owned | X_halo] (+ bias), the halo rows received block by block; differentiable in X and bias.

    Under `stale:R` (training only) the received rows are also written into the
    schedule's per-layer cache of halo rows (what stale halos need, and all they
    keep); between refreshes the blocks come from that cache, nothing travels,
    and the halo rows' gradients are discarded, as resident stale halos do.

    Shapes: x_owned [n_owned, F] -> [n_owned, F]
    """
    schedule = exchanger.schedule.for_slot(slot)
    stale = schedule if exchanger.training and isinstance(schedule, StaleSchedule) else None
    cache = None
    if stale is not None:
        cache = stale.cache.get(slot)
        if exchanger.epoch % stale.refresh_every != 0 and cache is not None:
            plan = exchanger.plan
            exchanger.counters.halo_rows_skipped += plan.rows_sent_to_peers + plan.n_halo
            return aggregate_local(blocked, x_owned, lambda start, stop: cache[start:stop], bias)
        cache = torch.empty(exchanger.plan.n_halo, x_owned.shape[1], dtype=x_owned.dtype)
        stale.cache[slot] = cache
    return _SequentialAggregate.apply(x_owned.contiguous(), bias, blocked, exchanger, slot, cache)


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


def _send_counts(num_parts: int, peer: int, rows: int) -> np.ndarray:
    counts = np.zeros(num_parts, dtype=np.int64)
    counts[peer] = rows
    return counts


class _SequentialAggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_owned, bias, blocked: BlockedOperator, ex: HaloExchanger, slot: str,  # type: ignore[override]
                keep_into: torch.Tensor | None = None):
        plan = ex.plan
        ctx.blocked, ctx.ex, ctx.slot, ctx.has_bias = blocked, ex, slot, bias is not None
        out = _matmul(blocked.owned.matrix, x_owned, bias)
        ex.step = f"epoch {ex.epoch}: {slot} sequential forward halo exchange"
        for step in blocked.steps:
            block = step.block
            send = x_owned.index_select(0, plan.send_idx[step.send_start:step.send_stop])
            received = torch.empty(block.col_stop - block.col_start, x_owned.shape[1], dtype=x_owned.dtype)
            ex.send_rows(send, _send_counts(plan.num_parts, step.dest, send.shape[0]), received,
                         _send_counts(plan.num_parts, step.src, received.shape[0]))
            del send
            if keep_into is not None:
                keep_into[block.col_start:block.col_stop] = received
            if received.shape[0]:
                out.index_add_(0, block.rows, _matmul(block.operator.matrix, received))
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        blocked, ex = ctx.blocked, ctx.ex
        plan = ex.plan
        grad_out = grad_out.contiguous()
        grad_x = _matmul(blocked.owned.transpose, grad_out)
        ex.step = f"epoch {ex.epoch}: {ctx.slot} sequential backward halo exchange"
        for step in blocked.steps:
            block = step.block
            # The gradient of the halo rows we received from src goes back to src; dest returns ours.
            grad_halo = _matmul(block.operator.transpose, grad_out.index_select(0, block.rows)) \
                if block.col_stop > block.col_start else grad_out.new_empty(0, grad_out.shape[1])
            returned = torch.empty(step.send_stop - step.send_start, grad_out.shape[1], dtype=grad_out.dtype)
            ex.send_rows(grad_halo, _send_counts(plan.num_parts, step.src, grad_halo.shape[0]), returned,
                         _send_counts(plan.num_parts, step.dest, returned.shape[0]))
            del grad_halo
            grad_x.index_add_(0, plan.send_idx[step.send_start:step.send_stop], returned)
        grad_bias = grad_out.sum(0) if ctx.has_bias and ctx.needs_input_grad[1] else None
        return grad_x, grad_bias, None, None, None, None


class ExchangedBlocks:
    """Where an attention layer's halo blocks come from when they travel: each block is received from its owner
    (and, in the backward, received again, since attention needs the rows themselves to differentiate)."""

    def __init__(self, exchanger: HaloExchanger, slot: str):
        self.exchanger = exchanger
        self.slot = slot

    def fetch(self, step: Step, source_owned: torch.Tensor, phase: str) -> torch.Tensor:
        ex, plan, block = self.exchanger, self.exchanger.plan, step.block
        ex.step = f"epoch {ex.epoch}: {self.slot} sequential {phase} halo exchange"
        send = source_owned.index_select(0, plan.send_idx[step.send_start:step.send_stop])
        received = torch.empty(block.col_stop - block.col_start, source_owned.shape[1], dtype=source_owned.dtype)
        ex.send_rows(send, _send_counts(plan.num_parts, step.dest, send.shape[0]), received,
                     _send_counts(plan.num_parts, step.src, received.shape[0]))
        return received

    def give_back(self, step: Step, grad_block: torch.Tensor, grad_owned: torch.Tensor) -> None:
        """The block's gradient goes to its owner; ours comes back from dest and joins grad_owned."""
        ex, plan = self.exchanger, self.exchanger.plan
        returned = torch.empty(step.send_stop - step.send_start, grad_block.shape[1], dtype=grad_block.dtype)
        ex.send_rows(grad_block, _send_counts(plan.num_parts, step.src, grad_block.shape[0]), returned,
                     _send_counts(plan.num_parts, step.dest, returned.shape[0]))
        grad_owned.index_add_(0, plan.send_idx[step.send_start:step.send_stop], returned)


class LocalBlocks:
    """Where the first layer's halo blocks come from: made from the cached input features (dropout and the
    layer's transform run per block); in the backward each block is made again with autograd and its gradient
    flows into the layer's parameters."""

    def __init__(self, block_source):
        self.block_source = block_source  # (halo start, halo stop) -> the block's source rows, differentiable

    def fetch(self, step: Step, source_owned: torch.Tensor, phase: str) -> torch.Tensor:
        with torch.no_grad():
            return self.block_source(step.block.col_start, step.block.col_stop)

    def give_back(self, step: Step, grad_block: torch.Tensor, grad_owned: torch.Tensor) -> None:
        if grad_block.shape[0]:
            with torch.enable_grad():
                torch.autograd.backward(self.block_source(step.block.col_start, step.block.col_stop), grad_block)


def attend_blocks(blocked: BlockedOperator, blocks, source_owned: torch.Tensor, dst_score: torch.Tensor,
                  bias: torch.Tensor, heads: int, dropout) -> torch.Tensor:
    """Attention (kernels/attention.py) over [owned | halo] columns with one halo block alive at a time.

    Each block's partial result joins the running one by the online softmax
    (running log-denominator, rescaled output): the result equals resident
    attention. The backward needs the whole rows' log-denominators (kept,
    [n_owned x heads]) and each block's rows again: `blocks` (ExchangedBlocks
    or LocalBlocks) fetches them once more, so a travelling layer sends its
    forward rows twice per epoch (3 row transfers instead of resident's 2).

    dropout: the attention dropout over [owned | halo] columns (EdgeDropout) or None.
    Shapes: source_owned [n_owned, heads * C + heads]; dst_score [n_owned, heads] -> [n_owned, heads * C]
    """
    return _SequentialAttention.apply(source_owned.contiguous(), dst_score.contiguous(), bias, blocked, blocks,
                                      heads, dropout)


def _block_dropout(dropout, n_owned: int, block: HaloBlock | None):
    if dropout is None:
        return None
    if block is None:
        return dropout.restricted(cols=slice(0, n_owned))
    return dropout.restricted(rows=block.rows, cols=slice(n_owned + block.col_start, n_owned + block.col_stop))


class _SequentialAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, source_owned, dst_score, bias, blocked: BlockedOperator, blocks, heads: int,  # type: ignore[override]
                dropout):
        from gnn_dist.kernels.attention import merge, partial_forward

        n = source_owned.shape[0]
        out, lse = partial_forward(blocked.owned, source_owned, dst_score, heads, _block_dropout(dropout, n, None))
        for step in blocked.steps:
            block = step.block
            received = blocks.fetch(step, source_owned, "forward")
            if block.rows.numel():
                part = partial_forward(block.operator, received, dst_score[block.rows], heads,
                                       _block_dropout(dropout, n, block))
                out[block.rows], lse[block.rows] = merge((out[block.rows], lse[block.rows]), part, heads)
            del received
        ctx.save_for_backward(source_owned, dst_score, lse, out)
        ctx.blocked, ctx.blocks, ctx.heads, ctx.dropout = blocked, blocks, heads, dropout
        return out + bias

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        from gnn_dist.kernels.attention import partial_backward

        source_owned, dst_score, lse, out = ctx.saved_tensors
        blocked, blocks, heads, dropout = ctx.blocked, ctx.blocks, ctx.heads, ctx.dropout
        n = source_owned.shape[0]
        grad_out = grad_out.to(source_owned.dtype).contiguous()
        # sum over the whole row of alpha * dL/dalpha = <dL/dout, out> per head (out without the bias)
        delta = (grad_out.view(n, heads, -1) * out.view(n, heads, -1)).sum(-1)
        grad_owned, grad_dst = partial_backward(blocked.owned, source_owned, dst_score, lse, grad_out, delta, heads,
                                                _block_dropout(dropout, n, None))
        for step in blocked.steps:
            block = step.block
            received = blocks.fetch(step, source_owned, "backward (rows again)")
            rows = block.rows
            grad_block, grad_dst_rows = partial_backward(block.operator, received, dst_score[rows], lse[rows],
                                                         grad_out[rows], delta[rows], heads,
                                                         _block_dropout(dropout, n, block))
            del received
            grad_dst.index_add_(0, rows, grad_dst_rows)
            blocks.give_back(step, grad_block, grad_owned)
        return grad_owned, grad_dst, grad_out.sum(0), None, None, None, None
