"""Chunked layer-wise evaluation against PyG on the whole graph; sampled mode's memory footprint.

The reference is PyG's GCNConv / SAGEConv stack in eval mode on the whole
graph (BatchNorm with its running statistics), never our own forward.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import gnn_dist.kernels.spmm as spmm_module
from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import ModelConfig, SampledConfig, TrainConfig
from gnn_dist.context import RankContext
from gnn_dist.partition.datasets import load_dataset
from gnn_dist.partition.format import load_part
from gnn_dist.steps.evaluation import accuracies
from gnn_dist.training import run_epochs, setup
from tests.conftest import run_mpi
from tests.reference import pyg_with_our_parameters

TINY_NODES = 400  # synthetic:tiny


def pyg_eval_logits(graph, model: str, widths, params: dict, buffers: dict) -> torch.Tensor:
    """Eval-mode logits of every node from PyG on the whole graph, with our weights and BatchNorm statistics."""
    ref = pyg_with_our_parameters(model, widths, bool(buffers), params)
    their_buffers = dict(ref.named_buffers())
    with torch.no_grad():
        for ours, value in buffers.items():
            their_buffers[ours].copy_(value)
    ref.eval()
    with torch.no_grad():
        return ref(torch.from_numpy(graph.x).double(), torch.from_numpy(graph.edge_index))


def set_running_statistics(model, seed: int) -> dict:
    """Give every BatchNorm running statistics far from (0, 1), so eval mode's use of them is visible."""
    generator = torch.Generator().manual_seed(seed)
    buffers = {}
    for k, norm in enumerate(model.norms or []):
        with torch.no_grad():
            norm.running_mean.copy_(torch.randn(norm.running_mean.shape, generator=generator))
            norm.running_var.copy_(torch.rand(norm.running_var.shape, generator=generator) + 0.5)
        buffers[f"norms.{k}.running_mean"] = norm.running_mean.double().clone()
        buffers[f"norms.{k}.running_var"] = norm.running_var.double().clone()
    return buffers


CASES = [
    ("gcn", 32, 1, 3, False),   # 16->32->32->4: aggregate first, last layer transforms first
    ("gcn", 8, 1, 2, False),    # 16->8: the first layer transforms the cached [owned | halo] features first
    ("sage", 32, 1, 3, False),
    ("sage", 8, 1, 2, False),
    ("gcn", 24, 1, 3, True),    # BatchNorm in eval mode: running statistics
    ("sage", 24, 1, 3, True),
    ("gat", 6, 3, 3, False),    # attention: owned and halo column blocks joined by their softmax denominators
]


@pytest.mark.parametrize("model, hidden, heads, num_layers, batch_norm", CASES)
@pytest.mark.parametrize("num_parts", [1, 2, 4])
@pytest.mark.parametrize("mode", ["full", "sampled"])
def test_chunked_evaluation_equals_pyg_on_the_whole_graph(partitioned, model, hidden, heads, num_layers, batch_norm,
                                                          num_parts, mode):
    if mode == "sampled" and batch_norm:
        pytest.skip("sampled mode trains without BatchNorm")
    directory = partitioned("synthetic:tiny", num_parts)
    fanouts = tuple([3] * num_layers)
    config = TrainConfig(parts=str(directory), epochs=0, progress=False, seed=4, mode=mode,
                         sampled=SampledConfig(fanouts=fanouts),
                         model=ModelConfig(model=model, hidden=hidden, heads=heads, num_layers=num_layers,
                                           dropout=0.5, batch_norm=batch_norm))
    chunk_sizes = [1, 7, TINY_NODES + 1]

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        buffers = set_running_statistics(state.model, seed=9)
        state.model.eval()
        per_chunk = {}
        for chunk in chunk_sizes:
            per_chunk[chunk] = state.model.forward_layerwise(state.x_full, chunk)
        accs = accuracies(state.ctx, per_chunk[7], state.graph)
        params = {name: p.detach().double().clone() for name, p in state.model.named_parameters()}
        return state.graph.node_ids, per_chunk, params, buffers, accs

    results = run_fake_ranks(num_parts, rank_fn)
    graph = load_dataset("synthetic:tiny")
    widths = config.model.layers(graph.num_features, graph.num_classes)
    ref = pyg_eval_logits(graph, model, widths, results[0][2], results[0][3])
    for chunk in chunk_sizes:
        logits = torch.full_like(ref, float("nan"))
        for node_ids, per_chunk, *_ in results:
            logits[node_ids] = per_chunk[chunk].double()
        assert (logits - ref).abs().max() <= 1e-5, chunk
    # Accuracies (summed over ranks) against the dataset's own labels and masks.
    predicted = ref.argmax(1).numpy()
    for name, mask in (("train_acc", graph.train_mask), ("val_acc", graph.val_mask), ("test_acc", graph.test_mask)):
        expected = float((predicted[mask] == graph.y[mask]).mean())
        assert all(r[4][name] == pytest.approx(expected, abs=1e-12) for r in results), name


