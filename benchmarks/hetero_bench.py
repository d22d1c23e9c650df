"""R-GCN on typed graphs beside the same recipe in PyG, one process: test accuracy at best validation per seed.

    python -m gnn_dist.benchmarks.hetero_bench --datasets ../shared/data/hetero/acm.npz,../shared/data/hetero/freebase.npz \
        --seeds 0-9 [--parts 1] [--epochs 200] [--out runs/bench-hetero]

The recipe (../shared/data/README.md's reference figures): a Linear to --hidden per featured type, an embedding
of that width per featureless type, reverse relations added (ToUndirected), two RGCNConv(aggr='mean') layers,
dropout 0.5 before each layer, Adam lr 0.01 and weight decay 5e-4 over every parameter, 200 epochs; the test
accuracy of the epoch with the best validation accuracy. gnn-dist runs `mpiexec -n P gnn-dist train --model
rgcn` on a partition of the graph; PyG runs here, on the whole HeteroData, to_homogeneous(). The table gives
each side's mean and standard deviation over the seeds, and the difference with its standard error.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from gnn_dist.benchmarks.common import machine, markdown_table, run_train


def pyg_run(path: str, seed: int, hidden: int, epochs: int, lr: float, weight_decay: float,
            dropout: float, model: str = "rgcn", heads: int = 1) -> dict:
    """The recipe in PyG on the whole graph: test accuracy at the best validation epoch, and seconds per epoch."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch_geometric.data import HeteroData
    from torch_geometric.nn import GATConv, HeteroConv, RGCNConv
    from torch_geometric.transforms import ToUndirected

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    arrays = np.load(path, allow_pickle=False)
    types = [str(t) for t in arrays["node_types"]]
    target = str(arrays["target"])
    data = HeteroData()
    for t in types:
        data[t].num_nodes = int(arrays[f"num_nodes__{t}"])
        if f"x__{t}" in arrays.files:
            data[t].x = torch.from_numpy(arrays[f"x__{t}"])
    for key in arrays.files:
        if key.startswith("edge_index__"):
            src, rel, dst = key.split("__")[1:]
            data[src, rel, dst].edge_index = torch.from_numpy(arrays[key].astype(np.int64))
    data = ToUndirected()(data)
    homogeneous = data.to_homogeneous()
    y = torch.from_numpy(arrays["y"])
    masks = [torch.from_numpy(arrays[m]) for m in ("train_mask", "val_mask", "test_mask")]
    classes = int(y.max()) + 1
    lins = nn.ModuleDict({t: nn.Linear(data[t].x.shape[1], hidden) for t in types if "x" in data[t]})
    embs = nn.ModuleDict({t: nn.Embedding(data[t].num_nodes, hidden) for t in types if "x" not in data[t]})
    if model == "rgcn":
        convs = nn.ModuleList([RGCNConv(hidden, hidden, len(data.edge_types), aggr="mean"),
                               RGCNConv(hidden, classes, len(data.edge_types), aggr="mean")])
    else:  # R-GAT: a GATConv per relation, summed; hidden layers `heads` heads of width `hidden`, the last one head
        convs = nn.ModuleList([
            HeteroConv({r: GATConv(hidden, hidden, heads=heads, add_self_loops=False) for r in data.edge_types}),
            HeteroConv({r: GATConv(hidden * heads, classes, add_self_loops=False) for r in data.edge_types})])
    params = [*lins.parameters(), *embs.parameters(), *convs.parameters()]
    optimizer = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    offset = sum(data[t].num_nodes for t in types[:types.index(target)])
    rows = slice(offset, offset + data[target].num_nodes)

    def forward(training: bool):
        if model != "rgcn":
            x = {t: lins[t](data[t].x) if t in lins else embs[t].weight for t in types}
            for k, conv in enumerate(convs):
                x = conv({t: F.dropout(v, dropout, training) for t, v in x.items()}, data.edge_index_dict)
                if k < len(convs) - 1:
                    x = {t: torch.relu(v) for t, v in x.items()}
            return x[target]
        x = torch.cat([lins[t](data[t].x) if t in lins else embs[t].weight for t in types])
        for k, conv in enumerate(convs):
            x = conv(F.dropout(x, dropout, training), homogeneous.edge_index, homogeneous.edge_type)
            if k < len(convs) - 1:
                x = torch.relu(x)
        return x[rows]

    best_val, test_at_best, times = -1.0, 0.0, []
    for _ in range(epochs):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(forward(True)[masks[0]], y[masks[0]])
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        with torch.no_grad():
            predicted = forward(False).argmax(1)
        val, test = ((predicted[m] == y[m]).float().mean().item() for m in masks[1:])
        if val > best_val:
            best_val, test_at_best = val, test
    return {"test_acc_at_best_val": test_at_best, "epoch_s": statistics.median(times)}


def seeds_of(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", required=True, help="comma-separated typed .npz files")
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--parts", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--model", default="rgcn", help="rgcn or rgat")
    parser.add_argument("--heads", type=int, default=1, help="--model rgat: heads of the hidden layer")
    parser.add_argument("--out", default="runs/bench-hetero")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, raw = [], []
    for path in args.datasets.split(","):
        name = Path(path).stem
        parts = out / f"parts-{name}-{args.parts}"
        if not (parts / "meta.json").exists():
            subprocess.run([sys.executable, "-m", "gnn_dist", "partition", "--dataset", f"hetero:{path}",
                            "--num-parts", str(args.parts), "--out", str(parts)], check=True, capture_output=True)
        ours, theirs = [], []
        for seed in seeds_of(args.seeds):
            final = run_train(args.parts, parts, out / f"m-{name}-{seed}.jsonl",
                              ["--model", args.model, "--heads", str(args.heads), "--hidden", str(args.hidden),
                               "--num-layers", "2", "--dropout", "0.5",
                               "--lr", "0.01", "--weight-decay", "5e-4", "--epochs", str(args.epochs), "--seed",
                               str(seed)])
            ours.append(final["test_acc_at_best_val"])
            theirs.append(pyg_run(path, seed, args.hidden, args.epochs, 0.01, 5e-4, 0.5, args.model,
                                  args.heads)["test_acc_at_best_val"])
            print(f"{name} seed {seed}: gnn-dist {ours[-1]:.4f}, PyG {theirs[-1]:.4f}", file=sys.stderr, flush=True)
        diff = np.array(ours) - np.array(theirs)
        se = float(np.sqrt(np.var(ours, ddof=1) / len(ours) + np.var(theirs, ddof=1) / len(theirs)))
        raw.append({"dataset": name, "gnn_dist": ours, "pyg": theirs})
        rows.append([name, f"{100 * np.mean(ours):.2f} ± {100 * np.std(ours, ddof=1):.2f}",
                     f"{100 * np.mean(theirs):.2f} ± {100 * np.std(theirs, ddof=1):.2f}",
                     f"{100 * diff.mean():+.2f}", f"{100 * se:.2f}"])
    table = markdown_table(["dataset", f"gnn-dist P={args.parts} (%)", "PyG, one process (%)", "difference (points)",
                            "standard error of the difference"], rows)
    model = "R-GCN" if args.model == "rgcn" else f"R-GAT ({args.heads} heads in the hidden layer)"
    text = (f"{model} 2 layers, hidden {args.hidden}, dropout 0.5, Adam lr 0.01, weight decay 5e-4, {args.epochs} "
            f"epochs, seeds {args.seeds}; test accuracy at best validation; {machine()['cpu']}\n\n{table}\n")
    stem = "hetero" if args.model == "rgcn" else f"hetero-{args.model}"
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"machine": machine(), "config": vars(args), "runs": raw}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
