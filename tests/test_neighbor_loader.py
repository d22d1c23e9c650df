"""gd.NeighborLoader and gd.distribute(model) without data: sampled mini-batches for an unmodified PyG model.

A batch is checked against the dataset itself (its rows, labels and edges), against a subgraph this test lays
out in PyG's order from the batch's own sampled edges, and against the draws of `--mode sampled`'s sampler; a
sampled step at P=2 against one process training the same model on the same two batches.
"""
from __future__ import annotations

import copy
import re
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gnn_dist as gd
from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import ModelConfig, SampledConfig, TrainConfig
from gnn_dist.context import RankContext
from gnn_dist.partition.format import load_node_map
from gnn_dist.training.setup import setup

pytest.importorskip("torch_geometric")
from torch_geometric.nn.models import GraphSAGE  # noqa: E402

FANOUTS = [4, 3]


def _whole(graph):
    """Every node's in-neighbours (original ids) in the whole graph: the edges a sample may draw from."""
    neighbours = [set() for _ in range(len(graph.y))]
    for source, target in graph.edge_index.T.tolist():
        neighbours[target].add(source)
    return neighbours


def _pyg_layout(seeds: list[int], hops: list[list[tuple[int, int]]]):
    """The subgraph PyG's NeighborLoader lays out from these sampled (source, target) edges, in original ids:
    the seeds, then each hop's new sources in order of first appearance; edges as (source, target) positions."""
    order, position = list(seeds), {v: k for k, v in enumerate(seeds)}
    edges, per_hop = [], [len(seeds)]
    for pairs in hops:
        added = 0
        for source, _ in pairs:
            if source not in position:
                position[source] = len(order)
                order.append(source)
                added += 1
        per_hop.append(added)
        edges += [(position[s], position[t]) for s, t in pairs]
    return order, edges, per_hop


@pytest.mark.parametrize("num_parts", [1, 2])
def test_every_batch_is_the_dataset_subgraph_of_its_sampled_edges(partitioned, tiny_graph, num_parts):
    directory = partitioned("synthetic:tiny", num_parts)

    def rank_fn(comm):
        data = gd.load_partition(directory, RankContext(comm))
        loader = gd.NeighborLoader(data, FANOUTS, input_nodes=data.train_mask, batch_size=7, shuffle=True, seed=3)
        seeds_of = data.n_id[data.train_mask]
        return [(b.x, b.y, b.n_id, b.edge_index, b.batch_size, b.num_sampled_nodes, b.num_sampled_edges,
                 seeds_of[b.input_id]) for b in loader]

    graph, neighbours = tiny_graph, _whole(tiny_graph)
    checked = 0
    for batches in run_fake_ranks(num_parts, rank_fn):
        for x, y, n_id, edge_index, batch_size, num_nodes, num_edges, seeds in batches:
            ids = n_id.tolist()
            assert torch.equal(x, torch.from_numpy(graph.x[ids])) and torch.equal(y, torch.from_numpy(graph.y[ids]))
            assert ids[:batch_size] == seeds.tolist() and len(set(ids)) == len(ids)
            assert sum(num_nodes) == len(ids) and sum(num_edges) == edge_index.shape[1]
            pairs = [(ids[s], ids[t]) for s, t in edge_index.T.tolist()]
            bounds = np.cumsum([0] + num_edges)
            hops = [pairs[bounds[h]:bounds[h + 1]] for h in range(len(FANOUTS))]
            starts = np.cumsum([0] + num_nodes)
            for h, fanout in enumerate(FANOUTS):  # hop h samples exactly the nodes hop h-1 added
                drawn: dict[int, list[int]] = {}
                for source, target in hops[h]:
                    drawn.setdefault(target, []).append(source)
                for target in ids[starts[h]:starts[h + 1]]:
                    got = drawn.pop(target, [])
                    assert len(set(got)) == len(got) == min(fanout, len(neighbours[target]))
                    assert set(got) <= neighbours[target]
                assert not drawn  # no edge targets a node of another hop
            order, edges, per_hop = _pyg_layout(ids[:batch_size], hops)
            assert order == ids and per_hop == num_nodes and edges == [tuple(e) for e in edge_index.T.tolist()]
            checked += 1
    assert checked >= 2 * num_parts


