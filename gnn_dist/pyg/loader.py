"""gd.NeighborLoader: sampled mini-batches of a partitioned graph, laid out as PyG's NeighborLoader lays them out.

    loader = gd.NeighborLoader(data, num_neighbors=[15, 10, 5], input_nodes=data.train_mask, batch_size=1024,
                               shuffle=True, seed=0)
    model = gd.distribute(GraphSAGE(data.num_features, 256, 3, data.num_classes))   # no data: sampled
    for batch in loader:
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        gd.cross_entropy(out, batch.y[:batch.batch_size]).backward()

Each rank iterates batches of its own seeds (input_nodes: a mask or the indices of its owned rows), and every
rank runs the same number of steps, so the sampler's and the feature store's collectives pair up:
- shuffle=True draws an epoch's batches as `gnn-dist train --mode sampled` does (shuffled by a generator keyed
  on (seed, epoch, rank), each rank's seeds recycled up to the largest rank's count, the last batch partial);
- shuffle=False takes each rank's seeds in order, once: a rank with fewer gets empty batches at the end.
Each pass over the loader is the next epoch; set_epoch(e) says which one the next pass is (a resume).

A node's neighbours are the keyed draws of gnn-dist's sampler (gnn_dist.graph.sampler): uniform without
replacement, keyed by (seed, epoch, step, hop) and original ids, so they are `--mode sampled`'s draws for that
node at that hop, whichever rank asks. As in PyG, hop h samples only the nodes hop h-1 added (the seeds at
hop 1). The batch is PyG's layout: the seeds first, then each hop's new nodes (`num_sampled_nodes` per hop),
`edge_index` [2, E] of (source, target) in local positions grouped by hop (`num_sampled_edges`), so PyG
models trim per hop; `x` and `y` of every node (remote rows from their owners), `n_id` their original ids,
`batch_size` and `input_id` (the seeds' positions among this rank's input nodes).
"""
from __future__ import annotations

import numpy as np
import torch

from gnn_dist.graph.feature_store import FeatureStore, fetch_from_owners
from gnn_dist.graph.sampler import DistributedSampler, Relabel
from gnn_dist.kernels.keyed_random import sample_key
from gnn_dist.pyg.part_data import graph_of
from gnn_dist.steps.mini_batch import shuffled_batches


def _fanouts(num_neighbors) -> list[int]:
    if isinstance(num_neighbors, dict):
        raise ValueError("gd.NeighborLoader: num_neighbors by relation is for typed graphs, which gd.load_partition "
                         "does not read yet: give one list, e.g. [15, 10, 5]")
    fanouts = list(num_neighbors) if isinstance(num_neighbors, (list, tuple)) else None
    if not fanouts or not all(isinstance(f, int) and (f >= 1 or f == -1) for f in fanouts):
        raise ValueError(f"gd.NeighborLoader: num_neighbors must be a list of positive integers (or -1: every "
                         f"neighbour), one per hop, e.g. [15, 10, 5]; got {num_neighbors!r}")
    return fanouts


def _input_rows(input_nodes, n_owned: int) -> np.ndarray:
    """The rank's seeds as local rows: all owned rows, a mask over them, or their indices."""
    if input_nodes is None:
        return np.arange(n_owned, dtype=np.int64)
    rows = torch.as_tensor(input_nodes)
    if rows.dtype == torch.bool:
        if rows.shape != (n_owned,):
            raise ValueError(f"gd.NeighborLoader: input_nodes is a mask of {tuple(rows.shape)} entries for "
                             f"{n_owned} owned nodes: pass data.train_mask (one entry per owned node)")
        return rows.nonzero().flatten().numpy().astype(np.int64)
    rows = rows.flatten().to(torch.int64).numpy()
    if len(rows) and (rows.min() < 0 or rows.max() >= n_owned):
        raise ValueError(f"gd.NeighborLoader: input_nodes holds indices outside this rank's {n_owned} owned "
                         f"nodes: pass a mask, or indices of owned rows")
    return rows


