#!/usr/bin/env bash
# Set up (once), lint (ruff, configured in pyproject.toml) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source "${VENV:-.venv}/bin/activate"
ruff check .
exec python -m pytest -q --durations=15 "$@"
