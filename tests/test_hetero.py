"""Typed (heterogeneous) graphs: the typed .npz input, reverse relations as PyG's ToUndirected makes them, typed
partitions, and R-GCN exact at any P against an independent PyG model on the whole graph (per-type Linear
inputs, nn.Embedding tables for featureless types, to_homogeneous() and RGCNConv(aggr='mean'))."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gnn_dist import ModelConfig, RankContext, TrainConfig
from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.partition.datasets import load_dataset
from gnn_dist.partition.format import load_part, type_offsets
from gnn_dist.partition.graph import DatasetError
from gnn_dist.partition.hetero import load_hetero_npz
from gnn_dist.partition.hetero_parts import partition_typed_graph
from gnn_dist.training import setup
from tests.conftest import SHARED_DATA, run_cli, run_mpi


def typed_arrays(seed: int = 0) -> dict:
    """A small typed graph in the .npz format: papers (the target, 8 features, 4 classes) cite papers, authors
    (5 features) write papers, papers have fields (featureless); a few repeated writes edges."""
    rng = np.random.default_rng(seed)
    papers, authors, fields = 60, 80, 10
    writes = np.stack([rng.integers(0, authors, 150), rng.integers(0, papers, 150)])
    writes = np.concatenate([writes, writes[:, :5]], axis=1)  # repeated edges stay repeated (ToUndirected)
    y = rng.integers(0, 4, papers)
    split = rng.permutation(papers)
    masks = [np.isin(np.arange(papers), split[a:b]) for a, b in ((0, 30), (30, 45), (45, 60))]
    return {
        "node_types": np.array(["paper", "author", "field"]), "target": np.array("paper"),
        "num_nodes__paper": np.int64(papers), "num_nodes__author": np.int64(authors),
        "num_nodes__field": np.int64(fields),
        "x__paper": rng.normal(size=(papers, 8)).astype(np.float32),
        "x__author": rng.normal(size=(authors, 5)).astype(np.float32),
        "edge_index__author__writes__paper": writes,
        "edge_index__paper__cites__paper": np.stack([rng.integers(0, papers, 100), rng.integers(0, papers, 100)]),
        "edge_index__paper__has__field": np.stack([np.arange(papers), rng.integers(0, fields, papers)]),
        "y": y, "train_mask": masks[0], "val_mask": masks[1], "test_mask": masks[2],
    }


@pytest.fixture(scope="module")
def typed_npz(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("typed") / "typed.npz"
    np.savez(path, **typed_arrays())
    return path


@pytest.fixture(scope="module")
def typed_parts(typed_npz, tmp_path_factory):
    """partitions of the typed graph (reverse relations added) at P = 1, 2, 4, made once."""
    graph = load_hetero_npz(str(typed_npz)).with_reverse_relations()
    base = tmp_path_factory.mktemp("typed-parts")
    return {p: partition_typed_graph(graph, p, base / f"p{p}", locality_block=16) and base / f"p{p}" for p in (1, 2, 4)}


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update({"edge_index__paper__cites__venue": np.zeros((2, 1), np.int64)}), "unknown node type 'venue'"),
    (lambda a: a["edge_index__paper__has__field"].__setitem__((1, 0), 10), "field id 10, outside [0, 10)"),
    (lambda a: a.update({"x__author": np.zeros((79, 5), np.float32)}), "x__author has shape (79, 5) but type 'author'"),
    (lambda a: a.update({"y": np.zeros(59, np.int64)}), "the target type needs labels"),
    (lambda a: a.update({"num_nodes__field": np.int64(0)}), "node type 'field' has no nodes"),
])
def test_bad_typed_input_gets_one_line_naming_the_fix(tmp_path, change, message):
    arrays = typed_arrays()
    change(arrays)
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DatasetError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_hetero_npz(str(path))
    done = run_cli("partition", "--dataset", f"hetero:{path}", "--num-parts", "2", "--out", str(tmp_path / "p"))
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1 and message.split("(")[0] in done.stderr
    assert not (tmp_path / "p").exists()


def parts_edge_balance(directory: Path, graph) -> float:
    """max / mean over parts of their owned nodes' operator rows (in-edges over every relation, plus one),
    counted on the graph's own edges, not the parts' CSR."""
    in_edges = np.bincount(graph.homogeneous()[0][1], minlength=graph.total_nodes)
    meta = json.loads((directory / "meta.json").read_text())
    rows = np.array([(in_edges[load_part(directory, k).node_ids] + 1).sum() for k in range(meta["num_parts"])])
    return float(rows.max() / rows.mean())


def test_a_typed_partition_evens_the_parts_edges_by_default_and_keeps_each_type_balanced(tmp_path):
    """synthetic:magtiny's degrees are heavy-tailed: node-balanced parts differ in edges (1.17-1.23x their mean at
    P = 2, 4 with seed 0), the default (each node weighing its edges) within 5%; every type within 3% either way."""
    graph = load_dataset("synthetic:magtiny").with_reverse_relations()
    sizes = np.array([graph.num_nodes[t] for t in graph.node_types])
    offsets = np.array([graph.offsets()[t] for t in graph.node_types])
    for p in (2, 4):
        balances = {}
        for rule in ("default", "nodes"):
            out = tmp_path / f"{rule}-{p}"
            done = run_cli("partition", "--dataset", "synthetic:magtiny", "--num-parts", str(p), "--out", str(out),
                           *(["--balance", rule] if rule != "default" else []))
            assert done.returncode == 0, done.stderr
            assert json.loads((out / "meta.json").read_text())["balance"] == ("edges" if rule == "default" else rule)
            balances[rule] = parts_edge_balance(out, graph)
            for k in range(p):
                counts = np.bincount(np.searchsorted(offsets, load_part(out, k).node_ids, side="right") - 1,
                                     minlength=len(sizes))
                assert (counts <= np.ceil(1.03 * sizes / p)).all(), (rule, p, counts)
        assert balances["default"] <= 1.05 < balances["nodes"], balances
    refused = run_cli("partition", "--dataset", "synthetic:magtiny", "--num-parts", "2", "--method", "random",
                      "--balance", "both", "--out", str(tmp_path / "refused"))
    assert refused.returncode != 0 and "use --method metis, or drop --balance" in refused.stderr
    assert not (tmp_path / "refused").exists()


def pyg_typed_data(arrays: dict):
    """The same graph as PyG's HeteroData, ToUndirected() applied: the independent side of every comparison."""
    from torch_geometric.data import HeteroData
    from torch_geometric.transforms import ToUndirected

    data = HeteroData()
    for t in arrays["node_types"]:
        data[str(t)].num_nodes = int(arrays[f"num_nodes__{t}"])
        if f"x__{t}" in arrays:
            data[str(t)].x = torch.from_numpy(arrays[f"x__{t}"]).double()
    for key, value in arrays.items():
        if key.startswith("edge_index__"):
            src, rel, dst = key.split("__")[1:]
            data[src, rel, dst].edge_index = torch.from_numpy(np.asarray(value, dtype=np.int64))
    return ToUndirected()(data)


