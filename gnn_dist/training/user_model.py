"""`gnn-dist train --model MODULE_OR_FILE:NAME`: a user's PyG model under the command line's epoch loop.

The model is built as the user would build it in one process: torch seeded with --seed, then
NAME(in_channels=, hidden_channels=, num_layers=, out_channels=, dropout=) (PyG's basic models' keywords;
those NAME does not take are left out, --model-kwargs adds or overrides), so `--model
torch_geometric.nn.models:GIN` trains PyG's GIN from the weights the same call makes in one process. It runs
through gd.distribute (gnn_dist.pyg): exact at any P under --schedule exact, the same keyed dropout, the
same schedules and wire formats of the exchanges. The loop is gnn-dist train's: Adam, evaluation every
--eval-every epochs, the metrics records and TensorBoard scalars, the divergence guard of lossy schedules,
the watchdog, checkpoints (one file per epoch, DIR/model-epoch-NNNNNN.pt, gd.save's format) and --resume from
them at any P, which is what `gnn-dist supervise` restarts.

What gnn-dist cannot do for a model it does not see inside is refused in one line before anything starts
(TrainConfig.validate): sampled mode and the link task (not yet), sequential halos, the memory plan
(--memory-limit) and the options that shape the built-in models only.
"""
from __future__ import annotations

import inspect
import json
import time
from pathlib import Path

import torch

from gnn_dist.config import TrainConfig
from gnn_dist.context import RankContext, SetupError
from gnn_dist.log import rank_logger
from gnn_dist.memory.rss import PhasePeaks, release_free_heap
from gnn_dist.metrics import MetricsWriter, summarise
from gnn_dist.partition.format import load_meta
from gnn_dist.pyg import checkpoint, reductions
from gnn_dist.pyg.loader import NeighborLoader
from gnn_dist.pyg.model_spec import BASIC_KEYWORDS, build_model, model_callable
from gnn_dist.pyg.model_spec import model_keywords as keywords_for
from gnn_dist.pyg.part_data import load_partition
from gnn_dist.pyg.wrapper import distribute, refusal
from gnn_dist.resilience.faults import maybe_inject_failure
from gnn_dist.resilience.supervise import first_num_parts, restarts_so_far
from gnn_dist.resilience.watchdog import NoWatchdog, Watchdog
from gnn_dist.schedules import parse_schedule
from gnn_dist.steps.evaluation import majority_rate
from gnn_dist.steps.full_batch import check_finite
from gnn_dist.steps.state import max_over_ranks, sum_over_ranks
from gnn_dist.tasks.base import best_record
from gnn_dist.training.guard import DivergenceGuard
from gnn_dist.training.reports import memory_report
from gnn_dist.training.setup import agree_on_setup, check_writable


def model_keywords(config: TrainConfig, in_channels: int, out_channels: int) -> dict:
    """What --model MODULE:NAME is built with: the basic five it takes, filled from the options, then
    --model-kwargs."""
    basic = dict(zip(BASIC_KEYWORDS, (in_channels, config.model.hidden, config.model.num_layers, out_channels,
                                      config.model.dropout)))
    return keywords_for(model_callable(config.model.model), basic, config.model.user_model_kwargs())


def seeded_model(config: TrainConfig, data):
    """The user's model, seeded as one process would seed it (rank 0's weights are broadcast anyway), checked
    by gd.distribute's rules."""
    keywords = model_keywords(config, data.num_features, data.num_classes)
    torch.manual_seed(config.seed)
    model = build_model(config.model.model, keywords)
    why = refusal(model, data, config.schedule)
    if why is not None:
        raise ValueError(why)
    return model


