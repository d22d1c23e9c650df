"""GAT under mpiexec: exact against PyG's GATConv stack at P = 1, 2, 4; one loss curve at every P with dropout on;
Cora accuracy (full-batch and sampled) against PyG's GAT example; schedules and halo dtypes on its exchanged rows;
inspect's byte prediction."""
from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli, run_mpi, train_many
from tests.test_mpi_train import read_metrics

pytestmark = pytest.mark.mpi

GAT = ["--model", "gat"]
CORA_GAT = GAT + ["--heads", "8", "--hidden", "8", "--dropout", "0.6", "--lr", "0.005", "--weight-decay", "5e-4"]


@pytest.mark.parametrize("num_parts", [1, 2, 4])
@pytest.mark.parametrize("halo_memory", ["resident", "sequential"])
def test_gat_logits_and_gradients_equal_pyg(partitioned, num_parts, halo_memory):
    """Float32 ranks against PyG in float64, gradients to 1e-5 absolute.

    The parts are node-balanced: on the default (nodes and edges) parts at P=2 one first-layer pre-activation
    lies within float32 rounding of zero (the native kernel's sum rounds it to 0, the torch formulation's to
    +7e-9, measured), so the ReLU passes one gradient that float64 blocks and layer 0's gradients move by 2e-5.
    That is a tie, not an error in the exchange: both kernels agree with a float64 recomputation to 1e-9 on
    every attention backward of that run. The loss-curve test below runs on the default parts.
    """
    directory = partitioned("synthetic:small", num_parts, balance="nodes")
    done = run_mpi(num_parts, "--parts", str(directory), "--dataset", "synthetic:small", "--model", "gat",
                   "--hidden", "8", "--heads", "4", "--num-layers", "3", "--halo-memory", halo_memory,
                   "--halo-block-rows", "100", script="equivalence.py")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ranks"] == num_parts
    assert result["blocked_operator"] == (halo_memory == "sequential")
    assert result["max_logit_diff"] <= 1e-5 and result["max_grad_diff"] <= 1e-5


def test_gat_loss_curve_with_dropout_is_the_same_at_every_rank_count(partitioned, tmp_path):
    """Resident at P = 1, 2, 4 and sequential halos at P = 2, 4: one curve."""
    curves = {}
    for num_parts, halo_memory in ((1, "resident"), (2, "resident"), (4, "resident"), (2, "sequential"),
                                   (4, "sequential")):
        out = tmp_path / f"m{num_parts}{halo_memory}.jsonl"
        done = run_mpi(num_parts, "train", "--parts", str(partitioned("synthetic:small", num_parts)), *GAT,
                       "--heads", "4", "--hidden", "8", "--epochs", "20", "--dropout", "0.5",
                       "--attn-dropout", "0.3", "--halo-memory", halo_memory, "--halo-block-rows", "300",
                       "--metrics-out", str(out), "--no-progress")
        assert done.returncode == 0, done.stderr
        epochs, final = read_metrics(out)
        assert final["halo_memory"] == halo_memory
        curves[num_parts, halo_memory] = [r["loss"] for r in epochs]
    reference = curves[1, "resident"]
    assert reference[-1] < 0.9 * reference[0]  # the loss moves, or equal curves would prove nothing
    for key, curve in curves.items():
        for a, b in zip(reference, curve):
            assert abs(a - b) <= 1e-4 * abs(a), (key, reference, curve)


def test_attention_dropout_changes_the_curve(partitioned, tmp_path):
    """--attn-dropout is applied: the same run with it off follows another curve."""
    directory = partitioned("synthetic:small", 2)
    curves = []
    for p in ("0.0", "0.5"):
        out = tmp_path / f"a{p}.jsonl"
        done = run_mpi(2, "train", "--parts", str(directory), *GAT, "--heads", "2", "--hidden", "8", "--epochs", "3",
                       "--dropout", "0.0", "--attn-dropout", p, "--metrics-out", str(out), "--no-progress")
        assert done.returncode == 0, done.stderr
        curves.append([r["loss"] for r in read_metrics(out)[0]])
    assert curves[0][0] != curves[1][0]


@pytest.fixture(scope="module")
def cora_gat_runs(cora_root, tmp_path_factory):
    """Cora with row-normalised features, as PyG's GAT example reads it (NormalizeFeatures); full-batch and
    sampled GAT, 3 seeds each, in one mpiexec launch."""
    parts = tmp_path_factory.mktemp("cora") / "p2"
    done = run_cli("partition", "--dataset", "planetoid:Cora", "--root", str(cora_root), "--num-parts", "2",
                   "--normalize-features", "--out", str(parts))
    assert done.returncode == 0, done.stderr
    # The accuracy asserted is the last epoch's: evaluated then (--eval-every EPOCHS), not after every epoch.
    runs = [f"--mode {mode} --epochs {epochs} --eval-every {epochs} --seed {seed}"
            for mode, epochs, _ in CORA_TARGETS for seed in (0, 1, 2)]
    return train_many(2, ["--parts", str(parts), *CORA_GAT, "--batch-size", "64"], runs)


CORA_TARGETS = [("full", 200, 0.80), ("sampled", 100, 0.78)]


