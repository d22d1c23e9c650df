"""GraphSAGE with the mean aggregator and a root weight, as PyG's SAGEConv: out = W_l mean_{j in N(i)} x_j + b + W_r x_i."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gnn_dist.kernels.spmm import SparseOperator, csr_matmul
from gnn_dist.models.base import DistConv, linear_uniform_
from gnn_dist.models.registry import register_model
from gnn_dist.nn.sparse_features import linear


@register_model
class DistSAGEConv(DistConv):
    name = "sage"
    needs_root = True
    self_loops = False
    takes_sparse_input = True
    block_order_by_work = True  # forward_block: _BlockUpdate aggregates first, the base class transforms first

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

    @classmethod
    def block_input_gradients(cls, aggregate_first: bool) -> int:
        return 1 if aggregate_first else 2  # _BlockUpdate adds the root rows' gradient into the aggregation's

    def forward_block(self, h_src: torch.Tensor, block_op: SparseOperator, ids: torch.Tensor | None = None):
        if not self.aggregates_operator_first(block_op):
            return super().forward_block(h_src, block_op, ids)
        return _BlockUpdate.apply(h_src, block_op, self.lin_l.weight, self.lin_l.bias, self.lin_r.weight)

    @staticmethod
    def normalise(rows: np.ndarray, cols: np.ndarray, deg: np.ndarray, start: int, n_rows: int):
        # Mean over in-neighbours; a row with no neighbours stays empty (aggregates to 0).
        values = 1.0 / deg[rows + start].astype(np.float64) if rows.size else np.zeros(0)
        return rows, cols, values

    @staticmethod
    def block_operator(block, with_transpose: bool = True) -> SparseOperator:
        counts = torch.bincount(block.dst, minlength=block.n_dst).to(torch.float32)
        # A block's entries come grouped by target (Block.dst ascends): no sort for the matrix itself
        return SparseOperator.from_coo(block.dst, block.src, 1.0 / counts[block.dst], (block.n_dst, block.n_src),
                                       with_transpose=with_transpose, rows_sorted=True)

    @staticmethod
    def pyg_spec(in_dim: int, out_dim: int) -> tuple[str, dict]:
        return "torch_geometric.nn.SAGEConv", {"in_channels": in_dim, "out_channels": out_dim}

    @staticmethod
    def pyg_parameter_names() -> dict[str, str]:
        return {name: name for name in ("lin_l.weight", "lin_l.bias", "lin_r.weight")}


class _BlockUpdate(torch.autograd.Function):
    """SAGE on a sampled block, aggregating first: out = (A h) W_l^T + b + h[:n_dst] W_r^T, as one autograd node.

    The root rows are a prefix of the source rows, so the backward adds their gradient (g W_r) into the first
    rows of the aggregation's gradient (A^T g W_l) by the product itself (beta = 1). As separate nodes, the
    slice's backward made a zero [n_src, in] tensor, copied the root gradient into it and autograd summed it with
    the aggregation's: two passes over the whole source gradient per layer and step.
    """

    @staticmethod
    def forward(ctx, h_src, block_op, weight_l, bias_l, weight_r):  # type: ignore[override]
        n_dst = block_op.shape[0]
        with torch.profiler.record_function("spmm"):
            aggregated = csr_matmul(block_op.matrix, h_src)
        with torch.profiler.record_function("dense"):
            out = torch.addmm(bias_l, aggregated, weight_l.t())
            out.addmm_(h_src[:n_dst], weight_r.t())
        ctx.block_op = block_op
        ctx.save_for_backward(h_src, aggregated, weight_l, weight_r)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        h_src, aggregated, weight_l, weight_r = ctx.saved_tensors
        block_op = ctx.block_op
        root = h_src[:block_op.shape[0]]
        grad_h = None
        if ctx.needs_input_grad[0]:
            if block_op.transpose is None:
                raise RuntimeError("SAGE block: the operator was built without its transpose, but the layer's "
                                   "input needs a gradient: build it with with_transpose=True")
            with torch.profiler.record_function("dense"):
                grad_aggregated = grad_out @ weight_l
            with torch.profiler.record_function("spmm"):
                grad_h = csr_matmul(block_op.transpose, grad_aggregated)
            with torch.profiler.record_function("dense"):
                grad_h[:block_op.shape[0]].addmm_(grad_out, weight_r)
        with torch.profiler.record_function("dense"):
            grad_weight_l = grad_out.t() @ aggregated if ctx.needs_input_grad[2] else None
            grad_bias = grad_out.sum(0) if ctx.needs_input_grad[3] else None
            grad_weight_r = grad_out.t() @ root if ctx.needs_input_grad[4] else None
        return grad_h, None, grad_weight_l, grad_bias, grad_weight_r
