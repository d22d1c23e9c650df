"""The PyG example under mpiexec: the loss curve of P=2 equals P=1's, and a user's mistake exits with one line."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import MPIEXEC, ROOT, run_mpi

EXAMPLE = ROOT / "examples" / "pyg_node_classification.py"


def _example(num_parts: int, parts, *options: str) -> tuple[list[float], str]:
    if MPIEXEC is None:
        pytest.skip("mpiexec not found: pip install mpich (the [mpi] extra)")
    done = subprocess.run([MPIEXEC, "-n", str(num_parts), sys.executable, str(EXAMPLE), str(parts), *options],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    losses = [float(v) for v in re.findall(r"^epoch \d+ loss (\S+)$", done.stdout, re.M)]
    return losses, done.stdout


@pytest.mark.parametrize("model", ["gat", "gcn"])
def test_the_example_draws_the_same_curve_at_p1_and_p2(model, partitioned):
    """GAT's attention kernel exchanges by MPI; GCN's overlapped exchange goes through shared memory, freed at
    exit before MPI finalises (a job that hung there would time out here)."""
    options = ("--model", model, "--hidden", "16", "--epochs", "8", "--dropout", "0.5")
    one, _ = _example(1, partitioned("synthetic:small", 1), *options)
    two, out = _example(2, partitioned("synthetic:small", 2), *options)
    assert len(one) == 8
    np.testing.assert_allclose(two, one, rtol=1e-4)
    sent = int(re.search(r"halo bytes sent ([\d,]+)", out).group(1).replace(",", ""))
    assert sent > 0 and "test accuracy" in out


def test_a_mask_of_the_wrong_length_ends_the_job_with_one_line(partitioned):
    done = run_mpi(2, str(partitioned("synthetic:tiny", 2)), script="bad_mask.py", timeout=120)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("gnn-dist: rank")]
    assert lines and all("a mask of 3 entries" in line for line in lines), done.stderr
    assert "Traceback" not in done.stderr


def test_one_failing_rank_brings_the_whole_job_down(partitioned):
    done = run_mpi(2, str(partitioned("synthetic:tiny", 2)), script="one_rank_fails.py", timeout=120)
    assert done.returncode != 0
    assert "gnn-dist: rank 1: rank 1's own mistake" in done.stderr


def test_the_mini_batch_example_trains_and_evaluates_full_batch_under_mpiexec(partitioned):
    if MPIEXEC is None:
        pytest.skip("mpiexec not found: pip install mpich (the [mpi] extra)")
    script = ROOT / "examples" / "pyg_neighbor_sampling.py"
    done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(script), str(partitioned("synthetic:small", 2)),
                           "--hidden", "32", "--epochs", "4", "--batch-size", "256", "--fanouts", "5,5"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    losses = [float(v) for v in re.findall(r"^epoch \d+ loss (\S+)$", done.stdout, re.M)]
    accuracy = float(re.search(r"^test accuracy (\S+)$", done.stdout, re.M).group(1))
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert 0.0 <= accuracy <= 1.0
