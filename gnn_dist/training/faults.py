"""Failure injection for the failure tests: GNN_DIST_FAIL_AT="RANK:EPOCH[:hang]" makes that rank raise (or
hang without an error) when it reaches that epoch, so the tests can watch the whole job come down."""
from __future__ import annotations

import os
import time

FAIL_AT_ENV = "GNN_DIST_FAIL_AT"


def maybe_inject_failure(rank: int, epoch: int) -> None:
    spec = os.environ.get(FAIL_AT_ENV)
    if spec:
        fail_rank, fail_epoch, *mode = spec.split(":")
        if rank == int(fail_rank) and epoch == int(fail_epoch):
            if mode == ["hang"]:
                while True:  # a rank that stops making progress without any error
                    time.sleep(1)
            raise RuntimeError(f"injected failure ({FAIL_AT_ENV}={spec})")
