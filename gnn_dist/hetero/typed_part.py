"""A typed part as its rank sees it: the type of each owned and halo row, and the relation operator.

Node ids in a typed partition are homogeneous (type offset + type-local id, partition.hetero), so a row's
type is one search in the type offsets away; every rank derives it alike from the ids, which is what lets a
sender and a receiver pick the same rows of one type without a message (HaloPlan.restricted).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

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


@dataclass(frozen=True)
class RelationOperator:
    """Each relation's mean aggregation as one block of rows of one sparse matrix.

    Rows offsets[r]:offsets[r + 1] are the owned nodes with at least one in-edge of relation r (their local ids:
    nodes[...]), each row that node's in-edges of r, each 1 / their count (RGCNConv(aggr='mean')), over
    [owned | halo] columns. Only a (node, relation) pair with edges has a row, so relation r's weight multiplies
    the rows r reaches and no others: on Freebase a node receives 1-3 of its 6 relations, and multiplying every
    node's row for every relation cost about 5x the products (DGL's per-relation GraphConv makes the few).
    Every in-edge of an owned node lies in its part, so the counts are local.

    Shapes: operator [S, n_owned + n_halo]; nodes int64 [S]; offsets R + 1 row offsets
    """

    operator: SparseOperator
    nodes: torch.Tensor
    offsets: tuple[int, ...]
    n_owned: int


def relation_operator(part: PartData, num_relations: int, device: torch.device) -> RelationOperator:
    n = part.n_owned
    destination = np.repeat(np.arange(n, dtype=np.int64), np.diff(part.indptr))
    pair = part.edge_type.astype(np.int64) * n + destination  # sorted pairs: relation-major, then node
    pairs, rows, counts = np.unique(pair, return_inverse=True, return_counts=True)
    offsets = np.searchsorted(pairs, np.arange(num_relations + 1, dtype=np.int64) * n)
    values = (1.0 / counts[rows]).astype(np.float32)
    operator = SparseOperator.from_coo(torch.from_numpy(rows.astype(np.int64)).to(device),
                                       torch.from_numpy(part.indices.astype(np.int64)).to(device),
                                       torch.from_numpy(values).to(device), (len(pairs), n + part.n_halo))
    return RelationOperator(operator, torch.from_numpy(pairs % max(n, 1)).to(device),
                            tuple(int(o) for o in offsets), n)
