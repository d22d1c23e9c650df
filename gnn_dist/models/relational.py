"""The base of the layers that run on a typed graph's relations (R-GCN, R-GAT): `RelationConv`.

Such a layer reads a gnn_dist.hetero.typed_part.RelationOperator (each relation's nodes reached and sources) and
adds each relation's rows into the nodes it reaches. What they share is here: the last layer of a typed stack
computes the target type's rows only (restrict_output), and the rows each relation adds into (_nodes).
"""
from __future__ import annotations

import torch

from gnn_dist.models.base import DistConv


class RelationConv(DistConv):
    typed = True  # it runs on typed partitions only, in gnn_dist.hetero's stack

    def __init__(self, in_dim, out_dim, operator, exchanger, slot, blocked=None):
        super().__init__(in_dim, out_dim, operator, exchanger, slot, blocked)
        self._order: dict | None = None  # the layer's per-relation plan (_plan), dropped when the rows change
        # Set by restrict_output (the last layer of a typed stack): the owned rows this layer outputs, and
        # per relation that reaches them, where each of its nodes sits among those rows.
        self.output_rows: torch.Tensor | None = None
        self._output_nodes: dict = {}

    def bind_types(self, owned_type: torch.Tensor, relation_destinations: list[int], num_types: int) -> None:
        """The type of each owned row and each relation's destination type (the typed stack calls it before
        restrict_output): for a layer whose terms are per type rather than per node reached."""

    def restrict_output(self, rows: torch.Tensor) -> None:
        """Compute only these owned rows (the target type's, in the last layer): a relation into another type is
        then not computed at all. Every relation reaches nodes of one type, so it reaches all of `rows`' type
        or none of it."""
        relations = self.operator
        position = torch.full((relations.n_owned,), -1, dtype=torch.int64, device=rows.device)
        position[rows] = torch.arange(len(rows), device=rows.device)
        self.output_rows, self._output_nodes, self._order = rows, {}, None
        for r in range(relations.num_relations):
            mapped = position[relations.reached(r)]
            kept = mapped >= 0
            if bool(kept.all()) and len(mapped):
                self._output_nodes[r] = mapped
            elif bool(kept.any()):
                raise ValueError(f"relation {r} reaches nodes of more than one type")

    def computes(self, r: int) -> bool:
        """Whether relation r adds anything to this layer's output rows (it has edges, into those rows)."""
        return self.operator.counts(r)[2] > 0 and (self.output_rows is None or r in self._output_nodes)

    def _nodes(self, r: int) -> torch.Tensor:
        """The output rows relation r adds into: the nodes it reaches (among the output rows when restricted)."""
        if self.output_rows is not None:
            return self._output_nodes[r]
        return self.operator.reached(r)


class _AddRows(torch.autograd.Function):
    """out[index] += rows, in place, keeping only the index for the backward: torch's index_add_ keeps its
    source as well (its gradient is shaped after it), one [nodes reached, out] tensor per relation and layer,
    which on ogbn-mag's shape was half of a step's saved tensors."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out.index_add_(0, index, rows)
        ctx.mark_dirty(out)
        ctx.save_for_backward(index)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (index,) = ctx.saved_tensors
        return grad, None, grad.index_select(0, index)


def add_rows_(out: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """out[index[i]] += rows[i] in place, differentiable in both (Shapes: out [n, F], index [m], rows [m, F])."""
    return _AddRows.apply(out, index, rows)


NARROW_COLUMNS = 16  # below this many output columns a product takes the weight in [out, in] layout (times)


def times(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight (+ bias) for a weight in [in, out] layout (PyG's RGCNConv keeps its weights so).

    On the CPU a row-major product fewer than 16 columns wide (a last layer's classes) runs 2-5x slower,
    forward and backward, than the same product with the weight in [out, in] layout (nn.Linear's, which the
    BLAS computes as x . W^T); at 16 columns and more the two are alike (benchmarks/results/hetero-dgl-speed.md).
    So a narrow weight is laid out so first: a copy of [in, out] values, where the product is [rows, out].

    Shapes: x [n, in], weight [in, out], bias [out] -> [n, out]
    """
    if weight.shape[1] < NARROW_COLUMNS and x.device.type == "cpu":
        weight = weight.t().contiguous().t()
    return x @ weight if bias is None else torch.addmm(bias, x, weight)
