"""`gnn-dist export` of typed models (R-GCN, R-GAT): the exported modules load and run with torch and PyG alone
on a HeteroData (docs/export.md's lines), score as the run that trained them, and give the logits of an
independent PyG model built from the checkpoint's own files (replicated weights, each rank's embedding rows)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import run_cli, run_mpi
from tests.test_hetero import pyg_typed_data, reference_rgcn, typed_arrays, typed_npz, typed_parts
from tests.test_rgat import reference_rgat

__all__ = ["typed_npz", "typed_parts"]  # module fixtures shared with tests/test_hetero.py

RUNS = {"rgcn": ["--model", "rgcn", "--num-bases", "2"], "rgat": ["--model", "rgat", "--heads", "2"]}

ROOT = Path(__file__).resolve().parents[1]


def documented_recipe() -> str:
    """docs/export.md's lines for a typed model (its section's Python block), as a user would copy them."""
    text = (ROOT / "docs" / "export.md").read_text()
    section = text[text.index("### A typed graph's model"):]
    return section[section.index("```python\n") + len("```python\n"):section.index("\n```", section.index("```python"))]


# the graph as a user would build it, then the recipe's logits, in a process that imports no gnn_dist
RUN_IT = """
from torch_geometric.data import HeteroData
from torch_geometric.transforms import ToUndirected
import sys
arrays = np.load(GRAPH)
data = HeteroData()
for t in spec["node_types"]:
    data[t].num_nodes = int(arrays[f"num_nodes__{t}"])
    if f"x__{t}" in arrays.files:
        data[t].x = torch.from_numpy(arrays[f"x__{t}"])
for key in arrays.files:
    if key.startswith("edge_index__"):
        data[tuple(key.split("__")[1:])].edge_index = torch.from_numpy(arrays[key].astype(np.int64))
if spec["reverse_relations"]:
    data = ToUndirected()(data)
with torch.no_grad():
    np.save(OUT, logits(data).numpy())
assert not any(name.startswith("gnn_dist") for name in sys.modules)
"""


@pytest.fixture(scope="module")
def trained_typed(typed_parts, tmp_path_factory):
    """R-GCN (2 bases) and R-GAT (2 heads), 6 epochs at P=2 with checkpoints; their final records."""
    root = tmp_path_factory.mktemp("typed-trained")
    finals = {}
    for name, flags in RUNS.items():
        metrics = root / f"{name}.jsonl"
        done = run_mpi(2, "train", "--parts", str(typed_parts[2]), *flags, "--hidden", "8", "--epochs", "6",
                       "--seed", "3", "--no-progress", "--checkpoint-dir", str(root / name), "--metrics-out",
                       str(metrics))
        assert done.returncode == 0, done.stderr
        finals[name] = json.loads(metrics.read_text().splitlines()[-1])
    return root, finals


def checkpoint_params(directory: Path) -> dict:
    """The model's parameters read from the newest checkpoint's files themselves: the replicated weights, and
    each embedding table put together from every rank's rows by their type-local ids."""
    newest = sorted(p for p in directory.glob("epoch-*") if (p / "MANIFEST.json").is_file())[-1]
    params = dict(torch.load(newest / "replicated.pt", weights_only=True)["model"])
    arrays = typed_arrays()
    for rank_file in sorted(newest.glob("rank-*.pt")):
        for name, held in torch.load(rank_file, weights_only=True)["shards"].items():
            t = name.rsplit(".", 1)[1]
            table = params.setdefault(name, torch.full((int(arrays[f"num_nodes__{t}"]), held["rows"].shape[1]),
                                                       float("nan")))
            table[held["ids"]] = held["rows"]
    return params


