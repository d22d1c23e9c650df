"""Sampled R-GCN at ogbn-mag's scale, end to end (the scale run): seconds per epoch, peak RSS per rank,
bytes per epoch, at each P.

    python -m gnn_dist.benchmarks.hetero_sampled_scale --parts-dir "parts/mag-p{P}" --parts 2,4 \\
        [--fanouts 25,20] [--batch-size 1024] [--hidden 64] [--epochs 1] [--out runs/bench-hetero-scale]

The partitions are made first (`gnn-dist partition --dataset synthetic:mag --num-parts P`), never beside a run.
Each run trains --epochs whole epochs (every rank's training papers once: ceil(629k / (P x batch)) steps a
rank) with evaluation only after the last, layer by layer in chunks. Ranks run one thread each; at P=4 the two
cores here are oversubscribed, so its seconds are no speed-up.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table, run_train

GIB = 2**30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts-dir", required=True, help="partition directories, {P} standing for P")
    parser.add_argument("--parts", default="2,4")
    parser.add_argument("--fanouts", default="25,20")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--out", default="runs/bench-hetero-scale")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, raw = [], []
    for p in [int(v) for v in args.parts.split(",")]:
        parts = Path(args.parts_dir.replace("{P}", str(p)))
        final = run_train(p, parts, out / f"m-sampled-{p}.jsonl",
                          ["--model", "rgcn", "--hidden", str(args.hidden), "--num-layers", "2", "--dropout", "0.5",
                           "--mode", "sampled", "--fanouts", args.fanouts, "--batch-size", str(args.batch_size),
                           "--epochs", str(args.epochs), "--eval-every", str(args.epochs)], timeout=4 * 3600)
        epochs = final["per_epoch"]
        steps = -(-max(epochs[0]["seeds"], 1) // (p * args.batch_size))
        raw.append({"parts": p, "final": final})
        rows.append([str(p), str(steps), f"{epochs[-1]['epoch_s']:.1f}", f"{epochs[-1]['seeds_per_s']:.0f}",
                     " / ".join(f"{v / GIB:.2f}" for v in final["peak_rss_bytes_per_rank"]),
                     f"{epochs[-1]['sample_bytes'] / 1e6:.0f} + {epochs[-1]['feature_bytes'] / 1e6:.0f}",
                     f"{final['test_acc']:.4f}"])
    table = markdown_table(["P", "steps a rank", "epoch s", "seeds / s", "peak RSS per rank (GiB)",
                            "bytes per epoch, sampling + features (MB)", "test accuracy"], rows)
    text = (f"Sampled R-GCN, 2 layers, hidden {args.hidden}, fanouts {args.fanouts} per relation, batch "
            f"{args.batch_size} per rank, {args.epochs} epoch(s); {machine()['cpu']}\n\n{table}\n")
    (out / "hetero-sampled-scale.md").write_text(text)
    (out / "hetero-sampled-scale.json").write_text(json.dumps({"machine": machine(), "config": vars(args),
                                                               "runs": raw}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
