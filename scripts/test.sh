#!/usr/bin/env bash
# Set up (once) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source "${VENV:-.venv}/bin/activate"
exec python -m pytest -q "$@"
