"""Training configuration: the single source of every option's name, default and help.

Each option is a dataclass field made with `option(...)`: its default, its
help text and how argparse reads it. The command line is generated from these
fields (`add_options`, `options_from_args`), so `gnn-dist train --help`, the
Python API (`TrainConfig(...)`) and `validate()` cannot disagree about a
default. Fields made without `option` (the nested configs) are not flags.

Loading the config loads no registry. What only a registry can answer (the model and schedule names, a halo
dtype's codec, a link's spec) is looked up when validate() runs or when a parser lists the choices. The task
registry sits above the config (its tasks train with it): --task is checked where training looks the task up,
and the command line hands its names to add_options as choices.

May import: comm, device, memory, models, options, schedules
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

import torch

from gnn_dist.device import DEVICES, check_device
from gnn_dist.memory.host import byte_size
from gnn_dist.options import add_options, fanout_list, option, options_from_args, profile_range, timeout_seconds

MODES = ("full", "sampled")
HALO_MEMORY_MODES = ("resident", "sequential")
# Rows per block by default: 16 MiB per block at width 256, where one peer's whole block can be most of the
# halo (P=2). Each extra sub-round costs one more message per layer and direction.
DEFAULT_HALO_BLOCK_ROWS = 16384
SCHEDULE_GUARD = ("on", "off")
SAMPLING_STRATEGIES = ("remote", "local")
# Storage of the input features (--feature-dtype); the model upcasts them to fp32 where it uses them.
FEATURE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_EVAL_CHUNK_NODES = 16384  # rows per chunk: 16 MiB per temporary at width 256, a small share of a layer


def _models():
    """The model registry, when a question needs it (not at import: the config does not load the runtime)."""
    import gnn_dist.models

    return gnn_dist.models


def is_user_model(model: str) -> bool:
    """--model MODULE_OR_FILE:NAME names a user's PyG model (gnn_dist.training.user_model); a bare name, a
    registered one."""
    return ":" in model


class ModelChoices(tuple):
    """--model's choices: the registered names, listed in --help and in argparse's error, and any
    MODULE_OR_FILE:NAME, checked when the model is built."""

    def __contains__(self, value) -> bool:
        return tuple.__contains__(self, value) or (isinstance(value, str) and is_user_model(value))


@dataclass(frozen=True)
class ModelConfig:
    model: str = option("gcn", "the model (gnn_dist.models registers them), or MODULE_OR_FILE:NAME: a PyG model "
                               "of your own, built as NAME(in_channels=, hidden_channels=, num_layers=, "
                               "out_channels=, dropout=) (docs/your-model.md)",
                        choices=lambda: ModelChoices(_models().model_names()))
    hidden: int = option(16, "width of the hidden layers")
    num_layers: int = option(2, "number of graph convolutions")
    dropout: float = option(0.5, "dropout before every convolution")
    batch_norm: bool = option(False, "BatchNorm after hidden convs, statistics over all ranks")
    heads: int = option(1, "attention heads of each hidden layer, concatenated (--model gat, rgat); the output "
                           "layer has one")
    attn_dropout: float | None = option(None, "dropout of attention coefficients (--model gat: default --dropout; "
                                              "--model rgat: default 0, as PyG's GATConv)", parse=float)
    num_bases: int = option(0, "--model rgcn: share each layer's relation weights out of this many bases (basis "
                               "decomposition; 0: one weight per relation)")
    model_kwargs: str = option("", "--model MODULE_OR_FILE:NAME: more keyword arguments of NAME, a JSON object "
                                   "(e.g. '{\"jk\": \"cat\"}'); it may override the five it is given")

    def validate(self) -> None:
        model_class, model_names, one_of = _models().model_class, _models().model_names, _models().one_of
        if is_user_model(self.model):
            self._validate_user_model()
            return
        if self.model_kwargs:
            raise ValueError(f"--model-kwargs is for --model MODULE_OR_FILE:NAME, not --model {self.model}: drop it")
        if self.model not in model_names():
            raise ValueError(f"unknown --model {self.model!r}: use {one_of(model_names())}")
        if self.hidden < 1:
            raise ValueError(f"--hidden must be at least 1, got {self.hidden}")
        if self.num_layers < 1:
            raise ValueError(f"--num-layers must be at least 1, got {self.num_layers}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must lie in [0, 1), got {self.dropout}")
        if self.heads < 1:
            raise ValueError(f"--heads must be at least 1, got {self.heads}")
        if self.heads > 1 and not model_class(self.model).multi_head:
            multi = [name for name in model_names() if model_class(name).multi_head]
            raise ValueError(f"--heads applies to attention models ({one_of(multi)}), not --model {self.model}: "
                             f"drop --heads")
        if self.num_bases < 0:
            raise ValueError(f"--num-bases must be 0 (no bases) or positive, got {self.num_bases}")
        if self.num_bases and not getattr(model_class(self.model), "basis_decomposition", False):
            raise ValueError(f"--num-bases applies to --model rgcn, not --model {self.model}: drop --num-bases")
        if self.attn_dropout is not None and not 0.0 <= self.attn_dropout < 1.0:
            raise ValueError(f"--attn-dropout must lie in [0, 1), got {self.attn_dropout}")

    def _validate_user_model(self) -> None:
        module, _, name = self.model.rpartition(":")
        if not module or not name.isidentifier():
            raise ValueError(f"bad --model {self.model!r}: give MODULE:NAME or FILE.py:NAME, e.g. "
                             f"torch_geometric.nn.models:GIN")
        self.user_model_kwargs()
        if self.hidden < 1 or self.num_layers < 1 or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--hidden and --num-layers must be at least 1 and --dropout in [0, 1), got "
                             f"{self.hidden}, {self.num_layers} and {self.dropout}")
        built_in_only = {"--batch-norm": self.batch_norm, "--heads": self.heads != 1,
                         "--attn-dropout": self.attn_dropout is not None, "--num-bases": self.num_bases != 0}
        for flag, given in built_in_only.items():
            if given:
                raise ValueError(f"{flag} shapes the built-in models, not --model {self.model}: drop it, and pass "
                                 f"your model's own keyword in --model-kwargs")

    def user_model_kwargs(self) -> dict:
        """--model-kwargs as a dict (ValueError naming the fix when it is not a JSON object)."""
        import json

        if not self.model_kwargs:
            return {}
        try:
            kwargs = json.loads(self.model_kwargs)
        except json.JSONDecodeError as err:
            raise ValueError(f"--model-kwargs is not JSON ({err.msg} at character {err.pos}): give an object, "
                             f"e.g. '{{\"jk\": \"cat\"}}'") from None
        if not isinstance(kwargs, dict):
            raise ValueError(f"--model-kwargs must be a JSON object of keyword arguments, got {self.model_kwargs!r}")
        return kwargs

    def widths(self, in_dim: int, out_dim: int) -> list[tuple[int, int]]:
        """(input, output) columns of each layer; hidden layers output heads * hidden (one head: hidden)."""
        dims = [in_dim] + [self.hidden * self.heads] * (self.num_layers - 1) + [out_dim]
        return list(zip(dims[:-1], dims[1:]))

    def layers(self, in_dim: int, out_dim: int) -> list[tuple[int, int, dict]]:
        """(input, output, constructor options) of each layer, the options from the model's layer_options."""
        conv = _models().model_class(self.model)
        return [(i, o, conv.layer_options(self, k, self.num_layers))
                for k, (i, o) in enumerate(self.widths(in_dim, out_dim))]


