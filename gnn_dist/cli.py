"""`gnn-dist partition | convert | train | inspect` (DESIGN.md's command-line contract).

Errors: one line `gnn-dist CMD: error: ...` on stderr and a non-zero exit.
Under mpiexec an argument error is printed by rank 0 only; a failure on one
rank during training prints the rank and the cause and aborts the whole job.
"""
from __future__ import annotations

import argparse
import json
import sys

from gnn_dist.comm import launcher_rank
from gnn_dist.sequential import DEFAULT_HALO_BLOCK_ROWS
from gnn_dist.trainer import DEFAULT_EVAL_CHUNK_NODES

EXIT_ERROR = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """Prints usage errors once per job rather than once per MPI rank."""

    def error(self, message: str):  # type: ignore[override]
        if launcher_rank() in (None, 0):
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _fanouts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected one integer per layer separated by commas, like 15,10,5; "
                                         f"got {text!r}") from None


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _byte_size(text: str) -> int:
    """'8G', '512M', '1.5G' or plain bytes (binary units)."""
    number, unit = text.strip().upper().rstrip("IB"), ""
    if number and number[-1] in _SIZE_UNITS:
        number, unit = number[:-1], number[-1]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 8G, 512M or a number of bytes; got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gnn-dist", description="Distributed GNN training over METIS partitions with MPI.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("partition", help="split a dataset into P parts on disk")
    p.add_argument("--dataset", required=True,
                   help="synthetic:tiny|small|arxiv|medium|large|products, planetoid:NAME, ogbn-*, npz:PATH, "
                        "chunked:DIR")
    p.add_argument("--root", default=None, help="folder holding the dataset's files (planetoid, ogbn)")
    p.add_argument("--num-parts", type=int, required=True)
    p.add_argument("--out", required=True, help="partition directory to create")
    p.add_argument("--method", default="metis", choices=["metis", "random", "ptscotch"],
                   help="metis: pymetis in one process (the default, for graphs that fit); ptscotch: PT-Scotch, "
                        "distributed over --ranks (or the ranks of mpirun -n R)")
    p.add_argument("--ranks", type=_positive_int, default=None,
                   help="with --method ptscotch: start R ranks on this host under the system's Open MPI "
                        "(1: one process, sequential Scotch)")
    p.add_argument("--memory-limit", type=_byte_size, default=None,
                   help="bytes each partitioning rank may use (default: what the host has available, shared)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--balance-train", action="store_true", help="balance training nodes across parts too")
    p.add_argument("--locality-block", type=int, default=256,
                   help="number each part's nodes by METIS blocks of about this many nodes, so neighbours sit "
                        "close in memory and aggregation runs faster (0: dataset order)")
    p.add_argument("--download", action="store_true", help="let ogb download missing OGB files")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")

    c = sub.add_parser("convert", help="write a dataset as a chunked directory, streaming where the source allows")
    c.add_argument("--dataset", required=True, help="any --dataset of partition except chunked:DIR")
    c.add_argument("--root", default=None, help="folder holding the dataset's files (planetoid, ogbn)")
    c.add_argument("--out", required=True, help="chunked directory to create (pass it as --dataset chunked:DIR)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--edges-per-chunk", type=_positive_int, default=8_000_000)
    c.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")

    t = sub.add_parser("train", help="train under mpiexec -n P (one rank per part)")
    t.add_argument("--parts", required=True, help="partition directory from gnn-dist partition")
    t.add_argument("--model", default="gcn", choices=["gcn", "sage"])
    t.add_argument("--mode", default="full")
    t.add_argument("--schedule", default="exact")
    t.add_argument("--halo-dtype", default="fp32")
    t.add_argument("--epochs", type=int, default=200)
    t.add_argument("--hidden", type=int, default=16)
    t.add_argument("--num-layers", type=int, default=2)
    t.add_argument("--dropout", type=float, default=0.5)
    t.add_argument("--batch-norm", action="store_true", help="BatchNorm after hidden convs, statistics over all ranks")
    t.add_argument("--lr", type=float, default=0.01)
    t.add_argument("--weight-decay", type=float, default=5e-4)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    t.add_argument("--eval-every", type=int, default=1, help="evaluate every this many epochs (and after the last)")
    t.add_argument("--eval-chunk-nodes", type=int, default=DEFAULT_EVAL_CHUNK_NODES,
                   help="evaluate layer by layer over chunks of this many owned nodes: memory of one layer's "
                        "activations plus a chunk, in both modes")
    t.add_argument("--halo-memory", default="resident", choices=["resident", "sequential"],
                   help="resident: receive each layer's whole halo at once; sequential: one peer block at a time, "
                        "the same results and bytes in far less memory (docs/memory.md)")
    t.add_argument("--halo-block-rows", type=int, default=DEFAULT_HALO_BLOCK_ROWS,
                   help="sequential: receive at most this many halo rows at once (0: one peer's whole block)")
    t.add_argument("--feature-dtype", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="storage of the input features, upcast to fp32 per use (fp32 is exact)")
    t.add_argument("--memory-limit", type=_byte_size, default=None,
                   help="memory this rank may use, e.g. 8G: refuse to start when the plan exceeds it (default: "
                        "the host's available memory, shared by the ranks on it)")
    t.add_argument("--metrics-out", default=None, help="JSON Lines file (rank 0 writes it)")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--checkpoint-dir", default=None, help="write checkpoints here (and resume from here)")
    t.add_argument("--checkpoint-every", type=int, default=10, help="epochs between checkpoints")
    t.add_argument("--keep-checkpoints", type=int, default=3, help="complete checkpoints to keep")
    t.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    t.add_argument("--fanouts", type=_fanouts, default=(10, 10),
                   help="sampled mode: neighbours per layer, outermost last")
    t.add_argument("--batch-size", type=int, default=1024, help="sampled mode: seeds per rank per step")
    t.add_argument("--sampling", default="remote", choices=["remote", "local"],
                   help="sampled mode: sample across the whole graph, or only inside the part and its halo")
    t.add_argument("--feature-cache-mb", type=float, default=0.0,
                   help="sampled mode: static cache of remote features (MB per rank), filled by a counting pass")
    t.add_argument("--predictions-out", default=None, help=".npy of every node's predicted class (rank 0 writes)")
    t.add_argument("--timeout", type=float, default=600.0,
                   help="abort the job when a rank makes no progress for this many seconds (0: never)")

    sub.add_parser("bench", help="benchmark sweeps with PyG baselines (gnn-dist bench --help)", add_help=False)

    i = sub.add_parser("inspect", help="partition quality and predicted halo traffic")
    i.add_argument("directory")
    i.add_argument("--json", action="store_true")
    i.add_argument("--model", default="gcn", choices=["gcn", "sage"])
    i.add_argument("--hidden", type=_positive_int, default=16)
    i.add_argument("--num-layers", type=_positive_int, default=2)
    i.add_argument("--schedule", default="exact")
    i.add_argument("--halo-dtype", default="fp32")
    i.add_argument("--dropout", type=float, default=0.5, help="memory plan: as train's --dropout")
    i.add_argument("--batch-norm", action="store_true", help="memory plan: as train's --batch-norm")
    i.add_argument("--halo-memory", default="resident", choices=["resident", "sequential"],
                   help="memory plan: as train's --halo-memory")
    i.add_argument("--halo-block-rows", type=int, default=DEFAULT_HALO_BLOCK_ROWS,
                   help="memory plan: as train's --halo-block-rows")
    i.add_argument("--feature-dtype", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="memory plan: as train's --feature-dtype")
    return parser


