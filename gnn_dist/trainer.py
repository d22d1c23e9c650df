"""Full-batch distributed training: set-up, the epoch loop, evaluation and metrics.

P-invariance (the `exact` schedule reproduces one process on the whole graph):
- initial weights come from the same seed and are broadcast from rank 0;
- the loss is the sum over owned training nodes divided by the global number
  of training nodes, and gradients are summed across ranks (one Allreduce of
  one flat buffer per step, which also carries the loss);
- dropout masks are keyed by (seed, epoch, layer, original node id).

Failure: set-up problems (missing or corrupt part file, wrong rank count,
unwritable metrics file) are agreed on by all ranks before the first
collective, so rank 0 can report them once and every rank exits cleanly.
Anything raised later is fatal to the job (see gnn_dist.cli).
"""
from __future__ import annotations

import dataclasses
import math
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gnn_dist.checkpoint import load_checkpoint, save_checkpoint
from gnn_dist.codec import HALO_DTYPES, make_codec
from gnn_dist.comm import first_failure
from gnn_dist.context import RankContext, SetupError
from gnn_dist.flat import pack_into, unpack_from
from gnn_dist.halo import HaloExchanger, HaloPlan
from gnn_dist.memory import (PhasePeaks, current_rss_bytes, peak_rss_bytes, release_free_heap,
                             return_large_blocks_on_free)
from gnn_dist.metrics import MetricsWriter, summarise
from gnn_dist.model import FEATURE_DTYPES, DistGNN, LocalGraph, ModelConfig
from gnn_dist.plan import (RankMemory, available_memory_bytes, memory_refusal, part_shape, plan_config_of,
                           plan_part)
from gnn_dist.sampled import SampledConfig, SampledRun
from gnn_dist.schedules import ExactSchedule, StaleSchedule, parse_schedule
from gnn_dist.sequential import DEFAULT_HALO_BLOCK_ROWS, HALO_MEMORY_MODES
from gnn_dist.watchdog import NoWatchdog, Watchdog
from gnn_dist.kernels.native import native_module
from gnn_dist.partition.format import load_meta, load_part

MODES = ("full", "sampled")
DEFAULT_EVAL_CHUNK_NODES = 16384  # rows per chunk: 16 MiB per temporary at width 256, a small share of a layer
FAIL_AT_ENV = "GNN_DIST_FAIL_AT"  # "RANK:EPOCH[:hang]": raise (or hang) on that rank at that epoch (failure tests)


class TrainingDiverged(SetupError):
    """The (globally reduced) loss is NaN or infinite; every rank sees the same value."""


