"""`gnn-dist bench`: sweeps of datasets x rank counts x schedules x modes x seeds, with PyG baselines.

Every training run is a real `mpiexec -n P gnn-dist train` subprocess with a
timeout; a run that fails or times out is recorded as failed with the tail of
its stderr and the sweep goes on. Partitions are cached by (dataset, P,
method, seed) under OUT/partitions and reused. A `pyg` baseline row per
dataset, model and mode runs PyG's own layers in one process with the same
hyperparameters and threads (gnn_dist.benchmarks.pyg_fullbatch); sampled-mode
baselines need PyG's NeighborLoader backends and are recorded as skipped
without them.

Outputs in OUT: results.jsonl, results.csv, summary.md and PNG plots, each
carrying the machine, library versions, git commit and the full config.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gnn_dist.benchmarks.common import machine, mpi_versions, mpiexec
from gnn_dist.benchmarks.time_to_accuracy import add_time_to_target, section, val_curve
from gnn_dist.benchmarks.time_to_accuracy import plot as time_to_accuracy_plot

# Published OGB leaderboard test accuracies (mean over 10 runs) of the reference full-batch models.
OGB_REFERENCE = {
    "ogbn-arxiv": {"gcn": 0.7174, "sage": 0.7149},
    "ogbn-products": {"gcn": 0.7564, "sage": 0.7850},
}
CSV_COLUMNS = ["run_id", "backend", "dataset", "parts", "mode", "schedule", "halo_dtype", "model", "seed", "link",
               "epochs", "status", "target_val_acc", "time_to_target_s", "epoch_s_median", "test_acc", "best_val_acc",
               "test_acc_at_best_val", "ogb_test_acc",
               "halo_bytes_per_epoch", "halo_bytes_total", "compute_s_median", "comm_s_median", "wait_s_median",
               "peak_rss_bytes", "wall_s", "error"]


@dataclass(frozen=True)
class BenchConfig:
    datasets: list = field(default_factory=lambda: ["synthetic:tiny"])
    root: str | None = None
    parts: list = field(default_factory=lambda: [1, 2])
    schedules: list = field(default_factory=lambda: ["exact"])
    halo_dtypes: list = field(default_factory=lambda: ["fp32"])
    modes: list = field(default_factory=lambda: ["full"])
    models: list = field(default_factory=lambda: ["gcn"])
    seeds: list = field(default_factory=lambda: [0])
    epochs: int = 50
    hidden: int = 256
    num_layers: int = 3
    heads: int = 1  # attention heads per hidden layer (--models gat)
    dropout: float = 0.5
    lr: float = 0.01
    threads: int = 1
    method: str = "metis"
    timeout: float = 3600.0
    pyg: bool = True
    out: str = "runs/bench"
    extra_train_args: list = field(default_factory=list)
    links: list = field(default_factory=list)  # modelled link bandwidths, Gb/s (benchmarks.time_to_accuracy)
    target_val_acc: float = 0.0  # time-to-accuracy target (0: 0.98 x the exact schedule's best)


@dataclass(frozen=True)
class Run:
    dataset: str
    parts: int
    mode: str
    schedule: str
    halo_dtype: str
    model: str
    seed: int
    link: str = ""  # modelled link, Gb/s ("": this host's own exchange)

    @property
    def run_id(self) -> str:
        name = f"{self.dataset}-p{self.parts}-{self.mode}-{self.schedule}-{self.halo_dtype}-{self.model}-s{self.seed}"
        name += f"-link{self.link}" if self.link else ""
        return "".join(c if c.isalnum() or c in "-._" else "_" for c in name)


def plan_runs(config: BenchConfig) -> list[Run]:
    runs = []
    for dataset in config.datasets:
        for mode in config.modes:
            for model in config.models:
                for num_parts in config.parts:
                    for schedule in config.schedules:
                        for dtype in config.halo_dtypes:
                            if mode == "sampled" and (schedule, dtype) != ("exact", "fp32"):
                                continue  # schedules shape full-batch halo traffic only
                            for seed in config.seeds:
                                for link in config.links or [""]:
                                    runs.append(Run(dataset, num_parts, mode, schedule, dtype, model, seed,
                                                    str(link)))
    return runs


def environment() -> dict:
    import torch_geometric

    info = {**machine(), "memory_bytes": None, "torch_geometric": torch_geometric.__version__}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_bytes"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        info.update(mpi_versions())
    except (OSError, subprocess.TimeoutExpired):  # version reporting must not stop a sweep
        info.update({"mpi4py": "unknown", "mpi_library": "unknown"})
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).resolve().parent)
        info["git_commit"] = commit.stdout.strip() or "unknown"
    except OSError:
        info["git_commit"] = "unknown"
    return info


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def ensure_partition(config: BenchConfig, dataset: str, num_parts: int, seed: int = 0) -> Path:
    """Cached by (dataset, P, method, seed)."""
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in dataset)
    out = Path(config.out) / "partitions" / f"{safe}-p{num_parts}-{config.method}-s{seed}"
    if not (out / "meta.json").is_file():
        cmd = [sys.executable, "-m", "gnn_dist", "partition", "--dataset", dataset, "--num-parts", str(num_parts),
               "--out", str(out), "--method", config.method, "--seed", str(seed), "--overwrite"]
        if config.root:
            cmd += ["--root", config.root]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=config.timeout)
        if done.returncode != 0:
            raise RuntimeError(_tail(done.stderr))
    return out


def ogb_score(dataset: str, root: str | None, predictions_path: Path) -> float | None:
    """Test accuracy by OGB's own Evaluator, for OGB datasets."""
    if not dataset.startswith("ogbn-") or not predictions_path.is_file():
        return None
    import numpy as np

    from gnn_dist.partition.datasets import import_ogb_quietly, load_dataset

    import_ogb_quietly()
    from ogb.nodeproppred import Evaluator

    graph = load_dataset(dataset, root)
    predictions = np.load(predictions_path, allow_pickle=False)
    test = graph.test_mask
    result = Evaluator(dataset).eval({"y_true": graph.y[test].reshape(-1, 1),
                                      "y_pred": predictions[test].reshape(-1, 1)})
    return float(result["acc"])


