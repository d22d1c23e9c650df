"""Full-batch epoch time, memory and bytes: gnn-dist at P = 1, 2 against PyG in one process.

    python -m gnn_dist.benchmarks.fullbatch --dataset synthetic:arxiv --epochs 5 --out runs/bench-fullbatch

Every run is a separate process, one after another (never side by side on
the cores), with one torch thread per process: PyG's GCNConv through
edge_index (its default) and through a torch CSR adjacency, then
`mpiexec -n P gnn-dist train` for each P. With --rounds R the whole sequence
runs R times, so slow phases of a shared host hit every run alike; ratios are
taken within a round (paired) and the table shows their median and range.
Targets: P=1 / PyG <= 1.0,
speed-up P=2 over P=1 >= 1.6, peak RSS per rank P=2 / P=1 <= 0.6, halo bytes
per epoch / `gnn-dist inspect`'s prediction = 1.00.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table, partition, run_train


def pyg_run(dataset: str, root: str | None, path: str, args) -> dict:
    cmd = [sys.executable, "-m", "gnn_dist.benchmarks.pyg_fullbatch", "--dataset", dataset, "--path", path,
           "--epochs", str(args.pyg_epochs), "--hidden", str(args.hidden), "--num-layers", str(args.num_layers),
           "--model", args.model, "--heads", str(args.heads), "--device", args.device] + (["--root", root] if root else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synthetic:arxiv")
    parser.add_argument("--root", default=None)
    parser.add_argument("--parts", default="1,2")
    parser.add_argument("--model", default="gcn")
    parser.add_argument("--heads", type=int, default=1, help="--model gat: heads per hidden layer")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--pyg-epochs", type=int, default=3)
    parser.add_argument("--pyg-paths", default="edge_index,csr")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default="runs/bench-fullbatch")
    parser.add_argument("--device", default="cpu", help="cpu or cuda: both sides run there (cuda adds peak device "
                        "memory, torch.cuda.max_memory_allocated, to the table)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    rows = {"machine": machine(), "config": vars(args), "pyg": {}, "ours": {}}
    model_args = ["--model", args.model, "--hidden", str(args.hidden), "--num-layers", str(args.num_layers)]
    model_args += ["--heads", str(args.heads)] if args.model == "gat" else []
    train_args = model_args + ["--epochs", str(args.epochs), "--eval-every", str(args.epochs), "--device", args.device]
    part_counts = [int(p) for p in args.parts.split(",")]
    for round_index in range(args.rounds):
        for path in filter(None, args.pyg_paths.split(",")):
            result = pyg_run(args.dataset, args.root, path, args)
            rows["pyg"].setdefault(path, []).append(result)
            print(f"round {round_index} pyg {path}: {result['epoch_s_median']:.2f} s/epoch", file=sys.stderr)
        for num_parts in part_counts:
            parts = partition(args.dataset, num_parts, out / f"parts-{args.dataset.replace(':', '_')}-{num_parts}",
                              args.root)
            final = run_train(num_parts, parts, out / f"metrics-p{num_parts}-r{round_index}.jsonl", train_args)
            inspect = subprocess.run([sys.executable, "-m", "gnn_dist", "inspect", str(parts), "--json", *model_args],
                                     capture_output=True, text=True, check=True)
            final["predicted_halo_bytes_per_epoch"] = json.loads(inspect.stdout)["predicted_halo_bytes_per_epoch"]
            rows["ours"].setdefault(num_parts, []).append(final)
            print(f"round {round_index} gnn-dist P={num_parts}: {final['epoch_s_median']:.2f} s/epoch",
                  file=sys.stderr)
    (out / "fullbatch.json").write_text(json.dumps(rows, indent=1))

    def summary(values: list[float]) -> str:
        text = f"{statistics.median(values):.2f}"
        return text + (f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else "")

    def seconds(run: dict) -> float:
        return run["epoch_s_median"]

    def device_gib(run: dict) -> str:
        peak = run.get("peak_device_bytes")
        if peak is None:
            peak = max(run.get("peak_device_bytes_per_rank") or [0]) or None
        return "" if peak is None else f"{peak / 2**30:.2f}"

    table = []
    base = rows["ours"].get(1)
    layer = {"gcn": "GCNConv", "sage": "SAGEConv", "gat": "GATConv"}.get(args.model, args.model)
    first_pyg = next(iter(rows["pyg"].values()), None)
    for path, runs in rows["pyg"].items():
        table.append([f"PyG {layer} ({path}), 1 process", summary([seconds(r) for r in runs]), "", "",
                      summary([r["peak_rss_bytes"] / 2**30 for r in runs]), "", "", "", device_gib(runs[-1])])
    for num_parts, runs in rows["ours"].items():
        r = runs[-1]
        per_epoch = r["halo_bytes_total"] / max(r["epochs"], 1)
        predicted = r["predicted_halo_bytes_per_epoch"]
        vs_pyg = " / ".join(summary([seconds(o) / seconds(p) for o, p in zip(runs, pyg_runs)])
                            for pyg_runs in rows["pyg"].values())
        speedup = summary([seconds(b) / seconds(o) for o, b in zip(runs, base)]) if base else ""
        rss = summary([o["peak_rss_bytes"] / b["peak_rss_bytes"] for o, b in zip(runs, base)]) if base else ""
        ratio = f"{per_epoch / predicted:.2f}" if predicted else "n/a (no halo)"
        rss_vs_pyg = summary([o["peak_rss_bytes"] / p["peak_rss_bytes"] for o, p in zip(runs, first_pyg)]) \
            if first_pyg else ""
        table.append([f"gnn-dist P={num_parts}", summary([seconds(o) for o in runs]), vs_pyg, speedup,
                      summary([o["peak_rss_bytes"] / 2**30 for o in runs]), rss, rss_vs_pyg,
                      f"{per_epoch / 1e6:.1f} MB ({ratio})", device_gib(r)])
    header = ["run", "s/epoch", "vs PyG (" + " / ".join(rows["pyg"]) + ")", "speed-up vs P=1",
              "peak RSS/rank GiB", "RSS vs P=1", "RSS vs PyG (" + next(iter(rows["pyg"]), "") + ")",
              "halo bytes/epoch (vs inspect)", "peak device GiB/rank (cuda)"]
    heads = f" x {args.heads} heads" if args.model == "gat" else ""
    text = (f"{args.dataset}, {args.model} {args.num_layers} layers hidden {args.hidden}{heads}, 1 thread per process, "
            f"median of {args.epochs} epochs (PyG {args.pyg_epochs}) per run, {args.rounds} round(s): median "
            f"(range) over rounds, ratios paired within a round; {rows['machine']['cpu']}\n\n"
            + markdown_table(header, table))
    (out / "fullbatch.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
