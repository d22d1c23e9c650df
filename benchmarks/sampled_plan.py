"""Sampled training's memory plan on homogeneous graphs beside the measured peak RSS per rank, per phase.

    python -m gnn_dist.benchmarks.sampled_plan --datasets synthetic:sbm60k,synthetic:medium --parts 1,2 \
        --models sage,gcn,gat --out runs/bench-sampled-plan

One epoch of `gnn-dist train --mode sampled` (fanouts 15,10,5, batch 1024 per rank; GraphSAGE and GCN 3 x 256,
GAT 3 x 4 heads x 64), then its evaluation, on one METIS partition per (graph, P), made first. The final record
gives every rank's planned peak (gnn_dist.plan.sampled, sized by epoch 0's first batch) and its measured peak RSS,
and the phase peaks of the rank where each phase peaked. Target: every rank within 15% of its plan.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table, partition, run_train, write_report

MIB = 2**20
MODELS = {"sage": ["--model", "sage", "--hidden", "256"], "gcn": ["--model", "gcn", "--hidden", "256"],
          "gat": ["--model", "gat", "--heads", "4", "--hidden", "64"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="synthetic:sbm60k,synthetic:medium")
    parser.add_argument("--parts", default="1,2")
    parser.add_argument("--models", default="sage,gcn,gat")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--out", default="runs/bench-sampled-plan")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, runs = [], []
    for dataset in args.datasets.split(","):
        for num_parts in (int(p) for p in args.parts.split(",")):
            parts = partition(dataset, num_parts, out / f"parts-{dataset.replace(':', '_')}-{num_parts}")
            for model in args.models.split(","):
                final = run_train(num_parts, parts, out / f"m-{parts.name}-{model}.jsonl",
                                  [*MODELS[model], "--num-layers", "3", "--mode", "sampled", "--fanouts", "15,10,5",
                                   "--batch-size", str(args.batch_size), "--epochs", "1", "--no-progress"])
                measured, planned = final["peak_rss_bytes_per_rank"], final["planned_peak_rss_bytes_per_rank"]
                ratios = [m / p for m, p in zip(measured, planned)]
                runs.append({"dataset": dataset, "parts": num_parts, "model": model, "measured": measured,
                             "planned": planned, "phases": {k: final.get(f"{k}_peak_rss_bytes")
                                                            for k in ("setup", "train", "eval")}})
                rows.append([dataset, num_parts, model, " / ".join(f"{m / MIB:.0f}" for m in measured),
                             " / ".join(f"{p / MIB:.0f}" for p in planned),
                             f"{min(ratios):.3f}-{max(ratios):.3f}" if len(ratios) > 1 else f"{ratios[0]:.3f}",
                             " / ".join(f"{final.get(f'{k}_peak_rss_bytes', 0) / MIB:.0f}"
                                        for k in ("setup", "train", "eval"))])
                print(rows[-1], flush=True)
    table = markdown_table(["graph", "P", "model", "peak RSS per rank (MiB)", "planned (MiB)", "measured / planned",
                            "setup / train / eval peaks (MiB)"], rows)
    text = (f"Sampled training (fanouts 15,10,5, batch {args.batch_size}, 3 layers, one epoch and its evaluation), "
            f"{machine()['cpu']}\n\n{table}\n")
    write_report(out, "sampled-plan", text, args, runs)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
