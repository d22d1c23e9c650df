"""Sampled GraphSAGE throughput and traffic: gnn-dist at P = 1, 2, with and without the feature cache.

    python -m gnn_dist.benchmarks.sampled_bench --dataset synthetic:arxiv --epochs 1 --out runs/bench-sampled

GraphSAGE, fanouts 15,10,5, batch 1024 per rank, one thread per process.
Two cache sizes at P=2, both --cache-fraction (default 10%) of a count of
rows: of the rank's remote features (every node it does not own; the halo's
rows are cached at start-up anyway), and, stricter, of the remote nodes
outside its halo (the only ones ever fetched). Figures are the last epoch's:
with two or more epochs that is after the cache refill from epoch 0's counts.

PyG's NeighborLoader baseline (same model: dropout on the input and after
each hidden ReLU, Adam, one thread) runs when torch-sparse or pyg-lib is
importable, for --pyg-steps steps after the first batch; otherwise its row
says why it was skipped. PyG computes every layer over the whole sampled
subgraph (its default; trim_to_layer needs pyg-lib's per-hop counts), where
gnn-dist's blocks shrink layer by layer. Targets: P=1 >= 0.8x PyG's
seeds/s, P=2 >= 1.5x our P=1, the cache removes at least half of the fetched
bytes.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table, partition, run_train


def pyg_neighbor_loader(dataset: str, root: str | None, args) -> dict:
    if not any(importlib.util.find_spec(m) for m in ("torch_sparse", "pyg_lib")):
        return {"skipped": "PyG's NeighborLoader needs torch-sparse or pyg-lib; neither is installed "
                           "(pip install --no-build-isolation torch-scatter torch-sparse builds them, ~15 min)"}
    import torch
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn import SAGEConv

    from gnn_dist.partition.datasets import load_dataset

    torch.set_num_threads(1)
    g = load_dataset(dataset, root)
    data = Data(x=torch.from_numpy(g.x), y=torch.from_numpy(g.y), edge_index=torch.from_numpy(g.edge_index))
    train = torch.from_numpy(g.train_mask).nonzero().squeeze(1)
    loader = NeighborLoader(data, num_neighbors=args.fanouts_list, batch_size=args.batch_size,
                            input_nodes=train, shuffle=True)
    dims = [g.num_features] + [args.hidden] * (len(args.fanouts_list) - 1) + [g.num_classes]
    convs = torch.nn.ModuleList(SAGEConv(i, o) for i, o in zip(dims[:-1], dims[1:]))
    opt = torch.optim.Adam(convs.parameters(), lr=0.01)
    batches = iter(loader)
    next(batches)  # the first batch builds the sampler's CSC: set-up, not throughput
    start, seeds = time.perf_counter(), 0
    for _, batch in zip(range(args.pyg_steps), batches):
        opt.zero_grad()
        h = F.dropout(batch.x, 0.5, True)
        for k, conv in enumerate(convs):
            h = conv(h, batch.edge_index)
            if k < len(convs) - 1:
                h = F.dropout(torch.relu(h), 0.5, True)
        n = batch.batch_size
        F.cross_entropy(h[:n], batch.y[:n]).backward()
        opt.step()
        seeds += n
    elapsed = time.perf_counter() - start
    return {"seeds_per_s": seeds / elapsed, "seconds": elapsed, "steps": args.pyg_steps,
            "sampler": "pyg-lib" if importlib.util.find_spec("pyg_lib") else "torch-sparse"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synthetic:arxiv")
    parser.add_argument("--root", default=None)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--pyg-steps", type=int, default=20)
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
    cmd = [sys.executable, "-m", "gnn_dist.benchmarks.sampled_bench", "--pyg-worker", "--dataset", args.dataset,
           "--fanouts", args.fanouts, "--batch-size", str(args.batch_size), "--hidden", str(args.hidden),
           "--pyg-steps", str(args.pyg_steps)]
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
        remote_rows = max(inspect["num_nodes"] - min(p["owned"] for p in inspect["parts"]), 0)
        beyond_halo = max(inspect["num_nodes"] - min(p["owned"] + p["halo"] for p in inspect["parts"]), 0)
        row_mb = inspect["num_features"] * 4 / 2**20
        variants = [("no cache", 0.0)]
        if num_parts > 1:
            pct = f"{100 * args.cache_fraction:g}%"
            variants += [(f"cache {pct} of remote rows", args.cache_fraction * remote_rows * row_mb),
                         (f"cache {pct} of rows beyond the halo", args.cache_fraction * beyond_halo * row_mb)]
        for name, mb in variants:
            final = run_train(num_parts, parts, out / f"m-{num_parts}-{mb:.0f}.jsonl",
                              common + ["--feature-cache-mb", f"{mb:.3f}"])
            last = final.pop("per_epoch")[-1]
            rows[(num_parts, name)] = {
                "cache_mb": mb, "seeds_per_s": last["seeds_per_s"], "feature_bytes": last["feature_bytes"],
                "sample_bytes": last["sample_bytes"], "hit_rate": last["cache_hit_rate"],
                "sample_s": last["sample_s"], "fetch_s": last["fetch_s"], "compute_s": last["compute_s"],
                "test_acc": final["test_acc"], "peak_rss_bytes": final["peak_rss_bytes"]}
            print(f"P={num_parts} {name}: {rows[(num_parts, name)]}", file=sys.stderr)
    base = rows[(1, "no cache")]["seeds_per_s"]
    table = []
    if "seeds_per_s" in pyg:
        table.append([f"PyG NeighborLoader ({pyg['sampler']}), 1 process", f"{pyg['seeds_per_s']:.0f}", "1.00",
                      "", "", "", "", "", ""])
    no_cache = {k[0]: r["feature_bytes"] for k, r in rows.items() if k[1] == "no cache"}
    for (num_parts, name), r in rows.items():
        vs_pyg = f"{r['seeds_per_s'] / pyg['seeds_per_s']:.2f}" if "seeds_per_s" in pyg else "n/a"
        saved = 1 - r["feature_bytes"] / no_cache[num_parts] if no_cache.get(num_parts) else 0.0
        table.append([f"gnn-dist P={num_parts}, {name}" + (f" ({r['cache_mb']:.1f} MB)" if r["cache_mb"] else ""),
                      f"{r['seeds_per_s']:.0f}", vs_pyg,
                      f"{r['seeds_per_s'] / base:.2f}", f"{r['feature_bytes'] / 1e6:.1f}",
                      f"{100 * saved:.0f}%" if r["cache_mb"] else "",
                      f"{r['sample_bytes'] / 1e6:.1f}", f"{100 * r['hit_rate']:.1f}%",
                      f"{r['sample_s']:.1f} / {r['fetch_s']:.1f} / {r['compute_s']:.1f}"])
    text = (f"{args.dataset}, GraphSAGE fanouts {args.fanouts}, batch {args.batch_size} per rank, hidden "
            f"{args.hidden}, {args.epochs} epoch(s) (figures of the last), 1 thread per process; "
            f"{machine()['cpu']}\n"
            + ("" if "seeds_per_s" in pyg else f"PyG baseline skipped: {pyg['skipped']}\n") + "\n"
            + markdown_table(["run", "seeds/s", "vs PyG", "vs our P=1", "feature MB/epoch", "fetched bytes saved",
                              "sampling MB/epoch", "cache hit rate", "sample / fetch / compute s"], table))
    (out / "sampled.md").write_text(text + "\n")
    (out / "sampled.json").write_text(json.dumps({"machine": machine(), "pyg": pyg,
                                                  "rows": {f"{k[0]}|{k[1]}": v for k, v in rows.items()}}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
