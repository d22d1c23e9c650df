"""What METIS balances (`gnn-dist partition --balance nodes|edges|both`): node and edge balance and edge cut per
graph, P and seed, then, optionally, epoch time of P = 1 against a P = 2 partition of each rule, rounds
alternating.

    python -m gnn_dist.benchmarks.balance_bench --datasets planetoid:Cora,npz:../shared/data/npz/facebook.npz \
        --root ../shared/data/planetoid --parts 2,4,8 --seeds 0,1,2 --out runs/bench-balance
    python -m gnn_dist.benchmarks.balance_bench --datasets npz:../shared/data/npz/twitch_fr.npz --parts 2 \
        --time "--model gat --heads 4 --hidden 64 --num-layers 3" --epochs 20 --rounds 3 --out runs/bench-balance-gat

Balance is max/mean over parts: of node counts, and of operator rows' entries (in-degree + 1, the
aggregation's work). Beside the three rules, METIS's own multi-constraint mode (node counts and edges as two
vertex weights, k-way, DistDGL's balance_edges) is tried through pymetis, for the record. Partitioning runs in
this process; the timed runs are real `mpiexec -n P gnn-dist train` processes, one at a time, one torch thread
each.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from unittest import mock

import numpy as np

from gnn_dist.benchmarks.common import machine, markdown_table, run_train

RULES = {"--balance nodes": {"balance": "nodes"}, "--balance edges": {"balance": "edges"},
         "--balance both": {"balance": "both"},
         "nodes and edges, two METIS constraints (pymetis)": {"balance": "nodes", "two_constraints": True}}


def assign(graph, num_parts: int, seed: int, balance: str = "nodes", two_constraints: bool = False):
    """The part vector of a rule; two_constraints asks METIS (k-way) itself for node counts and edges at once,
    DistDGL's way, by handing pymetis both vertex weights."""
    import pymetis

    from gnn_dist.partition.metis import assign_parts

    if not two_constraints:
        return assign_parts(graph, num_parts, seed=seed, balance=balance)
    real = pymetis.part_graph
    rows = np.bincount(graph.edge_index[1], minlength=graph.num_nodes) + 1

    def both(*args, **kwargs):
        weights = np.stack([np.ones(graph.num_nodes, dtype=np.int64), rows], axis=1).reshape(-1)
        return real(*args, **{**kwargs, "vweights": weights, "recursive": False})

    with mock.patch.object(pymetis, "part_graph", both):
        return assign_parts(graph, num_parts, seed=seed, balance=balance)


def balance_rows(datasets: list[str], root: str | None, parts: list[int], seeds: list[int]) -> list[dict]:
    from gnn_dist.partition.datasets import load_dataset

    rows = []
    for spec in datasets:
        graph = load_dataset(spec, root if spec.startswith(("planetoid:", "ogbn-")) else None)
        src, dst = graph.edge_index
        work = np.bincount(dst, minlength=graph.num_nodes) + 1
        for num_parts in parts:
            for rule, options in RULES.items():
                nodes, edges, cuts = [], [], []
                for seed in seeds:
                    assignment = assign(graph, num_parts, seed, **options)
                    counts = np.bincount(assignment, minlength=num_parts)
                    loads = np.bincount(assignment, weights=work, minlength=num_parts)
                    nodes.append(float(counts.max() / counts.mean()))
                    edges.append(float(loads.max() / loads.mean()))
                    cuts.append(int((assignment[src] != assignment[dst]).sum() // 2))
                rows.append({"dataset": spec, "parts": num_parts, "rule": rule, "node_balance_worst": max(nodes),
                             "edge_balance_worst": max(edges), "edge_cut_mean": float(np.mean(cuts)),
                             "node_balance": nodes, "edge_balance": edges, "edge_cuts": cuts})
                print(f"{spec} P={num_parts} {rule}: nodes {max(nodes):.3f} edges {max(edges):.3f} "
                      f"cut {np.mean(cuts):,.0f}", flush=True)
    return rows


def timing_rows(spec: str, root: str | None, train_options: list[str], epochs: int, rounds: int,
                out: Path) -> list[dict]:
    import subprocess
    import sys

    layouts = {"P=1": (1, []), **{f"P=2 --balance {rule}": (2, ["--balance", rule]) for rule in ("nodes", "edges",
                                                                                                "both")}}
    dirs = {}
    for name, (num_parts, flags) in layouts.items():
        directory = out / "partitions" / name.replace(" ", "_").replace("=", "").replace("(", "").replace(")", "")
        if not (directory / "meta.json").exists():
            cmd = [sys.executable, "-m", "gnn_dist", "partition", "--dataset", spec, "--num-parts", str(num_parts),
                   "--out", str(directory), *flags] + (["--root", root] if root and spec.startswith("planetoid:")
                                                       else [])
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        dirs[name] = (num_parts, directory)
    medians: dict[str, list[float]] = {name: [] for name in layouts}
    for round_ in range(rounds):
        for name, (num_parts, directory) in dirs.items():
            final = run_train(num_parts, directory, out / f"metrics-{round_}-{num_parts}-{directory.name}.jsonl",
                              [*train_options, "--epochs", str(epochs)])
            times = [r["epoch_s"] for r in final["per_epoch"][2:]]  # the first epochs warm caches and allocators
            medians[name].append(statistics.median(times))
            print(f"round {round_ + 1} {name}: {medians[name][-1]:.4f} s/epoch", flush=True)
    rows = []
    for name in layouts:
        speedups = [p1 / t for p1, t in zip(medians["P=1"], medians[name])]
        rows.append({"layout": name, "epoch_s": medians[name], "speedup_per_round": speedups})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", required=True, help="comma-separated dataset specs")
    parser.add_argument("--root", default=None, help="folder of planetoid (or ogbn) datasets")
    parser.add_argument("--parts", default="2,4,8")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--time", default=None, metavar="TRAIN_OPTIONS",
                        help="also time P=1 against both P=2 partitions of the first dataset with these train options")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    datasets = args.datasets.split(",")
    rows = balance_rows(datasets, args.root, [int(p) for p in args.parts.split(",")],
                        [int(s) for s in args.seeds.split(",")])
    lines = [f"# METIS balance: nodes against --balance-edges ({machine()['cpu']})", "",
             f"Seeds {args.seeds}; balance is max/mean over parts (worst seed), edges are operator entries "
             "(in-degree + 1).", "",
             markdown_table(["graph", "P", "rule", "nodes max/mean", "edges max/mean", "edge cut (mean)"],
                            [[r["dataset"].split("/")[-1], r["parts"], r["rule"], f"{r['node_balance_worst']:.3f}",
                              f"{r['edge_balance_worst']:.3f}", f"{r['edge_cut_mean']:,.0f}"] for r in rows])]
    result = {"balance": rows}
    if args.time:
        timed = timing_rows(datasets[0], args.root, args.time.split(), args.epochs, args.rounds, out)
        result["timing"] = timed
        lines += ["", f"Epoch time of {datasets[0].split('/')[-1]} with `{args.time}`, {args.epochs} epochs, median "
                  f"of each run's epochs after the second, {args.rounds} rounds alternating:", "",
                  markdown_table(["layout", "s/epoch per round", "speed-up over P=1 per round"],
                                 [[r["layout"], ", ".join(f"{t:.3f}" for t in r["epoch_s"]),
                                   ", ".join(f"{s:.2f}x" for s in r["speedup_per_round"])] for r in timed])]
    (out / "balance.json").write_text(json.dumps(result, indent=1))
    (out / "balance.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
