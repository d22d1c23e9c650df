"""What a task owns (`Task`): the data it reads from the partition, the model's output width and head, the
training mode of each --mode, its metrics and the rule that picks the best epoch.

The runtime asks the task and never branches on its name. A task is one file under gnn_dist/tasks/ (or a
--plugin module) holding a `Task` subclass decorated with `@register_task`:

    name                      its --task NAME
    partition_task            the `--task` the partition must have been made with (meta.json's task)
    epoch_keys                the keys evaluate() returns, in every epoch record (0.0 before the first evaluation)
    best_key                  the validation key that picks the best epoch (and the guard's collapse rule watches)
    training_modes            --mode -> the TrainingMode class (gnn_dist.steps.mode), built as cls(state, part)
    output_width()            the last layer's width
    build_model(graph, exchanger, part)   the LayerStack (on a typed partition, the typed stack, which reads the
                                    part) with the task's head attached (its parameters train with it)
    prepare(state, part)      load the task's data from the part into the rank's state (before the mode is built)
    evaluate(state)           the epoch_keys, over all ranks (collective)
    traffic_figures(ctx, trained, evaluation)   the task's own traffic keys of an epoch record, from the training
                              step's and the evaluation's counters (collective)
    collapse_level(state)     the best_key value of a model that learnt nothing (the guard's collapse rule), or None
    final_figures(state, records)   the task's keys of the final record
    describe()                what a resumed run must share with the checkpoint's run (gnn_dist.resilience.checkpoint)
    final_text(final)         the task's figures in the line `gnn-dist train` prints at the end
"""
from __future__ import annotations

from typing import ClassVar

from gnn_dist.models import one_of


class Task:
    name: ClassVar[str] = ""
    partition_task: ClassVar[str] = ""
    epoch_keys: ClassVar[tuple[str, ...]] = ()
    best_key: ClassVar[str] = ""
    training_modes: ClassVar[dict] = {}
    # How the guard's line names the best_key figure and its collapse level (gnn_dist.training.guard)
    guard_names: ClassVar[dict] = {"metric": "validation accuracy", "level_name": "the majority class's rate"}

    def __init__(self, config, meta):
        self.config = config
        self.meta = meta

    def check_partition(self) -> None:
        """ValueError (one line, naming the fix) when the partition was not made for this task."""
        made_for = getattr(self.meta, "task", "node")
        if made_for != self.partition_task:
            raise ValueError(f"--parts {self.config.parts} was partitioned for --task {made_for}, not --task "
                             f"{self.name}: re-run gnn-dist partition with --task {self.partition_task} (or train "
                             f"with --task {made_for})")
        check_typed(self.config, self.meta)

    def training_mode(self, state, part):
        try:
            mode_class = self.training_modes[self.config.mode]
        except KeyError:
            raise ValueError(f"--task {self.name} trains with --mode {one_of(self.training_modes)}, not "
                             f"{self.config.mode}") from None
        return mode_class(state, part)

    def output_width(self) -> int:
        raise NotImplementedError

    def build_model(self, graph, exchanger, part=None, halo_blocking=None):
        """The rank's model: the layer stack over its graph, or on a typed partition the typed stack (its inputs
        per node type, then R-GCN layers: gnn_dist.hetero), which reads the part's typed arrays. halo_blocking:
        (the P x P send-count matrix, --halo-block-rows) under --halo-memory sequential, for the typed stack
        (a homogeneous graph's blocked operator is the graph's own)."""
        if self.meta.hetero is not None:
            from gnn_dist.hetero.stack import TypedStack

            # sampled training evaluates layer by layer from the part's CSR: no whole-part forms are built
            return TypedStack(self.config.model, self.output_width(), part, exchanger, self.config.seed,
                              layerwise=self.config.mode == "sampled", halo_blocking=halo_blocking)
        from gnn_dist.steps.layer_stack import LayerStack

        return LayerStack(self.config.model, self.meta.num_features, self.output_width(), graph, exchanger,
                          self.config.seed)

    def prepare(self, state, part) -> None:
        pass

    def evaluate(self, state) -> dict:
        raise NotImplementedError

    def traffic_figures(self, ctx, trained, evaluation) -> dict:
        return {}

    def collapse_level(self, state) -> float | None:
        return None

    def final_figures(self, state, records: list[dict]) -> dict:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"task": self.name}

    @staticmethod
    def final_text(final: dict) -> str:
        raise NotImplementedError


def best_record(records: list[dict], key: str) -> dict | None:
    """The first epoch with the highest `key` (None without epochs)."""
    return max(records, key=lambda record: record[key]) if records else None


# What training on a typed graph supports so far, each refusal naming the fix (docs/hetero.md)
_TYPED_ONLY = {"feature_dtype": ("fp32", "--feature-dtype fp32"), "predictions_out": (None, "no --predictions-out")}


def check_typed(config, meta) -> None:
    """ValueError when the model and the partition disagree on being typed, or a typed run asks what it lacks."""
    from gnn_dist.models import check_model_fits, model_class

    check_model_fits(config.model.model, meta.hetero["node_types"] if meta.hetero else None, config.parts)
    if meta.hetero is None:
        return
    if config.task != "node":
        raise ValueError(f"--task {config.task} is not defined on a typed graph yet: use --task node")
    for name, (wanted, fix) in _TYPED_ONLY.items():
        if getattr(config, name) != wanted:
            raise ValueError(f"a typed graph trains with {fix} so far (got --{name.replace('_', '-')} "
                             f"{getattr(config, name)}): use {fix}")
    if config.mode == "sampled" and config.device != "cpu":
        raise ValueError(f"sampled training of a typed graph runs on the CPU so far (got --device {config.device}): "
                         f"use --device cpu, or --mode full")
    if config.model.batch_norm:
        raise ValueError("a typed graph trains without --batch-norm so far: drop it")
    if config.halo_memory == "sequential":
        if model_class(config.model.model).attention:
            raise ValueError(f"--halo-memory sequential trains --model rgcn on a typed graph so far (got --model "
                             f"{config.model.model}): use --halo-memory resident with it")
        if config.schedule != "exact":
            raise ValueError(f"--halo-memory sequential trains a typed graph with --schedule exact so far (got "
                             f"{config.schedule}): use --schedule exact, or --halo-memory resident with it")
    if model_class(config.model.model).attention:
        check_typed_attention(config, meta)


def check_typed_attention(config, meta) -> None:
    """R-GAT's limits: every type a relation starts at must be reached by one (a layer outputs only the types
    relations reach, as PyG's HeteroConv does), and no schedule that leaves halo rows out (an attention softmax
    over fewer sources has no renormalisation that equals a full one)."""
    from gnn_dist.schedules import parse_schedule

    relations = [tuple(r) for r in meta.hetero["relations"]]
    reached = {dst for _, _, dst in relations}
    unreached = sorted({src for src, _, _ in relations} - reached)
    if unreached and config.model.num_layers > 1:
        raise ValueError(f"--model {config.model.model}: no relation reaches type {unreached[0]!r}, so its rows end "
                         f"after the first layer while later layers read them: partition with reverse relations "
                         f"(drop --no-reverse-relations), or use --num-layers 1")
    schedules = parse_schedule(config.schedule).per_layer(max(config.model.num_layers - 1, 1))
    if meta.num_parts > 1 and any(s.reweights_rows for s in schedules):
        raise ValueError(f"--model {config.model.model} runs with schedules that send every halo row (exact, "
                         f"stale, pipeline), not --schedule {config.schedule}: pick one of those")
