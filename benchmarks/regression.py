"""Speed and memory against an earlier commit, side by side: epoch time and peak RSS per rank.

    python -m gnn_dist.benchmarks.regression --before REV [--rounds 2] [--parts 1,2,4] [--models gcn,sage,gat]
        [--modes full,sampled] [--dataset synthetic:sbm60k] [--epochs 8] [--hidden 256] [--out DIR]

REV is checked out beside the working tree (git worktree, detached), and the two trees run alternately, round
by round (which one goes first alternates too), so the host's drift over minutes falls on both alike. Each
tree runs its own code (PYTHONPATH) with its own kernel build folder (TORCH_EXTENSIONS_DIR), on partitions
that its own `gnn-dist partition` made of one graph written once as an .npz file (any older tree reads it).
A run is `mpiexec -n P gnn-dist train`, one thread per rank; its figures are the median epoch_s of the epochs
after the first two, and the largest peak RSS of its ranks. The table gives the median over rounds of each,
and after / before. Four ranks on fewer cores are oversubscribed: their times compare the trees, nothing more.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table, mpiexec, write_report

ROOT = Path(__file__).resolve().parents[1]


def checkout(rev: str, where: Path) -> Path:
    """REV's tracked files in `where` (a detached worktree of this repository)."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--force", "--detach", str(where), rev],
                   check=True, capture_output=True, text=True)
    return where


def write_graph(spec: str, path: Path) -> None:
    """The benchmark graph as an .npz file (the format every version reads)."""
    import numpy as np

    from gnn_dist.partition.datasets import load_dataset

    graph = load_dataset(spec)
    np.savez(path, edge_index=graph.edge_index, x=graph.x, y=graph.y, train_mask=graph.train_mask,
             val_mask=graph.val_mask, test_mask=graph.test_mask)


def tree_env(tree: Path, work: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "TORCH_EXTENSIONS_DIR": str(work / f"ext-{tree.name}"),
            "OMP_NUM_THREADS": "1"}


def partition(tree: Path, work: Path, graph: Path, num_parts: int) -> Path:
    out = work / f"parts-{tree.name}-{num_parts}"
    if not (out / "meta.json").exists():
        subprocess.run([sys.executable, "-m", "gnn_dist", "partition", "--dataset", f"npz:{graph}", "--num-parts",
                        str(num_parts), "--out", str(out)], check=True, capture_output=True, text=True, cwd=tree,
                       env=tree_env(tree, work))
    return out


def train(tree: Path, work: Path, parts: Path, num_parts: int, model: str, mode: str, args) -> dict:
    metrics = work / f"m-{tree.name}-{num_parts}-{model}-{mode}.jsonl"
    options = ["--model", model, "--mode", mode, "--epochs", str(args.epochs), "--hidden", str(args.hidden),
               "--num-layers", "3", "--eval-every", str(args.epochs), "--no-progress", "--metrics-out", str(metrics)]
    if model == "gat":
        options += ["--heads", "4", "--hidden", str(max(1, args.hidden // 4))]
    if mode == "sampled":
        options += ["--fanouts", "10,10,10"]  # one per layer: the default's two would be refused for 3 layers
    done = subprocess.run([mpiexec(), "-n", str(num_parts), sys.executable, "-m", "gnn_dist", "train", "--parts",
                           str(parts), *options], capture_output=True, text=True, cwd=tree, env=tree_env(tree, work),
                          timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{tree.name}: {model} {mode} P={num_parts} failed:\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    epochs = [r["epoch_s"] for r in records[:-1]][2:] or [r["epoch_s"] for r in records[:-1]]
    final = records[-1]
    # older trees (the first layout) wrote the largest rank's peak only
    return {"epoch_s": statistics.median(epochs),
            "peak_rss": max(final.get("peak_rss_bytes_per_rank") or [final["peak_rss_bytes"]])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="the commit to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--parts", default="1,2,4")
    parser.add_argument("--models", default="gcn,sage,gat")
    parser.add_argument("--modes", default="full,sampled")
    parser.add_argument("--dataset", default="synthetic:sbm60k")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default="runs/regression")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gnn-dist-regression-") as tmp:
        work = Path(tmp)
        trees = {"before": checkout(args.before, work / "before"), "after": ROOT}
        try:
            graph = work / "graph.npz"
            write_graph(args.dataset, graph)
            configs = [(p, m, mode) for p in map(int, args.parts.split(",")) for m in args.models.split(",")
                       for mode in args.modes.split(",")]
            runs: dict = {}
            for r in range(args.rounds):
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                for num_parts, model, mode in configs:
                    for name in order:
                        parts = partition(trees[name], work, graph, num_parts)
                        result = train(trees[name], work, parts, num_parts, model, mode, args)
                        runs.setdefault((num_parts, model, mode, name), []).append(result)
                        print(f"round {r} {name}: {model} {mode} P={num_parts}: {result['epoch_s']:.3f} s/epoch, "
                              f"{result['peak_rss'] / 2**20:.0f} MiB", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "before")],
                           capture_output=True)
    rows, raw = [], []
    for num_parts, model, mode in configs:
        cell = {name: {key: statistics.median(r[key] for r in runs[(num_parts, model, mode, name)])
                       for key in ("epoch_s", "peak_rss")} for name in ("before", "after")}
        raw.append({"parts": num_parts, "model": model, "mode": mode, **cell})
        time_ratio = cell["after"]["epoch_s"] / cell["before"]["epoch_s"]
        rows.append([model, mode, num_parts, f"{cell['before']['epoch_s']:.3f}", f"{cell['after']['epoch_s']:.3f}",
                     f"{time_ratio:.2f}" + (" (slower)" if time_ratio > 1.05 else ""),
                     f"{cell['before']['peak_rss'] / 2**20:.0f}", f"{cell['after']['peak_rss'] / 2**20:.0f}",
                     f"{cell['after']['peak_rss'] / cell['before']['peak_rss']:.2f}"])
    table = markdown_table(["model", "mode", "P", "before s/epoch", "after s/epoch", "after / before",
                            "before peak MiB/rank", "after peak MiB/rank", "after / before"], rows)
    text = (f"{args.dataset}, 3 layers, hidden {args.hidden} (GAT: 4 heads of {max(1, args.hidden // 4)}), "
            f"{args.epochs} epochs, median of {args.rounds} rounds; before = {args.before}, after = the working "
            f"tree; {machine()['cpu']}, {machine()['cores']} cores\n\n{table}\n")
    write_report(out, "regression", text, args, raw)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
