"""Unmodified PyG models through gd.distribute, on simulated ranks, against the same model in plain PyG on the
whole graph (symmetrised, no self loops: what the partitioner keeps) in one process.

Every comparison is float64 at rel 1e-9: the logits of every node (by original id), the loss and every
parameter's gradient after one backward. Dropout is checked against plain PyG whose F.dropout is replaced by
the same keyed mask function (gnn_dist.pyg.dropout.keep_mask_for), and across P over Adam epochs.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gnn_dist as gd
from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.context import RankContext
from gnn_dist.pyg import dropout as keyed

pytest.importorskip("torch_geometric")
from torch_geometric import nn as pyg  # noqa: E402
from torch_geometric.nn import models as pyg_models  # noqa: E402

HIDDEN = 8


class TwoLayers(nn.Module):
    """conv(in -> hidden), relu, conv(hidden -> out): one layer class under test, twice."""

    def __init__(self, make, in_channels, out_channels):
        super().__init__()
        self.first = make(in_channels, HIDDEN)
        self.second = make(HIDDEN, out_channels)

    def forward(self, x, edge_index):
        return self.second(self.first(x, edge_index).relu(), edge_index)


class GCNII(nn.Module):
    """PyG's GCN2Conv example: a linear input, GCN2Conv layers with the initial rows x_0, a linear output."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.lin_in = nn.Linear(in_channels, HIDDEN)
        self.convs = nn.ModuleList(pyg.GCN2Conv(HIDDEN, alpha=0.1, theta=0.5, layer=k + 1) for k in range(2))
        self.lin_out = nn.Linear(HIDDEN, out_channels)

    def forward(self, x, edge_index):
        x = x0 = self.lin_in(x).relu()
        for conv in self.convs:
            x = conv(x, x0, edge_index).relu()
        return self.lin_out(x)


class Propagated(nn.Module):
    """An MLP whose output a parameter-free propagation spreads (APPNP, SGConv-style)."""

    def __init__(self, propagation, in_channels, out_channels):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels)
        self.propagation = propagation

    def forward(self, x, edge_index):
        return self.propagation(self.lin(x), edge_index)


