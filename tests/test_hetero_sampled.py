"""Sampled training on typed graphs (`--mode sampled` on a typed partition), against independent references: the
dataset's own edges for the sampler, PyG (RGCNConv, HeteroConv of GATConv) replaying gnn-dist's own sampled
blocks for the forward and the gradients, torch.optim.SparseAdam for the embedding tables' update."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gnn_dist import ModelConfig, RankContext, TrainConfig
from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import SampledConfig
from gnn_dist.hetero.sampler import TypedSampler
from gnn_dist.partition.format import load_meta, load_part
from gnn_dist.training import setup
from tests.conftest import run_mpi
from tests.test_hetero import (
    gather_params_and_grads,
    pyg_typed_data,
    reference_rgcn,
    refused_between_the_plans,
    refused_then_fitting,
    typed_arrays,
    typed_npz,
    typed_parts,
)
from tests.test_rgat import reference_rgat

__all__ = ["typed_npz", "typed_parts"]  # module fixtures shared with tests/test_hetero.py

TYPES = ["paper", "author", "field"]


def orig_of_global(directory, num_parts: int) -> np.ndarray:
    """Global id (the partition's numbering: part k owns [partptr[k], partptr[k + 1])) -> homogeneous original id."""
    meta = load_meta(str(directory))
    return np.concatenate([load_part(str(directory), k, meta).node_ids for k in range(num_parts)])


def type_and_local(arrays: dict, orig: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.cumsum([0] + [int(arrays[f"num_nodes__{t}"]) for t in TYPES])
    kind = np.searchsorted(offsets, orig, side="right") - 1
    return kind, orig - offsets[kind]


def true_in_neighbours(arrays: dict) -> dict:
    """(homogeneous id, relation index) -> Counter of its in-neighbours' homogeneous ids, from PyG's
    ToUndirected graph (the relation order is PyG's edge_types order, which the partition keeps)."""
    data = pyg_typed_data(arrays)
    offsets = dict(zip(TYPES, np.cumsum([0] + [int(arrays[f"num_nodes__{t}"]) for t in TYPES])))
    neighbours: dict = {}
    for r, (src, _, dst) in enumerate(data.edge_types):
        edges = data[src, _, dst].edge_index.numpy()
        for u, v in zip(edges[0] + offsets[src], edges[1] + offsets[dst]):
            neighbours.setdefault((int(v), r), Counter())[int(u)] += 1
    return neighbours


def sampled_neighbourhoods(directory, num_parts: int, fanouts: tuple) -> list[dict]:
    """Per hop, (node's original id, relation) -> the original ids it drew, sampled from every owned paper at
    each rank (epoch 1, step 2)."""
    meta = load_meta(str(directory))
    g2o = orig_of_global(directory, num_parts)

    def rank_fn(comm):
        part = load_part(str(directory), comm.rank, meta)
        sampler = TypedSampler(comm, part, list(fanouts), seed=11)
        papers = np.flatnonzero(sampler.typed.owned_type == sampler.typed.type_index("paper"))
        names, blocks = sampler.sample(sampler.names_of_owned(papers), epoch=1, step=2)
        orig = g2o[sampler.global_of(names)]
        hops = []
        for block in blocks:
            drawn: dict = {}
            for d, s, r in zip(block.dst.numpy(), block.src.numpy(), block.relation.numpy()):
                drawn.setdefault((int(orig[d]), int(r)), []).append(int(orig[s]))
            # every (node, relation) asked, drawn from or not
            hops.append({key: sorted(value) for key, value in drawn.items()} | {"nodes": set(orig[:block.n_dst])})
        return hops

    per_rank = run_fake_ranks(num_parts, rank_fn)
    merged = []
    for hop in range(len(fanouts)):
        joined: dict = {"nodes": set()}
        for hops in per_rank:
            joined["nodes"] |= hops[hop].pop("nodes")
            joined |= hops[hop]
        merged.append(joined)
    return merged


def test_the_typed_sampler_draws_up_to_the_fanout_per_relation_and_never_depends_on_p(typed_parts):
    """Each node draws min(its in-edges of r, fanout) neighbours of relation r, for every relation, all of them
    true in-neighbours of r (repeated edges may be drawn as often as they repeat); a node's draw is keyed by
    its ids and the hop's key, so P=1 and P=2 draw the same for every node both reach."""
    arrays = typed_arrays()
    truth = true_in_neighbours(arrays)
    fanouts = (3, 2)
    at = {p: sampled_neighbourhoods(typed_parts[p], p, fanouts) for p in (1, 2)}
    relations = 1 + max(r for _, r in truth)
    for p, hops in at.items():
        for hop, fanout in enumerate(fanouts):
            drawn = hops[hop]
            for node in drawn["nodes"]:
                for r in range(relations):
                    have = truth.get((node, r), Counter())
                    got = Counter(drawn.get((node, r), []))
                    assert sum(got.values()) == min(sum(have.values()), fanout), (p, hop, node, r)
                    assert not got - have, (p, hop, node, r)
    assert at[1][0]["nodes"] == at[2][0]["nodes"] == set(range(60))  # every paper seeds once at each P
    for hop in range(len(fanouts)):
        common = at[1][hop]["nodes"] & at[2][hop]["nodes"]
        assert len(common) >= 40
        for key in [k for k in at[1][hop] if k != "nodes" and k[0] in common]:
            assert at[1][hop][key] == at[2][hop].get(key), (hop, key)
    # fanouts below a node's degree really subsample: the draws are not the whole neighbourhood
    assert any(len(v) < sum(truth[k].values()) for k, v in at[1][0].items() if k != "nodes")


def one_sampled_step(directory, num_parts: int, model: str, hidden: int = 8, heads: int = 1):
    """One sampled step (every rank's whole training set in one batch, no dropout): per rank its batch, the
    loss, parameters before and after, the summed replicated gradients and its tables' sparse gradients."""
    config = TrainConfig(parts=str(directory), epochs=0, progress=False, seed=5, mode="sampled", lr=0.01,
                         weight_decay=5e-4, sampled=SampledConfig(fanouts=(3, 2), batch_size=64),
                         model=ModelConfig(model=model, hidden=hidden, num_layers=2, dropout=0.0, heads=heads))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        mode, model_ = state.mode, state.model
        batches, table_grads = [], {}
        prepare, push = mode.prepare, mode.inputs.table_gradients

        def recording_prepare(*args):
            batches.append(prepare(*args))
            return batches[-1]

        def recording_push(scale):
            table_grads.update(push(scale))
            return table_grads

        mode.prepare, mode.inputs.table_gradients = recording_prepare, recording_push
        before = {n: p.detach().clone() for n, p in model_.named_parameters()}
        figures = mode.train_epoch(0)
        assert len(batches) == 1
        batch, _ = batches[0]
        inputs = model_.inputs
        shard_ids = {t: state.graph.node_ids[inputs.owned_rows[t]].numpy() for t in inputs.shards}
        return {"loss": figures["loss"], "seeds": figures["seeds"], "node_ids": batch.node_ids.numpy(),
                "blocks": batch.blocks, "targets": batch.targets, "params": before,
                "after": {n: p.detach().clone() for n, p in model_.named_parameters()},
                "grads": {n: p.grad.clone() for n, p in model_.named_parameters() if p.grad is not None},
                "table_grads": {f"inputs.shards.{t}": torch.zeros_like(model_.inputs.shards[t]).index_add_(0, *g)
                                for t, g in table_grads.items()},
                "shard_ids": shard_ids}

    return run_fake_ranks(num_parts, rank_fn)


def replay_level_inputs(arrays, data, lins, embs, orig: np.ndarray) -> torch.Tensor:
    """The batch's outermost level's rows through PyG's own input modules, in the level's order."""
    kind, local = type_and_local(arrays, orig)
    pieces, positions = [], []
    for k, t in enumerate(TYPES):
        at = np.flatnonzero(kind == k)
        index = torch.from_numpy(local[at])
        pieces.append(lins[t](data[t].x[index]) if t in lins else embs[t].weight[index])
        positions.append(at)
    order = np.empty(len(orig), dtype=np.int64)
    order[np.concatenate(positions)] = np.arange(len(orig))
    return torch.cat(pieces)[torch.from_numpy(order)]


def replay_rgat_layer(conv, data, arrays, x: torch.Tensor, orig: np.ndarray, block) -> torch.Tensor:
    """PyG's HeteroConv over one sampled block: every type's rows of the level, each relation's sampled edges in
    type-local positions; the targets' outputs (a prefix of the level) put back in the level's order."""
    kind, _ = type_and_local(arrays, orig)
    position = np.zeros(len(orig), dtype=np.int64)
    for k in range(len(TYPES)):
        position[kind == k] = np.arange(int((kind == k).sum()))
    x_dict = {t: x[torch.from_numpy(np.flatnonzero(kind == k))] for k, t in enumerate(TYPES)}
    dst, src, relation = block.dst.numpy(), block.src.numpy(), block.relation.numpy()
    edges = {}
    for r, edge_type in enumerate(data.edge_types):
        kept = relation == r
        edges[edge_type] = torch.from_numpy(np.stack([position[src[kept]], position[dst[kept]]]))
    out = conv(x_dict, edges)
    targets = np.arange(block.n_dst)
    return torch.stack([out[TYPES[kind[i]]][position[i]] for i in targets])


def replay(results, arrays, directory, num_parts: int, model: str, hidden: int, heads: int):
    """PyG in float64 on gnn-dist's own blocks from every rank: (the global mean loss, the gradients of the
    replicated weights by our names, PyG's embedding tables holding theirs)."""
    params, _ = gather_params_and_grads([{**r, "grads": r["params"]} for r in results], arrays)
    params = {n: v.double() for n, v in params.items()}
    if model == "rgcn":
        forward, theirs, _ = reference_rgcn(arrays, params, hidden, 2, 4, 0)

        def their_grads():
            return {name: parameter.grad for name, parameter in theirs.items()}
    else:
        forward, their_grads, _ = reference_rgat(arrays, params, hidden, heads, 2, 4)
    lins, embs, convs = forward.modules
    data = pyg_typed_data(arrays)
    g2o = orig_of_global(directory, num_parts)
    y = torch.from_numpy(arrays["y"])
    total, seeds = 0.0, 0
    for result in results:
        orig = g2o[result["node_ids"]]
        x = replay_level_inputs(arrays, data, lins, embs, orig)
        for k, (conv, block) in enumerate(zip(convs, reversed(result["blocks"]))):
            if model == "rgcn":
                edge_index = torch.stack([block.src, block.dst])
                x = conv(x[:block.n_src], edge_index, block.relation)[:block.n_dst]
            else:
                x = replay_rgat_layer(conv, data, arrays, x[:block.n_src], orig[:block.n_src], block)
            if k < len(convs) - 1:
                x = torch.relu(x)
        n = len(result["targets"])
        _, papers = type_and_local(arrays, orig[:n])
        total = total + F.cross_entropy(x[:n], y[torch.from_numpy(papers)], reduction="sum")
        seeds += n
    loss = total / seeds
    loss.backward()
    replicated = {name: grad for name, grad in their_grads().items() if not name.startswith("inputs.shards.")}
    return loss, replicated, embs


@pytest.mark.parametrize("model, heads", [("rgcn", 1), ("rgat", 2)])
@pytest.mark.parametrize("num_parts", [1, 2])
def test_a_sampled_step_equals_pyg_replaying_the_same_blocks(typed_parts, model, heads, num_parts):
    """The blocks every rank sampled, replayed through PyG's layers on the whole graph's features and tables: the
    same global loss, the same summed gradients of the replicated weights and of every embedding row (rows
    fetched from other ranks sent their gradients home), and each table stepped by torch.optim.SparseAdam on
    exactly the rows some batch touched, weight decay left out."""
    arrays = typed_arrays()
    hidden = 8
    results = one_sampled_step(typed_parts[num_parts], num_parts, model, hidden, heads)
    g2o = orig_of_global(typed_parts[num_parts], num_parts)
    # a batch holds every training paper of its rank (recycled up to the largest rank's count, as homogeneous
    # batches are)
    seeds = {int(i) for r in results for i in g2o[r["node_ids"][:len(r["targets"])]]}
    assert seeds == set(np.flatnonzero(arrays["train_mask"]).tolist())
    loss, theirs, embs = replay(results, arrays, typed_parts[num_parts], num_parts, model, hidden, heads)
    for result in results:
        assert result["loss"] == pytest.approx(float(loss), rel=1e-5)
    assert set(theirs) == set(results[0]["grads"])  # the shards hold no dense gradient
    for name, grad in theirs.items():
        assert (results[0]["grads"][name].double() - grad).abs().max() <= 1e-5, name
    before, after = gather_params_and_grads([{**r, "grads": r["after"]} for r in results], arrays)
    table_grads, _ = gather_params_and_grads([{**r, "params": r["table_grads"], "grads": r["table_grads"]}
                                              for r in results], arrays)
    (name,) = [n for n in before if n.startswith("inputs.shards.")]
    grad = table_grads[name]
    assert (grad.double() - embs["field"].weight.grad).abs().max() <= 1e-5
    touched = grad.abs().sum(1) > 0
    assert 0 < int(touched.sum()) <= 10
    # SparseAdam's rule on the same gradient: the touched rows move, no other row does
    reference = torch.nn.Parameter(before[name].clone())
    reference.grad = grad.to_sparse(1)
    torch.optim.SparseAdam([reference], lr=0.01).step()
    assert torch.allclose(after[name], reference.detach(), atol=1e-6)
    assert torch.equal(after[name][~touched], before[name][~touched])


@pytest.mark.mpi
def test_sampled_typed_training_learns_and_the_per_type_cache_changes_no_number(typed_parts, tmp_path):
    """P=2 sampled R-GCN on the typed graph: the loss falls; a per-type feature cache serves some of the remote
    feature rows, and every loss stays what it was without it (the embedding rows are never cached)."""
    curves = {}
    for cache in ("0", "1"):
        out = tmp_path / f"m{cache}.jsonl"
        done = run_mpi(2, "train", "--parts", str(typed_parts[2]), "--model", "rgcn", "--hidden", "16",
                       "--mode", "sampled", "--fanouts", "4,4", "--batch-size", "8", "--epochs", "12",
                       "--feature-cache-mb", cache, "--no-progress", "--metrics-out", str(out))
        assert done.returncode == 0, done.stderr
        curves[cache] = [json.loads(line) for line in out.read_text().splitlines()]
    epochs = [r for r in curves["1"] if "final" not in r]
    assert [r["loss"] for r in epochs] == [r["loss"] for r in curves["0"] if "final" not in r]
    assert epochs[-1]["loss"] < 0.8 * epochs[0]["loss"]
    assert sum(r["cache_hits"] for r in epochs) > 0


@pytest.mark.parametrize("kernels", ["native", "torch"])
def test_the_tables_update_is_torch_sparse_adams_over_several_steps(kernels, monkeypatch):
    """sparse_adam_step (the native kernel, and its torch formulation) against torch.optim.SparseAdam on the same
    table and the same sparse gradients, four steps with different rows touched (one step touching none, which
    still counts as a step, as every rank steps every table every step): the same rows, moments and step count."""
    from gnn_dist.hetero.mini_batch import sparse_adam_step
    from gnn_dist.kernels.native import KERNEL_ENV

    monkeypatch.setenv(KERNEL_ENV, kernels)

    generator = torch.Generator().manual_seed(3)
    table = torch.randn(12, 4, generator=generator)
    reference = torch.nn.Parameter(table.clone())
    theirs = torch.optim.SparseAdam([reference], lr=0.05)
    ours, state = table.clone(), {}
    for rows in ([0, 3, 7], [3, 4], [], [0, 11, 7, 5]):
        index = torch.tensor(rows, dtype=torch.int64).reshape(1, -1)
        grad = torch.sparse_coo_tensor(index, torch.randn(len(rows), 4, generator=generator), (12, 4)).coalesce()
        reference.grad = grad
        theirs.step()
        sparse_adam_step(ours, state, grad.indices()[0], grad.values(), 0.05, (0.9, 0.999), 1e-8)
        assert torch.allclose(ours, reference.detach(), atol=1e-6)
    assert float(state["step"]) == 4
    assert torch.allclose(state["exp_avg_sq"], theirs.state[reference]["exp_avg_sq"], atol=1e-7)


@pytest.mark.parametrize("model, heads", [("rgcn", 1), ("rgat", 2)])
def test_sampled_evaluation_layer_by_layer_in_chunks_equals_pyg_on_the_whole_graph(typed_parts, model, heads):
    """Sampled training evaluates each layer in chunks of 7 output rows from the part's CSR (no whole-part form is
    built): at P=2 the target's logits, and every node's rows after the first layer, equal PyG's whole graph."""
    arrays = typed_arrays()
    hidden = 8
    config = TrainConfig(parts=str(typed_parts[2]), epochs=0, progress=False, seed=5, mode="sampled",
                         eval_chunk_nodes=7, sampled=SampledConfig(fanouts=(3, 2), batch_size=64),
                         model=ModelConfig(model=model, hidden=hidden, num_layers=2, dropout=0.0, heads=heads))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        stack = state.model
        stack.eval()
        inputs = stack.inputs
        return {"params": {n: p.detach().clone() for n, p in stack.named_parameters()},
                "shard_ids": {t: state.graph.node_ids[inputs.owned_rows[t]].numpy() for t in inputs.shards},
                "ids": state.graph.node_ids.numpy(), "target_ids": state.graph.node_ids[stack.output_rows].numpy(),
                "logits": stack.forward_layerwise(None, 7), "hidden": stack.forward_layerwise(None, 7, upto=0)}

    results = run_fake_ranks(2, rank_fn)
    params, _ = gather_params_and_grads([{**r, "grads": r["params"]} for r in results], arrays)
    params = {n: v.double() for n, v in params.items()}
    if model == "rgcn":
        forward, _, _ = reference_rgcn(arrays, params, hidden, 2, 4, 0)
    else:
        forward, _, _ = reference_rgat(arrays, params, hidden, heads, 2, 4)
    with torch.no_grad():
        logits, first = forward(), forward(upto=0)
    for result in results:
        assert (result["logits"].double() - logits[torch.from_numpy(result["target_ids"])]).abs().max() <= 1e-5
        assert (result["hidden"].double() - first[torch.from_numpy(result["ids"])]).abs().max() <= 1e-5


@pytest.mark.parametrize("num_parts", [1, 2])
def test_the_sampled_plan_counts_what_set_up_and_training_keep(typed_parts, num_parts):
    """The sampled plan's kept parts against what set-up and a trained epoch hold: the sampler's relation CSRs
    (each array's bytes), the replicated weights (values, gradients, the flat buffer, Adam's two moments) and
    every shard with SparseAdam's two moments; and its batch's sizes against a sampled batch counted here
    (levels, edges, distinct (relation, target) rows, outermost nodes per type)."""
    from gnn_dist.plan.memory import plan_config_of
    from gnn_dist.plan.typed import typed_shape
    from gnn_dist.plan.typed_sampled import EvaluationChunks, SampledBatchShape, plan_typed_sampled_phases

    config = TrainConfig(parts=str(typed_parts[num_parts]), epochs=0, progress=False, seed=3, mode="sampled",
                         sampled=SampledConfig(fanouts=(3, 2), batch_size=8),
                         model=ModelConfig(model="rgcn", hidden=8, num_layers=2))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        mode = state.mode
        mode.train_epoch(0)
        csr_bytes = sum(csr.indptr.nbytes for csr in mode.sampler.relation_csrs) + \
            mode.sampler.relation_csrs[0].indices.base.nbytes  # every relation's sources are views of one array
        replicated = sum(p.numel() for p in state.model.replicated_parameters())
        shards = list(state.model.sharded_parameters())
        moments = [state.optimizer.state[s] for s in shards]
        assert all(m["exp_avg"].shape == s.shape and m["exp_avg_sq"].shape == s.shape for m, s in zip(moments, shards))
        seeds = mode.batch_seeds(0, mode.batches(0)[0])[0]
        names, blocks = mode.sampler.sample(seeds, 0, 0)
        part = load_part(typed_parts[num_parts], comm.rank)
        return (csr_bytes, replicated, sum(s.numel() for s in shards), names, blocks, mode.sampler.num_types,
                typed_shape(part.arrays, part.meta), part.meta.num_classes,
                EvaluationChunks.of(part.arrays, part.meta, 5),
                ((part.indptr, part.indices, part.edge_type), state.model.output_rows.numpy()))

    for csr_bytes, replicated, shard_values, names, blocks, num_types, shape, num_classes, chunks, part_csr in \
            run_fake_ranks(num_parts, rank_fn):
        # evaluation's chunks of 5 rows, counted here entry by entry from the part's CSR
        part_arrays, target_rows = part_csr
        for kind, rows in ((chunks.owned, np.arange(shape.owned)), (chunks.target, target_rows)):
            indptr, indices, edge_type = part_arrays
            for (size, counts), start in zip(kind, range(0, len(rows), 5)):
                chunk = rows[start:start + 5]
                assert size == len(chunk)
                for r in range(len(shape.relations)):
                    pairs = [(int(v), int(indices[j])) for v in chunk for j in range(indptr[v], indptr[v + 1])
                             if edge_type[j] == r]
                    assert counts[r] == (len(pairs), len({v for v, _ in pairs}), len({u for _, u in pairs}))
        # and add up to the part's own counts per relation (typed_shape counts them from a whole-part table)
        for kind, rows in ((chunks.owned, shape.owned), (chunks.target, shape.target)):
            assert sum(r for r, _ in kind) == rows and all(r <= 5 for r, _ in kind)
            for k, (e, a, s, into_target) in enumerate(shape.relations):
                if kind is chunks.owned or into_target:
                    assert sum(c[k][0] for _, c in kind) == e and sum(c[k][1] for _, c in kind) == a
                    assert all(c[k][2] <= min(s, c[k][0]) for _, c in kind)
                    assert a == 0 or any(c[k][2] > 0 for _, c in kind)
                else:
                    assert all(c[k] == (0, 0, 0) for _, c in kind)
        batch = SampledBatchShape.of(names, blocks, num_types)
        assert batch.levels == (blocks[0].n_dst, *(b.n_src for b in blocks)) and batch.levels[-1] == len(names)
        assert batch.edges == tuple(len(b.dst) for b in reversed(blocks))
        assert batch.reached == tuple(len(set(zip(b.relation.tolist(), b.dst.tolist()))) for b in reversed(blocks))
        assert batch.outer_per_type == tuple(int((names % num_types == k).sum()) for k in range(num_types))
        plan = plan_typed_sampled_phases(shape, batch, chunks, plan_config_of(config), num_classes)
        assert plan["train"].parts["sampler CSRs"] == csr_bytes
        assert plan["train"].parts["parameters, Adam"] == replicated * 4 * 5 + shard_values * 4 * 3
        assert plan["setup"].parts["parameters"] == (replicated + shard_values) * 4


@pytest.mark.mpi
def test_sampled_typed_training_refuses_a_job_over_its_memory_limit_and_records_the_plan(typed_parts, tmp_path):
    """A typed sampled job is refused in one line, with no metrics written: over set-up's own plan (no batch
    needed) before it loads features or builds shards; between set-up's plan and the whole plan (sized by a
    sampled batch) before its first epoch. Under a limit it fits, every rank's planned peak is in the final
    record, above set-up's plan."""
    from gnn_dist.partition.format import part_file_name
    from gnn_dist.plan.memory import plan_config_of
    from gnn_dist.plan.typed import typed_shape
    from gnn_dist.plan.typed_sampled import plan_typed_sampled_setup

    metrics = tmp_path / "m.jsonl"
    common = ["train", "--parts", str(typed_parts[2]), "--model", "rgcn", "--hidden", "16", "--mode", "sampled",
              "--fanouts", "4,4", "--batch-size", "8", "--no-progress"]
    planned = refused_then_fitting([*common, "--metrics-out", str(metrics)], metrics,
                                   phase="setup")["planned_peak_rss_bytes_per_rank"]
    meta = load_meta(typed_parts[2])
    config = plan_config_of(TrainConfig(parts=str(typed_parts[2]), mode="sampled", model=ModelConfig(model="rgcn",
                                                                                                       hidden=16)))
    setup_peaks = []
    for k in range(2):
        with np.load(typed_parts[2] / part_file_name(k)) as archive:
            shape = typed_shape({name: archive[name] for name in archive.files}, meta)
        setup_peaks.append(plan_typed_sampled_setup(shape, config, meta.num_classes).peak)
    refused_between_the_plans(common, tmp_path, setup_peaks, planned)


def test_the_sampled_plans_evaluation_takes_each_layers_costliest_chunk_of_its_own_rows():
    """The walk of evaluation: the hidden layers' chunks are the owned rows', the last layer's the target's, and
    a layer's cost is its costliest chunk (a chunk of far more entries than the others sets it)."""
    from gnn_dist.plan.liveness import Liveness
    from gnn_dist.plan.typed import TypedShape
    from gnn_dist.plan.typed_sampled import EvaluationChunks, _chunk_bytes, _evaluation

    shape = TypedShape(owned=100, halo=0, target=40, train=10, sent=0, sent_featureless=0, owned_per_type=(40, 60),
                       halo_per_type=(0, 0), widths=(8, 0), relations=((500, 90, 80, False), (300, 40, 30, True)),
                       file_bytes=0)
    small, large = (10, ((5, 5, 5), (5, 5, 5))), (10, ((0, 0, 0), (10**7, 10, 10**6)))
    widths = [(16, 16, {}), (16, 3, {})]
    for attends in (False, True):
        for owned, target, expected in (((small,), (small, large), large), ((small, large), (small,), small)):
            live = Liveness({})
            _evaluation(live, shape, widths, 16, EvaluationChunks(owned=owned, target=target), attends)
            # the last layer's chunk is alive at the last layer's peak
            assert sum(_chunk_bytes(*expected, 16, 3, 1, attends)) <= live.peak
            if expected is small:  # the large owned chunk sets the hidden layer's peak, not the last's
                assert live.at_peak["chunk"] + live.at_peak["relation temporaries"] == \
                    sum(_chunk_bytes(*large, 16, 16, 1, attends))
            else:
                assert live.at_peak["chunk"] + live.at_peak["relation temporaries"] == \
                    sum(_chunk_bytes(*large, 16, 3, 1, attends))
