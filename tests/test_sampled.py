"""Sampled mini-batch training: the sampler against the graph itself, remote features against the dataset."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import ModelConfig, SampledConfig, TrainConfig
from gnn_dist.context import RankContext
from gnn_dist.graph import feature_store
from gnn_dist.graph.feature_store import FeatureStore
from gnn_dist.graph.sampler import DistributedSampler, Relabel, sample_key
from gnn_dist.kernels.native import native_module
from gnn_dist.partition.datasets import load_dataset
from gnn_dist.partition.format import load_node_map, load_part
from gnn_dist.training import setup
from tests.conftest import run_cli, run_mpi

SEEDS = np.array([3, 17, 250, 1024, 2048, 3333, 4999])


def sample_by_original_id(directory, num_parts, fanouts, local_only=False, as_lists=False):
    """Each rank samples for its share of SEEDS; returns per hop the set of (target, source) original ids.

    as_lists: per hop the list of pairs instead (repeats stay visible), and the levels' nodes (original ids).
    """
    node_map = load_node_map(directory)
    new_of = np.empty_like(node_map)
    new_of[node_map] = np.arange(len(node_map))

    def rank_fn(comm):
        part = load_part(directory, comm.rank)
        sampler = DistributedSampler(comm, part, fanouts, seed=5, local_only=local_only)
        mine = SEEDS[comm.rank::num_parts]
        nodes, blocks = sampler.sample(new_of[mine], epoch=1, step=2)
        hops = []
        for block in blocks:
            dst_level = nodes[:block.n_dst]
            pairs = [(int(node_map[dst_level[d]]), int(node_map[nodes[s]]))
                     for d, s in zip(block.dst.tolist(), block.src.tolist())]
            hops.append(pairs if as_lists else set(pairs))
        if as_lists:
            levels = [node_map[nodes[:block.n_dst]].tolist() for block in blocks] + [node_map[nodes].tolist()]
            return hops, levels
        return hops, sampler.counters.sample_bytes, part

    return run_fake_ranks(num_parts, rank_fn)


def test_samples_are_independent_of_p(partitioned):
    per_p = {}
    for num_parts in (1, 2, 3):
        results = sample_by_original_id(partitioned("synthetic:small", num_parts), num_parts, [6, 4])
        per_p[num_parts] = [set().union(*(r[0][h] for r in results)) for h in range(2)]
    assert per_p[1] == per_p[2] == per_p[3]


@pytest.mark.parametrize("num_parts", [1, 3])
def test_every_hop_samples_its_whole_frontier_within_the_fanout(partitioned, num_parts):
    graph = load_dataset("synthetic:small")
    edges = set(zip(graph.edge_index[1].tolist(), graph.edge_index[0].tolist()))  # (target, source)
    degree = np.bincount(graph.edge_index[1], minlength=graph.num_nodes)
    fanouts = [6, 4, 3]
    results = sample_by_original_id(partitioned("synthetic:small", num_parts), num_parts, fanouts, as_lists=True)
    for rank, (hops, levels) in enumerate(results):
        assert levels[0] == SEEDS[rank::num_parts].tolist()
        for hop, (pairs, fanout) in enumerate(zip(hops, fanouts)):
            assert set(pairs) <= edges, hop
            assert len(pairs) == len(set(pairs)), hop  # no neighbour drawn twice for one target
            frontier = levels[hop]
            draws = {node: 0 for node in frontier}
            for target, _ in pairs:
                draws[target] += 1  # a KeyError here: a target outside the frontier
            assert draws == {node: min(int(degree[node]), fanout) for node in frontier}, hop
            # the next level is this frontier followed by the new sources, each once
            new = levels[hop + 1][len(frontier):]
            assert levels[hop + 1][:len(frontier)] == frontier
            assert sorted(new) == sorted({s for _, s in pairs} - set(frontier))


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


@pytest.mark.parametrize("compact_every", [None, 7])  # 7: requests are folded into counts along the way
def test_cache_refill_keeps_the_most_requested_and_fetches_only_new_rows(partitioned, monkeypatch, compact_every):
    if compact_every is not None:
        monkeypatch.setattr(feature_store, "_COMPACT_REQUESTS", compact_every)
    graph = load_dataset("synthetic:small")
    directory = partitioned("synthetic:small", 2)
    node_map = load_node_map(directory)
    row_bytes = graph.num_features * 4

    def rank_fn(comm):
        state = setup(RankContext(comm), TrainConfig(parts=str(directory), progress=False, timeout=0))
        sampler = DistributedSampler(comm, load_part(directory, comm.rank), [2], seed=0)
        store = FeatureStore(comm, sampler, state.x_full, count_requests=True)
        remote = np.setdiff1d(np.arange(graph.num_nodes), sampler.local_to_global)[:30]
        hot, warm, cold = remote[:5], remote[5:15], remote[15:]
        # requests: hot 3 times, warm twice, cold once (plus owned nodes, which are never counted)
        for ids in (remote, np.concatenate([hot, warm, [sampler.first]]), hot):
            store.gather(ids)
        ids, hits = store.request_counts()
        store.fill_cache(warm[:4], np.ones(4, dtype=np.int64), budget_bytes=4 * row_bytes)  # an earlier fill
        sampler.counters.reset()
        store.fill_cache(ids, hits, budget_bytes=15 * row_bytes)
        refill_bytes = sampler.counters.feature_bytes
        sampler.counters.reset()
        answer = store.gather(remote)
        store.request_counts()
        # the counting pass's path: owned and halo nodes are never counted, remote ones once each
        halo_node = sampler.local_to_global[sampler.part.n_owned] if sampler.part.n_halo else sampler.first
        store.count_remote(np.concatenate([remote, [sampler.first, halo_node]]))
        counted = store.request_counts()
        return (ids, hits, hot, warm, cold, store.cache_ids, refill_bytes, answer, remote,
                sampler.counters.cache_hits, counted)

    for ids, hits, hot, warm, cold, cached, refill_bytes, answer, remote, cache_hits, counted in \
            run_fake_ranks(2, rank_fn):
        assert np.array_equal(counted[0], np.sort(remote)) and (counted[1] == 1).all()
        expected = dict(zip(np.concatenate([hot, warm, cold]).tolist(), [3] * 5 + [2] * 10 + [1] * len(cold)))
        assert dict(zip(ids.tolist(), hits.tolist())) == expected
        assert set(cached.tolist()) == set(hot.tolist()) | set(warm.tolist())
        assert refill_bytes == 11 * row_bytes  # 15 chosen, 4 of them were cached already
        assert cache_hits == 15
        assert torch.equal(answer, torch.from_numpy(graph.x[node_map[remote]]))


def test_ranks_with_unequal_training_nodes_run_the_same_steps(partitioned):
    directory = partitioned("synthetic:small", 3)
    config = TrainConfig(parts=str(directory), mode="sampled", progress=False, timeout=0,
                         model=ModelConfig(model="sage", hidden=16, num_layers=2),
                         sampled=SampledConfig(fanouts=(5, 5), batch_size=100))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        result = state.mode.train_epoch(0)
        return int(state.graph.train_mask.sum()), state.mode.steps, result["seeds"]

    results = run_fake_ranks(3, rank_fn)
    steps = {r[1] for r in results}
    assert len(steps) == 1
    assert steps.pop() == max(-(-r[0] // 100) for r in results)
    # every rank draws as many nodes as the rank with the most (recycling its own), the last batch partial
    largest = max(r[0] for r in results)
    assert largest % 100 != 0  # so a partial last batch is exercised
    assert results[0][2] == 3 * largest


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
    accuracies = []
    for seed in (0, 1, 2):  # one seed's accuracy moves by about a point; the mean of three is the claim
        out = tmp_path / f"m{seed}.jsonl"
        done = run_mpi(2, "train", "--parts", str(parts), "--model", "sage", "--mode", "sampled", "--fanouts",
                       "10,10", "--batch-size", "32", "--epochs", "60", "--feature-cache-mb", "1", "--seed",
                       str(seed), "--metrics-out", str(out), "--no-progress")
        assert done.returncode == 0, done.stderr
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert records[-1]["mode"] == "sampled"
        accuracies.append(records[-1]["test_acc"])
    assert np.mean(accuracies) >= 0.78, accuracies
    for key in ("seeds_per_s", "sample_s", "fetch_s", "compute_s", "cache_hit_rate", "feature_bytes"):
        assert key in records[0]


def test_native_sampler_draws_exactly_what_the_numpy_path_draws(partitioned):
    if native_module() is None:
        pytest.skip("native kernels unavailable (no C++ compiler): only the numpy sampler runs here")
    directory = partitioned("synthetic:small", 2)

    def rank_fn(comm):
        sampler = DistributedSampler(comm, load_part(directory, comm.rank), [3], seed=0)
        rng = np.random.default_rng(comm.rank)
        rows = rng.choice(sampler.part.n_owned, 400, replace=True)  # repeats and any degree, including 0
        checked = 0
        for fanout, step in ((1, 0), (3, 1), (10, 2), (10**6, 3)):
            key = sample_key(0, 1, step, 0)
            counts, sources = sampler.sample_owned(rows, fanout, key)
            want_counts, want_sources = sampler.csr.sample_numpy(rows, fanout, key)
            assert np.array_equal(counts, want_counts) and np.array_equal(sources, want_sources)
            checked += len(sources)
        empty = sampler.sample_owned(np.zeros(0, dtype=np.int64), 5, sample_key(0, 0, 0, 0))
        assert len(empty[0]) == 0 and len(empty[1]) == 0
        return checked

    assert all(checked > 1000 for checked in run_fake_ranks(2, rank_fn))


def test_native_relabel_matches_numpy_over_several_hops(monkeypatch):
    if native_module() is None:
        pytest.skip("native kernels unavailable (no C++ compiler): only the numpy relabel runs here")
    rng = np.random.default_rng(0)
    for n_seeds, hops in ((0, [0, 50]), (40, [0, 7]), (500, [3000, 20_000, 1]), (5, [10_000, 10_000])):
        seeds = rng.choice(10**9, n_seeds, replace=False)
        if n_seeds:
            seeds[-1] = seeds[0]  # a repeated seed (a recycled batch): sources point at its last copy
        results = {}
        for kernel in ("native", "torch"):
            if kernel == "torch":
                monkeypatch.setenv("GNN_DIST_KERNEL", "torch")
            relabel, level, got = Relabel(), seeds.copy(), []
            relabel.reset(np.arange(5))  # a sample before: its ids must be forgotten
            relabel.extend(np.arange(100, 20_000))
            relabel.reset(seeds)
            draws = np.random.default_rng(n_seeds)  # the same sources for both kernels
            for n_sources in hops:
                # sources: some of every level so far, some never seen (a few repeated within the hop)
                sources = np.concatenate([draws.choice(level, n_sources // 2) if len(level) else np.zeros(0, np.int64),
                                          draws.integers(0, 2000 + 10**6 * len(got), n_sources - n_sources // 2)])
                new, src = relabel.extend(sources)
                unseen = sources[~np.isin(sources, level)]
                assert np.array_equal(new, unseen[np.sort(np.unique(unseen, return_index=True)[1])])  # first seen
                level = np.concatenate([level, new])
                assert np.array_equal(level[src], sources)
                got.append((new, src))
            results[kernel] = got
            monkeypatch.delenv("GNN_DIST_KERNEL", raising=False)
        for (new_a, src_a), (new_b, src_b) in zip(results["native"], results["torch"]):
            assert np.array_equal(new_a, new_b) and np.array_equal(src_a, src_b)


def pyg_block_logits(model: str, params: dict, x_src: torch.Tensor, blocks, labels: torch.Tensor, widths):
    """The model's PyG computation on the same sampled blocks (outermost first), as its file names it
    (DistConv.pyg_block_conv): logits and the parameter gradients of the summed loss."""
    import torch.nn.functional as F

    from gnn_dist.models import model_class

    conv_class = model_class(model)
    layers = []
    for k, (i, o, options) in enumerate(widths):
        module = conv_class.pyg_block_conv(i, o, **options).double()
        with torch.no_grad():
            for ours, theirs in conv_class.pyg_parameter_names().items():
                module.reference.get_parameter(theirs).copy_(params[f"convs.{k}.{ours}"])
        layers.append(module)
    h = x_src.double()
    for k, block in enumerate(reversed(blocks)):  # blocks come hop 1 first; layer 0 reads the outermost
        if k > 0:
            h = torch.relu(h)
        h = layers[k](h, block.n_dst, torch.stack([block.src, block.dst]))
    F.cross_entropy(h, labels, reduction="sum").backward()
    grads = {}
    for k, module in enumerate(layers):
        for ours, theirs in conv_class.pyg_parameter_names().items():
            grads[f"convs.{k}.{ours}"] = module.reference.get_parameter(theirs).grad
    return h.detach(), grads


# hidden 16 below the 64 features: the input layer narrows; 64: it widens, aggregates first (_BlockUpdate) and its
# operator has no transpose. Which order a narrowing layer takes on a block depends on the block's sizes (the test
# after this one holds both orders to PyG).
@pytest.mark.parametrize("model,hidden", [("sage", 16), ("sage", 64), ("gcn", 16), ("gat", 16)])
def test_a_sampled_step_equals_pyg_on_the_same_blocks(partitioned, model, hidden):
    import torch.nn.functional as F

    from gnn_dist.kernels.keyed_random import sampled_stream_key
    from gnn_dist.steps.layer_stack import forward_blocks
    from gnn_dist.steps.mini_batch import PreparedBatch

    graph = load_dataset("synthetic:small")
    directory = partitioned("synthetic:small", 2)
    node_map = load_node_map(directory)
    config = TrainConfig(parts=str(directory), mode="sampled", progress=False, timeout=0, seed=1,
                         model=ModelConfig(model=model, hidden=hidden, num_layers=3, dropout=0.0,
                                           heads=2 if model == "gat" else 1),
                         sampled=SampledConfig(fanouts=(4, 3, 2), batch_size=40))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        run = state.mode
        batch = run.batches(0)[0]
        nodes, blocks = run.sampler.sample(batch + run.sampler.first, 0, 0)
        x = run.store.gather(nodes)
        operators = run.block_operators(PreparedBatch(x, blocks, torch.from_numpy(nodes), batch))
        # a transpose exactly where a gradient flows back through the aggregation, in the order forward_block
        # takes on the operator itself (block_operators decides from the block's counts before building it)
        assert [op.transpose is not None for op in operators] == \
            [k > 0 or not conv.aggregates_operator_first(op) for k, (conv, op) in
             enumerate(zip(state.model.convs, operators))] if model != "gat" else [False] * 3
        keys = [sampled_stream_key(1, 0, 0, comm.rank, k) for k in range(3)]
        state.model.train()
        logits = forward_blocks(state.model, x, operators, torch.from_numpy(nodes), keys)
        F.cross_entropy(logits, state.graph.y[torch.from_numpy(batch)], reduction="sum").backward()
        params = {k: p.detach().double().clone() for k, p in state.model.named_parameters()}
        grads = {k: p.grad.double().clone() for k, p in state.model.named_parameters()}
        return nodes, blocks, logits.detach().double(), params, grads

    for nodes, blocks, logits, params, grads in run_fake_ranks(2, rank_fn):
        assert blocks[-1].n_src > blocks[0].n_dst  # the sample reached beyond the seeds
        original = node_map[nodes]  # the features and labels come from the dataset, not from our store
        x_ref = torch.from_numpy(graph.x[original])
        labels = torch.from_numpy(graph.y[original[:blocks[0].n_dst]])
        ref_logits, ref_grads = pyg_block_logits(model, params, x_ref, blocks, labels,
                                                 config.model.layers(graph.num_features, graph.num_classes))
        assert (logits - ref_logits).abs().max() <= 1e-5
        assert set(ref_grads) == set(grads)
        for name, grad in grads.items():
            assert (grad - ref_grads[name]).abs().max() <= 1e-4, name


def _block(targets_sources: list[list[int]], n_src: int):
    from gnn_dist.graph.sampler import Block

    dst = torch.tensor([t for t, sources in enumerate(targets_sources) for _ in sources], dtype=torch.int64)
    src = torch.tensor([s for sources in targets_sources for s in sources], dtype=torch.int64)
    return Block(dst=dst, src=src, n_dst=len(targets_sources), n_src=n_src)


@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_a_narrowing_layer_aggregates_a_block_first_where_that_multiplies_less(model):
    """A layer 32 -> 4 transforms first on a whole graph (the narrower side). On a block of 6 targets with 10
    sources each out of 60 rows, aggregating first costs 60*32 + 6*32*4 = 2688 multiply-adds (GCN's 6 self
    loops: 2880) against 60*32*4 + 60*4 = 7920 transforming first: the layer aggregates first. On a block whose
    20 sources are its 20 targets, 3 each: 60*32 + 20*32*4 = 4480 (GCN 5120) against 20*32*4 + 60*4 = 2800
    (GCN 3120): it transforms first. Both outputs and gradients equal PyG's on the block; the order shows in the
    autograd node that made the output."""
    from gnn_dist.models import model_class

    conv_class = model_class(model)
    rng = np.random.default_rng(3)
    wide = _block([sorted(rng.choice(np.arange(6, 60), 10, replace=False).tolist()) for _ in range(6)], 60)
    square = _block([sorted(rng.choice(20, 3, replace=False).tolist()) for _ in range(20)], 20)
    aggregate_first_node = {"sage": "_BlockUpdateBackward", "gcn": "AddmmBackward0"}[model]
    for block, aggregates_first in ((wide, True), (square, False)):
        conv = conv_class(32, 4, None, None, "test")
        op = conv_class.block_operator(block, True)
        h = torch.randn(block.n_src, 32, dtype=torch.float32, requires_grad=True)
        out = conv.forward_block(h, op)
        assert conv.aggregates_operator_first(op) == aggregates_first
        assert (type(out.grad_fn).__name__ == aggregate_first_node) == aggregates_first, type(out.grad_fn).__name__
        out.pow(2).sum().backward()
        reference = conv_class.pyg_block_conv(32, 4).double()
        with torch.no_grad():
            for ours, theirs in conv_class.pyg_parameter_names().items():
                reference.reference.get_parameter(theirs).copy_(conv.get_parameter(ours))
        h_ref = h.detach().double().requires_grad_(True)
        ref = reference(h_ref, block.n_dst, torch.stack([block.src, block.dst]))
        ref.pow(2).sum().backward()
        assert (out.detach().double() - ref.detach()).abs().max() <= 1e-5
        assert (h.grad.double() - h_ref.grad).abs().max() <= 1e-4
        for ours, theirs in conv_class.pyg_parameter_names().items():
            grad, ref_grad = conv.get_parameter(ours).grad, reference.reference.get_parameter(theirs).grad
            assert (grad.double() - ref_grad).abs().max() <= 1e-4, ours


def test_a_batch_shape_counts_the_levels_and_every_hops_draws(partitioned):
    """BatchShape.of on a real sample (P=1): its levels are the distinct nodes reached within each hop, its edges per
    layer the draws of that hop, each frontier node drawing min(its in-degree, the fanout) (the dataset's own
    degrees), the outermost hop first."""
    from gnn_dist.plan.sampled import BatchShape

    graph = load_dataset("synthetic:small")
    degree = np.bincount(graph.edge_index[1], minlength=graph.num_nodes)
    fanouts = [6, 4, 3]
    directory = partitioned("synthetic:small", 1)
    node_map = load_node_map(directory)  # new (global) id -> original id

    def rank_fn(comm):
        sampler = DistributedSampler(comm, load_part(directory, 0), fanouts, seed=0)
        return sampler.sample(np.arange(50, dtype=np.int64), 0, 0)

    [(nodes, blocks)] = run_fake_ranks(1, rank_fn)
    shape = BatchShape.of(blocks)
    levels, draws = [50], []
    for fanout, block in zip(fanouts, blocks):
        frontier = node_map[nodes[:block.n_dst]]
        draws.append(int(np.minimum(degree[frontier], fanout).sum()))
        # the next level: the frontier, then each source not in it yet, once
        assert block.n_src == len(set(range(block.n_dst)) | set(block.src.tolist()))
        levels.append(block.n_src)
    assert shape.levels == tuple(levels) and levels[-1] == len(nodes)
    assert shape.edges == tuple(reversed(draws))


def test_the_largest_evaluation_chunk_is_counted_from_the_csr():
    from gnn_dist.plan.sampled import largest_chunk_entries

    indptr = np.array([0, 2, 5, 5, 9, 10])  # rows of 2, 3, 0, 4 and 1 entries
    assert largest_chunk_entries(indptr, 5, 2) == 5   # chunks [0, 2): 5, [2, 4): 4, [4, 5): 1
    assert largest_chunk_entries(indptr, 5, 3) == 5   # [0, 3): 5, [3, 5): 5
    assert largest_chunk_entries(indptr, 5, 1) == 4
    assert largest_chunk_entries(indptr, 5, 100) == 10


@pytest.mark.mpi
def test_sampled_training_refuses_a_job_over_its_memory_limit_and_records_the_plan(partitioned, tmp_path):
    """A sampled job is refused in one line, with no metrics written: over set-up's own plan (no batch needed)
    before it fetches the halo's features; between set-up's plan and the whole plan (sized by a sampled batch)
    before its first epoch. Under a limit it fits, every rank's planned peak is in the final record, above
    set-up's plan."""
    from gnn_dist.partition.format import load_meta, part_shapes
    from gnn_dist.plan.memory import plan_config_of
    from gnn_dist.plan.sampled import plan_sampled_setup
    from tests.test_hetero import refused_between_the_plans, refused_then_fitting

    parts = partitioned("synthetic:small", 2)
    metrics = tmp_path / "m.jsonl"
    common = ["train", "--parts", str(parts), "--model", "sage", "--hidden", "16", "--mode", "sampled",
              "--fanouts", "4,4", "--batch-size", "32", "--no-progress"]
    planned = refused_then_fitting([*common, "--metrics-out", str(metrics)], metrics,
                                   phase="setup")["planned_peak_rss_bytes_per_rank"]
    meta = load_meta(parts)
    config = plan_config_of(TrainConfig(parts=str(parts), mode="sampled", model=ModelConfig(model="sage", hidden=16)))
    setup_peaks = [plan_sampled_setup(shape, config, meta.num_features, meta.num_classes).peak
                   for shape in part_shapes(parts)]
    refused_between_the_plans(common, tmp_path, setup_peaks, planned)
