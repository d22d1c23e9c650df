"""Under mpiexec: several trainings one after another in the same ranks (one launch, one torch import).

    mpiexec -n P python -m gnn_dist.benchmarks.train_many --common "--parts DIR --epochs 200" --run "--schedule stale:4" ...

Each run's options are `gnn-dist train` options (--common, then the run's own), parsed by the options of
`gnn-dist train` (gnn_dist.config.add_train_options). Rank 0 prints one JSON line per run: {"run": RUN, **the run's final record}.
"""
from __future__ import annotations

import json
import shlex
import sys


def parse_runs(argv: list[str]) -> tuple[list[str], list[str]]:
    common, runs = [], []
    while argv:
        if len(argv) < 2 or argv[0] not in ("--common", "--run"):
            raise SystemExit("train_many: give --common OPTIONS and --run OPTIONS (repeatable)")
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--common":
            common = shlex.split(value)
        else:
            runs.append(value)
    return common, runs


def main(argv: list[str] | None = None) -> None:
    import argparse

    from gnn_dist import RankContext, make_world_comm
    from gnn_dist.config import add_train_options, train_config_from_args
    from gnn_dist.plugins.loading import import_plugins
    from gnn_dist.tasks import task_names
    from gnn_dist.training.loop import train

    common, runs = parse_runs(sys.argv[1:] if argv is None else argv)
    import_plugins(common + [word for run in runs for word in shlex.split(run)])
    ctx = RankContext(make_world_comm())
    parser = argparse.ArgumentParser(prog="train_many")
    add_train_options(parser, task_names)
    parser.add_argument("--plugin", action="append", default=[])
    for run in runs:
        args = parser.parse_args(["--no-progress", *common, *shlex.split(run)])
        final = train(ctx, train_config_from_args(args))
        if ctx.is_root:
            print(json.dumps({"run": run, **final}), flush=True)


if __name__ == "__main__":
    main()
