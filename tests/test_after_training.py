"""After training: `gnn-dist embed` and `gnn-dist export` against PyG on the whole graph, TensorBoard's event
file against the metrics, and per-rank traces with their named spans."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from gnn_dist.partition.datasets import load_dataset
from tests.conftest import run_cli, run_mpi, train_many

MODELS = {"gcn": "--batch-norm", "sage": "--batch-norm", "gat": "--heads 2"}


@pytest.fixture(scope="module")
def trained(partitioned, tmp_path_factory):
    """Each model trained 3 epochs at P=4 with checkpoints; the final records by model."""
    root = tmp_path_factory.mktemp("trained")
    parts = partitioned("synthetic:tiny", 4)
    runs = [f"--model {model} {extra} --checkpoint-dir {root / model}" for model, extra in MODELS.items()]
    records = train_many(4, ["--parts", str(parts), "--epochs", "3", "--hidden", "8", "--num-layers", "3"], runs)
    return root, {model: records[run] for model, run in zip(MODELS, runs)}


def pyg_outputs(module, graph, layer: int) -> torch.Tensor:
    """The exported Sequential on the whole graph in float64, up to and including the output of `layer` (its
    convs counted from 0; -1 the last)."""
    from torch_geometric.nn.conv import MessagePassing

    x, edges = torch.from_numpy(graph.x).double(), torch.from_numpy(graph.edge_index)
    children = list(module.double().eval().children())
    convs = [k for k, child in enumerate(children) if isinstance(child, MessagePassing)]
    stop = len(children) if layer in (-1, len(convs) - 1) else convs[layer + 1] - 1  # before the next Dropout
    with torch.no_grad():
        for child in children[:stop]:
            x = child(x, edges) if isinstance(child, MessagePassing) else child(x)
    return x


@pytest.mark.mpi
@pytest.mark.parametrize("model", list(MODELS))
def test_embed_at_two_ranks_from_a_four_rank_checkpoint_equals_pyg_with_the_exported_weights(
        trained, partitioned, tmp_path, model):
    from gnn_dist.export import load_pyg

    root, _ = trained
    exported = run_cli("export", "--checkpoint-dir", str(root / model), "--out", str(tmp_path / "model.pt"))
    assert exported.returncode == 0, exported.stderr
    module = load_pyg(tmp_path / "model.pt")
    graph = load_dataset("synthetic:tiny")
    for layer in (-1, -2):
        out = tmp_path / f"emb{layer}.npy"
        done = run_mpi(2, "embed", "--parts", str(partitioned("synthetic:tiny", 2)), "--checkpoint-dir",
                       str(root / model), "--out", str(out), "--layer", str(layer))
        assert done.returncode == 0, done.stderr
        rows = torch.from_numpy(np.load(out, allow_pickle=False)).double()
        reference = pyg_outputs(module, graph, layer)
        assert rows.shape == reference.shape
        assert (rows - reference).abs().max() <= 1e-5, (model, layer)


@pytest.mark.mpi
def test_the_exported_model_loads_with_torch_and_pyg_alone_and_scores_as_the_run(trained, partitioned, tmp_path):
    """In a fresh process that imports only torch and torch_geometric (docs/export.md's lines): the same logits
    as embed and the same test accuracy as the run's final record."""
    root, finals = trained
    assert run_cli("export", "--checkpoint-dir", str(root / "gcn"), "--out", str(tmp_path / "m.pt")).returncode == 0
    embedded = tmp_path / "logits.npy"
    assert run_mpi(2, "embed", "--parts", str(partitioned("synthetic:tiny", 2)), "--checkpoint-dir",
                   str(root / "gcn"), "--out", str(embedded)).returncode == 0
    graph = load_dataset("synthetic:tiny")
    np.savez(tmp_path / "graph.npz", x=graph.x, edge_index=graph.edge_index)
    code = f"""
import importlib, json, sys, numpy as np, torch, torch_geometric.nn as pyg
spec = json.load(open({str(tmp_path / "m.json")!r}))
make = lambda l: getattr(importlib.import_module(l["module"].rpartition(".")[0]), l["module"].rpartition(".")[2])
model = pyg.Sequential(spec["input"], [(make(l)(**l["kwargs"]), l["call"]) for l in spec["layers"]]).eval()
model.load_state_dict(torch.load({str(tmp_path / "m.pt")!r}, weights_only=True))
g = np.load({str(tmp_path / "graph.npz")!r})
with torch.no_grad():
    np.save({str(tmp_path / "pyg.npy")!r}, model(torch.from_numpy(g["x"]), torch.from_numpy(g["edge_index"])).numpy())
assert not any(name.startswith("gnn_dist") for name in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    logits = np.load(tmp_path / "pyg.npy")
    assert np.abs(logits - np.load(embedded)).max() <= 1e-5
    test_acc = (logits.argmax(1) == graph.y)[graph.test_mask].mean()
    assert test_acc == pytest.approx(finals["gcn"]["test_acc"], abs=1e-9)


@pytest.mark.mpi
def test_embed_chunks_do_not_change_the_file_and_stay_under_the_plan(trained, partitioned, tmp_path):
    from gnn_dist.partition.format import load_meta, part_shapes
    from gnn_dist.plan.memory import PlanConfig, plan_phases

    root, _ = trained
    parts = partitioned("synthetic:tiny", 2)
    files = []
    for chunk in (1, 10**6):
        out = tmp_path / f"chunk{chunk}.npy"
        done = run_mpi(2, "embed", "--parts", str(parts), "--checkpoint-dir", str(root / "sage"), "--out", str(out),
                       "--eval-chunk-nodes", str(chunk))
        assert done.returncode == 0, done.stderr
        files.append(np.load(out))
        peaks = [float(v) for v in done.stdout.split("peak RSS per rank ")[1].split(" GiB")[0].split(", ")]
    # the same rows; a 1-row chunk's products round apart from a whole matrix's (BLAS picks other kernels)
    assert np.abs(files[0] - files[1]).max() <= 1e-6
    from gnn_dist.config import ModelConfig

    meta = load_meta(parts)
    model = ModelConfig(model="sage", hidden=8, num_layers=3, batch_norm=True)
    planned = [plan_phases(shape, PlanConfig(model=model), meta.num_features, meta.num_classes)["eval"].peak
               for shape in part_shapes(parts)]
    for peak, plan in zip(peaks, planned):
        assert peak * 2**30 <= 1.15 * plan


@pytest.mark.mpi
def test_an_interrupted_embed_leaves_nothing_at_out(trained, partitioned, tmp_path):
    root, _ = trained
    out = tmp_path / "emb.npy"
    done = run_mpi(2, "embed", "--parts", str(partitioned("synthetic:tiny", 2)), "--checkpoint-dir", str(root / "gcn"),
                   "--out", str(out), env={"GNN_DIST_FAIL_AT": "1:0:kill"})
    assert done.returncode != 0
    assert not out.exists()


def test_embed_refuses_a_layer_the_model_does_not_have(trained, partitioned, tmp_path):
    root, _ = trained
    done = run_cli("embed", "--parts", str(partitioned("synthetic:tiny", 1)), "--checkpoint-dir", str(root / "gcn"),
                   "--out", str(tmp_path / "e.npy"), "--layer", "3")
    assert done.returncode == 3 and done.stderr.count("\n") == 1 and "--layer 3: the model has 3 layers" in done.stderr


def test_export_refuses_a_model_without_a_pyg_layer_built_from_plain_arguments(partitioned, tmp_path):
    """GIN's PyG layer wraps an MLP module, which a JSON spec cannot name: one line, and nothing written."""
    parts = partitioned("synthetic:tiny", 1)
    plugin = str(tmp_path.parent / "gin_plugin.py")
    from pathlib import Path

    Path(plugin).write_text((Path(__file__).parent / "plugins" / "gin.py").read_text())
    trained = run_cli("train", "--plugin", plugin, "--parts", str(parts), "--model", "gin", "--epochs", "1",
                      "--no-progress", "--checkpoint-dir", str(tmp_path / "ck"))
    assert trained.returncode == 0, trained.stderr
    done = run_cli("export", "--plugin", plugin, "--checkpoint-dir", str(tmp_path / "ck"), "--out",
                   str(tmp_path / "m.pt"))
    assert done.returncode == 1 and "--model gin has no PyG layer" in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.mpi
def test_tensorboard_holds_the_metrics_losses_and_traces_are_per_rank_with_named_spans(partitioned, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics, board, traces = tmp_path / "m.jsonl", tmp_path / "tb", tmp_path / "traces"
    done = run_mpi(2, "train", "--parts", str(partitioned("synthetic:tiny", 2)), "--epochs", "4", "--no-progress",
                   "--num-layers", "3", "--metrics-out", str(metrics), "--tensorboard", str(board),
                   "--profile", str(traces), "--profile-epochs", "1:3")
    assert done.returncode == 0, done.stderr
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()[:-1]]
    events = EventAccumulator(str(board))
    events.Reload()
    logged = [event.value for event in events.Scalars("loss/loss")]
    assert logged == pytest.approx(losses, rel=1e-6) and len(logged) == 4
    for rank in (0, 1):
        trace = json.loads((traces / f"trace-rank-{rank:05d}.json").read_text())
        names = {event.get("name") for event in trace["traceEvents"]}
        assert {"halo exchange", "spmm", "dense", "allreduce", "optimizer step"} <= names, names


def test_tensorboard_without_its_package_is_refused_with_the_install_line(partitioned, tmp_path, monkeypatch):
    from gnn_dist.metrics import MetricsWriter

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ValueError, match=r"--tensorboard needs the tensorboard package: pip install"):
        MetricsWriter(None, tensorboard=str(tmp_path / "tb"))
