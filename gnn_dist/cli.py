"""`gnn-dist partition | convert | train | inspect | embed | export | bench | supervise`: the command line
(README.md, docs/).

Errors: one line `gnn-dist CMD: error: ...` on stderr and a non-zero exit.
Under mpiexec an argument error is printed by rank 0 only; a failure on one
rank during training prints the rank and the cause and aborts the whole job.

The benchmarks are imported only when `gnn-dist bench` runs (the core never loads them).

May import: benchmarks, comm, config, context, embed, export, memory, options, partition, partition_report,
    plan, plugins, resilience, tasks, training
"""
from __future__ import annotations

import argparse
import json
import sys

from gnn_dist.comm.communicator import launcher_rank
from gnn_dist.config import (
    LinkConfig,
    ModelConfig,
    TrainConfig,
    add_train_options,
    is_user_model,
    train_config_from_args,
)
from gnn_dist.embed import EmbedConfig
from gnn_dist.memory.host import byte_size
from gnn_dist.options import add_options, options_from_args, positive_int
from gnn_dist.partition.metis import BALANCES
from gnn_dist.partition.partitioner import DEFAULT_BALANCE, DEFAULT_LOCALITY_BLOCK
from gnn_dist.plugins.loading import PluginError
from gnn_dist.plugins.loading import import_plugins as load_plugins
from gnn_dist.resilience.supervise import EXIT_FAILED, EXIT_SETUP, supervise

# Exit statuses (gnn_dist.resilience.supervise restarts on any failure but usage and set-up errors, which input caused).
EXIT_ERROR = EXIT_FAILED  # a rank failed or hung: the job was aborted
EXIT_USAGE = 2
# train's options that also shape inspect's byte prediction and memory plan
INSPECT_OPTIONS = ("schedule", "halo_dtype", "halo_memory", "halo_block_rows", "feature_dtype", "device")


class _Parser(argparse.ArgumentParser):
    """Prints usage errors once per job rather than once per MPI rank."""

    def error(self, message: str):  # type: ignore[override]
        if launcher_rank() in (None, 0):
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


PLUGIN_HELP = ("import this module (or .py file) first, so the models, schedules and datasets it registers can be "
               "named (docs/extending.md); repeatable")


def _task_names() -> tuple[str, ...]:
    """--task's choices: the task registry (loaded when the train parser is built, as --model's registry is)."""
    from gnn_dist.tasks import task_names

    return task_names()


