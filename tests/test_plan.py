"""The memory planner (gnn_dist.plan.memory) against counts made by hand, and train's refusal to start."""
from __future__ import annotations

import dataclasses
import json

import pytest

from gnn_dist.config import ModelConfig
from gnn_dist.halo.overlap import OVERLAP_ENV
from gnn_dist.memory.host import PROCESS_BYTES, RankMemory, memory_refusal
from gnn_dist.partition.format import load_meta, load_part, part_shapes
from gnn_dist.plan.host import plan_host, staging_pool_bytes
from gnn_dist.plan.memory import SETUP_BYTES_PER_ENTRY, PlanConfig, plan_part, plan_phases
from tests.conftest import run_cli, run_mpi

GIB = 2**30


def _tiny_shape(partitioned, num_parts=2, part=0):
    directory = partitioned("synthetic:tiny", num_parts)
    return directory, part_shapes(directory)[part], load_meta(directory)


def test_part_statistics_are_read_from_the_part_file(partitioned):
    directory, shape, meta = _tiny_shape(partitioned)
    part = load_part(directory, 0)
    assert (shape.owned, shape.halo) == (part.n_owned, part.n_halo)
    assert shape.entries == part.indices.shape[0]
    assert shape.cut_entries == int((part.indices >= part.n_owned).sum())
    assert shape.sent == part.send_idx.shape[0]
    assert sum(shape.received_per_peer) == part.n_halo


@pytest.mark.parametrize("halo_memory, overlap, shared", [("resident", "1", True), ("resident", "1", False),
                                                           ("resident", "0", True), ("sequential", "1", True)])