def test_reverse_relations_are_pyg_to_undirected(typed_npz):
    ours = load_hetero_npz(str(typed_npz)).with_reverse_relations()
    theirs = pyg_typed_data(typed_arrays())
    assert list(ours.relations) == list(theirs.edge_types)
    for relation in ours.relations:
        assert np.array_equal(ours.edges[relation], theirs[relation].edge_index.numpy()), relation
    raw = load_hetero_npz(str(typed_npz))  # --no-reverse-relations: as given
    assert list(raw.relations) == [("author", "writes", "paper"), ("paper", "cites", "paper"), ("paper", "has", "field")]


def test_a_typed_partition_holds_every_typed_edge_once_and_balances_each_type(typed_npz, typed_parts):
    graph = load_hetero_npz(str(typed_npz)).with_reverse_relations()
    edge_index, edge_type, node_type = graph.homogeneous()
    want = sorted(zip(edge_index[0], edge_index[1], edge_type))
    for p, directory in typed_parts.items():
        got, counts = [], np.zeros((p, len(graph.node_types)), dtype=np.int64)
        for k in range(p):
            part = load_part(directory, k)
            ids = np.concatenate([part.node_ids, part.halo_ids])
            rows = np.repeat(part.node_ids, np.diff(part.indptr))
            got += zip(ids[part.indices], rows, part.edge_type)
            owned_type = np.searchsorted(type_offsets(part.meta.hetero), part.node_ids, side="right") - 1
            counts[k] = np.bincount(owned_type, minlength=len(graph.node_types))
            for t, x in graph.x.items():
                local = part.node_ids[owned_type == graph.node_types.index(t)] - graph.offsets()[t]
                assert np.array_equal(part.arrays[f"x__{t}"], x[local])
        assert sorted(got) == want  # repeated edges included, each with its relation
        sizes = np.array([graph.num_nodes[t] for t in graph.node_types])
        assert (counts.max(0) <= np.ceil(1.03 * sizes / p)).all(), counts


def reference_rgcn(arrays: dict, params: dict, hidden: int, num_layers: int, num_classes: int, num_bases: int):
    """PyG on the whole graph in float64: a Linear per featured type, an nn.Embedding per featureless type (holding
    our rows), to_homogeneous(), then num_layers RGCNConv(aggr='mean') layers with ReLU between; our parameters
    copied in."""
    from torch_geometric.nn import RGCNConv

    data = pyg_typed_data(arrays)
    types = [str(t) for t in arrays["node_types"]]
    lins = nn.ModuleDict({t: nn.Linear(data[t].x.shape[1], hidden).double() for t in types if "x" in data[t]})
    embs = nn.ModuleDict({t: nn.Embedding(data[t].num_nodes, hidden).double() for t in types if "x" not in data[t]})
    dims = [hidden] * num_layers + [num_classes]  # the inputs bring every type to `hidden` first
    convs = nn.ModuleList(RGCNConv(i, o, len(data.edge_types), num_bases=num_bases or None, aggr="mean").double()
                          for i, o in zip(dims[:-1], dims[1:]))
    theirs = {f"inputs.linears.{t}.{n}": p for t, lin in lins.items() for n, p in lin.named_parameters()}
    theirs |= {f"inputs.shards.{t}": emb.weight for t, emb in embs.items()}
    for k, conv in enumerate(convs):
        names = {"root": "root", "bias": "bias"} | ({"basis": "weight", "comp": "comp"} if num_bases else {"weight": "weight"})
        theirs |= {f"convs.{k}.{ours}": getattr(conv, name) for ours, name in names.items()}
    assert set(theirs) == set(params), (sorted(theirs), sorted(params))
    with torch.no_grad():
        for name, value in params.items():
            theirs[name].copy_(value)
    homogeneous = data.to_homogeneous()

    def forward(last_edges=None, upto=None):
        """last_edges: a bool mask over the homogeneous edges the last layer aggregates (default: all); upto:
        stop after that layer (its ReLU included)."""
        x = torch.cat([lins[t](data[t].x) if t in lins else embs[t].weight for t in types])
        for k, conv in enumerate(convs[:None if upto is None else upto + 1]):
            kept = last_edges if k == len(convs) - 1 and last_edges is not None else slice(None)
            x = conv(x, homogeneous.edge_index[:, kept], homogeneous.edge_type[kept])
            if k < len(convs) - 1:
                x = torch.relu(x)
        return x

    forward.edge_index = homogeneous.edge_index
    forward.modules = lins, embs, convs  # replays of sampled batches run them on the batch's nodes

    offset = sum(int(arrays[f"num_nodes__{t}"]) for t in types[:types.index("paper")])
    return forward, theirs, offset


