"""Link prediction beside PyG's link_pred recipe, one process, and gnn-dist at P = 1, 2, 4 (full-batch), with
sampled training at P = 1 and 2.

    python -m gnn_dist.benchmarks.link_bench --datasets planetoid:Cora,npz:PATH --root DATA [--parts 1,2,4]
        [--epochs 100] [--seeds 0,1,2] [--sampled-parts 1,2] [--speed-only synthetic:arxiv]
        [--negatives pairs|source] [--out DIR]

The recipe (PyG's examples/link_pred.py): row-normalised features (NormalizeFeatures, where features are
non-negative counts as in Planetoid; real-valued features, as facebook's, are used as they are on both
sides), GCN in -> 128 -> 64 with ReLU between, no dropout, dot-product decoder, one negative per positive
drawn afresh each epoch, BCE, Adam lr 0.01,
weight decay 0, 100 epochs; test AUC of the last epoch. Both sides use the same split: the one
`gnn-dist partition --task link` stored (85/5/10, held-out edges out of the message-passing graph), read back
from the part files; PyG draws its negatives with its own `negative_sampling` (which avoids existing edges),
gnn-dist with its keyed uniform draw, by default under the same rule (`--negatives pairs`: both ends
uniform); `--negatives source` keeps each positive's source (gnn-dist's default rule). PyG's baseline
runs first in this process (one torch thread, as each of our ranks); epoch time is the median training
step (forward, decode, backward, update), without evaluation.

Tables: test AUC (mean over seeds, and the worst seed against PyG's same seed), epoch time and its ratio to
PyG's, score and halo bytes per epoch, and sampled training's positive edges per second. `--speed-only`
graphs run fewer epochs and report time and bytes only. Timings on this host drift over minutes; four ranks
on two cores are oversubscribed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from gnn_dist.benchmarks.common import machine, markdown_table, run_train
from gnn_dist.partition.datasets import load_dataset

HIDDEN, EMBEDDING, LR = 128, 64, 0.01


def link_partition(spec: str, num_parts: int, out: Path, root: str | None, normalize: bool) -> Path:
    import subprocess
    import sys

    if not (out / "meta.json").exists():
        cmd = [sys.executable, "-m", "gnn_dist", "partition", "--dataset", spec, "--num-parts", str(num_parts),
               "--out", str(out), "--task", "link"] + (["--normalize-features"] if normalize else []) + \
              (["--root", root] if root else [])
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def stored_split(directory: Path) -> dict:
    from gnn_dist.partition.format import load_meta, load_part

    meta = load_meta(directory)
    parts = [load_part(directory, k, meta).arrays for k in range(meta.num_parts)]
    return {name: np.concatenate([p[f"link_{name}"] for p in parts])
            for name in ("train", "val_pos", "val_neg", "test_pos", "test_neg")}


def features_are_counts(graph) -> bool:
    """PyG's recipe row-normalises bag-of-words features (Planetoid's); NormalizeFeatures first shifts features by
    their smallest value, which flattens real-valued features (facebook's lie in [-3, 2.3]: every shifted row
    sums to about 384 and divides to nearly 1/128 everywhere). Both sides normalise only non-negative features."""
    return bool(graph.x.min() >= 0)


def pyg_baseline(graph, split: dict, epochs: int, seed: int, normalize: bool) -> dict:
    """PyG's recipe on the whole graph in this process: test AUC of the last epoch, median epoch time."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv
    from torch_geometric.utils import negative_sampling

    from gnn_dist.link.metrics import auc
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    x = torch.from_numpy(graph.x)
    if normalize:
        from torch_geometric.data import Data
        from torch_geometric.transforms import NormalizeFeatures

        x = NormalizeFeatures()(Data(x=x)).x
    train = torch.from_numpy(split["train"]).T
    message_passing = torch.cat([train, train.flip(0)], 1)
    conv1, conv2 = GCNConv(graph.num_features, HIDDEN), GCNConv(HIDDEN, EMBEDDING)
    params = list(conv1.parameters()) + list(conv2.parameters())
    optimizer = torch.optim.Adam(params, lr=LR)

    def encode():
        return conv2(conv1(x, message_passing).relu(), message_passing)

    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        optimizer.zero_grad()
        z = encode()
        negatives = negative_sampling(message_passing, num_nodes=graph.num_nodes, num_neg_samples=train.shape[1])
        pairs = torch.cat([train, negatives], 1)
        labels = torch.cat([torch.ones(train.shape[1]), torch.zeros(negatives.shape[1])])
        scores = (z[pairs[0]] * z[pairs[1]]).sum(-1)
        F.binary_cross_entropy_with_logits(scores, labels).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    with torch.no_grad():
        z = encode()
        score = lambda p: (z[p[:, 0]] * z[p[:, 1]]).sum(-1).numpy()  # noqa: E731
        test_auc = auc(score(torch.from_numpy(split["test_pos"])), score(torch.from_numpy(split["test_neg"])))
    return {"test_auc": test_auc, "epoch_s": statistics.median(times[2:] if len(times) > 4 else times)}


