"""A job killed twice at random epochs finishes under `gnn-dist supervise` with the uninterrupted loss curve.

    python -m gnn_dist.benchmarks.supervise_demo --dataset synthetic:arxiv --parts 4 --epochs 30 --out runs/supervise-demo

Runs the job once uninterrupted, then under `gnn-dist supervise` with two
injected SIGKILLs (a random rank at a random epoch in each of the first two
attempts, drawn from --seed and printed), and writes a table of both loss
curves, the restarts and the wall time to OUT/results.md.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def train_command(args, metrics: Path, extra: list[str]) -> list[str]:
    return [mpiexec(), "-n", str(args.parts), sys.executable, "-m", "gnn_dist", "train", "--parts", str(args.out / "parts"),
            "--epochs", str(args.epochs), "--hidden", "64", "--num-layers", "3", "--no-progress",
            "--metrics-out", str(metrics), *extra]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="synthetic:arxiv")
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="draws the killed ranks and epochs")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.out / "parts" / "meta.json").exists():
        subprocess.run([sys.executable, "-m", "gnn_dist", "partition", "--dataset", args.dataset, "--num-parts",
                        str(args.parts), "--out", str(args.out / "parts"), "--overwrite"], check=True)
    draw = random.Random(args.seed)
    first = draw.randrange(2, args.epochs // 2)
    second = draw.randrange(first + 1, args.epochs - 1)
    kills = [(draw.randrange(args.parts), first), (draw.randrange(args.parts), second)]
    fail_at = ",".join(f"{rank}:{epoch}:kill@{attempt}" for attempt, (rank, epoch) in enumerate(kills))
    print(f"kills: {fail_at}", flush=True)

    start = time.perf_counter()
    subprocess.run(train_command(args, args.out / "whole.jsonl", []), check=True)
    whole_s = time.perf_counter() - start
    healed = args.out / "healed.jsonl"
    ckpt = args.out / "ckpt"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gnn_dist", "supervise", "--max-restarts", "3", "--backoff", "1",
                           "--", *train_command(args, healed, ["--checkpoint-dir", str(ckpt), "--checkpoint-every",
                                                               str(args.checkpoint_every)])],
                          env={**os.environ, "GNN_DIST_FAIL_AT": fail_at}, capture_output=True, text=True)
    healed_s = time.perf_counter() - start
    log = [line for line in done.stderr.splitlines() if line.startswith("gnn-dist supervise:")]
    print("\n".join(log))
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return done.returncode
    a = [r for r in records(args.out / "whole.jsonl") if "final" not in r]
    b_all = records(healed)
    b = [r for r in b_all if "final" not in r]
    worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
    lines = [f"# `gnn-dist supervise`: {args.dataset}, P={args.parts}, GCN 3x64, {args.epochs} epochs", "",
             f"Kills (rank:epoch, attempt): `{fail_at}`; checkpoints every {args.checkpoint_every} epochs.", "",
             "Supervisor log:", "", *[f"    {line}" for line in log], "",
             f"- epochs in the healed metrics file: {[r['epoch'] for r in b] == list(range(args.epochs))} "
             f"(each of 0..{args.epochs - 1} exactly once)",
             f"- final record: restarts = {b_all[-1]['restarts']}, resumed_from_epoch = "
             f"{b_all[-1]['resumed_from_epoch']}, test_acc = {b_all[-1]['test_acc']:.4f} "
             f"(uninterrupted {records(args.out / 'whole.jsonl')[-1]['test_acc']:.4f})",
             f"- largest relative loss difference over {args.epochs} epochs: {worst:.2e}",
             f"- wall time: uninterrupted {whole_s:.0f} s, supervised with two kills {healed_s:.0f} s", "",
             "| epoch | loss (uninterrupted) | loss (killed twice, supervised) |", "|---|---|---|"]
    lines += [f"| {x['epoch']} | {x['loss']:.6f} | {y['loss']:.6f} |" for x, y in zip(a, b)]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print((args.out / "results.md").read_text())
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
