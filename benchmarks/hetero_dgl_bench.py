"""R-GCN seconds per training epoch beside DGL 2.1's full-graph R-GCN, one process, one thread, rounds alternating.

    python -m gnn_dist.benchmarks.hetero_dgl_bench --datasets ../shared/data/hetero/acm.npz,../shared/data/hetero/freebase.npz \
        --dgl-python /path/to/dgl-venv/bin/python [--rounds 3] [--epochs 30] [--out runs/bench-hetero-dgl]
    python -m gnn_dist.benchmarks.hetero_dgl_bench --datasets synthetic:mag200k --dgl-python ... --p2
    python -m gnn_dist.benchmarks.hetero_dgl_bench --datasets synthetic:mag200k --dgl-python ... --p2 \
        --mode sampled --fanouts 10,10 --batch-size 1024

A dataset is a typed .npz file or any typed --dataset spec (synthetic:mag200k; ogbn-mag with --root), written
once as a typed .npz for DGL's side. --p2 also times gnn-dist at P=2 (two ranks, one thread each) in every
round, for the speed-up over P=1; the partitions are made before any timing, never beside it.

DGL's side is the model of DGL's own examples/pytorch/rgcn-hetero (a HeteroGraphConv of GraphConv(norm='right',
no weight of its own) per relation, each relation's weight passed in, summed over relations, plus a self-loop
weight and a bias per layer), changed where it loads data: the typed .npz with PyG's ToUndirected reverse
relations, and the same inputs as gnn-dist's (a Linear per featured type, an embedding per featureless one).
Two layers, --hidden wide, dropout 0.5, Adam over every parameter. It runs in its own virtual environment
(--dgl-python; never a dependency of gnn-dist). gnn-dist runs `mpiexec -n 1 gnn-dist train --model rgcn` on a
one-part partition; the figure is the median training epoch (forward, backward, optimiser step; evaluation
excluded on both sides) after the first two.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table, run_train

# Runs under DGL's interpreter. argv: graph.npz, epochs, hidden; prints one JSON line of seconds per epoch.
DGL_RGCN = r"""
import json, sys, time
import numpy as np, torch, torch.nn.functional as F
from torch import nn
torch.set_num_threads(1)
import dgl, dgl.nn as dglnn

arrays = np.load(sys.argv[1], allow_pickle=False)
epochs, hidden = int(sys.argv[2]), int(sys.argv[3])
types = [str(t) for t in arrays["node_types"]]
target = str(arrays["target"])
relations = {}
for key in arrays.files:
    if not key.startswith("edge_index__"):
        continue
    src_type, rel, dst_type = key.split("__")[1:]
    src, dst = torch.from_numpy(arrays[key].astype(np.int64))
    if src_type == dst_type:  # ToUndirected: a relation within one type becomes symmetric in place
        pairs = torch.unique(torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]), dim=1)
        relations[(src_type, rel, dst_type)] = (pairs[0], pairs[1])
    else:
        relations[(src_type, rel, dst_type)] = (src, dst)
        relations[(dst_type, "rev_" + rel, src_type)] = (dst, src)
g = dgl.heterograph(relations, num_nodes_dict={t: int(arrays["num_nodes__" + t]) for t in types})
y = torch.from_numpy(arrays["y"])
train = torch.from_numpy(arrays["train_mask"])
classes = int(y.max()) + 1


