"""The in-memory graph every loader returns, and the edge clean-up they share.

A `Graph` is always undirected in the sense GNN training needs: both
directions of every edge are stored, each directed edge once, no self loops.
Self loops are the model's business (GCN adds them in its normalisation),
not the dataset's.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


class DatasetError(ValueError):
    """A dataset could not be loaded; the message names the fix."""


@dataclass(frozen=True)
class GraphSizes:
    """A graph's sizes, known before it is loaded where its source allows (the partitioner's memory model)."""

    num_nodes: int
    num_features: int
    input_edges: int  # as stored, one direction each


# A graph's optional per-edge arrays (name -> dimensions): one value, or D values, per directed edge, carried from
# the input through symmetrising into each part file's CSR entries
EDGE_ARRAYS = {"edge_weight": 1, "edge_attr": 2}


@dataclass(frozen=True)
class Graph:
    """A graph with node features, node labels and masks, and, where its dataset has one, an official edge
    split for link prediction (link_split: a gnn_dist.partition.link_split.LinkSplit, whose training edges are
    then exactly edge_index's).

    Shapes:
        edge_index: int64 [2, E] (row 0 source, row 1 target), symmetric
        x: float32 [N, F]; y: int64 [N]; *_mask: bool [N]
        edge_weight: float32 [E] or None; edge_attr: float32 [E, D] or None (one value per directed edge: a
        reverse edge made by symmetrising holds its edge's value)
    """

    name: str
    edge_index: np.ndarray
    x: np.ndarray
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    link_split: object = None
    edge_weight: np.ndarray | None = None
    edge_attr: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    def with_normalized_features(self) -> Graph:
        """PyG's NormalizeFeatures: x shifted by its smallest value, then each row divided by its sum (at least 1).
        The name says so, so a partition of these features is never mistaken for one of the raw ones."""
        x = self.x - self.x.min() if self.x.size else self.x
        x = x / np.maximum(x.sum(axis=1, keepdims=True), 1.0)
        return dataclasses.replace(self, name=f"{self.name}+normalized-features", x=x.astype(np.float32, copy=False))

    def sizes(self) -> GraphSizes:
        return GraphSizes(self.num_nodes, int(self.x.shape[1]), self.num_edges)

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    def validate(self) -> None:
        """Check shapes, dtypes and ranges; raise DatasetError naming the field."""
        n = self.num_nodes
        if n == 0:
            raise DatasetError(f"dataset {self.name!r} has no nodes: a graph needs at least one node")
        if self.x.ndim != 2 or self.x.dtype != np.float32:
            raise DatasetError(f"dataset {self.name!r}: x must be float32 [N, F], got {self.x.dtype} {self.x.shape}")
        bad = ~np.isfinite(self.x)
        if bad.any():
            node, column = np.argwhere(bad)[0]
            raise DatasetError(f"dataset {self.name!r}: x has {int(bad.sum())} NaN or infinite values (first at node "
                               f"{node}, column {column}): clean or impute the features before partitioning")
        if self.y.shape != (n,) or self.y.dtype != np.int64:
            raise DatasetError(f"dataset {self.name!r}: y must be int64 [{n}], got {self.y.dtype} {self.y.shape}")
        for mask_name in ("train_mask", "val_mask", "test_mask"):
            mask = getattr(self, mask_name)
            if mask.shape != (n,) or mask.dtype != np.bool_:
                raise DatasetError(f"dataset {self.name!r}: {mask_name} must be bool [{n}], got {mask.dtype} {mask.shape}")
        if not self.train_mask.any():
            raise DatasetError(f"dataset {self.name!r} has no training nodes: give train_mask at least one True")
        labelled = self.train_mask | self.val_mask | self.test_mask
        if labelled.any() and (self.y[labelled].min() < 0 or self.y[labelled].max() >= self.num_classes):
            raise DatasetError(
                f"dataset {self.name!r}: labels of train/val/test nodes must lie in [0, {self.num_classes})")
        if self.edge_index.ndim != 2 or self.edge_index.shape[0] != 2 or self.edge_index.dtype != np.int64:
            raise DatasetError(f"dataset {self.name!r}: edge_index must be int64 [2, E], got "
                               f"{self.edge_index.dtype} {self.edge_index.shape}")
        if self.num_edges and (self.edge_index.min() < 0 or self.edge_index.max() >= n):
            raise DatasetError(f"dataset {self.name!r}: edge_index refers to nodes outside [0, {n})")


def entries_of_rows(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions of the entries of rows that start at `starts` and hold `lengths` entries, row after row (the
    concatenation of arange(start, start + length) for each pair): a CSR's entries of some of its rows."""
    total = int(lengths.sum())
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total, dtype=np.int64)


def symmetrize(edge_index: np.ndarray, num_nodes: int) -> np.ndarray:
    """Both directions of every edge, each directed edge once, self loops removed.

    The result is sorted by (target, source), which is also the CSR order the
    partition builder wants.
    """
    edge_index = np.asarray(edge_index, dtype=np.int64)
    if edge_index.size == 0:
        return np.zeros((2, 0), dtype=np.int64)
    _check_node_range(edge_index, num_nodes)
    keys = np.empty(2 * edge_index.shape[1], dtype=np.int64)
    filled = add_both_directions(keys, 0, edge_index[0], edge_index[1], num_nodes)
    holder = [keys[:filled]]
    del keys
    return edges_from_keys(holder, num_nodes)


def _check_node_range(edge_index: np.ndarray, num_nodes: int) -> None:
    if edge_index.size and (edge_index.min() < 0 or edge_index.max() >= num_nodes):
        raise DatasetError(f"edge_index refers to nodes outside [0, {num_nodes}): fix the edge list")


def symmetrize_with_values(edge_index: np.ndarray, num_nodes: int, values: dict[str, np.ndarray],
                           where: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """symmetrize's edges, and per-edge arrays (first axis E) carried along: a reverse edge copies its edge's
    values; an edge given twice (in either direction) must carry the same values, else DatasetError naming the
    fix. Self loops are dropped with their values. Sorted by (target, source), as symmetrize's."""
    edge_index = np.asarray(edge_index, dtype=np.int64)
    _check_node_range(edge_index, num_nodes)
    keep = edge_index[0] != edge_index[1]
    src, dst = edge_index[0][keep], edge_index[1][keep]
    keys = np.concatenate([dst * num_nodes + src, src * num_nodes + dst])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    first = np.ones(keys.shape[0], dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    group = np.cumsum(first) - 1
    carried = {}
    for name, value in values.items():
        value = np.asarray(value)[keep]
        value = np.concatenate([value, value])[order]
        kept = value[first]
        if not np.array_equal(value, kept[group]):
            raise DatasetError(f"{where}: an edge is given more than once with different {name} values: keep one "
                               f"value per edge (its reverse copies it)")
        carried[name] = kept
    keys = keys[first]
    return np.stack([keys % num_nodes, keys // num_nodes]), carried


def add_both_directions(keys: np.ndarray, filled: int, src: np.ndarray, dst: np.ndarray, num_nodes: int) -> int:
    """Write one int64 key (target * N + source) per direction of each non-loop edge at keys[filled:].

    Returns the new fill count. Generators call it chunk by chunk, so the key
    array is the only edge-sized buffer alive besides the chunk.
    """
    keep = src != dst
    src, dst = src[keep], dst[keep]
    count = src.shape[0]
    forward = keys[filled:filled + count]
    np.multiply(dst, num_nodes, out=forward)
    forward += src
    backward = keys[filled + count:filled + 2 * count]
    np.multiply(src, num_nodes, out=backward)
    backward += dst
    return filled + 2 * count


def edges_from_keys(holder: list, num_nodes: int) -> np.ndarray:
    """int64 [2, E] (source, target) of the distinct keys, sorted by key.

    holder is a one-element list with the key array; it is taken out, so the
    caller holds no reference and the array is freed as soon as its distinct
    keys are copied out. In-place sort and a one-byte distinct mask, not
    np.unique (which copies the keys, sorts the copy and builds an index
    array): at ogbn-products' size the peak is the finished edge list plus
    its keys (about 3 GiB), where np.unique needed about 13.
    """
    unique = sorted_distinct_keys(holder)
    out = np.empty((2, unique.shape[0]), dtype=np.int64)
    np.remainder(unique, num_nodes, out=out[0])
    np.floor_divide(unique, num_nodes, out=out[1])
    return out


def sorted_distinct_keys(holder: list) -> np.ndarray:
    """The distinct keys of holder's one array, sorted; the array is taken out and sorted in place.

    A one-byte distinct mask, not np.unique (which copies the keys, sorts the copy and builds an index array).
    """
    keys = holder.pop()
    keys.sort()
    distinct = np.empty(keys.shape[0], dtype=bool)
    if keys.shape[0]:
        distinct[0] = True
        np.not_equal(keys[1:], keys[:-1], out=distinct[1:])
    return keys[distinct]


def random_split(num_nodes: int, seed: int, fractions: tuple[float, float, float]) -> tuple[np.ndarray, ...]:
    """Seeded train/val/test masks with the given fractions (the rest unlabelled)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(num_nodes)
    n_train = max(1, int(round(fractions[0] * num_nodes)))
    n_val = int(round(fractions[1] * num_nodes))
    n_test = int(round(fractions[2] * num_nodes))
    masks = []
    for start, stop in ((0, n_train), (n_train, n_train + n_val), (n_train + n_val, n_train + n_val + n_test)):
        mask = np.zeros(num_nodes, dtype=bool)
        mask[order[start:stop]] = True
        masks.append(mask)
    return tuple(masks)
