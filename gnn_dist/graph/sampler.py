"""Distributed neighbour sampling of sampled training (the remote features: gnn_dist.graph.feature_store).

Node names: every rank speaks in *global* ids (the partition's contiguous
numbering: part k owns [partptr[k], partptr[k+1])), so the owner of any node
is one searchsorted away. Samples are drawn by the node's owner, which knows
its neighbours' original ids.

Uniform sampling without replacement, independent of who asks and of P: for
target v and candidate neighbour u, score = hash(key, orig(v), orig(u)) and
the k smallest scores win. The k smallest of i.i.d. uniform scores are a
uniform k-subset, and the scores depend only on the key (seed, epoch, step,
hop) and original ids, never on the local order of a CSR row.

Blocks are DGL-style: hop h samples fresh neighbours for every node of level
h-1 (seeds at level 0); level h lists level h-1's nodes first, then the new
ones, so a layer's targets are a prefix of its sources.

`--sampling local` samples only inside the rank's part: a frontier node owned
elsewhere (a halo node) gets no neighbours of its own, and nodes beyond the
halo never appear. That sends no sampling requests and fetches no features
beyond the cached halo, and it biases the estimate: boundary nodes aggregate
over truncated neighbourhoods at the deeper hops (more so with more parts).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from gnn_dist.comm.communicator import Comm, exchange_rows
from gnn_dist.kernels.keyed_random import edge_scores, sample_key
from gnn_dist.kernels.native import native_module
from gnn_dist.partition.format import PartData
from gnn_dist.partition.graph import entries_of_rows


class Relabel:
    """A sample's levels in local positions: `reset(seeds)` makes the seeds level 0, and `extend(sources)` makes
    a hop's sources that no level holds yet the next level's new nodes, in order of first appearance, and
    returns (new, each source's position in [every level so far | new]). Natively one hash table serves every
    sample of a sampler (each hop inserts only what it adds); the numpy path (no compiler, and the test
    reference) gives exactly the same."""

    def __init__(self):
        native = native_module()
        self._native = native.Relabel() if native is not None else None
        self._level = np.zeros(0, dtype=np.int64)

    def reset(self, seeds: np.ndarray) -> None:
        seeds = np.ascontiguousarray(seeds, dtype=np.int64)
        if self._native is not None:
            self._native.reset(torch.from_numpy(seeds))
        self._level = seeds

    def extend(self, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sources = np.ascontiguousarray(sources, dtype=np.int64)
        if self._native is not None:
            new, src = self._native.extend(torch.from_numpy(sources))
            return new.numpy(), src.numpy()
        level = self._level
        unseen = ~np.isin(sources, level)
        distinct, first = np.unique(sources[unseen], return_index=True)
        new = distinct[np.argsort(first, kind="stable")]  # in order of first appearance
        self._level = level = np.concatenate([level, new])
        order = np.argsort(level, kind="stable")
        # a repeated seed: sources point at its last copy, as the native table keeps it
        return new, order[np.searchsorted(level[order], sources, side="right") - 1]


class RowSampler:
    """The keyed draw over one CSR of owned rows: up to `fanout` of a row's neighbours, the smallest scores
    hash(key, orig(row), orig(neighbour)) winning, each winner named by `names` (its column's global id; a typed
    sampler's names carry the type too). Natively in one pass; the numpy path (no compiler, and the test
    reference) gives exactly the same.

    Shapes: indptr [n_owned + 1], indices [entries] (columns), orig and names [columns], all int64."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, orig: np.ndarray, names: np.ndarray):
        self.indptr, self.indices, self.orig, self.names = indptr, indices, orig, names
        # int64 views for the native sampler, made once (torch.from_numpy shares the memory)
        self._tensors = tuple(torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
                              for a in (indptr, indices, orig, names))

    def sample(self, rows: np.ndarray, fanout: int, key: np.uint64) -> tuple[np.ndarray, np.ndarray]:
        """(count per row, the winners' names grouped by row, each row's in CSR order)."""
        native = native_module()
        if native is not None:
            indptr_t, indices_t, orig_t, names_t = self._tensors
            rows_t = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
            counts, picked = native.sample_rows(indptr_t, indices_t, rows_t, orig_t, names_t,
                                                int(np.array(key, dtype=np.uint64).view(np.int64)), fanout)
            return counts.numpy(), picked.numpy()  # names, mapped in the kernel's pass
        return self.sample_numpy(rows, fanout, key)

    def sample_numpy(self, rows: np.ndarray, fanout: int, key: np.uint64) -> tuple[np.ndarray, np.ndarray]:
        """The same draw in numpy (the fallback without the native kernels, and their test reference)."""
        indptr, indices = self.indptr, self.indices
        starts = indptr[rows]
        degrees = indptr[rows + 1] - starts
        total = int(degrees.sum())
        if total == 0:
            return np.zeros(len(rows), dtype=np.int64), np.zeros(0, dtype=np.int64)
        row_of = np.repeat(np.arange(len(rows), dtype=np.int64), degrees)
        neighbours = indices[entries_of_rows(starts, degrees)]
        scores = edge_scores(key, self.orig[rows][row_of], self.orig[neighbours])
        order = np.lexsort((scores, row_of))
        # Sorting keeps rows grouped in place, so position k of `order` has the same rank within
        # its row as entry k of the CSR slices: the first `fanout` of each row win.
        rank_in_row = entries_of_rows(np.zeros(len(rows), dtype=np.int64), degrees)
        keep = np.sort(order[rank_in_row < fanout])  # each row's winners in CSR order, as the native kernel lists them
        return np.minimum(degrees, fanout), self.names[neighbours[keep]]


@dataclass
class SamplingCounters:
    sample_bytes: int = 0
    feature_bytes: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    halo_hits: int = 0
    sample_s: float = 0.0
    fetch_s: float = 0.0

    def reset(self) -> None:
        self.sample_bytes = self.feature_bytes = self.cache_hits = self.cache_misses = self.halo_hits = 0
        self.sample_s = self.fetch_s = 0.0


@dataclass
class Block:
    """Sampled edges from level h nodes (sources) to level h-1 nodes (targets, a prefix)."""

    dst: torch.Tensor  # int64 [E]: target position in level h-1, ascending (entries grouped by target)
    src: torch.Tensor  # int64 [E]: source position in level h
    n_dst: int
    n_src: int


@dataclass
class DistributedSampler:
    comm: Comm
    part: PartData
    fanouts: list[int]
    seed: int
    local_only: bool = False
    counters: SamplingCounters = field(default_factory=SamplingCounters)

    def __post_init__(self):
        meta = self.part.meta
        self.partptr = np.asarray(meta.partptr, dtype=np.int64)
        self.rank = self.part.part_id
        self.first = int(self.partptr[self.rank])
        part = self.part
        owner = part.halo_owner.astype(np.int64)
        self.local_to_global = np.concatenate([
            self.first + np.arange(part.n_owned, dtype=np.int64),
            self.partptr[owner] + part.halo_index_on_owner])
        self.local_orig = np.concatenate([part.node_ids, part.halo_ids]).astype(np.int64)
        self._relabel = Relabel()  # its table is reused by every sample
        self.csr = RowSampler(part.indptr, part.indices, self.local_orig, self.local_to_global)

    def owner_of(self, global_ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.partptr, global_ids, side="right") - 1

    def sample_owned(self, local_rows: np.ndarray, fanout: int, key: np.uint64) -> tuple[np.ndarray, np.ndarray]:
        """(count per row, neighbours' global ids grouped by row) for owned rows, sampled here."""
        return self.csr.sample(local_rows, fanout, key)

    def _exchange_ints(self, send: np.ndarray, send_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Variable-length int64 messages to every peer: (received values, counts per peer)."""
        recv, recv_counts, sent = exchange_rows(self.comm, np.asarray(send, dtype=np.int64), send_counts)
        self.counters.sample_bytes += sent
        return recv, recv_counts

    def sample_hop(self, frontier: np.ndarray, fanout: int, key: np.uint64) -> tuple[np.ndarray, np.ndarray]:
        """Sample for every frontier node (global ids). Returns (count per frontier node, sources grouped)."""
        owners = self.owner_of(frontier)
        counts = np.zeros(len(frontier), dtype=np.int64)
        mine = np.flatnonzero(owners == self.rank)
        own_counts, own_sources = self.sample_owned(frontier[mine] - self.first, fanout, key)
        if self.comm.size == 1:
            return own_counts, own_sources  # every frontier node is this rank's, in frontier order
        counts[mine] = own_counts
        remote = np.zeros(0, dtype=np.int64)
        got_sources = np.zeros(0, dtype=np.int64)
        if not self.local_only:
            remote = np.flatnonzero(owners != self.rank)
            remote = remote[np.argsort(owners[remote], kind="stable")]
            request_counts = np.bincount(owners[remote], minlength=self.comm.size)
            asked, asked_counts = self._exchange_ints(frontier[remote], request_counts)
            answer_counts, answer_sources = self.sample_owned(asked - self.first, fanout, key)
            asker = np.repeat(np.arange(self.comm.size), asked_counts)
            sources_per_peer = np.bincount(asker, weights=answer_counts, minlength=self.comm.size).astype(np.int64)
            got_counts, _ = self._exchange_ints(answer_counts, asked_counts)
            got_sources, _ = self._exchange_ints(answer_sources, sources_per_peer)
            counts[remote] = got_counts
        # lay both groups out in frontier order
        offsets = np.cumsum(counts) - counts
        sources = np.empty(int(counts.sum()), dtype=np.int64)
        sources[entries_of_rows(offsets[mine], counts[mine])] = own_sources
        sources[entries_of_rows(offsets[remote], counts[remote])] = got_sources
        return counts, sources

    def sample(self, seeds_global: np.ndarray, epoch: int, step: int) -> tuple[np.ndarray, list[Block]]:
        """All levels' nodes (global ids, level L last) and the blocks, hop 1 first."""
        start = time.perf_counter()
        nodes = np.asarray(seeds_global, dtype=np.int64)
        blocks = []
        relabel = self._relabel
        relabel.reset(nodes)
        for hop, fanout in enumerate(self.fanouts):
            counts, sources = self.sample_hop(nodes, fanout, sample_key(self.seed, epoch, step, hop))
            dst = np.repeat(np.arange(len(nodes), dtype=np.int64), counts)
            new, src = relabel.extend(sources)
            level = np.concatenate([nodes, new])
            blocks.append(Block(torch.from_numpy(dst), torch.from_numpy(src), len(nodes), len(level)))
            nodes = level
        self.counters.sample_s += time.perf_counter() - start
        return nodes, blocks
