"""Failure injection for the failure tests: GNN_DIST_FAIL_AT makes a rank fail on purpose at an epoch.

    GNN_DIST_FAIL_AT="RANK:EPOCH[:MODE][@ATTEMPT][,...]"

MODE is raise (the default: an exception, so the job aborts), hang (stops
making progress without an error, for the watchdog) or kill (SIGKILL: the
process vanishes, as when a node dies). An entry with @ATTEMPT fires only in
that attempt of a supervised job (gnn-dist supervise counts them from 0), so
a restarted job does not fail again at the same place; without it, always.
"""
from __future__ import annotations

import os
import signal
import time

from gnn_dist.resilience.supervise import restarts_so_far

FAIL_AT_ENV = "GNN_DIST_FAIL_AT"


def maybe_inject_failure(rank: int, epoch: int) -> None:
    spec = os.environ.get(FAIL_AT_ENV)
    if not spec:
        return
    for entry in spec.split(","):
        where, _, attempt = entry.partition("@")
        fail_rank, fail_epoch, *mode = where.split(":")
        if rank != int(fail_rank) or epoch != int(fail_epoch) or (attempt and int(attempt) != restarts_so_far()):
            continue
        if mode == ["hang"]:
            while True:  # a rank that stops making progress without any error
                time.sleep(1)
        if mode == ["kill"]:
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected failure ({FAIL_AT_ENV}={spec})")