def run_ours(config: BenchConfig, run: Run) -> dict:
    out = Path(config.out) / "runs" / run.run_id
    out.mkdir(parents=True, exist_ok=True)
    row = {"run_id": run.run_id, "backend": "gnn-dist", **asdict(run), "epochs": config.epochs}
    start = time.perf_counter()
    try:
        parts = ensure_partition(config, run.dataset, run.parts)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return {**row, "status": "failed", "error": f"partition: {err}", "wall_s": time.perf_counter() - start}
    metrics = out / "metrics.jsonl"
    predictions = out / "predictions.npy"
    cmd = [mpiexec(), "-n", str(run.parts), sys.executable, "-m", "gnn_dist", "train", "--parts", str(parts),
           "--mode", run.mode, "--schedule", run.schedule, "--halo-dtype", run.halo_dtype, "--model", run.model,
           "--seed", str(run.seed), "--epochs", str(config.epochs), "--hidden", str(config.hidden),
           "--num-layers", str(config.num_layers), "--dropout", str(config.dropout), "--lr", str(config.lr),
           "--threads", str(config.threads), "--metrics-out", str(metrics), "--no-progress",
           *(["--heads", str(config.heads)] if run.model == "gat" else []), *config.extra_train_args]
    if run.dataset.startswith("ogbn-"):
        cmd += ["--predictions-out", str(predictions)]
    if run.link:
        cmd += ["--simulate-link", run.link]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=config.timeout)
    except subprocess.TimeoutExpired as err:
        stderr = err.stderr.decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
        return {**row, "status": "timeout", "error": f"timed out after {config.timeout:g} s\n{_tail(stderr)}",
                "wall_s": time.perf_counter() - start}
    row["wall_s"] = time.perf_counter() - start
    (out / "stderr.txt").write_text(done.stderr)
    if done.returncode != 0 or not metrics.is_file():
        return {**row, "status": "failed", "error": _tail(done.stderr) or f"exit code {done.returncode}"}
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    final = records[-1]
    epochs = max(final["epochs"], 1)
    if run.link:
        row["val_curve"] = val_curve(records)
    trained = records[:-1]
    breakdown = {key: statistics.median(r[key] for r in trained) if trained and key in trained[0] else None
                 for key in ("compute_s", "comm_s", "wait_s")}
    return {**row, "status": "ok", "epoch_s_median": final["epoch_s_median"], "test_acc": final["test_acc"],
            **{f"{key}_median": value for key, value in breakdown.items()},
            "best_val_acc": final["best_val_acc"], "test_acc_at_best_val": final["test_acc_at_best_val"],
            "ogb_test_acc": ogb_score(run.dataset, config.root, predictions),
            "halo_bytes_total": final["halo_bytes_total"], "halo_bytes_per_epoch": final["halo_bytes_total"] / epochs,
            "peak_rss_bytes": final["peak_rss_bytes"]}


