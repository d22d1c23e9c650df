"""GraphSAGE with the mean aggregator and a root weight, as PyG's SAGEConv: out = W_l mean_{j in N(i)} x_j + b + W_r x_i."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gnn_dist.kernels.spmm import SparseOperator
from gnn_dist.models.base import DistConv, linear_uniform_
from gnn_dist.models.registry import register_model
from gnn_dist.nn.sparse_features import linear


@register_model
class DistSAGEConv(DistConv):
    name = "sage"
    needs_root = True
    self_loops = False
    takes_sparse_input = True

    def __init__(self, in_dim, out_dim, operator, exchanger, slot, blocked=None):
        super().__init__(in_dim, out_dim, operator, exchanger, slot, blocked)
        self.lin_l = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        linear_uniform_(self.lin_l, generator)
        linear_uniform_(self.lin_r, generator)

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.aggregate_first else linear(h, self.lin_l.weight, self.input_features)

    @property
    def aggregation_bias(self) -> torch.Tensor | None:
        return None if self.aggregate_first else self.lin_l.bias

    def update(self, aggregated: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        out = self.lin_l(aggregated) if self.aggregate_first else aggregated
        # The root term is added by the product itself (a GEMM with beta = 1): no [rows, out] term and no sum
        # pass. In place is safe: neither the Linear's backward nor the aggregation's keeps its output.
        return out.addmm_(root, self.lin_r.weight.t())

    @staticmethod
    def normalise(rows: np.ndarray, cols: np.ndarray, deg: np.ndarray, start: int, n_rows: int):
        # Mean over in-neighbours; a row with no neighbours stays empty (aggregates to 0).
        values = 1.0 / deg[rows + start].astype(np.float64) if rows.size else np.zeros(0)
        return rows, cols, values

    @staticmethod
    def block_operator(block) -> SparseOperator:
        counts = torch.bincount(block.dst, minlength=block.n_dst).to(torch.float32)
        return SparseOperator.from_coo(block.dst, block.src, 1.0 / counts[block.dst], (block.n_dst, block.n_src))

    @staticmethod
    def pyg_spec(in_dim: int, out_dim: int) -> tuple[str, dict]:
        return "torch_geometric.nn.SAGEConv", {"in_channels": in_dim, "out_channels": out_dim}

    @staticmethod
    def pyg_parameter_names() -> dict[str, str]:
        return {name: name for name in ("lin_l.weight", "lin_l.bias", "lin_r.weight")}