def ours(parts: Path, num_parts: int, out: Path, epochs: int, seed: int, mode: str, eval_every: int,
         negatives: str) -> dict:
    extra = ["--task", "link", "--hidden", str(HIDDEN), "--embedding-dim", str(EMBEDDING), "--num-layers", "2",
             "--dropout", "0", "--weight-decay", "0", "--lr", str(LR), "--epochs", str(epochs), "--seed", str(seed),
             "--eval-every", str(eval_every), "--mode", mode, "--negatives", negatives]
    if mode == "sampled":
        extra += ["--fanouts", "10,10", "--batch-size", "1024"]
    final = run_train(num_parts, parts, out, extra, timeout=7200)
    epochs_run = final["per_epoch"][2:] if len(final["per_epoch"]) > 4 else final["per_epoch"]
    return {"test_auc": final["test_auc"], "epoch_s": statistics.median(r["epoch_s"] for r in epochs_run),
            "score_bytes": statistics.mean(r["score_bytes"] for r in epochs_run),
            "halo_bytes": statistics.mean(r["halo_bytes"] for r in epochs_run),
            "seeds_per_s": statistics.median(r.get("seeds_per_s", 0.0) for r in epochs_run)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="planetoid:Cora")
    parser.add_argument("--speed-only", default="", help="graphs to time (fewer epochs, no accuracy table)")
    parser.add_argument("--root", default=None)
    parser.add_argument("--parts", default="1,2,4")
    parser.add_argument("--sampled-parts", default="1,2")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--speed-epochs", type=int, default=8)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--negatives", default="pairs", choices=["pairs", "source"],
                        help="gnn-dist's training negatives: pairs, as PyG's recipe, or source-kept")
    parser.add_argument("--out", default="benchmarks/results/link")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts_list = [int(p) for p in args.parts.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    rows, speed_rows = [], []
    jobs = [(spec, False) for spec in filter(None, args.datasets.split(","))] + \
           [(spec, True) for spec in filter(None, args.speed_only.split(","))]
    for spec, speed_only in jobs:
        tag = spec.replace(":", "_").replace("/", "_")[-40:]
        epochs = args.speed_epochs if speed_only else args.epochs
        run_seeds = seeds[:1] if speed_only else seeds
        graph = load_dataset(spec, args.root)  # once: the normalisation rule and every seed's baseline read it
        normalize = features_are_counts(graph)
        tag += "-normalized" if normalize else ""
        directories = {p: link_partition(spec, p, out / f"parts-{tag}-{p}", args.root, normalize) for p in parts_list}
        split = stored_split(directories[parts_list[0]])
        baseline = [pyg_baseline(graph, split, epochs, seed, normalize) for seed in run_seeds]
        pyg_time = statistics.median(b["epoch_s"] for b in baseline)
        pyg_auc = [b["test_auc"] for b in baseline]
        print(f"{spec} PyG: auc {np.mean(pyg_auc):.4f} epoch {pyg_time:.4f}s", flush=True)
        results = {}
        for mode, plist in (("full", parts_list), ("sampled", [int(p) for p in args.sampled_parts.split(",") if p])):
            for p in plist:
                if p not in directories:
                    directories[p] = link_partition(spec, p, out / f"parts-{tag}-{p}", args.root, normalize)
                runs = [ours(directories[p], p, out / f"m-{tag}-{mode}-{p}-{s}.jsonl", epochs, s, mode,
                             epochs if speed_only else 10, args.negatives) for s in run_seeds]
                results[mode, p] = runs
                print(f"{spec} {mode} P={p}: auc {np.mean([r['test_auc'] for r in runs]):.4f} epoch "
                      f"{statistics.median(r['epoch_s'] for r in runs):.4f}s", flush=True)
        one = statistics.median(r["epoch_s"] for r in results["full", parts_list[0]])
        sampled_rate = {p: statistics.median(r["seeds_per_s"] for r in runs)
                        for (mode, p), runs in results.items() if mode == "sampled"}
        for (mode, p), runs in results.items():
            epoch_s = statistics.median(r["epoch_s"] for r in runs)
            if mode == "full":
                scaling = f"{one / epoch_s:.2f}x"
            else:
                base = sampled_rate.get(min(sampled_rate))
                scaling = f"{sampled_rate[p]:,.0f} edges/s ({sampled_rate[p] / base:.2f}x P={min(sampled_rate)})"
            row = [spec, mode, p, f"{epoch_s:.4f}", f"{epoch_s / pyg_time:.2f}", scaling,
                   f"{statistics.mean(r['score_bytes'] for r in runs) / 1e6:.2f}",
                   f"{statistics.mean(r['halo_bytes'] for r in runs) / 1e6:.2f}"]
            speed_rows.append(row)
            if not speed_only:
                aucs = [r["test_auc"] for r in runs]
                worst = min(a - b for a, b in zip(aucs, pyg_auc))
                rows.append(row[:3] + [f"{100 * np.mean(aucs):.2f}", f"{100 * np.mean(pyg_auc):.2f}",
                                       f"{100 * (np.mean(aucs) - np.mean(pyg_auc)):+.2f}", f"{100 * worst:+.2f}"])
        speed_rows.append([spec, "PyG", 1, f"{pyg_time:.4f}", "1.00", "-", "-", "-"])
    env = machine()
    text = ["# Link prediction beside PyG's link_pred recipe\n",
            f"GCN {HIDDEN} -> {EMBEDDING}, dot decoder, 1:1 negatives (gnn-dist: --negatives {args.negatives}), "
            f"no dropout, Adam {LR}; {args.epochs} epochs, "
            f"seeds {args.seeds}; {env['cpu']}, {env['cores']} cores, torch {env['torch']}, one thread per rank.\n"]
    if rows:
        text += ["## Test AUC (last epoch)\n", markdown_table(
            ["dataset", "mode", "P", "test AUC %", "PyG %", "Δ mean", "worst seed Δ"], rows), ""]
    text += ["## Training epoch time and traffic\n", markdown_table(
        ["dataset", "mode", "P", "epoch s", "vs PyG", "full: speed-up vs P=1; sampled: positive edges/s",
         "score MB/epoch", "halo MB/epoch"], speed_rows), ""]
    (out / "link.md").write_text("\n".join(text))
    (out / "link.json").write_text(json.dumps({"rows": rows, "speed_rows": speed_rows, "machine": env}, indent=1))
    print("\n".join(text))


if __name__ == "__main__":
    main()
