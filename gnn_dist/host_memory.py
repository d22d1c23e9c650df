"""What fits on this host: the memory a host has, what one gnn-dist process costs before its data, and the
refusal to start a job that would not fit (training and partitioning alike).

The peaks themselves come from each job's model of its own memory (gnn_dist.memory_plan for training,
gnn_dist.partition.memory_model for the partitioner); this module compares them with the host.
"""
from __future__ import annotations

from dataclasses import dataclass

# One gnn-dist process before its data: Python, torch, numpy, mpi4py and MPI's buffers, the native kernels, and
# what set-up leaves behind beyond the arrays it keeps. Measured with mpiexec -n 1..4 on synthetic:arxiv:
# 320-330 MiB once set-up is done (imports alone: about 245 MiB; tests/test_plan.py checks that bound).
PROCESS_BYTES = 325 << 20


def readable_bytes(value: float) -> str:
    """GiB from 1 GiB up, MiB below (small parts would all read 0.00 GiB)."""
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"


def available_memory_bytes() -> int | None:
    """The host's MemAvailable (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass(frozen=True)
class RankMemory:
    """What one rank reports before training: its host, its plan, what it holds now, what its host has free."""

    host: str
    predicted: int
    summary: str
    current: int
    available: int | None


def memory_refusal(ranks: list[RankMemory], limit: int | None) -> str | None:
    """The one-line reason not to start, or None when every rank's plan fits.

    With a limit (bytes per rank), each rank's predicted peak must stay below it.
    Without one, the ranks of each host must fit together in what the host has
    available now, counting only what they still have to allocate.
    """
    fixes = ("start more ranks on a partition with more parts, use --halo-memory sequential (and "
             "--halo-block-rows), --feature-dtype bf16, or a smaller --hidden")
    if limit is not None:
        worst = max(range(len(ranks)), key=lambda r: ranks[r].predicted)
        if ranks[worst].predicted > limit:
            return (f"rank {worst} would need about {ranks[worst].predicted / 2**30:.2f} GiB at its peak "
                    f"({ranks[worst].summary}), over --memory-limit {limit / 2**30:.2f} GiB: {fixes}")
        return None
    hosts: dict[str, list[int]] = {}
    for r, report in enumerate(ranks):
        hosts.setdefault(report.host, []).append(r)
    for host, members in hosts.items():
        available = [ranks[r].available for r in members if ranks[r].available is not None]
        if not available:
            continue
        needed = sum(max(ranks[r].predicted - ranks[r].current, 0) for r in members)
        if needed > min(available):
            worst = max(members, key=lambda r: ranks[r].predicted)
            return (f"the {len(members)} ranks on {host} would need about {needed / 2**30:.2f} GiB more "
                    f"(rank {worst}: {ranks[worst].predicted / 2**30:.2f} GiB at its peak: {ranks[worst].summary}) "
                    f"but {min(available) / 2**30:.2f} GiB is available: {fixes}; or pass --memory-limit to "
                    f"override")
    return None


def budget_refusal(need: int, limit: int | None, ranks_on_host: int, what: str, fix: str) -> str | None:
    """One line saying why a job whose ranks each need `need` bytes would not fit, or None.

    With a limit, each rank must stay below it; without one, the host's available memory is shared equally
    by its ranks."""
    if limit is not None:
        have, where = limit, f"--memory-limit {readable_bytes(limit)} per rank"
    else:
        available = available_memory_bytes()
        if available is None:
            return None
        have, where = available // max(1, ranks_on_host), f"{readable_bytes(available)} available on this host"
        if ranks_on_host > 1:
            where += f" for {ranks_on_host} ranks"
    if need <= have:
        return None
    return f"{what} would need about {readable_bytes(need)} per rank, over the {where}: {fix}"
