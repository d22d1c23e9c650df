"""A typed part as its rank sees it: the type of each owned and halo row, and the relation operator.

Node ids in a typed partition are homogeneous (type offset + type-local id, partition.hetero), so a row's
type is one search in the type offsets away; every rank derives it alike from the ids, which is what lets a
sender and a receiver pick the same rows of one type without a message (HaloPlan.restricted).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gnn_dist.halo.blocks import BlockedOperator, build_blocked_operator
from gnn_dist.kernels.spmm import SparseOperator
from gnn_dist.partition.format import PartData, type_offsets


@dataclass(frozen=True)
class TypedPart:
    """Shapes: owned_type [n_owned], halo_type [n_halo], both int64 type indices into node_types."""

    node_types: tuple[str, ...]
    target: str
    relations: tuple[tuple[str, str, str], ...]
    feature_widths: dict
    offsets: np.ndarray  # int64 [T + 1]
    owned_type: np.ndarray
    halo_type: np.ndarray

    @classmethod
    def of(cls, part: PartData) -> TypedPart:
        hetero = part.meta.hetero
        offsets = type_offsets(hetero)
        return cls(node_types=tuple(hetero["node_types"]), target=hetero["target"],
                   relations=tuple(tuple(r) for r in hetero["relations"]), feature_widths=dict(hetero["feature_widths"]),
                   offsets=offsets, owned_type=np.searchsorted(offsets, part.node_ids, side="right") - 1,
                   halo_type=np.searchsorted(offsets, part.halo_ids, side="right") - 1)

    @property
    def num_relations(self) -> int:
        return len(self.relations)

    def type_index(self, name: str) -> int:
        return self.node_types.index(name)

    def featured(self, name: str) -> bool:
        return bool(self.feature_widths[name])


class RelationOperator:
    """Each relation's mean aggregation (RGCNConv(aggr='mean')), in the two forms a layer may ask for.

    A relation r reaches the owned nodes with at least one in-edge of r (nodes[offsets[r]:offsets[r + 1]]: only
    a (node, relation) pair with edges has a row, so a weight multiplies no row its relation leaves empty: on
    Freebase a node receives 1-3 of its 6 relations) from its sources, the [owned | halo] columns those edges
    start at. Each entry is 1 / (the node's in-edges of r). Every in-edge of an owned node lies in its part, so
    the counts are local.

    A layer aggregates a relation first (stacked(): the blocks of the chosen relations as rows of one matrix
    over [owned | halo], one product for all of them) or transforms its sources first (gathered(r): a matrix
    from the relation's sources alone), whichever multiplies fewer rows by the weight: for Freebase's `ma`
    relation, 3.5k movies reach 33k actors. Both forms are built once and shared by the layers; the typed stack
    builds every form its layers use at set-up, then release_entries() drops the entries they were built from
    (28 bytes an entry), so a rank keeps the forms alone.

    Shapes: nodes int64 [S]; offsets R + 1 row offsets into them; stacked [rows of the relations, n_columns];
    gathered(r) ([|nodes of r|, |sources of r|], sources int64 [|sources of r|])
    """

    def __init__(self, rows: np.ndarray, cols: np.ndarray, values: np.ndarray, offsets: np.ndarray,
                 nodes: np.ndarray, n_owned: int, n_columns: int, device: torch.device):
        if len(rows) > 1 and not bool(np.all(rows[1:] >= rows[:-1])):  # a sampled block's come grouped already
            order = np.argsort(rows, kind="stable")  # entries grouped by row, so by relation too
            rows, cols, values = rows[order], cols[order], values[order]
        self._rows, self._cols, self._values = rows, cols, values
        self._entry_offsets = np.searchsorted(self._rows, offsets)
        self.offsets = tuple(int(o) for o in offsets)
        self.nodes = torch.from_numpy(nodes).to(device)
        self.n_owned, self.n_columns, self.device = n_owned, n_columns, device
        self._stacked: dict = {}
        self._blocked: dict = {}
        self._gathered: dict = {}
        self._distinct: dict = {}
        self._counts: dict = {}
        self._halo_sources: dict = {}
        self._released = False

    @property
    def num_relations(self) -> int:
        return len(self.offsets) - 1

    def _entries(self, r: int) -> slice:
        return slice(int(self._entry_offsets[r]), int(self._entry_offsets[r + 1]))

    def _sources(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """(relation r's distinct source columns, each entry's position among them), found once for every
        layer's plan and the gathered form."""
        if r not in self._distinct:
            sources, position = np.unique(self._cols[self._entries(r)], return_inverse=True)
            self._distinct[r] = sources, position.reshape(-1)
        return self._distinct[r]

    def reached(self, r: int) -> torch.Tensor:
        """The owned rows relation r reaches (its block's rows, in order)."""
        return self.nodes[self.offsets[r]:self.offsets[r + 1]]

    def counts(self, r: int) -> tuple[int, int, int]:
        """(nodes reached, distinct sources, entries) of relation r."""
        if r not in self._counts:
            sources, position = self._sources(r)
            self._counts[r] = self.offsets[r + 1] - self.offsets[r], len(sources), len(position)
        return self._counts[r]

    def has_halo_sources(self, r: int) -> bool:
        """Whether an entry of relation r starts at a halo column (answered before the entries are released)."""
        if r not in self._halo_sources:
            sources, _ = self._sources(r)  # sorted: the last is the largest column
            self._halo_sources[r] = bool(len(sources)) and int(sources[-1]) >= self.n_owned
        return self._halo_sources[r]

    def release_entries(self) -> None:
        """Drop the entries once every form in use is built: later forms cannot be made, counts still answer."""
        for r in range(self.num_relations):
            self.counts(r)
            self.has_halo_sources(r)
        del self._rows, self._cols, self._values
        self._distinct = {}
        self._released = True

    def _check_entries(self, form: str) -> None:
        if self._released:
            raise RuntimeError(f"the {form} form was not built at set-up, and the relation entries are released: "
                               f"build every form a layer uses before RelationOperator.release_entries()")

    def stacked(self, relations: tuple[int, ...]) -> SparseOperator:
        """The blocks of `relations`, in that order, as the rows of one operator over [owned | halo]."""
        if relations not in self._stacked:
            self._check_entries(f"stacked {relations}")
            rows, cols, values, n_rows = self._stacked_entries(relations)
            self._stacked[relations] = _operator(rows, cols, values, (n_rows, self.n_columns), self.device)
        return self._stacked[relations]

    def blocked(self, relations: tuple[int, ...], rank: int, send_counts_matrix: np.ndarray,
                recv_counts: np.ndarray, block_rows: int) -> BlockedOperator:
        """The stacked form of `relations` split by columns into its owned columns and its halo blocks
        (--halo-memory sequential: gnn_dist.halo.blocks), one block of halo rows alive at a time."""
        if relations not in self._blocked:
            self._check_entries(f"blocked {relations}")
            rows, cols, values, n_rows = self._stacked_entries(relations)
            placed = [torch.from_numpy(a).to(self.device) for a in (rows, cols.astype(np.int64, copy=False),
                                                                   values.astype(np.float32, copy=False))]
            del rows, cols, values
            self._blocked[relations] = build_blocked_operator(*placed, self.n_owned, rank, send_counts_matrix,
                                                              recv_counts, block_rows, n_rows=n_rows)
        return self._blocked[relations]

    def _stacked_entries(self, relations: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(rows, columns, values, row count) of the stacked form: relation r's rows renumbered after the
        relations before it in `relations`, its entries grouped by row."""
        rows, cols, values, first = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float32)], 0
        for r in relations:
            entries = self._entries(r)
            rows.append(self._rows[entries] - self.offsets[r] + first)
            cols.append(self._cols[entries])
            values.append(self._values[entries])
            first += self.offsets[r + 1] - self.offsets[r]
        return np.concatenate(rows), np.concatenate(cols), np.concatenate(values), first

    def gathered(self, r: int) -> tuple[SparseOperator, torch.Tensor]:
        """Relation r from its sources alone: (operator [its nodes, its sources], the sources' column ids)."""
        if r not in self._gathered:
            self._check_entries(f"gathered {r}")
            entries = self._entries(r)
            sources, cols = self._sources(r)
            operator = _operator(self._rows[entries] - self.offsets[r], cols, self._values[entries],
                                 (self.offsets[r + 1] - self.offsets[r], len(sources)), self.device)
            self._gathered[r] = operator, torch.from_numpy(sources).to(self.device)
        return self._gathered[r]


def _operator(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int],
              device: torch.device) -> SparseOperator:
    # the entries are grouped by row (RelationOperator keeps them so): the matrix needs no sort
    return SparseOperator.from_coo(torch.from_numpy(rows.astype(np.int64)).to(device),
                                   torch.from_numpy(cols.astype(np.int64)).to(device),
                                   torch.from_numpy(values.astype(np.float32)).to(device), shape, rows_sorted=True)


def relation_operator(part: PartData, num_relations: int, device: torch.device) -> RelationOperator:
    n = part.n_owned
    destination = np.repeat(np.arange(n, dtype=np.int64), np.diff(part.indptr))
    return edges_operator(destination, part.indices.astype(np.int64), part.edge_type, n, n + part.n_halo,
                          num_relations, device)


def edges_operator(destination: np.ndarray, source: np.ndarray, relation: np.ndarray, n_destinations: int,
                   n_columns: int, num_relations: int, device: torch.device) -> RelationOperator:
    """The RelationOperator of typed edges (a part's, or a sampled block's): destination rows in [0,
    n_destinations), source columns in [0, n_columns), each edge's relation index."""
    n = n_destinations
    pair = relation.astype(np.int64) * n + destination  # sorted pairs: relation-major, then node
    if len(pair) and bool(np.all(pair[1:] >= pair[:-1])):
        # a sampled block's edges come sorted by (relation, target): its pairs are runs, found without a sort
        first = np.flatnonzero(np.concatenate([[True], pair[1:] != pair[:-1]]))
        pairs, counts = pair[first], np.diff(np.append(first, len(pair)))
        rows = np.repeat(np.arange(len(first), dtype=np.int64), counts)
    else:
        pairs, rows, counts = np.unique(pair, return_inverse=True, return_counts=True)
        rows = rows.reshape(-1)
    offsets = np.searchsorted(pairs, np.arange(num_relations + 1, dtype=np.int64) * n)
    values = (1.0 / counts[rows]).astype(np.float32)
    return RelationOperator(rows, source, values, offsets, pairs % max(n, 1), n, n_columns, device)
