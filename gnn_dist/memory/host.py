"""What fits on this host: the memory a host has, what one gnn-dist process costs before its data, and the
refusal to start a job that would not fit (training and partitioning alike).

The peaks themselves come from each job's model of its own memory (gnn_dist.plan.memory for training,
gnn_dist.partition.memory_model for the partitioner); this module compares them with the host.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

# One gnn-dist process before its data: Python, torch, numpy, mpi4py and MPI's buffers, the native kernels, and
# what set-up leaves behind beyond the arrays it keeps. Measured with mpiexec -n 1..4 on synthetic:arxiv:
# 320-330 MiB once set-up is done (imports alone: about 245 MiB; tests/test_plan.py checks that bound).
PROCESS_BYTES = 325 << 20


def readable_bytes(value: float) -> str:
    """GiB from 1 GiB up, MiB below (small parts would all read 0.00 GiB)."""
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_size(text: str) -> int:
    """'8G', '512M', '1.5G' or plain bytes (binary units)."""
    number, unit = text.strip().upper().rstrip("IB"), ""
    if number and number[-1] in _SIZE_UNITS:
        number, unit = number[:-1], number[-1]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 8G, 512M or a number of bytes; got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return int(value)


HOST_MEMORY_ENV = "GNN_DIST_HOST_MEMORY"


def host_budget_bytes() -> int | None:
    """GNN_DIST_HOST_MEMORY (a size like 8G): the memory this host gives the job's ranks in all, for a node shared
    with other work (and the emulated cluster's hosts); None when unset."""
    text = os.environ.get(HOST_MEMORY_ENV)
    return byte_size(text) if text else None


def available_memory_bytes() -> int | None:
    """What this host has free now: the lesser of its MemAvailable (Linux) and what the process's memory cgroup
    still allows (a container's or a SLURM job's limit); None where neither can be read."""
    found = []
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    found += [left for left in [_cgroup_room()] if left is not None]
    return min(found) if found else None


def _cgroup_room() -> int | None:
    """The memory cgroup's limit less its usage (v2 memory.max, v1 memory.limit_in_bytes), None without a limit."""
    try:
        entries = [line.strip().split(":", 2) for line in open("/proc/self/cgroup")]
    except OSError:
        return None
    for _, controllers, path in entries:
        if controllers == "":  # v2
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            limit_file, usage_file = base / "memory.max", base / "memory.current"
        elif "memory" in controllers.split(","):  # v1
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            limit_file, usage_file = base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"
        else:
            continue
        try:
            limit, usage = limit_file.read_text().strip(), int(usage_file.read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max", or v1's "no limit" near 2**63
            return max(0, int(limit) - usage)
    return None


@dataclass(frozen=True)
class RankMemory:
    """What one rank reports before training: its host, its plan, what it holds now, what its host has free."""

    host: str
    predicted: int
    summary: str
    current: int
    available: int | None
    budget: int | None = None  # GNN_DIST_HOST_MEMORY: what the host gives all of the job's ranks on it


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
        budgets = [ranks[r].budget for r in members if ranks[r].budget is not None]
        total = sum(ranks[r].predicted for r in members)
        if budgets and total > min(budgets):
            worst = max(members, key=lambda r: ranks[r].predicted)
            return (f"the {len(members)} ranks on {host} would need about {total / 2**30:.2f} GiB at their peaks "
                    f"(rank {worst}: {ranks[worst].predicted / 2**30:.2f} GiB: {ranks[worst].summary}) but the host "
                    f"gives the job {min(budgets) / 2**30:.2f} GiB ({HOST_MEMORY_ENV}): {fixes}; or place fewer "
                    f"ranks on {host}")
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