@dataclass(frozen=True)
class TrainConfig:
    parts: str
    model: ModelConfig = field(default_factory=ModelConfig)
    mode: str = "full"
    schedule: str = "exact"
    halo_dtype: str = "fp32"
    epochs: int = 200
    lr: float = 0.01
    weight_decay: float = 5e-4
    seed: int = 0
    threads: int = 1
    eval_every: int = 1
    metrics_out: str | None = None
    progress: bool = True
    checkpoint_dir: str | None = None
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    resume: bool = False
    timeout: float = 600.0  # seconds without progress before the watchdog aborts the job; 0 disables
    predictions_out: str | None = None  # .npy of every node's predicted class, by original id (rank 0 writes)
    # Evaluation runs layer by layer over the owned nodes in chunks of this many rows (gnn_dist.model.
    # DistGNN.forward_layerwise): memory is one layer's activations plus a chunk, never a whole forward.
    eval_chunk_nodes: int = DEFAULT_EVAL_CHUNK_NODES
    # resident: each layer receives its whole halo at once; sequential: block by block (gnn_dist.sequential).
    halo_memory: str = "resident"
    halo_block_rows: int = DEFAULT_HALO_BLOCK_ROWS  # sequential: most halo rows received at once (0: a peer's block)
    feature_dtype: str = "fp32"  # storage of the input features (owned and cached halo); upcast to fp32 per use
    memory_limit: int | None = None  # bytes this rank may use; None: the host's MemAvailable, shared by its ranks
    sampled: SampledConfig = field(default_factory=SampledConfig)  # used with mode="sampled"

    def validate(self) -> None:
        self.model.validate()
        if self.mode not in MODES:
            raise ValueError(f"bad --mode {self.mode!r}: use --mode full or --mode sampled")
        if self.mode == "sampled":
            self.sampled.validate(self.model.num_layers)
            if self.model.batch_norm:
                raise ValueError("--batch-norm is for --mode full; sampled mini-batches train without it")
            if self.schedule != "exact" or self.halo_dtype != "fp32":
                raise ValueError("--schedule and --halo-dtype shape full-batch halo traffic: use them with --mode "
                                 "full (sampled mode fetches exact fp32 features)")
        schedule = parse_schedule(self.schedule)
        if self.halo_memory not in HALO_MEMORY_MODES:
            raise ValueError(f"bad --halo-memory {self.halo_memory!r}: use resident or sequential")
        if self.halo_memory == "sequential":
            if self.mode != "full":
                raise ValueError("--halo-memory sequential is for --mode full (sampled mode holds no layer halos)")
            if not isinstance(schedule, (ExactSchedule, StaleSchedule)):
                raise ValueError(f"--halo-memory sequential runs with --schedule exact or stale:R: {self.schedule} "
                                 f"builds whole-halo tensors each epoch; use --halo-memory resident with it")
        if self.halo_block_rows < 0:
            raise ValueError(f"--halo-block-rows must be 0 (a peer's whole block) or positive, got "
                             f"{self.halo_block_rows}")
        if self.feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"bad --feature-dtype {self.feature_dtype!r}: valid: {', '.join(FEATURE_DTYPES)}")
        if self.feature_dtype != "fp32" and self.mode != "full":
            raise ValueError("--feature-dtype is for --mode full; sampled mode keeps fp32 features")
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise ValueError(f"--memory-limit must be positive, got {self.memory_limit}")
        if self.halo_dtype not in HALO_DTYPES:
            raise ValueError(f"bad --halo-dtype {self.halo_dtype!r}: valid: {', '.join(HALO_DTYPES)}")
        if self.epochs < 0:
            raise ValueError(f"--epochs must be 0 or more, got {self.epochs}")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ValueError(f"--lr must be a positive number, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"--weight-decay must be 0 or more, got {self.weight_decay}")
        if self.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {self.threads}")
        if self.eval_every < 1:
            raise ValueError(f"--eval-every must be at least 1, got {self.eval_every}")
        if self.eval_chunk_nodes < 1:
            raise ValueError(f"--eval-chunk-nodes must be at least 1, got {self.eval_chunk_nodes}")
        if self.checkpoint_every < 1:
            raise ValueError(f"--checkpoint-every must be at least 1, got {self.checkpoint_every}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"--keep-checkpoints must be at least 1, got {self.keep_checkpoints}")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir DIR (where the checkpoints are)")
        if self.timeout < 0:
            raise ValueError(f"--timeout must be 0 (off) or positive seconds, got {self.timeout}")


@dataclass
class RankState:
    """Everything one rank holds during training, passed explicitly."""

    ctx: RankContext
    config: TrainConfig
    graph: LocalGraph
    exchanger: HaloExchanger
    x_full: torch.Tensor  # [owned | halo] input features: the halo fetched once at start-up
    model: DistGNN
    optimizer: torch.optim.Optimizer
    num_train: int
    flat: torch.Tensor  # gradient buffer (+ one slot for the loss), allocated once
    metrics: MetricsWriter
    dataset: str
    setup_halo_bytes: int
    partition_id: str
    watchdog: object
    start_epoch: int = 0
    epochs_run: int = 0  # training epochs this process executed (a resumed run skips the restored ones)
    records: list = dataclasses.field(default_factory=list)
    sampled_run: object = None
    flat_sampled: torch.Tensor | None = None
    memory: PhasePeaks | None = None  # peak RSS per phase (set by train(); absent when a test drives the steps)


def _agree_on_setup(ctx: RankContext, build) -> object:
    """Run the rank-local set-up; if any rank fails, every rank raises the same SetupError.

    This is the only point before which ranks may fail independently without
    a hang: nothing before it communicates.
    """
    try:
        result, error = build(), None
    except Exception as err:  # noqa: BLE001 - reported to all ranks below
        result, error = None, f"{err}" if isinstance(err, (ValueError, SetupError, OSError)) else f"{type(err).__name__}: {err}"
    failure = first_failure(ctx.comm, error)
    if failure:
        rank, msg, everyone_alike = failure
        raise SetupError(msg if everyone_alike else f"rank {rank}: {msg}")
    return result


def setup(ctx: RankContext, config: TrainConfig) -> RankState:
    torch.set_num_threads(config.threads)

    def build_local():
        config.validate()
        meta = load_meta(config.parts)
        ctx.check_num_parts(meta.num_parts, config.parts)
        part = load_part(config.parts, ctx.rank, meta)
        if config.checkpoint_dir:
            _check_writable(config.checkpoint_dir, "--checkpoint-dir")
        native_module()  # build (or load) the kernel now, not inside the first epoch the watchdog times
        metrics = MetricsWriter(config.metrics_out if ctx.is_root else None)
        return meta, part, metrics

    meta, part, metrics = _agree_on_setup(ctx, build_local)  # type: ignore[misc]
    if config.mode == "full":
        _refuse_if_memory_short(ctx, config, part)
    # Simulated ranks (threads of one process) have no job to abort: no watchdog there.
    watchdog = Watchdog(config.timeout, ctx.rank, ctx.comm.abort) \
        if config.timeout > 0 and ctx.comm.aborts_job else NoWatchdog()
    watchdog.beat("set-up: fetching halo input features")
    plan = HaloPlan.from_part(part)
    exchanger = HaloExchanger(ctx.comm, plan, codec=make_codec(config.halo_dtype, config.seed, ctx.rank),
                              schedule=parse_schedule(config.schedule, config.seed), beat=watchdog.beat)
    # Sampled training aggregates over its batches' blocks and evaluates chunk by chunk from the part's CSR,
    # so only full-batch training builds the whole part's operator and its transpose; sequential halos
    # build it split into column blocks instead.
    blocked_by = None
    if config.halo_memory == "sequential":
        blocked_by = (np.array(ctx.comm.allgather_object(plan.send_counts.tolist()), dtype=np.int64),
                      config.halo_block_rows)
    graph = LocalGraph.from_part(part, config.model.model, whole_operator=config.mode == "full",
                                 blocked_by=blocked_by)
    x_full = torch.cat([graph.x, exchanger.fetch_once(graph.x)])
    if config.feature_dtype != "fp32":
        x_full = x_full.to(FEATURE_DTYPES[config.feature_dtype])
    graph = dataclasses.replace(graph, x=x_full[:graph.n_owned])  # one copy of the features, not two
    if config.mode == "sampled":
        # Sampled mode keeps the part (its CSR) for sampling and evaluation: point its features at the same
        # rows too, or the part file's copy would stay resident beside x_full.
        part.arrays["x"] = graph.x.numpy()
    setup_halo_bytes = _sum_over_ranks(ctx, [exchanger.counters.halo_bytes])[0]
    exchanger.counters.reset()

    model = DistGNN(config.model, meta.num_features, meta.num_classes, graph, exchanger, config.seed)
    params = [p for p in model.parameters()]
    flat = torch.zeros(sum(p.numel() for p in params) + 1)
    # Same seed gives the same weights; the broadcast makes it true even across torch builds.
    pack_into(params, flat, grads=False)
    ctx.comm.bcast_(flat)
    unpack_from(params, flat, grads=False)
    optimizer = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    state = RankState(ctx, config, graph, exchanger, x_full, model, optimizer, meta.num_train, flat, metrics,
                      meta.dataset, setup_halo_bytes, meta.partition_id, watchdog)
    if config.mode == "sampled":
        watchdog.beat("set-up: sampler and feature cache")
        state.flat_sampled = torch.zeros(flat.numel() + 1)
        state.sampled_run = SampledRun(state, part, config.sampled)
    if config.resume:
        watchdog.beat("set-up: loading the checkpoint")
        restored = _agree_on_setup(ctx, lambda: load_checkpoint(state, config.checkpoint_dir))
        if restored is None:
            if ctx.is_root:
                print(f"gnn-dist train: no complete checkpoint in {config.checkpoint_dir}: starting at epoch 0",
                      file=sys.stderr)
        else:
            state.start_epoch, state.records = restored
            if ctx.is_root:
                print(f"gnn-dist train: resuming at epoch {state.start_epoch} from the checkpoint in "
                      f"{config.checkpoint_dir}", file=sys.stderr)
            for record in state.records:
                metrics.write(record)
    return state


def _refuse_if_memory_short(ctx: RankContext, config: TrainConfig, part) -> None:
    """Plan this rank's peak (gnn_dist.plan) and refuse on every rank, before the big allocations, if any
    host's ranks would not fit (or a rank would pass --memory-limit)."""
    plan = plan_part(part_shape(part), plan_config_of(config), part.meta.num_features, part.meta.num_classes)
    mine = RankMemory(socket.gethostname(), plan.peak, plan.summary(3), current_rss_bytes(),
                      available_memory_bytes())
    reason = memory_refusal(ctx.comm.allgather_object(mine), config.memory_limit)
    if reason is not None:
        raise SetupError(reason)


def _check_writable(directory: str, option: str) -> None:
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise SetupError(f"{option} {directory} is not writable ({err.strerror or err}): choose a directory you "
                         f"can write to") from err


def _sum_over_ranks(ctx: RankContext, values: list[float]) -> list[float]:
    buf = torch.tensor(values, dtype=torch.float64)
    if ctx.size > 1:
        ctx.comm.allreduce_(buf)
    return buf.tolist()


def _max_over_ranks(ctx: RankContext, values: list[float]) -> list[float]:
    buf = torch.tensor(values, dtype=torch.float64)
    if ctx.size > 1:
        ctx.comm.allreduce_(buf, op="max")
    return buf.tolist()


def compute_gradients(state: RankState, epoch: int) -> float:
    """Forward and backward on this rank, then gradients (and the loss) summed over ranks.

    Afterwards every rank holds the gradient of the global mean training loss;
    returns that loss.
    """
    model, graph = state.model, state.graph
    model.train()
    model.epoch = epoch
    state.optimizer.zero_grad(set_to_none=False)
    logits = model(state.x_full)
    mask = graph.train_mask
    loss = F.cross_entropy(logits[mask], graph.y[mask], reduction="sum") / state.num_train
    loss.backward()
    params = list(model.parameters())
    pack_into(params, state.flat, grads=True)
    state.flat[-1] = loss.detach()
    state.exchanger.allreduce_(state.flat)
    unpack_from(params, state.flat, grads=True)
    return float(state.flat[-1])


def train_step(state: RankState, epoch: int) -> float:
    """One epoch of full-batch training; returns the global loss."""
    global_loss = compute_gradients(state, epoch)
    if not math.isfinite(global_loss):
        raise TrainingDiverged(f"loss became {global_loss} at epoch {epoch}: lower --lr, or check the input "
                               f"features for NaN/inf")
    state.optimizer.step()
    return global_loss


@torch.no_grad()
def evaluate(state: RankState) -> dict:
    """Train/val/test accuracy over all ranks' owned nodes (fractions in [0, 1]), layer by layer in chunks."""
    state.model.eval()
    logits = state.model.forward_layerwise(state.x_full, state.config.eval_chunk_nodes)
    return accuracies(state.ctx, logits, state.graph)


def accuracies(ctx: RankContext, logits: torch.Tensor, graph: LocalGraph) -> dict:
    correct = logits.argmax(1) == graph.y
    counts = []
    for mask in (graph.train_mask, graph.val_mask, graph.test_mask):
        counts += [float(correct[mask].sum()), float(mask.sum())]
    c = _sum_over_ranks(ctx, counts)
    return {name: (c[2 * i] / c[2 * i + 1] if c[2 * i + 1] else 0.0)
            for i, name in enumerate(("train_acc", "val_acc", "test_acc"))}


def _sampled_metrics(ctx: RankContext, sampled: dict, epoch_s: float) -> dict:
    """Per-epoch figures of sampled training: traffic summed over ranks, times of the slowest rank."""
    sums = _sum_over_ranks(ctx, [sampled["sample_bytes"], sampled["feature_bytes"], sampled["cache_hits"],
                                 sampled["cache_misses"], sampled["halo_hits"]])
    slowest = _max_over_ranks(ctx, [sampled["sample_s"], sampled["fetch_s"], sampled["compute_s"]])
    sample_bytes, feature_bytes, hits, misses, halo_hits = (int(v) for v in sums)
    return {
        "halo_bytes": sample_bytes + feature_bytes, "sample_bytes": sample_bytes, "feature_bytes": feature_bytes,
        "cache_hits": hits, "cache_misses": misses, "halo_hits": halo_hits,
        "cache_hit_rate": hits / (hits + misses) if hits + misses else 1.0,
        "seeds": sampled["seeds"], "seeds_per_s": sampled["seeds"] / epoch_s if epoch_s else 0.0,
        "sample_s": slowest[0], "fetch_s": slowest[1], "compute_s": slowest[2],
    }


def _maybe_inject_failure(rank: int, epoch: int) -> None:
    spec = os.environ.get(FAIL_AT_ENV)
    if spec:
        fail_rank, fail_epoch, *mode = spec.split(":")
        if rank == int(fail_rank) and epoch == int(fail_epoch):
            if mode == ["hang"]:
                while True:  # a rank that stops making progress without any error
                    time.sleep(1)
            raise RuntimeError(f"injected failure ({FAIL_AT_ENV}={spec})")


def run_epochs(state: RankState) -> list[dict]:
    ctx, config, counters = state.ctx, state.config, state.exchanger.counters
    bar = None
    if config.progress and ctx.is_root:
        from tqdm import tqdm

        bar = tqdm(total=config.epochs, desc=f"train P={ctx.size}", unit="epoch", dynamic_ncols=True)
    records: list[dict] = list(state.records)
    if bar is not None:
        bar.update(state.start_epoch)
    last_acc = {k: records[-1][k] for k in ("train_acc", "val_acc", "test_acc")} if records else \
        {"train_acc": 0.0, "val_acc": 0.0, "test_acc": 0.0}
    beat = state.watchdog.beat
    for epoch in range(state.start_epoch, config.epochs):
        _maybe_inject_failure(ctx.rank, epoch)
        _enter_phase(state, "train")
        counters.reset()
        beat(f"epoch {epoch}: training step")
        start = time.perf_counter()
        sampled = None
        if state.sampled_run is not None:
            sampled = state.sampled_run.train_epoch(epoch)
            loss = sampled["loss"]
        else:
            loss = train_step(state, epoch)
        state.epochs_run += 1
        epoch_s = time.perf_counter() - start
        train_traffic = (counters.halo_bytes, counters.halo_rows, counters.allreduce_bytes, counters.comm_s,
                         counters.halo_rows_skipped)
        counters.reset()
        eval_start = time.perf_counter()
        beat(f"epoch {epoch}: evaluation")
        if (epoch + 1) % config.eval_every == 0 or epoch == config.epochs - 1:
            _enter_phase(state, "eval")
            last_acc = evaluate(state)
            _enter_phase(state, "train")
        eval_s = time.perf_counter() - eval_start
        halo_bytes, halo_rows, allreduce_bytes, rows_skipped, eval_halo_bytes = _sum_over_ranks(
            ctx, [train_traffic[0], train_traffic[1], train_traffic[2], train_traffic[4], counters.halo_bytes])
        slowest = _max_over_ranks(ctx, [epoch_s, train_traffic[3], eval_s])
        record = {
            "epoch": epoch, "loss": loss, **last_acc,
            "epoch_s": slowest[0], "comm_s": slowest[1], "eval_s": slowest[2],
            "halo_bytes": int(halo_bytes), "halo_rows": int(halo_rows), "halo_rows_skipped": int(rows_skipped),
            "eval_halo_bytes": int(eval_halo_bytes),
            "allreduce_bytes": int(allreduce_bytes),
        }
        if sampled is not None:
            record.update(_sampled_metrics(ctx, sampled, epoch_s))
        records.append(record)
        state.metrics.write(record)
        if config.checkpoint_dir and (epoch + 1) % config.checkpoint_every == 0:
            beat(f"epoch {epoch}: checkpoint")
            save_checkpoint(state, config.checkpoint_dir, epoch + 1, records, config.keep_checkpoints)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", val=f"{last_acc['val_acc']:.3f}",
                            MB=f"{halo_bytes / 1e6:.1f}", refresh=False)
            bar.update(1)
    if bar is not None:
        bar.close()
    return records