def test_the_loader_draws_the_seeds_and_neighbours_of_mode_sampled(partitioned):
    """shuffle=True with --mode sampled's seed and training nodes: each step's seeds are its batch's, in its
    order, and hop h's edges are the draws its sampler makes at hop h for the nodes hop h-1 added."""
    directory = partitioned("synthetic:small", 2)
    node_map = load_node_map(directory)  # global id -> original id
    config = TrainConfig(parts=str(directory), mode="sampled", progress=False, timeout=0, seed=4,
                         model=ModelConfig(model="sage", hidden=8, num_layers=2),
                         sampled=SampledConfig(fanouts=tuple(FANOUTS), batch_size=64))

    def rank_fn(comm):
        ctx = RankContext(comm)
        mode = setup(ctx, config).mode
        data = gd.load_partition(directory, ctx)
        loader = gd.NeighborLoader(data, FANOUTS, input_nodes=data.train_mask, batch_size=64, shuffle=True, seed=4)
        loader.set_epoch(1)
        steps = []
        for step, (batch, rows) in enumerate(zip(loader, mode.batches(1))):
            nodes, blocks = mode.sampler.sample(rows + mode.sampler.first, 1, step)
            steps.append((batch, node_map[nodes], [(b.src.tolist(), b.dst.tolist()) for b in blocks]))
        return len(loader), mode.steps, steps

    compared = 0
    for loader_steps, mode_steps, steps in run_fake_ranks(2, rank_fn):
        assert loader_steps == mode_steps == len(steps) > 1
        for batch, level_ids, blocks in steps:
            ids = batch.n_id.tolist()
            assert ids[:batch.batch_size] == level_ids[:batch.batch_size].tolist()
            bounds, starts = np.cumsum([0] + batch.num_sampled_edges), np.cumsum([0] + batch.num_sampled_nodes)
            for h, (src, dst) in enumerate(blocks):
                # the nodes hop h-1 added sit at the same positions of both layouts (a recycled seed may come
                # twice in a batch: each copy is a row of its own, with its own draw)
                expected = Counter((int(level_ids[s]), int(level_ids[d])) for s, d in zip(src, dst)
                                   if starts[h] <= d < starts[h + 1])
                got = Counter((ids[s], ids[t]) for s, t in batch.edge_index[:, bounds[h]:bounds[h + 1]].T.tolist())
                assert got == expected
                compared += sum(got.values())
    assert compared > 500


