"""The cost of training an unmodified PyG model through gd.distribute, beside the built-in model and plain PyG.

    python -m gnn_dist.benchmarks.pyg_wrapper --dataset synthetic:sbm60k --model gcn --parts 1,2 --rounds 3
    python -m gnn_dist.benchmarks.pyg_wrapper --dataset npz:../shared/data/npz/twitch_fr.npz --model gat
    python -m gnn_dist.benchmarks.pyg_wrapper --dataset synthetic:sbm60k --model gin --parts 1,2
    python -m gnn_dist.benchmarks.pyg_wrapper --dataset npz:../shared/data/npz/twitch_fr.npz --model gat-one-head-out

Per round, alternating which side goes first: PyG's basic model (GCN, GAT, GAT v2, GIN: --hidden wide,
--num-layers deep, GAT's --heads concatenated) wrapped by gd.distribute under `mpiexec -n P`; `gnn-dist train
--model gcn|gat` with the same widths where one exists; and at P=1 the same PyG model on the whole graph in one
process. Each side's figure is its median training epoch (forward, backward, Adam; no evaluation), the slowest
rank's per epoch. One torch thread per rank. Writes benchmarks/results/pyg-wrapper-MODEL.md and .json.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from gnn_dist.benchmarks.common import markdown_table, mpiexec, partition, run_train, write_report

BUILT_IN = {"gcn": "gcn", "gat": "gat", "gat-one-head-out": "gat"}


class GATLikeBuiltIn(torch.nn.Module):
    """GATConv layers as --model gat stacks them: hidden layers of `heads` concatenated heads, a last layer of
    one head, ReLU and dropout between (PyG's GAT model averages `heads` heads in its last layer instead)."""

    def __init__(self, in_channels: int, hidden: int, layers: int, classes: int, heads: int, dropout: float):
        from torch_geometric.nn import GATConv

        super().__init__()
        widths = [in_channels] + [hidden * heads] * (layers - 1)
        self.convs = torch.nn.ModuleList([GATConv(w, hidden, heads=heads) for w in widths[:-1]]
                                         + [GATConv(widths[-1], classes, heads=1)])
        self.dropout = dropout

    def forward(self, x, edge_index):
        for conv in self.convs[:-1]:
            x = torch.nn.functional.dropout(conv(x, edge_index).relu(), self.dropout, self.training)
        return self.convs[-1](x, edge_index)


def build(model: str, in_channels: int, hidden: int, layers: int, classes: int, heads: int, dropout: float):
    from torch_geometric.nn.models import GAT, GCN, GIN

    if model == "gat-one-head-out":
        return GATLikeBuiltIn(in_channels, hidden, layers, classes, heads, dropout)
    if model == "gcn":
        return GCN(in_channels, hidden, layers, classes, dropout=dropout)
    if model == "gin":
        return GIN(in_channels, hidden, layers, classes, dropout=dropout)
    return GAT(in_channels, hidden * heads, layers, classes, heads=heads, v2=model == "gatv2", dropout=dropout)


def _epochs(step, epochs: int, slowest) -> list[float]:
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        step()
        times.append(slowest(time.perf_counter() - start))
    return times


def worker(args) -> None:
    """One rank of the wrapped model (started by mpiexec)."""
    import gnn_dist as gd

    ctx = gd.init(threads=1)
    data = gd.load_partition(args.worker, ctx)
    torch.manual_seed(args.seed)
    model = gd.distribute(build(args.model, data.num_features, args.hidden, args.num_layers, data.num_classes,
                                args.heads, args.dropout), data)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        model.train()
        opt.zero_grad()
        gd.cross_entropy(model(data.x, data.edge_index), data.y, data.train_mask).backward()
        opt.step()

    step()  # warm-up: caches and kernels
    model.graph.exchanger.counters.reset()
    times = _epochs(step, args.epochs, lambda s: float(gd.all_reduce(torch.tensor([s], dtype=torch.float64),
                                                                      "max")))
    sent = gd.all_reduce(torch.tensor([float(model.graph.exchanger.counters.halo_bytes)], dtype=torch.float64))
    rss = gd.all_reduce(torch.tensor([float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)]), "max")
    if ctx.is_root:
        print(json.dumps({"epoch_s_median": statistics.median(times), "halo_bytes_per_epoch": float(sent) / args.epochs,
                          "peak_rss_gib": float(rss) / 2**20}))


