"""Turn a part vector into per-part arrays: renumbering, local CSR, halos, send lists.

New node ids are the old ones sorted by part, then by an optional locality
block inside the part, then by original id, so part k owns the contiguous
range [partptr[k], partptr[k+1]). A part's halo is the set of
remote in-neighbours of its nodes, ordered by new id; because new ids are
contiguous per part, the halo is grouped by owner, and the rows a rank
receives from peer q land in one contiguous slice of its halo. The send list
from k to q is q's halo slice owned by k, in the same order, so sender and
receiver agree on row order without any message.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn_dist.partition.graph import EDGE_ARRAYS, Graph


@dataclass(frozen=True)
class PartStats:
    owned: int
    halo: int
    local_edges: int  # CSR entries whose source is owned
    cut_edges: int    # CSR entries whose source is a halo node
    train: int        # owned training nodes


def build_parts(graph: Graph, parts: np.ndarray, num_parts: int, blocks: np.ndarray | None = None,
                edge_type: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Returns (partptr int64 [P+1], node_map int64 [N] new->original id, per-part array dicts).

    blocks: optional int64 [N] locality block of each node inside its part
    (gnn_dist.partition.metis.locality_blocks). Each dict holds exactly the arrays of
    the public part-file format (docs/partition-format.md). edge_type: int64 [E], the relation of each edge of a
    typed graph (gnn_dist.partition.hetero_parts); each part then holds its CSR entries' relations too.
    """
    n = graph.num_nodes
    if blocks is None:
        node_map = np.argsort(parts, kind="stable").astype(np.int64)  # new id -> original id
    else:
        node_map = np.lexsort((np.arange(n), blocks, parts)).astype(np.int64)
    new_of = np.empty(n, dtype=np.int64)
    new_of[node_map] = np.arange(n, dtype=np.int64)
    partptr = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(parts, minlength=num_parts), out=partptr[1:])
    degree = np.bincount(graph.edge_index[1], minlength=n).astype(np.int64)  # indexed by original id

    src_new = new_of[graph.edge_index[0]]
    dst_new = new_of[graph.edge_index[1]]
    order = np.argsort(dst_new * n + src_new, kind="stable")
    src_new, dst_new = src_new[order], dst_new[order]
    edge_type = None if edge_type is None else edge_type[order]
    # a graph's edge arrays (edge_weight, edge_attr) follow its edges into each part's CSR entries
    edge_arrays = {name: value[order] for name in EDGE_ARRAYS
                   if (value := getattr(graph, name, None)) is not None}
    row_start = np.searchsorted(dst_new, partptr)

    halos = []
    for k in range(num_parts):
        sources = src_new[row_start[k]:row_start[k + 1]]
        remote = sources[(sources < partptr[k]) | (sources >= partptr[k + 1])]
        halos.append(np.unique(remote))

    # send lists: what k sends to q is q's halo restricted to k's nodes, in q's order.
    send_lists: list[list[np.ndarray]] = [[None] * num_parts for _ in range(num_parts)]  # type: ignore[list-item]
    for q in range(num_parts):
        bounds = np.searchsorted(halos[q], partptr)
        for k in range(num_parts):
            send_lists[k][q] = halos[q][bounds[k]:bounds[k + 1]] - partptr[k]

    arrays = []
    for k in range(num_parts):
        lo, hi = int(partptr[k]), int(partptr[k + 1])
        n_owned = hi - lo
        halo = halos[k]
        sources = src_new[row_start[k]:row_start[k + 1]]
        targets = dst_new[row_start[k]:row_start[k + 1]] - lo
        is_local = (sources >= lo) & (sources < hi)
        columns = np.where(is_local, sources - lo, n_owned + np.searchsorted(halo, sources))
        indptr = np.zeros(n_owned + 1, dtype=np.int64)
        np.cumsum(np.bincount(targets, minlength=n_owned), out=indptr[1:])
        owned_orig = node_map[lo:hi]
        halo_orig = node_map[halo]
        halo_owner = (np.searchsorted(partptr, halo, side="right") - 1).astype(np.int32)
        send_ptr = np.zeros(num_parts + 1, dtype=np.int64)
        np.cumsum([len(s) for s in send_lists[k]], out=send_ptr[1:])
        arrays.append({
            "node_ids": owned_orig,
            "halo_ids": halo_orig,
            "halo_owner": halo_owner,
            "halo_index_on_owner": (halo - partptr[halo_owner]).astype(np.int64),
            "indptr": indptr,
            "indices": columns.astype(np.int64),
            "x": np.ascontiguousarray(graph.x[owned_orig], dtype=np.float32),
            "y": graph.y[owned_orig].astype(np.int64),
            "train_mask": graph.train_mask[owned_orig],
            "val_mask": graph.val_mask[owned_orig],
            "test_mask": graph.test_mask[owned_orig],
            "deg": np.concatenate([degree[owned_orig], degree[halo_orig]]),
            "send_ptr": send_ptr,
            "send_idx": np.concatenate(send_lists[k]).astype(np.int64),
        })
        if edge_type is not None:
            arrays[-1]["edge_type"] = edge_type[row_start[k]:row_start[k + 1]].astype(np.int32)
        for name, value in edge_arrays.items():
            arrays[-1][name] = np.ascontiguousarray(value[row_start[k]:row_start[k + 1]], dtype=np.float32)
    return partptr, node_map, arrays


def part_stats(arrays: dict) -> PartStats:
    n_owned = int(arrays["node_ids"].shape[0])
    cut = int(np.count_nonzero(arrays["indices"] >= n_owned))
    return PartStats(owned=n_owned, halo=int(arrays["halo_ids"].shape[0]),
                     local_edges=int(arrays["indices"].shape[0]) - cut, cut_edges=cut,
                     train=int(arrays["train_mask"].sum()))
