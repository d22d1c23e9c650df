"""Under mpiexec: several trainings, one after another in the same ranks.

    mpiexec -n P python train_many.py --common "--parts DIR --epochs 200" --run "--schedule stale:4" --run ...

Each run's options are `gnn-dist train` options (--common, then the run's
own), parsed by gnn-dist's own train parser. Rank 0 prints one JSON line per
run: {"run": RUN, **the run's final record}. One launch (and one torch
import) for a group of runs instead of one per run keeps the many-runs tests
affordable.
"""
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gnn_dist import RankContext, make_world_comm  # noqa: E402
from gnn_dist.cli import build_parser  # noqa: E402
from gnn_dist.config import train_config_from_args  # noqa: E402
from gnn_dist.training.loop import train  # noqa: E402

common, runs, argv = [], [], sys.argv[1:]
while argv:
    flag, value, argv = argv[0], argv[1], argv[2:]
    if flag == "--common":
        common = shlex.split(value)
    elif flag == "--run":
        runs.append(value)
    else:
        raise SystemExit(f"train_many.py: unknown option {flag} (use --common OPTIONS and --run OPTIONS)")

ctx = RankContext(make_world_comm())
parser = build_parser()
for run in runs:
    args = parser.parse_args(["train", "--no-progress", *common, *shlex.split(run)])
    final = train(ctx, train_config_from_args(args))
    if ctx.is_root:
        print(json.dumps({"run": run, **final}), flush=True)