def plain(args) -> dict:
    """The same PyG model on the whole graph in this process."""
    import torch.nn.functional as F

    from gnn_dist.partition.datasets import load_dataset

    torch.set_num_threads(1)
    g = load_dataset(args.dataset, args.root)
    x, y = torch.from_numpy(g.x), torch.from_numpy(g.y)
    edge_index, mask = torch.from_numpy(g.edge_index), torch.from_numpy(g.train_mask)
    torch.manual_seed(args.seed)
    model = build(args.model, g.num_features, args.hidden, args.num_layers, g.num_classes, args.heads, args.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        model.train()
        opt.zero_grad()
        out = model(x, edge_index)
        F.cross_entropy(out[mask], y[mask]).backward()
        opt.step()

    step()
    return {"epoch_s_median": statistics.median(_epochs(step, args.epochs, lambda s: s))}


def run_wrapped(args, parts: Path, num_parts: int) -> dict:
    cmd = [mpiexec(), "-n", str(num_parts), sys.executable, "-m", "gnn_dist.benchmarks.pyg_wrapper", "--worker",
           str(parts), "--model", args.model, "--hidden", str(args.hidden), "--num-layers", str(args.num_layers),
           "--heads", str(args.heads), "--dropout", str(args.dropout), "--epochs", str(args.epochs)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_plain(args) -> dict:
    cmd = [sys.executable, "-m", "gnn_dist.benchmarks.pyg_wrapper", "--plain", "--dataset", args.dataset,
           "--model", args.model, "--hidden", str(args.hidden), "--num-layers", str(args.num_layers),
           "--heads", str(args.heads), "--dropout", str(args.dropout), "--epochs", str(args.epochs)]
    cmd += ["--root", args.root] if args.root else []
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_built_in(args, parts: Path, num_parts: int, work: Path) -> dict:
    extra = ["--model", BUILT_IN[args.model], "--num-layers", str(args.num_layers), "--dropout", str(args.dropout),
             "--epochs", str(args.epochs + 1), "--eval-every", str(args.epochs + 1), "--weight-decay", "0"]
    if args.model.startswith("gat"):
        # PyG's GAT and GATConv default to no attention dropout; --model gat's default is --dropout's
        extra += ["--heads", str(args.heads), "--attn-dropout", "0"]
    extra += ["--hidden", str(args.hidden)]
    final = run_train(num_parts, parts, work / f"built-in-{num_parts}.jsonl", extra)
    times = [r["epoch_s"] for r in final["per_epoch"][1:] if "epoch_s" in r]  # the first epoch warms up
    return {"epoch_s_median": statistics.median(times) if times else final["epoch_s_median"],
            "halo_bytes_per_epoch": final["halo_bytes_total"] / (args.epochs + 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="synthetic:sbm60k")
    parser.add_argument("--root", default=None)
    parser.add_argument("--model", choices=["gcn", "gat", "gat-one-head-out", "gatv2", "gin"], default="gcn",
                        help="PyG's GCN, GAT, GAT v2, GIN; gat-one-head-out: GATConv layers stacked as --model gat")
    parser.add_argument("--hidden", type=int, default=256, help="width of a hidden layer (GAT: of one head)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--num-layers", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--parts", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default="runs/pyg-wrapper")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model.startswith("gat") and args.hidden == 256:
        args.hidden = 64  # 4 heads of 64: 256 columns, as PyG's GAT(hidden_channels=256, heads=4)
    if args.worker:
        return worker(args)
    if args.plain:
        print(json.dumps(plain(args)))
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    runs, rows = [], []
    for num_parts in [int(p) for p in args.parts.split(",")]:
        parts = partition(args.dataset, num_parts, work / f"{args.dataset.replace(':', '-').replace('/', '-')}-{num_parts}",
                          root=args.root)
        sides = ["wrapped"] + (["built-in"] if args.model in BUILT_IN else []) + (["plain"] if num_parts == 1 else [])
        for round_ in range(args.rounds):
            order = sides if round_ % 2 == 0 else sides[::-1]
            result = {"parts": num_parts, "round": round_}
            for side in order:
                if side == "wrapped":
                    result[side] = run_wrapped(args, parts, num_parts)
                elif side == "built-in":
                    result[side] = run_built_in(args, parts, num_parts, work)
                else:
                    result[side] = run_plain(args)
            runs.append(result)
            print(json.dumps(result), flush=True)
    for num_parts in sorted({r["parts"] for r in runs}):
        mine = [r for r in runs if r["parts"] == num_parts]
        wrapped = statistics.median(r["wrapped"]["epoch_s_median"] for r in mine)
        row = [num_parts, f"{wrapped:.3f}"]
        for side in ("built-in", "plain"):
            if side in mine[0]:
                ratios = [r["wrapped"]["epoch_s_median"] / r[side]["epoch_s_median"] for r in mine]
                row += [f"{statistics.median(r[side]['epoch_s_median'] for r in mine):.3f}",
                        ", ".join(f"{x:.2f}" for x in ratios)]
            else:
                row += ["-", "-"]
        row.append(f"{mine[0]['wrapped']['halo_bytes_per_epoch']:,.0f}")
        rows.append(row)
    text = (f"# PyG {args.model} wrapped by gd.distribute: {args.dataset}, {args.num_layers} x {args.hidden}"
            f"{' x ' + str(args.heads) + ' heads' if args.model.startswith('gat') else ''}, dropout {args.dropout}\n\n"
            + markdown_table(["P", "wrapped s/epoch", "built-in s/epoch", "wrapped / built-in per round",
                              "plain PyG s/epoch", "wrapped / plain per round", "wrapped halo bytes/epoch"], rows)
            + f"\n\n`python -m gnn_dist.benchmarks.pyg_wrapper --dataset {args.dataset} --model {args.model} "
              f"--parts {args.parts} --rounds {args.rounds} --epochs {args.epochs}`\n")
    write_report(Path(args.out), f"pyg-wrapper-{args.model}", text, args, runs)
    print(text)


if __name__ == "__main__":
    main()
