"""The remote-feature store of sampled training: features of sampled nodes, from this rank, its halo, a
static cache of hot remote rows, or their owners (requests through gnn_dist.graph.sampler.DistributedSampler).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from gnn_dist.comm.communicator import Comm
from gnn_dist.graph.sampler import DistributedSampler

_COMPACT_REQUESTS = 1 << 22  # raw request ids kept before folding them into counts


@dataclass
class FeatureStore:
    """Features of any node by global id: owned, cached halo, a static cache of other remote nodes, or fetched."""

    comm: Comm
    sampler: DistributedSampler
    x_full: torch.Tensor  # [owned | halo] input features
    cache_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # sorted global ids
    cache_rows: torch.Tensor | None = None
    count_requests: bool = False  # record which remote (non-halo) nodes the batches asked for
    # A store over some of the rows (a typed graph's store per type): the global id of each row of x_full, and
    # for each owned local position, the row of x_full that serves it (-1: not served here). None: x_full is
    # [owned | halo], the sampler's local rows.
    row_ids: np.ndarray | None = None
    served_rows: np.ndarray | None = None

    def __post_init__(self):
        local_global = self.sampler.local_to_global if self.row_ids is None else self.row_ids
        self.known_order = np.argsort(local_global)
        self.known_sorted = local_global[self.known_order]
        self.requested: list[np.ndarray] = []  # ids asked since the last compaction
        self.counted = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))  # (sorted ids, times asked)

    def _record_requests(self, ids: np.ndarray) -> None:
        self.requested.append(ids)
        # Fold the raw ids into (id, count) pairs now and then, so an epoch of requests on a
        # large graph costs memory in distinct nodes, not in requests.
        if sum(len(r) for r in self.requested) > _COMPACT_REQUESTS:
            self.counted = self._compacted()

    def _compacted(self) -> tuple[np.ndarray, np.ndarray]:
        ids, hits = self.counted
        raw = [ids] + self.requested
        weights = [hits] + [np.ones(len(r), dtype=np.int64) for r in self.requested]
        self.requested = []
        unique, inverse = np.unique(np.concatenate(raw), return_inverse=True)
        return unique, np.bincount(inverse, weights=np.concatenate(weights), minlength=len(unique)).astype(np.int64)

    def count_remote(self, nodes: np.ndarray) -> None:
        """Record the nodes among `nodes` (global ids) that are neither owned nor halo, as gather does."""
        known, _ = self._lookup(self.known_sorted, nodes)
        self._record_requests(nodes[~known])

    def request_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, times asked) of the remote non-halo nodes recorded since the last call; clears the record."""
        counted = self._compacted()
        self.counted = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        return counted

    def _lookup(self, ids_sorted: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(ids_sorted) == 0:
            return np.zeros(len(queries), dtype=bool), np.zeros(len(queries), dtype=np.int64)
        pos = np.minimum(np.searchsorted(ids_sorted, queries), len(ids_sorted) - 1)
        return ids_sorted[pos] == queries, pos

    def gather(self, nodes: np.ndarray) -> torch.Tensor:
        """Features of `nodes` (global ids). Collective when fetching (every rank calls it once per step)."""
        start = time.perf_counter()
        counters = self.sampler.counters
        # An owned node's row is its local position (through served_rows for a store over some rows): only the
        # others are searched among the halo's ids.
        owned = self.sampler.owner_of(nodes) == self.sampler.rank
        rows = np.zeros(len(nodes), dtype=np.int64)
        local = nodes[owned] - self.sampler.first
        rows[owned] = local if self.served_rows is None else self.served_rows[local]
        others = np.flatnonzero(~owned)
        halo_hit, pos = self._lookup(self.known_sorted, nodes[others])
        rows[others[halo_hit]] = self.known_order[pos[halo_hit]]
        # One index_select over all rows (others read row 0 for now and are overwritten below): a
        # single pass, where a masked gather-then-scatter would copy the local rows twice.
        if len(self.x_full):
            out = self.x_full.index_select(0, torch.from_numpy(rows))
        else:
            out = torch.zeros(len(nodes), self.x_full.shape[1])
        counters.halo_hits += int(halo_hit.sum())
        rest = others[~halo_hit]
        if self.count_requests:
            self._record_requests(nodes[rest])
        cache_hit, cache_pos = self._lookup(self.cache_ids, nodes[rest])
        if cache_hit.any():
            out[torch.from_numpy(rest[cache_hit])] = self.cache_rows[torch.from_numpy(cache_pos[cache_hit])]
        counters.cache_hits += int(cache_hit.sum())
        missing = rest[~cache_hit]
        counters.cache_misses += len(missing)
        if not self.sampler.local_only:
            out[torch.from_numpy(missing)] = self.fetch(nodes[missing])
        counters.fetch_s += time.perf_counter() - start
        return out

    def fetch(self, global_ids: np.ndarray) -> torch.Tensor:
        """Rows of remote nodes from their owners: one request and one reply round (collective)."""
        def serve(local: np.ndarray) -> torch.Tensor:
            return self.x_full[torch.from_numpy(local if self.served_rows is None else self.served_rows[local])]

        return fetch_from_owners(self.sampler, global_ids, serve, self.x_full.shape[1], self.x_full.dtype)[0]

    def fill_cache(self, ids: np.ndarray, hits: np.ndarray, budget_bytes: int) -> None:
        """Cache the features of the remote nodes counted most often (ties: lower id), up to the budget.

        Collective: every rank calls it at the same point (the new rows are fetched in one round).
        Rows already cached are kept rather than fetched again, so a refill sends only the new ones.
        """
        row_bytes = self.x_full.shape[1] * self.x_full.element_size()
        capacity = budget_bytes // row_bytes if row_bytes else 0
        chosen = ids[np.lexsort((ids, -hits))][:capacity] if capacity else np.zeros(0, dtype=np.int64)
        chosen = np.sort(chosen)
        kept, pos = self._lookup(self.cache_ids, chosen)
        rows = torch.empty(len(chosen), self.x_full.shape[1], dtype=self.x_full.dtype)
        if kept.any():
            rows[torch.from_numpy(np.flatnonzero(kept))] = self.cache_rows[torch.from_numpy(pos[kept])]
        rows[torch.from_numpy(np.flatnonzero(~kept))] = self.fetch(chosen[~kept])
        self.cache_ids, self.cache_rows = chosen, rows


@dataclass
class RowRoute:
    """How rows fetched from their owners travelled (fetch_from_owners), so that something per row can travel
    back the same way (send_home: an embedding row's gradient)."""

    order: np.ndarray         # the requested positions, grouped by owner: the order they were asked in
    counts: np.ndarray        # rows asked of each rank
    asked: np.ndarray         # the owned local positions each peer asked of this rank, grouped by peer
    asked_counts: np.ndarray  # rows each peer asked of this rank


def fetch_from_owners(sampler: DistributedSampler, global_ids: np.ndarray, serve, width: int,
                      dtype: torch.dtype) -> tuple[torch.Tensor, RowRoute]:
    """Rows of nodes (global ids) from their owners: one request and one reply round (collective). serve(local
    positions) gives this rank's rows for what its peers ask. Returns ([len(global_ids), width] in the given
    order, the route)."""
    owners = sampler.owner_of(global_ids)
    order = np.argsort(owners, kind="stable")
    counts = np.bincount(owners, minlength=sampler.comm.size) if len(owners) else np.zeros(sampler.comm.size, np.int64)
    asked, asked_counts = sampler._exchange_ints(global_ids[order], counts)
    asked = asked - sampler.first
    reply = serve(asked) if len(asked) else torch.zeros(0, width, dtype=dtype)
    received = torch.empty(len(global_ids), width, dtype=dtype)
    sampler.counters.feature_bytes += sampler.comm.alltoallv(reply.contiguous(), asked_counts, received, counts)
    out = torch.empty_like(received)
    out[torch.from_numpy(order)] = received
    return out, RowRoute(order, counts, asked, asked_counts)


def send_home(sampler: DistributedSampler, route: RowRoute, values: torch.Tensor) -> torch.Tensor:
    """values (one per row fetch_from_owners brought, in its order) back to the rows' owners (collective):
    [len(route.asked), width], one per row the peers asked of this rank, in route.asked's order."""
    back = torch.empty(len(route.asked), values.shape[1], dtype=values.dtype)
    sampler.counters.feature_bytes += sampler.comm.alltoallv(values[torch.from_numpy(route.order)].contiguous(),
                                                             route.counts, back, route.asked_counts)
    return back
