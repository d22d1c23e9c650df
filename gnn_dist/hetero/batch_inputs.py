"""The typed inputs of a sampled batch: each sampled node's row at --hidden width, from its type's source.

- A featured type's raw features come from a feature store of that type alone (gnn_dist.graph.feature_store:
  owned rows, the halo's rows fetched at set-up, the type's share of the static cache, else the owner), then
  go through the type's Linear, replicated like every weight.
- A featureless type's rows are its embedding rows (EmbeddingRows): the owned ones read from this rank's shard,
  the others fetched from their owners at the start of the step (after the previous step's update, as one
  process would see them), never cached since every step changes them. After the backward, each fetched row's
  gradient goes back to its owner, who sums the gradients of the rows its batch and its peers' batches
  touched; the shard then steps with torch.optim.SparseAdam's rule (gnn_dist.hetero.mini_batch), so only
  touched rows move.

Shapes: rows() -> [nodes of the outermost level, hidden], in the sample's order
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from gnn_dist.graph.feature_store import FeatureStore, fetch_from_owners, send_home
from gnn_dist.hetero.sampler import TypedSampler


class EmbeddingRows:
    """Rows of one featureless type's table, by global id, and their gradients back to the owners.

    fetch() and push_gradients() are collectives: every rank calls each once per step per table, in type
    order, with or without rows of its own."""

    def __init__(self, sampler: TypedSampler, shard: torch.nn.Parameter, owned_positions: np.ndarray):
        self.sampler, self.shard = sampler, shard
        self.comm = sampler.comm
        self.shard_row = np.full(sampler.part.n_owned, -1, dtype=np.int64)  # owned local position -> shard row
        self.shard_row[owned_positions] = np.arange(len(owned_positions))
        self._pending: tuple | None = None  # what push_gradients needs of the last fetch

    def fetch(self, global_ids: np.ndarray) -> torch.Tensor:
        """The current rows of these nodes (all of this type): a leaf that collects their gradients."""
        sampler, table = self.sampler, self.shard.detach()
        mine = sampler.owner_of(global_ids) == sampler.rank
        own_rows = torch.from_numpy(self.shard_row[global_ids[mine] - sampler.first])
        if self.comm.size == 1:  # every row is this rank's: one gather, and nothing sent back after the backward
            self._pending = own_rows, None, None, None
            return table.index_select(0, own_rows).requires_grad_()
        own_at, remote = np.flatnonzero(mine), np.flatnonzero(~mine)
        rows = torch.empty(len(global_ids), table.shape[1], dtype=table.dtype)
        rows[torch.from_numpy(own_at)] = table[own_rows]
        rows[torch.from_numpy(remote)], route = fetch_from_owners(
            sampler, global_ids[remote], lambda local: table[torch.from_numpy(self.shard_row[local])], table.shape[1],
            table.dtype)
        self._pending = own_rows, torch.from_numpy(own_at), torch.from_numpy(remote), route
        return rows.requires_grad_()

    def push_gradients(self, rows: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The shard's gradient (times `scale`) as (shard rows, each once; their gradients): this rank's own rows'
        and those its peers send back for the rows they fetched, summed per row (collective)."""
        own_rows, own_at, remote, route = self._pending
        self._pending = None
        grad = rows.grad if rows.grad is not None else torch.zeros_like(rows)
        if own_at is None:  # one rank: every row its own, each once (a level lists a node once)
            return own_rows, grad.mul_(scale)
        back = send_home(self.sampler, route, grad[remote])
        # a row may come from this rank's batch and from several peers': summed into one
        asked_rows = torch.from_numpy(self.shard_row[route.asked])
        touched, position = torch.unique(torch.cat([own_rows, asked_rows]), return_inverse=True)
        summed = grad.new_zeros(len(touched), grad.shape[1])
        summed.index_add_(0, position, torch.cat([grad[own_at], back]))
        return touched, summed.mul_(scale)


@dataclasses.dataclass
class GatheredInputs:
    """What prepare() gathered of a batch's inputs: per featured type its rows' positions and raw features, per
    featureless type its rows' positions and global ids (their rows are fetched when the step starts)."""

    featured: dict   # type -> (positions, raw rows [n, width])
    featureless: dict  # type -> (positions, global ids)
    n_nodes: int


