"""Node-to-part assignment: METIS k-way (via pymetis) or a seeded random baseline.

The result is deterministic for the same graph, number of parts and seed.
METIS may leave a part empty on tiny or disconnected graphs; every rank needs
at least one node, so such parts get nodes moved from the largest parts
(documented in `_fill_empty_parts`).
"""
from __future__ import annotations

import numpy as np

from partition.graph import DatasetError, Graph

METHODS = ("metis", "random")


class PartitionError(ValueError):
    """The graph cannot be split as asked; the message names the fix."""


def check_num_parts(num_parts: int, num_nodes: int) -> None:
    if num_parts < 1:
        raise PartitionError(f"--num-parts must be at least 1, got {num_parts}")
    if num_nodes == 0:
        raise PartitionError("the graph has no nodes: there is nothing to partition")
    if num_parts > num_nodes:
        raise PartitionError(f"--num-parts {num_parts} is more than the graph's {num_nodes} nodes: "
                             f"use at most {num_nodes} parts")


def assign_parts(graph: Graph, num_parts: int, *, method: str = "metis", seed: int = 0,
                 balance_train: bool = False) -> np.ndarray:
    """Part id (int64 [N]) of every node.

    balance_train: ask METIS to balance training nodes across parts as well as
    node counts (a second vertex constraint, as DistDGL does), so every rank
    has a similar share of the loss.
    """
    check_num_parts(num_parts, graph.num_nodes)
    if method not in METHODS:
        raise PartitionError(f"unknown partition method {method!r}: use --method metis or --method random")
    if num_parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    if method == "random":
        rng = np.random.default_rng(seed)
        parts = np.empty(graph.num_nodes, dtype=np.int64)
        parts[rng.permutation(graph.num_nodes)] = np.arange(graph.num_nodes) % num_parts
        return parts
    return _fill_empty_parts(_metis(graph, num_parts, seed, balance_train), num_parts)


def _metis(graph: Graph, num_parts: int, seed: int, balance_train: bool) -> np.ndarray:
    import pymetis

    n = graph.num_nodes
    # Graph edges are symmetric and sorted by (target, source): exactly METIS's CSR.
    src, dst = graph.edge_index
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=xadj[1:])
    vweights = None
    if balance_train:
        vweights = np.stack([np.ones(n, dtype=np.int64), graph.train_mask.astype(np.int64)], axis=1).reshape(-1)
    options = pymetis.Options()
    options.seed = int(seed)
    try:
        result = pymetis.part_graph(num_parts, adjacency=pymetis.CSRAdjacency(xadj, src.astype(np.int64)),
                                    vweights=vweights, options=options)
    except Exception as err:  # pymetis raises RuntimeError with METIS's status code
        raise PartitionError(f"METIS failed to split {graph.name} into {num_parts} parts ({err}): "
                             f"try --method random or fewer parts") from err
    return np.asarray(result.vertex_part, dtype=np.int64)


def _fill_empty_parts(parts: np.ndarray, num_parts: int) -> np.ndarray:
    """Give every empty part one node taken from the currently largest part.

    Deterministic: the moved node is the highest-numbered node of that part.
    Only happens on graphs barely larger than num_parts.
    """
    parts = parts.copy()
    counts = np.bincount(parts, minlength=num_parts)
    for empty in np.flatnonzero(counts == 0):
        donor = int(np.argmax(counts))
        node = int(np.flatnonzero(parts == donor)[-1])
        parts[node] = empty
        counts[donor] -= 1
        counts[empty] += 1
    return parts


__all__ = ["METHODS", "PartitionError", "DatasetError", "assign_parts", "check_num_parts"]
