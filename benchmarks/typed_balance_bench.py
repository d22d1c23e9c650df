"""What METIS weighs before a typed graph's node types are balanced (`gnn-dist partition --balance
nodes|edges|both` on a typed graph): per graph, P and seed, the worst node type's balance, the training nodes',
the edges' (each part's operator rows over every relation: its owned nodes' in-edges plus one), the cut and the
replication factor; then, optionally, R-GCN's epoch time at P = 1 against P = 2 partitions of each rule, rounds
alternating.

    python -m gnn_dist.benchmarks.typed_balance_bench --datasets hetero:../shared/data/hetero/acm.npz,\\
        hetero:../shared/data/hetero/freebase.npz,synthetic:mag200k,stress:mag200k-cross \\
        --parts 2,4,8 --seeds 0,1,2 --out runs/bench-typed-balance
    python -m gnn_dist.benchmarks.typed_balance_bench --datasets synthetic:mag200k --parts 2 --seeds 0 \\
        --time "--model rgcn --hidden 64 --num-layers 2" --epochs 10 --rounds 5 --out runs/bench-typed-balance-time

Balance is max/mean over parts. `stress:mag200k-cross` is synthetic:mag200k drawn with 20% of each edge's other
ends in the paper's class instead of 70% (partition.synthetic_mag.MagSpec.in_class): a high cut, weak locality.
Every rule then balances each node type and the target's training nodes within 3%
(partition.hetero_parts.balance_types), so the node types' columns say what that pass leaves. Partitioning runs
in this process; the timed runs are real `mpiexec -n P gnn-dist train` processes, one at a time, one torch
thread each.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from gnn_dist.benchmarks.common import machine, markdown_table, run_train

RULES = ("nodes", "edges", "both")
STRESS = {"mag200k-cross": (0.1, 0.2)}  # name: (scale, in_class)


def load(spec: str):
    """A typed graph with its reverse relations, as `gnn-dist partition` builds it."""
    from gnn_dist.partition.datasets import load_dataset
    from gnn_dist.partition.synthetic_mag import MagSpec, make_mag

    if spec.startswith("stress:"):
        scale, in_class = STRESS[spec.split(":", 1)[1]]
        graph = make_mag(MagSpec(scale, in_class), spec.split(":", 1)[1])
    else:
        graph = load_dataset(spec, None)
    return graph.with_reverse_relations()


def balance_of(counts: np.ndarray) -> float:
    return float(counts.max() / counts.mean())


def part_figures(graph, adjacency, edge_index, node_type, parts: np.ndarray, num_parts: int) -> dict:
    """The balances, cut and replication factor of one part vector (homogeneous ids)."""
    src, dst = edge_index
    n = len(parts)
    types = [balance_of(np.bincount(parts[node_type == k], minlength=num_parts)) for k in range(len(graph.node_types))]
    rows = np.bincount(parts[dst], minlength=num_parts) + np.bincount(parts, minlength=num_parts)
    cut = parts[src] != parts[dst]
    halo = np.unique(parts[dst[cut]] * n + src[cut]).size  # distinct (part, remote source) pairs
    return {"worst_type_balance": max(types), "type_balances": types,
            "train_balance": balance_of(np.bincount(parts[adjacency.train_mask], minlength=num_parts)),
            "edge_balance": balance_of(rows), "cut_fraction": float(cut.mean()), "replication": (n + halo) / n}


def balance_rows(datasets: list[str], parts: list[int], seeds: list[int]) -> list[dict]:
    from gnn_dist.partition.hetero_parts import assign_typed_parts, typed_adjacency

    rows = []
    for spec in datasets:
        graph = load(spec)
        adjacency, edge_index, _, node_type = typed_adjacency(graph)
        for p in parts:
            for seed in seeds:
                for rule in RULES:
                    assigned = assign_typed_parts(graph, adjacency, node_type, p, seed=seed, balance=rule)
                    rows.append({"dataset": spec, "parts": p, "seed": seed, "rule": rule,
                                 **part_figures(graph, adjacency, edge_index, node_type, assigned, p)})
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def worst_table(rows: list[dict]) -> str:
    """Per dataset, P and rule: the worst over seeds of each balance, the mean cut and replication."""
    table = []
    keys = sorted({(r["dataset"], r["parts"], r["rule"]) for r in rows}, key=lambda k: (k[0], k[1], RULES.index(k[2])))
    for dataset, p, rule in keys:
        mine = [r for r in rows if (r["dataset"], r["parts"], r["rule"]) == (dataset, p, rule)]
        table.append([dataset, p, rule, f"{max(r['worst_type_balance'] for r in mine):.3f}",
                      f"{max(r['train_balance'] for r in mine):.3f}", f"{max(r['edge_balance'] for r in mine):.3f}",
                      f"{statistics.mean(r['cut_fraction'] for r in mine):.3f}",
                      f"{statistics.mean(r['replication'] for r in mine):.3f}"])
    return markdown_table(["dataset", "P", "--balance", "worst type (max over seeds)", "training nodes",
                           "edges", "cut (mean)", "replication (mean)"], table)


def timed_rows(spec: str, train_args: list[str], epochs: int, rounds: int, out: Path) -> list[dict]:
    """Rounds alternating P=1 and a P=2 partition of each rule: epoch seconds (median past the first two)."""
    import shlex

    from gnn_dist.partition.hetero_parts import partition_typed_graph

    graph = load(spec)
    name = spec.replace(":", "-").replace("/", "-")
    directories = {"P=1": out / f"parts-{name}-1"}
    partition_typed_graph(graph, 1, directories["P=1"], overwrite=True)
    for rule in RULES:
        directories[rule] = out / f"parts-{name}-2-{rule}"
        partition_typed_graph(graph, 2, directories[rule], balance=rule, overwrite=True)
    extra = [*shlex.split(train_args), "--epochs", str(epochs), "--eval-every", str(10 * epochs)]
    rows = []
    for r in range(rounds):
        for label, directory in directories.items():
            p = 1 if label == "P=1" else 2
            final = run_train(p, directory, out / f"m-{name}-{label.replace('=', '')}-{r}.jsonl", extra)
            seconds = statistics.median(e["epoch_s"] for e in final["per_epoch"][2:])
            rows.append({"dataset": spec, "round": r, "run": label, "epoch_s": seconds,
                         "comm_s": statistics.median(e["comm_s"] for e in final["per_epoch"][2:])})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def speedup_table(rows: list[dict]) -> str:
    table = []
    for dataset in dict.fromkeys(row["dataset"] for row in rows):
        mine = [row for row in rows if row["dataset"] == dataset]
        for rule in RULES:
            ratios = []
            for r in sorted({row["round"] for row in mine}):
                this_round = {row["run"]: row["epoch_s"] for row in mine if row["round"] == r}
                ratios.append(this_round["P=1"] / this_round[rule])
            table.append([dataset, rule, ", ".join(f"{v:.2f}" for v in ratios), f"{statistics.median(ratios):.2f}"])
    return markdown_table(["dataset", "--balance", "P=2 speed-up over P=1 per round", "median"], table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", required=True, help="comma-separated typed dataset specs (stress:NAME too)")
    parser.add_argument("--parts", default="2,4,8")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--time", default=None, help="train options: also time P=1 against each rule's P=2")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="runs/bench-typed-balance")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    datasets = args.datasets.split(",")
    rows = balance_rows(datasets, [int(p) for p in args.parts.split(",")], [int(s) for s in args.seeds.split(",")])
    timed = [row for spec in datasets for row in timed_rows(spec, args.time, args.epochs, args.rounds, out)] \
        if args.time else []
    (out / "typed-balance.json").write_text(json.dumps({"machine": machine(), "config": vars(args), "balance": rows,
                                                        "timed": timed}, indent=1))
    report = worst_table(rows) + ("\n\n" + speedup_table(timed) if timed else "")
    (out / "typed-balance.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