def run_pyg(config: BenchConfig, dataset: str, model: str, mode: str, seed: int) -> dict:
    row = {"run_id": f"pyg-{dataset}-{mode}-{model}-s{seed}".replace(":", "_").replace("/", "_"), "backend": "pyg",
           "dataset": dataset, "parts": 1, "mode": mode, "schedule": "", "halo_dtype": "fp32", "model": model,
           "seed": seed, "epochs": config.epochs}
    if mode == "sampled":
        return {**row, "status": "skipped",
                "error": "PyG's NeighborLoader baseline needs torch-sparse or pyg-lib (not installed by default)"}
    cmd = [sys.executable, "-m", "gnn_dist.benchmarks.pyg_fullbatch", "--dataset", dataset, "--model", model,
           "--epochs", str(config.epochs), "--hidden", str(config.hidden), "--num-layers", str(config.num_layers),
           "--dropout", str(config.dropout), "--threads", str(config.threads),
           # PyG's fastest path per model: a torch CSR adjacency, which GATConv does not take
           "--path", "edge_index" if model == "gat" else "csr", "--heads", str(config.heads if model == "gat" else 1)]
    if config.root:
        cmd += ["--root", config.root]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=config.timeout)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout", "error": f"timed out after {config.timeout:g} s",
                "wall_s": time.perf_counter() - start}
    if done.returncode != 0:
        return {**row, "status": "failed", "error": _tail(done.stderr), "wall_s": time.perf_counter() - start}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**row, "status": "ok", "epoch_s_median": result["epoch_s_median"], "test_acc": result["test_acc"],
            "peak_rss_bytes": result["peak_rss_bytes"], "wall_s": time.perf_counter() - start,
            "halo_bytes_per_epoch": 0, "halo_bytes_total": 0}


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def _fmt(value, spec=".3f", none="–"):
    return none if value is None else format(value, spec)