def gather_params_and_grads(results, arrays):
    """Replicated parameters and gradients from rank 0; each embedding table assembled from every rank's shard."""
    types = [str(t) for t in arrays["node_types"]]
    offsets = np.concatenate([[0], np.cumsum([int(arrays[f"num_nodes__{t}"]) for t in types])])
    params, grads = dict(results[0]["params"]), dict(results[0]["grads"])
    for name in [n for n in params if n.startswith("inputs.shards.")]:
        t = name.split(".")[-1]
        table = torch.zeros(int(arrays[f"num_nodes__{t}"]), params[name].shape[1])
        grad = torch.zeros_like(table)
        for result in results:
            ids = result["shard_ids"][t] - offsets[types.index(t)]
            table[ids] = result["params"][name]
            grad[ids] = result["grads"][name]
        params[name], grads[name] = table, grad
    return params, grads


def one_typed_step(directory: Path, num_parts: int, hidden: int, num_layers: int, num_bases: int = 0,
                   seed: int = 5, training: dict | None = None, inspect=None, **model):
    """One step at P ranks without dropout (R-GCN, or the model `model` names; `training`: more TrainConfig
    fields): every rank's logits, loss, parameters and gradients, its embedding rows' ids and what
    inspect(state) returns after the step."""
    config = TrainConfig(parts=str(directory), epochs=0, progress=False, seed=seed, **(training or {}),
                         model=ModelConfig(**{"model": "rgcn", "hidden": hidden, "num_layers": num_layers,
                                              "dropout": 0.0, "num_bases": num_bases, **model}))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        loss = state.mode.compute_gradients(epoch=0)
        with torch.no_grad():
            logits = state.model()
        inputs = state.model.inputs
        # the logits are the target type's owned rows only (the last layer computes no other)
        return {"ids": state.graph.node_ids[state.model.output_rows], "logits": logits, "loss": loss,
                "params": {n: p.detach().clone() for n, p in state.model.named_parameters()},
                "grads": {n: p.grad.clone() for n, p in state.model.named_parameters()},
                "shard_ids": {t: state.graph.node_ids[inputs.owned_rows[t]].numpy() for t in inputs.shards},
                "owned_ids": state.graph.node_ids, "inspected": inspect(state) if inspect else None}

    return run_fake_ranks(num_parts, rank_fn)


def force_order(monkeypatch, order: str) -> None:
    """Every R-GCN layer aggregates every relation first (order 'aggregate') or transforms every relation's
    sources first ('transform'), instead of choosing per relation by cost ('chosen')."""
    from gnn_dist.models.rgcn import DistRGCNConv

    if order == "chosen":
        return

    def forced(conv):
        # the relations with edges (in the last layer, those into the target type)
        relations = tuple(r for r in range(conv.operator.num_relations) if conv.operator.counts(r)[2]
                          and (conv.output_rows is None or r in conv._output_nodes))
        other = "transform" if order == "aggregate" else "aggregate"
        return {order: relations, other: ()}

    monkeypatch.setattr(DistRGCNConv, "_plan", forced)


@pytest.mark.parametrize("order", ["chosen", "aggregate", "transform"])
@pytest.mark.parametrize("num_parts", [1, 2, 4])
@pytest.mark.parametrize("hidden, num_layers, num_bases", [(16, 2, 0), (8, 3, 2)])
def test_rgcn_logits_loss_and_gradients_equal_pyg_at_any_p(typed_parts, num_parts, hidden, num_layers, num_bases,
                                                           order, monkeypatch):
    force_order(monkeypatch, order)
    results = one_typed_step(typed_parts[num_parts], num_parts, hidden, num_layers, num_bases)
    assert_step_is_pyg_s(results, num_parts, hidden, num_layers, num_bases)


@pytest.mark.parametrize("block_rows", [0, 3])
@pytest.mark.parametrize("num_parts", [1, 2, 4])
@pytest.mark.parametrize("hidden, num_layers, num_bases", [(16, 2, 0), (8, 3, 2)])
def test_rgcn_with_sequential_halos_equals_pyg_at_any_p(typed_parts, num_parts, hidden, num_layers, num_bases,
                                                        block_rows):
    """--halo-memory sequential: every layer's halo, the first's included (its owners' Linear outputs and
    embedding rows), arrives in blocks of at most block_rows rows (0: a peer's whole block), and no layer
    holds an [owned | halo] tensor; the step is PyG's all the same."""
    results = one_typed_step(typed_parts[num_parts], num_parts, hidden, num_layers, num_bases,
                             training={"halo_memory": "sequential", "halo_block_rows": block_rows},
                             inspect=lambda state: {
                                 "halo_inputs": len(state.model.inputs()),
                                 "blocks": [len(conv.blocked.exchanges) for conv in state.model.convs],
                                 "featured_halo": len(state.model.inputs.halo_x)})
    assert_step_is_pyg_s(results, num_parts, hidden, num_layers, num_bases)
    for result in results:
        seen = result["inspected"]
        # the typed inputs are the owned rows alone, no halo features were fetched, and with more than one
        # rank every layer moves its halo in blocks
        assert seen["halo_inputs"] == len(result["owned_ids"]) and seen["featured_halo"] == 0
        assert all(blocks > 0 for blocks in seen["blocks"]) == (num_parts > 1)


@pytest.mark.parametrize("halo_memory", ["resident", "sequential"])
def test_rgcn_products_in_chunks_of_rows_equal_pyg(typed_parts, monkeypatch, halo_memory):
    """A relation's block times its weight, a few rows at a time (as the last layer of a many-class graph
    makes it), adds into the same rows and gives PyG's step."""
    from gnn_dist.models import rgcn

    monkeypatch.setattr(rgcn, "PRODUCT_CHUNK_BYTES", 4 * 16 * 3)  # 3 rows of 16 columns, a row of 4 classes
    force_order(monkeypatch, "aggregate")
    results = one_typed_step(typed_parts[2], 2, 16, 2, training={"halo_memory": halo_memory})
    assert_step_is_pyg_s(results, 2, 16, 2, 0)


