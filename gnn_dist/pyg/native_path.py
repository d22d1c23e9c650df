"""The native path of a wrapped layer: a linear aggregation computed by gnn-dist's CSR product.

PyG's message passing materialises one message per edge (index_select, then a scatter): on sbm60k at 3 x 256
that is several times the built-in models' epoch. A layer whose messages are its source rows, times an edge
weight or not, summed or averaged (GCNConv, SAGEConv with mean or sum, GraphConv, GINConv, SGConv, APPNP,
TAGConv, GCN2Conv, as PyG ships them), computes A @ x for a sparse A: this path builds A once per edge set and
weights (owned targets by [owned | halo] sources, kept while they are the same tensors) and runs the native
row-parallel SpMM the built-in convs run, forward and backward. The halo rows arrive exactly as on PyG's path
(halo_hooks), so both paths send the same bytes; an exact exchange overlaps the owned rows' product, as the
built-in convs' does. A weight that needs a gradient, or any other layer, takes PyG's path.
"""
from __future__ import annotations

import torch

from gnn_dist.halo.overlap import overlapped_aggregation
from gnn_dist.kernels.spmm import SparseOperator, spmm
from gnn_dist.pyg import passes
from gnn_dist.pyg.part_data import WITH_HALO

# PyG's layers whose message is x_j (times edge_weight where given) and whose update is the identity
LINEAR_LAYERS = ("GCNConv", "SAGEConv", "GraphConv", "GINConv", "SGConv", "APPNP", "TAGConv", "GCN2Conv")
LINEAR_AGGREGATIONS = {"SumAggregation": False, "MeanAggregation": True}  # name -> averages


def takes_native_path(conv) -> bool:
    """Whether the layer's propagate is a linear aggregation this path computes exactly."""
    kind = type(conv)
    if kind.__name__ not in LINEAR_LAYERS or not kind.__module__.startswith("torch_geometric."):
        return False
    if getattr(conv, "decomposed_layers", 1) != 1 or getattr(conv, "explain", None):
        return False
    return type(getattr(conv, "aggr_module", None)).__name__ in LINEAR_AGGREGATIONS


