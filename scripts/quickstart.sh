#!/usr/bin/env bash
# The main job on the built-in default graph: set up, partition into 2 parts, inspect, train on 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source "${VENV:-.venv}/bin/activate"
DATASET="${DATASET:-synthetic:small}"
OUT="${OUT:-runs/quickstart}"
# The model the run trains: inspect plans (bytes and memory) for exactly this one.
MODEL_OPTIONS=(--hidden 64)
gnn-dist partition --dataset "$DATASET" --num-parts 2 --out "$OUT/parts" --overwrite
gnn-dist inspect "$OUT/parts" "${MODEL_OPTIONS[@]}"
mpiexec -n 2 gnn-dist train --parts "$OUT/parts" --epochs "${EPOCHS:-100}" "${MODEL_OPTIONS[@]}" \
    --metrics-out "$OUT/metrics.jsonl"
echo "metrics: $OUT/metrics.jsonl"