class NeighborLoader:
    """Batches of this rank's seeds and their sampled neighbourhoods (a collective: every rank iterates)."""

    def __init__(self, data, num_neighbors, input_nodes=None, batch_size: int = 1, shuffle: bool = False,
                 seed: int | None = None, drop_last: bool = False):
        graph = graph_of(data)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"gd.NeighborLoader: batch_size must be at least 1, got {batch_size!r}")
        self.graph, self.batch_size, self.shuffle, self.drop_last = graph, batch_size, shuffle, drop_last
        comm = graph.ctx.comm
        fanouts = _fanouts(num_neighbors)
        if -1 in fanouts:  # every neighbour: the whole graph's largest in-degree draws them all
            degrees = np.diff(graph.part.indptr)
            largest = torch.tensor([float(degrees.max()) if len(degrees) else 0.0], dtype=torch.float64)
            comm.allreduce_(largest, op="max")
            fanouts = [max(int(largest.item()), 1) if f == -1 else f for f in fanouts]
        self.fanouts = fanouts
        # rank 0's seed, so every rank draws alike (torch's seed when none is given, as PyG's loader uses torch's)
        self.seed = int(comm.allgather_object(torch.initial_seed() % (1 << 31) if seed is None else int(seed))[0])
        self.items = _input_rows(input_nodes, graph.n_owned)
        largest = torch.tensor([float(len(self.items))], dtype=torch.float64)
        comm.allreduce_(largest, op="max")
        self.items_per_epoch = int(largest.item())
        full, partial = divmod(self.items_per_epoch, batch_size)
        self.steps = full + (1 if partial and not drop_last else 0)
        self.sampler = DistributedSampler(comm, graph.part, fanouts, self.seed)
        self.store = FeatureStore(comm, self.sampler, graph.x_full)
        # each row's label and original id, served to the ranks whose batches reach it (float64 holds both exactly)
        self._labels = torch.from_numpy(np.stack([graph.part.y.astype(np.float64),
                                                  graph.node_ids.numpy().astype(np.float64)], 1))
        self._relabel = Relabel()
        self.epoch = 0

    def __len__(self) -> int:
        return self.steps

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass over the loader draws (its batches and its neighbours)."""
        self.epoch = int(epoch)

    def __iter__(self):
        epoch = self.epoch
        self.epoch += 1
        for step, rows in enumerate(self.batches(epoch)):
            yield self.batch(rows, epoch, step)

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's seeds (local rows) of each step of an epoch."""
        b = self.batch_size
        if self.shuffle:
            return shuffled_batches(self.items, self.seed, epoch, self.graph.ctx.rank, self.items_per_epoch, b,
                                    self.steps)
        return [self.items[k * b:(k + 1) * b] if (not self.drop_last or (k + 1) * b <= len(self.items))
                else self.items[:0] for k in range(self.steps)]

    def sample(self, seeds: np.ndarray, epoch: int, step: int):
        """(every node's global id, seeds first then each hop's new nodes; the edges' source and target positions
        grouped by hop; nodes per hop; edges per hop). A collective: each hop asks the owners of its frontier."""
        nodes = np.asarray(seeds, dtype=np.int64)
        self._relabel.reset(nodes)
        sources, targets, num_nodes, num_edges = [], [], [len(nodes)], []
        start = 0
        for hop, fanout in enumerate(self.fanouts):
            frontier = nodes[start:]
            counts, drawn = self.sampler.sample_hop(frontier, fanout, sample_key(self.seed, epoch, step, hop))
            new, positions = self._relabel.extend(drawn)
            targets.append(start + np.repeat(np.arange(len(frontier), dtype=np.int64), counts))
            sources.append(positions)
            start = len(nodes)
            nodes = np.concatenate([nodes, new])
            num_nodes.append(len(new))
            num_edges.append(len(positions))
        return nodes, np.concatenate(sources), np.concatenate(targets), num_nodes, num_edges

    def batch(self, rows: np.ndarray, epoch: int, step: int):
        from torch_geometric.data import Data

        nodes, sources, targets, num_nodes, num_edges = self.sample(rows + self.sampler.first, epoch, step)
        x = self.store.gather(nodes)
        labels = self._rows_of(nodes)
        return Data(x=x, edge_index=torch.from_numpy(np.stack([sources, targets])),
                    y=labels[:, 0].to(torch.int64), n_id=labels[:, 1].to(torch.int64), batch_size=len(rows),
                    input_id=torch.from_numpy(_positions(self.items, rows)),
                    num_sampled_nodes=num_nodes, num_sampled_edges=num_edges, num_nodes=len(nodes))

    def _rows_of(self, nodes: np.ndarray) -> torch.Tensor:
        """[len(nodes), 2] float64: label and original id of each node (global ids), remote ones from their
        owners (a collective)."""
        owned = self.sampler.owner_of(nodes) == self.sampler.rank
        out = torch.empty(len(nodes), 2, dtype=torch.float64)
        out[torch.from_numpy(owned)] = self._labels[torch.from_numpy(nodes[owned] - self.sampler.first)]
        remote = np.flatnonzero(~owned)

        def serve(local: np.ndarray) -> torch.Tensor:
            return self._labels[torch.from_numpy(local)]

        out[torch.from_numpy(remote)] = fetch_from_owners(self.sampler, nodes[remote], serve, 2, torch.float64)[0]
        return out


def _positions(items: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each row's position among items (the seeds' input_id), for items in any order."""
    order = np.argsort(items, kind="stable")
    return order[np.searchsorted(items[order], rows)]