def _fail(command: str, message: str) -> int:
    print(f"gnn-dist {command}: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def cmd_inspect(args) -> int:
    from gnn_dist.inspect import format_report, inspect_partition
    from gnn_dist.model import ModelConfig
    from gnn_dist.plan import PlanConfig
    from gnn_dist.partition.format import PartitionFormatError

    try:
        model = ModelConfig(model=args.model, hidden=args.hidden, num_layers=args.num_layers, dropout=args.dropout,
                            batch_norm=args.batch_norm)
        report = inspect_partition(args.directory, model, schedule=args.schedule, halo_dtype=args.halo_dtype,
                                   memory=PlanConfig(model=model, halo_memory=args.halo_memory, schedule=args.schedule,
                                                     halo_block_rows=args.halo_block_rows,
                                                     feature_dtype=args.feature_dtype))
    except (PartitionFormatError, OSError, ValueError) as err:
        return _fail("inspect", str(err))
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def train_config_from_args(args):
    from gnn_dist.model import ModelConfig
    from gnn_dist.sampled import SampledConfig
    from gnn_dist.trainer import TrainConfig

    return TrainConfig(
        parts=args.parts,
        model=ModelConfig(model=args.model, hidden=args.hidden, num_layers=args.num_layers, dropout=args.dropout,
                          batch_norm=args.batch_norm),
        mode=args.mode, schedule=args.schedule, halo_dtype=args.halo_dtype, epochs=args.epochs, lr=args.lr,
        weight_decay=args.weight_decay, seed=args.seed, threads=args.threads, eval_every=args.eval_every,
        eval_chunk_nodes=args.eval_chunk_nodes, halo_memory=args.halo_memory, halo_block_rows=args.halo_block_rows,
        feature_dtype=args.feature_dtype, memory_limit=args.memory_limit,
        metrics_out=args.metrics_out, progress=not args.no_progress, checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every, keep_checkpoints=args.keep_checkpoints, resume=args.resume,
        timeout=args.timeout, predictions_out=args.predictions_out,
        sampled=SampledConfig(fanouts=args.fanouts, batch_size=args.batch_size, sampling=args.sampling,
                              feature_cache_mb=args.feature_cache_mb),
    )


def cmd_train(args) -> int:
    from gnn_dist.comm import make_world_comm
    from gnn_dist.context import RankContext, SetupError
    from gnn_dist.trainer import train

    comm = make_world_comm()
    ctx = RankContext(comm)
    try:
        final = train(ctx, train_config_from_args(args))
    except SetupError as err:
        # Raised identically on every rank: report once, exit cleanly everywhere.
        if ctx.is_root:
            _fail("train", str(err))
        return EXIT_ERROR
    except Exception as err:  # noqa: BLE001 - one rank's failure must end the whole job
        print(f"gnn-dist train: error on rank {ctx.rank}: {type(err).__name__}: {err}", file=sys.stderr)
        if ctx.size > 1:
            comm.abort(EXIT_ERROR)
        return EXIT_ERROR
    if ctx.is_root:
        print(f"final: test_acc={final['test_acc']:.4f} best_val_acc={final['best_val_acc']:.4f} "
              f"test_acc_at_best_val={final['test_acc_at_best_val']:.4f} "
              f"halo_bytes_total={final['halo_bytes_total']:,} ({final['halo_bytes_total'] / 1e6:.2f} MB) "
              f"epoch_s_median={final['epoch_s_median']:.4f} ranks={final['num_parts']}"
              if final["epochs"] else f"final: 0 epochs run on {final['num_parts']} ranks")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from gnn_dist.benchmarks.harness import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "partition":
        from gnn_dist.partition.command import cmd_partition

        return cmd_partition(args, argv)
    if args.command == "convert":
        from gnn_dist.partition.command import cmd_convert

        return cmd_convert(args)
    handler = {"train": cmd_train, "inspect": cmd_inspect}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