@pytest.mark.parametrize("columns", [1, 3, 15, 16, 40])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_product_by_a_weight_in_pyg_layout_is_the_matmul_at_every_width(columns, with_bias):
    """times(): a narrow weight is laid out [out, in] first (the fast BLAS product); values and every gradient
    are torch's own x @ weight + bias, at widths on both sides of the switch."""
    from gnn_dist.models.relational import times

    generator = torch.Generator().manual_seed(columns)
    x = torch.randn(37, 8, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(8, columns, dtype=torch.float64, generator=generator, requires_grad=True)
    bias = torch.randn(columns, dtype=torch.float64, generator=generator, requires_grad=True) if with_bias else None
    upstream = torch.randn(37, columns, dtype=torch.float64, generator=generator)
    ours = times(x, weight, bias)
    ours_grads = torch.autograd.grad(ours, [x, weight] + ([bias] if with_bias else []), upstream)
    theirs = x @ weight + (bias if with_bias else 0)
    theirs_grads = torch.autograd.grad(theirs, [x, weight] + ([bias] if with_bias else []), upstream)
    assert ours.shape == (37, columns)
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-12)
    for mine, reference in zip(ours_grads, theirs_grads, strict=True):
        assert mine.shape == reference.shape and torch.allclose(mine, reference, rtol=1e-12, atol=1e-12)


