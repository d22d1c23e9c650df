"""Under mpiexec: several trainings, one after another in the same ranks (gnn_dist.benchmarks.train_many),
run from this checkout whichever gnn-dist is installed.

    mpiexec -n P python train_many.py --common "--parts DIR --epochs 200" --run "--schedule stale:4" --run ...
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gnn_dist.benchmarks.train_many import main  # noqa: E402

main()