class NativePropagate:
    """A replacement for one layer's propagate: the halo rows as PyG's path gets them, then A @ x."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.conv = hooks.conv
        self.pyg_propagate = self.conv.propagate
        self.averages = LINEAR_AGGREGATIONS[type(self.conv.aggr_module).__name__]
        self.cached: tuple | None = None  # (edge_index, weight, dtype, operator)

    def __call__(self, edge_index, size=None, **kwargs):
        active = self.hooks._active()
        weight = kwargs.get("edge_weight")
        x = kwargs.get("x")
        source = x[0] if isinstance(x, (tuple, list)) else x
        usable = (active is not None and isinstance(edge_index, torch.Tensor) and edge_index.layout == torch.strided
                  and isinstance(source, torch.Tensor) and (weight is None or not weight.requires_grad)
                  and size is None)
        if not usable:
            return self.pyg_propagate(edge_index, size=size, **kwargs)
        hooks, graph = self.hooks, self.hooks.graph
        complete = hooks.name in active.full_input
        active.full_input.discard(hooks.name)  # a later propagate (SGConv's hops) aggregates its own owned rows
        slot = f"{hooks.name} x{active.call_suffix(hooks.name)}"
        operator = self._operator(edge_index, weight, source.dtype, graph.n_owned, graph.n_all)
        hooks.taken = "native spmm"
        return aggregate(graph, operator, source, complete, slot)

    def _operator(self, edge_index, weight, dtype, n_rows: int, n_cols: int) -> SparseOperator:
        cached = self.cached
        if cached is not None and cached[0] is edge_index and cached[1] is weight and cached[2] == dtype \
                and cached[3].shape == (n_rows, n_cols):
            return cached[3]
        operator = linear_operator(edge_index, weight, dtype, (n_rows, n_cols), self.averages)
        self.cached = (edge_index, weight, dtype, operator)
        return operator


def linear_operator(edge_index: torch.Tensor, weight: torch.Tensor | None, dtype: torch.dtype,
                    shape: tuple[int, int], averages: bool, with_transpose: bool = True) -> SparseOperator:
    """The sparse A of a linear aggregation over edge_index's (source, target) edges, targets by sources: the
    edge weights (ones without), each row divided by its in-edge count where the layer averages."""
    targets = edge_index[1]
    values = torch.ones(targets.shape[0], dtype=dtype, device=targets.device) if weight is None \
        else weight.detach().to(dtype).reshape(-1)
    if averages:  # PyG's mean: the sum over a row's messages by their count (an empty row stays zero)
        values = values / torch.bincount(targets, minlength=shape[0]).clamp_min(1).to(dtype)[targets]
    return SparseOperator.from_coo(targets, edge_index[0], values, shape, with_transpose=with_transpose)


def aggregate(graph, operator: SparseOperator, rows: torch.Tensor, complete: bool, slot: str,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """operator @ [owned | halo] rows (+ bias): rows are complete already (data.x's cached rows), or owned rows
    whose halo travels, overlapped with the owned product where the exchanger overlaps this slot's exchange
    (exact, on the host: gnn_dist.halo.overlap), else gathered first. Shapes: [n_owned or n_all, *] ->
    [n_owned, *]"""
    flat = rows.reshape(rows.shape[0], -1)
    known = getattr(rows, WITH_HALO, None)
    if known is not None:
        flat, complete = known.reshape(known.shape[0], -1), True
    if complete:
        graph.check_complete(flat, slot)
        out = spmm(operator, flat, bias)
    elif graph.exchanger.overlapped(slot, False):
        out = overlapped_aggregation(operator, graph.exchanger, flat, bias, slot)
    else:
        out = spmm(operator, graph.with_halo(flat, slot), bias)
    return out.reshape(graph.n_owned, *rows.shape[1:])


class BatchPropagate:
    """A layer's propagate in a model distributed without data: on a mini-batch (a whole subgraph, no halo) a
    linear aggregation is the native CSR product over the batch's edges, built per call (PyG's per-hop trimming
    hands each layer its own edges); outside such a forward, or for what this path does not compute (a weight
    that needs a gradient, a sparse edge_index), the propagate it replaced runs."""

    def __init__(self, conv):
        self.conv = conv
        self.replaced = conv.propagate
        self.averages = LINEAR_AGGREGATIONS[type(conv.aggr_module).__name__]
        self.path = "pyg"  # the path of the last call (DistributedModel.paths)

    def __call__(self, edge_index, size=None, **kwargs):
        weight, x = kwargs.get("edge_weight"), kwargs.get("x")
        source, target = (x[0], x[1]) if isinstance(x, (tuple, list)) else (x, None)
        usable = (passes.in_batches() and isinstance(edge_index, torch.Tensor) and edge_index.layout == torch.strided
                  and isinstance(source, torch.Tensor) and (weight is None or not weight.requires_grad))
        if not usable:
            if passes.in_batches():
                self.path = "pyg"
            return self.replaced(edge_index, size=size, **kwargs)
        self.path = "native spmm"
        n_cols = source.shape[0]
        n_rows = size[1] if size is not None and size[1] is not None else \
            (target.shape[0] if isinstance(target, torch.Tensor) else n_cols)
        flat = source.reshape(n_cols, -1)
        # the transpose serves the backward only: none for rows that need no gradient (the batch's features)
        operator = linear_operator(edge_index, weight, source.dtype, (n_rows, n_cols), self.averages,
                                   with_transpose=flat.requires_grad)
        return spmm(operator, flat).reshape(n_rows, *source.shape[1:])


def install_batch_path(module) -> int:
    """BatchPropagate on every linear-aggregation layer of module (once each); returns how many layers take it."""
    from torch_geometric.nn import MessagePassing

    taken = 0
    for conv in module.modules():
        if isinstance(conv, MessagePassing) and takes_native_path(conv):
            if not isinstance(conv.propagate, BatchPropagate):
                conv.propagate = BatchPropagate(conv)
            taken += 1
    return taken


def install(hooks) -> NativePropagate:
    native = NativePropagate(hooks)
    hooks.conv.propagate = native
    return native


class NativeGCNForward:
    """A replacement for a GCNConv's forward that orders it as --model gcn does: A (X W) = (A X) W, so the
    narrower of its input and output is aggregated and exchanged, and the bias rides the SpMM's pass.

    The layer's parameters are its own (lin.weight, bias); gcn_norm is gnn-dist's (global degrees); the result
    equals GCNConv's to float rounding. A weight that needs a gradient, a lazy width or a call outside a
    wrapped forward runs GCNConv's own forward.
    """

    def __init__(self, hooks, propagate: NativePropagate):
        self.hooks, self.propagate = hooks, propagate
        self.conv = hooks.conv
        self.pyg_forward = self.conv.forward

    def __call__(self, x, edge_index, edge_weight=None):
        from torch.nn.functional import linear

        from gnn_dist.pyg.gcn_norm import distributed_gcn_norm

        conv, hooks = self.conv, self.hooks
        active = hooks._active()
        if isinstance(x, tuple) and active is not None and hooks.name in active.full_input:
            x = x[0]  # data.x's (all rows, owned rows): with one shared weight, the owned rows are all rows' first
        usable = (active is not None and isinstance(x, torch.Tensor) and isinstance(edge_index, torch.Tensor)
                  and edge_index.layout == torch.strided and not _lazy(conv.lin.weight)
                  and (edge_weight is None or not edge_weight.requires_grad))
        if not usable:
            return self.pyg_forward(x, edge_index, edge_weight)
        complete = hooks.name in active.full_input  # x holds [owned | halo] rows already (data.x's cached rows)
        active.full_input.discard(hooks.name)
        if conv.normalize:
            edge_index, edge_weight = distributed_gcn_norm(edge_index, edge_weight, x.shape[0], conv.improved,
                                                           conv.add_self_loops, conv.flow, x.dtype)
        graph = hooks.graph
        operator = self.propagate._operator(edge_index, edge_weight, x.dtype, graph.n_owned, graph.n_all)
        slot = f"{hooks.name} x"
        hooks.taken = "native gcn"
        if conv.lin.weight.shape[1] <= conv.lin.weight.shape[0]:  # the input is narrower: aggregate it
            return linear(aggregate(graph, operator, x, complete, slot), conv.lin.weight, conv.bias)
        return aggregate(graph, operator, conv.lin(x), complete, slot, conv.bias)


def _lazy(tensor) -> bool:
    return isinstance(tensor, torch.nn.parameter.UninitializedTensorMixin)


def install_gcn_forward(hooks, propagate: NativePropagate) -> NativeGCNForward | None:
    """The ordered forward for PyG's own GCNConv (not a subclass, which may compute otherwise)."""
    if type(hooks.conv).__name__ != "GCNConv" or not type(hooks.conv).__module__.startswith("torch_geometric."):
        return None
    forward = NativeGCNForward(hooks, propagate)
    hooks.conv.forward = forward
    return forward