class RelGraphConvLayer(nn.Module):
    # examples/pytorch/rgcn-hetero's layer: per relation GraphConv(norm='right') with the relation's weight,
    # summed by HeteroGraphConv, then the self loop, the bias, the activation and dropout.
    def __init__(self, in_feat, out_feat, rel_names, activation=None, dropout=0.0):
        super().__init__()
        self.rel_names = rel_names
        self.conv = dglnn.HeteroGraphConv({rel: dglnn.GraphConv(in_feat, out_feat, norm="right", weight=False,
                                                                bias=False) for rel in rel_names})
        self.weight = nn.Parameter(torch.empty(len(rel_names), in_feat, out_feat))
        nn.init.xavier_uniform_(self.weight, gain=nn.init.calculate_gain("relu"))
        self.loop_weight = nn.Parameter(torch.empty(in_feat, out_feat))
        nn.init.xavier_uniform_(self.loop_weight, gain=nn.init.calculate_gain("relu"))
        self.h_bias = nn.Parameter(torch.zeros(out_feat))
        self.activation = activation
        self.dropout = nn.Dropout(dropout)

    def forward(self, g, inputs):
        g = g.local_var()
        # on a block (sampled mode), the self loop takes the targets' rows: the first of each type's sources
        inputs_dst = {t: v[:g.num_dst_nodes(t)] for t, v in inputs.items()} if g.is_block else inputs
        wdict = {rel: {"weight": w.squeeze(0)} for rel, w in zip(self.rel_names, torch.split(self.weight, 1, 0))}
        hs = self.conv(g, inputs, mod_kwargs=wdict)
        out = {}
        for ntype, h in hs.items():
            h = h + inputs_dst[ntype] @ self.loop_weight + self.h_bias
            if self.activation is not None:
                h = self.activation(h)
            out[ntype] = self.dropout(h)
        return out


rel_names = sorted(set(g.etypes))
featured = {t: torch.from_numpy(arrays["x__" + t]) for t in types if "x__" + t in arrays.files}
lins = nn.ModuleDict({t: nn.Linear(x.shape[1], hidden) for t, x in featured.items()})
embs = nn.ModuleDict({t: nn.Embedding(g.num_nodes(t), hidden) for t in types if t not in featured})
layers = nn.ModuleList([RelGraphConvLayer(hidden, hidden, rel_names, F.relu, 0.5),
                        RelGraphConvLayer(hidden, classes, rel_names)])
opt = torch.optim.Adam([*lins.parameters(), *embs.parameters(), *layers.parameters()], lr=0.01, weight_decay=5e-4)
times = []
for epoch in range(epochs):
    start = time.perf_counter()
    h = {t: lins[t](featured[t]) if t in lins else embs[t].weight for t in types}
    h = {t: F.dropout(v, 0.5, True) for t, v in h.items()}
    for layer in layers:
        h = layer(g, h)
    loss = F.cross_entropy(h[target][train], y[train])
    opt.zero_grad()
    loss.backward()
    opt.step()
    times.append(time.perf_counter() - start)
print(json.dumps({"epoch_s": times, "version": dgl.__version__}))
"""


# The sampled side (--mode sampled): the same layers on DGL's blocks, as examples/pytorch/rgcn-hetero's
# entity_classify_mp.py runs them: NeighborSampler with the fanout per relation (DGL's list runs from the input
# layer), a DataLoader over the target's training nodes (shuffled, batch --batch-size), embeddings of the
# featureless types as nn.Embedding(sparse=True) stepped by SparseAdam, every other weight by Adam with weight
# decay. argv after the shared three: fanouts (seed hop first, gnn-dist's order), batch size.
DGL_RGCN_SAMPLED = DGL_RGCN.split("rel_names = sorted")[0] + r"""
fanouts = [int(f) for f in sys.argv[4].split(",")][::-1]  # DGL's list runs from the input layer
batch_size = int(sys.argv[5])


rel_names = sorted(set(g.etypes))
featured = {t: torch.from_numpy(arrays["x__" + t]) for t in types if "x__" + t in arrays.files}
lins = nn.ModuleDict({t: nn.Linear(x.shape[1], hidden) for t, x in featured.items()})
embs = nn.ModuleDict({t: nn.Embedding(g.num_nodes(t), hidden, sparse=True) for t in types if t not in featured})
layers = nn.ModuleList([RelGraphConvLayer(hidden, hidden, rel_names, F.relu, 0.5),
                        RelGraphConvLayer(hidden, classes, rel_names)])
