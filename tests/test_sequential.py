"""Sequential halo aggregation (--halo-memory sequential) against PyG and against resident halos."""
from __future__ import annotations

import dataclasses

import pytest

from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import ModelConfig, TrainConfig
from gnn_dist.context import RankContext
from gnn_dist.partition.datasets import load_dataset
from gnn_dist.training import run_epochs, setup
from tests.conftest import run_mpi
from tests.test_halo_fake import CASES, assert_equal_to_pyg, one_step_on_every_rank


@pytest.mark.parametrize("model, hidden, num_layers, batch_norm", CASES)
@pytest.mark.parametrize("num_parts, block_rows", [(1, 0), (2, 0), (4, 0), (4, 7)])
def test_sequential_model_equals_pyg_on_the_whole_graph(partitioned, model, hidden, num_layers, batch_norm,
                                                        num_parts, block_rows):
    directory = partitioned("synthetic:tiny", num_parts)
    config = TrainConfig(parts=str(directory), epochs=0, progress=False, seed=3, halo_memory="sequential",
                         halo_block_rows=block_rows,
                         model=ModelConfig(model=model, hidden=hidden, num_layers=num_layers, dropout=0.0,
                                           batch_norm=batch_norm))
    results = one_step_on_every_rank(config, num_parts)
    graph = load_dataset("synthetic:tiny")
    # The mode under test really ran: every rank built the blocked operator and, with several ranks,
    # received halo blocks (cut to at most block_rows rows when bounded).
    for *_, local in results:
        blocked = local.blocked
        assert blocked is not None
        assert (len(blocked.exchanges) > 0) == (num_parts > 1)
        if block_rows:
            assert max(b.col_stop - b.col_start for b in blocked.blocks) <= block_rows
    assert_equal_to_pyg(results, config, graph)


def _curve(directory, config, num_parts):
    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        records = run_epochs(state)
        return records, state.graph.blocked is not None

    results = run_fake_ranks(num_parts, rank_fn)
    assert all(sequential == (config.halo_memory == "sequential") for _, sequential in results)
    return results[0][0]


TRAINING = dict(epochs=4, progress=False, seed=5, lr=0.02,
                model=ModelConfig(model="gcn", hidden=24, num_layers=3, dropout=0.5, batch_norm=True))


@pytest.mark.parametrize("model, batch_norm", [("gcn", True), ("sage", True), ("gcn", False)])
@pytest.mark.parametrize("num_parts", [2, 4])
def test_sequential_training_equals_resident_with_dropout_and_batchnorm(partitioned, model, batch_norm, num_parts):
    directory = partitioned("synthetic:tiny", num_parts)
    base = TrainConfig(parts=str(directory), **{**TRAINING, "model": dataclasses.replace(
        TRAINING["model"], model=model, batch_norm=batch_norm)})
    resident = _curve(directory, base, num_parts)
    sequential = _curve(directory, dataclasses.replace(base, halo_memory="sequential", halo_block_rows=5), num_parts)
    for r, s in zip(resident, sequential):
        assert s["loss"] == pytest.approx(r["loss"], rel=1e-5)
        if not batch_norm:
            # With BatchNorm after a conv, the conv bias's true gradient is 0 and what each mode computes is
            # rounding noise, which Adam scales to full steps of opposite sign; the loss cannot see the bias
            # (BatchNorm removes it) but the running mean, and so eval-mode accuracy, can.
            assert s["val_acc"] == pytest.approx(r["val_acc"], abs=1e-9)
        # the same rows travel, in more messages: exactly resident's bytes, training and evaluation
        assert s["halo_bytes"] == r["halo_bytes"] > 0
        assert s["eval_halo_bytes"] == r["eval_halo_bytes"] > 0


@pytest.mark.parametrize("num_parts, schedule", [(2, "stale:3"), (4, "stale:3"), (2, "exact,stale:3")])
def test_sequential_stale_halos_equal_resident_stale_halos(partitioned, num_parts, schedule):
    directory = partitioned("synthetic:tiny", num_parts)
    base = TrainConfig(parts=str(directory), schedule=schedule, **{**TRAINING, "epochs": 7})
    resident = _curve(directory, base, num_parts)
    sequential = _curve(directory, dataclasses.replace(base, halo_memory="sequential", halo_block_rows=6), num_parts)
    exact = _curve(directory, dataclasses.replace(base, schedule="exact"), num_parts)
    # stale halos are live: they change the curve and skip rows (epochs 1, 2, 4, 5 reuse the cache)
    assert any(abs(s["loss"] - e["loss"]) > 1e-4 for s, e in zip(sequential, exact))
    for r, s in zip(resident, sequential):
        assert s["loss"] == pytest.approx(r["loss"], rel=1e-5)
        assert (s["halo_bytes"], s["halo_rows_skipped"]) == (r["halo_bytes"], r["halo_rows_skipped"])
    if schedule == "stale:3":
        assert [s["halo_bytes"] > 0 for s in sequential] == [True, False, False, True, False, False, True]
    else:  # the first exchanged layer sends every epoch, the second one epoch in 3
        assert [s["halo_rows_skipped"] > 0 for s in sequential] == [False, True, True, False, True, True, False]


def test_sequential_loss_curve_is_the_same_at_every_rank_count(partitioned):
    curves = []
    for num_parts in (1, 2, 4):
        config = TrainConfig(parts=str(partitioned("synthetic:tiny", num_parts)), halo_memory="sequential",
                             **TRAINING)
        curves.append([r["loss"] for r in _curve(None, config, num_parts)])
    for curve in curves[1:]:
        assert curve == pytest.approx(curves[0], rel=1e-5)
    assert curves[0][-1] < curves[0][0]  # it trains


