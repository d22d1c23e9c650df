"""Dataset -> part vector -> per-part arrays -> partition directory, in one call."""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from gnn_dist.partition.build import build_parts, part_stats
from gnn_dist.partition.format import PartitionMeta, save
from gnn_dist.partition.graph import DatasetError, Graph
from gnn_dist.partition.link_split import (
    DEFAULT_EDGE_SPLIT,
    DEFAULT_MRR_NEGATIVES,
    part_link_arrays,
    split_edges,
    with_mrr_negatives,
)
from gnn_dist.partition.metis import assign_parts, locality_blocks

DEFAULT_LOCALITY_BLOCK = 256
# What METIS evens across parts by default (gnn_dist.partition.metis.assign_parts): node counts and edges weighed
# alike. Chosen from the worst case over the real graphs and stress graphs at P = 2, 4, 8, 3 seeds each
# (benchmarks/results/balance-default.md): node-balanced parts let a part's edges reach 2.79x their mean
# (tolokers, P=8), edge-balanced ones a part's nodes 1.73x (facebook, P=8), both together neither past 1.34x.
DEFAULT_BALANCE = "both"


def partition_graph(graph: Graph, num_parts: int, out: str | os.PathLike, *, method: str = "metis",
                    seed: int = 0, balance_train: bool = False, overwrite: bool = False,
                    locality_block: int = DEFAULT_LOCALITY_BLOCK, objective: str = "cut", task: str = "node",
                    edge_split: tuple[float, float, float] = DEFAULT_EDGE_SPLIT,
                    mrr_negatives: int = DEFAULT_MRR_NEGATIVES, balance_edges: bool = False,
                    balance: str | None = None) -> PartitionMeta:
    """balance: what METIS evens across parts (nodes, edges or both; default DEFAULT_BALANCE).
    locality_block: nodes per METIS block when numbering inside a part (0: dataset order).
    objective: what METIS minimises, cut or volume (gnn_dist.partition.metis.assign_parts).
    task link: the held-out edges leave the graph before it is partitioned, and each part stores the split's
    pairs whose source it owns (gnn_dist.partition.link_split); a dataset's official split is kept."""
    split = None
    if task == "node" and graph.link_split is not None:
        raise DatasetError(f"{graph.name} is a link-prediction dataset without node labels: partition it with "
                           f"--task link")
    if task == "link" and (graph.edge_weight is not None or graph.edge_attr is not None):
        raise DatasetError(f"{graph.name} has edge_weight or edge_attr: --task link holds edges out and does not "
                           f"carry edge arrays yet; partition it for node classification, or drop the edge arrays")
    if task == "link":
        if graph.link_split is not None:
            split = with_mrr_negatives(graph.link_split, graph.num_nodes, seed, mrr_negatives)
            source = "official"
        else:
            graph, split = split_edges(graph, edge_split, seed, mrr_negatives)
            source = f"seeded {','.join(f'{f:g}' for f in edge_split)} (seed {seed})"
    if balance is None:  # --balance-train is a second METIS constraint beside the node counts
        balance = "nodes" if balance_train or balance_edges else DEFAULT_BALANCE
    parts = assign_parts(graph, num_parts, method=method, seed=seed, balance_train=balance_train,
                         objective=objective, balance_edges=balance_edges, balance=balance)
    blocks = locality_blocks(graph, parts, num_parts, locality_block, seed) if locality_block > 0 else None
    partptr, node_map, part_arrays = build_parts(graph, parts, num_parts, blocks)
    infos = [dataclasses.asdict(part_stats(arrays)) for arrays in part_arrays]
    link = None
    if split is not None:
        for arrays, extra in zip(part_arrays, part_link_arrays(split, parts, num_parts)):
            arrays.update(extra)
        link = {"source": source, **split.summary()}
    meta_fields = dict(
        dataset=graph.name, num_nodes=graph.num_nodes, num_edges=graph.num_edges, num_parts=num_parts,
        num_features=graph.num_features, num_classes=graph.num_classes, num_train=int(graph.train_mask.sum()),
        method=method, seed=seed, partptr=[int(v) for v in partptr], task=task, link=link,
        balance=("edges" if balance_edges else balance) if method == "metis" else None,
        feature_density=float(np.count_nonzero(graph.x)) / max(graph.x.size, 1),
    )
    return save(out, meta_fields, node_map, part_arrays, infos, overwrite=overwrite)