def assert_step_is_pyg_s(results, num_parts: int, hidden: int, num_layers: int, num_bases: int) -> None:
    """One typed step's logits, loss and gradients at P ranks (one_typed_step's) are the independent PyG model's."""
    arrays = typed_arrays()
    params, grads = gather_params_and_grads(results, arrays)
    forward, theirs, offset = reference_rgcn(arrays, {n: v.double() for n, v in params.items()}, hidden, num_layers,
                                             4, num_bases)
    logits = forward()
    papers = int(arrays["num_nodes__paper"])
    mask = torch.from_numpy(arrays["train_mask"])
    loss = F.cross_entropy(logits[offset:offset + papers][mask], torch.from_numpy(arrays["y"])[mask])
    loss.backward()
    ours = torch.full_like(logits, float("nan"))
    for result in results:
        ours[torch.from_numpy(result["ids"].numpy())] = result["logits"].double()
    # every paper's logits, each from the rank that owns it; no rank returns rows of another type
    assert (ours[offset:offset + papers] - logits.detach()[offset:offset + papers]).abs().max() <= 1e-5
    assert sum(len(result["ids"]) for result in results) == papers
    for result in results:
        assert result["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    for name, grad in grads.items():
        assert (grad.double() - theirs[name].grad).abs().max() <= 1e-5, name
    # each rank's embedding shard holds exactly its owned rows of that type, never a whole table
    for result in results:
        for t, ids in result["shard_ids"].items():
            assert result["params"][f"inputs.shards.{t}"].shape[0] == len(ids) < int(arrays[f"num_nodes__{t}"]) \
                or num_parts == 1


def curves_at_every_p(typed_parts, tmp_path, model: list[str], epochs: int, seed: int, dropouts: tuple) -> dict:
    """{(P, dropout): the loss curve} of `epochs` Adam epochs under mpiexec at P = 1, 2, 4 with every flag of
    `dropouts` at 0.5, then at 0; asserts that every P gives one curve (relative 1e-5) and that the halo bytes
    of the dropout-free runs at P = 2 and 4 are the ones inspect predicts."""
    curves = {}
    for dropout in ("0.5", "0"):
        for p in (1, 2, 4):
            out = tmp_path / f"m{p}-{dropout}.jsonl"
            done = run_mpi(p, "train", "--parts", str(typed_parts[p]), *model, "--epochs", str(epochs), "--seed",
                           str(seed), *(arg for flag in dropouts for arg in (flag, dropout)), "--no-progress",
                           "--metrics-out", str(out))
            assert done.returncode == 0, done.stderr
            curves[p, dropout] = [r["loss"] for r in map(json.loads, out.read_text().splitlines()) if "final" not in r]
        for p in (2, 4):
            for a, b in zip(curves[1, dropout], curves[p, dropout], strict=True):
                assert abs(a - b) <= 1e-5 * abs(a), (p, dropout)
    assert curves[1, "0.5"] != curves[1, "0"]
    for p in (2, 4):  # the bytes inspect predicts are the bytes that travelled
        final = json.loads((tmp_path / f"m{p}-0.jsonl").read_text().splitlines()[-1])
        report = json.loads(run_cli("inspect", str(typed_parts[p]), "--json", *model).stdout)
        assert final["halo_bytes_total"] == epochs * report["predicted_halo_bytes_per_epoch"] > 0
    return curves


@pytest.mark.mpi
def test_rgcn_loss_curve_is_the_same_at_every_rank_count_and_follows_pyg(typed_parts, tmp_path):
    """Adam for 12 epochs with weight decay, dropout on: P = 1, 2, 4 under mpiexec draw the same masks and give one
    curve; with dropout off the curve is PyG's under torch.optim.Adam."""
    curves = curves_at_every_p(typed_parts, tmp_path, ["--model", "rgcn", "--hidden", "16"], 12, 5, ("--dropout",))
    assert_pyg_adam_curve(typed_parts, curves[1, "0"])


@pytest.mark.mpi
def test_rgcn_with_sequential_halos_trains_one_curve_at_every_p_as_pyg(typed_parts, tmp_path):
    """--halo-memory sequential under mpiexec, blocks of at most 5 rows: P = 1, 2, 4 give one curve with dropout
    on (the owners drop the first layer's rows out with the same keyed masks), PyG's under Adam with it off, and
    the halo bytes inspect predicts for sequential halos (the first layer's whole halo every step)."""
    flags = ["--model", "rgcn", "--hidden", "16", "--halo-memory", "sequential", "--halo-block-rows", "5"]
    curves = curves_at_every_p(typed_parts, tmp_path, flags, 8, 5, ("--dropout",))
    assert_pyg_adam_curve(typed_parts, curves[1, "0"])


def assert_pyg_adam_curve(typed_parts, curve: list[float], table_decay: float | None = None) -> None:
    """`curve` (R-GCN hidden 16, 2 layers, no dropout, Adam lr 0.01 and weight decay 5e-4; the embedding tables'
    decay table_decay where given) is PyG's from the run's initial parameters (P=1's set-up, which every P
    shares)."""
    results = one_typed_step(typed_parts[1], 1, 16, 2)
    params, _ = gather_params_and_grads(results, typed_arrays())
    arrays = typed_arrays()
    forward, theirs, offset = reference_rgcn(arrays, {n: v.double() for n, v in params.items()}, 16, 2, 4, 0)
    tables = [v for n, v in theirs.items() if n.startswith("inputs.shards.")]
    assert len(tables) == 1  # the field type's nn.Embedding
    others = [v for n, v in theirs.items() if not n.startswith("inputs.shards.")]
    optimizer = torch.optim.Adam([{"params": others}, {"params": tables, "weight_decay": (
        5e-4 if table_decay is None else table_decay)}], lr=0.01, weight_decay=5e-4)
    papers, mask = int(arrays["num_nodes__paper"]), torch.from_numpy(arrays["train_mask"])
    for epoch, ours in enumerate(curve):
        optimizer.zero_grad()
        loss = F.cross_entropy(forward()[offset:offset + papers][mask], torch.from_numpy(arrays["y"])[mask])
        loss.backward()
        optimizer.step()
        assert abs(float(loss) - ours) <= 1e-5 * abs(ours), epoch


def test_bns_renormalises_each_relations_mean_over_the_sources_it_keeps(typed_parts):
    """bns leaves halo rows out of a hidden layer: each relation's mean of a node is then over that relation's
    sources still present (owned, or halo rows kept this epoch), which is PyG's RGCNConv(aggr='mean') on the
    kept edges alone. Checked at P=4 against PyG on the whole graph, per rank."""
    num_parts, hidden = 4, 8
    config = TrainConfig(parts=str(typed_parts[num_parts]), epochs=0, progress=False, seed=5, schedule="bns:0.4",
                         model=ModelConfig(model="rgcn", hidden=hidden, num_layers=2, dropout=0.0))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        state.model.train()
        state.model.epoch = 3
        exchanger = state.model.exchanger
        exchanger.begin_pass(3, True)
        halo_kept = exchanger.schedule._keep(exchanger)[1].clone()
        with torch.no_grad():
            logits = state.model()
        inputs = state.model.inputs
        return {"ids": state.graph.node_ids, "target_ids": state.graph.node_ids[state.model.output_rows],
                "halo_ids": state.graph.halo_ids, "halo_kept": halo_kept,
                "logits": logits, "params": {n: p.detach().clone() for n, p in state.model.named_parameters()},
                "grads": {n: torch.zeros_like(p) for n, p in state.model.named_parameters()},
                "shard_ids": {t: state.graph.node_ids[inputs.owned_rows[t]].numpy() for t in inputs.shards}}

    results = run_fake_ranks(num_parts, rank_fn)
    arrays = typed_arrays()
    params, _ = gather_params_and_grads(results, arrays)
    forward, _, _ = reference_rgcn(arrays, {n: v.double() for n, v in params.items()}, hidden, 2, 4, 0)
    source, target = forward.edge_index
    renormalised = 0
    for result in results:
        owned = torch.zeros(int(source.max()) + 1, dtype=torch.bool)
        owned[torch.as_tensor(result["ids"])] = True
        present = owned.clone()
        present[torch.as_tensor(result["halo_ids"])[result["halo_kept"]]] = True
        assert not bool(result["halo_kept"].all()) and bool(result["halo_kept"].any())
        kept = present[source] & owned[target]
        with torch.no_grad():
            expected = forward(kept)[torch.as_tensor(result["target_ids"])]
            exact = forward()[torch.as_tensor(result["target_ids"])]
        assert (result["logits"].double() - expected).abs().max() <= 1e-5
        renormalised += int(((expected - exact).abs().max(1).values > 1e-4).sum())
    assert renormalised > 10  # rows that lost sources of some relation, so the rule was exercised


def typed_losses(directory: Path, spec: str, halo_dtype: str = "fp32", epochs: int = 30, **model) -> list[float]:
    from tests.test_schedules import train_losses

    config = TrainConfig(parts=str(directory), schedule=spec, halo_dtype=halo_dtype, schedule_guard="off",
                         progress=False, seed=3, model=ModelConfig(**{"model": "rgcn", "hidden": 16, "num_layers": 3,
                                                                      "dropout": 0.5, **model}))
    return train_losses(directory, spec, epochs, config)


@pytest.mark.parametrize("spec, halo_dtype", [("stale:3", "fp32"), ("pipeline", "fp32"), ("bns:0.5", "fp32"),
                                              ("adaptive:0.05", "fp32"), ("exact", "int8"), ("exact", "fp16")])
def test_schedules_and_halo_dtypes_train_typed_graphs(typed_parts, spec, halo_dtype):
    """Every schedule and halo dtype on R-GCN's hidden layers: the loss falls as exact's does and ends near it."""
    exact = typed_losses(typed_parts[2], "exact")
    losses = typed_losses(typed_parts[2], spec, halo_dtype)
    assert losses[-1] < 0.6 * losses[0]
    assert abs(losses[-1] - exact[-1]) < 0.2 * exact[-1], (losses[-1], exact[-1])
    if spec.startswith("pipeline"):
        assert losses[0] == exact[0]  # epoch 0 has nothing stale to use


@pytest.mark.mpi
def test_typed_bytes_under_a_schedule_and_a_halo_dtype_are_the_predicted_ones(typed_parts, tmp_path):
    """stale:3 with int8 rows on the hidden layers, the embedding rows exact in fp32 every step: the bytes that
    travel over 12 epochs are 12 times what inspect predicts per epoch, and fewer than exact fp32's."""
    out = tmp_path / "m.jsonl"
    done = run_mpi(2, "train", "--parts", str(typed_parts[2]), "--model", "rgcn", "--hidden", "16", "--num-layers",
                   "3", "--epochs", "12", "--schedule", "stale:3", "--halo-dtype", "int8", "--schedule-guard", "off",
                   "--no-progress", "--metrics-out", str(out))
    assert done.returncode == 0, done.stderr
    final = json.loads(out.read_text().splitlines()[-1])
    inspect = ["inspect", str(typed_parts[2]), "--json", "--model", "rgcn", "--hidden", "16", "--num-layers", "3"]
    lossy = json.loads(run_cli(*inspect, "--schedule", "stale:3", "--halo-dtype", "int8").stdout)
    exact = json.loads(run_cli(*inspect).stdout)
    assert final["halo_bytes_total"] == pytest.approx(12 * lossy["predicted_halo_bytes_per_epoch"], rel=1e-9)
    assert lossy["typed"]["embedding_halo_bytes_per_epoch"] > 0
    assert lossy["predicted_halo_bytes_per_epoch"] < 0.5 * exact["predicted_halo_bytes_per_epoch"]


def typed_losses_of(path: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, path.read_text().splitlines()) if "final" not in r]