def summarise(config: BenchConfig, env: dict, rows: list[dict]) -> str:
    ok = [r for r in rows if r["status"] == "ok"]
    lines = ["# gnn-dist bench summary", "",
             f"- machine: {env['cpu']}, {env['cores']} cores, {(env['memory_bytes'] or 0) / 2**30:.0f} GiB",
             f"- versions: torch {env['torch']}, torch_geometric {env['torch_geometric']}, mpi4py "
             f"{env.get('mpi4py')}, MPI {env.get('mpi_library')}", f"- git commit: {env['git_commit']}",
             f"- config: `{json.dumps(asdict(config))}`", ""]

    lines += ["## Epoch time", "", "| dataset | mode | model | backend | P | s/epoch | vs PyG | speed-up vs P=1 |",
              "|---|---|---|---|---|---|---|---|"]
    for dataset in config.datasets:
        for mode in config.modes:
            for model in config.models:
                pyg = _mean(r["epoch_s_median"] for r in ok if r["backend"] == "pyg" and r["dataset"] == dataset
                            and r["mode"] == mode and r["model"] == model)
                if pyg is not None:
                    lines.append(f"| {dataset} | {mode} | {model} | PyG (1 process) | 1 | {pyg:.3f} | 1.00 | |")
                ours = {p: _mean(r["epoch_s_median"] for r in ok if r["backend"] == "gnn-dist"
                                 and (r["dataset"], r["mode"], r["model"], r["parts"]) == (dataset, mode, model, p)
                                 and (r["schedule"], r["halo_dtype"]) == ("exact", "fp32")) for p in config.parts}
                for p, value in ours.items():
                    if value is None:
                        continue
                    vs_pyg = _fmt(value / pyg, ".2f") if pyg else "–"
                    speedup = _fmt(ours[1] / value, ".2f") if ours.get(1) else "–"
                    lines.append(f"| {dataset} | {mode} | {model} | gnn-dist exact | {p} | {value:.3f} | {vs_pyg} "
                                 f"| {speedup} |")

    lines += ["", "## Halo bytes per epoch", "", "| dataset | P | schedule | halo dtype | MB/epoch | vs exact |",
              "|---|---|---|---|---|---|"]
    for dataset in config.datasets:
        for p in config.parts:
            full = [r for r in ok if r["backend"] == "gnn-dist" and r["dataset"] == dataset and r["parts"] == p
                    and r["mode"] == "full"]
            exact = _mean(r["halo_bytes_per_epoch"] for r in full if (r["schedule"], r["halo_dtype"]) == ("exact", "fp32"))
            for schedule in config.schedules:
                for dtype in config.halo_dtypes:
                    value = _mean(r["halo_bytes_per_epoch"] for r in full
                                  if (r["schedule"], r["halo_dtype"]) == (schedule, dtype))
                    if value is None:
                        continue
                    ratio = _fmt(value / exact, ".3f") if exact else "–"
                    lines.append(f"| {dataset} | {p} | {schedule} | {dtype} | {value / 1e6:.2f} | {ratio} |")

    lines += ["", "## Accuracy", "", "| dataset | mode | model | backend | P | schedule | test acc (mean ± sd over seeds) "
              "| OGB Evaluator | OGB leaderboard | gap |", "|---|---|---|---|---|---|---|---|---|---|"]
    groups = sorted({(r["dataset"], r["mode"], r["model"], r["backend"], r["parts"], r["schedule"], r["halo_dtype"])
                     for r in ok})
    for dataset, mode, model, backend, p, schedule, dtype in groups:
        mine = [r for r in ok if (r["dataset"], r["mode"], r["model"], r["backend"], r["parts"], r["schedule"],
                                  r["halo_dtype"]) == (dataset, mode, model, backend, p, schedule, dtype)]
        accs = [r["test_acc"] for r in mine]
        spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
        ogb = _mean(r.get("ogb_test_acc") for r in mine)
        reference = OGB_REFERENCE.get(dataset, {}).get(model)
        score = ogb if ogb is not None else statistics.mean(accs)
        gap = ""
        if reference is not None:
            gap = f"{100 * (score - reference):+.2f} points" + (" **(more than 1 point)**"
                                                                 if abs(score - reference) > 0.01 else "")
        label = schedule + ("" if dtype == "fp32" else f" + {dtype}")
        lines.append(f"| {dataset} | {mode} | {model} | {backend} | {p} | {label} | "
                     f"{100 * statistics.mean(accs):.2f} ± {100 * spread:.2f} | {_fmt(ogb and 100 * ogb, '.2f')} | "
                     f"{_fmt(reference and 100 * reference, '.2f')} | {gap} |")

    failed = [r for r in rows if r["status"] not in ("ok",)]
    if failed:
        lines += ["", "## Runs that did not complete", ""]
        for r in failed:
            first = (r.get("error") or "").strip().splitlines()
            lines.append(f"- `{r['run_id']}`: {r['status']}: {first[-1] if first else ''}")
    return "\n".join(lines) + "\n"


