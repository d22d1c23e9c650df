"""gd.NeighborLoader beside `--mode sampled`: the sampling alone, and a whole unmodified PyG GraphSAGE epoch.

    python -m gnn_dist.benchmarks.loader_bench --dataset synthetic:sbm60k --fanouts 15,10,5 --batch-size 1024 \
        [--rounds 3] [--epochs 2] [--hidden 256] [--out runs/bench-loader]

sampling: seconds per epoch of sampling every batch of the epoch's shuffled training nodes at P=1 (one thread),
the loader's way (NeighborLoader.sample: hop h draws for the nodes hop h-1 added, PyG's layout) beside
`--mode sampled`'s (DistributedSampler.sample: hop h draws for every node so far, DGL's blocks), the same
batches and keys, alternating round by round and which goes first.

train: seconds per epoch (after the first) of `gnn-dist train --mode sampled` with PyG's GraphSAGE
(`--model torch_geometric.nn.models:GraphSAGE`: the loader's loop, trimmed per hop) at P=1 and P=2, and of the
built-in `--model sage` at P=1, each --hidden wide with one layer per fanout; P=2's seeds per second over P=1's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from gnn_dist.benchmarks.common import machine, markdown_table, partition, run_train

PYG_SAGE = "torch_geometric.nn.models:GraphSAGE"


def sampling_epochs(parts: Path, fanouts: list[int], batch: int, epochs: int, loader_first: bool) -> dict:
    """{"loader": [...], "mode sampled": [...]}: seconds per epoch of each way of sampling the same batches."""
    import torch

    import gnn_dist as gd
    from gnn_dist.comm.simulated_ranks import solo_comm
    from gnn_dist.graph.sampler import DistributedSampler

    torch.set_num_threads(1)
    data = gd.load_partition(str(parts), gd.RankContext(solo_comm()))
    loader = gd.NeighborLoader(data, fanouts, input_nodes=data.train_mask, batch_size=batch, shuffle=True, seed=0)
    blocks = DistributedSampler(loader.sampler.comm, loader.graph.part, fanouts, seed=0)
    ways = {"loader": loader.sample, "mode sampled": blocks.sample}
    for sample in ways.values():
        sample(loader.items[:batch] + loader.sampler.first, 0, 0)  # warm-up: the native kernel loads
    order = list(ways) if loader_first else list(ways)[::-1]
    times: dict[str, list[float]] = {name: [] for name in ways}
    for epoch in range(epochs):
        batches = loader.batches(epoch)
        for name in order:
            start = time.perf_counter()
            for step, rows in enumerate(batches):
                ways[name](rows + loader.sampler.first, epoch, step)
            times[name].append(time.perf_counter() - start)
    return times


def train_epochs(args, parts: dict[int, Path], out: Path) -> dict:
    """Seconds per epoch after the first, and seeds per second, of each training run."""
    fanouts = args.fanouts.split(",")
    common = ["--mode", "sampled", "--hidden", str(args.hidden), "--num-layers", str(len(fanouts)), "--fanouts",
              args.fanouts, "--batch-size", str(args.batch_size), "--epochs", str(args.epochs + 1),
              "--eval-every", "100000", "--threads", "1"]
    runs = {"PyG GraphSAGE, loader, P=1": (1, PYG_SAGE), "PyG GraphSAGE, loader, P=2": (2, PYG_SAGE),
            "--model sage, P=1": (1, "sage")}
    result = {}
    for name, (num_parts, model) in runs.items():
        final = run_train(num_parts, parts[num_parts], out / f"train-{num_parts}-{model.rpartition(':')[2]}.jsonl",
                          [*common, "--model", model])
        result[name] = [r["epoch_s"] for r in final["per_epoch"][1:]]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synthetic:sbm60k")
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--no-train", action="store_true", help="the sampling comparison only")
    parser.add_argument("--out", default="runs/bench-loader")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.dataset.replace(":", "-")
    parts = {p: partition(args.dataset, p, out / f"{name}-p{p}") for p in (1, 2)}
    fanouts = [int(f) for f in args.fanouts.split(",")]
    rounds = []
    for k in range(args.rounds):
        round_ = {"sampling": sampling_epochs(parts[1], fanouts, args.batch_size, args.epochs, loader_first=k % 2 == 0)}
        if not args.no_train:
            round_["train"] = train_epochs(args, parts, out)
        rounds.append(round_)
        print(json.dumps({"round": k, **round_}), flush=True)

    def median(kind: str, what: str) -> float:
        return statistics.median(v for r in rounds for v in r[kind][what])

    rows = [["sampling, " + what, f"{median('sampling', what):.3f}",
             f"{median('sampling', what) / median('sampling', 'mode sampled'):.2f}x"]
            for what in ("loader", "mode sampled")]
    paired = [np.median(r["sampling"]["loader"]) / np.median(r["sampling"]["mode sampled"]) for r in rounds]
    command = " ".join(sys.argv[1:] if argv is None else argv)
    text = [f"# gd.NeighborLoader beside --mode sampled ({args.dataset}, fanouts {args.fanouts}, batch "
            f"{args.batch_size})", "", "    python -m gnn_dist.benchmarks.loader_bench " + command, "",
            markdown_table(["what", "median s/epoch", "over --mode sampled's sampling"], rows), "",
            f"Loader over --mode sampled per round: {', '.join(f'{v:.2f}' for v in paired)}."]
    if not args.no_train:
        trained = [[what, f"{median('train', what):.3f}"] for what in rounds[0]["train"]]
        one, two = median("train", "PyG GraphSAGE, loader, P=1"), median("train", "PyG GraphSAGE, loader, P=2")
        text += ["", markdown_table(["training epoch", "median s/epoch"], trained), "",
                 f"P=2 over P=1 in seeds per second: {one / two:.2f}x; the loader's P=1 epoch over --model sage's: "
                 f"{one / median('train', '--model sage, P=1'):.2f}x."]
    report = "\n".join(text) + "\n"
    (out / "loader.md").write_text(report)
    (out / "loader.json").write_text(json.dumps({"machine": machine(), "config": vars(args), "rounds": rounds},
                                                indent=1))
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