@pytest.mark.mpi
def test_embedding_weight_decay_decays_the_tables_alone_as_pyg_param_groups(typed_parts, tmp_path):
    """--embedding-weight-decay 1.0 at P=2 (no dropout, 8 epochs) is PyG's Adam with the field table in its own group
    at decay 1.0 and the rest at 5e-4; the curve leaves the default run's (every weight at 5e-4)."""
    common = ["--model", "rgcn", "--hidden", "16", "--epochs", "8", "--dropout", "0", "--seed", "5", "--no-progress"]
    curves = {}
    for name, flags in (("tables", ["--embedding-weight-decay", "1.0"]), ("default", [])):
        out = tmp_path / f"{name}.jsonl"
        done = run_mpi(2, "train", "--parts", str(typed_parts[2]), *common, *flags, "--metrics-out", str(out))
        assert done.returncode == 0, done.stderr
        curves[name] = typed_losses_of(out)
    assert_pyg_adam_curve(typed_parts, curves["tables"], table_decay=1.0)
    assert max(abs(a - b) / abs(b) for a, b in zip(curves["tables"], curves["default"])) > 1e-4


@pytest.mark.mpi
def test_a_typed_run_stopped_at_p2_resumes_at_p4_and_p2_on_the_uninterrupted_curve(typed_parts, tmp_path):
    """A rank fails at epoch 6 of a P=2 run with checkpoints every 4 epochs (Adam, dropout on, 10 epochs). Each rank
    wrote only its own embedding rows and their Adam moments, keyed by (type, id); the resume on the same
    partition reads its own file, the one at P=4 re-shards the rows from both old files. Both continue on the
    uninterrupted run's loss curve."""
    common = ["--model", "rgcn", "--hidden", "16", "--epochs", "10", "--dropout", "0.5", "--seed", "2", "--no-progress"]
    whole = tmp_path / "whole.jsonl"
    assert run_mpi(2, "train", "--parts", str(typed_parts[2]), *common, "--metrics-out", str(whole)).returncode == 0
    ckpt = tmp_path / "ckpt"
    done = run_mpi(2, "train", "--parts", str(typed_parts[2]), *common, "--checkpoint-dir", str(ckpt),
                   "--checkpoint-every", "4", env={"GNN_DIST_FAIL_AT": "1:6"})
    assert done.returncode != 0
    written = ckpt / "epoch-000004"
    arrays = typed_arrays()
    for k in range(2):  # each rank's file holds exactly its owned rows of each featureless type
        shards = torch.load(written / f"rank-{k:05d}.pt", weights_only=True)["shards"]
        part = load_part(typed_parts[2], k)
        owned_type = np.searchsorted(type_offsets(part.meta.hetero), part.node_ids, side="right") - 1
        field = int((owned_type == 2).sum())  # types: paper, author, field
        ids = shards["inputs.shards.field"]["ids"]
        assert len(ids) == shards["inputs.shards.field"]["rows"].shape[0] == field < int(arrays["num_nodes__field"])
        assert shards["inputs.shards.field"]["optimizer"]["exp_avg"].shape == (field, 16)
    replicated = torch.load(written / "replicated.pt", weights_only=True)
    assert not any(name.startswith("inputs.shards.") for name in replicated["model"])
    curve = typed_losses_of(whole)
    # the last: the tables in their own optimiser group at the same decay (--embedding-weight-decay), so the
    # checkpoint's one group of Adam state is renumbered into two, and the curve is unchanged
    for k, (p, tables) in enumerate(((2, []), (4, []), (2, ["--embedding-weight-decay", "5e-4"]))):
        resumed_dir = tmp_path / f"ckpt{k}"
        shutil.copytree(ckpt, resumed_dir)
        resumed = tmp_path / f"resumed{k}.jsonl"
        done = run_mpi(p, "train", "--parts", str(typed_parts[p]), *common, *tables, "--checkpoint-dir",
                       str(resumed_dir), "--resume", "--metrics-out", str(resumed))
        assert done.returncode == 0, done.stderr
        assert json.loads(resumed.read_text().splitlines()[-1])["resumed_from_epoch"] == 4
        for epoch, (a, b) in enumerate(zip(curve, typed_losses_of(resumed), strict=True)):
            assert abs(a - b) <= 1e-5 * abs(a), (p, epoch, a, b)


