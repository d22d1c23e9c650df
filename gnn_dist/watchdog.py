"""A per-rank watchdog: abort the job when this rank makes no progress for `timeout` seconds.

The training loop and the halo exchange call `beat(step)` as they go. When a
peer dies without an MPI error, or a collective never completes, the beats
stop; the watchdog then prints which step stalled and aborts the whole job,
so nothing is left waiting forever.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable


class Watchdog:
    def __init__(self, timeout: float, rank: int, abort: Callable[[int], None], poll: float | None = None):
        self.timeout = timeout
        self.rank = rank
        self._abort = abort
        self._poll = poll or min(1.0, timeout / 4)
        self._last = time.monotonic()
        self._step = "start-up"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gnn-dist-watchdog", daemon=True)
        self._thread.start()

    def beat(self, step: str) -> None:
        self._step = step
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll):
            idle = time.monotonic() - self._last
            if idle > self.timeout:
                print(f"gnn-dist train: error on rank {self.rank}: no progress for {idle:.0f} s (--timeout "
                      f"{self.timeout:g}), stalled in: {self._step}; a peer may have died or hung: aborting the job",
                      file=sys.stderr, flush=True)
                # Abort from this thread; if MPI cannot even do that, leave hard.
                threading.Thread(target=self._abort, args=(1,), daemon=True).start()
                time.sleep(10)
                os._exit(1)


class NoWatchdog:
    """Stands in when --timeout is 0 (and for simulated ranks)."""

    def beat(self, step: str) -> None:
        pass

    def stop(self) -> None:
        pass