@pytest.mark.parametrize("num_parts, schedule", [(2, "pipeline"), (4, "pipeline"), (2, "pipeline:0"),
                                                  (2, "bns:0.5"), (4, "bns:0.5"), (2, "adaptive:0.05"),
                                                  (4, "adaptive:0.05"), (4, "pipeline,bns:0.5")])
def test_sequential_schedules_equal_resident_ones(partitioned, num_parts, schedule):
    """Every schedule keeps its own per-block state with sequential halos and trains exactly as it does with
    resident halos: the same loss curve, the same bytes, the same rows skipped."""
    directory = partitioned("synthetic:tiny", num_parts)
    base = TrainConfig(parts=str(directory), schedule=schedule, **{**TRAINING, "epochs": 6, "schedule_guard": "off"})
    resident = _curve(directory, base, num_parts)
    sequential = _curve(directory, dataclasses.replace(base, halo_memory="sequential", halo_block_rows=6), num_parts)
    exact = _curve(directory, dataclasses.replace(base, schedule="exact"), num_parts)
    assert any(abs(r["loss"] - e["loss"]) > 1e-4 for r, e in zip(resident, exact))  # the schedule is live
    for r, s in zip(resident, sequential):
        assert s["loss"] == pytest.approx(r["loss"], rel=1e-5)
        assert (s["halo_bytes"], s["halo_rows"], s["halo_rows_skipped"]) == \
            (r["halo_bytes"], r["halo_rows"], r["halo_rows_skipped"])


@pytest.mark.mpi
@pytest.mark.parametrize("schedule", ["pipeline", "bns:0.5", "adaptive:0.05"])
def test_sequential_schedules_equal_resident_ones_under_mpiexec(partitioned, tmp_path, schedule):
    """The same under real MPI (point-to-point blocks, non-blocking pipeline transfers): two ranks, dropout on."""
    import json

    directory = partitioned("synthetic:small", 2)
    curves = {}
    for halo_memory in ("resident", "sequential"):
        out = tmp_path / f"{halo_memory}.jsonl"
        done = run_mpi(2, "train", "--parts", str(directory), "--schedule", schedule, "--schedule-guard", "off",
                       "--epochs", "8", "--dropout", "0.5", "--hidden", "16", "--halo-memory", halo_memory,
                       "--halo-block-rows", "300", "--metrics-out", str(out), "--no-progress")
        assert done.returncode == 0, done.stderr
        curves[halo_memory] = [json.loads(line) for line in out.read_text().splitlines()][:-1]
    assert len(curves["resident"]) == 8
    for r, s in zip(curves["resident"], curves["sequential"]):
        assert s["loss"] == pytest.approx(r["loss"], rel=1e-5)
        assert (s["halo_bytes"], s["halo_rows"], s["halo_rows_skipped"]) == \
            (r["halo_bytes"], r["halo_rows"], r["halo_rows_skipped"])


@pytest.mark.parametrize("changes, message", [
    (dict(schedule="pipeline", model=ModelConfig(model="gat")),
     "--halo-memory sequential runs --model gat with --schedule exact only"),
    (dict(mode="sampled"), "--halo-memory sequential is for --mode full"),
    (dict(halo_block_rows=-1), "--halo-block-rows must be 0"),
    (dict(halo_memory="lazy"), "bad --halo-memory 'lazy'"),
])
def test_sequential_refuses_what_it_cannot_do(changes, message):
    config = TrainConfig(parts="unused", **{"halo_memory": "sequential", **changes})
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        config.validate()


@pytest.mark.parametrize("halo_memory", ["resident", "sequential"])
def test_low_precision_features_train_close_to_fp32(partitioned, halo_memory):
    directory = partitioned("synthetic:tiny", 2)
    base = TrainConfig(parts=str(directory), halo_memory=halo_memory, **TRAINING)
    exact = _curve(directory, base, 2)
    low = _curve(directory, dataclasses.replace(base, feature_dtype="bf16"), 2)
    gaps = [abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(exact, low)]
    # bf16 keeps 8 bits of mantissa: the curves differ (the option is live) but only slightly
    assert 0 < max(gaps) < 0.02


@pytest.mark.parametrize("schedule", ["exact", "pipeline", "bns:0.5", "adaptive:0.05"])
def test_a_sequential_forward_keeps_no_layer_input_for_the_backward(partitioned, schedule):
    """Each sequential aggregation's autograd node holds its block pass until the backward; the pass must not keep
    the layer's [n_owned, F] input (a linear aggregation's backward never reads it). Kept, it held one input per
    layer through the rest of the forward: synthetic:large P=2 trained at 2.23 GiB against 1.88 without it."""
    directory = partitioned("synthetic:tiny", 2)
    config = TrainConfig(parts=str(directory), schedule=schedule, halo_memory="sequential", halo_block_rows=6,
                         **{**TRAINING, "epochs": 0, "schedule_guard": "off"})

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        state.model.train()
        out = state.model(state.x_full)
        passes, seen, stack = [], set(), [out.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if hasattr(node, "transfers"):
                passes.append(node.transfers)
            stack.extend(next_node for next_node, _ in node.next_functions)
        out.sum().backward()  # every rank runs its backward: the exchanges in it are collective
        return [(p.x_owned is None, p.like.shape[0]) for p in passes]

    for passes in run_fake_ranks(2, rank_fn):
        # one sequential aggregation per layer but the first (its halo inputs are the features, fetched once)
        assert len(passes) == TRAINING["model"].num_layers - 1
        assert passes == [(True, 0)] * len(passes)
