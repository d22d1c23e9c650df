"""`gnn-dist train --model MODULE_OR_FILE:NAME`: a PyG model the command line builds, trains and checkpoints.

The reference is the same model in plain PyG on the whole graph in one process, built after the same
torch.manual_seed and trained by the same Adam: the command line's loss curve, at P=2, must be that one's.
"""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import run_cli, run_mpi

pytest.importorskip("torch_geometric")
from torch_geometric.nn import models as pyg_models  # noqa: E402

GIN = "torch_geometric.nn.models:GIN"

# A model of the user's own in a file: no num_layers keyword (the command line leaves it out), and dropout
NET = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import SAGEConv


    class Net(torch.nn.Module):
        def __init__(self, in_channels, hidden_channels, out_channels, dropout):
            super().__init__()
            self.dropout = dropout
            self.first = SAGEConv(in_channels, hidden_channels)
            self.second = SAGEConv(hidden_channels, out_channels)

        def forward(self, x, edge_index):
            x = F.dropout(x, self.dropout, self.training)
            x = self.first(x, edge_index).relu()
            x = F.dropout(x, self.dropout, self.training)
            return self.second(x, edge_index)
''')


def _records(path) -> tuple[list[dict], dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if not r.get("final")], lines[-1]


def _train(n: int, parts, *options: str):
    done = run_mpi(n, "train", "--parts", str(parts), "--no-progress", *options, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def test_pyg_gin_trains_at_p2_on_the_curve_of_one_process(partitioned, tiny_graph, tmp_path):
    epochs, hidden = 6, 16
    metrics = tmp_path / "m.jsonl"
    _train(2, partitioned("synthetic:tiny", 2), "--model", GIN, "--hidden", str(hidden), "--epochs", str(epochs),
           "--dropout", "0", "--seed", "3", "--metrics-out", str(metrics))
    records, final = _records(metrics)

    g = tiny_graph
    x, edge_index, y = torch.from_numpy(g.x), torch.from_numpy(g.edge_index), torch.from_numpy(g.y)
    torch.manual_seed(3)
    model = pyg_models.GIN(g.x.shape[1], hidden, 2, int(g.y.max()) + 1, dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    train = torch.from_numpy(g.train_mask)
    losses = []
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x, edge_index)[train], y[train])
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        predicted = model(x, edge_index).argmax(1)
    test = torch.from_numpy(g.test_mask)

    np.testing.assert_allclose([r["loss"] for r in records], losses, rtol=1e-4)
    assert final["test_acc"] == pytest.approx((predicted[test] == y[test]).double().mean().item(), abs=1e-9)
    assert final["model"] == GIN and final["num_parts"] == 2 and final["halo_bytes_total"] > 0
    assert set(final["paths"]) == {"convs.0", "convs.1"}


def test_a_model_from_a_file_resumes_at_another_p_on_the_same_curve_and_exports(partitioned, tiny_graph,
                                                                                 tmp_path):
    source = tmp_path / "my_net.py"
    source.write_text(NET)
    model = ["--model", f"{source}:Net", "--hidden", "16", "--dropout", "0.5"]
    one, two = partitioned("synthetic:tiny", 1), partitioned("synthetic:tiny", 2)
    straight, resumed, checkpoints = tmp_path / "straight.jsonl", tmp_path / "resumed.jsonl", tmp_path / "ck"
    _train(1, one, *model, "--epochs", "8", "--metrics-out", str(straight))
    _train(2, two, *model, "--epochs", "4", "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "2")
    done = _train(1, one, *model, "--epochs", "8", "--checkpoint-dir", str(checkpoints), "--resume",
                  "--metrics-out", str(resumed))
    assert "resuming at epoch 4" in done.stderr
    expected, _ = _records(straight)
    got, final = _records(resumed)
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in expected], rtol=1e-5)
    assert final["resumed_from_epoch"] == 4 and final["epochs_run"] == 4
    assert final["paths"] == {"first": "native spmm", "second": "native spmm"}

    out = tmp_path / "export" / "model.pt"
    exported = run_cli("export", "--checkpoint-dir", str(checkpoints), "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    from gnn_dist.export import load_pyg

    g = tiny_graph
    with torch.no_grad():
        predicted = load_pyg(out)(torch.from_numpy(g.x), torch.from_numpy(g.edge_index)).argmax(1)
    test, y = torch.from_numpy(g.test_mask), torch.from_numpy(g.y)
    assert final["test_acc"] == pytest.approx((predicted[test] == y[test]).double().mean().item(), abs=1e-9)


def test_supervise_heals_a_killed_run_onto_the_uninterrupted_curve(partitioned, tmp_path):
    """Rank 1 is killed at epoch 3 of the first attempt; supervise restarts the job from its epoch-2 checkpoint
    and every epoch's loss is the uninterrupted run's."""
    from tests.test_supervise import supervise, train_command

    parts = partitioned("synthetic:tiny", 2)
    common = ["--model", GIN, "--hidden", "16", "--epochs", "6", "--dropout", "0.5", "--no-progress"]
    whole, healed = tmp_path / "whole.jsonl", tmp_path / "healed.jsonl"
    _train(2, parts, *common, "--metrics-out", str(whole))
    command = train_command(2, parts, *common, "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "2",
                            "--metrics-out", str(healed))
    done = supervise("--max-restarts", "1", "--backoff", "0", "--", *command, env={"GNN_DIST_FAIL_AT": "1:3:kill@0"})
    assert done.returncode == 0, done.stderr
    assert "resuming from epoch 2" in done.stderr
    expected, _ = _records(whole)
    got, final = _records(healed)
    assert final["restarts"] == 1 and final["resumed_from_epoch"] == 2
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in expected], rtol=1e-5)


def test_sampled_training_follows_the_loader_loop_a_user_writes(partitioned, tmp_path):
    """--mode sampled --model: one process's loss curve is the one a script over gd.NeighborLoader draws (the
    same seeds, neighbours and weights); at P=2 it resumes from its checkpoint at P=1."""
    import gnn_dist as gd
    from gnn_dist.comm.simulated_ranks import run_fake_ranks
    from gnn_dist.context import RankContext

    sage, fanouts = "torch_geometric.nn.models:GraphSAGE", [4, 3]
    common = ["--mode", "sampled", "--model", sage, "--hidden", "16", "--fanouts", "4,3", "--batch-size", "48",
              "--dropout", "0", "--seed", "5", "--lr", "0.01"]
    one, two = partitioned("synthetic:tiny", 1), partitioned("synthetic:tiny", 2)
    metrics = tmp_path / "m.jsonl"
    _train(1, one, *common, "--epochs", "3", "--metrics-out", str(metrics))
    records, final = _records(metrics)
    assert final["mode"] == "sampled" and final["halo_bytes_total"] == 0  # one rank fetches nothing

    def script(comm):
        data = gd.load_partition(one, RankContext(comm))
        torch.manual_seed(5)
        model = gd.distribute(pyg_models.GraphSAGE(data.num_features, 16, 2, data.num_classes, dropout=0.0))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
        loader = gd.NeighborLoader(data, fanouts, input_nodes=data.train_mask, batch_size=48, shuffle=True, seed=5)
        curve = []
        for _ in range(3):
            losses = []
            for batch in loader:
                optimizer.zero_grad()
                out = model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                            num_sampled_edges_per_hop=batch.num_sampled_edges)[:batch.batch_size]
                loss = gd.cross_entropy(out, batch.y[:batch.batch_size])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            curve.append(sum(losses) / len(losses))
        return curve

    (expected,) = run_fake_ranks(1, script)
    np.testing.assert_allclose([r["loss"] for r in records], expected, rtol=1e-5)

    checkpoints = tmp_path / "ck"
    _train(2, two, *common, "--epochs", "2", "--checkpoint-dir", str(checkpoints), "--metrics-out",
           str(tmp_path / "two.jsonl"))
    assert _records(tmp_path / "two.jsonl")[1]["halo_bytes_total"] > 0  # rows fetched from the other rank
    done = _train(1, one, *common, "--epochs", "3", "--checkpoint-dir", str(checkpoints), "--resume")
    assert "resuming at epoch 2" in done.stderr


@pytest.mark.parametrize("options, says", [
    (["--model", "no_such_module:Net"], "cannot import no_such_module"),
    (["--model", "torch_geometric.nn.models:Nope"], "has no class or function Nope"),
    (["--model", GIN, "--model-kwargs", "{bad"], "--model-kwargs is not JSON"),
    (["--model", GIN, "--heads", "2"], "--heads shapes the built-in models"),
    (["--model", GIN, "--mode", "sampled", "--sampling", "local"], "--sampling local and --feature-cache-mb apply"),
    (["--model", GIN, "--halo-memory", "sequential"], "--halo-memory sequential needs the built-in models'"),
    (["--model", GIN, "--memory-limit", "1G"], "--memory-limit is checked against gnn-dist's memory plan"),
    (["--model", GIN, "--model-kwargs", '{"in_channels": 7}'], "takes in_channels=7 but the partition has 16"),
    (["--model", GIN, "--schedule", "bns:0.5"], "gd.distribute supports exact, stale, pipeline"),
    (["--model", "gcn", "--model-kwargs", "{}"], "--model-kwargs is for --model MODULE_OR_FILE:NAME"),
])
def test_what_cannot_apply_is_refused_in_one_line(options, says, partitioned):
    done = run_cli("train", "--parts", str(partitioned("synthetic:tiny", 1)), "--epochs", "1", "--no-progress",
                   *options)
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr


def test_every_rank_refuses_a_missing_module_and_the_job_ends(partitioned):
    done = run_mpi(2, "train", "--parts", str(partitioned("synthetic:tiny", 2)), "--model", "no_such_module:Net",
                   "--epochs", "1", "--no-progress", timeout=120)
    assert done.returncode == 3
    assert done.stderr.count("cannot import no_such_module") == 1, done.stderr


def test_embed_and_inspect_say_they_do_not_run_a_model_of_your_own(partitioned, tmp_path):
    parts = partitioned("synthetic:tiny", 1)
    checkpoints = tmp_path / "ck"
    assert run_cli("train", "--parts", str(parts), "--model", GIN, "--epochs", "1", "--no-progress",
                   "--checkpoint-dir", str(checkpoints)).returncode == 0
    embedded = run_cli("embed", "--parts", str(parts), "--checkpoint-dir", str(checkpoints), "--out",
                       str(tmp_path / "e.npy"))
    assert embedded.returncode != 0 and "which gnn-dist embed cannot run" in embedded.stderr
    inspected = run_cli("inspect", str(parts), "--model", GIN)
    assert inspected.returncode != 0 and "inspect predicts the built-in models' bytes" in inspected.stderr
