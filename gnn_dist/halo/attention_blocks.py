"""Attention over sequential halo blocks (`--halo-memory sequential` with --model gat): one block alive at a time.

Each block's partial attention joins the running one by the online softmax
(a running log-denominator and a rescaled output), so the result equals
resident attention (kernels/attention.py). The backward needs every row's
log-denominator (kept, [n_owned x heads]) and each block's rows again, which
travel a second time: three row transfers per epoch instead of two.
"""
from __future__ import annotations

import torch

from gnn_dist.halo.blocks import (
    BACKWARD_GRADIENTS,
    FORWARD_ROWS,
    ROWS_AGAIN,
    BlockedOperator,
    BlockExchange,
    BlockPass,
    HaloBlock,
    message_tag,
    post_transfers,
)
from gnn_dist.halo.exchange import HaloExchanger


class ExchangedBlocks:
    """Where an attention layer's halo blocks come from when they travel: each block is received from its owner
    (and, in the backward, received again, since attention needs the rows themselves to differentiate).
    With sequential halos, attention layers run the exact exchange only."""

    def __init__(self, exchanger: HaloExchanger, slot: str):
        self.exchanger = exchanger
        self.slot = slot

    def fetch(self, exchange: BlockExchange, source_owned: torch.Tensor, phase: str) -> torch.Tensor:
        ex, block = self.exchanger, exchange.block
        ex.activity = f"epoch {ex.epoch}: {self.slot} sequential {phase} halo exchange"
        transfers = BlockPass(ex, source_owned)
        buffer = transfers.in_buffer(exchange)
        rows = transfers.out_rows(exchange) if exchange.send_stop > exchange.send_start else None
        sends, receive = post_transfers(transfers, rows, exchange.dest,
                                        buffer if block.col_stop > block.col_start else None, exchange.src,
                                        message_tag(self.slot, FORWARD_ROWS if phase == "forward" else ROWS_AGAIN))
        for pending in sends + ([receive] if receive is not None else []):
            pending.wait()
        return buffer

    def give_back(self, exchange: BlockExchange, grad_block: torch.Tensor, grad_owned: torch.Tensor) -> None:
        """The block's gradient goes to its owner; ours comes back from dest and joins grad_owned."""
        transfers = BlockPass(self.exchanger, None)
        incoming = transfers.in_gradients(exchange, grad_block) if exchange.send_stop > exchange.send_start else None
        sends, receive = post_transfers(transfers, grad_block if exchange.block.col_stop > exchange.block.col_start else None,
                               exchange.src, incoming[0] if incoming else None, exchange.dest,
                               message_tag(self.slot, BACKWARD_GRADIENTS))
        for pending in sends + ([receive] if receive is not None else []):
            pending.wait()
        if receive is not None:
            grad_owned.index_add_(0, incoming[1], incoming[0])


class LocalBlocks:
    """Where the first layer's halo blocks come from: made from the cached input features (dropout and the
    layer's transform run per block); in the backward each block is made again with autograd and its gradient
    flows into the layer's parameters."""

    def __init__(self, block_source):
        self.block_source = block_source  # (halo start, halo stop) -> the block's source rows, differentiable

    def fetch(self, exchange: BlockExchange, source_owned: torch.Tensor, phase: str) -> torch.Tensor:
        with torch.no_grad():
            return self.block_source(exchange.block.col_start, exchange.block.col_stop)

    def give_back(self, exchange: BlockExchange, grad_block: torch.Tensor, grad_owned: torch.Tensor) -> None:
        if grad_block.shape[0]:
            with torch.enable_grad():
                torch.autograd.backward(self.block_source(exchange.block.col_start, exchange.block.col_stop), grad_block)


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
        for exchange in blocked.exchanges:
            block = exchange.block
            received = blocks.fetch(exchange, source_owned, "forward")
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
        for exchange in blocked.exchanges:
            block = exchange.block
            received = blocks.fetch(exchange, source_owned, "backward (rows again)")
            rows = block.rows
            grad_block, grad_dst_rows = partial_backward(block.operator, received, dst_score[rows], lse[rows],
                                                         grad_out[rows], delta[rows], heads,
                                                         _block_dropout(dropout, n, block))
            del received
            grad_dst.index_add_(0, rows, grad_dst_rows)
            blocks.give_back(exchange, grad_block, grad_owned)
        return grad_owned, grad_dst, grad_out.sum(0), None, None, None, None
