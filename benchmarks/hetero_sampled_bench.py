"""Sampled R-GCN on typed graphs beside full-batch R-GCN (the accuracy benchmark).

    python -m gnn_dist.benchmarks.hetero_sampled_bench \\
        --datasets hetero:../shared/data/hetero/acm.npz,hetero:../shared/data/hetero/freebase.npz \\
        --batch-sizes 64,64 --seeds 0-9 [--parts 1] [--epochs 200] [--out runs/bench-hetero-sampled]

Both sides are gnn-dist on the same partition with the recipe of hetero_bench (2 layers, hidden 64, dropout
0.5, Adam lr 0.01, weight decay 5e-4, the same epochs): full-batch, and `--mode sampled --fanouts F,F` (per
relation) with the dataset's batch size. The figure is the test accuracy at the best validation epoch; the
sampled side's epochs are passes over the training nodes, so it takes many more optimiser steps.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from gnn_dist.benchmarks.common import machine, markdown_table, partition, run_train
from gnn_dist.benchmarks.hetero_bench import seeds_of


def partition_of(dataset: str, parts: int, out: Path) -> Path:
    name = dataset.split(":", 1)[1].rsplit("/", 1)[-1].removesuffix(".npz")
    return partition(dataset, parts, out / f"parts-{name}-{parts}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", required=True, help="comma-separated --dataset values (hetero:PATH, synthetic:mag200k)")
    parser.add_argument("--batch-sizes", required=True, help="comma-separated, one per dataset")
    parser.add_argument("--fanouts", default="10,10")
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--parts", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--sampled-epochs", type=int, default=0, help="epochs of the sampled side (default: --epochs)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--full-embedding-weight-decay", type=float, default=None,
                        help="the full-batch side's --embedding-weight-decay (default: --weight-decay's 5e-4, as PyG; "
                             "0 decays the tables as little as the sampled side's SparseAdam rule)")
    parser.add_argument("--out", default="runs/bench-hetero-sampled")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    recipe = ["--model", "rgcn", "--hidden", str(args.hidden), "--num-layers", "2", "--dropout", "0.5", "--lr", "0.01",
              "--weight-decay", "5e-4"]
    rows, raw = [], []
    for dataset, batch in zip(args.datasets.split(","), args.batch_sizes.split(",")):
        parts = partition_of(dataset, args.parts, out)
        name = parts.name
        full, sampled, seconds = [], [], []
        for seed in seeds_of(args.seeds):
            common = recipe + ["--seed", str(seed)]
            tables = [] if args.full_embedding_weight_decay is None else \
                ["--embedding-weight-decay", str(args.full_embedding_weight_decay)]
            full.append(run_train(args.parts, parts, out / f"m-{name}-full-{seed}.jsonl",
                                  common + ["--epochs", str(args.epochs)] + tables)["test_acc_at_best_val"])
            start = time.perf_counter()
            final = run_train(args.parts, parts, out / f"m-{name}-sampled-{seed}.jsonl",
                              common + ["--epochs", str(args.sampled_epochs or args.epochs), "--mode", "sampled",
                                        "--fanouts", args.fanouts, "--batch-size", batch])
            seconds.append(time.perf_counter() - start)
            sampled.append(final["test_acc_at_best_val"])
            print(f"{name} seed {seed}: full {full[-1]:.4f}, sampled {sampled[-1]:.4f}", file=sys.stderr, flush=True)
        diff = np.array(sampled) - np.array(full)
        raw.append({"dataset": dataset, "batch_size": int(batch), "full": full, "sampled": sampled,
                    "sampled_run_s": seconds})
        rows.append([name, batch, f"{100 * np.mean(full):.2f} ± {100 * np.std(full, ddof=1):.2f}",
                     f"{100 * np.mean(sampled):.2f} ± {100 * np.std(sampled, ddof=1):.2f}", f"{100 * diff.mean():+.2f}",
                     f"{100 * diff.min():+.2f} to {100 * diff.max():+.2f}"])
    table = markdown_table(["partition", "batch", "full-batch (%)", f"sampled, fanouts {args.fanouts} per relation (%)",
                            "sampled - full (points)", "per seed (points)"], rows)
    tables = "" if args.full_embedding_weight_decay is None else \
        f" (full-batch's embedding tables {args.full_embedding_weight_decay:g})"
    text = (f"R-GCN 2 layers, hidden {args.hidden}, dropout 0.5, Adam lr 0.01, weight decay 5e-4{tables}, P={args.parts}, "
            f"seeds {args.seeds}; full-batch {args.epochs} epochs, sampled {args.sampled_epochs or args.epochs}; "
            f"test accuracy at best validation; {machine()['cpu']}\n\n{table}\n")
    (out / "hetero-sampled.md").write_text(text)
    (out / "hetero-sampled.json").write_text(json.dumps({"machine": machine(), "config": vars(args), "runs": raw},
                                                        indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