def _parameters(module: torch.nn.Module) -> dict:
    """The names the module's forward takes (none where it has no signature to read)."""
    try:
        return dict(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return {}


def forward_keywords(module: torch.nn.Module, data) -> dict:
    """The partition's edge arrays, passed where the model's forward names them (edge_weight, edge_attr)."""
    accepted = _parameters(module)
    return {name: getattr(data, name) for name in ("edge_weight", "edge_attr")
            if name in accepted and getattr(data, name, None) is not None}


class UserModelRun:
    """One rank's run of a user's model: the data, the wrapped model, its optimizer, and the loop's state."""

    def __init__(self, ctx: RankContext, config: TrainConfig, metrics: MetricsWriter, watchdog):
        self.ctx, self.config, self.metrics, self.watchdog = ctx, config, metrics, watchdog
        self.meta = load_meta(config.parts)
        self.data = load_partition(config.parts, ctx)
        module = agree_on_setup(ctx, lambda: seeded_model(config, self.data))
        self.model = distribute(module, self.data, schedule=config.schedule, halo_dtype=config.halo_dtype)
        self.exchanger = self.model.graph.exchanger
        self.exchanger.beat = watchdog.beat
        self.inputs = forward_keywords(module, self.data)
        # lazy widths take their values in a first forward (gd.distribute broadcasts them); Adam needs them first
        if any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in module.parameters()):
            with torch.no_grad():
                self.model.eval()
                self.model(self.data.x, self.data.edge_index, **self.inputs)
            self.exchanger.counters.reset()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        # --mode sampled: mini-batches of gd.NeighborLoader (the draws of the built-in models' sampled mode) train
        # the module through a second wrapper without data; the full-batch one evaluates it exactly
        self.loader = self.sampled = None
        if config.mode == "sampled":
            self.loader = NeighborLoader(self.data, list(config.sampled.fanouts), input_nodes=self.data.train_mask,
                                         batch_size=config.sampled.batch_size, shuffle=True, seed=config.seed)
            self.sampled = distribute(module)
            self.trims = {"num_sampled_nodes_per_hop", "num_sampled_edges_per_hop"} <= set(_parameters(module))
        self.val_majority_rate = majority_rate(ctx, self.data.y[self.data.val_mask], self.data.num_classes)
        schedule = parse_schedule(config.schedule)
        lossy = any(s.kind != "exact" for s in getattr(schedule, "layers", (schedule,)))
        self.guard = DivergenceGuard(majority_rate=self.val_majority_rate) \
            if lossy and config.schedule_guard == "on" else None
        self.start_epoch, self.records = 0, []
        self.identity = self._identity()

    def _identity(self) -> dict:
        """What a checkpoint records of the run, checked on resume: the graph, the model and how it was built."""
        return {"dataset": self.meta.dataset, "num_nodes": int(self.meta.num_nodes), "model": self.config.model.model,
                "keywords": json.dumps(model_keywords(self.config, self.data.num_features, self.data.num_classes),
                                       sort_keys=True)}

    # -- one epoch ------------------------------------------------------------------------------------------
    def train_step(self, epoch: int) -> float:
        if self.loader is not None:
            return self.sampled_epoch(epoch)
        model, data = self.model, self.data
        model.train()
        self.optimizer.zero_grad()
        out = model(data.x, data.edge_index, **self.inputs)
        loss = reductions.cross_entropy(out, data.y, data.train_mask)
        loss.backward()
        value = float(loss.detach())
        self.optimizer.step()
        return value

    def sampled_epoch(self, epoch: int) -> float:
        """One pass over the loader: a step per batch; returns the mean of the steps' global losses."""
        model, losses = self.sampled, []
        model.train()
        self.loader.set_epoch(epoch)
        for batch in self.loader:
            self.optimizer.zero_grad()
            trim = {"num_sampled_nodes_per_hop": batch.num_sampled_nodes,
                    "num_sampled_edges_per_hop": batch.num_sampled_edges} if self.trims else {}
            out = model(batch.x, batch.edge_index, **trim)[:batch.batch_size]
            loss = reductions.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            losses.append(float(loss.detach()))
            self.optimizer.step()
        return sum(losses) / max(len(losses), 1)

    def sampled_bytes(self) -> int:
        """What the loader's sampling and row fetches sent since the last call (0 full-batch)."""
        if self.loader is None:
            return 0
        counters = self.loader.sampler.counters
        sent = counters.sample_bytes + counters.feature_bytes
        counters.reset()
        return sent

    def evaluate(self) -> dict:
        model, data = self.model, self.data
        model.eval()
        with torch.no_grad():
            out = model(data.x, data.edge_index, **self.inputs)
        return {f"{name}_acc": reductions.accuracy(out, data.y, getattr(data, f"{name}_mask"))
                for name in ("train", "val", "test")}

    def run_epochs(self) -> list[dict]:
        config, ctx, counters, beat = self.config, self.ctx, self.exchanger.counters, self.watchdog.beat
        records = list(self.records)
        last_eval = {k: records[-1][k] for k in ("train_acc", "val_acc", "test_acc")} if records \
            else dict.fromkeys(("train_acc", "val_acc", "test_acc"), 0.0)
        for epoch in range(self.start_epoch, config.epochs):
            maybe_inject_failure(ctx.rank, epoch)
            if self.guard is not None:
                self.exchanger.guard_exact = self.guard.exact_now(epoch)
            counters.reset()
            beat(f"epoch {epoch}: training step")
            start = time.perf_counter()
            loss = self.train_step(epoch)
            check_finite(loss, epoch)
            epoch_s = time.perf_counter() - start
            trained = counters.take()
            trained.halo_bytes += self.sampled_bytes()
            evaluated = (epoch + 1) % config.eval_every == 0 or epoch == config.epochs - 1
            eval_start = time.perf_counter()
            if evaluated:
                beat(f"epoch {epoch}: evaluation")
                last_eval = self.evaluate()
            eval_s = time.perf_counter() - eval_start
            evaluation = counters.take()
            halo_bytes, halo_rows, allreduce_bytes, skipped, eval_halo_bytes = sum_over_ranks(
                ctx, [trained.halo_bytes, trained.halo_rows, trained.allreduce_bytes, trained.halo_rows_skipped,
                      evaluation.halo_bytes])
            slowest = max_over_ranks(ctx, [epoch_s, trained.comm_s, trained.wait_s, epoch_s - trained.comm_s, eval_s])
            if self.guard is not None:
                line = self.guard.observe(epoch, loss, last_eval["val_acc"] if evaluated else None)
                if line is not None:
                    self.exchanger.schedule.drain(self.exchanger)
                    self.exchanger.schedule.reset()
                    if ctx.is_root:
                        rank_logger(None).warning(line)
            record = {"epoch": epoch, "loss": loss, **last_eval, "guard_exact": self.exchanger.guard_exact,
                      "epoch_s": slowest[0], "comm_s": slowest[1], "wait_s": slowest[2], "compute_s": slowest[3],
                      "eval_s": slowest[4], "halo_bytes": int(halo_bytes), "halo_rows": int(halo_rows),
                      "halo_rows_skipped": int(skipped), "eval_halo_bytes": int(eval_halo_bytes),
                      "allreduce_bytes": int(allreduce_bytes)}
            records.append(record)
            self.metrics.write(record)
            if config.checkpoint_dir and ((epoch + 1) % config.checkpoint_every == 0 or epoch == config.epochs - 1):
                beat(f"epoch {epoch}: checkpoint")
                self.save_checkpoint(epoch + 1, records)
        return records

    # -- checkpoints ----------------------------------------------------------------------------------------
    def save_checkpoint(self, epoch: int, records: list[dict]) -> None:
        directory = Path(self.config.checkpoint_dir)
        run = {**self.identity, "epoch": epoch, "records": json.dumps(records),
               "guard": json.dumps(self.guard.state_dict()) if self.guard is not None else ""}
        checkpoint.save(checkpoint.epoch_file(directory, epoch), self.model, self.optimizer, run=run)
        if self.ctx.is_root:
            for old in checkpoint.epoch_files(directory)[:-self.config.keep_checkpoints]:
                old.unlink(missing_ok=True)

    def resume(self) -> None:
        """Continue from the newest checkpoint in --checkpoint-dir, at any P (every rank reads the same file)."""
        directory = Path(self.config.checkpoint_dir)
        newest = agree_on_setup(self.ctx, lambda: self._newest_checkpoint(directory))
        if newest is None:
            if self.ctx.is_root:
                rank_logger(None).warning(f"no complete checkpoint in {directory}: starting at epoch 0")
            return
        state = agree_on_setup(self.ctx, lambda: self._check(newest, checkpoint.read(newest)))
        run = checkpoint.restore(state, self.model, self.optimizer, newest)
        self.start_epoch, self.records = int(run["epoch"]), json.loads(run["records"])
        if self.guard is not None and run.get("guard"):
            self.guard.load_state_dict(json.loads(run["guard"]))
        if self.ctx.is_root:
            rank_logger(None).warning(f"resuming at epoch {self.start_epoch} from {newest}")
        for record in self.records:
            self.metrics.write(record)

    @staticmethod
    def _newest_checkpoint(directory: Path) -> Path | None:
        found = checkpoint.epoch_files(directory)
        if not found and any(directory.glob("epoch-*")):
            raise ValueError(f"{directory} holds checkpoints of a built-in model, not of --model MODULE:NAME: "
                             f"resume with the --model that wrote them, or give another --checkpoint-dir")
        return found[-1] if found else None

    def _check(self, path: Path, state: dict) -> dict:
        """state (checkpoint.read's), once its run is this run's graph and model."""
        run = state.get("run") or {}
        for key, value in self.identity.items():
            if run.get(key) != value:
                raise ValueError(f"{path} was written for {key} {run.get(key)!r}, not {value!r}: resume with the "
                                 f"same graph and --model (any number of ranks), or give another --checkpoint-dir")
        return state