@pytest.mark.parametrize("mode, epochs, target", CORA_TARGETS)
def test_gat_on_cora_reaches_the_pyg_example_accuracy(cora_gat_runs, mode, epochs, target):
    accuracies = [cora_gat_runs[f"--mode {mode} --epochs {epochs} --eval-every {epochs} --seed {seed}"]["test_acc"]
                  for seed in (0, 1, 2)]
    assert sum(accuracies) / 3 >= target, accuracies


@pytest.mark.parametrize("spec, dtype", [("stale:4", "fp32"), ("pipeline", "fp16"), ("bns:0.5", "int8"),
                                         ("adaptive:0.05", "bf16"), ("exact", "int8")])
def test_schedules_and_dtypes_apply_to_gat_rows(partitioned, tmp_path, spec, dtype):
    directory = partitioned("synthetic:small", 4)
    options = ["--hidden", "6", "--heads", "3", "--num-layers", "3", "--schedule", spec, "--halo-dtype", dtype]
    out = tmp_path / "m.jsonl"
    done = run_mpi(4, "train", "--parts", str(directory), *GAT, *options, "--epochs", "8", "--metrics-out", str(out),
                   "--no-progress")
    assert done.returncode == 0, done.stderr
    epochs, final = read_metrics(out)
    assert final["schedule"] == spec and final["halo_dtype"] == dtype
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    report = json.loads(run_cli("inspect", str(directory), "--json", *GAT, *options).stdout)
    # independent count: layers 1 and 2 send [x W | a_src] rows: 3 heads x 6 + 3 scores, then the classes + 1
    classes = report["num_classes"]
    assert report["exchanged_widths"] == [0, 3 * 6 + 3, classes + 1]
    measured = final["halo_bytes_total"] / final["epochs"]
    if spec in ("stale:4", "pipeline", "exact"):  # exact predictions (stale: over whole periods of 4 epochs)
        assert measured == report["predicted_halo_bytes_per_epoch"]
    elif spec == "bns:0.5":
        assert abs(measured / report["predicted_halo_bytes_per_epoch"] - 1) < 0.1
    else:  # adaptive: an upper bound
        assert measured <= report["predicted_halo_bytes_per_epoch"]


def test_sequential_gat_sends_what_inspect_predicts(partitioned, tmp_path):
    """Sequential attention sends each forward row twice (again in the backward) and each gradient once."""
    directory = partitioned("synthetic:small", 4)
    options = [*GAT, "--hidden", "6", "--heads", "3", "--num-layers", "3", "--halo-memory", "sequential"]
    out = tmp_path / "m.jsonl"
    done = run_mpi(4, "train", "--parts", str(directory), *options, "--halo-block-rows", "50", "--epochs", "3",
                   "--metrics-out", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr
    epochs, _ = read_metrics(out)
    report = json.loads(run_cli("inspect", str(directory), "--json", *options).stdout)
    # independent count: rows x (3 heads x 6 + 3 scores, then classes + 1) x 4 bytes x 3 transfers
    widths = 3 * 6 + 3 + report["num_classes"] + 1
    assert report["predicted_halo_bytes_per_epoch"] == report["total_halo_rows"] * widths * 4 * 3
    assert all(r["halo_bytes"] == report["predicted_halo_bytes_per_epoch"] for r in epochs)


def test_sequential_gat_with_a_stale_schedule_is_refused_before_it_starts(partitioned):
    done = run_mpi(2, "train", "--parts", str(partitioned("synthetic:small", 2)), *GAT, "--halo-memory", "sequential",
                   "--schedule", "stale:4", "--epochs", "1", "--no-progress")
    assert done.returncode != 0
    assert "--halo-memory sequential runs --model gat with --schedule exact only" in done.stderr
    assert "Traceback" not in done.stderr


def test_gat_killed_and_resumed_at_another_rank_count_follows_the_uninterrupted_curve(partitioned, tmp_path):
    options = [*GAT, "--heads", "2", "--hidden", "8", "--dropout", "0.5", "--epochs", "6", "--no-progress"]
    whole = tmp_path / "whole.jsonl"
    done = run_mpi(2, "train", "--parts", str(partitioned("synthetic:small", 2)), *options, "--metrics-out", str(whole))
    assert done.returncode == 0, done.stderr
    checkpoints = tmp_path / "ck"
    failed = run_mpi(2, "train", "--parts", str(partitioned("synthetic:small", 2)), *options, "--checkpoint-dir",
                     str(checkpoints), "--checkpoint-every", "2", env={"GNN_DIST_FAIL_AT": "3"})
    assert failed.returncode != 0
    resumed = tmp_path / "resumed.jsonl"
    done = run_mpi(4, "train", "--parts", str(partitioned("synthetic:small", 4)), *options, "--checkpoint-dir",
                   str(checkpoints), "--checkpoint-every", "2", "--resume", "--metrics-out", str(resumed))
    assert done.returncode == 0, done.stderr
    expected, again = read_metrics(whole)[0], read_metrics(resumed)[0]
    assert [r["epoch"] for r in again] == list(range(6))
    for a, b in zip(expected, again):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"]), (expected, again)
