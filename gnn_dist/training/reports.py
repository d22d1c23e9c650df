"""What a run's final record says of its memory: the peak RSS of every rank and of each phase (the built-in
models' loop and a user's model's alike)."""
from __future__ import annotations

from gnn_dist.context import RankContext
from gnn_dist.memory.rss import PhasePeaks, peak_rss_bytes
from gnn_dist.steps.state import max_over_ranks


def memory_report(ctx: RankContext, memory: PhasePeaks) -> dict:
    """Peak RSS of every rank, and of each phase on the rank where that phase peaked (bytes).

    A rank's figure is its process's own peak (never reset, so it bounds every phase and matches what
    /usr/bin/time reports), which also covers whatever ran before train() was called.
    """
    phases = memory.stop()
    # The kernel folds per-thread RSS counters into the high-water mark lazily (every 64 page faults), so
    # an RSS sample can exceed the mark read just after it by a few pages; the peak is the larger.
    own_peak = max([peak_rss_bytes(), *phases.values()])
    per_rank = [int(v) for v in ctx.comm.allgather_object(own_peak)]
    names = ("setup", "train", "eval")
    worst = max_over_ranks(ctx, [float(phases.get(name, 0)) for name in names])
    report = {"peak_rss_bytes": max(per_rank), "peak_rss_bytes_per_rank": per_rank}
    for name, value in zip(names, worst):
        report[f"{name}_peak_rss_bytes"] = int(value) if value else None
    return report