def train_user_model(ctx: RankContext, config: TrainConfig, memory: PhasePeaks) -> dict:
    """Train a --model MODULE_OR_FILE:NAME on this rank's part; returns the final record (the same on every rank)."""
    torch.set_num_threads(config.threads)

    def check_local():
        config.validate()
        ctx.check_num_parts(load_meta(config.parts).num_parts, config.parts)
        if config.checkpoint_dir:
            check_writable(config.checkpoint_dir, "--checkpoint-dir")
        return MetricsWriter(config.metrics_out if ctx.is_root else None,
                             tensorboard=config.tensorboard if ctx.is_root else None)

    metrics = agree_on_setup(ctx, check_local)
    watchdog = Watchdog(config.timeout, ctx.rank, ctx.comm.abort) \
        if config.timeout != 0 and ctx.comm.aborts_job else NoWatchdog()
    complete = False
    try:
        watchdog.beat("set-up: the partition and the model")
        try:
            run = UserModelRun(ctx, config, metrics, watchdog)
        except ValueError as err:  # raised alike on every rank (gd.distribute's checks): the input is refused
            raise SetupError(str(err)) from None
        if config.resume:
            run.resume()
        release_free_heap()
        memory.enter("train")
        records = run.run_epochs()
        run.exchanger.drain()
        best = best_record(records, "val_acc")
        final = summarise(records, {
            "dataset": run.meta.dataset, "task": "node", "num_parts": ctx.size, "mode": config.mode,
            "schedule": config.schedule, "halo_dtype": config.halo_dtype, "model": config.model.model,
            "model_kwargs": config.model.model_kwargs, "paths": run.model.paths(), "hidden": config.model.hidden,
            "num_layers": config.model.num_layers, "seed": config.seed, "threads": config.threads,
            "resumed_from_epoch": run.start_epoch, "epochs_run": config.epochs - run.start_epoch,
            "restarts": restarts_so_far(), "first_num_parts": first_num_parts() or ctx.size,
            "simulated_link": None, "schedule_guard": config.schedule_guard if run.guard is not None else "off",
            "guard_epochs": run.guard.guard_epochs if run.guard is not None else 0,
            **memory_report(ctx, memory), "device": "cpu",
            # gnn-dist plans the memory of its own models; a model it does not see inside has no plan
            "planned_peak_rss_bytes_per_rank": None,
        }, {"test_acc": records[-1]["test_acc"] if records else None,
            "best_val_acc": best["val_acc"] if best else None,
            "test_acc_at_best_val": best["test_acc"] if best else None,
            "val_majority_rate": run.val_majority_rate})
        metrics.write(final)
        complete = True
        return final
    finally:
        watchdog.stop()
        metrics.close(complete)
