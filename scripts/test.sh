#!/usr/bin/env bash
# Set up (once), lint (ruff, configured in pyproject.toml) and run the whole test suite. Extra arguments go to pytest.
#
# Two passes. Everything but the emulated cluster runs on GNN_DIST_TEST_WORKERS pytest-xdist workers (default:
# the cores, at most 4), a test file per worker at a time: most tests start MPI jobs whose ranks import torch
# and wait on each other, so one pass alone leaves cores idle (measured: 1.47 of 2 cores busy serially, 1.88 with
# 2 workers; 23.8 min instead of about 30). The cluster tests then run alone: they time a cut link and a shaped
# link, which another worker's load would skew.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source "${VENV:-.venv}/bin/activate"
ruff check .
workers=${GNN_DIST_TEST_WORKERS:-$(python -c "import os; print(min(4, len(os.sched_getaffinity(0))))")}

status=0
python -m pytest -q --durations=15 -n "$workers" --dist loadfile -m "not cluster" "$@" || status=$?
[ "$status" -eq 5 ] && status=0  # pytest's "no tests collected": the arguments selected only cluster tests
cluster_status=0
python -m pytest -q --durations=5 -m cluster "$@" || cluster_status=$?
[ "$cluster_status" -eq 5 ] && cluster_status=0
[ "$status" -ne 0 ] && exit "$status"
exit "$cluster_status"