class TypedBatchInputs:
    def __init__(self, sampler: TypedSampler, inputs):
        """inputs: the typed stack's TypedInputs (its Linears, shards, owned and halo rows per type)."""
        self.sampler, self.inputs = sampler, inputs
        typed, part = sampler.typed, sampler.part
        self.stores: dict[str, FeatureStore] = {}
        self.tables: dict[str, EmbeddingRows] = {}
        for name in typed.node_types:
            owned = inputs.owned_rows[name].cpu().numpy()
            if name in inputs.linears:
                halo = inputs.halo_rows[name].cpu().numpy()
                served = np.full(part.n_owned, -1, dtype=np.int64)
                served[owned] = np.arange(len(owned))
                rows = torch.cat([inputs.owned_x[name].cpu(), inputs.halo_x[name].cpu()])
                # one copy of the type's rows: the stack's inputs (evaluation) and the part read views of it
                inputs.owned_x[name], inputs.halo_x[name] = rows[:len(owned)], rows[len(owned):]
                part.arrays[f"x__{name}"] = inputs.owned_x[name].numpy()
                self.stores[name] = FeatureStore(sampler.comm, sampler, rows,
                                                 row_ids=sampler.local_to_global[np.concatenate([owned,
                                                                                                 part.n_owned + halo])],
                                                 served_rows=served)
            else:
                self.tables[name] = EmbeddingRows(sampler, inputs.shards[name], owned)
        self.fetched: dict[str, torch.Tensor] = {}  # featureless type -> the step's leaf rows

    def gather(self, names: np.ndarray) -> GatheredInputs:
        """The raw features of the batch's featured nodes (collective: each type's store fetches)."""
        sampler = self.sampler
        types, global_ids = sampler.type_of(names), sampler.global_of(names)
        featured, featureless = {}, {}
        for k, name in enumerate(sampler.typed.node_types):
            positions = np.flatnonzero(types == k)
            if name in self.stores:
                featured[name] = torch.from_numpy(positions), self.stores[name].gather(global_ids[positions])
            else:
                featureless[name] = torch.from_numpy(positions), global_ids[positions]
        return GatheredInputs(featured, featureless, len(names))

    def count_remote(self, names: np.ndarray) -> None:
        types, global_ids = self.sampler.type_of(names), self.sampler.global_of(names)
        for name, store in self.stores.items():
            store.count_remote(global_ids[types == self.sampler.typed.type_index(name)])

    def rows(self, gathered: GatheredInputs) -> torch.Tensor:
        """Every node's row at --hidden width: Linears over the raw features, fetched embedding rows (collective:
        each table fetches, in type order)."""
        inputs = self.inputs
        pieces, positions = [], []
        for name, (at, raw) in gathered.featured.items():
            pieces.append(inputs.linears[name](raw))
            positions.append(at)
        self.fetched = {}
        for name, (at, ids) in gathered.featureless.items():
            self.fetched[name] = self.tables[name].fetch(ids)
            pieces.append(self.fetched[name])
            positions.append(at)
        order = torch.empty(gathered.n_nodes, dtype=torch.int64)
        order[torch.cat(positions)] = torch.arange(gathered.n_nodes)
        return torch.cat(pieces).index_select(0, order)

    def table_gradients(self, scale: float) -> dict:
        """{type: (its shard's touched rows, their gradients)} after the backward (collective, in type order)."""
        return {name: table.push_gradients(self.fetched[name], scale) for name, table in self.tables.items()}

    def fill_cache(self, budget_bytes: int) -> None:
        """Share the cache among the featured types by the bytes their counted remote rows would take, each
        type then caching its most requested rows (collective)."""
        counted = {name: store.request_counts() for name, store in self.stores.items()}
        wanted = {name: float(hits.sum()) * self.stores[name].x_full.shape[1] for name, (_, hits) in counted.items()}
        total = sum(wanted.values())
        for name, store in self.stores.items():
            ids, hits = counted[name]
            store.fill_cache(ids, hits, int(budget_bytes * wanted[name] / total) if total else 0)