opt = torch.optim.Adam([*lins.parameters(), *layers.parameters()], lr=0.01, weight_decay=5e-4)
sparse_opt = torch.optim.SparseAdam(list(embs.parameters()), lr=0.01) if len(embs) else None
sampler = dgl.dataloading.NeighborSampler(fanouts)
loader = dgl.dataloading.DataLoader(g, {target: torch.nonzero(train).squeeze(1)}, sampler, batch_size=batch_size,
                                    shuffle=True, drop_last=False, num_workers=0)
times = []
for epoch in range(epochs):
    start = time.perf_counter()
    for input_nodes, output_nodes, blocks in loader:
        h = {t: lins[t](featured[t][ids]) if t in lins else embs[t](ids) for t, ids in input_nodes.items()}
        h = {t: F.dropout(v, 0.5, True) for t, v in h.items()}
        for layer, block in zip(layers, blocks):
            h = layer(block, h)
        loss = F.cross_entropy(h[target], y[output_nodes[target]])
        opt.zero_grad()
        if sparse_opt is not None:
            sparse_opt.zero_grad()
        loss.backward()
        opt.step()
        if sparse_opt is not None:
            sparse_opt.step()
    times.append(time.perf_counter() - start)
print(json.dumps({"epoch_s": times, "version": dgl.__version__}))
"""


def dgl_epochs(python: str, path: str, epochs: int, hidden: int, sampled: tuple | None = None) -> list[float]:
    """DGL's seconds per epoch: full-graph, or with sampled = (fanouts, batch size) on its blocks."""
    script, extra = (DGL_RGCN, []) if sampled is None else (DGL_RGCN_SAMPLED, [sampled[0], str(sampled[1])])
    done = subprocess.run([python, "-c", script, path, str(epochs), str(hidden), *extra], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["epoch_s"]


def typed_npz(dataset: str, root: str | None, out: Path) -> tuple[str, str, str]:
    """(a typed .npz holding the graph, the --dataset spec gnn-dist partitions, a name for files and tables)."""
    if dataset.endswith(".npz"):
        return dataset, f"hetero:{dataset}", Path(dataset).stem
    from gnn_dist.partition.datasets import load_dataset
    from gnn_dist.partition.hetero import HeteroGraph, save_hetero_npz

    name = dataset.replace(":", "-")
    path = out / f"{name}.npz"
    if not path.exists():
        graph = load_dataset(dataset, root)
        if not isinstance(graph, HeteroGraph):
            raise SystemExit(f"hetero_dgl_bench: {dataset} is not a typed graph: give a typed one")
        temporary = path.with_name(f".{path.name}.tmp.npz")
        save_hetero_npz(graph, temporary)
        temporary.replace(path)
    return str(path), dataset, name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", required=True, help="comma-separated typed .npz files")
    parser.add_argument("--dgl-python", required=True, help="the interpreter of a virtual environment with dgl")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--root", default=None, help="where a dataset spec's files are (ogbn-mag)")
    parser.add_argument("--p2", action="store_true", help="also time gnn-dist at P=2 in every round")
    parser.add_argument("--mode", default="full", help="full, or sampled: mini-batches on both sides")
    parser.add_argument("--fanouts", default="10,10", help="--mode sampled: per relation, seed hop first")
    parser.add_argument("--batch-size", type=int, default=1024, help="--mode sampled")
    parser.add_argument("--out", default="runs/bench-hetero-dgl")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, raw = [], {}
    for dataset in args.datasets.split(","):
        path, spec, name = typed_npz(dataset, args.root, out)
        sizes = (1, 2) if args.p2 else (1,)
        parts = {p: out / f"parts-{name}-{p}" for p in sizes}
        for p, directory in parts.items():
            if not (directory / "meta.json").exists():
                command = [sys.executable, "-m", "gnn_dist", "partition", "--dataset", spec, "--num-parts", str(p),
                           "--out", str(directory)] + (["--root", args.root] if args.root else [])
                subprocess.run(command, check=True, capture_output=True)
        sampled = ["--mode", "sampled", "--fanouts", args.fanouts, "--batch-size", str(args.batch_size)] \
            if args.mode == "sampled" else []
        per_round = {"gnn-dist": [], "dgl": [], **({"gnn-dist P=2": []} if args.p2 else {})}
        seeds_per_s = {"gnn-dist": [], "gnn-dist P=2": []}  # sampled: every rank's seeds (up to the largest rank's count)
        for r in range(args.rounds):
            sides = ("gnn-dist", "dgl") if r % 2 == 0 else ("dgl", "gnn-dist")
            for side in sides + (("gnn-dist P=2",) if args.p2 else ()):
                if side == "dgl":
                    times = dgl_epochs(args.dgl_python, path, args.epochs, args.hidden,
                                       (args.fanouts, args.batch_size) if sampled else None)
                else:
                    p = 2 if side.endswith("P=2") else 1
                    final = run_train(p, parts[p], out / f"m-{name}-{p}-{r}.jsonl",
                                      ["--model", "rgcn", "--hidden", str(args.hidden), "--num-layers", "2",
                                       "--dropout", "0.5", "--lr", "0.01", "--weight-decay", "5e-4", "--epochs",
                                       str(args.epochs), "--eval-every", str(10 * args.epochs)] + sampled)
                    times = [e["epoch_s"] for e in final["per_epoch"]]  # the training step; evaluation is eval_s
                    if sampled:
                        seeds_per_s[side].append(statistics.median(e["seeds_per_s"] for e in final["per_epoch"][2:]))
                per_round[side].append(statistics.median(times[2:]))
                print(f"{name} round {r} {side}: {per_round[side][-1]:.4f} s/epoch", file=sys.stderr, flush=True)
        ratios = [a / b for a, b in zip(per_round["gnn-dist"], per_round["dgl"])]
        # P=2 over P=1: epochs per second full-batch, seeds per second sampled
        speedups = [a / b for a, b in zip(per_round["gnn-dist"], per_round.get("gnn-dist P=2", []))] if not sampled \
            else [b / a for a, b in zip(seeds_per_s["gnn-dist"], seeds_per_s["gnn-dist P=2"])]
        raw[name] = {**per_round, "ratio": ratios, "p2_speedup": speedups, "seeds_per_s": seeds_per_s}
        rows.append([name, ", ".join(f"{t:.4f}" for t in per_round["gnn-dist"]),
                     ", ".join(f"{t:.4f}" for t in per_round["dgl"]), ", ".join(f"{q:.2f}" for q in ratios),
                     f"{statistics.median(ratios):.2f}",
                     ", ".join(f"{t:.4f} ({q:.2f}x)" for t, q in zip(per_round.get("gnn-dist P=2", []), speedups))
                     or "-"])
    table = markdown_table(["graph", "gnn-dist P=1 s/epoch per round", "DGL s/epoch per round", "gnn-dist / DGL",
                            "median", "gnn-dist P=2 s/epoch (speed-up over P=1"
                            + (", seeds per second)" if args.mode == "sampled" else ")")], rows)
    how = "full-batch" if args.mode == "full" else \
        f"sampled, fanouts {args.fanouts} per relation, batch {args.batch_size}"
    text = (f"R-GCN 2 layers, hidden {args.hidden}, {how}, one process, one thread, {args.epochs} epochs a run "
            f"(median after the first two), {args.rounds} rounds alternating; {machine()['cpu']}\n\n{table}\n")
    stem = "hetero-dgl" if args.mode == "full" else "hetero-dgl-sampled"
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"machine": machine(), "config": vars(args), "runs": raw},
                                                    indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
