"""GAT (Velickovic et al.) as PyG's GATConv computes it, with H heads concatenated in hidden layers.

    x' = x W^T viewed [N, H, C];  a_src = <x'_j, att_src>,  a_dst = <x'_i, att_dst>   (per head)
    alpha_ij = softmax over j in N(i) + {i} of leaky_relu(a_src_j + a_dst_i, 0.2)
    out_i = concat over heads of sum_j alpha_ij * x'_j  + bias

Hidden layers have `--heads` heads of width `--hidden` (so they output heads * hidden columns); the output
layer has one head. Self loops are in the operator (one per row); the operator's values are not used.

Across ranks: a rank owns its destination rows, so each row's softmax is local. The rows that travel are
[x' | a_src] of the owned nodes (heads * C + heads columns); a_dst never leaves its rank. With
--halo-memory sequential, halo blocks join by the online softmax and travel again in the backward. Attention dropout
(`--attn-dropout`) is keyed by (seed, epoch, layer, original source id, original destination id, head), so
every P keeps the same attention entries. The aggregation runs in kernels/attention.py.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from gnn_dist.halo.attention_blocks import ExchangedBlocks, LocalBlocks, attend_blocks
from gnn_dist.kernels.attention import EdgeDropout, attention, merge
from gnn_dist.kernels.keyed_random import mix32_reference
from gnn_dist.kernels.spmm import SparseOperator
from gnn_dist.models.base import DistConv, PygOnBlock, glorot_, with_self_loops
from gnn_dist.models.registry import register_model

_ATTENTION_SALT = 0x68E31DA4  # attention masks draw apart from the same layer's feature dropout


@register_model
class DistGATConv(DistConv):
    name = "gat"
    needs_root = False
    self_loops = True
    attention = True
    multi_head = True

    def __init__(self, in_dim, out_dim, operator, exchanger, slot, blocked=None, heads: int = 1,
                 attn_dropout: float = 0.0):
        if out_dim % heads:
            raise ValueError(f"GAT layer: {out_dim} output columns do not split into {heads} heads")
        super().__init__(in_dim, out_dim, operator, exchanger, slot, blocked)
        self.heads = heads
        self.head_width = out_dim // heads
        self.attn_dropout = attn_dropout
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, self.head_width))  # host: moved with its module
        self.att_dst = nn.Parameter(torch.empty(1, heads, self.head_width))  # host: moved with its module
        self.bias = nn.Parameter(torch.zeros(out_dim))  # host: moved with its module
        self.reset_parameters()

    @classmethod
    def layer_options(cls, config, layer: int, num_layers: int) -> dict:
        last = layer == num_layers - 1
        p = config.dropout if config.attn_dropout is None else config.attn_dropout
        return {"heads": 1 if last else config.heads, "attn_dropout": p}

    @classmethod
    def aggregation(cls, in_dim: int, out_dim: int, heads: int = 1, **_) -> tuple[bool, int]:
        return False, out_dim + heads  # it transforms first: the rows it aggregates are [x W | a_src]

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        # PyG's GATConv: glorot on the weight and on each attention vector ([heads, C]), zero bias.
        glorot_(self.lin.weight, generator)
        bound = math.sqrt(6.0 / (self.heads + self.head_width))
        with torch.no_grad():
            self.att_src.uniform_(-bound, bound, generator=generator)
            self.att_dst.uniform_(-bound, bound, generator=generator)
            self.bias.zero_()

    def _scores(self, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """Per head <x_h, att_h> of transformed rows, as PyG computes them.

        Folding att into the weight instead (x (W^T att), one product) was faster but lost precision of the
        first layer's gradients in float32 against PyG's float64 GATConv, and an einsum was slower than this
        product and sum on CPU (measured: benchmarks/results/gat-synthetic-arxiv.md).
        Shapes: x [n, heads * C] (rows may be a column slice) -> [n, heads]
        """
        return _head_scores(x, att.view(1, self.heads, self.head_width))

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        """[x W | a_src]: the rows every destination aggregates. Shapes: [n, in_dim] -> [n, out_dim + heads]."""
        return transformed_rows(h, self.lin.weight, self.att_src.view(1, self.heads, self.head_width))

    def destination_scores(self, source_rows: torch.Tensor) -> torch.Tensor:
        """a_dst of rows whose [x W | a_src] are given. Shapes: [n, out_dim + heads] -> [n, heads]."""
        return self._scores(source_rows[:, :self.out_dim], self.att_dst)

    aggregation_bias = None

    def update(self, aggregated: torch.Tensor, root: torch.Tensor | None) -> torch.Tensor:
        return aggregated

    def _edge_dropout(self, col_ids: torch.Tensor | None, n_rows: int) -> EdgeDropout | None:
        """The attention dropout of rows 0..n_rows over columns with original ids col_ids (rows first)."""
        if not self.training or self.attn_dropout == 0.0:
            return None
        if col_ids is None or self.pass_key is None:
            raise RuntimeError("GAT attention dropout needs the pass key and node ids (set by the model stack)")
        key = mix32_reference(self.pass_key ^ _ATTENTION_SALT)
        return EdgeDropout.keyed(col_ids[:n_rows], col_ids, self.heads, key, self.attn_dropout)

    def forward(self, x: torch.Tensor | None = None, x_full: torch.Tensor | None = None,
                halo_source=None) -> torch.Tensor:
        if isinstance(x, list):
            x = x.pop()
        if self.blocked is not None:
            return self._forward_sequential(x, halo_source)
        n = self.operator.shape[0]
        if x_full is not None:
            source = self.transform(x_full)  # the first layer: halo inputs are the cached features
        else:
            source = self.exchanger.gather(self.transform(x), self.slot)
            del x
        dst = self.destination_scores(source[:n])
        return attention(self.operator, source, dst, self.heads, self.bias, self._edge_dropout(self.column_ids, n))

    def _forward_sequential(self, x: torch.Tensor, halo_source) -> torch.Tensor:
        """--halo-memory sequential: one halo block at a time, joined by the online softmax (gnn_dist.halo.blocks)."""
        if halo_source is None:
            blocks = ExchangedBlocks(self.exchanger, self.slot)
        else:  # the first layer: its halo rows are the cached input features
            blocks = LocalBlocks(lambda start, stop: self.transform(halo_source(start, stop)))
        source = self.transform(x)
        dst = self.destination_scores(source)
        del x
        dropout = self._edge_dropout(self.column_ids, source.shape[0])
        return attend_blocks(self.blocked, blocks, source, dst, self.bias, self.heads, dropout)

    def forward_block(self, h_src: torch.Tensor, block_op: SparseOperator, ids: torch.Tensor | None = None):
        n_dst = block_op.shape[0]
        dropout = self._edge_dropout(ids, n_dst)
        source = self.transform(h_src)
        return attention(block_op, source, self.destination_scores(source[:n_dst]), self.heads, self.bias, dropout)

    def aggregate_rows(self, start: int, stop: int, from_owned: SparseOperator, from_halo: SparseOperator,
                       owned: torch.Tensor, halo: torch.Tensor) -> torch.Tensor:
        """Evaluation's row chunk: owned and halo columns apart, joined by their softmax denominators."""
        dst = self.destination_scores(owned[start:stop])
        result = attention(from_owned, owned, dst, self.heads, with_lse=True)
        if halo.shape[0]:
            result = merge(result, attention(from_halo, halo, dst, self.heads, with_lse=True), self.heads)
        return result[0] + self.bias

    @staticmethod
    def normalise(rows: np.ndarray, cols: np.ndarray, deg: np.ndarray, start: int, n_rows: int):
        # The operator is only the pattern (values unused): every in-edge and one self loop per row, as PyG's
        # GATConv adds them (the partitioner has already dropped self loops of the input graph).
        rows, cols = with_self_loops(rows, cols, start, n_rows)
        return rows, cols, np.ones(rows.shape[0])

    @staticmethod
    def block_operator(block, with_transpose: bool = True) -> SparseOperator:
        rows, cols = with_self_loops(block.dst, block.src, 0, block.n_dst)  # targets are the first sources
        return SparseOperator.from_coo(rows, cols, torch.ones(rows.shape[0], device=rows.device),
                                       (block.n_dst, block.n_src), with_transpose=with_transpose)

    @classmethod
    def block_needs_transpose(cls, aggregate_first: bool, input_needs_grad: bool) -> bool:
        return False  # the attention kernels order the entries by column themselves (kernels.attention)

    @staticmethod
    def pyg_spec(in_dim: int, out_dim: int, heads: int = 1, attn_dropout: float = 0.0) -> tuple[str, dict]:
        return "torch_geometric.nn.GATConv", {"in_channels": in_dim, "out_channels": out_dim // heads, "heads": heads,
                                              "concat": True, "dropout": attn_dropout}

    @staticmethod
    def pyg_parameter_names() -> dict[str, str]:
        return {name: name for name in ("lin.weight", "att_src", "att_dst", "bias")}

    @classmethod
    def pyg_block_conv(cls, in_dim: int, out_dim: int, heads: int = 1, attn_dropout: float = 0.0) -> nn.Module:
        # GATConv on the block's edges: its self loops are the targets', the first sources
        return PygOnBlock(cls.pyg_conv(in_dim, out_dim, heads=heads, attn_dropout=attn_dropout),
                          lambda conv, h, n_dst, edges: conv(h, edges)[:n_dst])


