"""A model added from one file (--plugin tests/plugins/gin.py --model gin): GIN, PyG's GINConv with eps 0.

    out_i = MLP(x_i + sum over j in N(i) of x_j),   MLP = Linear(in, out) -> ReLU -> Linear(out, out)

It aggregates first whatever the widths (its update is not linear), so the rows that travel are its input.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gnn_dist.kernels.spmm import SparseOperator
from gnn_dist.models import register_model
from gnn_dist.models.base import DistConv, linear_uniform_, with_self_loops


@register_model
class DistGINConv(DistConv):
    name = "gin"
    needs_root = False  # the node's own row is the operator's self loop (1 + eps with eps 0)
    self_loops = True
    aggregation_bias = None

    def __init__(self, in_dim, out_dim, operator, exchanger, slot, blocked=None):
        super().__init__(in_dim, out_dim, operator, exchanger, slot, blocked)
        self.mlp = nn.Sequential(nn.Linear(in_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim))

    @classmethod
    def aggregation(cls, in_dim, out_dim, **layer_options):
        return True, in_dim

    @classmethod
    def update_memory(cls, in_dim, out_dim, **layer_options):
        return out_dim, out_dim  # the hidden rows of the MLP; ReLU keeps its output for the backward

    def reset_parameters(self, generator=None):
        linear_uniform_(self.mlp[0], generator)
        linear_uniform_(self.mlp[2], generator)

    def transform(self, h):
        return h

    def update(self, aggregated, root):
        return self.mlp(aggregated)

    @staticmethod
    def normalise(rows, cols, deg, start, n_rows):
        rows, cols = with_self_loops(rows, cols, start, n_rows)
        return rows, cols, np.ones(rows.shape[0])

    @staticmethod
    def block_operator(block, with_transpose: bool = True):
        rows, cols = with_self_loops(block.dst, block.src, 0, block.n_dst)
        return SparseOperator.from_coo(rows, cols, torch.ones(rows.shape[0]), (block.n_dst, block.n_src),
                                       with_transpose=with_transpose)

    @staticmethod
    def pyg_conv(in_dim, out_dim):
        from torch_geometric.nn import GINConv

        return GINConv(nn.Sequential(nn.Linear(in_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim)), eps=0.0)

    @staticmethod
    def pyg_parameter_names():
        return {f"mlp.{k}.{what}": f"nn.{k}.{what}" for k in (0, 2) for what in ("weight", "bias")}