@pytest.mark.mpi
def test_supervise_heals_a_typed_run_onto_the_uninterrupted_curve(typed_parts, tmp_path):
    """Rank 1 is killed at epoch 5 of the first attempt; supervise restarts the job from its epoch-4 checkpoint
    (each rank's embedding rows from its own file) and every epoch's loss is the uninterrupted run's."""
    from tests.test_supervise import supervise, train_command

    common = ["--model", "rgcn", "--hidden", "16", "--epochs", "8", "--dropout", "0.5", "--no-progress"]
    whole = tmp_path / "whole.jsonl"
    assert run_mpi(2, "train", "--parts", str(typed_parts[2]), *common, "--metrics-out", str(whole)).returncode == 0
    healed = tmp_path / "healed.jsonl"
    command = train_command(2, typed_parts[2], *common, "--checkpoint-dir", str(tmp_path / "ckpt"),
                            "--checkpoint-every", "4", "--metrics-out", str(healed))
    done = supervise("--max-restarts", "1", "--backoff", "0", "--", *command, env={"GNN_DIST_FAIL_AT": "1:5:kill@0"})
    assert done.returncode == 0, done.stderr
    assert "resuming from epoch 4" in done.stderr
    final = json.loads(healed.read_text().splitlines()[-1])
    assert final["restarts"] == 1 and final["resumed_from_epoch"] == 4
    for a, b in zip(typed_losses_of(whole), typed_losses_of(healed), strict=True):
        assert abs(a - b) <= 1e-5 * abs(a)


def _storage_bytes(tensor: torch.Tensor) -> int:
    if tensor.layout == torch.sparse_csr:
        return sum(_storage_bytes(t) for t in (tensor.crow_indices(), tensor.col_indices(), tensor.values()))
    return tensor.untyped_storage().nbytes()


@pytest.mark.parametrize("num_parts, halo_memory", [(1, "resident"), (4, "resident"), (4, "sequential")])
def test_the_typed_plan_counts_the_forms_and_shards_the_layers_build(typed_parts, num_parts, halo_memory):
    """The plan's relation forms and embedding shards against what set-up built (each CSR tensor's storage, each
    shard's rows), and its layer orders against the layers' own choices; each form counted once, whichever
    layers share it. Sequential halos' blocked forms are bounded from above (a block's rows are at most its
    entries), and no halo feature is held."""
    from gnn_dist.plan.options import PlanConfig
    from gnn_dist.plan.typed import _orders, plan_typed_phases, typed_shape

    model = ModelConfig(model="rgcn", hidden=8, num_layers=3, dropout=0.5)
    config = TrainConfig(parts=str(typed_parts[num_parts]), epochs=0, progress=False, model=model,
                         halo_memory=halo_memory, halo_block_rows=4)
    plan_config = PlanConfig(model=model, halo_memory=halo_memory, halo_block_rows=4)

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        operator = state.model.convs[0].operator
        forms = [f for f in operator._stacked.values()] + [f for f, _ in operator._gathered.values()]
        forms += [f for blocked in operator._blocked.values()
                  for f in [blocked.owned] + [block.operator for block in blocked.blocks]]
        built = sum(_storage_bytes(f.matrix) + _storage_bytes(f.transpose) for f in forms)
        built += sum(_storage_bytes(sources) for _, sources in operator._gathered.values())
        built += sum(_storage_bytes(block.rows) for blocked in operator._blocked.values() for block in blocked.blocks)
        built += _storage_bytes(operator.nodes)
        inputs = state.model.inputs
        features = sum(_storage_bytes(x) for x in list(inputs.owned_x.values()) + list(inputs.halo_x.values()))
        shard_rows = sum(p.shape[0] for p in state.model.sharded_parameters())
        orders = [{r: how for how, rs in conv._plan().items() for r in rs} for conv in state.model.convs]
        part = load_part(typed_parts[num_parts], comm.rank)
        return built, features, shard_rows, orders, typed_shape(part.arrays, part.meta), part.meta.num_classes

    for built, features, shard_rows, orders, shape, num_classes in run_fake_ranks(num_parts, rank_fn):
        plan = plan_typed_phases(shape, plan_config, num_classes)["train"]
        if halo_memory == "resident":
            assert plan.parts["relation forms"] == built
        else:  # the bound: every halo entry's row, where a block's rows are fewer (they share rows)
            assert built <= plan.parts["relation forms"] <= built + 12 * sum(shape.halo_entries)
        assert plan.parts["typed input features"] == features
        assert _orders(shape, plan_config, num_classes) == orders
        relations = len(shape.relations)  # writes, cites (made symmetric in place), has, rev_writes, rev_has
        assert relations == 5
        # the Linears of paper (8 features) and author (5); per layer R relation weights, the root and the bias
        replicated = (8 * 8 + 8) + (5 * 8 + 8) + 2 * (relations * 8 * 8 + 8 * 8 + 8) + (relations * 8 * 4 + 8 * 4 + 4)
        assert plan.parts["parameters, Adam"] == replicated * 4 * 5 + shard_rows * 8 * 4 * 4


