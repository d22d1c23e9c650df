"""Sampled mini-batch training: the sampler against the graph itself, remote features against the dataset."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gnn_dist.comm import run_fake_ranks
from gnn_dist.context import RankContext
from gnn_dist.model import ModelConfig
from gnn_dist.sampled import SampledConfig
from gnn_dist.sampling import DistributedSampler, FeatureStore
from gnn_dist.trainer import TrainConfig, setup
from partition.datasets import load_dataset
from partition.format import load_node_map, load_part
from tests.conftest import run_cli, run_mpi

SEEDS = np.array([3, 17, 250, 1024, 2048, 3333, 4999])


def sample_by_original_id(directory, num_parts, fanouts, local_only=False):
    """Each rank samples for its share of SEEDS; returns per hop the set of (target, source) original ids."""
    node_map = load_node_map(directory)
    new_of = np.empty_like(node_map)
    new_of[node_map] = np.arange(len(node_map))

    def rank_fn(comm):
        part = load_part(directory, comm.rank)
        sampler = DistributedSampler(comm, part, fanouts, seed=5, local_only=local_only)
        mine = SEEDS[comm.rank::num_parts]
        nodes, blocks = sampler.sample(new_of[mine], epoch=1, step=2)
        hops = []
        for level, block in enumerate(blocks):
            dst_level = nodes[:block.n_dst]
            hops.append({(int(node_map[dst_level[d]]), int(node_map[nodes[s]]))
                         for d, s in zip(block.dst.tolist(), block.src.tolist())})
        return hops, sampler.counters.sample_bytes, part

    return run_fake_ranks(num_parts, rank_fn)


def test_samples_are_graph_edges_within_fanouts_and_independent_of_p(partitioned):
    graph = load_dataset("synthetic:small")
    edges = set(zip(graph.edge_index[1].tolist(), graph.edge_index[0].tolist()))  # (target, source)
    degree = np.bincount(graph.edge_index[1], minlength=graph.num_nodes)
    per_p = {}
    for num_parts in (1, 2, 3):
        results = sample_by_original_id(partitioned("synthetic:small", num_parts), num_parts, [6, 4])
        per_p[num_parts] = [set().union(*(r[0][h] for r in results)) for h in range(2)]
    assert per_p[1] == per_p[2] == per_p[3]
    first_hop = per_p[1][0]
    assert first_hop <= edges and per_p[1][1] <= edges
    for seed in SEEDS:
        drawn = [s for t, s in first_hop if t == seed]
        assert len(drawn) == len(set(drawn)) == min(degree[seed], 6)


def test_local_sampling_sends_nothing_and_stays_in_the_halo(partitioned):
    directory = partitioned("synthetic:small", 3)
    results = sample_by_original_id(directory, 3, [5, 5], local_only=True)
    for hops, sent, part in results:
        assert sent == 0
        local = set(part.node_ids.tolist()) | set(part.halo_ids.tolist())
        for hop in hops:
            assert {s for _, s in hop} <= local


def test_remote_features_match_the_dataset(partitioned):
    graph = load_dataset("synthetic:small")
    directory = partitioned("synthetic:small", 3)
    node_map = load_node_map(directory)
    rng = np.random.default_rng(0)
    wanted = rng.choice(graph.num_nodes, 300, replace=False)
    new_of = np.empty_like(node_map)
    new_of[node_map] = np.arange(len(node_map))

    def rank_fn(comm):
        state = setup(RankContext(comm), TrainConfig(parts=str(directory), progress=False, timeout=0))
        part = load_part(directory, comm.rank)
        sampler = DistributedSampler(comm, part, [2], seed=0)
        store = FeatureStore(comm, sampler, state.x_full)
        first = store.gather(new_of[wanted])
        # a static cache of some remote nodes: answers must not change, hits must be counted
        remote = np.setdiff1d(new_of[wanted], sampler.local_to_global)
        store.fill_cache(remote, np.ones(len(remote), dtype=np.int64), budget_bytes=10**9)
        sampler.counters.reset()
        second = store.gather(new_of[wanted])
        return first, second, sampler.counters.cache_hits, sampler.counters.cache_misses, len(remote)

    for first, second, hits, misses, remote in run_fake_ranks(3, rank_fn):
        assert torch.equal(first, torch.from_numpy(graph.x[wanted]))
        assert torch.equal(second, first)
        assert hits == remote and misses == 0


def test_ranks_with_unequal_training_nodes_run_the_same_steps(partitioned):
    directory = partitioned("synthetic:small", 3)
    config = TrainConfig(parts=str(directory), mode="sampled", progress=False, timeout=0,
                         model=ModelConfig(model="sage", hidden=16, num_layers=2),
                         sampled=SampledConfig(fanouts=(5, 5), batch_size=100))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        result = state.sampled_run.train_epoch(0)
        return int(state.graph.train_mask.sum()), state.sampled_run.steps, result["seeds"]

    results = run_fake_ranks(3, rank_fn)
    steps = {r[1] for r in results}
    assert len(steps) == 1
    assert steps.pop() == max(-(-r[0] // 100) for r in results)
    assert results[0][2] == 3 * 100 * results[0][1]  # every rank fills every step (recycling)


def test_bad_fanouts_are_one_clear_error(partitioned):
    config = TrainConfig(parts="unused", mode="sampled", model=ModelConfig(num_layers=3),
                         sampled=SampledConfig(fanouts=(10, 10)))
    with pytest.raises(ValueError, match="--fanouts has 2 values but the model has 3 layers"):
        config.validate()


@pytest.mark.mpi
def test_graphsage_sampled_on_cora(cora_root, tmp_path):
    parts = tmp_path / "cora"
    assert run_cli("partition", "--dataset", "planetoid:Cora", "--root", str(cora_root), "--num-parts", "2",
                   "--out", str(parts)).returncode == 0
    out = tmp_path / "m.jsonl"
    done = run_mpi(2, "train", "--parts", str(parts), "--model", "sage", "--mode", "sampled", "--fanouts", "10,10",
                   "--batch-size", "32", "--epochs", "60", "--feature-cache-mb", "1", "--metrics-out", str(out),
                   "--no-progress")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    final = records[-1]
    assert final["mode"] == "sampled"
    assert final["test_acc"] >= 0.78, final
    for key in ("seeds_per_s", "sample_s", "fetch_s", "compute_s", "cache_hit_rate", "feature_bytes"):
        assert key in records[0]