class InputNormed(nn.Module):
    """torch's BatchNorm1d on the input features, then PyG's GCN (whose input then travels: it is not data.x)."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.norm = nn.BatchNorm1d(in_channels)
        self.gcn = pyg_models.GCN(in_channels, HIDDEN, 2, out_channels)

    def forward(self, x, edge_index):
        return self.gcn(self.norm(x), edge_index)


def _models(num_features: int, num_classes: int, histogram=None) -> dict:
    f, c = num_features, num_classes
    return {
        "GCN": lambda: pyg_models.GCN(f, HIDDEN, 3, c),
        "GraphSAGE": lambda: pyg_models.GraphSAGE(f, HIDDEN, 2, c),
        "GIN": lambda: pyg_models.GIN(f, HIDDEN, 2, c),
        "GIN batch norm": lambda: pyg_models.GIN(f, HIDDEN, 3, c, norm="batch_norm"),
        "GCN BatchNorm1d": lambda: InputNormed(f, c),
        "GAT": lambda: pyg_models.GAT(f, HIDDEN, 2, c, heads=2),
        "GATv2": lambda: pyg_models.GAT(f, HIDDEN, 2, c, heads=2, v2=True),
        "EdgeCNN": lambda: pyg_models.EdgeCNN(f, HIDDEN, 2, c),
        "SAGE max": lambda: TwoLayers(lambda i, o: pyg.SAGEConv(i, o, aggr="max"), f, c),
        "SAGE sum": lambda: TwoLayers(lambda i, o: pyg.SAGEConv(i, o, aggr="sum"), f, c),
        "GraphConv": lambda: TwoLayers(pyg.GraphConv, f, c),
        "GATConv": lambda: TwoLayers(lambda i, o: pyg.GATConv(i, o, heads=2, concat=False), f, c),
        "TransformerConv": lambda: TwoLayers(lambda i, o: pyg.TransformerConv(i, o, heads=2, concat=False), f, c),
        "ResGatedGraphConv": lambda: TwoLayers(pyg.ResGatedGraphConv, f, c),
        "GCN improved": lambda: TwoLayers(lambda i, o: pyg.GCNConv(i, o, improved=True), f, c),
        "TAGConv": lambda: TwoLayers(lambda i, o: pyg.TAGConv(i, o, K=2), f, c),
        "SGConv": lambda: pyg.SGConv(f, c, K=2),
        "APPNP": lambda: Propagated(pyg.APPNP(K=3, alpha=0.1), f, c),
        "GCN2Conv": lambda: GCNII(f, c),
        "PNA": lambda: pyg_models.PNA(f, HIDDEN, 2, c, aggregators=["mean", "max", "std"],
                                      scalers=["identity", "amplification"], deg=histogram),
    }


@pytest.fixture(scope="module")
def graph(tiny_graph):
    return tiny_graph


def _whole_graph(graph):
    x = torch.from_numpy(graph.x).double()
    edge_index = torch.from_numpy(graph.edge_index)
    return x, edge_index, torch.from_numpy(graph.y), torch.from_numpy(graph.train_mask)


def _reference(model, graph):
    """Logits, loss and gradients of the plain model on the whole graph (one process)."""
    x, edge_index, y, mask = _whole_graph(graph)
    model = copy.deepcopy(model)
    out = model(x, edge_index)
    loss = F.cross_entropy(out[mask], y[mask])
    loss.backward()
    return out.detach(), loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _distributed(model, parts, num_parts: int, **options):
    """[(n_id, logits, loss, gradients)] per rank of the wrapped model after one forward and backward."""
    copies = [copy.deepcopy(model) for _ in range(num_parts)]

    def rank(comm):
        torch.set_num_threads(1)
        data = gd.load_partition(parts, RankContext(comm), dtype=torch.float64)
        wrapped = gd.distribute(copies[comm.rank], data, **options)
        out = wrapped(data.x, data.edge_index)
        loss = gd.cross_entropy(out, data.y, data.train_mask)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in wrapped.module.named_parameters()}
        return data.n_id, out.detach(), loss.item(), grads, wrapped.paths()

    return run_fake_ranks(num_parts, rank)


def _assert_equal_to_reference(results, reference, num_nodes):
    logits, loss, grads = reference
    ours = torch.full_like(logits, float("nan"))
    for n_id, out, rank_loss, rank_grads, *_ in results:
        ours[n_id] = out
        assert rank_loss == pytest.approx(loss, rel=1e-9)
        assert set(rank_grads) == set(grads)
        for name, grad in grads.items():
            torch.testing.assert_close(rank_grads[name], grad, rtol=1e-9, atol=1e-12, msg=name)
    torch.testing.assert_close(ours, logits, rtol=1e-9, atol=1e-12)


def _histogram(graph):
    degrees = np.bincount(graph.edge_index[1], minlength=graph.x.shape[0])
    return torch.from_numpy(np.bincount(degrees)).long()


# the models whose every layer aggregates linearly (the native SpMM takes them all)
ALL_NATIVE = {"GCN", "GraphSAGE", "GIN", "GIN batch norm", "GCN BatchNorm1d", "SAGE sum", "GraphConv",
              "GCN improved", "TAGConv", "SGConv", "APPNP", "GCN2Conv"}


@pytest.mark.parametrize("native", [True, False], ids=["native path", "pyg path"])
@pytest.mark.parametrize("name", list(_models(1, 1)))
def test_an_unmodified_pyg_model_equals_the_whole_graph_at_any_p(name, native, graph, partitioned):
    torch.manual_seed(0)
    model = _models(graph.x.shape[1], graph.num_classes, _histogram(graph))[name]().double()
    reference = _reference(model, graph)
    for num_parts in (1, 2, 4):
        results = _distributed(model, partitioned("synthetic:tiny", num_parts), num_parts, native=native)
        _assert_equal_to_reference(results, reference, graph.x.shape[0])
    paths = set(results[0][4].values())
    if native and name in {"GAT", "GATConv"}:
        assert paths == {"native gat"}
    elif native and name in ALL_NATIVE:
        assert paths <= {"native spmm", "native gcn"}
        assert ("native gcn" in paths) == (name in {"GCN", "GCN BatchNorm1d", "GCN improved"})
    elif native:
        assert "pyg" in paths
    else:
        assert paths == {"pyg"}


def test_lazy_widths_take_rank_0s_values_before_the_first_step(graph, partitioned):
    torch.manual_seed(0)
    model = TwoLayers(lambda i, o: pyg.SAGEConv(-1, o) if i == graph.x.shape[1] else pyg.SAGEConv(i, o),
                      graph.x.shape[1], graph.num_classes).double()
    copies = [copy.deepcopy(model) for _ in range(2)]

    def rank(comm):
        data = gd.load_partition(partitioned("synthetic:tiny", 2), RankContext(comm), dtype=torch.float64)
        wrapped = gd.distribute(copies[comm.rank], data)
        out = wrapped(data.x, data.edge_index)  # the first forward materialises, broadcasts, then runs
        loss = gd.cross_entropy(out, data.y, data.train_mask)
        loss.backward()
        state = {n: p.detach().clone() for n, p in wrapped.module.named_parameters()}
        grads = {n: p.grad.clone() for n, p in wrapped.module.named_parameters()}
        return data.n_id, out.detach(), loss.item(), grads, state

    results = run_fake_ranks(2, rank)
    state = results[0][4]
    for name, value in state.items():  # both ranks hold rank 0's lazy values
        assert torch.equal(results[1][4][name], value), name
    reference = copy.deepcopy(model)
    with torch.no_grad():
        reference(*_whole_graph(graph)[:2])  # widths only; the values are the ranks' own
    reference.load_state_dict(state)
    _assert_equal_to_reference([r[:4] for r in results], _reference(reference, graph), graph.x.shape[0])


def test_the_degree_histogram_is_the_whole_graphs(graph, partitioned):
    def rank(comm):
        return gd.degree_histogram(gd.load_partition(partitioned("synthetic:tiny", 4), RankContext(comm)))

    for histogram in run_fake_ranks(4, rank):
        assert torch.equal(histogram, _histogram(graph))


class Dropped(nn.Module):
    """Input dropout (nn.Dropout), GAT's attention dropout, F.dropout between layers: every kind of dropout."""

    def __init__(self, in_channels, out_channels, scale: float = 1.0):
        super().__init__()
        self.input_dropout = nn.Dropout(0.3 * scale)
        self.first = pyg.GATConv(in_channels, HIDDEN, heads=2, dropout=0.4 * scale)
        self.second = pyg.GCNConv(2 * HIDDEN, out_channels)
        self.p = 0.5 * scale

    def forward(self, x, edge_index):
        x = self.first(self.input_dropout(x), edge_index).relu()
        return self.second(F.dropout(x, self.p, self.training), edge_index)


