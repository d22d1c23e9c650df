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

from gnn_dist.graph.sampler import DistributedSampler, RowSampler, _ranges
from gnn_dist.hetero.typed_part import TypedPart
from gnn_dist.kernels.keyed_random import sample_key


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
        # in-edges relation-major: relation r's CSR over the owned rows is a slice of one array
        n = part.n_owned
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(part.indptr))
        key = part.edge_type.astype(np.int64) * n + rows
        order = np.argsort(key, kind="stable")
        indices = part.indices[order].astype(np.int64)
        bounds = np.searchsorted(key[order], np.arange(R * n + 1, dtype=np.int64))
        del rows, key, order
        self.relation_csrs = []
        for r in range(R):
            first = int(bounds[r * n])
            indptr = bounds[r * n:(r + 1) * n + 1] - first
            self.relation_csrs.append(RowSampler(indptr, indices[first:int(bounds[(r + 1) * n])], self.local_orig,
                                                 self.local_names))
        self.csr = None  # the homogeneous CSR sampler is not used on a typed part

    def names_of_owned(self, local_rows: np.ndarray) -> np.ndarray:
        return self.local_names[local_rows]

    def global_of(self, names: np.ndarray) -> np.ndarray:
        return names // self.num_types

    def type_of(self, names: np.ndarray) -> np.ndarray:
        return names % self.num_types

    def sample_owned_typed(self, local_rows: np.ndarray, fanout: int, keys: list) -> tuple[np.ndarray, np.ndarray]:
        """(counts [rows, R], the neighbours' names node-major, each node's relations in order)."""
        counts, picked = zip(*(csr.sample(local_rows, fanout, key) for csr, key in zip(self.relation_csrs, keys)))
        counts = np.stack(counts, axis=1) if counts else np.zeros((len(local_rows), 0), dtype=np.int64)
        picked = np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64)
        # relation-major to node-major: a stable sort by row keeps each row's relations in order
        row_of = np.concatenate([np.repeat(np.arange(len(local_rows), dtype=np.int64), counts[:, r])
                                 for r in range(counts.shape[1])]) if counts.shape[1] else picked
        return counts, picked[np.argsort(row_of, kind="stable")]

    def sample_typed_hop(self, frontier: np.ndarray, fanout: int, keys: list) -> tuple[np.ndarray, np.ndarray]:
        """Sample every relation for every frontier node (names): (counts [frontier, R], sources' names grouped
        by node, then by relation). One request and one reply round whoever owns the nodes."""
        R = self.num_relations
        owners = self.owner_of(self.global_of(frontier))
        mine = np.flatnonzero(owners == self.rank)
        own_counts, own_sources = self.sample_owned_typed(self.global_of(frontier[mine]) - self.first, fanout, keys)
        if self.comm.size == 1:
            return own_counts, own_sources
        counts = np.zeros((len(frontier), R), dtype=np.int64)
        counts[mine] = own_counts
        remote = np.zeros(0, dtype=np.int64)
        got_sources = np.zeros(0, dtype=np.int64)
        if not self.local_only:
            remote = np.flatnonzero(owners != self.rank)
            remote = remote[np.argsort(owners[remote], kind="stable")]
            request_counts = np.bincount(owners[remote], minlength=self.comm.size)
            asked, asked_counts = self._exchange_ints(frontier[remote], request_counts)
            answer_counts, answer_sources = self.sample_owned_typed(self.global_of(asked) - self.first, fanout, keys)
            asker = np.repeat(np.arange(self.comm.size), asked_counts)
            sources_per_peer = np.bincount(asker, weights=answer_counts.sum(1),
                                           minlength=self.comm.size).astype(np.int64)
            got_counts, _ = self._exchange_ints(answer_counts.reshape(-1), asked_counts * R)
            got_sources, _ = self._exchange_ints(answer_sources, sources_per_peer)
            counts[remote] = got_counts.reshape(-1, R)
        totals = counts.sum(1)
        offsets = np.cumsum(totals) - totals
        sources = np.empty(int(totals.sum()), dtype=np.int64)
        sources[_ranges(offsets[mine], totals[mine])] = own_sources
        sources[_ranges(offsets[remote], totals[remote])] = got_sources
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
            dst = np.repeat(np.arange(len(nodes), dtype=np.int64), counts.sum(1))
            relation = np.repeat(np.tile(np.arange(self.num_relations, dtype=np.int64), len(nodes)),
                                 counts.reshape(-1))
            new, src = relabel.extend(sources)
            level = np.concatenate([nodes, new])
            blocks.append(TypedBlock(torch.from_numpy(dst), torch.from_numpy(src), torch.from_numpy(relation),
                                     len(nodes), len(level)))
            nodes = level
        self.counters.sample_s += time.perf_counter() - start
        return nodes, blocks