def test_layerwise_evaluation_refuses_train_mode(partitioned):
    config = TrainConfig(parts=str(partitioned("synthetic:tiny", 1)), epochs=0, progress=False,
                         model=ModelConfig(batch_norm=True))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        state.model.train()
        with pytest.raises(RuntimeError, match="call model.eval"):
            state.model.forward_layerwise(state.x_full, 8)
        return True

    assert run_fake_ranks(1, rank_fn) == [True]


def whole_part_operator(part) -> tuple[int, int, int]:
    """(rows, cols, nnz) of a part's whole GCN operator, counted from the part file."""
    return part.n_owned, part.n_owned + part.n_halo, len(part.indices) + part.n_owned  # one self loop per row


def record_operator_builds(monkeypatch) -> list:
    """Every SparseOperator.from_coo call as (rows, cols, nnz, with_transpose, under no_grad). Evaluation runs
    under no_grad; training builds its sampled blocks with gradients on (an input layer's may lack its transpose
    too: gnn_dist.steps.mini_batch.MiniBatchMode.block_operators)."""
    built = []
    real = spmm_module.SparseOperator.from_coo.__func__

    def recording(cls, rows, cols, values, shape, with_transpose=True, **options):
        built.append((int(shape[0]), int(shape[1]), int(cols.numel()), with_transpose, not torch.is_grad_enabled()))
        return real(cls, rows, cols, values, shape, with_transpose, **options)

    monkeypatch.setattr(spmm_module.SparseOperator, "from_coo", classmethod(recording))
    return built


@pytest.mark.parametrize("mode", ["full", "sampled"])
def test_only_full_batch_mode_builds_the_whole_part_operator(partitioned, monkeypatch, mode):
    num_parts, chunk, num_layers = 2, 50, 2
    directory = partitioned("synthetic:small", num_parts)
    parts = [load_part(directory, k) for k in range(num_parts)]
    whole = {whole_part_operator(part) for part in parts}
    built = record_operator_builds(monkeypatch)
    config = TrainConfig(parts=str(directory), epochs=1, progress=False, mode=mode, eval_chunk_nodes=chunk,
                         sampled=SampledConfig(fanouts=(4, 4), batch_size=64),
                         model=ModelConfig(model="gcn", hidden=16, num_layers=num_layers))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        run_epochs(state)  # one training epoch, then one evaluation
        return state.graph.operator is None

    no_operator = run_fake_ranks(num_parts, rank_fn)
    whole_built = [b for b in built if b[:3] in whole and b[3]]
    assert any(not b[4] for b in built)  # training built its blocks
    if mode == "full":
        # The control: full-batch training builds each part's operator (with its transpose) once.
        assert no_operator == [False] * num_parts
        assert len(whole_built) == num_parts
        return
    assert no_operator == [True] * num_parts
    assert whole_built == []
    # Evaluation built forward-only rows chunk by chunk: per layer, every owned row of every part once.
    eval_chunks = [b for b in built if b[4]]
    assert eval_chunks and not any(b[3] for b in eval_chunks)
    assert max(rows for rows, *_ in eval_chunks) <= chunk
    assert sum(rows for rows, *_ in eval_chunks) == num_layers * sum(part.n_owned for part in parts)
    assert sum(nnz for _, _, nnz, *_ in eval_chunks) == num_layers * sum(nnz for *_, nnz in whole)


