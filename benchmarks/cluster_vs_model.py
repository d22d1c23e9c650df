"""Two emulated hosts on a real shaped link against one host with the modelled link.

    sudo python -m gnn_dist.benchmarks.cluster_vs_model [--dataset synthetic:arxiv] [--parts 2,4] [--epochs 45]
        [--target-val-acc 0.8] [--rate-gbit 1]
        [--configs exact,stale:4,pipeline,bns:0.1,adaptive:0.05,exact+int8] [--out DIR]

For every P and schedule it trains twice on the same partition: across two hosts of scripts/cluster.sh
(network, UTS, IPC, mount and PID namespaces, MPI over TCP through a tbf link of --rate-gbit), and on this
host alone with `--simulate-link RATE` (gnn_dist.comm.simulated_link). It reports each run's median epoch time and
communication time (epochs after the first two) and their ratio: the target is agreement within 15%. Both
runs evaluate after every epoch, and each reports its time to --target-val-acc: the training seconds (epoch_s
summed, as benchmarks/time_to_accuracy.py counts them) until validation accuracy first reaches it; the two
runs of a pair follow the same curve (the link changes timing, not arithmetic), so they reach it at the same
epoch and differ only in seconds. The cluster is torn down afterwards, also on failure. Needs root (ip netns,
tc); both runs share this host's cores, so each side's compute is as contended as the other's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table, partition, run_train
from gnn_dist.benchmarks.time_to_accuracy import val_curve

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "scripts" / "cluster.sh"
NAME = "gdb"
HOSTS = [f"{NAME}-h0", f"{NAME}-h1"]


def cluster(*args: str) -> None:
    done = subprocess.run(["bash", str(CLUSTER), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CLUSTER_NAME": NAME})
    if done.returncode != 0:
        raise RuntimeError(f"scripts/cluster.sh {' '.join(args)} failed:\n{done.stderr[-2000:]}")


def across_hosts(num_parts: int, parts: Path, metrics: Path, extra: list[str]) -> dict:
    env = {**os.environ, "CLUSTER_NAME": NAME, "MPIEXEC": str(Path(sys.executable).parent / "mpiexec"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    spec = ",".join(f"{host}:{num_parts // 2}" for host in HOSTS)
    command = ["bash", str(CLUSTER), "mpiexec", "-hosts", spec, "-n", str(num_parts), sys.executable, "-m",
               "gnn_dist", "train", "--parts", str(parts.resolve()), "--metrics-out", str(metrics.resolve()),
               "--no-progress", *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"the run across hosts failed:\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {**records[-1], "per_epoch": records[:-1]}


def timings(final: dict, target: float) -> dict:
    epochs = final["per_epoch"][2:] or final["per_epoch"]
    curve = val_curve(final["per_epoch"])
    reached = next(((epoch, seconds) for epoch, (seconds, acc) in enumerate(curve) if acc >= target), (None, None))
    return {"epoch_s": statistics.median(r["epoch_s"] for r in epochs),
            "comm_s": statistics.median(r["comm_s"] for r in epochs),
            "halo_bytes": final["halo_bytes_total"], "val_acc": final.get("best_val_acc"),
            "target_epoch": reached[0], "time_to_target_s": reached[1],
            "val_accs": [acc for _, acc in curve]}


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _ratio(real: float | None, modelled: float | None) -> str:
    return "–" if real is None or modelled is None else f"{real / modelled:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synthetic:arxiv")
    parser.add_argument("--parts", default="2,4")
    parser.add_argument("--epochs", type=int, default=45)
    parser.add_argument("--target-val-acc", type=float, default=0.8,
                        help="the validation accuracy whose time to reach is compared (default 0.8: exact reaches it "
                             "on synthetic:arxiv, GCN 3x128, in about 30 epochs)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--rate-gbit", type=float, default=1.0)
    parser.add_argument("--configs", default="exact,stale:4,pipeline,bns:0.1,adaptive:0.05,exact+int8")
    parser.add_argument("--out", default="runs/bench-cluster")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("cluster_vs_model: the emulated cluster needs root (ip netns, tc): run it with sudo", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--hidden", str(args.hidden), "--num-layers", "3", "--epochs", str(args.epochs), "--eval-every", "1",
              "--timeout", "600"]
    rows, raw = [], []
    cluster("up", "2", "--rate", f"{args.rate_gbit:g}gbit")
    try:
        for num_parts in (int(p) for p in args.parts.split(",")):
            parts = partition(args.dataset, num_parts, out / f"parts-{args.dataset.replace(':', '-')}-{num_parts}")
            for config in args.configs.split(","):
                spec, _, dtype = config.partition("+")
                extra = common + ["--schedule", spec, "--halo-dtype", dtype or "fp32"]
                tag = f"{num_parts}-{config.replace(':', '_').replace('+', '-')}"
                real = timings(across_hosts(num_parts, parts, out / f"cluster-{tag}.jsonl", extra),
                               args.target_val_acc)
                modelled = timings(run_train(num_parts, parts, out / f"model-{tag}.jsonl",
                                             extra + ["--simulate-link", f"{args.rate_gbit:g}"]), args.target_val_acc)
                raw.append({"parts": num_parts, "config": config, "cluster": real, "modelled": modelled})
                rows.append([num_parts, config, f"{real['epoch_s']:.3f}", f"{modelled['epoch_s']:.3f}",
                             f"{real['epoch_s'] / modelled['epoch_s']:.2f}", f"{real['comm_s']:.3f}",
                             f"{modelled['comm_s']:.3f}", f"{real['halo_bytes'] / args.epochs / 1e6:.1f}",
                             "yes" if real["halo_bytes"] == modelled["halo_bytes"] else "NO",
                             "–" if real["target_epoch"] is None else real["target_epoch"] + 1,
                             _seconds(real["time_to_target_s"]), _seconds(modelled["time_to_target_s"]),
                             _ratio(real["time_to_target_s"], modelled["time_to_target_s"]),
                             "yes" if real["val_accs"] == modelled["val_accs"] else "NO"])
                print(" | ".join(str(v) for v in rows[-1]), flush=True)
    finally:
        cluster("down")
    env = machine()
    text = (f"# Two emulated hosts at {args.rate_gbit:g} Gbit/s (real, tbf) against one host with "
            f"--simulate-link {args.rate_gbit:g}\n\n{args.dataset}, GCN 3x{args.hidden}, {args.epochs} epochs, median of "
            f"the epochs after the first two; time to validation accuracy {args.target_val_acc:g} (training seconds, "
            f"evaluation excluded; '–': not reached in {args.epochs} epochs); {env['cpu']}, {env['cores']} cores "
            f"(both sides share them).\n\n" +
            markdown_table(["P", "schedule", "epoch s (2 hosts)", "epoch s (modelled)", "real / modelled",
                            "comm s (2 hosts)", "comm s (modelled)", "halo MB/epoch", "same bytes", "epochs to target",
                            "to target s (2 hosts)", "to target s (modelled)", "real / modelled",
                            "same val curve"], rows) + "\n")
    (out / "cluster_vs_model.md").write_text(text)
    (out / "cluster_vs_model.json").write_text(json.dumps({"machine": env, "args": vars(args), "runs": raw},
                                                          indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
