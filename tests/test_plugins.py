"""The extension contract, proved: a model (GIN), a schedule and a dataset, each one file under tests/plugins/,
reach every part of gnn-dist through --plugin with no edit anywhere else: the command line's help and errors,
inspect's bytes, the memory plan, the partitioner's memory check, training under mpiexec, and equality with PyG."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gnn_dist.config import ModelConfig, TrainConfig
from gnn_dist.partition.format import load_meta, load_part, part_shapes
from gnn_dist.plan.memory import PlanConfig, plan_phases
from tests.conftest import run_cli, run_mpi

PLUGINS = Path(__file__).resolve().parent / "plugins"
GIN, EVERY_OTHER, GRID = (str(PLUGINS / name) for name in ("gin.py", "every_other.py", "grid.py"))


@pytest.fixture(scope="module")
def grid_parts(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid") / "p2"
    done = run_cli("partition", "--plugin", GRID, "--dataset", "test-grid:20", "--num-parts", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


def test_the_command_line_offers_what_the_plugins_register(tmp_path):
    helped = run_cli("train", "--plugin", GIN, "--help")
    choices = helped.stdout.split("--model {", 1)[1].split("}", 1)[0].split(",")
    assert helped.returncode == 0 and "gin" in choices and "gcn" in choices
    refused = run_cli("train", "--plugin", EVERY_OTHER, "--parts", "unused", "--schedule", "every-other:3")
    assert refused.returncode == 3 and "every-other" in refused.stderr.split("valid forms:")[1]
    unknown = run_cli("partition", "--plugin", GRID, "--dataset", "test-grid", "--num-parts", "2", "--out",
                      str(tmp_path / "x"))
    assert unknown.returncode == 1 and "test-grid:N" in unknown.stderr


def test_the_partitioner_checks_a_plugin_dataset_before_loading_it(tmp_path):
    """The dataset's sizes hook gives the memory check its figures without loading: 400 nodes, 760 edges."""
    done = run_cli("partition", "--plugin", GRID, "--dataset", "test-grid:20", "--num-parts", "2", "--out",
                   str(tmp_path / "p"), "--memory-limit", "1K")
    assert done.returncode == 1 and "partitioning 400 nodes and 760 input edges by metis" in done.stderr
    assert not (tmp_path / "p").exists()


def test_inspect_prices_a_plugin_model_and_schedule(grid_parts):
    """GIN aggregates first at every width, so its second layer sends its 8-wide input, not its 4-wide output;
    every-other sends on half the epochs: bytes = 2 directions x halo rows x 8 x 4 bytes / 2."""
    done = run_cli("inspect", str(grid_parts), "--plugin", GIN, "--plugin", EVERY_OTHER, "--model", "gin",
                   "--hidden", "8", "--num-layers", "2", "--schedule", "every-other", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    halo_rows = sum(load_part(grid_parts, k).n_halo for k in range(2))
    assert report["exchanged_widths"] == [0, 8]
    assert report["predicted_halo_bytes_per_epoch"] == 2 * halo_rows * 8 * 4 / 2


def test_the_memory_plan_charges_what_a_plugin_model_keeps(grid_parts, gin_in_this_process):
    meta = load_meta(grid_parts)
    shape = part_shapes(grid_parts)[0]
    model = ModelConfig(model="gin", hidden=8, num_layers=2, dropout=0.0)
    train = plan_phases(shape, PlanConfig(model=model, schedule="exact"), meta.num_features, meta.num_classes)["train"]
    # at the peak (the backward's start) both layers still hold the MLP's hidden rows: n x width x 4 bytes each
    assert train.parts["saved update 0"] == shape.owned * 8 * 4
    assert train.parts["saved update 1"] == shape.owned * meta.num_classes * 4


@pytest.mark.parametrize("num_parts", [1, 2, 4])
def test_the_plugin_model_equals_pyg_gin_on_the_whole_graph(partitioned, num_parts, gin_in_this_process):
    from gnn_dist.partition.datasets import load_dataset
    from tests.test_halo_fake import assert_equal_to_pyg, one_step_on_every_rank

    config = TrainConfig(parts=str(partitioned("synthetic:tiny", num_parts)), epochs=0, progress=False, seed=2,
                         model=ModelConfig(model="gin", hidden=16, num_layers=3, dropout=0.0))
    assert_equal_to_pyg(one_step_on_every_rank(config, num_parts), config, load_dataset("synthetic:tiny"))


@pytest.mark.mpi
def test_the_plugins_train_under_mpiexec(grid_parts, tmp_path):
    """The three together: the grid partitioned through its plugin, GIN trained on it with every-other, sending
    exactly the bytes inspect predicted, in resident and in sequential halo mode alike."""
    finals = {}
    for halo_memory in ("resident", "sequential"):
        metrics = tmp_path / f"{halo_memory}.jsonl"
        done = run_mpi(2, "train", "--plugin", GIN, "--plugin", EVERY_OTHER, "--parts", str(grid_parts),
                       "--model", "gin", "--hidden", "8", "--num-layers", "2", "--schedule", "every-other",
                       "--halo-memory", halo_memory, "--epochs", "4", "--no-progress", "--metrics-out", str(metrics))
        assert done.returncode == 0, done.stderr
        finals[halo_memory] = json.loads(metrics.read_text().splitlines()[-1])
    halo_rows = sum(load_part(grid_parts, k).n_halo for k in range(2))
    for final in finals.values():
        assert (final["model"], final["schedule"]) == ("gin", "every-other")
        assert final["halo_bytes_total"] == 4 * (2 * halo_rows * 8 * 4) / 2  # 4 epochs, half of them exchange
    assert finals["sequential"]["test_acc"] == pytest.approx(finals["resident"]["test_acc"], abs=1e-9)