def import_plugins(argv: list[str]) -> None:
    """Import every --plugin before the parser is built; a failure is one usage-error line (rank 0's)."""
    try:
        load_plugins(argv)
    except PluginError as err:
        if launcher_rank() in (None, 0):
            print(f"gnn-dist: error: {err}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gnn-dist", description="Distributed GNN training over METIS partitions with MPI.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("partition", help="split a dataset into P parts on disk")
    p.add_argument("--dataset", required=True,
                   help="synthetic:tiny|small|weak|sbm60k|arxiv|medium|large|products, synthetic:mag|mag200k|magtiny "
                        "(typed), planetoid:NAME, ogbn-*, ogbn-mag (typed), ogbl-* (--task link), npz:PATH, "
                        "hetero:PATH (typed), chunked:DIR")
    p.add_argument("--root", default=None, help="folder holding the dataset's files (planetoid, ogbn)")
    p.add_argument("--num-parts", type=int, required=True)
    p.add_argument("--out", required=True, help="partition directory to create")
    p.add_argument("--method", default="metis", choices=["metis", "random", "ptscotch"],
                   help="metis: pymetis in one process (the default, for graphs that fit); ptscotch: PT-Scotch, "
                        "distributed over --ranks (or the ranks of mpirun -n R)")
    p.add_argument("--ranks", type=positive_int, default=None,
                   help="with --method ptscotch: start R ranks on this host under the system's Open MPI "
                        "(1: one process, sequential Scotch)")
    p.add_argument("--memory-limit", type=byte_size, default=None,
                   help="bytes each partitioning rank may use (default: what the host has available, shared)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--balance-train", action="store_true", help="balance training nodes across parts too")
    p.add_argument("--balance", default=None, choices=BALANCES,
                   help=f"what METIS evens across parts: node counts; edges (each node weighing its in-degree + 1: "
                        f"full-batch compute on graphs with skewed degrees, at less even node counts); or both, "
                        f"weighed alike (default: {DEFAULT_BALANCE}, and edges for a typed graph, whose node types "
                        f"are balanced after; PT-Scotch balances its own way; benchmarks/results/balance-default.md, "
                        f"typed-balance.md)")
    p.add_argument("--balance-edges", dest="balance", action="store_const", const="edges",
                   help="the same as --balance edges")
    p.add_argument("--normalize-features", action="store_true",
                   help="divide each node's features by their sum, as PyG's NormalizeFeatures (the usual "
                        "preprocessing of Planetoid's bag-of-words features)")
    p.add_argument("--objective", default="cut", choices=["cut", "volume"],
                   help="what METIS minimises: edges between parts (cut), or the halo rows that travel (volume)")
    p.add_argument("--locality-block", type=int, default=DEFAULT_LOCALITY_BLOCK,
                   help="number each part's nodes by METIS blocks of about this many nodes, so neighbours sit "
                        "close in memory and aggregation runs faster (0: dataset order)")
    p.add_argument("--task", default="node", choices=["node", "link"],
                   help="what the parts are for: node classification, or link prediction (the held-out edges "
                        "leave the graph before partitioning; docs/link-prediction.md)")
    p.add_argument("--edge-split", default="0.85,0.05,0.10",
                   help="--task link: train,val,test fractions of the undirected edges (a dataset's official split "
                        "is kept)")
    p.add_argument("--mrr-negatives", type=int, default=100,
                   help="--task link: negative destinations per validation and test positive, for MRR")
    p.add_argument("--no-reverse-relations", action="store_true",
                   help="a typed graph (hetero:PATH, ogbn-mag, synthetic:mag): keep its relations as given, without "
                        "the reverse of each (rev_NAME) that PyG's ToUndirected adds by default")
    p.add_argument("--download", action="store_true", help="let ogb download missing OGB files")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE|FILE.py", help=PLUGIN_HELP)

    c = sub.add_parser("convert", help="write a dataset as a chunked directory, streaming where the source allows")
    c.add_argument("--dataset", required=True, help="any --dataset of partition except chunked:DIR")
    c.add_argument("--root", default=None, help="folder holding the dataset's files (planetoid, ogbn)")
    c.add_argument("--out", required=True, help="chunked directory to create (pass it as --dataset chunked:DIR)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--edges-per-chunk", type=positive_int, default=8_000_000)
    c.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    c.add_argument("--plugin", action="append", default=[], metavar="MODULE|FILE.py", help=PLUGIN_HELP)

    t = sub.add_parser("train", help="train under mpiexec -n P (one rank per part)")
    # Every option comes from the config dataclasses (gnn_dist.config): one place for names, defaults and help.
    add_train_options(t, _task_names)
    t.add_argument("--plugin", action="append", default=[], metavar="MODULE|FILE.py", help=PLUGIN_HELP)

    e = sub.add_parser("embed", help="every node's output of one layer of a trained model, to one .npy (under "
                                     "mpiexec -n P)")
    add_options(e, EmbedConfig)
    e.add_argument("--plugin", action="append", default=[], metavar="MODULE|FILE.py", help=PLUGIN_HELP)

    x = sub.add_parser("export", help="a trained model as a plain torch_geometric module (model.pt + model.json)")
    x.add_argument("--checkpoint-dir", required=True, help="the training run's --checkpoint-dir (its newest "
                   "complete checkpoint)")
    x.add_argument("--out", required=True, help="the state_dict to write (a .json spec goes beside it)")
    x.add_argument("--plugin", action="append", default=[], metavar="MODULE|FILE.py", help=PLUGIN_HELP)

    sub.add_parser("bench", help="benchmark sweeps with PyG baselines (gnn-dist bench --help)", add_help=False)
    sub.add_parser("supervise", help="run a training job and restart it from its checkpoint when it crashes "
                   "(gnn-dist supervise --help)", add_help=False)

    i = sub.add_parser("inspect", help="partition quality and predicted halo traffic")
    i.add_argument("directory")
    i.add_argument("--json", action="store_true")
    add_options(i, ModelConfig, help_prefix="as train's: ")
    i.set_defaults(model=None)  # the partition's kind picks it (gnn_dist.partition_report.default_model)
    i.add_argument("--plugin", action="append", default=[], metavar="MODULE|FILE.py", help=PLUGIN_HELP)
    add_options(i, TrainConfig, only=INSPECT_OPTIONS, help_prefix="as train's: ")
    add_options(i, LinkConfig, help_prefix="as train's: ")
    return parser


def _fail(command: str, message: str) -> int:
    print(f"gnn-dist {command}: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _validated(config):
    config.validate()
    return config


def cmd_inspect(args) -> int:
    from gnn_dist.partition.format import PartitionFormatError, load_meta
    from gnn_dist.partition_report import default_model, format_report, inspect_partition
    from gnn_dist.plan.memory import PlanConfig

    try:
        options = options_from_args(ModelConfig, args)
        options["model"] = options["model"] or default_model(load_meta(args.directory))
        if is_user_model(options["model"]):
            raise ValueError(f"--model {options['model']}: inspect predicts the built-in models' bytes and memory "
                             f"only; a model of your own reports its bytes per epoch in gnn-dist train's metrics")
        model = ModelConfig(**options)
        model.validate()
        report = inspect_partition(args.directory, model, schedule=args.schedule, halo_dtype=args.halo_dtype,
                                   link=_validated(LinkConfig(**options_from_args(LinkConfig, args))),
                                   memory=PlanConfig(model=model, halo_memory=args.halo_memory, schedule=args.schedule,
                                                     halo_block_rows=args.halo_block_rows,
                                                     feature_dtype=args.feature_dtype, device=args.device))
    except (PartitionFormatError, OSError, ValueError) as err:
        return _fail("inspect", str(err))
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def _run_collective(command: str, job):
    """Run `job(ctx)` on every rank: (its result, 0), or (None, the exit status) after reporting the failure.

    A SetupError is raised identically on every rank: rank 0 reports it once and every rank exits cleanly, with
    the status that says "the input was refused" (a supervisor does not retry it). Anything else is one rank's
    failure, which must end the whole job."""
    from gnn_dist.comm.communicator import make_world_comm
    from gnn_dist.context import RankContext, SetupError

    comm = make_world_comm()
    ctx = RankContext(comm)
    try:
        return job(ctx), 0, ctx
    except SetupError as err:
        if ctx.is_root:
            _fail(command, str(err))
        return None, EXIT_SETUP, ctx
    except Exception as err:  # noqa: BLE001 - one rank's failure must end the whole job
        print(f"gnn-dist {command}: error on rank {ctx.rank}: {type(err).__name__}: {err}", file=sys.stderr)
        if ctx.size > 1:
            comm.abort(EXIT_ERROR)
        return None, EXIT_ERROR, ctx


def cmd_train(args) -> int:
    from gnn_dist.training import train

    final, status, ctx = _run_collective("train", lambda ctx: train(ctx, train_config_from_args(args)))
    if status or not ctx.is_root:
        return status
    from gnn_dist.tasks import task_class

    print(f"final: {task_class(final['task']).final_text(final)} "
          f"halo_bytes_total={final['halo_bytes_total']:,} ({final['halo_bytes_total'] / 1e6:.2f} MB) "
          f"epoch_s_median={final['epoch_s_median']:.4f} ranks={final['num_parts']}"
          + (f" link={final['simulated_link']}" if final["simulated_link"] else "")
          if final["epochs"] else f"final: 0 epochs run on {final['num_parts']} ranks")
    return 0


def cmd_embed(args) -> int:
    from gnn_dist.embed import embed

    done, status, ctx = _run_collective("embed", lambda ctx: embed(ctx, EmbedConfig(**options_from_args(EmbedConfig,
                                                                                                        args))))
    if status or not ctx.is_root:
        return status
    print(f"wrote {done['out']}: {done['rows']:,} rows x {done['width']} (layer {done['layer']}), peak RSS per "
          f"rank {', '.join(f'{v / 2**30:.2f}' for v in done['peak_rss_bytes_per_rank'])} GiB")
    return 0


def cmd_export(args) -> int:
    from gnn_dist.context import SetupError
    from gnn_dist.export import export, spec_path

    try:
        spec = export(args.checkpoint_dir, args.out)
    except (SetupError, OSError, ValueError) as err:
        return _fail("export", str(err))
    if "keywords" in spec:  # a --model MODULE_OR_FILE:NAME model, exported as itself
        print(f"wrote {args.out} and {spec_path(args.out)}: {spec['model']} after {spec['gnn_dist']['epochs']} "
              f"epochs; load it with gnn_dist.export.load_pyg (which imports {spec['model'].rpartition(':')[0]})")
        return 0
    if "node_types" in spec:  # a typed graph's model (gnn_dist.export.typed)
        print(f"wrote {args.out} and {spec_path(args.out)}: {spec['model']}, inputs for {', '.join(spec['inputs'])} "
              f"and {len(spec['layers'])} layers over {len(spec['relations'])} relations, for a HeteroData "
              f"({spec['target']} logits); load it with gnn_dist.export.typed.load_pyg_typed or docs/export.md's lines")
        return 0
    print(f"wrote {args.out} and {spec_path(args.out)}: {len(spec['layers'])} torch_geometric.nn.Sequential layers "
          f"({spec['gnn_dist']['model']['model']}, {spec['gnn_dist']['in_channels']} -> "
          f"{spec['gnn_dist']['out_channels']}); load it with gnn_dist.export.load_pyg or docs/export.md's lines")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        # The one place the core reaches the benchmarks, lazily and only for this command: the harness
        # imports gnn_dist, never the other way round at import time.
        from gnn_dist.benchmarks.harness import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["supervise"]:
        return supervise(argv[1:])
    if argv[:1] in (["train"], ["inspect"], ["partition"], ["convert"], ["embed"], ["export"]):
        import_plugins(argv)
    args = build_parser().parse_args(argv)
    if args.command == "partition":
        from gnn_dist.partition.command import cmd_partition

        return cmd_partition(args, argv)
    if args.command == "convert":
        from gnn_dist.partition.command import cmd_convert

        return cmd_convert(args)
    handler = {"train": cmd_train, "inspect": cmd_inspect, "embed": cmd_embed, "export": cmd_export}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