PHASES_PROBE = """
import json, time, torch
from gnn_dist.memory.rss import PhasePeaks, current_rss_bytes
mib = 2**20
torch.ones(1)  # torch's own start-up allocations happen before the tracker starts
peaks = PhasePeaks("quiet", interval_s=0.005)
base = current_rss_bytes()
time.sleep(0.05)
peaks.enter("big")
before_big = current_rss_bytes()  # what the process holds just before the allocation (base may have shrunk since)
big = torch.ones(256 * mib // 4)  # touched, so resident
del big
peaks.enter("medium")
medium = torch.ones(96 * mib // 4)
time.sleep(0.1)  # below the earlier high-water mark: this phase's peak comes from the sampler
del medium
peaks.enter("steady")
taken = peaks.samples
time.sleep(1.0)  # nothing changes: the sampler backs off instead of waking every 5 ms
steady_samples = peaks.samples - taken
peaks.enter("late")  # a phase after a long steady one is sampled densely again from its start
late = torch.ones(64 * mib // 4)
time.sleep(0.06)
del late
result = peaks.stop()
print(json.dumps({"base": base, "before_big": before_big, "peaks": result, "again": peaks.stop(),
                  "steady_samples": steady_samples}))
"""


def test_phase_peaks_attribute_memory_to_the_phase_that_used_it():
    # A fresh process, so that the 256 MiB phase is sure to raise the process's high-water mark.
    done = subprocess.run([sys.executable, "-c", PHASES_PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout.splitlines()[-1])
    mib, base, peaks = 2**20, probe["base"], probe["peaks"]
    # A new high-water mark, read from the kernel's RSS counters. Those are per-CPU and summed lazily, so on a
    # host with many CPUs they trail the truth by some MiB (CI read 242.5 MiB of the 256): allow an eighth.
    assert peaks["big"] >= probe["before_big"] + 224 * mib
    assert peaks["quiet"] < base + 64 * mib
    assert base + 80 * mib <= peaks["medium"] < peaks["big"]
    assert probe["again"] == peaks  # stopping twice changes nothing
    # one second of a steady phase: doubling from 5 ms to the 0.32 s cap takes about a dozen samples, where a
    # fixed 5 ms interval takes 200
    assert probe["steady_samples"] <= 15
    assert base + 48 * mib <= peaks["late"] < peaks["big"]


def test_sampled_run_reports_training_and_evaluation_peaks(partitioned, tmp_path):
    out = tmp_path / "m.jsonl"
    parts_dir = partitioned("synthetic:small", 2)
    done = run_mpi(2, "train", "--parts", str(parts_dir), "--mode", "sampled",
                   "--fanouts", "5,5", "--batch-size", "128", "--epochs", "2", "--eval-every", "2",
                   "--eval-chunk-nodes", "500", "--metrics-out", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    final = records[-1]
    per_rank = final["peak_rss_bytes_per_rank"]
    assert len(per_rank) == 2 and all(isinstance(v, int) and v > 0 for v in per_rank)
    assert final["peak_rss_bytes"] == max(per_rank)
    for phase in ("setup", "train", "eval"):
        assert 0 < final[f"{phase}_peak_rss_bytes"] <= final["peak_rss_bytes"]
    assert final["eval_chunk_nodes"] == 500
    # --eval-every 2 over 2 epochs: only epoch 1 evaluates, and its chunked forward exchanges each layer's
    # input once, not once per chunk: halo rows x exchanged width (64->16->10: layer 1 sends 10 columns)
    # x 4 bytes, the forward direction only.
    halo_rows = sum(load_part(parts_dir, k).n_halo for k in range(2))
    assert records[0]["eval_halo_bytes"] == 0
    assert records[1]["eval_halo_bytes"] == halo_rows * 10 * 4