class _KeyedReference:
    """Plain PyG's F.dropout replaced by the keyed mask on the whole graph: node rows keyed by their ids
    (original order), per-edge tensors inside message passing by their edges' (source, target) ids."""

    def __init__(self, model, seed: int):
        self.seed, self.step, self.calls, self.edges = seed, 0, 0, None
        for module in model.modules():
            if isinstance(module, pyg.MessagePassing):
                module.register_propagate_forward_pre_hook(self._enter)
                module.register_edge_update_forward_pre_hook(self._enter)
                module.register_propagate_forward_hook(self._leave)
                module.register_edge_update_forward_hook(self._leave)

    def _enter(self, module, inputs):
        self.edges = inputs[0]

    def _leave(self, module, inputs, output):
        self.edges = None

    def dropout(self, x, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return x
        key = keyed.dropout_key(self.seed, self.step, self.calls)
        self.calls += 1
        flat = x.reshape(x.shape[0], -1)
        if self.edges is not None and x.shape[0] == self.edges.shape[1]:
            ids = torch.arange(int(self.edges.max()) + 1)
            mask = keyed.edge_dropout(ids, ids, flat.shape[1], key, p)
            return (flat * keyed.edge_factors(mask, self.edges, x.dtype)).reshape(x.shape)
        rows = keyed.row_hashes(torch.arange(x.shape[0]), key)
        keep = keyed.keep_mask_for(rows, flat.shape[1], p)
        return (flat * keep.to(x.dtype) / (1.0 - p)).reshape(x.shape)


def _train(model, parts, num_parts: int, epochs: int, dtype=torch.float64, **options):
    """Adam epochs of the wrapped model: each rank's losses and the final parameters."""
    copies = [copy.deepcopy(model) for _ in range(num_parts)]

    def rank(comm):
        torch.set_num_threads(1)
        data = gd.load_partition(parts, RankContext(comm), dtype=dtype)
        wrapped = gd.distribute(copies[comm.rank], data, **options)
        opt = torch.optim.Adam(wrapped.parameters(), lr=0.01)
        losses = []
        for _ in range(epochs):
            wrapped.train()
            opt.zero_grad()
            loss = gd.cross_entropy(wrapped(data.x, data.edge_index), data.y, data.train_mask)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, wrapped.state_dict()

    return run_fake_ranks(num_parts, rank)


def test_dropout_at_p1_equals_plain_pyg_under_the_keyed_mask(graph, partitioned, monkeypatch):
    torch.manual_seed(0)
    model = Dropped(graph.x.shape[1], graph.num_classes).double()
    seed = torch.initial_seed() % (1 << 31)
    x, edge_index, y, mask = _whole_graph(graph)
    reference = copy.deepcopy(model)
    keyed_reference = _KeyedReference(reference, seed)
    with monkeypatch.context() as patch:
        patch.setattr(F, "dropout", keyed_reference.dropout)
        out = reference(x, edge_index)
    loss = F.cross_entropy(out[mask], y[mask])
    loss.backward()
    grads = {n: p.grad.clone() for n, p in reference.named_parameters()}
    [(n_id, logits, rank_loss, rank_grads, paths)] = _distributed(model, partitioned("synthetic:tiny", 1), 1)
    assert paths == {"first": "native gat", "second": "native gcn"}  # the native kernels drew the keyed masks
    assert rank_loss == pytest.approx(loss.item(), rel=1e-9)
    torch.testing.assert_close(logits[torch.argsort(n_id)], out.detach(), rtol=1e-9, atol=1e-12)
    for name, grad in grads.items():
        torch.testing.assert_close(rank_grads[name], grad, rtol=1e-9, atol=1e-12)


def test_dropout_draws_the_same_curve_at_any_p(graph, partitioned):
    torch.manual_seed(0)
    model = Dropped(graph.x.shape[1], graph.num_classes).double()
    curves = {}
    for num_parts in (1, 2, 4):
        runs = _train(model, partitioned("synthetic:tiny", num_parts), num_parts, epochs=20)
        for losses, state in runs:
            assert losses == runs[0][0]  # every rank reports the global loss
            for name, value in state.items():  # and holds the same parameters, bit for bit
                assert torch.equal(value, runs[0][1][name]), name
        curves[num_parts] = runs[0]
    for num_parts in (2, 4):
        np.testing.assert_allclose(curves[num_parts][0], curves[1][0], rtol=1e-5)
        for name, value in curves[1][1].items():
            torch.testing.assert_close(curves[num_parts][1][name], value, rtol=1e-5, atol=1e-7)
    undropped = Dropped(graph.x.shape[1], graph.num_classes, scale=0.0).double()
    undropped.load_state_dict(model.state_dict())
    without = _train(undropped, partitioned("synthetic:tiny", 1), 1, epochs=2)[0][0]
    assert abs(without[1] - curves[1][0][1]) > 1e-6  # dropout changed the curve


def test_a_resume_at_another_p_continues_the_curve(graph, partitioned, tmp_path):
    torch.manual_seed(0)
    model = Dropped(graph.x.shape[1], graph.num_classes).double()
    whole = _train(model, partitioned("synthetic:tiny", 1), 1, epochs=6)[0][0]
    path = tmp_path / "model.pt"
    copies = [copy.deepcopy(model) for _ in range(4)]

    def run(num_parts: int, epochs: int, resume: bool):
        def rank(comm):
            data = gd.load_partition(partitioned("synthetic:tiny", num_parts), RankContext(comm),
                                     dtype=torch.float64)
            wrapped = gd.distribute(copies[comm.rank], data)
            opt = torch.optim.Adam(wrapped.parameters(), lr=0.01)
            if resume:
                gd.load(path, wrapped, opt)
            losses = []
            for _ in range(epochs):
                opt.zero_grad()
                loss = gd.cross_entropy(wrapped(data.x, data.edge_index), data.y, data.train_mask)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            gd.save(path, wrapped, opt)
            return losses

        return run_fake_ranks(num_parts, rank)[0]

    first = run(2, 3, resume=False)
    second = run(4, 3, resume=True)
    np.testing.assert_allclose(first + second, whole, rtol=1e-6)


def test_gradients_accumulated_over_two_backwards_are_summed_once(graph, partitioned):
    torch.manual_seed(0)
    model = pyg_models.GCN(graph.x.shape[1], HIDDEN, 2, graph.num_classes).double()
    x, edge_index, y, mask = _whole_graph(graph)
    reference = copy.deepcopy(model)
    for _ in range(2):
        out = reference(x, edge_index)
        F.cross_entropy(out[mask], y[mask]).backward()
    copies = [copy.deepcopy(model) for _ in range(2)]

    def rank(comm):
        data = gd.load_partition(partitioned("synthetic:tiny", 2), RankContext(comm), dtype=torch.float64)
        wrapped = gd.distribute(copies[comm.rank], data)
        for _ in range(2):
            gd.cross_entropy(wrapped(data.x, data.edge_index), data.y, data.train_mask).backward()
        return {n: p.grad for n, p in wrapped.module.named_parameters()}

    for grads in run_fake_ranks(2, rank):
        for name, param in reference.named_parameters():
            torch.testing.assert_close(grads[name], param.grad, rtol=1e-9, atol=1e-12)


def test_the_first_layer_reads_cached_rows_and_later_layers_send_what_they_aggregate(graph, partitioned):
    """A wrapped GCNConv model sends, per step, each hidden layer's transformed owned boundary rows once
    forward and their gradients once backward: the plan's rows times the layer's output width."""
    torch.manual_seed(0)
    model = TwoLayers(pyg.GCNConv, graph.x.shape[1], graph.num_classes)
    copies = [copy.deepcopy(model) for _ in range(2)]

    def rank(comm):
        data = gd.load_partition(partitioned("synthetic:tiny", 2), RankContext(comm))
        wrapped = gd.distribute(copies[comm.rank], data)
        counters = wrapped.graph.exchanger.counters
        counters.reset()
        gd.cross_entropy(wrapped(data.x, data.edge_index), data.y, data.train_mask).backward()
        plan = wrapped.graph.plan
        return counters.halo_bytes, plan.rows_sent_to_peers, plan.n_halo

    for sent, rows_out, rows_in in run_fake_ranks(2, rank):
        # forward: the second layer's transformed rows (the first sends nothing); backward: the halo rows'
        # gradients (rows_in of them); the degrees of gcn_norm travel once, at the first forward
        assert sent == 4 * graph.num_classes * (rows_out + rows_in) + 4 * rows_out


def _refused(model_factory, parts, num_parts=2, call=None, **options):
    copies = [model_factory() for _ in range(num_parts)]

    def rank(comm):
        data = gd.load_partition(parts, RankContext(comm))
        try:
            wrapped = gd.distribute(copies[comm.rank], data, **options)
            if call is not None:
                call(wrapped, data)
        except ValueError as err:
            return str(err)
        return None

    return run_fake_ranks(num_parts, rank)


@pytest.mark.parametrize("case, expected", [
    ("graph norm", "GraphNorm"),
    ("batch norm without statistics", "track_running_stats=True"),
    ("target to source", "flow='target_to_source'"),
    ("lstm aggregation", "LSTMAggregation"),
    ("in_channels", "in_channels=5 but the partition has"),
    ("bns schedule", "--schedule bns:0.5"),
    ("twice", "already distributed"),
    ("mask length", "a mask of 3 entries"),
])
def test_bad_input_gets_one_line_on_every_rank(case, expected, graph, partitioned):
    f, c = graph.x.shape[1], graph.num_classes
    factories = {
        "graph norm": lambda: nn.Sequential(pyg.GraphNorm(f)),
        "batch norm without statistics": lambda: nn.Sequential(nn.BatchNorm1d(f, track_running_stats=False)),
        "target to source": lambda: pyg.SAGEConv(f, c, flow="target_to_source"),
        "lstm aggregation": lambda: pyg.SAGEConv(f, c, aggr="lstm"),
        "in_channels": lambda: pyg.GCNConv(5, c),
    }
    options, call = {}, None
    if case == "bns schedule":
        options = {"schedule": "bns:0.5"}
    if case == "twice":
        def call(wrapped, data):
            gd.distribute(wrapped, data)
    if case == "mask length":
        def call(wrapped, data):
            gd.cross_entropy(wrapped(data.x, data.edge_index), data.y, data.train_mask[:3])
    messages = _refused(factories.get(case, lambda: pyg.GCNConv(f, c)), partitioned("synthetic:tiny", 2),
                        call=call, **options)
    assert all(m is not None and expected in m and "\n" not in m for m in messages), messages


def test_batch_norm_running_statistics_are_the_whole_graphs(graph, partitioned):
    torch.manual_seed(0)
    model = InputNormed(graph.x.shape[1], graph.num_classes).double()
    reference = copy.deepcopy(model)
    reference(*_whole_graph(graph)[:2])
    copies = [copy.deepcopy(model) for _ in range(4)]

    def rank(comm):
        data = gd.load_partition(partitioned("synthetic:tiny", 4), RankContext(comm), dtype=torch.float64)
        wrapped = gd.distribute(copies[comm.rank], data)
        wrapped(data.x, data.edge_index)
        wrapped.eval()
        with torch.no_grad():  # evaluation normalises by the running statistics, as torch's
            return data.n_id, wrapped(data.x, data.edge_index), dict(wrapped.module.norm.named_buffers())

    reference.eval()
    with torch.no_grad():
        expected = reference(*_whole_graph(graph)[:2])
    for n_id, out, buffers in run_fake_ranks(4, rank):
        for name, value in reference.norm.named_buffers():
            torch.testing.assert_close(buffers[name], value, rtol=1e-9, atol=1e-12, msg=name)
        torch.testing.assert_close(out, expected[n_id], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("schedule, halo_dtype", [("stale:2", None), ("pipeline", None), ("exact", "bf16")])
def test_a_wrapped_gcn_under_a_schedule_equals_model_gcn(schedule, halo_dtype, graph, partitioned, tmp_path):
    """PyG's GCNConv twice, wrapped, against gnn-dist train --model gcn with the same initial weights: the same
    rows travel under the same schedule and wire format (the hidden layer is wider than the classes, so both
    transform first), and the loss curves agree."""
    import json

    from gnn_dist.config import ModelConfig, TrainConfig
    from gnn_dist.models import model_class
    from gnn_dist.training import train

    parts, hidden, epochs = partitioned("synthetic:tiny", 2), 16, 6
    model = TwoLayers(pyg.GCNConv, graph.x.shape[1], graph.num_classes)
    model.first, model.second = pyg.GCNConv(graph.x.shape[1], hidden), pyg.GCNConv(hidden, graph.num_classes)
    generator = torch.Generator().manual_seed(0)  # --model gcn's initial weights: its layers reset in order
    for conv, (i, o) in zip((model.first, model.second), ((graph.x.shape[1], hidden), (hidden, graph.num_classes))):
        builtin = model_class("gcn")(i, o, None, None, "initial weights")
        builtin.reset_parameters(generator)
        with torch.no_grad():
            conv.lin.weight.copy_(builtin.weight)
            conv.bias.copy_(builtin.bias)
    metrics = tmp_path / "builtin.jsonl"
    config = TrainConfig(parts=str(parts), model=ModelConfig(model="gcn", hidden=hidden, num_layers=2, dropout=0.0),
                         epochs=epochs, weight_decay=0.0, schedule=schedule, schedule_guard="off", seed=0,
                         progress=False, eval_every=epochs, metrics_out=str(metrics), halo_dtype=halo_dtype or "fp32")
    run_fake_ranks(2, lambda comm: train(RankContext(comm), config))
    builtin_losses = [r["loss"] for r in map(json.loads, metrics.read_text().splitlines()) if "loss" in r]
    wrapped_losses = _train(model, parts, 2, epochs, dtype=torch.float32, schedule=schedule,
                            halo_dtype=halo_dtype)[0][0]
    assert len(builtin_losses) == epochs
    np.testing.assert_allclose(wrapped_losses, builtin_losses, rtol=1e-5)
    exact = _train(model, parts, 2, epochs, dtype=torch.float32)[0][0]
    assert np.abs(np.array(exact) - np.array(wrapped_losses)).max() > 1e-6  # the schedule made a difference


@pytest.fixture(scope="module")
def weighted_graph(tiny_graph, tmp_path_factory):
    """synthetic:tiny's edges, each stored once with a weight and 3 attributes, as a user's npz; the whole graph
    (both directions, each with its edge's values) built here, apart from the loader's symmetrising."""
    rng = np.random.default_rng(0)
    edges = tiny_graph.edge_index[:, tiny_graph.edge_index[0] < tiny_graph.edge_index[1]]
    weight = rng.uniform(0.5, 2.0, edges.shape[1]).astype(np.float32)
    attr = rng.normal(size=(edges.shape[1], 3)).astype(np.float32)
    path = tmp_path_factory.mktemp("weighted") / "graph.npz"
    np.savez(path, edge_index=edges, edge_weight=weight, edge_attr=attr, x=tiny_graph.x, y=tiny_graph.y,
             train_mask=tiny_graph.train_mask, val_mask=tiny_graph.val_mask, test_mask=tiny_graph.test_mask)
    whole = (np.concatenate([edges, edges[::-1]], 1), np.concatenate([weight, weight]), np.concatenate([attr, attr]))
    return path, whole


class EdgeModel(nn.Module):
    """GCNConv with the edge weights, GINEConv and TransformerConv with the edge attributes."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.gcn = pyg.GCNConv(in_channels, HIDDEN)
        self.gine = pyg.GINEConv(nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU()), edge_dim=3)
        self.transformer = pyg.TransformerConv(HIDDEN, out_channels, heads=2, concat=False, edge_dim=3)

    def forward(self, x, edge_index, edge_weight, edge_attr):
        x = self.gcn(x, edge_index, edge_weight).relu()
        x = self.gine(x, edge_index, edge_attr).relu()
        return self.transformer(x, edge_index, edge_attr)


@pytest.mark.parametrize("native", [True, False], ids=["native path", "pyg path"])
def test_edge_weights_and_attributes_reach_the_layers_as_on_the_whole_graph(native, tiny_graph, weighted_graph,
                                                                            tmp_path):
    from gnn_dist.partition.datasets import load_dataset
    from gnn_dist.partition.partitioner import partition_graph

    path, (edges, weight, attr) = weighted_graph
    torch.manual_seed(0)
    model = EdgeModel(tiny_graph.x.shape[1], tiny_graph.num_classes).double()
    reference = copy.deepcopy(model)
    x, _, y, mask = _whole_graph(tiny_graph)
    out = reference(x, torch.from_numpy(edges), torch.from_numpy(weight).double(), torch.from_numpy(attr).double())
    loss = F.cross_entropy(out[mask], y[mask])
    loss.backward()
    for num_parts in (1, 2, 4):
        parts = tmp_path / f"p{num_parts}"
        partition_graph(load_dataset(f"npz:{path}"), num_parts, parts)
        copies = [copy.deepcopy(model) for _ in range(num_parts)]

        def rank(comm, parts=parts, copies=copies):
            data = gd.load_partition(parts, RankContext(comm), dtype=torch.float64)
            wrapped = gd.distribute(copies[comm.rank], data, native=native)
            logits = wrapped(data.x, data.edge_index, data.edge_weight.double(), data.edge_attr.double())
            rank_loss = gd.cross_entropy(logits, data.y, data.train_mask)
            rank_loss.backward()
            return data.n_id, logits.detach(), rank_loss.item(), \
                {n: p.grad.clone() for n, p in wrapped.module.named_parameters()}

        reference_grads = {n: p.grad for n, p in reference.named_parameters()}
        _assert_equal_to_reference(run_fake_ranks(num_parts, rank), (out.detach(), loss.item(), reference_grads),
                                   tiny_graph.x.shape[0])


def test_an_edge_given_twice_with_different_values_is_refused(tiny_graph, tmp_path):
    from gnn_dist.partition.datasets import load_dataset
    from gnn_dist.partition.graph import DatasetError

    edges = np.array([[0, 1, 1], [1, 2, 0]])  # 0-1 twice (once reversed), with weights 1 and 2
    path = tmp_path / "twice.npz"
    np.savez(path, edge_index=edges, edge_weight=np.array([1.0, 3.0, 2.0], dtype=np.float32), x=tiny_graph.x[:3],
             y=tiny_graph.y[:3])
    with pytest.raises(DatasetError, match="more than once with different edge_weight values"):
        load_dataset(f"npz:{path}")
