"""The epoch loop and `train()`: training step, evaluation, metrics, checkpoints and the final record.

The loop is the same for every mode: the mode (gnn_dist.steps.mode)
trains one epoch, then the loop evaluates, reduces the epoch's figures over
ranks, writes the metrics record and, on schedule, a checkpoint.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from gnn_dist.comm.peers import PeerMonitor
from gnn_dist.comm.simulated_link import LinkModel
from gnn_dist.comm.staging import staging_host_bytes
from gnn_dist.config import TrainConfig, is_user_model
from gnn_dist.context import RankContext
from gnn_dist.device import peak_device_bytes
from gnn_dist.log import rank_logger
from gnn_dist.memory.rss import PhasePeaks, release_free_heap, use_workspace
from gnn_dist.metrics import summarise
from gnn_dist.options import profile_range
from gnn_dist.resilience.checkpoint import save_checkpoint
from gnn_dist.resilience.faults import maybe_inject_failure
from gnn_dist.resilience.supervise import first_num_parts, restarts_so_far
from gnn_dist.steps.evaluation import write_predictions
from gnn_dist.steps.state import RankState, max_over_ranks, sum_over_ranks
from gnn_dist.training.reports import memory_report
from gnn_dist.training.setup import setup


def run_epochs(state: RankState) -> list[dict]:
    ctx, config, counters = state.ctx, state.config, state.exchanger.counters
    bar = None
    if config.progress and ctx.is_root:
        from tqdm import tqdm

        bar = tqdm(total=config.epochs, desc=f"train P={ctx.size}", unit="epoch", dynamic_ncols=True)
    records: list[dict] = list(state.records)
    if bar is not None:
        bar.update(state.start_epoch)
    task = state.task
    # The task's figures of the last evaluation, repeated in the epochs between evaluations (--eval-every).
    last_eval = {k: records[-1][k] for k in task.epoch_keys} if records else dict.fromkeys(task.epoch_keys, 0.0)
    beat = state.watchdog.beat
    tracer = EpochTracer(config.profile, config.profile_epochs, ctx.rank) if config.profile else None
    for epoch in range(state.start_epoch, config.epochs):
        maybe_inject_failure(ctx.rank, epoch)
        if tracer is not None:
            tracer.before(epoch)
        enter_phase(state, "train")
        if state.guard is not None:
            state.exchanger.guard_exact = state.guard.exact_now(epoch)
        counters.reset()
        beat(f"epoch {epoch}: training step")
        start = time.perf_counter()
        figures = state.mode.train_epoch(epoch)
        loss = figures["loss"]
        state.epochs_run += 1
        epoch_s = time.perf_counter() - start
        trained = counters.take()
        eval_start = time.perf_counter()
        evaluated = (epoch + 1) % config.eval_every == 0 or epoch == config.epochs - 1
        if evaluated:
            beat(f"epoch {epoch}: evaluation")
            enter_phase(state, "eval")
            last_eval = task.evaluate(state)
            enter_phase(state, "train")
        eval_s = time.perf_counter() - eval_start
        evaluation = counters.take()
        # The epoch's figures are summed over ranks under the training phase's limit: a link cut here must end the
        # job as soon as one cut inside the training step does, not after evaluation's longer limit.
        beat(f"epoch {epoch}: training step: summing the epoch's figures over ranks")
        halo_bytes, halo_rows, allreduce_bytes, rows_skipped, eval_halo_bytes = sum_over_ranks(
            ctx, [trained.halo_bytes, trained.halo_rows, trained.allreduce_bytes, trained.halo_rows_skipped,
                  evaluation.halo_bytes])
        slowest = max_over_ranks(ctx, [epoch_s, trained.comm_s, trained.wait_s, epoch_s - trained.comm_s, eval_s])
        if state.guard is not None:
            watch_divergence(state, epoch, loss, last_eval[task.best_key] if evaluated else None)
        record = {
            "epoch": epoch, "loss": loss, **last_eval,
            "guard_exact": state.exchanger.guard_exact,
            "epoch_s": slowest[0], "comm_s": slowest[1], "wait_s": slowest[2], "compute_s": slowest[3],
            "eval_s": slowest[4],
            "halo_bytes": int(halo_bytes), "halo_rows": int(halo_rows), "halo_rows_skipped": int(rows_skipped),
            "eval_halo_bytes": int(eval_halo_bytes),
            "allreduce_bytes": int(allreduce_bytes),
            **task.traffic_figures(ctx, trained, evaluation),
            **state.mode.epoch_metrics(figures, epoch_s),
        }
        records.append(record)
        state.metrics.write(record)
        # Every checkpoint_every epochs, and after the last one, so a finished run can be continued with more --epochs.
        if config.checkpoint_dir and ((epoch + 1) % config.checkpoint_every == 0 or epoch == config.epochs - 1):
            beat(f"epoch {epoch}: checkpoint")
            save_checkpoint(state, config.checkpoint_dir, epoch + 1, records, config.keep_checkpoints)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", val=f"{last_eval[task.best_key]:.3f}",
                            MB=f"{halo_bytes / 1e6:.1f}", refresh=False)
            bar.update(1)
        if tracer is not None:
            tracer.after(epoch)
    if tracer is not None:
        tracer.close()
    if bar is not None:
        bar.close()
    return records


class EpochTracer:
    """--profile DIR --profile-epochs A:B: torch.profiler over epochs A..B-1 (training and evaluation), one
    Chrome/Perfetto trace per rank, DIR/trace-rank-NNNNN.json (named by rank, so ranks never overwrite each
    other's). The spans that matter are named where they run: halo exchange, wait, spmm, dense, allreduce and
    optimizer step."""

    def __init__(self, directory: str, epochs: str, rank: int):
        self.epochs = profile_range(epochs)
        self.path = Path(directory) / f"trace-rank-{rank:05d}.json"
        self.profiler = None

    def before(self, epoch: int) -> None:
        if epoch == self.epochs.start:
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profiler.start()

    def after(self, epoch: int) -> None:
        if self.profiler is not None and epoch == self.epochs.stop - 1:
            self.close()

    def close(self) -> None:
        if self.profiler is None:
            return
        self.profiler.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        self.profiler.export_chrome_trace(str(partial))
        os.replace(partial, self.path)
        self.profiler = None


def watch_divergence(state: RankState, epoch: int, loss: float, val_figure: float | None) -> None:
    """Tell the guard this epoch's figures; when it fires, the schedule's caches go (the exchange is exact for the
    guard's window, then the schedule starts afresh). Every rank decides alike: the figures are global."""
    line = state.guard.observe(epoch, loss, val_figure)
    if line is None:
        return
    state.exchanger.schedule.drain(state.exchanger)
    state.exchanger.schedule.reset()
    if state.ctx.is_root:
        rank_logger(None).warning(line)


def enter_phase(state: RankState, phase: str) -> None:
    """Start `phase`. The heap is trimmed only when the phase changes: what one phase freed must not stay
    resident under the next phase's peak, but an epoch frees the very tensors the next epoch of its phase
    allocates again, so trimming between them only hands back pages to be faulted in and zero-filled anew
    (on ACM's R-GCN about 2,100 page faults and 14% of every epoch; benchmarks/results/hetero-dgl-speed.md)."""
    if state.memory is not None and state.memory.phase == phase:
        return
    release_free_heap()
    if state.memory is not None:
        state.memory.enter(phase)


def device_peaks(ctx: RankContext, device) -> list[int] | None:
    """Every rank's peak device memory (torch's allocator), or None for a run on CPUs."""
    own = peak_device_bytes(device)
    return None if own is None else [int(v) for v in ctx.comm.allgather_object(own)]


def planned_report(ctx: RankContext, state: RankState) -> dict:
    """The memory plan's predictions beside the measured peaks, per rank (None where no plan was made:
    sampled mode), so a run says how far its plan was off; and the host buffers staging holds (None on CPUs)."""
    mine = (state.planned_host_bytes, state.planned_device_bytes,
            staging_host_bytes(state.exchanger.comm, getattr(state.mode, "mover", None)))
    host, on_device, staged = zip(*ctx.comm.allgather_object(mine))
    return {"planned_peak_rss_bytes_per_rank": None if None in host else [int(v) for v in host],
            "planned_device_bytes_per_rank": None if None in on_device else [int(v) for v in on_device],
            "staging_host_bytes_per_rank": None if None in staged else [int(v) for v in staged]}


def train(ctx: RankContext, config: TrainConfig) -> dict:
    """Train on this rank's part; returns the final record (the same on every rank)."""
    use_workspace()
    memory = PhasePeaks("setup")
    if is_user_model(config.model.model):  # a user's PyG model, through gd.distribute
        from gnn_dist.training.user_model import train_user_model

        try:
            return train_user_model(ctx, config, memory)
        finally:
            memory.stop()
    # Real MPI jobs only: simulated ranks share one process, which nothing can lose alone.
    peers = PeerMonitor.start(ctx.comm) if ctx.comm.aborts_job else None
    try:
        state = setup(ctx, config, peers)
    except BaseException:
        memory.stop()
        if peers is not None:
            peers.close(failing=True)
        raise
    state.memory = memory
    complete = False
    try:
        records = run_epochs(state)
        state.exchanger.drain()
        if config.predictions_out:
            enter_phase(state, "eval")
            write_predictions(state, config.predictions_out)
        final = summarise(records, {
            "dataset": state.dataset, "task": config.task, "num_parts": ctx.size, "mode": config.mode,
            "schedule": config.schedule,
            "halo_dtype": config.halo_dtype, "model": config.model.model, "hidden": config.model.hidden,
            "num_layers": config.model.num_layers, "seed": config.seed, "threads": config.threads,
            "eval_chunk_nodes": config.eval_chunk_nodes, "halo_memory": config.halo_memory,
            "halo_block_rows": config.halo_block_rows, "feature_dtype": config.feature_dtype,
            "setup_halo_bytes": int(state.setup_halo_bytes),
            "resumed_from_epoch": state.start_epoch, "epochs_run": state.epochs_run, "restarts": restarts_so_far(),
            "first_num_parts": first_num_parts() or ctx.size,
            "simulated_link": LinkModel.parse(config.simulate_link).label() if config.simulate_link else None,
            "schedule_guard": config.schedule_guard if state.guard is not None else "off",
            "guard_epochs": state.guard.guard_epochs if state.guard is not None else 0,
            **memory_report(ctx, memory),
            "device": config.device,
            # the same on every rank: set-up opened shared memory on all of them or on none
            "halo_exchange": "shared memory" if state.exchanger.shared is not None and state.exchanger.shared.used
            else "communicator",
            "peak_device_bytes_per_rank": device_peaks(ctx, state.device),
            **planned_report(ctx, state),
        }, state.task.final_figures(state, records))
        state.metrics.write(final)
        complete = True
        return final
    finally:
        memory.stop()
        state.watchdog.stop()
        if state.peers is not None:
            state.peers.close(failing=not complete)
        state.metrics.close(complete)
