"""Sampled GraphSAGE throughput and traffic: gnn-dist at P = 1, 2, with and without the feature cache.

    python -m benchmarks.sampled_bench --dataset synthetic:arxiv --epochs 1 --out runs/bench-sampled

GraphSAGE, fanouts 15,10,5, batch 1024 per rank, one thread per process.
The cache is sized at --cache-fraction (default 10%) of the remote features a
rank could need (nodes neither owned nor in its halo). PyG's NeighborLoader
baseline runs when torch-sparse or pyg-lib is importable; otherwise the row
says why it was skipped. Targets (issue 5): P=1 >= 0.8x PyG's seeds/s,
P=2 >= 1.5x our P=1, the cache removes at least half of the fetched bytes.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import machine, markdown_table, partition, run_train


def pyg_neighbor_loader(dataset: str, root: str | None, args) -> dict:
    if not any(importlib.util.find_spec(m) for m in ("torch_sparse", "pyg_lib")):
        return {"skipped": "PyG's NeighborLoader needs torch-sparse or pyg-lib; neither is installed "
                           "(pip install --no-build-isolation torch-scatter torch-sparse builds them, ~15 min)"}
    import torch
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn import SAGEConv

    from partition.datasets import load_dataset

    torch.set_num_threads(1)
    g = load_dataset(dataset, root)
    data = Data(x=torch.from_numpy(g.x), y=torch.from_numpy(g.y), edge_index=torch.from_numpy(g.edge_index))
    train = torch.from_numpy(g.train_mask).nonzero().squeeze(1)
    loader = NeighborLoader(data, num_neighbors=args.fanouts_list, batch_size=args.batch_size,
                            input_nodes=train, shuffle=True)
    dims = [g.num_features] + [args.hidden] * (len(args.fanouts_list) - 1) + [g.num_classes]
    convs = torch.nn.ModuleList(SAGEConv(i, o) for i, o in zip(dims[:-1], dims[1:]))
    opt = torch.optim.Adam(convs.parameters(), lr=0.01)
    start, seeds = time.perf_counter(), 0
    for batch in loader:
        opt.zero_grad()
        h = batch.x
        for k, conv in enumerate(convs):
            h = conv(h, batch.edge_index)
            if k < len(convs) - 1:
                h = F.dropout(torch.relu(h), 0.5, True)
        n = batch.batch_size
        F.cross_entropy(h[:n], batch.y[:n]).backward()
        opt.step()
        seeds += n
    elapsed = time.perf_counter() - start
    return {"seeds_per_s": seeds / elapsed, "epoch_s": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synthetic:arxiv")
    parser.add_argument("--root", default=None)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--cache-fraction", type=float, default=0.1)
    parser.add_argument("--out", default="runs/bench-sampled")
    parser.add_argument("--pyg-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.fanouts_list = [int(v) for v in args.fanouts.split(",")]
    if args.pyg_worker:
        print(json.dumps(pyg_neighbor_loader(args.dataset, args.root, args)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.sampled_bench", "--pyg-worker", "--dataset", args.dataset,
           "--fanouts", args.fanouts, "--batch-size", str(args.batch_size), "--hidden", str(args.hidden)]
    if args.root:
        cmd += ["--root", args.root]
    pyg = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    print(f"pyg: {pyg}", file=sys.stderr)
    rows = {}
    common = ["--model", "sage", "--mode", "sampled", "--fanouts", args.fanouts, "--batch-size", str(args.batch_size),
              "--hidden", str(args.hidden), "--num-layers", str(len(args.fanouts_list)), "--epochs",
              str(args.epochs), "--eval-every", str(args.epochs)]
    for num_parts in (1, 2):
        parts = partition(args.dataset, num_parts, out / f"parts-{num_parts}", args.root)
        inspect = json.loads(subprocess.run([sys.executable, "-m", "gnn_dist", "inspect", str(parts), "--json"],
                                            capture_output=True, text=True, check=True).stdout)
        remote_rows = max(inspect["num_nodes"] - min(p["owned"] + p["halo"] for p in inspect["parts"]), 0)
        cache_mb = args.cache_fraction * remote_rows * inspect["num_features"] * 4 / 2**20
        variants = [("no cache", 0.0)] + ([(f"cache {cache_mb:.1f} MB", cache_mb)] if num_parts > 1 else [])
        for name, mb in variants:
            final = run_train(num_parts, parts, out / f"m-{num_parts}-{mb:.0f}.jsonl",
                              common + ["--feature-cache-mb", f"{mb:.3f}"])
            epochs = final.pop("per_epoch")
            rows[(num_parts, name)] = {
                "seeds_per_s": statistics.median(e["seeds_per_s"] for e in epochs),
                "feature_bytes": statistics.mean(e["feature_bytes"] for e in epochs),
                "sample_bytes": statistics.mean(e["sample_bytes"] for e in epochs),
                "hit_rate": statistics.mean(e["cache_hit_rate"] for e in epochs),
                "sample_s": statistics.mean(e["sample_s"] for e in epochs),
                "fetch_s": statistics.mean(e["fetch_s"] for e in epochs),
                "compute_s": statistics.mean(e["compute_s"] for e in epochs),
                "test_acc": final["test_acc"], "peak_rss_bytes": final["peak_rss_bytes"]}
            print(f"P={num_parts} {name}: {rows[(num_parts, name)]}", file=sys.stderr)
    base = rows[(1, "no cache")]["seeds_per_s"]
    table = []
    if "seeds_per_s" in pyg:
        table.append(["PyG NeighborLoader, 1 process", f"{pyg['seeds_per_s']:.0f}", "1.00", "", "", "", "", ""])
    for (num_parts, name), r in rows.items():
        vs_pyg = f"{r['seeds_per_s'] / pyg['seeds_per_s']:.2f}" if "seeds_per_s" in pyg else "n/a"
        table.append([f"gnn-dist P={num_parts}, {name}", f"{r['seeds_per_s']:.0f}", vs_pyg,
                      f"{r['seeds_per_s'] / base:.2f}", f"{r['feature_bytes'] / 1e6:.1f}",
                      f"{r['sample_bytes'] / 1e6:.1f}", f"{100 * r['hit_rate']:.1f}%",
                      f"{r['sample_s']:.1f} / {r['fetch_s']:.1f} / {r['compute_s']:.1f}"])
    text = (f"{args.dataset}, GraphSAGE fanouts {args.fanouts}, batch {args.batch_size} per rank, hidden "
            f"{args.hidden}, {args.epochs} epoch(s), 1 thread per process; {machine()['cpu']}\n"
            + ("" if "seeds_per_s" in pyg else f"PyG baseline skipped: {pyg['skipped']}\n") + "\n"
            + markdown_table(["run", "seeds/s", "vs PyG", "vs our P=1", "feature MB/epoch", "sampling MB/epoch",
                              "cache hit rate", "sample / fetch / compute s"], table))
    (out / "sampled.md").write_text(text + "\n")
    (out / "sampled.json").write_text(json.dumps({"machine": machine(), "pyg": pyg,
                                                  "rows": {f"{k[0]}|{k[1]}": v for k, v in rows.items()}}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
