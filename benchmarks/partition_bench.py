"""Partition time, peak memory, edge cut and replication: METIS against random.

    python -m gnn_dist.benchmarks.partition_bench --dataset synthetic:arxiv --parts 2,4,8,16 --out runs/bench-partition

Each (P, method) runs as its own `gnn-dist partition` process, so peak RSS is
that run's alone (measured by the parent with wait4's rusage).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table


def measure(dataset: str, root: str | None, num_parts: int, method: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "gnn_dist", "partition", "--dataset", dataset, "--num-parts", str(num_parts),
           "--out", str(out), "--method", method, "--overwrite"] + (["--root", root] if root else [])
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(proc.stderr.read().decode())
    report = json.loads(subprocess.run([sys.executable, "-m", "gnn_dist", "inspect", str(out), "--json"],
                                       capture_output=True, text=True, check=True).stdout)
    return {"parts": num_parts, "method": method, "seconds": elapsed, "peak_rss_bytes": usage.ru_maxrss * 1024,
            "edge_cut": report["edge_cut"], "edge_cut_fraction": report["edge_cut_fraction"],
            "replication_factor": report["replication_factor"], "balance": report["balance"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synthetic:arxiv")
    parser.add_argument("--root", default=None)
    parser.add_argument("--parts", default="2,4,8,16")
    parser.add_argument("--out", default="runs/bench-partition")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for num_parts in (int(p) for p in args.parts.split(",")):
        for method in ("metis", "random"):
            results.append(measure(args.dataset, args.root, num_parts, method, out / f"p{num_parts}-{method}"))
            print(json.dumps(results[-1]), file=sys.stderr)
    (out / "partition.json").write_text(json.dumps({"machine": machine(), "results": results}, indent=1))
    by_key = {(r["parts"], r["method"]): r for r in results}
    rows = []
    for num_parts in sorted({r["parts"] for r in results}):
        m, r = by_key[(num_parts, "metis")], by_key[(num_parts, "random")]
        rows.append([num_parts, f"{m['seconds']:.1f}", f"{m['peak_rss_bytes'] / 2**30:.2f}",
                     f"{m['edge_cut']:,} ({100 * m['edge_cut_fraction']:.1f}%)",
                     f"{r['edge_cut']:,} ({100 * r['edge_cut_fraction']:.1f}%)",
                     f"{m['replication_factor']:.2f}", f"{r['replication_factor']:.2f}", f"{m['balance']:.3f}"])
    text = (f"{args.dataset}: `gnn-dist partition` (load + partition + write), one process each\n\n"
            + markdown_table(["P", "METIS s", "METIS peak RSS GiB", "METIS edge cut", "random edge cut",
                              "METIS replication", "random replication", "METIS balance"], rows))
    (out / "partition.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