def transformed_rows(h: torch.Tensor, weight: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """[h W^T | <h W^T, att> per head], keeping only h for the backward (_SourceRows).
    Shapes: h [n, in_dim], weight [heads * C, in_dim], att [1, heads, C] -> [n, heads * C + heads]"""
    return _SourceRows.apply(h, weight, att)


def _head_scores(x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """Per head <x_h, att_h>. Shapes: x [n, heads * C] (rows may be a column slice), att [1, heads, C] -> [n, heads]"""
    return (x.reshape(-1, att.shape[1], att.shape[2]) * att).sum(-1)


class _SourceRows(torch.autograd.Function):
    """[x W | <x W, att> per head] with the arithmetic of autograd over matmul, product, sum and cat, keeping
    for the backward only the layer's input h, which the layer keeps anyway.

    Left to autograd, the product would save x W ([n, heads * C]) and the rows would be saved again as they
    travel (the attention saves its own [owned | halo] copy), a share of GAT's peak memory the memory plan did
    not foresee (measured: benchmarks/results/gat-memory-plan.md). The backward needs x W only for att's
    gradient, sum_i g_ih x_ih = W_h (sum_i g_ih h_i): summed over the rows first ([heads, n] x [n, in_dim]),
    that is two thin products instead of x W again ([n, in_dim] x [in_dim, heads * C], a third of the layer's
    dense work).

    Shapes: h [n, in_dim], weight [heads * C, in_dim], att [1, heads, C] -> [n, heads * C + heads]
    """

    @staticmethod
    def forward(ctx, h, weight, att):  # type: ignore[override]
        _, heads, width = att.shape
        x = h @ weight.t()
        rows = torch.cat([x, _head_scores(x, att)], 1)  # the product's temporary goes first
        ctx.save_for_backward(h, weight, att)
        return rows

    @staticmethod
    def backward(ctx, grad_rows):  # type: ignore[override]
        h, weight, att = ctx.saved_tensors
        _, heads, width = att.shape
        grad_scores = grad_rows[:, heads * width:].unsqueeze(-1)
        grad_att = None
        if ctx.needs_input_grad[2]:
            summed = grad_rows[:, heads * width:].t() @ h  # [heads, in_dim]: each head's score gradients times h
            grad_att = torch.bmm(weight.view(heads, width, -1), summed.unsqueeze(-1)).view(1, heads, width)
        grad_x = (grad_scores * att).view(-1, heads * width)
        grad_x += grad_rows[:, :heads * width]
        grad_weight = grad_x.t() @ h if ctx.needs_input_grad[1] else None
        grad_h = grad_x @ weight if ctx.needs_input_grad[0] else None
        return grad_h, grad_weight, grad_att
