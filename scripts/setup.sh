#!/usr/bin/env bash
# Create .venv (once) and install gnn-dist with its test, MPI and distributed-partitioning extras.
# As root on Debian/Ubuntu it also installs PT-Scotch and Open MPI from apt (the distributed partitioner's
# ranks run under them) and the tools of the emulated cluster (ip and tc, unshare and nsenter, pgrep); elsewhere
# it says so and the tests that need them skip with that reason.
# torch is pinned here: an unpinned resolve pulls a multi-GB CUDA build.
# Knobs: TORCH_VERSION (default 2.13.0), VENV (default .venv), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
APT_PACKAGES="libptscotch-dev openmpi-bin iproute2 util-linux procps"
if ! dpkg -s $APT_PACKAGES >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q $APT_PACKAGES >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null && apt-get install -y -q $APT_PACKAGES >/dev/null; } \
            || echo "setup: apt-get could not install $APT_PACKAGES: the PT-Scotch and cluster tests will skip" >&2
    else
        echo "setup: not root or no apt-get: skipping $APT_PACKAGES (gnn-dist partition --ranks R > 1 needs them)" >&2
    fi
fi
stamp="$VENV/.gnn-dist-installed"
want="torch=$TORCH_VERSION $(cat pyproject.toml setup.py | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test,mpi,distpart]"
echo "$want" > "$stamp"
