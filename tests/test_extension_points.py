"""The extension points as a user meets them: a model and a schedule added from outside the project, config
defaults that live in one place, and an install that claims only the gnn_dist namespace."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from gnn_dist import ModelConfig, SampledConfig, TrainConfig, register_model, register_schedule
from gnn_dist.cli import build_parser
from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import train_config_from_args
from gnn_dist.context import RankContext
from gnn_dist.kernels.spmm import SparseOperator
from gnn_dist.models.base import DistConv, glorot_
from gnn_dist.partition.datasets import load_dataset
from gnn_dist.plan.memory import PlanConfig
from gnn_dist.schedules import Schedule
from gnn_dist.steps.evaluation import gather_logits
from gnn_dist.training import setup, train

ROOT = Path(__file__).resolve().parents[1]


@register_model
class SumConv(DistConv):
    """A model no project file knows: out = ((A + I) X) W^T + b, the plain sum over a node and its neighbours."""

    name = "test-sum"
    self_loops = True

    def __init__(self, in_dim, out_dim, operator, exchanger, slot, blocked=None):
        super().__init__(in_dim, out_dim, operator, exchanger, slot, blocked)
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim))
        self.bias = nn.Parameter(torch.zeros(out_dim))

    def reset_parameters(self, generator=None):
        glorot_(self.weight, generator)

    def transform(self, h):
        return h if self.aggregate_first else h @ self.weight.t()

    @property
    def aggregation_bias(self):
        return None if self.aggregate_first else self.bias

    def update(self, aggregated, root):
        return aggregated @ self.weight.t() + self.bias if self.aggregate_first else aggregated

    @staticmethod
    def normalise(rows, cols, deg, start, n_rows):
        rows = np.concatenate([rows, np.arange(n_rows, dtype=np.int64)])
        cols = np.concatenate([cols, np.arange(start, start + n_rows, dtype=np.int64)])
        return rows, cols, np.ones(rows.shape[0])

    @staticmethod
    def block_operator(block, with_transpose: bool = True):
        loops = torch.arange(block.n_dst, dtype=torch.int64)
        rows, cols = torch.cat([block.dst, loops]), torch.cat([block.src, loops])
        return SparseOperator.from_coo(rows, cols, torch.ones(rows.shape[0]), (block.n_dst, block.n_src),
                                       with_transpose=with_transpose)


@register_schedule
class SilentSchedule(Schedule):
    """A schedule no project file knows: hidden-layer halos are never sent (their rows read as zeros)."""

    kind = "test-silent"
    form = "test-silent"
    calls = 0

    @classmethod
    def parse(cls, arg, seed):
        return cls() if arg is None else None

    def forward(self, ex, slot, x_owned):
        SilentSchedule.calls += 1
        full = ex.new_full(x_owned)
        full[ex.plan.n_owned:] = 0
        ex.counters.halo_rows_skipped += ex.plan.rows_sent_to_peers
        return full, None

    def backward(self, ex, slot, grad_full, info):
        return grad_full[:ex.plan.n_owned].clone()

    def predicted_bytes(self, exact_bytes, exchanged_layers, num_parts):
        return 0.0


def dense_sum_model(graph, params: dict, num_layers: int) -> torch.Tensor:
    """The reference: (A + I) H W^T + b per layer with ReLU between, densely in float64 on the whole graph."""
    n = graph.num_nodes
    adjacency = torch.zeros(n, n, dtype=torch.float64)
    src, dst = torch.from_numpy(graph.edge_index)
    adjacency[dst, src] = 1.0
    adjacency += torch.eye(n, dtype=torch.float64)
    h = torch.from_numpy(graph.x).double()
    for k in range(num_layers):
        h = adjacency @ h @ params[f"convs.{k}.weight"].double().t() + params[f"convs.{k}.bias"].double()
        if k < num_layers - 1:
            h = torch.relu(h)
    return h


def test_a_model_and_a_schedule_registered_from_a_test_train_at_two_ranks(partitioned, tmp_path):
    directory = partitioned("synthetic:tiny", 2)
    model = ModelConfig(model="test-sum", hidden=8, num_layers=2, dropout=0.0)
    config = TrainConfig(parts=str(directory), model=model, schedule="test-silent", epochs=4, lr=0.01,
                         progress=False, timeout=0)
    SilentSchedule.calls = 0
    finals = run_fake_ranks(2, lambda comm: train(RankContext(comm), config))
    assert finals[0]["model"] == "test-sum" and finals[0]["schedule"] == "test-silent"
    assert SilentSchedule.calls == 2 * 4  # one hidden layer, two ranks, four epochs
    assert finals[0]["halo_bytes_total"] == 0  # hidden rows never travelled: the schedule ran, not exact
    assert finals[0]["halo_rows_skipped_total"] > 0

    # The registered model computes what it says, across the partition: evaluation is exact under any schedule.
    graph = load_dataset("synthetic:tiny")

    def logits_on_rank(comm):
        state = setup(RankContext(comm), TrainConfig(parts=str(directory), model=model, progress=False, timeout=0))
        ids, logits = gather_logits(state)
        return ids.numpy(), logits.double(), {k: p.detach() for k, p in state.model.named_parameters()}

    results = run_fake_ranks(2, logits_on_rank)
    reference = dense_sum_model(graph, results[0][2], num_layers=2)
    for ids, logits, _ in results:
        assert torch.allclose(logits, reference[torch.from_numpy(ids)], rtol=1e-4, atol=1e-4)


def test_a_model_registered_from_a_test_trains_sampled_with_transposes_only_where_asked(partitioned):
    """test-sum's block_operator builds its transpose only where the step asks (block_needs_transpose): none for an
    input layer that aggregates the features first and needs no input gradient."""
    from gnn_dist.models import model_class

    assert not model_class("test-sum").block_needs_transpose(True, False)
    assert model_class("test-sum").block_needs_transpose(True, True)
    directory = partitioned("synthetic:tiny", 2)
    config = TrainConfig(parts=str(directory), mode="sampled", epochs=1, progress=False, timeout=0,
                         model=ModelConfig(model="test-sum", hidden=8, num_layers=2, dropout=0.0),
                         sampled=SampledConfig(fanouts=(3, 2), batch_size=16))
    finals = run_fake_ranks(2, lambda comm: train(RankContext(comm), config))
    assert finals[0]["model"] == "test-sum" and finals[0]["mode"] == "sampled" and finals[0]["epochs_run"] == 1
    assert 0.0 <= finals[0]["test_acc"] <= 1.0


def test_a_dataset_registered_from_a_test_is_a_dataset_spec(tmp_path):
    from gnn_dist.partition.datasets import load_dataset, register_dataset
    from gnn_dist.partition.graph import Graph, random_split, symmetrize
    from gnn_dist.partition.partitioner import partition_graph

    @register_dataset("test-ring", "test-ring:N")
    def ring(arg, root, *, seed, download):
        n = int(arg)
        edges = symmetrize(np.stack([np.arange(n), (np.arange(n) + 1) % n]), n)
        masks = random_split(n, seed, (0.6, 0.2, 0.2))
        x = np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)
        return Graph("ring", edges, x, np.arange(n) % 2, *masks, num_classes=2)

    graph = load_dataset("test-ring:12")
    assert graph.num_nodes == 12 and graph.num_edges == 24  # a ring: two directed edges per node
    meta = partition_graph(graph, 2, tmp_path / "p2")
    assert meta.num_nodes == 12
    with pytest.raises(ValueError, match="use one of .*test-ring:N"):
        load_dataset("test-ring")


def test_every_config_validates_from_its_own_defaults():
    ModelConfig().validate()
    SampledConfig().validate(ModelConfig().num_layers)
    TrainConfig(parts="unused").validate()
    TrainConfig(parts="unused", mode="sampled").validate()
    assert PlanConfig().model == ModelConfig()


@pytest.mark.parametrize("mode", ["full", "sampled"])
def test_the_command_line_defaults_are_the_config_defaults(mode):
    args = build_parser().parse_args(["train", "--parts", "unused", "--mode", mode])
    assert train_config_from_args(args) == TrainConfig(parts="unused", mode=mode)


def test_the_command_line_offers_every_registered_model_and_schedule(capsys):
    args = build_parser().parse_args(["train", "--parts", "unused", "--model", "test-sum", "--schedule", "test-silent"])
    assert train_config_from_args(args).model.model == "test-sum"
    with pytest.raises(ValueError, match="valid forms: exact, .*stale:R .*test-silent"):
        TrainConfig(parts="unused", schedule="test-silent:2").validate()


def test_the_core_does_not_import_the_benchmarks():
    code = ("import sys, gnn_dist.cli, gnn_dist.training, gnn_dist.partition_report; "
            "sys.exit(any(m.startswith('gnn_dist.benchmarks') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


@pytest.mark.parametrize("name", ["kernels", "benchmarks", "partition"])
def test_no_top_level_name_but_gnn_dist_is_importable(tmp_path, name):
    # From outside the checkout (whose folders python -m would otherwise find on the path).
    # PYTHONPATH (set where another checkout runs its tests, scripts/mutants.py) would put a checkout's root on the
    # path; the question is what an installation claims.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp_path, capture_output=True, text=True,
                           env=env)
    assert found.returncode != 0 and f"No module named '{name}'" in found.stderr
    assert subprocess.run([sys.executable, "-c", f"import gnn_dist.{name}"], cwd=tmp_path, env=env).returncode == 0


def test_no_module_of_the_runtime_is_over_400_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "gnn_dist").rglob("*.py")}
    assert sizes and max(sizes.values()) <= 400, {k: v for k, v in sizes.items() if v > 400}


@pytest.mark.mpi
def test_a_plugin_registers_a_model_and_a_schedule_for_gnn_dist_train(partitioned, tmp_path):
    from tests.conftest import run_mpi

    plugin = tmp_path / "my_models.py"
    plugin.write_text("import tests.test_extension_points  # noqa: F401 - registers test-sum and test-silent\n")
    metrics = tmp_path / "m.jsonl"
    done = run_mpi(2, "train", "--plugin", str(plugin), "--parts", str(partitioned("synthetic:tiny", 2)),
                   "--model", "test-sum", "--schedule", "test-silent", "--epochs", "3", "--hidden", "8",
                   "--no-progress", "--metrics-out", str(metrics))
    assert done.returncode == 0, done.stderr
    final = json.loads(metrics.read_text().splitlines()[-1])
    assert (final["model"], final["schedule"], final["halo_bytes_total"]) == ("test-sum", "test-silent", 0)
    missing = run_mpi(2, "train", "--plugin", str(tmp_path / "missing.py"), "--parts", "unused")
    assert missing.returncode == 2 and missing.stderr.count("--plugin") == 1 and "cannot import it" in missing.stderr