@pytest.mark.mpi
@pytest.mark.parametrize("model", sorted(RUNS))
def test_a_typed_model_exports_to_pyg_and_scores_as_the_run(trained_typed, typed_npz, model, tmp_path):
    root, finals = trained_typed
    done = run_cli("export", "--checkpoint-dir", str(root / model), "--out", str(tmp_path / "m.pt"))
    assert done.returncode == 0, done.stderr
    recipe = documented_recipe().replace('"model.json"', repr(str(tmp_path / "m.json"))).replace(
        '"model.pt"', repr(str(tmp_path / "m.pt")))
    code = f"OUT = {str(tmp_path / 'logits.npy')!r}\nGRAPH = {str(typed_npz)!r}\n{recipe}\n{RUN_IT}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    logits = torch.from_numpy(np.load(tmp_path / "logits.npy")).double()
    arrays = typed_arrays()
    # gnn-dist's own loader and forward give the documented lines' logits
    from gnn_dist.export.typed import forward, load_pyg_typed

    module, spec = load_pyg_typed(tmp_path / "m.pt")
    with torch.no_grad():
        assert (forward(module.double(), spec, pyg_typed_data(arrays)) - logits).abs().max() <= 1e-5
    y, test = arrays["y"], arrays["test_mask"]
    assert (logits.argmax(1).numpy() == y)[test].mean() == pytest.approx(finals[model]["test_acc"], abs=1e-9)
    # the checkpoint's own files through an independent PyG model (float64)
    params = {name: value.double() for name, value in checkpoint_params(root / model).items()}
    assert not any(bool(value.isnan().any()) for value in params.values())  # every row came from some rank
    if model == "rgcn":
        forward, _, offset = reference_rgcn(arrays, params, 8, 2, 4, 2)
        with torch.no_grad():
            theirs = forward()[offset:offset + len(y)]
    else:
        forward, _, _ = reference_rgat(arrays, params, 8, 2, 2, 4)
        with torch.no_grad():
            theirs = forward()
    assert (logits - theirs).abs().max() <= 1e-5


def test_export_refuses_a_typed_checkpoint_written_before_typed_export(trained_typed, tmp_path):
    """A checkpoint whose manifest lacks the graph's types (written by an older gnn-dist) is refused in one line."""
    import shutil

    root, _ = trained_typed
    old = tmp_path / "old"
    shutil.copytree(root / "rgcn", old)
    for manifest in old.glob("epoch-*/MANIFEST.json"):
        fields = json.loads(manifest.read_text())
        del fields["hetero"]
        manifest.write_text(json.dumps(fields))
    done = run_cli("export", "--checkpoint-dir", str(old), "--out", str(tmp_path / "m.pt"))
    assert done.returncode != 0 and "train one epoch" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.mpi
@pytest.mark.parametrize("model", sorted(RUNS))
def test_a_typed_model_embeds_at_another_p_as_pyg_computes_it(trained_typed, typed_parts, model, tmp_path):
    """embed at P=4 from the P=2 checkpoint: the last layer's file is the papers' logits by type-local id, the
    first layer's every node's rows by homogeneous id, each equal to an independent PyG model built from the
    checkpoint's own files (float64, 1e-5)."""
    root, _ = trained_typed
    params = {name: value.double() for name, value in checkpoint_params(root / model).items()}
    arrays = typed_arrays()
    if model == "rgcn":
        forward, _, offset = reference_rgcn(arrays, params, 8, 2, 4, 2)
        papers = int(arrays["num_nodes__paper"])
        references = {-1: lambda: forward()[offset:offset + papers], 0: lambda: forward(upto=0)}
    else:
        forward, _, _ = reference_rgat(arrays, params, 8, 2, 2, 4)
        references = {-1: forward, 0: lambda: forward(upto=0)}
    for layer, reference in references.items():
        out = tmp_path / f"layer{layer}.npy"
        done = run_mpi(4, "embed", "--parts", str(typed_parts[4]), "--checkpoint-dir", str(root / model), "--out",
                       str(out), "--layer", str(layer), "--eval-chunk-nodes", "7")
        assert done.returncode == 0, done.stderr
        with torch.no_grad():
            theirs = reference()
        ours = torch.from_numpy(np.load(out)).double()
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max() <= 1e-5, layer
