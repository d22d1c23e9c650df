"""The sampler alone, beside DGL's: seconds per epoch of sampling (and relabelling) a graph's training batches.

    python -m gnn_dist.benchmarks.sampler_bench --dataset synthetic:sbm60k --fanouts 15,10,5 --batch-size 1024 \
        [--dgl-python /path/to/dgl-venv/bin/python] [--rounds 3] [--out runs/bench-sampler]

Each side runs a loop that only samples: every batch of the epoch's shuffled training nodes, hop by hop, with
the same fanouts (gnn-dist lists them from the seeds outwards; DGL's NeighborSampler from the input layer, so
15,10,5 here is [5, 10, 15] there), into blocks whose targets are a prefix of their sources: gnn-dist's
DistributedSampler.sample at P=1 (the rank owns the whole graph: no requests travel), DGL's
NeighborSampler.sample_blocks (sample_neighbors, then to_block). One thread, one process each; the sides
alternate round by round, and so does which goes first (--train's whole epochs too). DGL runs in its own
virtual environment (--dgl-python; never a dependency of gnn-dist: docs in the issue that asked for this), on
the same graph, written once as an .npz file.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gnn_dist.benchmarks.common import machine, markdown_table

# Runs under DGL's interpreter: argv = graph.npz, fanouts (input layer first), batch size, epochs; prints one
# JSON line of seconds per epoch.
DGL_LOOP = r"""
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
import dgl
arrays = np.load(sys.argv[1])
fanouts = [int(f) for f in sys.argv[2].split(",")]
batch, epochs = int(sys.argv[3]), int(sys.argv[4])
src, dst = arrays["edge_index"]
g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=int(arrays["num_nodes"]))
train = torch.from_numpy(np.flatnonzero(arrays["train_mask"]))
sampler = dgl.dataloading.NeighborSampler(fanouts)
sampler.sample_blocks(g, train[:batch])  # warm-up: the graph's formats are built on first use
times = []
for epoch in range(epochs):
    order = train[torch.randperm(len(train), generator=torch.Generator().manual_seed(epoch))]
    start = time.perf_counter()
    for k in range(0, len(order), batch):
        sampler.sample_blocks(g, order[k:k + batch])
    times.append(time.perf_counter() - start)
print(json.dumps({"epoch_s": times, "version": dgl.__version__}))
"""


# Runs under DGL's interpreter: a whole sampled GraphSAGE epoch (sampling, features, forward, backward, Adam), DGL's
# own way (dgl.dataloading.DataLoader over NeighborSampler, SAGEConv 'mean', dropout 0.5 before every layer
# but the first, as gnn-dist's stack drops out every layer's input). argv: graph.npz, fanouts (input layer
# first), batch, epochs, hidden; prints one JSON line of seconds per epoch.
DGL_TRAIN = r"""
import json, sys, time
import numpy as np, torch, torch.nn.functional as F
torch.set_num_threads(1)
import dgl
from dgl.nn import SAGEConv
arrays = np.load(sys.argv[1])
fanouts = [int(f) for f in sys.argv[2].split(",")]
batch, epochs, hidden = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
src, dst = arrays["edge_index"]
g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=int(arrays["num_nodes"]))
x, y = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])
train = torch.from_numpy(np.flatnonzero(arrays["train_mask"]))
dims = [x.shape[1]] + [hidden] * (len(fanouts) - 1) + [int(y.max()) + 1]
layers = torch.nn.ModuleList(SAGEConv(i, o, "mean") for i, o in zip(dims[:-1], dims[1:]))
opt = torch.optim.Adam(layers.parameters(), lr=0.01, weight_decay=5e-4)
loader = dgl.dataloading.DataLoader(g, train, dgl.dataloading.NeighborSampler(fanouts), batch_size=batch,
                                    shuffle=True, drop_last=False, num_workers=0)
times = []
for epoch in range(epochs):
    start = time.perf_counter()
    for input_nodes, output_nodes, blocks in loader:
        h = x[input_nodes]
        for k, (layer, block) in enumerate(zip(layers, blocks)):
            h = F.dropout(h, 0.5, True)
            h = layer(block, h)
            if k < len(layers) - 1:
                h = F.relu(h)
        loss = F.cross_entropy(h, y[output_nodes])
        opt.zero_grad()
        loss.backward()
        opt.step()
    times.append(time.perf_counter() - start)
