"""Distributed partitioning (PT-Scotch at R ranks) against single-process pymetis, side by side.

    python -m gnn_dist.benchmarks.distributed_partition --dataset synthetic:products --parts 4 --ranks 1,2,4 \
        --out runs/bench-distpart --train-epochs 2

The dataset is written chunked once (`gnn-dist convert`); every run then reads
that directory. Each partition run is its own `gnn-dist partition` job; its
peak RSS per rank is the one the command prints (each rank's getrusage), and
wall time includes starting the ranks. Edge cut and replication come from
`gnn-dist inspect`. Then GCN trains for a few epochs (exact schedule) on the
PT-Scotch partition of the most ranks and on the pymetis one, and the loss
curves are compared: any partition gives the same loss.

Targets: peak per rank at the most ranks <= 0.35x pymetis's; edge cut <= 1.1x pymetis's; equal losses.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table, run_train

PEAKS = re.compile(r"peak RSS per rank ([0-9./ ]+) GiB")


def gnn_dist(*args: str, timeout: float = 7200) -> tuple[str, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gnn_dist", *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"gnn-dist {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout, time.perf_counter() - start


def run_partition(chunked: Path, parts: int, method: str, ranks: int, out: Path) -> dict:
    extra = ["--ranks", str(ranks)] if method == "ptscotch" else []
    try:
        stdout, seconds = gnn_dist("partition", "--dataset", f"chunked:{chunked}", "--num-parts", str(parts),
                                   "--method", method, "--out", str(out), "--overwrite", *extra)
    except RuntimeError as err:  # the memory guard's refusal is a result: this host cannot run it
        refusal = next((line for line in str(err).splitlines() if "would need about" in line), None)
        if refusal is None:
            raise
        return {"method": method, "ranks": ranks, "parts": parts, "refused": refusal}
    peaks = [float(v) * 2**30 for v in PEAKS.search(stdout).group(1).split("/")]
    report = json.loads(gnn_dist("inspect", str(out), "--json")[0])
    return {"method": method, "ranks": ranks, "parts": parts, "seconds": seconds, "peak_rss_bytes_per_rank": peaks,
            "peak_rss_bytes": max(peaks), "edge_cut": report["edge_cut"],
            "replication_factor": report["replication_factor"], "balance": report["balance"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synthetic:products")
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--out", default="runs/bench-distpart")
    parser.add_argument("--skip-pymetis", action="store_true")
    parser.add_argument("--train-epochs", type=int, default=2)
    parser.add_argument("--train-args", default="--halo-memory sequential",
                        help="extra gnn-dist train arguments (the products graph needs sequential halos at P=4)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chunked = out / "chunked"
    stdout, convert_seconds = gnn_dist("convert", "--dataset", args.dataset, "--out", str(chunked), "--overwrite")
    print(stdout.strip(), flush=True)
    results = []
    for ranks in sorted((int(r) for r in args.ranks.split(",")), reverse=True):  # most ranks first
        results.append(run_partition(chunked, args.parts, "ptscotch", ranks, out / f"ptscotch-r{ranks}"))
        print(json.dumps(results[-1]), flush=True)
    if not args.skip_pymetis:
        results.append(run_partition(chunked, args.parts, "metis", 1, out / "metis"))
        print(json.dumps(results[-1]), flush=True)

    losses = {}
    if args.train_epochs > 0:
        most = max(r["ranks"] for r in results if r["method"] == "ptscotch" and "refused" not in r)
        for name in [f"ptscotch-r{most}"] + ([] if args.skip_pymetis else ["metis"]):
            final = run_train(args.parts, out / name, out / f"train-{name}.jsonl",
                              ["--epochs", str(args.train_epochs), "--model", "gcn", "--schedule", "exact",
                               *args.train_args.split()], timeout=7200)
            losses[name] = [record["loss"] for record in final["per_epoch"]]
            print(name, losses[name], flush=True)

    pymetis = next((r for r in results if r["method"] == "metis"), None)
    rows = []
    for r in results:
        if "refused" in r:
            rows.append([r["method"], r["ranks"], "refused before loading: " + r["refused"].split(": error: ")[-1]]
                        + [""] * 6)
            continue
        rows.append([r["method"], r["ranks"], f"{r['seconds']:.0f}", f"{r['peak_rss_bytes'] / 2**30:.2f}",
                     " / ".join(f"{v / 2**30:.2f}" for v in r["peak_rss_bytes_per_rank"]),
                     f"{r['peak_rss_bytes'] / pymetis['peak_rss_bytes']:.2f}" if pymetis else "",
                     f"{r['edge_cut']:,}", f"{r['edge_cut'] / pymetis['edge_cut']:.3f}" if pymetis else "",
                     f"{r['replication_factor']:.3f}"])
    table = markdown_table(["method", "ranks R", "wall s", "peak/rank GiB (max)", "per rank", "peak vs pymetis",
                            "edge cut", "cut vs pymetis", "replication"], rows)
    summary = {"dataset": args.dataset, "parts": args.parts, "convert_seconds": convert_seconds, "runs": results,
               "losses": losses, "machine": machine()}
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    (out / "results.md").write_text(f"# Distributed partitioning: {args.dataset}, P={args.parts}\n\n{table}\n\n"
                                    f"losses: {json.dumps(losses)}\n")
    print(table)


if __name__ == "__main__":
    main()
