#!/usr/bin/env bash
# Create .venv (once) and install gnn-dist with its test and MPI extras.
# torch is pinned here: an unpinned resolve pulls a multi-GB CUDA build.
# Knobs: TORCH_VERSION (default 2.13.0), VENV (default .venv), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
stamp="$VENV/.gnn-dist-installed"
want="torch=$TORCH_VERSION $(sha256sum pyproject.toml | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test,mpi]"
echo "$want" > "$stamp"
