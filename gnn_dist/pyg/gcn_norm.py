"""gcn_norm over the whole graph's degrees, for PyG's layers that normalise their own edges.

GCNConv, GCN2Conv, APPNP, SGConv, TAGConv, ARMAConv and others call torch_geometric's gcn_norm on the edges they
are given, with num_nodes read from their input. On a part that would count a halo node's in-edges on this
rank only (and index past the owned rows). Inside a wrapped forward, gnn-dist's gcn_norm computes the same
arithmetic on the whole graph: the owned rows' weighted in-degrees are complete on this rank (every in-edge of
an owned node is local), self loops are added for owned rows only (targets are owned), and the halo rows'
degrees come from their owners by one exact exchange. Outside a wrapped forward it is PyG's own.

The result for the part's own edges, with the part's own weights or none, is cached per (improved, self loops,
dtype); other weights, or weights that need a gradient, are normalised again at every call, with the exchange.
"""
from __future__ import annotations

import sys

import torch

from gnn_dist.pyg import passes

_ORIGINAL = None


def install() -> None:
    """Replace gcn_norm in every loaded torch_geometric module that imported it (once per process)."""
    global _ORIGINAL
    import torch_geometric.nn.conv.gcn_conv as gcn_conv

    if _ORIGINAL is None:
        _ORIGINAL = gcn_conv.gcn_norm
    for name, module in list(sys.modules.items()):
        if name.startswith("torch_geometric") and getattr(module, "gcn_norm", None) is _ORIGINAL:
            module.gcn_norm = distributed_gcn_norm


def distributed_gcn_norm(edge_index, edge_weight=None, num_nodes=None, improved=False, add_self_loops=True,
                         flow="source_to_target", dtype=None):
    active = passes.current()
    if active is None or not isinstance(edge_index, torch.Tensor) or edge_index.layout != torch.strided:
        return _ORIGINAL(edge_index, edge_weight, num_nodes, improved, add_self_loops, flow, dtype)
    graph = active.graph
    if flow != "source_to_target":
        raise ValueError("gcn_norm with flow='target_to_source' cannot be computed on a part (a target's "
                         "in-edges are local, its out-edges are not): use the default flow")
    # the part's own edges and weights (or none) give the same weights every step
    cacheable = edge_index is graph.edge_index and (
        edge_weight is None or (edge_weight is graph.edge_weight and not edge_weight.requires_grad))
    key = (improved, add_self_loops, dtype, edge_weight is None)
    if cacheable and key in graph.norm_cache:
        return graph.norm_cache[key]
    result = _normalise(graph, edge_index, edge_weight, improved, add_self_loops, dtype)
    if cacheable:
        graph.norm_cache[key] = result
    return result


def _normalise(graph, edge_index, edge_weight, improved, add_self_loops, dtype):
    from torch_geometric.utils import add_remaining_self_loops, scatter

    fill = 2.0 if improved else 1.0
    if add_self_loops:
        # as PyG's gcn_norm: before the unit weights are made, so loops of an unweighted graph weigh 1 even
        # when improved (only given weights get improved's 2)
        edge_index, edge_weight = add_remaining_self_loops(edge_index, edge_weight, fill, graph.n_owned)
    if edge_weight is None:
        edge_weight = torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)
    source, target = edge_index[0], edge_index[1]
    degree = scatter(edge_weight, target, dim=0, dim_size=graph.n_owned, reduce="sum")
    degree = graph.input_with_halo(degree.unsqueeze(1), "gcn_norm degrees").squeeze(1)
    inverse_root = degree.pow(-0.5)
    inverse_root = inverse_root.masked_fill(inverse_root == float("inf"), 0.0)
    return edge_index, inverse_root[source] * edge_weight * inverse_root[target]