def _enter_phase(state: RankState, phase: str) -> None:
    release_free_heap()  # what one phase freed must not stay resident under the next phase's peak
    if state.memory is not None:
        state.memory.enter(phase)


def _memory_report(ctx: RankContext, memory: PhasePeaks) -> dict:
    """Peak RSS of every rank, and of each phase on the rank where that phase peaked (bytes).

    A rank's figure is its process's own peak (never reset, so it bounds every phase and matches what
    /usr/bin/time reports), which also covers whatever ran before train() was called.
    """
    phases = memory.stop()
    # The kernel folds per-thread RSS counters into the high-water mark lazily (every 64 page faults), so
    # an RSS sample can exceed the mark read just after it by a few pages; the peak is the larger.
    own_peak = max([peak_rss_bytes(), *phases.values()])
    per_rank = [int(v) for v in ctx.comm.allgather_object(own_peak)]
    names = ("setup", "train", "eval")
    worst = _max_over_ranks(ctx, [float(phases.get(name, 0)) for name in names])
    report = {"peak_rss_bytes": max(per_rank), "peak_rss_bytes_per_rank": per_rank}
    for name, value in zip(names, worst):
        report[f"{name}_peak_rss_bytes"] = int(value) if value else None
    return report


def train(ctx: RankContext, config: TrainConfig) -> dict:
    """Train on this rank's part; returns the final record (the same on every rank)."""
    return_large_blocks_on_free()
    memory = PhasePeaks("setup")
    try:
        state = setup(ctx, config)
    except BaseException:
        memory.stop()
        raise
    state.memory = memory
    complete = False
    try:
        records = run_epochs(state)
        state.exchanger.finish()
        if config.predictions_out:
            _enter_phase(state, "eval")
            write_predictions(state, config.predictions_out)
        final = summarise(records, {
            "dataset": state.dataset, "num_parts": ctx.size, "mode": config.mode, "schedule": config.schedule,
            "halo_dtype": config.halo_dtype, "model": config.model.model, "hidden": config.model.hidden,
            "num_layers": config.model.num_layers, "seed": config.seed, "threads": config.threads,
            "eval_chunk_nodes": config.eval_chunk_nodes, "halo_memory": config.halo_memory,
            "halo_block_rows": config.halo_block_rows, "feature_dtype": config.feature_dtype,
            "setup_halo_bytes": int(state.setup_halo_bytes),
            "resumed_from_epoch": state.start_epoch, "epochs_run": state.epochs_run,
            **_memory_report(ctx, memory),
        })
        state.metrics.write(final)
        complete = True
        return final
    finally:
        memory.stop()
        state.watchdog.stop()
        state.metrics.close(complete)