def refused_then_fitting(common: list, metrics, phase: str | None = None) -> dict:
    """`common` at P=2 under --memory-limit 100M: refused with one error line before anything is written (on
    the plan of `phase`, when given); then under 4G for one epoch: its final record."""
    done = run_mpi(2, *common, "--epochs", "2", "--memory-limit", "100M")
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode != 0 and len(errors) == 1 and "over --memory-limit 0.10 GiB" in errors[0], done.stderr
    assert phase is None or f"at its peak (in {phase}: " in errors[0], errors[0]
    assert not metrics.exists()
    done = run_mpi(2, *common, "--epochs", "1", "--memory-limit", "4G")
    assert done.returncode == 0, done.stderr
    return json.loads(metrics.read_text().splitlines()[-1])


def refused_between_the_plans(common: list, tmp_path, setup_peaks: list, planned: list) -> None:
    """A sampled job's plans: set-up's (no batch) below the whole plan (sized by a batch) on every rank; under a
    --memory-limit between the two the job passes set-up's check, then is refused in one line before epoch 1,
    with no metrics written."""
    assert planned is not None and len(planned) == 2 and max(setup_peaks) < min(planned)
    between = tmp_path / "between.jsonl"
    done = run_mpi(2, *common, "--metrics-out", str(between), "--epochs", "1", "--memory-limit",
                   str((max(setup_peaks) + min(planned)) // 2))
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode != 0 and len(errors) == 1 and "over --memory-limit" in errors[0], done.stderr
    assert "at its peak (in setup: " not in errors[0], errors[0]
    assert not between.exists()


@pytest.mark.mpi
def test_train_refuses_a_typed_job_over_its_memory_limit_and_records_the_plan(typed_parts, tmp_path):
    from gnn_dist.partition.format import load_meta, part_file_name
    from gnn_dist.plan.options import PlanConfig
    from gnn_dist.plan.typed import plan_typed, typed_shape

    metrics = tmp_path / "m.jsonl"
    common = ["train", "--parts", str(typed_parts[2]), "--model", "rgcn", "--hidden", "16", "--no-progress",
              "--metrics-out", str(metrics)]
    final = refused_then_fitting(common, metrics)
    meta = load_meta(typed_parts[2])
    planned = []
    for k in range(2):
        with np.load(typed_parts[2] / part_file_name(k)) as archive:
            shape = typed_shape({name: archive[name] for name in archive.files}, meta)
        planned.append(plan_typed(shape, PlanConfig(model=ModelConfig(model="rgcn", hidden=16)), 4).peak)
    assert final["planned_peak_rss_bytes_per_rank"] == planned
    report = json.loads(run_cli("inspect", str(typed_parts[2]), "--json", "--model", "rgcn", "--hidden", "16").stdout)
    assert report["memory_plan"]["predicted_peak_rss_bytes_per_rank"] == planned
    # the only featureless type's rows, per rank: the nodes each owns, every node once, no rank all of them
    shards = report["memory_plan"]["embedding_shard_rows_per_rank"]
    assert list(shards) == ["field"] and sum(shards["field"]) == 10 and max(shards["field"]) < 10


def test_inspect_plans_rgcn_on_a_typed_partition_unless_told_and_refuses_a_homogeneous_model(typed_parts):
    report = json.loads(run_cli("inspect", str(typed_parts[2]), "--json").stdout)
    assert report["model"]["model"] == "rgcn"
    refused = run_cli("inspect", str(typed_parts[2]), "--model", "gcn")
    assert refused.returncode != 0 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "train it with --model rgat or rgcn" in refused.stderr


@pytest.mark.parametrize("flags, message", [
    (["--model", "gcn"], "train it with --model rgat or rgcn"),
    (["--model", "rgat", "--halo-memory", "sequential"], "--halo-memory resident"),
    (["--model", "rgcn", "--halo-memory", "sequential", "--schedule", "stale:2"], "--schedule exact"),
    (["--model", "rgcn", "--predictions-out", "preds.npz"], "no --predictions-out"),
    (["--model", "rgcn", "--task", "link"], "--task link"),
    (["--model", "rgcn", "--mode", "sampled", "--embedding-weight-decay", "0.1"], "SparseAdam's rule"),
])
def test_what_typed_training_lacks_is_refused_in_one_line(typed_parts, flags, message):
    done = run_mpi(2, "train", "--parts", str(typed_parts[2]), "--epochs", "1", "--no-progress", *flags)
    assert done.returncode != 0 and message in done.stderr
    assert len([line for line in done.stderr.splitlines() if "error" in line]) == 1, done.stderr


def test_rgcn_on_a_homogeneous_partition_is_refused(partitioned):
    done = run_mpi(2, "train", "--parts", str(partitioned("synthetic:tiny", 2)), "--model", "rgcn", "--epochs", "1")
    assert done.returncode != 0 and "partition a typed graph" in done.stderr


def test_embedding_weight_decay_without_tables_is_refused(partitioned):
    done = run_mpi(2, "train", "--parts", str(partitioned("synthetic:tiny", 2)), "--embedding-weight-decay", "0",
                   "--epochs", "1", "--no-progress")
    assert done.returncode != 0 and "no embedding tables: drop the option" in done.stderr
    assert len([line for line in done.stderr.splitlines() if "error" in line]) == 1, done.stderr


def test_the_real_typed_graphs_load_and_match_their_readme():
    if not (SHARED_DATA / "hetero" / "acm.npz").is_file():
        pytest.skip(f"{SHARED_DATA / 'hetero'} is absent (../shared/data)")
    acm = load_dataset(f"hetero:{SHARED_DATA / 'hetero' / 'acm.npz'}")
    assert acm.num_nodes == {"paper": 4019, "author": 7167, "subject": 60} and set(acm.x) == {"paper", "author"}
    assert (acm.train_mask.sum(), acm.val_mask.sum(), acm.test_mask.sum()) == (180, 1000, 1000)
    freebase = load_dataset(f"hetero:{SHARED_DATA / 'hetero' / 'freebase.npz'}")
    assert not freebase.x and freebase.num_nodes["actor"] == 33401