def plots(rows: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok" and r["backend"] == "gnn-dist"]
    written = []

    def save(fig, name):
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    def against_parts(runs, group, value, ylabel: str, title: str, name: str) -> None:
        """One line per group of runs: the mean of `value` at each P."""
        fig, ax = plt.subplots(figsize=(6, 4))
        for key in sorted({group(r) for r in runs}):
            mine = [r for r in runs if group(r) == key]
            points = sorted({r["parts"] for r in mine})
            ax.plot(points, [_mean(value(r) for r in mine if r["parts"] == p) for p in points], marker="o",
                    label=" ".join(map(str, key)))
        ax.set_xlabel("ranks (P)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if ax.lines:
            ax.legend(fontsize=7)
        save(fig, name)

    against_parts([r for r in ok if r["schedule"] == "exact"], lambda r: (r["dataset"], r["mode"], r["model"]),
                  lambda r: r["epoch_s_median"], "s / epoch", "Epoch time against P (exact schedule)",
                  "epoch_time_vs_parts.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = sorted({(r["schedule"], r["halo_dtype"]) for r in ok if r["mode"] == "full"})
    values = [_mean(r["halo_bytes_per_epoch"] / 1e6 for r in ok if (r["schedule"], r["halo_dtype"]) == label
                    and r["mode"] == "full") or 0 for label in labels]
    ax.bar([f"{s}\n{d}" for s, d in labels], values)
    ax.set_ylabel("MB per epoch (mean over runs)")
    ax.set_title("Halo bytes per epoch by schedule")
    save(fig, "bytes_by_schedule.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in ok:
        ax.scatter(max(r["halo_bytes_per_epoch"], 1) / 1e6, 100 * r["test_acc"], s=14)
    ax.set_xscale("log")
    ax.set_xlabel("halo MB per epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Accuracy against bytes")
    save(fig, "accuracy_vs_bytes.png")

    against_parts(ok, lambda r: (r["dataset"], r["model"]), lambda r: r["peak_rss_bytes"] / 2**30,
                  "peak RSS per rank (GiB)", "Peak memory per rank", "peak_memory.png")

    # Where each run's epoch goes, from the metrics' medians (slowest rank): compute, the exchange that ran
    # exposed, and the wait for non-blocking transfers that overlap did not hide.
    broken = [r for r in ok if r.get("compute_s_median") is not None]
    if broken:
        fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(broken)), 4))
        names = [f"{r['dataset'].split('/')[-1]} P={r['parts']}\n{r['model']} {r['schedule']}" for r in broken]
        compute = [r["compute_s_median"] for r in broken]
        exchange = [r["comm_s_median"] - r["wait_s_median"] for r in broken]
        wait = [r["wait_s_median"] for r in broken]
        ax.bar(names, compute, label="compute")
        ax.bar(names, exchange, bottom=compute, label="exchange")
        ax.bar(names, wait, bottom=[c + e for c, e in zip(compute, exchange)], label="wait")
        ax.set_ylabel("s per epoch (median)")
        ax.set_title("Per-epoch breakdown")
        ax.tick_params(axis="x", labelsize=6)
        ax.legend(fontsize=7)
        save(fig, "epoch_breakdown.png")
    modelled = time_to_accuracy_plot(rows, out, plt)
    return written + ([modelled] if modelled else [])


def write_outputs(config: BenchConfig, env: dict, rows: list[dict]) -> None:
    out = Path(config.out)
    header = {"environment": env, "config": asdict(config)}
    with open(out / "results.jsonl.partial", "w") as handle:
        handle.write(json.dumps({"header": header}) + "\n")
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    os.replace(out / "results.jsonl.partial", out / "results.jsonl")
    with open(out / "results.csv.partial", "w", newline="") as handle:
        handle.write(f"# {json.dumps(header)}\n")
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k) for k in CSV_COLUMNS})
    os.replace(out / "results.csv.partial", out / "results.csv")
    add_time_to_target(rows, config.target_val_acc)
    (out / "summary.md").write_text(summarise(config, env, rows) + "\n".join(section(rows)))
    plots(rows, out)
    (out / "environment.json").write_text(json.dumps(header, indent=1))


