"""Typed (heterogeneous) graphs: node types, relations between them, per-type features, labels on one type.

Names follow PyG's HeteroData: a node type is a string, a relation the triple (source type, name, target type),
and node ids inside a type are that type's own (type-local), as the input gives them.

    hetero:PATH    the typed .npz format (../shared/data/README.md; docs/datasets.md)

Reverse relations are added exactly as PyG's `ToUndirected()` adds them: a relation between two types gets
(dst, rev_NAME, src) with every edge flipped (repeated edges stay repeated); a relation within one type is made
symmetric in place, sorted and without repeats (`to_undirected`). `--no-reverse-relations` keeps the
relations as given.

For partitioning and message passing, a typed graph is also one homogeneous graph (`homogeneous()`), as PyG's
`to_homogeneous()` builds it: types in their order, each node numbered type offset + type-local id, every
relation's edges in relation order, each edge carrying its relation's index.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gnn_dist.partition.graph import DatasetError, GraphSizes

Relation = tuple[str, str, str]
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class HeteroGraph:
    """Shapes: num_nodes[t] nodes of type t; x[t]: float32 [num_nodes[t], F_t] for a featured type (widths differ
    by type; a type absent from x is featureless); edges[r]: int64 [2, E_r], row 0 source ids of r[0], row 1
    target ids of r[2] (type-local); y, *_mask: over the target type's nodes."""

    name: str
    node_types: tuple[str, ...]
    target: str
    num_nodes: dict[str, int]
    x: dict[str, np.ndarray]
    edges: dict[Relation, np.ndarray]
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    reverse_relations: bool = False  # whether with_reverse_relations made the relations
    link_split: object = field(default=None, repr=False)  # link prediction is not defined on typed graphs yet

    @property
    def relations(self) -> tuple[Relation, ...]:
        return tuple(self.edges)

    @property
    def total_nodes(self) -> int:
        return int(sum(self.num_nodes.values()))

    @property
    def total_edges(self) -> int:
        return int(sum(e.shape[1] for e in self.edges.values()))

    def sizes(self) -> GraphSizes:
        """Sizes for the partitioner's memory check: all nodes, the widest feature row, every stored edge."""
        return GraphSizes(self.total_nodes, max((x.shape[1] for x in self.x.values()), default=0), self.total_edges)

    def offsets(self) -> dict[str, int]:
        """The first homogeneous id of each type (types in their order)."""
        starts = np.concatenate([[0], np.cumsum([self.num_nodes[t] for t in self.node_types])])
        return {t: int(starts[k]) for k, t in enumerate(self.node_types)}

    def validate(self) -> None:
        """Check every name, shape and id; raise DatasetError naming the fix."""
        where = f"dataset {self.name!r}"
        if not self.node_types:
            raise DatasetError(f"{where}: no node types: list them in node_types")
        for t in self.node_types:
            if not _NAME.match(t):
                raise DatasetError(f"{where}: node type {t!r} is not a plain identifier: rename it (letters, digits, _)")
            if self.num_nodes.get(t, 0) <= 0:
                raise DatasetError(f"{where}: node type {t!r} has no nodes: give num_nodes__{t} > 0, or drop the type "
                                   f"and its relations")
        if len(set(self.node_types)) != len(self.node_types):
            raise DatasetError(f"{where}: node_types lists a type twice: list each once")
        if self.target not in self.node_types:
            raise DatasetError(f"{where}: the target type {self.target!r} is not one of the node types "
                               f"{list(self.node_types)}: set target to the type that carries the labels")
        for t, x in self.x.items():
            if t not in self.node_types:
                raise DatasetError(f"{where}: x__{t} names an unknown node type: rename it to one of "
                                   f"{list(self.node_types)}")
            if x.ndim != 2 or x.shape[0] != self.num_nodes[t]:
                raise DatasetError(f"{where}: x__{t} has shape {tuple(x.shape)} but type {t!r} has "
                                   f"{self.num_nodes[t]} nodes: give one row per node")
            if x.dtype != np.float32 or not np.isfinite(x).all():
                raise DatasetError(f"{where}: x__{t} must be finite float32 values")
        if not self.edges:
            raise DatasetError(f"{where}: no relations: give at least one edge_index__SRC__REL__DST")
        for (src, rel, dst), edge_index in self.edges.items():
            key = f"edge_index__{src}__{rel}__{dst}"
            for t in (src, dst):
                if t not in self.node_types:
                    raise DatasetError(f"{where}: {key} names the unknown node type {t!r}: use one of "
                                       f"{list(self.node_types)}")
            if not _NAME.match(rel):
                raise DatasetError(f"{where}: {key}: the relation name {rel!r} is not a plain identifier")
            if edge_index.ndim != 2 or edge_index.shape[0] != 2 or not np.issubdtype(edge_index.dtype, np.integer):
                raise DatasetError(f"{where}: {key} must be an integer array [2, E], got {edge_index.dtype} "
                                   f"{tuple(edge_index.shape)}")
            for row, t in ((0, src), (1, dst)):
                ids = edge_index[row]
                if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes[t]):
                    bad = int(ids.max()) if ids.max() >= self.num_nodes[t] else int(ids.min())
                    raise DatasetError(f"{where}: {key} holds {t} id {bad}, outside [0, {self.num_nodes[t]}): ids are "
                                       f"type-local, 0 to num_nodes__{t} - 1")
        n = self.num_nodes[self.target]
        if self.y.shape != (n,) or not np.issubdtype(self.y.dtype, np.integer):
            raise DatasetError(f"{where}: y must be int64 [{n}] (one label per {self.target} node), got "
                               f"{self.y.dtype} {tuple(self.y.shape)}: the target type needs labels")
        for name in ("train_mask", "val_mask", "test_mask"):
            mask = getattr(self, name)
            if mask.shape != (n,) or mask.dtype != np.bool_:
                raise DatasetError(f"{where}: {name} must be bool [{n}] over the {self.target} nodes")
        labelled = self.train_mask | self.val_mask | self.test_mask
        if labelled.any() and (self.y[labelled].min() < 0 or self.y[labelled].max() >= self.num_classes):
            raise DatasetError(f"{where}: labels of split nodes must lie in [0, {self.num_classes})")
        if not self.train_mask.any():
            raise DatasetError(f"{where}: no training nodes: mark some {self.target} nodes in train_mask")

    def with_reverse_relations(self) -> HeteroGraph:
        """PyG's ToUndirected(): (dst, rev_NAME, src) for every relation between two types, appended after the
        given relations in their order; a relation within one type made symmetric in place."""
        edges: dict[Relation, np.ndarray] = {}
        added: dict[Relation, np.ndarray] = {}
        for (src, rel, dst), edge_index in self.edges.items():
            if src == dst:
                both = np.concatenate([edge_index, edge_index[::-1]], axis=1)
                n = self.num_nodes[src]
                # to_undirected: coalesce, sorted by (source, target), repeats removed
                keys = np.unique(both[0].astype(np.int64) * n + both[1])
                edges[(src, rel, dst)] = np.stack([keys // n, keys % n]).astype(np.int64)
            else:
                edges[(src, rel, dst)] = edge_index.astype(np.int64, copy=False)
                reverse = (dst, f"rev_{rel}", src)
                if reverse in self.edges:
                    raise DatasetError(f"dataset {self.name!r}: both {src}__{rel}__{dst} and its reverse "
                                       f"{dst}__rev_{rel}__{src} are given: drop one, or pass --no-reverse-relations")
                added[reverse] = np.ascontiguousarray(edge_index[::-1], dtype=np.int64)
        return dataclasses.replace(self, edges={**edges, **added}, reverse_relations=True)

    def homogeneous(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(edge_index int64 [2, E] over homogeneous ids, edge_type int64 [E] (relation index), node_type int64
        [N]): PyG's to_homogeneous order."""
        offsets = self.offsets()
        parts, kinds = [], []
        for r, ((src, _, dst), edge_index) in enumerate(self.edges.items()):
            parts.append(np.stack([edge_index[0] + offsets[src], edge_index[1] + offsets[dst]]))
            kinds.append(np.full(edge_index.shape[1], r, dtype=np.int64))
        node_type = np.repeat(np.arange(len(self.node_types), dtype=np.int64),
                              [self.num_nodes[t] for t in self.node_types])
        return (np.concatenate(parts, axis=1).astype(np.int64), np.concatenate(kinds), node_type)


def save_hetero_npz(graph: HeteroGraph, path: str | Path) -> None:
    """Write `graph` in the typed .npz format that load_hetero_npz reads (relations in their order, no pickles).
    The caller picks the name (write to a temporary one, then rename)."""
    arrays = {"node_types": np.array(graph.node_types), "target": np.array(graph.target), "y": graph.y,
              "train_mask": graph.train_mask, "val_mask": graph.val_mask, "test_mask": graph.test_mask,
              "num_classes": np.array(graph.num_classes)}
    arrays.update({f"num_nodes__{t}": np.array(n) for t, n in graph.num_nodes.items()})
    arrays.update({f"x__{t}": x for t, x in graph.x.items()})
    arrays.update({f"edge_index__{s}__{r}__{d}": e for (s, r, d), e in graph.edges.items()})
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


def load_hetero_npz(path: str, *, reverse_relations: bool = False) -> HeteroGraph:
    """The typed .npz format: node_types, target, num_nodes__T, x__T (featured types), edge_index__S__R__D, y and
    the masks over the target's nodes. Read with allow_pickle=False: nothing in it is unpickled."""
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DatasetError(f"hetero:{path}: cannot read it as a .npz archive ({err}): give the typed .npz "
                           f"format of docs/datasets.md") from None
    with archive:
        files = set(archive.files)
        missing = [k for k in ("node_types", "target", "y", "train_mask", "val_mask", "test_mask") if k not in files]
        if missing:
            raise DatasetError(f"hetero:{path}: missing {', '.join(missing)}: the typed format needs node_types, "
                               f"target, y and the three masks (docs/datasets.md)")
        node_types = tuple(str(t) for t in archive["node_types"].reshape(-1))
        num_nodes = {}
        for t in node_types:
            if f"num_nodes__{t}" not in files:
                raise DatasetError(f"hetero:{path}: missing num_nodes__{t}: give every type's node count")
            num_nodes[t] = int(archive[f"num_nodes__{t}"])
        x = {key[len("x__"):]: np.asarray(archive[key]) for key in sorted(files) if key.startswith("x__")}
        edges: dict[Relation, np.ndarray] = {}
        for key in archive.files:  # the archive's order is the relation order, as the file lists them
            if key.startswith("edge_index__"):
                names = key[len("edge_index__"):].split("__")
                if len(names) != 3:
                    raise DatasetError(f"hetero:{path}: {key} should be edge_index__SRC__REL__DST")
                edges[(names[0], names[1], names[2])] = np.asarray(archive[key])
        y = np.asarray(archive["y"])
        graph = HeteroGraph(
            name=f"hetero:{path}", node_types=node_types, target=str(archive["target"]), num_nodes=num_nodes,
            x={t: v.astype(np.float32, copy=False) if v.dtype != np.float32 else v for t, v in x.items()},
            edges=edges, y=y.astype(np.int64, copy=False), train_mask=np.asarray(archive["train_mask"]),
            val_mask=np.asarray(archive["val_mask"]), test_mask=np.asarray(archive["test_mask"]),
            num_classes=int(archive["num_classes"]) if "num_classes" in files else int(y.max()) + 1 if y.size else 0)
    graph.validate()
    return graph.with_reverse_relations() if reverse_relations else graph
