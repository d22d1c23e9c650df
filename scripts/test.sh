#!/usr/bin/env bash
# Set up (once), lint (ruff, configured in pyproject.toml) and run the whole test suite. Extra arguments go to pytest.
#
# The tests run on GNN_DIST_TEST_WORKERS pytest-xdist workers (default: the cores, at most 4), one test file per
# worker at a time: most tests start MPI jobs whose ranks import torch and wait on each other, so one process
# alone leaves cores idle (measured: 1.47 of 2 cores busy serially and 38.6 min in CI; 1.88 with 2 workers). The
# emulated cluster's tests (one file) wait out a cut link for a minute, which another worker's files fill.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source "${VENV:-.venv}/bin/activate"
ruff check .
workers=${GNN_DIST_TEST_WORKERS:-$(python -c "import os; print(min(4, len(os.sched_getaffinity(0))))")}
exec python -m pytest -q --durations=15 -n "$workers" --dist loadfile "$@"