def sweep(config: BenchConfig, progress: bool = True) -> list[dict]:
    from tqdm import tqdm

    Path(config.out).mkdir(parents=True, exist_ok=True)
    env = environment()
    runs = plan_runs(config)
    baselines = [(d, m, mode, s) for d in config.datasets for m in config.models for mode in config.modes
                 for s in config.seeds] if config.pyg else []
    rows: list[dict] = []
    bar = tqdm(total=len(runs) + len(baselines), desc="bench", unit="run", disable=not progress)
    for dataset, model, mode, seed in baselines:
        bar.set_postfix_str(f"pyg {dataset} {model} {mode} s{seed}")
        rows.append(run_pyg(config, dataset, model, mode, seed))
        bar.update(1)
    for run in runs:
        bar.set_postfix_str(run.run_id)
        rows.append(run_ours(config, run))
        bar.update(1)
        write_outputs(config, env, rows)  # a sweep stopped half-way still leaves readable results
    bar.close()
    write_outputs(config, env, rows)
    return rows


def _csv_list(text: str, cast=str) -> list:
    return [cast(v) for v in text.split(",") if v]


def build_parser() -> argparse.ArgumentParser:
    """`gnn-dist bench`'s own options (any other option goes to every run's `gnn-dist train`)."""
    parser = argparse.ArgumentParser(prog="gnn-dist bench", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="TOML file with the same keys (command-line flags win)")
    parser.add_argument("--datasets")
    parser.add_argument("--root")
    parser.add_argument("--parts")
    parser.add_argument("--schedules", help="comma-separated; a per-layer schedule joins its entries with / here "
                        "(stale:4/exact is --schedule stale:4,exact)")
    parser.add_argument("--halo-dtypes")
    parser.add_argument("--modes")
    parser.add_argument("--models")
    parser.add_argument("--seeds")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--num-layers", type=int)
    parser.add_argument("--heads", type=int, help="attention heads per hidden layer of --models gat")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--no-pyg", action="store_true", help="skip the PyG baseline rows")
    parser.add_argument("--links", help="modelled link bandwidths in Gb/s, e.g. 1,10,100: every run trains once "
                        "per link under --simulate-link and the summary gives time to a target val. accuracy")
    parser.add_argument("--target-val-acc", type=float, help="time-to-accuracy target (default: 0.98 x exact's best)")
    parser.add_argument("--out")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and exit")
    return parser


def config_from_args(argv: list[str] | None = None) -> tuple[BenchConfig, bool]:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    values: dict = {}
    if args.config:
        try:
            import tomllib
        except ImportError as err:  # Python 3.10
            raise SystemExit("gnn-dist bench: error: --config needs Python 3.11+ (tomllib)") from err
        try:
            values.update(tomllib.loads(Path(args.config).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise SystemExit(f"gnn-dist bench: error: {args.config}: {err}") from err
        unknown = set(values) - {f for f in BenchConfig.__dataclass_fields__}
        if unknown:
            raise SystemExit(f"gnn-dist bench: error: {args.config}: unknown keys {', '.join(sorted(unknown))}")
    lists = {"datasets": str, "parts": int, "schedules": str, "halo_dtypes": str, "modes": str, "models": str,
             "seeds": int, "links": str}
    for key, cast in lists.items():
        given = getattr(args, key)
        if given is not None:
            values[key] = _csv_list(given, cast)
    if args.schedules is not None:
        values["schedules"] = [spec.replace("/", ",") for spec in values["schedules"]]
    for key in ("root", "epochs", "hidden", "num_layers", "heads", "threads", "timeout", "out", "target_val_acc"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if args.no_pyg:
        values["pyg"] = False
    if extra:
        values["extra_train_args"] = values.get("extra_train_args", []) + extra
    return BenchConfig(**values), args.dry_run


def main(argv: list[str] | None = None) -> int:
    config, dry_run = config_from_args(argv)
    if dry_run:
        for run in plan_runs(config):
            print(f"mpiexec -n {run.parts} gnn-dist train  # {run.run_id}")
        if config.pyg:
            for dataset in config.datasets:
                for model in config.models:
                    for mode in config.modes:
                        print(f"pyg baseline  # {dataset} {model} {mode} x {len(config.seeds)} seeds")
        return 0
    rows = sweep(config)
    failed = sum(r["status"] not in ("ok", "skipped") for r in rows)
    print(f"{len(rows)} runs, {failed} did not complete; results in {config.out}/summary.md")
    return 0
