"""Shared helpers: the real-data folder, partition fixtures and an mpiexec runner."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
PLANETOID_ROOT = SHARED_DATA / "planetoid"
FACEBOOK_NPZ = SHARED_DATA / "npz" / "facebook.npz"


def _mpiexec() -> str | None:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()


@pytest.fixture(scope="session")
def cora_root() -> Path:
    if not (PLANETOID_ROOT / "Cora" / "raw" / "ind.cora.graph").is_file():
        pytest.skip(f"real Cora data not found under {PLANETOID_ROOT} (../shared/data is absent)")
    return PLANETOID_ROOT


@pytest.fixture
def facebook_npz() -> Path:
    if not FACEBOOK_NPZ.is_file():
        pytest.skip(f"{FACEBOOK_NPZ} not found (../shared/data is absent)")
    return FACEBOOK_NPZ


def run_cli(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m gnn_dist ARGS` in one process."""
    return subprocess.run([sys.executable, "-m", "gnn_dist", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def run_mpi(n: int, *args: str, script: str | None = None, timeout: float = 180,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """`mpiexec -n N python -m gnn_dist ARGS` (or a script from tests/mpi_scripts)."""
    if MPIEXEC is None:
        pytest.skip("mpiexec not found: pip install mpich (the [mpi] extra)")
    target = [str(ROOT / "tests" / "mpi_scripts" / script)] if script else ["-m", "gnn_dist"]
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *target, *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def train_many(num_parts: int, common: list[str], runs: list[str], timeout: float = 900) -> dict:
    """Trainings one after another in one mpiexec launch (tests/mpi_scripts/train_many.py): each run's
    `gnn-dist train` options are `common` plus its own string; returns {run: its final record}."""
    done = run_mpi(num_parts, "--common", shlex.join(common), *(a for run in runs for a in ("--run", run)),
                   script="train_many.py", timeout=timeout)
    assert done.returncode == 0, done.stderr
    records = {record["run"]: record for record in map(json.loads, done.stdout.splitlines())}
    assert list(records) == runs
    return records


@pytest.fixture(scope="session")
def tiny_graph():
    from gnn_dist.partition.datasets import load_dataset

    return load_dataset("synthetic:tiny")


@pytest.fixture(scope="session")
def partitioned(tmp_path_factory):
    """partitioned(spec, P, method='metis', root=None, balance=None) -> directory, cached for the session."""
    from gnn_dist.partition.datasets import load_dataset
    from gnn_dist.partition.partitioner import partition_graph

    cache: dict = {}

    def make(spec: str, num_parts: int, method: str = "metis", root: str | None = None,
             balance: str | None = None) -> Path:
        key = (spec, num_parts, method, root, balance)
        if key not in cache:
            out = tmp_path_factory.mktemp("parts") / f"p{num_parts}"
            partition_graph(load_dataset(spec, root), num_parts, out, method=method, balance=balance)
            cache[key] = out
        return cache[key]

    return make


@pytest.fixture
def gin_in_this_process():
    """GIN registered in this test process for one test, then unregistered, so that later tests (which
    expect --model gin to be refused) see the built-in models only."""
    from gnn_dist.models.registry import MODELS

    before = dict(MODELS._entries)
    import tests.plugins.gin  # noqa: F401 - registers gin in this process
    yield
    MODELS._entries.clear()
    MODELS._entries.update(before)
    sys.modules.pop("tests.plugins.gin", None)