def test_without_shuffle_every_seed_comes_once_and_every_rank_runs_the_same_steps(partitioned, tiny_graph):
    directory = partitioned("synthetic:tiny", 3)

    def rank_fn(comm):
        data = gd.load_partition(directory, RankContext(comm))
        mine = data.train_mask.clone()
        if comm.rank == 1:
            mine[mine.nonzero()[::2].flatten()] = False  # fewer seeds here: its last steps are empty
        loader = gd.NeighborLoader(data, [2], input_nodes=mine, batch_size=5)
        return [b.n_id[:b.batch_size].tolist() for b in loader], int(mine.sum()), data.n_id[mine].tolist()

    results = run_fake_ranks(3, rank_fn)
    assert len({len(steps) for steps, _, _ in results}) == 1
    assert len(results[0][0]) == -(-max(count for _, count, _ in results) // 5)
    assert any(steps[-1] == [] for steps, _, _ in results)
    seen = [v for steps, _, _ in results for batch in steps for v in batch]
    assert sorted(seen) == sorted(v for _, _, mine in results for v in mine) and len(seen) == len(set(seen))


@pytest.mark.parametrize("trimmed", [False, True])
def test_a_sampled_step_at_p2_equals_one_process_on_the_same_batches(partitioned, trimmed):
    """Each rank steps an unmodified GraphSAGE on its batch; the loss is the mean over both ranks' seeds and the
    summed gradients are one process's on both batches."""
    directory = partitioned("synthetic:small", 2)
    torch.manual_seed(11)
    reference = GraphSAGE(64, 16, 2, 10)  # synthetic:small's features and classes

    def forward(model, batch):
        options = dict(num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                       num_sampled_edges_per_hop=batch.num_sampled_edges) if trimmed else {}
        return model(batch.x, batch.edge_index, **options)[:batch.batch_size]

    def rank_fn(comm):
        data = gd.load_partition(directory, RankContext(comm))
        assert data.num_features == 64 and data.num_classes == 10
        loader = gd.NeighborLoader(data, FANOUTS, input_nodes=data.train_mask, batch_size=40, shuffle=True, seed=2)
        model = gd.distribute(copy.deepcopy(reference))
        batch = next(iter(loader))
        loss = gd.cross_entropy(forward(model, batch), batch.y[:batch.batch_size])
        loss.backward()
        assert model.paths() == {"convs.0": "native spmm", "convs.1": "native spmm"}
        return batch, loss.item(), {name: p.grad.clone() for name, p in model.module.named_parameters()}

    results = run_fake_ranks(2, rank_fn)
    model = copy.deepcopy(reference)
    total = sum(F.cross_entropy(forward(model, batch), batch.y[:batch.batch_size], reduction="sum")
                for batch, _, _ in results) / sum(batch.batch_size for batch, _, _ in results)
    total.backward()
    for _, loss, grads in results:
        assert loss == pytest.approx(total.item(), rel=1e-6)
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("options, says", [
    ({"num_neighbors": [5, 0]}, "num_neighbors must be a list of positive integers"),
    ({"num_neighbors": {("a", "to", "b"): [5]}}, "num_neighbors by relation is for typed graphs"),
    ({"num_neighbors": [5], "batch_size": 0}, "batch_size must be at least 1"),
    ({"num_neighbors": [5], "input_nodes": torch.ones(3, dtype=torch.bool)}, "input_nodes is a mask of (3,)"),
])
def test_bad_loader_options_are_one_clear_error(partitioned, options, says):
    directory = partitioned("synthetic:tiny", 1)

    def rank_fn(comm):
        data = gd.load_partition(directory, RankContext(comm))
        with pytest.raises(ValueError, match=re.escape(says)):
            gd.NeighborLoader(data, **options)
        return True

    assert run_fake_ranks(1, rank_fn) == [True]


def test_a_distributed_model_of_mini_batches_refuses_full_batch_options():
    with pytest.raises(ValueError, match="a schedule or halo_dtype applies with data"):
        gd.distribute(GraphSAGE(4, 4, 1), schedule="stale:2")


def test_dropout_on_mini_batches_is_keyed_so_a_rerun_draws_the_same_masks(partitioned):
    """A batch's dropout masks are keyed by (seed, step, call, rank, row), not torch's generator: two runs of the
    same steps draw the same losses, the ranks draw different masks, and the curve differs from dropout off."""
    directory = partitioned("synthetic:small", 2)

    def curve(p):
        torch.manual_seed(1)  # one model for both ranks (simulated ranks are threads sharing torch's generator)
        reference = GraphSAGE(64, 16, 2, 10, dropout=p)

        def rank_fn(comm):
            data = gd.load_partition(directory, RankContext(comm))
            model = gd.distribute(copy.deepcopy(reference))
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
            loader = gd.NeighborLoader(data, FANOUTS, input_nodes=data.train_mask, batch_size=64, shuffle=True, seed=0)
            losses, masks = [], []
            for step, batch in zip(range(3), loader):
                optimizer.zero_grad()
                loss = gd.cross_entropy(model(batch.x, batch.edge_index)[:batch.batch_size],
                                        batch.y[:batch.batch_size])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                if step == 0:
                    with gd.pyg.passes.running_batches(gd.pyg.passes.BatchPass(seed=model.seed, step=0,
                                                                                rank=comm.rank)):
                        masks.append(F.dropout(torch.ones(50, 4), 0.5, True) > 0)
            return losses, masks[0]
        return run_fake_ranks(2, rank_fn)

    first, again, off = curve(0.5), curve(0.5), curve(0.0)
    assert [losses for losses, _ in first] == [losses for losses, _ in again]
    assert not torch.equal(first[0][1], first[1][1])  # each rank its own mask
    assert first[0][0] != off[0][0]
