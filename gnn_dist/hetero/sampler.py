"""Neighbour sampling on a typed graph (`--mode sampled` on a typed partition): per hop, up to the hop's fanout
of each node's in-neighbours *per relation*, as PyG's NeighborLoader and DGL's NeighborSampler take a fanout
on a heterograph. A paper with 40 citing papers, 3 authors and 12 fields at fanout 10 gets 10 + 3 + 10
neighbours, where a total fanout of 10 would share those 10 among the relations by chance.

It is the homogeneous sampler (gnn_dist.graph.sampler) with two changes:
- each owned row's in-edges are split by relation (one CSR per relation, relation-major in one array), and a
  relation's draw is keyed by (seed, epoch, step, hop, relation) and the endpoints' original ids, which are
  unique per (type, type-local id): a node's sample never depends on P, and paper 5 and author 5 draw apart;
- a node's name is (global id) * T + (its type), so every rank knows the type of every node it meets without
  holding a whole-graph table: the owner, which knows its rows' and halo's types, names the neighbours it
  draws. One request and one reply per hop carry every relation's draw of a node.

Blocks are DGL-style as in the homogeneous sampler (a layer's targets are a prefix of its sources), each edge
with its relation.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from gnn_dist.graph.sampler import DistributedSampler, RowSampler
from gnn_dist.hetero.typed_part import TypedPart
from gnn_dist.kernels.keyed_random import sample_key
from gnn_dist.partition.graph import entries_of_rows


@dataclass
class TypedBlock:
    """Sampled edges from level h nodes (sources) to level h-1 nodes (targets, a prefix), with their relations."""

    dst: torch.Tensor       # int64 [E]: target position in level h-1
    src: torch.Tensor       # int64 [E]: source position in level h
    relation: torch.Tensor  # int64 [E]: the edge's relation index
    n_dst: int
    n_src: int


class TypedSampler(DistributedSampler):
    """Node names: global id * num_types + type (see the module's docstring); `first` and `partptr` stay in
    global ids."""

    def __post_init__(self):
        super().__post_init__()
        part = self.part
        self.typed = typed = TypedPart.of(part)
        self.num_types = T = len(typed.node_types)
        self.num_relations = R = typed.num_relations
        local_type = np.concatenate([typed.owned_type, typed.halo_type]).astype(np.int64)
        self.local_names = self.local_to_global * T + local_type
        # in-edges relation-major: relation r's CSR over the owned rows is a slice of one array. The part's
        # entries are row-major, so relation r's entries in part order are already its CSR's, row by row: one
        # pass per relation (its entries' mask, the running count read at the row bounds), where a sort of
        # (relation, row) keys held four int64 copies of the entries at set-up's peak
        indptr, edge_type = part.indptr, part.edge_type
        indices = np.empty(len(part.indices), dtype=np.int64)
        self.relation_csrs = []
        first = 0
        for r in range(R):
            of_r = edge_type == r
            running = np.zeros(len(of_r) + 1, dtype=np.int64)
            np.cumsum(of_r, out=running[1:])
            relation_indptr = running[indptr]
            del running
            count = int(relation_indptr[-1])
            indices[first:first + count] = part.indices[of_r]
            del of_r
            self.relation_csrs.append(RowSampler(relation_indptr, indices[first:first + count], self.local_orig,
                                                 self.local_names))
            first += count
        self.csr = None  # the homogeneous CSR sampler is not used on a typed part

    def names_of_owned(self, local_rows: np.ndarray) -> np.ndarray:
        return self.local_names[local_rows]

    def global_of(self, names: np.ndarray) -> np.ndarray:
        return names // self.num_types

    def type_of(self, names: np.ndarray) -> np.ndarray:
        return names % self.num_types

    def sample_owned_typed(self, local_rows: np.ndarray, fanout: int, keys: list) -> tuple[np.ndarray, np.ndarray]:
        """(counts [rows, R], the neighbours' names relation-major: relation 0's draws row by row, then
        relation 1's, ...)."""
        counts, picked = zip(*(csr.sample(local_rows, fanout, key) for csr, key in zip(self.relation_csrs, keys)))
        return np.stack(counts, axis=1), np.concatenate(picked)

    def sample_typed_hop(self, frontier: np.ndarray, fanout: int, keys: list) -> tuple[np.ndarray, np.ndarray]:
        """Sample every relation for every frontier node (names): (counts [frontier, R], the sources' names
        relation-major, each relation's in frontier order). One request and one reply round whoever owns the
        nodes; no sort anywhere, only contiguous runs moved (each owner's draws are relation-major over the rows
        it was asked, so a relation's draws for one asker are one run)."""
        R = self.num_relations
        owners = self.owner_of(self.global_of(frontier))
        mine = np.flatnonzero(owners == self.rank)
        own_counts, own_sources = self.sample_owned_typed(self.global_of(frontier[mine]) - self.first, fanout, keys)
        if self.comm.size == 1:
            return own_counts, own_sources  # every frontier node is this rank's, in frontier order
        counts = np.zeros((len(frontier), R), dtype=np.int64)
        counts[mine] = own_counts
        groups = [(mine, own_counts, own_sources)]
        if not self.local_only:
            remote = np.flatnonzero(owners != self.rank)
            remote = remote[np.argsort(owners[remote], kind="stable")]
            request_counts = np.bincount(owners[remote], minlength=self.comm.size)
            asked, asked_counts = self._exchange_ints(frontier[remote], request_counts)
            answer_counts, answer_sources = self.sample_owned_typed(self.global_of(asked) - self.first, fanout, keys)
            per_asker = _per_group_sums(answer_counts, asked_counts)  # [peers, R]
            # relation-major over every asker's rows -> asker-major, relation-major within an asker: runs moved
            run_starts = (np.cumsum(per_asker.ravel(order="F")) - per_asker.ravel(order="F")).reshape(per_asker.shape,
                                                                                                      order="F")
            answer_sources = answer_sources[entries_of_rows(run_starts.ravel(), per_asker.ravel())]
            got_counts, _ = self._exchange_ints(answer_counts.reshape(-1), asked_counts * R)
            got_sources, _ = self._exchange_ints(answer_sources, per_asker.sum(1))
            got_counts = got_counts.reshape(-1, R)
            counts[remote] = got_counts
            row_bounds = np.concatenate([[0], np.cumsum(request_counts)])
            source_bounds = np.concatenate([[0], np.cumsum(_per_group_sums(got_counts, request_counts).sum(1))])
            for q in range(self.comm.size):
                rows = slice(row_bounds[q], row_bounds[q + 1])
                groups.append((remote[rows], got_counts[rows], got_sources[source_bounds[q]:source_bounds[q + 1]]))
        # each group's draws land at their places: relation r's draws for frontier node i start at
        # (every relation before r's draws) + (relation r's draws for the nodes before i)
        flat = counts.T.ravel()
        place = (np.cumsum(flat) - flat).reshape(R, len(frontier))
        sources = np.empty(int(flat.sum()), dtype=np.int64)
        for rows, group_counts, group_sources in groups:
            sources[entries_of_rows(place[:, rows].ravel(), group_counts.T.ravel())] = group_sources
        return counts, sources

    def sample(self, seeds: np.ndarray, epoch: int, step: int) -> tuple[np.ndarray, list[TypedBlock]]:
        """All levels' nodes (names, level L last) and the blocks, hop 1 first. seeds: names."""
        start = time.perf_counter()
        nodes = np.asarray(seeds, dtype=np.int64)
        blocks = []
        relabel = self._relabel
        relabel.reset(nodes)
        for hop, fanout in enumerate(self.fanouts):
            keys = [sample_key(self.seed, epoch, step, hop, relation=r) for r in range(self.num_relations)]
            counts, sources = self.sample_typed_hop(nodes, fanout, keys)
            # relation-major, each relation's edges in target order: sorted by (relation, target)
            dst = np.repeat(np.tile(np.arange(len(nodes), dtype=np.int64), self.num_relations), counts.T.ravel())
            relation = np.repeat(np.arange(self.num_relations, dtype=np.int64), counts.sum(0))
            new, src = relabel.extend(sources)
            level = np.concatenate([nodes, new])
            blocks.append(TypedBlock(torch.from_numpy(dst), torch.from_numpy(src), torch.from_numpy(relation),
                                     len(nodes), len(level)))
            nodes = level
        self.counters.sample_s += time.perf_counter() - start
        return nodes, blocks


def _per_group_sums(counts: np.ndarray, group_sizes: np.ndarray) -> np.ndarray:
    """[groups, R]: the rows of counts [rows, R] summed over consecutive groups of group_sizes rows."""
    running = np.zeros((len(counts) + 1, counts.shape[1]), dtype=np.int64)
    np.cumsum(counts, axis=0, out=running[1:])
    bounds = np.concatenate([[0], np.cumsum(group_sizes)])
    return running[bounds[1:]] - running[bounds[:-1]]