print(json.dumps({"epoch_s": times}))
"""


def gnn_dist_epochs(parts: Path, fanouts: list[int], batch: int, epochs: int) -> list[float]:
    """Seconds per epoch of DistributedSampler.sample over every batch, at P=1."""
    import torch

    from gnn_dist.comm.simulated_ranks import solo_comm
    from gnn_dist.graph.sampler import DistributedSampler
    from gnn_dist.partition.format import load_part

    torch.set_num_threads(1)
    part = load_part(parts, 0)
    sampler = DistributedSampler(solo_comm(), part, fanouts, seed=0)
    train = np.flatnonzero(part.train_mask)
    sampler.sample(train[:batch], 0, 0)  # warm-up: the native kernel loads
    times = []
    for epoch in range(epochs):
        order = np.random.default_rng([0, epoch]).permutation(train)
        start = time.perf_counter()
        for step, k in enumerate(range(0, len(order), batch)):
            sampler.sample(order[k:k + batch] + sampler.first, epoch, step)
        times.append(time.perf_counter() - start)
    return times


def whole_epochs(args, parts: Path, npz: Path, fanouts: list[int], env: dict,
                 dgl_first: bool = False) -> dict[str, list[float]]:
    """Seconds per whole sampled GraphSAGE epoch: gnn-dist at P=1 (`mpiexec -n 1 gnn-dist train --mode sampled`,
    its epochs after the first) and DGL's DataLoader loop, DGL's first when dgl_first (rounds alternate, so the
    host's drift over minutes falls on both sides alike)."""
    from gnn_dist.benchmarks.common import run_train

    def ours() -> list[float]:
        final = run_train(1, parts, Path(args.out) / "train.jsonl",
                          ["--mode", "sampled", "--model", "sage", "--hidden", str(args.hidden), "--num-layers",
                           str(len(fanouts)), "--fanouts", ",".join(map(str, fanouts)), "--batch-size",
                           str(args.batch_size), "--epochs", str(args.epochs + 1), "--eval-every", "1000"])
        return [r["epoch_s"] for r in final["per_epoch"][1:]]

    def dgl() -> list[float]:
        done = subprocess.run([args.dgl_python, "-c", DGL_TRAIN, str(npz), ",".join(map(str, fanouts[::-1])),
                               str(args.batch_size), str(args.epochs + 1), str(args.hidden)], capture_output=True,
                              text=True, env=env, timeout=7200)
        if done.returncode != 0:
            raise RuntimeError(f"DGL's training loop failed:\n{done.stderr[-2000:]}")
        return json.loads(done.stdout.splitlines()[-1])["epoch_s"][1:]

    sides = {"gnn-dist": ours, "dgl": dgl} if args.dgl_python else {"gnn-dist": ours}
    order = sorted(sides, key=lambda side: side != "dgl") if dgl_first else list(sides)
    return {side: sides[side]() for side in order}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synthetic:sbm60k")
    parser.add_argument("--root", default=None)
    parser.add_argument("--fanouts", default="15,10,5", help="from the seeds outwards, as gnn-dist's --fanouts")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per round (the median is reported)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dgl-python", default=None, help="the interpreter of a virtual environment with dgl")
    parser.add_argument("--train", action="store_true", help="also time whole sampled GraphSAGE epochs, each side")
    parser.add_argument("--hidden", type=int, default=256, help="--train: GraphSAGE's hidden width")
    parser.add_argument("--out", default="runs/bench-sampler")
    args = parser.parse_args(argv)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from gnn_dist.partition.datasets import load_dataset
    from gnn_dist.partition.partitioner import partition_graph

    graph = load_dataset(args.dataset, args.root)
    rows, raw = [], {"gnn-dist": [], "dgl": []}
    with tempfile.TemporaryDirectory(prefix="gnn-dist-sampler-") as tmp:
        parts = Path(tmp) / "parts"
        partition_graph(graph, 1, parts)
        npz = Path(tmp) / "graph.npz"
        np.savez(npz, edge_index=graph.edge_index, num_nodes=np.int64(graph.num_nodes), train_mask=graph.train_mask,
                 x=graph.x, y=graph.y)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DGLBACKEND": "pytorch"}
        for r in range(args.rounds):
            order = ["gnn-dist", "dgl"] if r % 2 == 0 else ["dgl", "gnn-dist"]
            for side in order:
                if side == "gnn-dist":
                    times = gnn_dist_epochs(parts, fanouts, args.batch_size, args.epochs)
                elif args.dgl_python:
                    done = subprocess.run([args.dgl_python, "-c", DGL_LOOP, str(npz), ",".join(map(str, fanouts[::-1])),
                                           str(args.batch_size), str(args.epochs)], capture_output=True, text=True,
                                          env=env, timeout=3600)
                    if done.returncode != 0:
                        raise RuntimeError(f"DGL's loop failed:\n{done.stderr[-2000:]}")
                    times = json.loads(done.stdout.splitlines()[-1])["epoch_s"]
                else:
                    continue
                raw[side].append(times)
                print(f"round {r} {side}: {', '.join(f'{t:.3f}' for t in times)} s/epoch", file=sys.stderr, flush=True)
        trained = {}
        if args.train:
            for r in range(args.rounds):
                for side, times in whole_epochs(args, parts, npz, fanouts, env, dgl_first=r % 2 == 1).items():
                    trained.setdefault(side, []).append(statistics.median(times))
                    print(f"round {r} {side}: whole epoch {trained[side][-1]:.3f} s", file=sys.stderr, flush=True)
    medians = {side: [statistics.median(t) for t in runs] for side, runs in raw.items() if runs}
    for side, values in medians.items():
        rows.append([side, ", ".join(f"{v:.3f}" for v in values), f"{statistics.median(values):.3f}"])
    if "dgl" in medians:
        ratios = [a / b for a, b in zip(medians["gnn-dist"], medians["dgl"])]
        rows.append(["gnn-dist / DGL", ", ".join(f"{v:.2f}" for v in ratios), f"{statistics.median(ratios):.2f}"])
    for side, values in trained.items():
        rows.append([f"{side}: whole GraphSAGE epoch", ", ".join(f"{v:.3f}" for v in values),
                     f"{statistics.median(values):.3f}"])
    if len(trained) == 2:
        ratios = [a / b for a, b in zip(trained["gnn-dist"], trained["dgl"])]
        rows.append(["whole epoch, gnn-dist / DGL", ", ".join(f"{v:.2f}" for v in ratios),
                     f"{statistics.median(ratios):.2f}"])
    table = markdown_table(["sampler", "s/epoch per round (median of its epochs)", "median"], rows)
    text = (f"{args.dataset}, fanouts {args.fanouts} (from the seeds), batch {args.batch_size}, "
            f"{int(graph.train_mask.sum())} training nodes, one thread; {machine()['cpu']}\n\n{table}\n")
    (out / "sampler.md").write_text(text)
    (out / "sampler.json").write_text(json.dumps({"machine": machine(), "config": vars(args), "runs": raw,
                                                  "whole_epochs": trained}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
