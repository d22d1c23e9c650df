"""Partition a graph that no single rank holds: R ranks, each reading about 1/R of a chunked directory.

1. Edge chunks are spread over the ranks; each directed edge and its reverse
   go (Alltoallv) to the rank that owns its target under a contiguous
   distribution of original ids, which sorts and de-duplicates them into its
   slice of the symmetric CSR (no self loops): exactly the graph every loader
   builds, held 1/R per rank.
2. An assigner (PT-Scotch's distributed graph, or sequential Scotch at R=1)
   gives each node its part.
3. Node rows, degrees and adjacency lists travel to the rank that writes their
   part (part k is written by rank k mod R). There the part is numbered as
   the single-process builder numbers it (locality blocks by METIS, then
   original id), its halo is resolved through the id-range owners, and the
   send lists are the peers' halos restricted to it.
4. Every rank writes its parts; rank 0 writes meta.json last and renames the
   directory into place. The output is partition/format.py's format exactly.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from gnn_dist.memory.rss import release_free_heap, return_large_blocks_on_free
from gnn_dist.partition import chunked
from gnn_dist.partition.build import part_stats
from gnn_dist.partition.format import (
    FORMAT_VERSION,
    META_FILE,
    NODE_MAP_FILE,
    PartInfo,
    PartitionFormatError,
    PartitionMeta,
    move_into_place,
    part_file_name,
    sha256_of,
)
from gnn_dist.partition.graph import Graph, entries_of_rows, sorted_distinct_keys
from gnn_dist.partition.metis import PartitionError, check_num_parts, locality_blocks_of_part
from gnn_dist.partition.partitioner import DEFAULT_LOCALITY_BLOCK
from gnn_dist.partition.shuffle import agree, allreduce_array, exchange, group_by

EDGES_PER_ROUND = 2_000_000  # 16 MB of each edge-sized buffer per exchange round
# assigner(comm, vtxdist, indptr, adjacency, num_parts, seed) -> part of each local node (int64)
Assigner = Callable[[object, np.ndarray, np.ndarray, np.ndarray, int, int], np.ndarray]


class ChunkedSource:
    """A chunked directory, read chunk by chunk."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.meta = chunked.read_meta(directory)
        self.name, self.num_nodes = self.meta.name, self.meta.num_nodes
        self.num_features, self.num_classes = self.meta.num_features, self.meta.num_classes
        self.edge_counts = [c.count for c in self.meta.edge_chunks]

    def read_edges(self, index: int, start: int, stop: int) -> np.ndarray:
        return chunked.read_edges(self.directory, self.meta, index, start, stop)

    def read_nodes(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return chunked.read_nodes(self.directory, self.meta, start, stop)


class GraphSource:
    """An already loaded graph (one rank): one edge chunk, node rows by slicing."""

    def __init__(self, graph: Graph):
        self.graph, self.name, self.num_nodes = graph, graph.name, graph.num_nodes
        self.num_features, self.num_classes = graph.num_features, graph.num_classes
        self.edge_counts = [graph.num_edges]

    def read_edges(self, index: int, start: int, stop: int) -> np.ndarray:
        return self.graph.edge_index[:, start:stop]

    def read_nodes(self, start: int, stop: int) -> dict[str, np.ndarray]:
        g = self.graph
        return {name: getattr(g, name)[start:stop] for name in chunked.NODE_FIELDS}


def id_ranges(num_nodes: int, size: int) -> np.ndarray:
    """vtxdist: rank r holds original ids [d[r], d[r+1])."""
    return np.array([num_nodes * r // size for r in range(size + 1)], dtype=np.int64)


def _range_owner(vtxdist: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return np.searchsorted(vtxdist, ids, side="right") - 1


def my_edge_chunks(counts: list[int], rank: int, size: int) -> list[int]:
    """Contiguous chunk indices for `rank`, balanced by edge count."""
    total = max(1, sum(counts))
    before = np.concatenate([[0], np.cumsum(counts)[:-1]]) if counts else np.zeros(0)
    return [i for i, b in enumerate(before) if (b * size) // total == rank]


def symmetric_csr_slice(comm, source, vtxdist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, adjacency by original id) of this rank's id range in the symmetrised, de-duplicated graph."""
    n, lo, hi = source.num_nodes, int(vtxdist[comm.rank]), int(vtxdist[comm.rank + 1])
    # slices of at most EDGES_PER_ROUND edges, so one round's buffers stay small whatever the chunk size
    mine = [(i, begin, min(begin + EDGES_PER_ROUND, source.edge_counts[i]))
            for i in my_edge_chunks(source.edge_counts, comm.rank, comm.size)
            for begin in range(0, source.edge_counts[i], EDGES_PER_ROUND)]
    rounds = int(allreduce_array(comm, np.array([len(mine)]), "max")[0])
    received: list[np.ndarray] = []
    for t in range(rounds):
        edges = agree(comm, lambda t=t: source.read_edges(*mine[t]) if t < len(mine) else np.zeros((2, 0), np.int64))
        src, dst = edges[0], edges[1]
        keep = src != dst
        # key = target * N + source, for both directions; routed to the target's range owner
        targets = np.concatenate([dst[keep], src[keep]])
        keys = targets * n + np.concatenate([src[keep], dst[keep]])
        del edges, src, dst, keep
        order, counts = group_by(_range_owner(vtxdist, targets), comm.size)
        del targets
        got, _ = exchange(comm, keys[order], counts)
        del keys, order
        received.append(got)
    holder = [np.concatenate(received) if received else np.zeros(0, np.int64)]
    received.clear()
    keys = sorted_distinct_keys(holder)
    indptr = np.zeros(hi - lo + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // n - lo, minlength=hi - lo), out=indptr[1:])
    np.remainder(keys, n, out=keys)
    return indptr, keys


def fill_empty_parts(comm, parts: np.ndarray, lo: int, num_parts: int) -> np.ndarray:
    """gnn_dist.partition.metis._fill_empty_parts across ranks: each empty part takes the highest id of the largest part."""
    counts = allreduce_array(comm, np.bincount(parts, minlength=num_parts))
    for empty in np.flatnonzero(counts == 0):
        donor = int(np.argmax(counts))
        members = np.flatnonzero(parts == donor)
        highest = int(allreduce_array(comm, np.array([lo + members[-1] if members.size else -1]), "max")[0])
        if lo <= highest < lo + parts.shape[0]:
            parts[highest - lo] = empty
        counts[donor] -= 1
        counts[empty] += 1
    return parts


def partition_distributed(comm, source, num_parts: int, out: str | os.PathLike, *, assigner: Assigner,
                          method: str, seed: int = 0, overwrite: bool = False,
                          locality_block: int = DEFAULT_LOCALITY_BLOCK) -> PartitionMeta:
    """Every rank calls this; all return the same meta once the directory is in place."""
    check_num_parts(num_parts, source.num_nodes)
    size, rank = comm.size, comm.rank
    vtxdist = id_ranges(source.num_nodes, size)
    lo = int(vtxdist[rank])
    out = Path(out)
    tmp = out.parent / f".{out.name}.tmp-{comm.allgather_object(uuid.uuid4().hex[:8])[0]}"

    def make_tmp() -> None:
        if rank == 0:
            if out.exists() and not overwrite:
                raise PartitionFormatError(f"{out} already exists: pass --overwrite or choose another --out")
            tmp.mkdir(parents=True)

    agree(comm, make_tmp)
    # big arrays get their own mmap, so freeing one returns it at once (gnn_dist.memory.rss)
    return_large_blocks_on_free()
    try:
        indptr, adjacency = symmetric_csr_slice(comm, source, vtxdist)
        parts = np.asarray(agree(comm, partial(assigner, comm, vtxdist, indptr, adjacency, num_parts, seed)),
                           dtype=np.int64)
        release_free_heap()  # what the partitioner freed stays resident otherwise, under the build's peak
        parts = fill_empty_parts(comm, parts, lo, num_parts)
        partptr = np.zeros(num_parts + 1, dtype=np.int64)
        np.cumsum(allreduce_array(comm, np.bincount(parts, minlength=num_parts)), out=partptr[1:])
        built = _build_my_parts(comm, source, vtxdist, indptr, adjacency, parts, partptr, seed, locality_block)
        del indptr, adjacency, parts
        return _write(comm, source, built, partptr, tmp, out, method, seed, num_parts)
    except BaseException:
        if rank == 0:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _build_my_parts(comm, source, vtxdist, indptr, adjacency, parts, partptr, seed, locality_block) -> dict[int, dict]:
    size, rank, num_parts = comm.size, comm.rank, partptr.shape[0] - 1
    lo, hi = int(vtxdist[rank]), int(vtxdist[rank + 1])
    degree = np.diff(indptr)
    nodes = agree(comm, lambda: source.read_nodes(lo, hi))
    # 3. node rows, degrees and adjacency lists to the writer of their part (k mod R)
    order, counts = group_by(parts % size, size)
    masks = (nodes["train_mask"].astype(np.int64) | nodes["val_mask"].astype(np.int64) << 1
             | nodes["test_mask"].astype(np.int64) << 2)
    ids = np.arange(lo, hi, dtype=np.int64)
    header = np.stack([ids, parts, nodes["y"], masks, degree], axis=1)[order]
    header, _ = exchange(comm, header, counts)
    x, _ = exchange(comm, nodes["x"][order], counts)
    del nodes
    starts = indptr[:-1][order]
    lens = degree[order]
    gather = entries_of_rows(starts, lens)
    edge_counts = np.bincount((parts % size)[order], weights=lens, minlength=size).astype(np.int64)
    neighbours, _ = exchange(comm, adjacency[gather], edge_counts)
    del gather, starts, lens
    offsets = np.concatenate([[0], np.cumsum(header[:, 4])])

    # numbering of each part this rank writes; the range owners learn every node's new id
    built: dict[int, dict] = {}
    for k in range(rank, num_parts, size):
        rows = np.flatnonzero(header[:, 1] == k)
        rows = rows[np.argsort(header[rows, 0], kind="stable")]
        orig = header[rows, 0]
        lens = header[rows, 4]
        gather = entries_of_rows(offsets[rows], lens)
        nb = neighbours[gather]
        del gather
        row_of_entry = np.repeat(np.arange(orig.shape[0]), lens)
        pos = np.minimum(np.searchsorted(orig, nb), orig.shape[0] - 1)
        inside = orig[pos] == nb
        blocks = locality_blocks_of_part(orig.shape[0], row_of_entry[inside], pos[inside], locality_block, seed)
        perm = np.lexsort((np.arange(orig.shape[0]), blocks))
        new_index = np.empty_like(perm)
        new_index[perm] = np.arange(perm.shape[0])
        built[k] = dict(rows=rows[perm], orig=orig[perm], nb=nb, entry_row=new_index[row_of_entry],
                        inside=inside, local_col=new_index[pos])
    del neighbours
    new_of = _publish_new_ids(comm, vtxdist, built, partptr)

    # halos: new ids and global degrees from the range owners
    halo_orig = {k: np.unique(b["nb"][~b["inside"]]) for k, b in built.items()}
    asked = np.concatenate([halo_orig[k] for k in sorted(built)] + [np.zeros(0, np.int64)])
    answers = _lookup(comm, vtxdist, asked, np.stack([new_of, degree], axis=1))
    cursor = 0
    for k in sorted(built):
        b, n_halo = built[k], halo_orig[k].shape[0]
        b["halo_orig_sorted"], b["halo_new_by_orig"] = halo_orig[k], answers[cursor:cursor + n_halo, 0]
        b["halo_deg_by_orig"] = answers[cursor:cursor + n_halo, 1]
        cursor += n_halo
    send_lists = _send_lists(comm, built, partptr)
    return {k: _part_arrays(built[k], header, x, partptr, k, send_lists[k]) for k in sorted(built)}


def _publish_new_ids(comm, vtxdist, built, partptr) -> np.ndarray:
    """The new id of every node in this rank's id range."""
    pairs = [np.stack([b["orig"], partptr[k] + np.arange(b["orig"].shape[0])], axis=1) for k, b in built.items()]
    pairs_all = np.concatenate(pairs + [np.zeros((0, 2), np.int64)])
    order, counts = group_by(_range_owner(vtxdist, pairs_all[:, 0]), comm.size)
    got, _ = exchange(comm, pairs_all[order], counts)
    lo, hi = int(vtxdist[comm.rank]), int(vtxdist[comm.rank + 1])
    new_of = np.full(hi - lo, -1, dtype=np.int64)
    new_of[got[:, 0] - lo] = got[:, 1]
    return new_of


def _lookup(comm, vtxdist, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """table rows (held by the range owners, indexed by id - range start) for each of `ids`, in order."""
    order, counts = group_by(_range_owner(vtxdist, ids), comm.size)
    asked, asked_counts = exchange(comm, ids[order], counts)
    replies, _ = exchange(comm, table[asked - vtxdist[comm.rank]], asked_counts)
    answers = np.empty_like(replies)
    answers[order] = replies
    return answers


def _send_lists(comm, built, partptr) -> dict[int, list[np.ndarray]]:
    """For each part k here, what k sends to each q: q's halo owned by k, in q's order."""
    size, num_parts = comm.size, partptr.shape[0] - 1
    for b in built.values():
        b["halo_new"] = np.sort(b["halo_new_by_orig"])
        b["halo_owner"] = np.searchsorted(partptr, b["halo_new"], side="right") - 1
    mine = {q: np.bincount(b["halo_owner"], minlength=num_parts) for q, b in built.items()}
    matrix = np.zeros((num_parts, num_parts), dtype=np.int64)  # matrix[q, k]: q's halo rows owned by k
    for gathered in comm.allgather_object(mine):
        for q, row in gathered.items():
            matrix[q] = row
    pieces, counts = [], np.zeros(size, dtype=np.int64)
    for dest in range(size):
        for q in sorted(built):
            starts = np.concatenate([[0], np.cumsum(matrix[q])])
            for k in range(dest, num_parts, size):
                pieces.append(built[q]["halo_new"][starts[k]:starts[k + 1]])
                counts[dest] += matrix[q, k]
    got, got_counts = exchange(comm, np.concatenate(pieces + [np.zeros(0, np.int64)]), counts)
    lists = {k: [None] * num_parts for k in built}
    cursor = 0
    for source_rank in range(size):
        for q in range(source_rank, num_parts, size):
            for k in sorted(built):
                lists[k][q] = got[cursor:cursor + matrix[q, k]] - partptr[k]
                cursor += matrix[q, k]
    return lists  # type: ignore[return-value]


def _part_arrays(b: dict, header: np.ndarray, x: np.ndarray, partptr: np.ndarray, k: int,
                 send_list: list[np.ndarray]) -> dict:
    n_owned = b["orig"].shape[0]
    halo_new = b["halo_new"]
    by_new = np.argsort(b["halo_new_by_orig"], kind="stable")  # halo index (new-id order) -> by-orig index
    halo_index_of_sorted = np.empty_like(by_new)
    halo_index_of_sorted[by_new] = np.arange(by_new.shape[0])
    nb, inside = b["nb"], b["inside"]
    columns = np.empty(nb.shape[0], dtype=np.int64)
    columns[inside] = b["local_col"][inside]
    columns[~inside] = n_owned + halo_index_of_sorted[np.searchsorted(b["halo_orig_sorted"], nb[~inside])]
    source_new = np.where(columns < n_owned, partptr[k] + columns, halo_new[np.maximum(columns - n_owned, 0)])
    order = np.lexsort((source_new, b["entry_row"]))  # CSR by row, each row by source's new id (as build_parts)
    indptr = np.zeros(n_owned + 1, dtype=np.int64)
    np.cumsum(np.bincount(b["entry_row"], minlength=n_owned), out=indptr[1:])
    rows = header[b["rows"]]
    halo_owner = b["halo_owner"]
    send_ptr = np.zeros(len(send_list) + 1, dtype=np.int64)
    np.cumsum([s.shape[0] for s in send_list], out=send_ptr[1:])
    return {
        "node_ids": b["orig"],
        "halo_ids": b["halo_orig_sorted"][by_new],
        "halo_owner": halo_owner.astype(np.int32),
        "halo_index_on_owner": (halo_new - partptr[halo_owner]).astype(np.int64),
        "indptr": indptr,
        "indices": columns[order],
        "x": np.ascontiguousarray(x[b["rows"]], dtype=np.float32),
        "y": rows[:, 2].copy(),
        "train_mask": (rows[:, 3] & 1).astype(bool),
        "val_mask": (rows[:, 3] & 2).astype(bool),
        "test_mask": (rows[:, 3] & 4).astype(bool),
        "deg": np.concatenate([rows[:, 4], b["halo_deg_by_orig"][by_new]]),
        "send_ptr": send_ptr,
        "send_idx": np.concatenate(send_list + [np.zeros(0, np.int64)]).astype(np.int64),
    }


def _write(comm, source, built: dict[int, dict], partptr, tmp: Path, out: Path, method: str, seed: int,
           num_parts: int) -> PartitionMeta:
    from numpy.lib.format import open_memmap

    partition_id = comm.allgather_object(uuid.uuid4().hex)[0]

    def create_node_map() -> None:
        if comm.rank == 0:
            open_memmap(tmp / NODE_MAP_FILE, mode="w+", dtype=np.int64, shape=(source.num_nodes,)).flush()

    agree(comm, create_node_map)

    def write_parts() -> dict[int, dict]:
        node_map = open_memmap(tmp / NODE_MAP_FILE, mode="r+")
        infos = {}
        for k, arrays in built.items():
            node_map[partptr[k]:partptr[k + 1]] = arrays["node_ids"]
            name = part_file_name(k)
            np.savez(tmp / name, partition_id=np.array(partition_id), part_id=np.int64(k), **arrays)
            infos[k] = dict(file=name, sha256=sha256_of(tmp / name), **part_stats(arrays).__dict__)
        node_map.flush()
        del node_map
        return infos

    infos: dict[int, dict] = {}
    for gathered in comm.allgather_object(agree(comm, write_parts)):
        infos.update(gathered)
    num_edges = int(allreduce_array(comm, np.array([sum(a["indices"].shape[0] for a in built.values())]))[0])
    num_train = int(allreduce_array(comm, np.array([sum(int(a["train_mask"].sum()) for a in built.values())]))[0])
    meta = PartitionMeta(format_version=FORMAT_VERSION, partition_id=partition_id, dataset=source.name,
                         num_nodes=source.num_nodes, num_edges=num_edges, num_parts=num_parts,
                         num_features=source.num_features, num_classes=source.num_classes, num_train=num_train,
                         method=method, seed=seed, partptr=[int(v) for v in partptr],
                         parts=[PartInfo(**infos[k]) for k in range(num_parts)])

    def publish() -> None:
        if comm.rank == 0:
            (tmp / META_FILE).write_text(meta.to_json())
            move_into_place(tmp, out)

    agree(comm, publish)
    return meta


__all__ = ["ChunkedSource", "GraphSource", "PartitionError", "partition_distributed", "symmetric_csr_slice",
           "id_ranges", "my_edge_chunks"]
