"""The wheel: built from the checkout, installed into a fresh virtual environment outside it, and run from
there (partition, then a 2-rank train), so a package that the wheel leaves out fails here and not on a
user's machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import MPIEXEC

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("partition", "kernels", "benchmarks")  # top folders of the repository installed inside gnn_dist


def packages_in_the_tree() -> set[str]:
    """Every folder with an __init__.py, as its installed package path (gnn_dist/..., gnn_dist/partition/...)."""
    found = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "gnn_dist").rglob("__init__.py")}
    for folder in MAPPED:
        found |= {"gnn_dist/" + str(p.parent.relative_to(ROOT)) for p in (ROOT / folder).rglob("__init__.py")}
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "--wheel-dir", str(out), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("gnn_dist-*.whl")
    return found


@pytest.mark.slow
def test_the_wheel_holds_every_package_of_the_tree_and_claims_only_gnn_dist(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"gnn_dist", next(t for t in tops if t.endswith(".dist-info"))}, tops
    packages = packages_in_the_tree()
    assert {"gnn_dist/link", "gnn_dist/tasks", "gnn_dist/partition", "gnn_dist/halo"} <= packages
    shipped = {name.rpartition("/")[0] for name in names if name.endswith("/__init__.py")}
    assert packages <= shipped, sorted(packages - shipped)
    assert "gnn_dist/kernels/native_kernels.cpp" in names


def test_a_checkout_run_by_path_maps_its_three_folders_and_nothing_else_of_its_root(tmp_path):
    """PYTHONPATH=checkout, from elsewhere (as the regression benchmark and the mutation tool run another tree):
    gnn_dist.partition, .kernels and .benchmarks are this checkout's folders; tests/, scripts/ and examples/
    are not part of the package."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    probe = ("import importlib, gnn_dist\n"
             "for name in ('partition', 'partition.format', 'kernels', 'benchmarks'):\n"
             "    print(importlib.import_module('gnn_dist.' + name).__file__)\n"
             "for name in ('tests', 'tests.conftest', 'scripts', 'examples'):\n"
             "    try:\n"
             "        importlib.import_module('gnn_dist.' + name)\n"
             "        print('IMPORTED', name)\n"
             "    except ModuleNotFoundError:\n"
             "        pass\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "IMPORTED" not in done.stdout, done.stdout
    assert [Path(f).relative_to(ROOT).as_posix() for f in done.stdout.split()] == [
        "partition/__init__.py", "partition/format.py", "kernels/__init__.py", "benchmarks/__init__.py"]


@pytest.mark.slow
@pytest.mark.mpi
def test_the_installed_wheel_partitions_and_trains_outside_the_checkout(wheel, tmp_path):
    if MPIEXEC is None:
        pytest.skip("mpiexec not found: pip install mpich (the [mpi] extra)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # PYTHONPATH would show pip a checkout's gnn_dist as installed already (scripts/mutants.py sets it)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--quiet", str(wheel)], capture_output=True, text=True, timeout=300, env=env)
    assert installed.returncode == 0, installed.stderr
    # The dependencies (torch, PyG, mpi4py, ...) come from this environment, appended after the fresh one's own
    # site-packages; .pth files of that folder are not run, so this checkout's editable install stays out.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    libmpi = sorted(Path(sys.prefix, "lib").glob("libmpi.so.*"))  # the mpich wheel's, which mpiexec belongs to
    if libmpi and "MPI4PY_LIBMPI" not in env:
        env["MPI4PY_LIBMPI"] = str(libmpi[0])

    where = subprocess.run([str(python), "-c", "import gnn_dist.link, gnn_dist.tasks, gnn_dist.partition, gnn_dist; "
                            "print(gnn_dist.__file__); print(gnn_dist.partition.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr
    assert all(Path(line).is_relative_to(venv) for line in where.stdout.split()), where.stdout

    gnn_dist = str(venv / "bin" / "gnn-dist")
    parted = subprocess.run([gnn_dist, "partition", "--dataset", "synthetic:tiny", "--num-parts", "2", "--out",
                             "parts"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert parted.returncode == 0, parted.stderr
    trained = subprocess.run([MPIEXEC, "-n", "2", gnn_dist, "train", "--parts", "parts", "--epochs", "3",
                              "--no-progress", "--metrics-out", "m.jsonl"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr
    final = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[-1])
    assert final["final"] and final["num_parts"] == 2 and final["epochs"] == 3 and final["halo_bytes_total"] > 0
