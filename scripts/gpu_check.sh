#!/usr/bin/env bash
# The check on a real GPU, as one prepared script of at most 8 minutes (CI has no GPU).
#
#   bash scripts/gpu_check.sh            # results under $OUT (the device tool's folder), else runs/gpu-check
#
# It expects an image with CUDA torch, torch_geometric and mpi4py, and no internet. The wheels such an image
# lacks travel in .whl/ (ignored by git): pymetis, and the mpich wheel (libmpi and mpiexec for mpi4py).
# Fetch them on a machine with pip, for the image's Python (3.12 on the device tool's H200):
#
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl pymetis mpich
#
# Steps (each bounded by its own timeout, so a hang in one still leaves the others' results):
#   1. the project runs from this checkout over the image's torch (PYTHONPATH; nothing is installed over it);
#   2. the exactness tests on CUDA at P = 1 and 2 (two ranks share the one GPU): GCN, SAGE and GAT against PyG,
#      the device memory plan against torch's allocator peak (a table of it),
#      and full-batch and sampled runs, pipeline and int8 halos, against the CPU run (tests/test_gpu.py), with
#      the staging tests (tests/test_staging.py);
#   3. GCN 3x256 full-batch on synthetic:products at P = 1 against PyG's GCNConv on the same GPU, side by side:
#      epoch time and peak device memory (benchmarks/fullbatch.py --device cuda);
#   4. a results table: $OUT/gpu-check.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_check: installing the carried wheels failed"; exit 1; }
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

{
    echo "# GPU check"
    echo
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
    echo "- torch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"
    echo "- mpiexec: $(command -v mpiexec || echo none)"
    echo
} >"$OUT/gpu-check.md"

python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'" \
    || { echo "gpu_check: no CUDA device visible: run this on a GPU machine"; exit 1; }

printf '| model | P | rank | planned MiB | measured MiB | plan error |\n|---|---|---|---|---|---|\n' >"$OUT/plan.md"
GNN_DIST_GPU_PLAN_REPORT="$OUT/plan.md" \
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_staging.py \
    -o junit_family=xunit2 --junitxml="$OUT/tests.xml" >"$OUT/tests.log" 2>&1
tests_rc=$?
{
    echo "## Exactness on CUDA (tests/test_gpu.py, tests/test_staging.py): exit $tests_rc"
    echo
    echo '```'
    tail -n 15 "$OUT/tests.log"
    echo '```'
    echo
} >>"$OUT/gpu-check.md"

{
    echo "## The device memory plan against torch.cuda.max_memory_allocated (synthetic:sbm60k, 3 epochs; target 15%)"
    echo
    cat "$OUT/plan.md"
    echo
} >>"$OUT/gpu-check.md"

timeout 240 python3 -m gnn_dist.benchmarks.fullbatch --dataset synthetic:products --parts 1 --device cuda \
    --pyg-paths edge_index,csr --epochs 10 --pyg-epochs 10 --rounds 2 --out "$OUT/bench" >"$OUT/bench.log" 2>&1
bench_rc=$?
{
    echo "## synthetic:products, GCN 3x256, P=1 against PyG's GCNConv on the same GPU: exit $bench_rc"
    echo
    echo "Targets: epoch time <= 1.0x PyG's, peak device memory <= 0.7x."
    echo
    if [ -f "$OUT/bench/fullbatch.md" ]; then cat "$OUT/bench/fullbatch.md"; else tail -n 20 "$OUT/bench.log"; fi
} >>"$OUT/gpu-check.md"

cat "$OUT/gpu-check.md"
exit $(( tests_rc != 0 || bench_rc != 0 ))
