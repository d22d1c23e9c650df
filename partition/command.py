"""`gnn-dist partition` and `gnn-dist convert`: which partitioner runs where, and their one-line errors.

- --method metis|random: one process loads the graph (pymetis), as before.
- --method ptscotch: the distributed partitioner (gnn_dist.partition.distributed).
  Inside an MPI job (mpirun -n R gnn-dist partition ...) every rank takes
  part. Outside one, --ranks R > 1 starts that job on this host with the
  system's Open MPI (gnn_dist.partition.scotch); --ranks 1 runs in this process with
  sequential Scotch and needs no MPI.
Every path first checks the memory model (gnn_dist.partition.memory_model).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback

from gnn_dist.memory.rss import peak_rss_bytes


def _fail(command: str, message: str, rank: int = 0) -> int:
    if rank == 0:
        print(f"gnn-dist {command}: error: {message}", file=sys.stderr)
    return 1


def _ranks_on_host(default: int) -> int:
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return default


def _report(meta, out: str, seconds: float, peaks: list[int], objective: str = "cut") -> None:
    where = f" on {len(peaks)} ranks" if len(peaks) > 1 else ""
    where += " minimising communication volume" if objective == "volume" else ""
    per_rank = " / ".join(f"{peak / 2**30:.2f}" for peak in peaks)
    print(f"partitioned {meta.dataset} ({meta.num_nodes:,} nodes, {meta.num_edges:,} directed edges) into "
          f"{meta.num_parts} parts by {meta.method}{where} in {seconds:.1f}s: edge cut {meta.edge_cut:,}, "
          f"peak RSS per rank {per_rank} GiB, wrote {out}")


def cmd_partition(args, argv: list[str]) -> int:
    from gnn_dist.comm.communicator import launcher_rank
    from gnn_dist.partition.datasets import dataset_sizes, load_dataset
    from gnn_dist.partition.format import PartitionFormatError
    from gnn_dist.partition.graph import DatasetError
    from gnn_dist.partition.hetero import HeteroGraph
    from gnn_dist.partition.memory_model import refusal
    from gnn_dist.partition.metis import PartitionError, check_num_parts
    from gnn_dist.partition.partitioner import DEFAULT_BALANCE, partition_graph

    start = time.perf_counter()
    if args.num_parts < 1:
        return _fail("partition", "--num-parts must be at least 1, got " + str(args.num_parts), launcher_rank() or 0)
    edge_split = None
    if args.task == "link":
        from gnn_dist.partition.link_split import parse_edge_split

        try:
            edge_split = parse_edge_split(args.edge_split)
        except ValueError as err:
            return _fail("partition", str(err), launcher_rank() or 0)
        if args.mrr_negatives < 1:
            return _fail("partition", f"--mrr-negatives must be at least 1, got {args.mrr_negatives}",
                         launcher_rank() or 0)
        if args.method == "ptscotch" or args.dataset.startswith("chunked:"):
            return _fail("partition", "--task link splits the edges of a graph one process holds: partition the "
                                      "dataset itself (not chunked:DIR) with --method metis or random; PT-Scotch "
                                      "and chunked input carry no edge split yet", launcher_rank() or 0)
    if args.method != "ptscotch":
        if args.ranks is not None and args.ranks != 1:
            return _fail("partition", f"--ranks is for --method ptscotch ({args.method} runs in one process)")
        sizes = dataset_sizes(args.dataset, args.root)
        reason = refusal(sizes, args.method, 1, 1, args.memory_limit)
        if reason:
            return _fail("partition", reason)
        try:
            graph = load_dataset(args.dataset, args.root, seed=args.seed, download=args.download)
            # a source that cannot tell its sizes before loading is checked before METIS, the larger part
            reason = refusal(graph.sizes(), args.method, 1, 1, args.memory_limit) if sizes is None else None
            if reason:
                return _fail("partition", reason)
            if isinstance(graph, HeteroGraph):
                meta = _partition_typed(graph, args)
                _report(meta, args.out, time.perf_counter() - start, [peak_rss_bytes()], args.objective)
                return 0
            if args.normalize_features:
                graph = graph.with_normalized_features()
            meta = partition_graph(graph, args.num_parts, args.out, method=args.method, seed=args.seed,
                                   balance_train=args.balance_train,
                                   balance=args.balance or ("nodes" if args.balance_train else DEFAULT_BALANCE),
                                   overwrite=args.overwrite,
                                   locality_block=args.locality_block, objective=args.objective, task=args.task,
                                   **({"edge_split": edge_split, "mrr_negatives": args.mrr_negatives}
                                      if edge_split else {}))
        except (DatasetError, PartitionError, PartitionFormatError, OSError) as err:
            return _fail("partition", str(err))
        _report(meta, args.out, time.perf_counter() - start, [peak_rss_bytes()], args.objective)
        return 0

    if args.objective != "cut":
        return _fail("partition", f"--objective {args.objective} is an objective of METIS: use it with --method "
                                  f"metis (PT-Scotch minimises the cut)", launcher_rank() or 0)
    if args.balance_train:
        return _fail("partition", "--balance-train needs METIS's second vertex constraint, which Scotch lacks: "
                                  "drop it or use --method metis", launcher_rank() or 0)
    if args.balance not in (None, "nodes"):
        return _fail("partition", f"--balance {args.balance} weighs METIS's vertices; the PT-Scotch path balances "
                                  f"nodes: drop it or use --method metis", launcher_rank() or 0)
    if args.normalize_features and args.dataset.startswith("chunked:"):
        return _fail("partition", "--normalize-features is not supported for chunked: datasets: drop it, or "
                                  "partition the original --dataset instead of its chunked copy",
                     launcher_rank() or 0)
    inside_job = launcher_rank() is not None
    if not inside_job and (args.ranks or 1) > 1:
        return _launch(args, argv)

    from gnn_dist.comm.communicator import make_world_comm
    from gnn_dist.comm.simulated_ranks import solo_comm
    from gnn_dist.partition.distributed import ChunkedSource, GraphSource, partition_distributed
    from gnn_dist.partition.scotch import scotch_assign
    from gnn_dist.partition.shuffle import CollectiveError

    comm = make_world_comm() if inside_job else solo_comm()
    if args.ranks is not None and args.ranks != comm.size:
        return _fail("partition", f"--ranks {args.ranks} but the job has {comm.size} ranks: pass --ranks "
                                  f"{comm.size} or drop it under mpirun", comm.rank)
    chunked = args.dataset.startswith("chunked:")
    if comm.size > 1 and not chunked:
        return _fail("partition", f"{args.dataset} would be loaded whole by every rank: write it chunked first "
                                  f"(gnn-dist convert --dataset {args.dataset} --out DIR) and pass --dataset "
                                  f"chunked:DIR", comm.rank)
    reason = refusal(dataset_sizes(args.dataset, args.root), "ptscotch", comm.size, _ranks_on_host(comm.size),
                     args.memory_limit)
    if reason:
        return _fail("partition", reason, comm.rank)
    try:
        if chunked:
            source = ChunkedSource(args.dataset.partition(":")[2])
        else:
            graph = load_dataset(args.dataset, args.root, seed=args.seed, download=args.download)
            source = GraphSource(graph.with_normalized_features() if args.normalize_features else graph)
        check_num_parts(args.num_parts, source.num_nodes)
        meta = partition_distributed(comm, source, args.num_parts, args.out, assigner=scotch_assign,
                                     method="ptscotch", seed=args.seed, overwrite=args.overwrite,
                                     locality_block=args.locality_block)
    except (DatasetError, PartitionError, PartitionFormatError, CollectiveError, OSError) as err:
        return _fail("partition", str(err), comm.rank)
    except Exception:  # noqa: BLE001 - an unexpected failure on one rank must bring the whole job down
        if comm.size == 1:
            raise
        print(f"gnn-dist partition: rank {comm.rank} failed:\n{traceback.format_exc()}", file=sys.stderr)
        comm.abort(1)
        raise
    peaks = comm.allgather_object(peak_rss_bytes())
    if comm.rank == 0:
        _report(meta, args.out, time.perf_counter() - start, peaks)
    return 0


def _partition_typed(graph, args):
    """A typed graph (gnn_dist.partition.hetero_parts): its relations' reverses added unless
    --no-reverse-relations; the options that only homogeneous graphs have are refused by name."""
    from gnn_dist.partition.graph import DatasetError
    from gnn_dist.partition.hetero_parts import TYPED_BALANCE, partition_typed_graph

    for flag, given in (("--task link", args.task == "link"), ("--balance-train", args.balance_train),
                        ("--normalize-features", args.normalize_features)):
        if given:
            raise DatasetError(f"{flag} is not supported for a typed graph ({graph.name}) yet: drop it (each node "
                               f"type and the training nodes are balanced already)")
    if args.balance not in (None, "nodes") and args.method != "metis":
        raise DatasetError(f"--balance {args.balance} weighs METIS's vertices, and --method {args.method} does not "
                           f"read them: use --method metis, or drop --balance")
    if not args.no_reverse_relations:
        graph = graph.with_reverse_relations()
    return partition_typed_graph(graph, args.num_parts, args.out, method=args.method, seed=args.seed,
                                 overwrite=args.overwrite, locality_block=args.locality_block,
                                 objective=args.objective, balance=args.balance or TYPED_BALANCE)


def _launch(args, argv: list[str]) -> int:
    """Rerun this command on args.ranks ranks of this host under the system's Open MPI."""
    from gnn_dist.partition.datasets import dataset_sizes
    from gnn_dist.partition.memory_model import refusal
    from gnn_dist.partition.scotch import launch_command, missing_for_ranks, rank_environment, scotch_int_bits

    problem = missing_for_ranks()
    if problem:
        return _fail("partition", problem)
    shape = dataset_sizes(args.dataset, args.root)
    reason = refusal(shape, "ptscotch", args.ranks, args.ranks, args.memory_limit)
    if reason:
        return _fail("partition", reason)
    # both directions of every stored edge bound the symmetric graph's directed edges
    bits = scotch_int_bits(shape.num_nodes, 2 * shape.input_edges) if shape else 64
    env = {**os.environ, **rank_environment(bits), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(launch_command(args.ranks, argv), env=env).returncode


def cmd_convert(args) -> int:
    from gnn_dist.partition.convert import convert
    from gnn_dist.partition.graph import DatasetError

    start = time.perf_counter()
    try:
        meta = convert(args.dataset, args.out, root=args.root, seed=args.seed, overwrite=args.overwrite,
                       edges_per_chunk=args.edges_per_chunk)
    except (DatasetError, OSError) as err:
        return _fail("convert", str(err))
    print(f"wrote {meta.name} ({meta.num_nodes:,} nodes, {meta.num_input_edges:,} input edges in "
          f"{len(meta.edge_chunks)} edge chunk(s), {len(meta.node_chunks)} node chunk(s)) to {args.out} in "
          f"{time.perf_counter() - start:.1f}s")
    return 0
