"""Shared pieces of the benchmark scripts: subprocess runs, machine description, tables."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def run_train(num_parts: int, parts_dir: Path, metrics: Path, extra: list[str], timeout: float = 3600,
              tree: Path | None = None) -> dict:
    """One real `mpiexec -n P gnn-dist train` run; returns its final metrics record.

    tree: run another checkout of gnn-dist instead (to compare with): the ranks start in that folder with
    it first on PYTHONPATH (`python -m` puts the working folder first on sys.path, so both are needed).
    """
    cmd = [mpiexec(), "-n", str(num_parts), sys.executable, "-m", "gnn_dist", "train", "--parts",
           str(Path(parts_dir).resolve()), "--metrics-out", str(Path(metrics).resolve()), "--no-progress", *extra]
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())} if tree else None
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tree)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    final = records[-1]
    final["per_epoch"] = records[:-1]
    return final


def run_train_many(num_parts: int, parts_dir: Path, runs: list[tuple[Path, list[str]]], common: list[str],
                   timeout: float = 36000) -> list[dict]:
    """Several `gnn-dist train` runs in one mpiexec launch (gnn_dist.benchmarks.train_many): each run is
    (its metrics file, its own options); returns their final records (with "per_epoch"), in order."""
    import shlex

    args = ["--common", shlex.join(["--parts", str(Path(parts_dir).resolve()), *common])]
    for metrics, extra in runs:
        args += ["--run", shlex.join(["--metrics-out", str(Path(metrics).resolve()), *extra])]
    cmd = [mpiexec(), "-n", str(num_parts), sys.executable, "-m", "gnn_dist.benchmarks.train_many", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:8])} ... failed:\n{done.stderr[-2000:]}")
    finals = []
    for metrics, _ in runs:
        records = [json.loads(line) for line in Path(metrics).read_text().splitlines()]
        finals.append({**records[-1], "per_epoch": records[:-1]})
    return finals


def partition(spec: str, num_parts: int, out: Path, root: str | None = None, method: str = "metis") -> Path:
    if not (out / "meta.json").exists():
        cmd = [sys.executable, "-m", "gnn_dist", "partition", "--dataset", spec, "--num-parts", str(num_parts),
               "--out", str(out), "--method", method] + (["--root", root] if root else [])
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def mpi_versions() -> dict:
    """mpi4py's version and the MPI library's, without initialising MPI in this process."""
    import subprocess

    try:
        import mpi4py
    except ImportError:
        return {"mpi4py": "unavailable", "mpi_library": "unavailable"}
    probe = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                           capture_output=True, text=True, timeout=60)
    library = probe.stdout.strip().splitlines()[0] if probe.stdout.strip() else "unknown"
    return {"mpi4py": mpi4py.__version__, "mpi_library": library}


def machine() -> dict:
    import torch

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}


def write_report(out: Path, stem: str, text: str, args, runs: list) -> None:
    """A benchmark's table as OUT/STEM.md and its runs as OUT/STEM.json (with the machine and the options)."""
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"machine": machine(), "config": vars(args), "runs": runs},
                                                 indent=1))


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