def test_training_peak_equals_a_count_by_hand(partitioned, monkeypatch, halo_memory, overlap, shared):
    """GCN 16 -> 32 -> 4 with dropout: the first layer aggregates first, the second transforms first."""
    monkeypatch.setenv(OVERLAP_ENV, overlap)
    directory, shape, meta = _tiny_shape(partitioned)
    F, H, C = meta.num_features, 32, meta.num_classes
    n, h, S, nnz = shape.owned, shape.halo, shape.sent, shape.entries + shape.owned
    config = PlanConfig(model=ModelConfig(model="gcn", hidden=H, num_layers=2, dropout=0.5),
                        halo_memory=halo_memory, halo_block_rows=0, shared_halo=shared)
    train = plan_phases(shape, config, F, C)["train"]
    f = 4
    params = F * H + H + H * C + C
    held = PROCESS_BYTES + (n + h) * F * f + nnz * 16 + (2 * n + h + 2) * 4 + n * 27 + h * 24 + S * 24 \
        + params * f * 5
    if halo_memory == "resident" and overlap == "1" and shared:
        # through shared memory (gnn_dist.halo.shared): the rank's slot and the pages of its peers' slots it
        # reads, nothing of the halo's own
        held += 2 * max(S, h) * C * f
        halo_rows = halo_grad = 0
        first_input = (n + h) * F * f
        layer0 = first_input + n * F * f + n * H * f
    elif halo_memory == "resident":
        held += 2 * S * C * f  # the exchanger keeps the send rows and returned gradients of the one exchanged width
        # overlapped (gnn_dist.halo.overlap): the halo's rows and their gradients alone; else [owned | halo]
        halo_rows = halo_grad = (h if overlap == "1" else n + h) * C * f
        first_input = (n + h) * F * f
        layer0 = first_input + n * F * f + n * H * f         # dropped [owned | halo] inputs, aggregation, output
    else:
        blocks = sum(1 for r in shape.received_per_peer if r)
        held += blocks * 8 + min(shape.cut_entries, n * blocks) * 16
        block = max(shape.received_per_peer)
        touched = min(n, shape.cut_entries * block // h)
        halo_rows = halo_grad = (block + max(max(shape.sent_per_peer), touched)) * C * f
        layer0 = max(n * F * f + (block + max(max(shape.sent_per_peer), touched)) * F * f + block * F * f
                     + n * F * f, n * F * f + n * H * f)
    saved0 = n * F * f                 # the first layer's aggregation, for its weight gradient
    mask = n * H // 8                  # one bit per element of the hidden layer's input (H = 32: whole bytes)
    layer1 = saved0 + n * H * f + mask + n * C * f + halo_rows + n * C * f   # input, mask, transformed, halo, sum
    # the loss's chunk temporaries (gnn_dist.nn.cross_entropy), then the logits' gradient beside the logits
    loss = saved0 + mask + n * H * f + 2 * n * C * f + 2 * min(8192, n) * C * f
    backward = max(saved0 + mask + n * H * f + n * C * f + halo_grad + n * C * f,  # through the aggregation
                   saved0 + mask + n * H * f + n * H * f)                          # through ReLU and dropout
    assert train.peak == held + max(layer0, layer1, loss, backward)


@pytest.mark.parametrize("overlap, shared", [("1", False), ("0", False), ("1", True)])
def test_an_overlapped_exchange_is_planned_with_the_halos_rows_and_gradients_alone(partitioned, monkeypatch,
                                                                                  overlap, shared):
    """GCN 16 -> 64 -> 64 -> 4: layers 1 and 2 exchange 64 and 4 columns. Overlapped (gnn_dist.halo.overlap) their
    training forward holds h received rows and their backward h rows of gradient; blocking, n + h of each;
    through shared memory (gnn_dist.halo.shared) none: they lie in the slots, held for the run. Evaluation
    (layer-wise) is planned alike either way."""
    import gnn_dist.plan.memory as memory_plan

    monkeypatch.setenv(OVERLAP_ENV, overlap)
    directory, shape, meta = _tiny_shape(partitioned)
    n, h = shape.owned, shape.halo
    charged = []

    class Recording(memory_plan.Liveness):
        def alloc(self, name, size):
            if name in ("halo rows", "halo gradient"):
                charged.append((name, int(size)))
            super().alloc(name, size)

    monkeypatch.setattr(memory_plan, "Liveness", Recording)
    config = PlanConfig(model=ModelConfig(model="gcn", hidden=64, num_layers=3), shared_halo=shared)
    train = plan_phases(shape, config, meta.num_features, meta.num_classes)["train"]
    rows = (0 if shared else h) if overlap == "1" else n + h
    S = shape.sent
    slots = 2 * max(S, h) * 64 * 4 if overlap == "1" and shared else 0
    assert train.parts.get("shared halo slots", 0) == slots
    assert train.parts.get("exchange buffers", 0) == (0 if slots else 2 * S * (64 + 4) * 4)
    # train: forward of layers 1 and 2, then the backward of layers 2 and 1 (layer 0 aggregates first: its
    # backward stops before the aggregation); evaluation: the forward of layers 1 and 2, n + h rows
    assert charged == [("halo rows", rows * 64 * 4), ("halo rows", rows * 4 * 4),
                       ("halo gradient", rows * 4 * 4), ("halo gradient", rows * 64 * 4),
                       ("halo rows", (n + h) * 64 * 4), ("halo rows", (n + h) * 4 * 4)]


def test_a_gpu_ranks_device_peak_equals_a_count_by_hand(partitioned):
    """The same GCN on a GPU: no process baseline (the host's), and the torch formulation of ReLU and dropout
    that a GPU runs keeps the ReLU's output beside the dropped copy, with a byte mask instead of a bit."""
    directory, shape, meta = _tiny_shape(partitioned)
    F, H, C = meta.num_features, 32, meta.num_classes
    n, h, S, nnz = shape.owned, shape.halo, shape.sent, shape.entries + shape.owned
    config = PlanConfig(model=ModelConfig(model="gcn", hidden=H, num_layers=2, dropout=0.5), device="cuda")
    train = plan_phases(shape, config, F, C)["train"]
    f = 4
    params = F * H + H * C + H + C
    held = (n + h) * F * f + nnz * 16 + (2 * n + h + 2) * 4 + n * 27 + h * 24 + S * 24 + params * f * 5 \
        + 2 * S * C * f
    layer0 = (n + h) * F * f + n * F * f + n * H * f      # dropped [owned | halo] inputs, aggregation, output
    saved0 = n * F * f
    relu, dropped, mask = n * H * f, n * H * f, n * H     # ReLU's output, the dropout's new tensor, byte mask
    halo = (n + h) * C * f
    layer1 = saved0 + relu + dropped + mask + n * C * f + halo + n * C * f
    loss = saved0 + relu + dropped + mask + 2 * n * C * f + 2 * min(8192, n) * C * f
    backward = max(saved0 + relu + dropped + mask + n * C * f + halo + n * C * f,
                   saved0 + relu + dropped + mask + n * H * f)
    assert train.peak == held + max(layer0, layer1, loss, backward)
    assert "process" not in {name for name, value in train.parts.items() if value}


def test_the_plan_counts_the_torch_formulations_whenever_they_run(partitioned, monkeypatch):
    """On CPUs the native kernels run unless GNN_DIST_KERNEL=torch or their build failed; the torch
    formulations keep more (GAT's [E x H] tensors, ReLU's output and a byte mask), and a GPU always runs them."""
    from gnn_dist.kernels import native

    directory, shape, meta = _tiny_shape(partitioned)
    config = PlanConfig(model=ModelConfig(model="gat", hidden=8, heads=2, dropout=0.5))
    monkeypatch.setenv(native.KERNEL_ENV, "auto")
    monkeypatch.setattr(native, "_failed", None)
    plain = plan_part(shape, config, meta.num_features, meta.num_classes).peak
    monkeypatch.setenv(native.KERNEL_ENV, "torch")
    forced = plan_part(shape, config, meta.num_features, meta.num_classes).peak
    monkeypatch.setenv(native.KERNEL_ENV, "auto")
    monkeypatch.setattr(native, "_failed", "RuntimeError: no compiler")
    failed = plan_part(shape, config, meta.num_features, meta.num_classes).peak
    assert forced == failed > plain
    monkeypatch.setattr(native, "_failed", None)
    on_gpu = plan_part(shape, dataclasses.replace(config, device="cuda"), meta.num_features, meta.num_classes)
    assert on_gpu.peak == forced - PROCESS_BYTES


def test_a_gpu_ranks_host_plan_is_the_process_its_part_file_and_the_staging_pool(partitioned):
    directory, shape, meta = _tiny_shape(partitioned)
    config = PlanConfig(model=ModelConfig(hidden=32), device="cuda")
    host = plan_host(shape, config, meta.num_features, meta.num_classes)
    loaded = sum(array.nbytes for array in load_part(directory, 0).arrays.values())
    assert abs(host.parts["part file"] - loaded) <= 0.02 * loaded  # the arrays as the part file loads them
    assert host.parts["process"] == PROCESS_BYTES
    terms = (shape.entries + shape.owned) * SETUP_BYTES_PER_ENTRY  # the normalisation, computed on the host
    pool = staging_pool_bytes(shape, config, meta.num_features, meta.num_classes)
    assert host.peak == PROCESS_BYTES + host.parts["part file"] + max(pool, terms)
    # wide layers: the staging buffers are the host's peak, at least a send and a receive buffer of the widest
    # rows (the hidden layer exchanges 4096 columns: every row sent and received, 4 bytes a value) and at most
    # GROWTH times that and the flat gradients
    H = 4096
    wide = PlanConfig(model=ModelConfig(hidden=H, num_layers=3), device="cuda")
    host = plan_host(shape, wide, meta.num_features, meta.num_classes)
    rows = (shape.sent + shape.halo) * H * 4
    params = meta.num_features * H + H * H + H * meta.num_classes + 2 * H + meta.num_classes
    assert host.phase == "train"
    assert rows <= host.peak - PROCESS_BYTES - host.parts["part file"] <= 1.25 * (rows + (params + 2) * 4)
    # on CPUs the host's plan is the rank's whole plan
    on_cpu = PlanConfig(model=ModelConfig(hidden=32))
    assert plan_host(shape, on_cpu, meta.num_features, meta.num_classes) == plan_part(shape, on_cpu,
                                                                                        meta.num_features,
                                                                                        meta.num_classes)


def test_sequential_and_bf16_features_plan_less_than_resident(partitioned):
    directory = partitioned("synthetic:arxiv", 2)
    meta = load_meta(directory)
    shape = part_shapes(directory)[0]
    model = ModelConfig(hidden=256, num_layers=3)
    resident = plan_part(shape, PlanConfig(model=model), meta.num_features, meta.num_classes)
    sequential = plan_part(shape, PlanConfig(model=model, halo_memory="sequential"), meta.num_features,
                           meta.num_classes)
    low = plan_part(shape, PlanConfig(model=model, feature_dtype="bf16"), meta.num_features, meta.num_classes)
    assert sequential.peak < resident.peak and low.peak < resident.peak
    assert "halo rows" in resident.parts or "exchange buffers" in resident.parts


def test_schedules_that_keep_halo_rows_between_epochs_plan_their_caches(partitioned, monkeypatch):
    # the caches alone: exact exchanges blocking, as in the layers the other schedules take over
    monkeypatch.setenv(OVERLAP_ENV, "0")
    directory = partitioned("synthetic:tiny", 2)
    meta = load_meta(directory)
    shape = part_shapes(directory)[0]
    model = ModelConfig(hidden=32, num_layers=3)   # exchanged widths 32 and 4 (the classes)
    specs = ("exact", "stale:4", "pipeline:0.95", "pipeline", "stale:4,pipeline", "adaptive:0.1", "bns:0.1")
    plans = {spec: plan_phases(shape, PlanConfig(model=model, schedule=spec), meta.num_features,
                               meta.num_classes)["train"] for spec in specs}
    h, S = shape.halo, shape.sent
    assert plans["stale:4"].peak - plans["exact"].peak == h * (32 + 4) * 4
    # pipeline: halo rows in use and arriving, gradients sent back (h each); gradients in use and arriving, rows
    # sent (S each), all alive while an epoch's transfers are in flight
    assert plans["pipeline:0.95"].peak - plans["exact"].peak == (3 * h + 3 * S) * (32 + 4) * 4
    # plain pipeline exchanges its last layer (the 4-wide class scores) exactly: only the 32-wide layer caches
    assert plans["pipeline"].peak - plans["exact"].peak == (3 * h + 3 * S) * 32 * 4
    # per layer: the 32-wide layer keeps stale's cache, the 4-wide one pipeline's
    assert plans["stale:4,pipeline"].peak - plans["exact"].peak == (h * 32 + (3 * h + 3 * S) * 4) * 4
    # adaptive on GCN: the rows last sent (a skipped block is absent, not reused), and five floats per owned row
    # (R_i and the factors of the last four patterns of absent blocks)
    assert plans["adaptive:0.1"].peak - plans["exact"].peak == S * (32 + 4) * 4 + 5 * 4 * shape.owned
    # bns: a keep mask per sent and halo row, and three floats per owned row (R_i and two epochs' factors)
    assert plans["bns:0.1"].peak - plans["exact"].peak == S + h + 3 * 4 * shape.owned
    # adaptive on GAT: an attention layer reuses the rows last received for a skipped block, so it keeps those too
    gat = ModelConfig(model="gat", hidden=8, heads=2, num_layers=3)
    gat_plans = {spec: plan_phases(shape, PlanConfig(model=gat, schedule=spec), meta.num_features,
                                   meta.num_classes)["train"] for spec in ("exact", "adaptive:0.1")}
    # the rows a GAT layer sends are [x W | a_src]: 2 heads of 8 and a score per head, then the last layer's one
    # head of class scores and its score
    widths = (2 * 8 + 2, meta.num_classes + 1)
    assert gat_plans["adaptive:0.1"].peak - gat_plans["exact"].peak == \
        (S + h) * sum(widths) * 4 + 5 * 4 * shape.owned


def _ranks(*predicted_gib, host="a", available_gib=8.0, current_gib=0.5):
    return [RankMemory(host, int(p * GIB), "x", int(current_gib * GIB), int(available_gib * GIB))
            for p in predicted_gib]


def test_refusal_with_a_limit_names_the_rank_and_the_fixes():
    assert memory_refusal(_ranks(1.0, 2.0), limit=3 * GIB) is None
    reason = memory_refusal(_ranks(1.0, 4.0), limit=3 * GIB)
    assert reason.startswith("rank 1 would need about 4.00 GiB") and "--halo-memory sequential" in reason


def test_refusal_without_a_limit_sums_the_ranks_of_each_host():
    # two ranks needing 3.5 GiB more each fit a host with 8 GiB available, three do not
    assert memory_refusal(_ranks(4.0, 4.0), limit=None) is None
    assert "the 3 ranks on a would need about 10.50 GiB more" in memory_refusal(_ranks(4.0, 4.0, 4.0), limit=None)
    # the same three ranks spread over two hosts fit
    spread = _ranks(4.0, 4.0) + _ranks(4.0, host="b")
    assert memory_refusal(spread, limit=None) is None


def test_inspect_reports_the_memory_plan_per_rank(partitioned):
    directory = partitioned("synthetic:tiny", 2)
    done = run_cli("inspect", str(directory), "--json", "--hidden", "32", "--halo-memory", "sequential")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["memory_plan"]
    meta = load_meta(directory)
    expected = [plan_part(s, PlanConfig(model=ModelConfig(hidden=32), halo_memory="sequential"), meta.num_features,
                          meta.num_classes).peak for s in part_shapes(directory)]
    assert plan["predicted_peak_rss_bytes_per_rank"] == expected
    assert plan["predicted_peak_rss_bytes"] == max(expected)
    assert plan["device"] == "cpu" and "predicted_peak_device_bytes" not in plan
    # --device cuda (inspect needs no GPU): the host's plan per rank, and the device's beside it
    done = run_cli("inspect", str(directory), "--json", "--hidden", "32", "--device", "cuda")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["memory_plan"]
    on_gpu = PlanConfig(model=ModelConfig(hidden=32), device="cuda")
    shapes = part_shapes(directory)
    assert plan["predicted_peak_rss_bytes_per_rank"] == [
        plan_host(s, on_gpu, meta.num_features, meta.num_classes).peak for s in shapes]
    assert plan["predicted_peak_device_bytes_per_rank"] == [
        plan_part(s, on_gpu, meta.num_features, meta.num_classes).peak for s in shapes]


def test_train_refuses_to_start_when_the_plan_exceeds_the_memory_limit(partitioned, tmp_path):
    directory = partitioned("synthetic:tiny", 2)
    metrics = tmp_path / "m.jsonl"
    done = run_mpi(2, "train", "--parts", str(directory), "--epochs", "2", "--memory-limit", "100M",
                   "--metrics-out", str(metrics))
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "over --memory-limit 0.10 GiB" in errors[0], done.stderr
    assert not metrics.exists()
    # the same job under a limit it fits trains, and its record says what the plan predicted beside the peaks
    done = run_mpi(2, "train", "--parts", str(directory), "--epochs", "1", "--memory-limit", "4G", "--no-progress",
                   "--metrics-out", str(metrics))
    assert done.returncode == 0, done.stderr
    final = json.loads(metrics.read_text().splitlines()[-1])
    meta = load_meta(directory)
    assert final["planned_peak_rss_bytes_per_rank"] == [
        plan_part(s, PlanConfig(), meta.num_features, meta.num_classes).peak for s in part_shapes(directory)]
    assert final["planned_device_bytes_per_rank"] is None and final["staging_host_bytes_per_rank"] is None
