"""GCN (Kipf and Welling): out = D^-1/2 (A + I) D^-1/2 X W^T + b, as PyG's GCNConv computes it."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gnn_dist.kernels.spmm import SparseOperator, spmm
from gnn_dist.models.base import DistConv, PygOnBlock, glorot_, with_self_loops
from gnn_dist.models.registry import register_model
from gnn_dist.nn.sparse_features import linear


@register_model
class DistGCNConv(DistConv):
    name = "gcn"
    needs_root = False  # the self loop is in the operator: no separate term of the node's own input
    self_loops = True
    takes_sparse_input = True
    block_order_by_work = True  # forward_block aggregates first wherever that is cheaper on the block

    def __init__(self, in_dim, out_dim, operator, exchanger, slot, blocked=None):
        super().__init__(in_dim, out_dim, operator, exchanger, slot, blocked)
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim))  # host: moved with its module
        self.bias = nn.Parameter(torch.zeros(out_dim))  # host: moved with its module
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        glorot_(self.weight, generator)
        with torch.no_grad():
            self.bias.zero_()

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.aggregate_first else linear(h, self.weight, self.input_features)

    @property
    def aggregation_bias(self) -> torch.Tensor | None:
        return None if self.aggregate_first else self.bias

    def update(self, aggregated: torch.Tensor, root: torch.Tensor | None) -> torch.Tensor:
        return torch.addmm(self.bias, aggregated, self.weight.t()) if self.aggregate_first else aggregated

    def forward_block(self, h_src: torch.Tensor, block_op: SparseOperator, ids: torch.Tensor | None = None):
        if self.aggregate_first or not self.aggregates_operator_first(block_op):
            return super().forward_block(h_src, block_op, ids)
        # a layer that transforms first on the whole graph (it narrows), aggregating a block's few targets first
        aggregated = spmm(block_op, h_src)
        with torch.profiler.record_function("dense"):
            return torch.addmm(self.bias, aggregated, self.weight.t())

    @staticmethod
    def normalise(rows: np.ndarray, cols: np.ndarray, deg: np.ndarray, start: int, n_rows: int):
        # PyG's gcn_norm: self loops added, weight 1 / sqrt((deg_i + 1)(deg_j + 1)).
        rows, cols = with_self_loops(rows, cols, start, n_rows)
        values = 1.0 / np.sqrt((deg[rows + start] + 1.0) * (deg[cols] + 1.0))
        return rows, cols, values

    @staticmethod
    def block_operator(block, with_transpose: bool = True) -> SparseOperator:
        # On a sampled block: the mean over the sampled neighbours and the node itself (a self loop per target).
        counts = torch.bincount(block.dst, minlength=block.n_dst).to(torch.float32)
        rows, cols = with_self_loops(block.dst, block.src, 0, block.n_dst)  # targets are the first sources
        values = 1.0 / (counts[rows] + 1.0)
        return SparseOperator.from_coo(rows, cols, values, (block.n_dst, block.n_src), with_transpose=with_transpose)

    @staticmethod
    def pyg_spec(in_dim: int, out_dim: int) -> tuple[str, dict]:
        return "torch_geometric.nn.GCNConv", {"in_channels": in_dim, "out_channels": out_dim}

    @staticmethod
    def pyg_parameter_names() -> dict[str, str]:
        return {"weight": "lin.weight", "bias": "bias"}

    @classmethod
    def pyg_block_conv(cls, in_dim: int, out_dim: int) -> nn.Module:
        # On a sampled block GCN averages over the sampled neighbours and the node itself, then transforms:
        # PyG's SimpleConv(mean) over the block's edges plus a self loop per target (targets are the first
        # sources), then GCNConv's own linear map and bias (its parameters named as in pyg_conv).
        from torch_geometric.nn import SimpleConv

        mean = SimpleConv(aggr="mean")

        def call(conv, h, n_dst, edges):
            loops = torch.arange(n_dst, device=edges.device)
            edges = torch.cat([edges, torch.stack([loops, loops])], dim=1)
            return conv.lin(mean((h, h[:n_dst]), edges)) + conv.bias

        return PygOnBlock(cls.pyg_conv(in_dim, out_dim), call)