def write_predictions(state: RankState, path: str) -> None:
    """Every node's predicted class (eval mode), indexed by original id, as a plain .npy (rank 0).

    Gathers one int per node on rank 0 through the object allgather: meant for
    graphs whose label vector fits one process (scoring with OGB's Evaluator).
    """
    node_ids, logits = gather_logits(state)
    pieces = state.ctx.comm.allgather_object((node_ids.numpy(), logits.argmax(1).numpy()))
    if state.ctx.is_root:
        import numpy as np

        total = sum(ids.shape[0] for ids, _ in pieces)
        predictions = np.full(total, -1, dtype=np.int64)
        for ids, pred in pieces:
            predictions[ids] = pred
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".partial.npy")
        np.save(tmp, predictions)
        os.replace(tmp, target)


def gather_logits(state: RankState) -> tuple[torch.Tensor, torch.Tensor]:
    """(original node ids, eval-mode logits) of this rank's owned nodes; for checks and examples."""
    state.model.eval()
    return state.graph.node_ids, state.model.forward_layerwise(state.x_full, state.config.eval_chunk_nodes)


__all__ = ["TrainConfig", "RankState", "setup", "compute_gradients", "train_step", "evaluate", "run_epochs", "train",
           "TrainingDiverged", "HALO_DTYPES", "MODES"]
