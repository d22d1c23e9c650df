"""Typed graphs: peak memory per rank as ranks are added, and the typed memory plan's error.

    python -m gnn_dist.benchmarks.hetero_memory \\
        --datasets hetero:../shared/data/hetero/acm.npz,hetero:../shared/data/hetero/freebase.npz,synthetic:mag200k \\
        --parts 1,2,4 --out runs/bench-hetero-memory [--parts-dir DATASET=DIR_WITH_{P},...] \\
        [--mode sampled --fanouts 10,10 --batch-sizes 64,64,1024] [--halo-memory sequential]

R-GCN (or --model rgat), hidden 64, 2 layers, dropout 0.5, exact schedule, one thread per rank. Each run is a real `mpiexec -n P
gnn-dist train` of a few epochs; its final record gives every rank's peak RSS and the peak the plan
(gnn_dist.plan.typed, or gnn_dist.plan.typed_sampled under --mode sampled: one epoch then) predicted for that rank
before the run. Reports measured over planned per rank (target:
within 15%, worst case given) and the largest rank's peak at P over P=1's (target at ogbn-mag's scale: P=2 at
most 0.6x P=1), with the replication factor beside every figure. --parts-dir reuses partitions made
beforehand (ogbn-mag-sized ones take minutes: never partition beside a training run).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from gnn_dist.benchmarks.common import markdown_table, partition, run_train, write_report
from gnn_dist.partition.format import load_meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default="hetero:../shared/data/hetero/acm.npz,"
                                              "hetero:../shared/data/hetero/freebase.npz,synthetic:mag200k")
    parser.add_argument("--parts", default="1,2,4")
    parser.add_argument("--model", default="rgcn", help="rgcn or rgat")
    parser.add_argument("--heads", type=int, default=1, help="--model rgat: heads of each hidden layer")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--extra", default="", help="more train options for every run, e.g. '--num-bases 2'")
    parser.add_argument("--parts-dir", default="",
                        help="DATASET=DIR,...: partitions made beforehand, DIR holding {P} for the part count")
    parser.add_argument("--mode", default="full", help="full or sampled")
    parser.add_argument("--fanouts", default="10,10", help="--mode sampled: per relation, per hop")
    parser.add_argument("--batch-sizes", default="1024", help="--mode sampled: seeds per rank per step, one per "
                                                              "dataset (or one for all)")
    parser.add_argument("--halo-memory", default="resident", help="resident or sequential (full-batch R-GCN)")
    parser.add_argument("--out", default="runs/bench-hetero-memory")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    made = dict(entry.split("=", 1) for entry in args.parts_dir.split(",") if entry)
    rows, raw = [], []
    datasets = args.datasets.split(",")
    batch_sizes = args.batch_sizes.split(",")
    batch_sizes = batch_sizes * len(datasets) if len(batch_sizes) == 1 else batch_sizes
    for dataset, batch_size in zip(datasets, batch_sizes):
        sampled = ["--mode", "sampled", "--fanouts", args.fanouts, "--batch-size", batch_size,
                   "--eval-every", str(args.epochs)] if args.mode == "sampled" else []
        stem = Path(dataset).stem.replace(":", "_")
        base = None
        for p in (int(v) for v in args.parts.split(",")):
            parts = Path(made[dataset].format(P=p)) if dataset in made else \
                partition(dataset, p, out / f"parts-{stem}-{p}")
            meta = load_meta(parts)
            final = run_train(p, parts, out / f"m-{stem}-{p}.jsonl",
                              ["--model", args.model, "--hidden", str(args.hidden),
                               *(["--heads", str(args.heads)] if args.heads > 1 else []), "--num-layers", "2",
                               "--epochs", str(args.epochs), *sampled, "--halo-memory", args.halo_memory,
                               *args.extra.split()])
            measured, planned = final["peak_rss_bytes_per_rank"], final["planned_peak_rss_bytes_per_rank"]
            ratios = [m / q for m, q in zip(measured, planned)]
            replication = (meta.num_nodes + sum(part.halo for part in meta.parts)) / meta.num_nodes
            base = base or max(measured)
            raw.append({"dataset": dataset, "parts": p, "measured": measured, "planned": planned,
                        "phases": {phase: final[f"{phase}_peak_rss_bytes"] for phase in ("setup", "train", "eval")},
                        "replication": replication, "epoch_s_median": final["epoch_s_median"],
                        "halo_bytes_per_epoch": final["halo_bytes_total"] / args.epochs})
            rows.append([dataset, p, f"{replication:.3f}", " / ".join(f"{m / 2**30:.3f}" for m in measured),
                         " / ".join(f"{q / 2**30:.3f}" for q in planned),
                         f"{min(ratios):.3f}-{max(ratios):.3f}", f"{max(measured) / base:.3f}",
                         f"{final['epoch_s_median']:.3f}", f"{final['halo_bytes_total'] / args.epochs / 1e6:.1f}"])
            print(rows[-1], flush=True)
    worst = max(abs(m / q - 1) for r in raw for m, q in zip(r["measured"], r["planned"]))
    table = markdown_table(["dataset", "P", "replication", "peak RSS per rank (GiB)", "planned (GiB)",
                            "measured / planned", "largest / P=1's", "epoch s (median)", "halo MB per epoch"],
                           rows)
    model = "R-GCN" if args.model == "rgcn" else f"R-GAT ({args.heads} heads)"
    how = f"{args.epochs} epochs, exact, {args.halo_memory} halos" if args.mode == "full" else \
        f"sampled: fanouts {args.fanouts} per relation, batch {args.batch_sizes} per rank, {args.epochs} epoch(s)"
    text = (f"# Typed graphs: peak RSS per rank and the plan\n\n{model} hidden {args.hidden}, 2 layers, dropout 0.5, "
            f"{how}. Worst |measured / planned - 1|: {worst:.3f} (target 0.15: "
            f"{'met' if worst <= 0.15 else 'NOT met'}).\n\n{table}\n")
    name = "hetero-memory" + ("" if args.model == "rgcn" else f"-{args.model}") + \
        ("" if args.mode == "full" else f"-{args.mode}") + ("" if args.halo_memory == "resident" else "-sequential")
    write_report(out, name, text, args, raw)
    print(text)


if __name__ == "__main__":
    main()
