"""Halo traffic under METIS's two objectives: edge cut against communication volume.

    python -m gnn_dist.benchmarks.objective_bench --datasets synthetic:arxiv,npz:../shared/data/npz/facebook.npz \
        --parts 2,4,8 --out runs/bench-objective

For each dataset and P it partitions with `--objective cut` and `--objective
volume` and reads `gnn-dist inspect --json`: edge cut, halo rows (the
communication volume: rows one exchange sends) and the predicted training
halo bytes per epoch of GCN 3x64 (exact, fp32), which the test suite checks
against the bytes a run really sends. --measure-parts P also trains one epoch
at that P under each objective and reports the bytes counted on the wire.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MODEL = ["--hidden", "64", "--num-layers", "3"]


def gnn_dist(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "gnn_dist", *args], check=True, capture_output=True, text=True).stdout


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="synthetic:arxiv")
    parser.add_argument("--parts", default="2,4,8")
    parser.add_argument("--measure-parts", type=int, default=0, help="also train one epoch at this P and count bytes")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for dataset in args.datasets.split(","):
        for num_parts in (int(p) for p in args.parts.split(",")):
            row = {"dataset": dataset, "parts": num_parts}
            for objective in ("cut", "volume"):
                directory = args.out / f"{dataset.replace(':', '_').replace('/', '_')}-p{num_parts}-{objective}"
                start = time.perf_counter()
                gnn_dist("partition", "--dataset", dataset, "--num-parts", str(num_parts), "--objective", objective,
                         "--out", str(directory), "--overwrite")
                seconds = time.perf_counter() - start
                report = json.loads(gnn_dist("inspect", str(directory), "--json", *MODEL))
                row[objective] = {"edge_cut": report["edge_cut"], "halo_rows": report["total_halo_rows"],
                                  "bytes_per_epoch": report["predicted_halo_bytes_per_epoch"], "seconds": seconds}
                if num_parts == args.measure_parts:
                    metrics = directory / "metrics.jsonl"
                    subprocess.run([mpiexec(), "-n", str(num_parts), sys.executable, "-m", "gnn_dist", "train", "--parts",
                                    str(directory), "--epochs", "1", *MODEL, "--no-progress", "--metrics-out",
                                    str(metrics)], check=True, capture_output=True)
                    row[objective]["measured_bytes"] = json.loads(metrics.read_text().splitlines()[0])["halo_bytes"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "objective.json").write_text(json.dumps(rows, indent=1))
    lines = ["| dataset | P | edge cut (cut / volume) | halo rows (cut / volume) | volume / cut | predicted halo MB "
             "per epoch, GCN 3x64 (cut / volume) | measured MB (cut / volume) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        c, v = r["cut"], r["volume"]
        measured = (f"{c['measured_bytes'] / 1e6:.1f} / {v['measured_bytes'] / 1e6:.1f}"
                    if "measured_bytes" in c else "")
        lines.append(f"| {r['dataset']} | {r['parts']} | {c['edge_cut']:,} / {v['edge_cut']:,} | {c['halo_rows']:,} / "
                     f"{v['halo_rows']:,} | {v['halo_rows'] / c['halo_rows']:.3f} | {c['bytes_per_epoch'] / 1e6:.1f} / "
                     f"{v['bytes_per_epoch'] / 1e6:.1f} | {measured} |")
    (args.out / "objective.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