class NativeGATForward:
    """A replacement for PyG's GATConv forward on the built-in GAT's kernels (kernels/attention.py): the rows
    [x W | a_src] are made once, travel once, and one fused pass computes every owned row's scores, softmax,
    attention dropout and sum, forward and backward, where PyG's path materialises per-edge tensors.

    Taken by a GATConv as PyG ships it with one shared weight (in_channels an int), no edge features and no
    residual, called with one input tensor and without return_attention_weights; any other call runs
    GATConv's own forward. The attention dropout is the one PyG's path draws inside a wrapped forward
    (gnn_dist.pyg.dropout.edge_dropout), so both paths draw the same masks.
    """

    def __init__(self, hooks):
        self.hooks = hooks
        self.conv = hooks.conv
        self.pyg_forward = self.conv.forward
        self.cached: tuple | None = None  # (edge_index, operator)

    def __call__(self, x, edge_index, edge_attr=None, size=None, return_attention_weights=None):
        from gnn_dist.kernels.attention import attention
        from gnn_dist.models.gat import transformed_rows
        from gnn_dist.pyg.dropout import dropout_key, edge_dropout

        conv, hooks = self.conv, self.hooks
        active = hooks._active()
        if isinstance(x, tuple) and active is not None and hooks.name in active.full_input:
            x = x[0]  # data.x's (all rows, owned rows): with one shared weight, the owned rows are all rows' first
        usable = (active is not None and isinstance(x, torch.Tensor) and isinstance(edge_index, torch.Tensor)
                  and edge_index.layout == torch.strided and edge_attr is None and size is None
                  and return_attention_weights is None and not _lazy(conv.lin.weight))
        if not usable:
            return self.pyg_forward(x, edge_index, edge_attr, size, return_attention_weights)
        complete = hooks.name in active.full_input
        active.full_input.discard(hooks.name)
        graph, heads, width = hooks.graph, conv.heads, conv.out_channels
        hooks.taken = "native gat"
        rows = transformed_rows(x, conv.lin.weight, conv.att_src)  # [x W | a_src]: what every target aggregates
        source = rows if complete else graph.with_halo(rows, f"{hooks.name} x")
        target_scores = (source[:graph.n_owned, :heads * width].reshape(-1, heads, width) * conv.att_dst).sum(-1)
        dropout = None
        if conv.training and conv.dropout > 0.0:  # PyG's path would call F.dropout here: the same call number
            key = dropout_key(active.seed, active.step, active.dropout_calls)
            active.dropout_calls += 1
            dropout = edge_dropout(graph.node_ids, graph.all_ids, heads, key, conv.dropout)
        operator = self._operator(edge_index, graph.n_owned, graph.n_all)
        bias = conv.bias if conv.concat else None
        out = attention(operator, source, target_scores, heads, bias, dropout, conv.negative_slope)
        if not conv.concat:
            out = out.reshape(-1, heads, width).mean(1)
            if conv.bias is not None:
                out = out + conv.bias
        return out

    def _operator(self, edge_index, n_rows: int, n_cols: int) -> SparseOperator:
        """The attention's pattern: the in-edges, and a self loop per owned row where GATConv adds them (it
        removes the graph's own first, as the partitioner has)."""
        if self.cached is not None and self.cached[0] is edge_index:
            return self.cached[1]
        sources, targets = edge_index[0], edge_index[1]
        keep = sources != targets
        sources, targets = sources[keep], targets[keep]
        if self.conv.add_self_loops:
            loops = torch.arange(n_rows, dtype=sources.dtype, device=sources.device)
            sources, targets = torch.cat([sources, loops]), torch.cat([targets, loops])
        operator = SparseOperator.from_coo(targets, sources, torch.ones(targets.shape[0], device=targets.device),
                                           (n_rows, n_cols), with_transpose=False)
        self.cached = (edge_index, operator)
        return operator


def install_gat_forward(hooks) -> NativeGATForward | None:
    """The native forward for PyG's own GATConv where its options allow (NativeGATForward)."""
    conv = hooks.conv
    if type(conv).__name__ != "GATConv" or not type(conv).__module__.startswith("torch_geometric."):
        return None
    if conv.lin is None or getattr(conv, "lin_edge", None) is not None or getattr(conv, "res", None) is not None:
        return None
    forward = NativeGATForward(hooks)
    conv.forward = forward
    return forward
