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


def relation_operator(part: PartData, num_relations: int, device: torch.device) -> SparseOperator:
    """Row i * R + r: node i's in-edges of relation r, each 1 / their count (the mean of RGCNConv(aggr='mean')),
    over [owned | halo] columns. Every in-edge of an owned node lies in its part, so the counts are local.

    Shapes: [n_owned * R, n_owned + n_halo]
    """
    n = part.n_owned
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(part.indptr)) * num_relations + part.edge_type
    counts = np.bincount(rows, minlength=n * num_relations)
    values = 1.0 / counts[rows]
    return SparseOperator.from_coo(torch.from_numpy(rows).to(device), torch.from_numpy(part.indices).to(device),
                                   torch.from_numpy(values.astype(np.float32)).to(device),
                                   (n * num_relations, n + part.n_halo))