@dataclass(frozen=True)
class SampledConfig:
    fanouts: tuple = option((10, 10), "sampled mode: neighbours per layer, outermost last (one per layer)",
                            parse=fanout_list)
    batch_size: int = option(1024, "sampled mode: seeds per rank per step")
    sampling: str = option("remote", "sampled mode: sample across the whole graph, or only inside the part and "
                                     "its halo", choices=SAMPLING_STRATEGIES)
    feature_cache_mb: float = option(0.0, "sampled mode: static cache of remote features (MB per rank), filled by "
                                          "a counting pass")
    cache_count_steps: int = 8  # steps of the counting pass that first fills the cache (not a flag)

    def validate(self, num_layers: int) -> None:
        if len(self.fanouts) != num_layers:
            raise ValueError(f"--fanouts has {len(self.fanouts)} values but the model has {num_layers} layers: "
                             f"give one fanout per layer (e.g. --fanouts {','.join(['10'] * num_layers)})")
        if any(f < 1 for f in self.fanouts):
            raise ValueError(f"--fanouts must be positive integers, got {list(self.fanouts)}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.sampling not in SAMPLING_STRATEGIES:
            raise ValueError(f"--sampling must be remote or local, got {self.sampling!r}")
        if self.feature_cache_mb < 0:
            raise ValueError(f"--feature-cache-mb must be 0 or more, got {self.feature_cache_mb}")


DECODERS = ("dot", "mlp")
NEGATIVE_RULES = ("source", "pairs")  # gnn_dist.link.negatives


@dataclass(frozen=True)
class LinkConfig:
    embedding_dim: int | None = option(None, "--task link: width of the last layer, the node embedding (default: "
                                             "--hidden)", parse=int)
    decoder: str = option("dot", "--task link: a pair's score from its two embeddings: their dot product, or mlp "
                                 "(an MLP on their Hadamard product, as OGB's link examples)", choices=DECODERS)
    neg_ratio: int = option(1, "--task link: negatives per training positive, keyed by (seed, epoch, edge): the "
                               "same at every P")
    negatives: str = option("source", "--task link: how a training negative is drawn: source keeps the positive's "
                                      "source and draws a destination uniform over the other nodes (DGL's uniform "
                                      "sampler); pairs draws both ends uniformly, as PyG's negative_sampling "
                                      "(docs/link-prediction.md)", choices=NEGATIVE_RULES)

    def validate(self) -> None:
        if self.embedding_dim is not None and self.embedding_dim < 1:
            raise ValueError(f"--embedding-dim must be at least 1, got {self.embedding_dim}")
        if self.decoder not in DECODERS:
            raise ValueError(f"bad --decoder {self.decoder!r}: use dot or mlp")
        if self.neg_ratio < 1:
            raise ValueError(f"--neg-ratio must be at least 1 (negatives per positive), got {self.neg_ratio}")
        if self.negatives not in NEGATIVE_RULES:
            raise ValueError(f"bad --negatives {self.negatives!r}: use source or pairs")


@dataclass(frozen=True)
class TrainConfig:
    parts: str = option(help="partition directory from gnn-dist partition")
    model: ModelConfig = field(default_factory=ModelConfig)
    task: str = option("node", "what to learn: node classification, or link prediction (on a partition made with "
                               "gnn-dist partition --task link; gnn_dist.tasks registers them)")
    mode: str = option("full", "full: full-batch training; sampled: mini-batches of sampled neighbourhoods")
    schedule: str = option("exact", "halo exchange schedule of hidden layers, or one per exchanged layer, "
                           "comma-separated (docs/schedules.md)")
    halo_dtype: str = option("fp32", "wire format of halo rows: fp32, fp16, bf16 or int8")
    schedule_guard: str = option("on", "with a lossy --schedule: fall back to exact exchanges for a while when the "
                                 "training loss climbs or validation accuracy collapses (gnn_dist.training.guard)",
                                 choices=SCHEDULE_GUARD)
    epochs: int = option(200, "training epochs")
    lr: float = option(0.01, "Adam's learning rate")
    weight_decay: float = option(5e-4, "Adam's weight decay")
    embedding_weight_decay: float | None = option(
        None, "full-batch training on a typed graph: Adam's weight decay of the featureless types' embedding tables "
              "(default: --weight-decay, as torch.optim.Adam on nn.Embedding; 0 leaves the tables undecayed, as "
              "sampled mode's SparseAdam rule always does)", parse=float)
    seed: int = option(0, "seed of the weights, dropout and sampling")
    threads: int = option(1, "torch threads per rank")
    device: str = option("cpu", "where each rank computes: cpu, or cuda (rank r takes GPU local rank mod visible "
                                "GPUs; halos staged through pinned host memory; docs/gpu.md)", choices=DEVICES)
    eval_every: int = option(1, "evaluate every this many epochs (and after the last)")
    metrics_out: str | None = option(None, "JSON Lines file (rank 0 writes it)", parse=str)
    progress: bool = option(True, "show a progress bar (rank 0)")
    checkpoint_dir: str | None = option(None, "write checkpoints here (and resume from here)", parse=str)
    checkpoint_every: int = option(10, "epochs between checkpoints")
    keep_checkpoints: int = option(3, "complete checkpoints to keep")
    resume: bool = option(False, "continue from the newest complete checkpoint")
    timeout: float | str = option("auto", "abort the job when a rank makes no progress for this many seconds (0: "
                                          "never); auto: max(60 s, 20 x the longest step seen) once training runs, "
                                          "more in set-up and evaluation (gnn_dist.resilience.watchdog)", parse=timeout_seconds)
    predictions_out: str | None = option(None, ".npy of every node's predicted class, by original id (rank 0 "
                                               "writes it)", parse=str)
    tensorboard: str | None = option(None, "write each epoch's scalars (loss, accuracies, bytes, times, memory) to "
                                     "this TensorBoard log directory (rank 0; needs the tensorboard package)",
                                     parse=str)
    profile: str | None = option(None, "write one Chrome/Perfetto trace per rank of the --profile-epochs to this "
                                 "directory (torch.profiler; trace-rank-NNNNN.json)", parse=str)
    profile_epochs: str = option("1:3", "the epochs to trace with --profile, A:B as a Python range (default 1:3: "
                                 "the second and third)")
    # Evaluation runs layer by layer over the owned nodes in chunks of this many rows (gnn_dist.steps.layer_stack.
    # LayerStack.forward_layerwise): memory is one layer's activations plus a chunk, never a whole forward.
    eval_chunk_nodes: int = option(DEFAULT_EVAL_CHUNK_NODES, "evaluate layer by layer over chunks of this many "
                                   "owned nodes: memory of one layer's activations plus a chunk, in both modes")
    halo_memory: str = option("resident", "resident: receive each layer's whole halo at once; sequential: one peer "
                              "block at a time, the same results in far less memory, and the same bytes on a "
                              "homogeneous graph (a typed graph's first layer then moves its whole halo: "
                              "docs/memory.md, docs/hetero.md)",
                              choices=HALO_MEMORY_MODES)
    halo_block_rows: int = option(DEFAULT_HALO_BLOCK_ROWS, "sequential: receive at most this many halo rows at "
                                  "once (0: one peer's whole block)")
    feature_dtype: str = option("fp32", "storage of the input features, upcast to fp32 per use (fp32 is exact)",
                                choices=tuple(FEATURE_DTYPES))
    memory_limit: int | None = option(None, "memory this rank may use, e.g. 8G: refuse to start when the plan "
                                      "exceeds it (default: the host's available memory, shared by its ranks)",
                                      parse=byte_size)
    simulate_link: str | None = option(None, "benchmarks: model a network of GBPS[,LATENCY_US] (Gb/s, us): every "
                                       "exchange of training takes at least latency + bytes / bandwidth; results "
                                       "are labelled modelled (gnn_dist.comm.simulated_link)", parse=str)
    sampled: SampledConfig = field(default_factory=SampledConfig)  # used with mode="sampled"
    link: LinkConfig = field(default_factory=LinkConfig)  # used with task="link"

    def validate(self) -> None:
        self.model.validate()
        if is_user_model(self.model.model):
            self._validate_user_model()
        if self.task == "link":
            self.link.validate()
            if self.predictions_out is not None:
                raise ValueError("--predictions-out writes node classes: for --task link, write embeddings with "
                                 "gnn-dist embed")
        if self.mode not in MODES:
            raise ValueError(f"bad --mode {self.mode!r}: use --mode full or --mode sampled")
        if self.mode == "sampled":
            self.sampled.validate(self.model.num_layers)
            if self.model.batch_norm:
                raise ValueError("--batch-norm is for --mode full; sampled mini-batches train without it")
            if self.schedule != "exact" or self.halo_dtype != "fp32":
                raise ValueError("--schedule and --halo-dtype shape full-batch halo traffic: use them with --mode "
                                 "full (sampled mode fetches exact fp32 features)")
        from gnn_dist.schedules import parse_schedule

        schedule = parse_schedule(self.schedule)
        layer_schedules = schedule.per_layer(self.model.num_layers - 1)
        if self.halo_memory not in HALO_MEMORY_MODES:
            raise ValueError(f"bad --halo-memory {self.halo_memory!r}: use resident or sequential")
        if self.halo_memory == "sequential":
            if self.mode != "full":
                raise ValueError("--halo-memory sequential is for --mode full (sampled mode holds no layer halos)")
            if _models().model_class(self.model.model).attention and any(s.kind != "exact" for s in layer_schedules):
                raise ValueError(f"--halo-memory sequential runs --model {self.model.model} with --schedule exact only "
                                 f"(its blocks travel again in the backward): use --schedule exact, or --halo-memory "
                                 f"resident with {self.schedule}")
            if not schedule.runs_with_sequential_halos:
                raise ValueError(f"--halo-memory sequential needs a schedule that moves halo blocks one at a time "
                                 f"(a block_pass): {self.schedule} has none; use --halo-memory resident with it")
        self._validate_numbers()
        self._validate_device()

    def _validate_user_model(self) -> None:
        """What --model MODULE_OR_FILE:NAME cannot do (gnn_dist.training.user_model), refused before it starts."""
        spec = f"--model {self.model.model}"
        if self.task != "node":
            raise ValueError(f"{spec} trains node classification for now: drop --task link, or use a built-in "
                             f"--model")
        if self.mode == "sampled" and (self.sampled.sampling != "remote" or self.sampled.feature_cache_mb):
            raise ValueError(f"--sampling local and --feature-cache-mb apply to the built-in models' sampled mode, "
                             f"not yet to {spec}: drop them")
        if self.halo_memory != "resident":
            raise ValueError(f"--halo-memory sequential needs the built-in models' blocked aggregation; a PyG "
                             f"layer aggregates its whole halo at once: drop it for {spec}")
        if self.memory_limit is not None:
            raise ValueError(f"--memory-limit is checked against gnn-dist's memory plan, which only the built-in "
                             f"models have; there is none of {spec}: drop --memory-limit")
        built_in_only = {"--device": self.device != "cpu", "--feature-dtype": self.feature_dtype != "fp32",
                         "--predictions-out": self.predictions_out is not None, "--profile": self.profile is not None,
                         "--simulate-link": self.simulate_link is not None,
                         "--embedding-weight-decay": self.embedding_weight_decay is not None}
        for flag, given in built_in_only.items():
            if given:
                raise ValueError(f"{flag} applies to the built-in models, not yet to {spec}: drop it")

    def _validate_device(self) -> None:
        check_device(self.device)

    def _validate_numbers(self) -> None:
        if self.halo_block_rows < 0:
            raise ValueError(f"--halo-block-rows must be 0 (a peer's whole block) or positive, got "
                             f"{self.halo_block_rows}")
        if self.feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"bad --feature-dtype {self.feature_dtype!r}: valid: {', '.join(FEATURE_DTYPES)}")
        if self.feature_dtype != "fp32" and self.mode != "full":
            raise ValueError("--feature-dtype is for --mode full; sampled mode keeps fp32 features")
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise ValueError(f"--memory-limit must be positive, got {self.memory_limit}")
        if self.schedule_guard not in SCHEDULE_GUARD:
            raise ValueError(f"bad --schedule-guard {self.schedule_guard!r}: use on or off")
        from gnn_dist.comm.codec import HALO_DTYPES

        if self.halo_dtype not in HALO_DTYPES:
            raise ValueError(f"bad --halo-dtype {self.halo_dtype!r}: valid: {', '.join(HALO_DTYPES)}")
        if self.epochs < 0:
            raise ValueError(f"--epochs must be 0 or more, got {self.epochs}")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ValueError(f"--lr must be a positive number, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"--weight-decay must be 0 or more, got {self.weight_decay}")
        if self.embedding_weight_decay is not None and self.embedding_weight_decay < 0:
            raise ValueError(f"--embedding-weight-decay must be 0 or more, got {self.embedding_weight_decay}")
        if self.embedding_weight_decay and self.mode == "sampled":
            raise ValueError("--embedding-weight-decay is full-batch's: sampled mode steps the tables by SparseAdam's "
                             "rule, which has no weight decay: drop it or give 0")
        at_least_one = {"--threads": self.threads, "--eval-every": self.eval_every,
                        "--eval-chunk-nodes": self.eval_chunk_nodes, "--checkpoint-every": self.checkpoint_every,
                        "--keep-checkpoints": self.keep_checkpoints}
        for flag, value in at_least_one.items():
            if value < 1:
                raise ValueError(f"{flag} must be at least 1, got {value}")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir DIR (where the checkpoints are)")
        if self.timeout != "auto" and not (isinstance(self.timeout, (int, float)) and self.timeout >= 0):
            raise ValueError(f"--timeout must be auto, 0 (off) or positive seconds, got {self.timeout}")
        if self.profile is not None:
            profile_range(self.profile_epochs)
        if self.simulate_link is not None:
            from gnn_dist.comm.simulated_link import LinkModel

            LinkModel.parse(self.simulate_link)


def add_train_options(parser: argparse.ArgumentParser, task_names) -> None:
    """Every option of `gnn-dist train`; task_names: the task registry's names (--task's choices)."""
    add_options(parser, TrainConfig, choices={"task": task_names})
    for config_class in (ModelConfig, SampledConfig, LinkConfig):
        add_options(parser, config_class)


def train_config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(**options_from_args(TrainConfig, args), model=ModelConfig(**options_from_args(ModelConfig, args)),
                       sampled=SampledConfig(**options_from_args(SampledConfig, args)),
                       link=LinkConfig(**options_from_args(LinkConfig, args)))
