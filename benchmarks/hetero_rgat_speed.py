"""R-GAT's epoch time beside PyG's HeteroConv recipe, and P=2 over P=1.

    python -m gnn_dist.benchmarks.hetero_rgat_speed --datasets ../shared/data/hetero/acm.npz,../shared/data/hetero/freebase.npz \\
        [--rounds 3] [--epochs 30] [--out runs/bench-rgat-speed]

One thread per process; each round runs PyG (gnn_dist.benchmarks.hetero_bench.pyg_run: the median of its training
steps), then `mpiexec -n 1` and `-n 2 gnn-dist train --model rgat --heads 2` (their final records' median
epoch_s), so the three share the host's drift. Partitions are made once under --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table, run_train
from gnn_dist.benchmarks.hetero_bench import pyg_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", required=True, help="comma-separated typed .npz files")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--out", default="runs/bench-rgat-speed")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw, rows = {}, []
    for path in args.datasets.split(","):
        name = Path(path).stem
        parts = {}
        for p in (1, 2):
            parts[p] = out / f"parts-{name}-{p}"
            if not (parts[p] / "meta.json").exists():
                subprocess.run([sys.executable, "-m", "gnn_dist", "partition", "--dataset", f"hetero:{path}",
                                "--num-parts", str(p), "--out", str(parts[p])], check=True, capture_output=True)
        rounds = []
        for round_ in range(args.rounds):
            timed = {"pyg": pyg_run(path, round_, args.hidden, args.epochs, 0.01, 5e-4, 0.5, "rgat",
                                    args.heads)["epoch_s"]}
            for p in (1, 2):
                final = run_train(p, parts[p], out / f"m-{name}-{p}-{round_}.jsonl",
                                  ["--model", "rgat", "--heads", str(args.heads), "--hidden", str(args.hidden),
                                   "--num-layers", "2", "--epochs", str(args.epochs), "--seed", str(round_)])
                timed[f"p{p}"] = final["epoch_s_median"]
            rounds.append(timed)
            print(name, round_, timed, file=sys.stderr, flush=True)
        raw[name] = rounds
        rows.append([name, ", ".join(f"{1000 * r['pyg']:.0f}" for r in rounds),
                     ", ".join(f"{1000 * r['p1']:.0f}" for r in rounds), ", ".join(f"{1000 * r['p2']:.0f}" for r in rounds),
                     f"{statistics.median(r['p1'] / r['pyg'] for r in rounds):.2f}x",
                     f"{statistics.median(r['p1'] / r['p2'] for r in rounds):.2f}x"])
    table = markdown_table(["graph", "PyG epoch (ms)", "gnn-dist P=1 (ms)", "gnn-dist P=2 (ms)", "P=1 / PyG (median)",
                            "P=2 over P=1 (median)"], rows)
    text = (f"R-GAT 2 layers, hidden {args.hidden} with {args.heads} heads in the hidden layer, dropout 0.5, "
            f"{args.epochs} epochs per run, {args.rounds} rounds; {machine()['cpu']}, one thread per process\n\n"
            f"{table}\n")
    (out / "hetero-rgat-speed.md").write_text(text)
    (out / "hetero-rgat-speed.json").write_text(json.dumps({"machine": machine(), "config": vars(args),
                                                            "rounds": raw}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
