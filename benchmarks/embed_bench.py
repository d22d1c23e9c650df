"""`gnn-dist embed` against one epoch of evaluation: wall time and peak RSS per rank.

    python -m gnn_dist.benchmarks.embed_bench [--dataset synthetic:products] [--parts 4]
        [--halo-memory sequential] [--hidden 256] [--out DIR]

It partitions the graph, trains one epoch (with --halo-memory) and a checkpoint (its evaluation at the end is the reference: the
final record's `eval_s` and `eval_peak_rss_bytes`), then runs `mpiexec -n P gnn-dist embed` from that
checkpoint for the last layer and for `--layer -2`, timing the whole launch (start-up, loading the part and the
checkpoint, the chunked forward, writing the file) and reading each rank's peak RSS from embed's own line.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table, mpiexec, partition, run_train

GIB = 2**30


def embed(parts: Path, checkpoints: Path, out: Path, num_parts: int, layer: int) -> dict:
    command = [mpiexec(), "-n", str(num_parts), sys.executable, "-m", "gnn_dist", "embed", "--parts", str(parts),
               "--checkpoint-dir", str(checkpoints), "--out", str(out), "--layer", str(layer)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=7200)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"embed failed:\n{done.stderr[-2000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("wrote "))
    peaks = [float(v) * GIB for v in re.search(r"peak RSS per rank ([0-9., ]+) GiB", line).group(1).split(",")]
    return {"wall_s": wall, "peak_rss_bytes_per_rank": peaks, "bytes": out.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synthetic:products")
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--halo-memory", default="sequential")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--out", default="runs/bench-embed")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = partition(args.dataset, args.parts, out / f"parts-{args.dataset.replace(':', '-')}-{args.parts}")
    checkpoints = out / "checkpoints"
    start = time.perf_counter()
    final = run_train(args.parts, parts, out / "train.jsonl",
                      ["--hidden", str(args.hidden), "--num-layers", "3", "--epochs", "1", "--eval-every", "1",
                       "--halo-memory", args.halo_memory, "--checkpoint-dir", str(checkpoints),
                       "--checkpoint-every", "1"], timeout=7200)
    train_wall = time.perf_counter() - start
    epoch = final["per_epoch"][-1]
    rows = [["training epoch + evaluation (train's launch)", f"{train_wall:.1f}", f"{epoch['epoch_s']:.1f}",
             f"{epoch['eval_s']:.1f}", f"{final['eval_peak_rss_bytes'] / GIB:.2f}",
             " / ".join(f"{v / GIB:.2f}" for v in final["peak_rss_bytes_per_rank"])]]
    results = {"train": final | {"wall_s": train_wall}}
    for layer in (-1, -2):
        result = embed(parts, checkpoints, out / f"embedding{layer}.npy", args.parts, layer)
        results[f"embed{layer}"] = result
        rows.append([f"embed --layer {layer} ({result['bytes'] / 1e6:.0f} MB written)", f"{result['wall_s']:.1f}",
                     "", "", "", " / ".join(f"{v / GIB:.2f}" for v in result["peak_rss_bytes_per_rank"])])
    env = machine()
    text = (f"# embed against one epoch of evaluation: {args.dataset}, P={args.parts}, --halo-memory "
            f"{args.halo_memory}, GCN 3x{args.hidden}\n\n{env['cpu']}, {env['cores']} cores, one thread per rank "
            f"(P={args.parts} ranks on {env['cores']} cores are oversubscribed alike in every row).\n\n" +
            markdown_table(["launch", "wall s", "epoch s", "eval s", "eval peak GiB/rank (max)",
                            "peak RSS GiB per rank (whole launch)"], rows) + "\n")
    (out / "embed.md").write_text(text)
    (out / "embed.json").write_text(json.dumps({"machine": env, "args": vars(args), "results": results},
                                               indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
