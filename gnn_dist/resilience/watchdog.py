"""A per-rank watchdog: abort the job when this rank makes no progress for too long.

The training loop and the halo exchange call `beat(step)` as they go. When a
peer dies without an MPI error, a link is cut, or a collective never
completes, the beats stop; the watchdog then prints which step stalled (and
which peers no longer answer: gnn_dist.comm.peers) and aborts the whole job, so
nothing is left waiting forever.

`--timeout auto` (the default) fits the limit to the job instead of one number
for every graph: once a training epoch has completed, a training step may go
quiet for max(60 s, 20 x the longest quiet gap seen in training so far); an
evaluation or checkpoint for max(300 s, 20 x the longest gap seen in that phase
before); set-up and the first epoch of each phase get 600 s. A cut link on a
job whose steps take a second ends it in about a minute, and a graph whose
layers take minutes is not cut short. `--timeout S` fixes the limit at S
seconds for every phase; 0 turns the watchdog off.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable

AUTO_FLOOR = 60.0          # training steps, once one epoch has completed
AUTO_PHASE_FLOOR = 300.0   # evaluation and checkpoints, once one has completed
AUTO_FIRST = 600.0         # set-up, and a phase not yet seen complete
AUTO_FACTOR = 20.0


def phase_of(step: str) -> str | None:
    """The phase a beat announces (None: a beat inside the current phase, like a halo exchange)."""
    if step.startswith("set-up"):
        return "set-up"
    if step.startswith("epoch "):
        what = step.split(": ", 1)[-1]
        if what.startswith(("training step", "sampled step")):
            return "training"
        if what.startswith(("evaluation", "checkpoint")):
            return what.split()[0]
    return None


class Watchdog:
    def __init__(self, timeout: float | str, rank: int, abort: Callable[[int], None], poll: float | None = None,
                 explain: Callable[[], list[str]] | None = None):
        """timeout: seconds, or "auto"; explain: what to add to the stall line (the peers that do not answer)."""
        self.auto = timeout == "auto"
        self.timeout = None if self.auto else float(timeout)
        self.rank = rank
        self._abort = abort
        self._explain = explain
        self._poll = poll or (1.0 if self.auto else min(1.0, self.timeout / 4))
        self._last = time.monotonic()
        self._step = "start-up"
        self._phase = "set-up"
        self._longest: dict[str, float] = {}   # the longest quiet gap seen in each phase
        self._completed: set[str] = set()      # phases seen through to their end at least once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gnn-dist-watchdog", daemon=True)
        self._thread.start()

    def beat(self, step: str) -> None:
        now = time.monotonic()
        gap = now - self._last
        self._longest[self._phase] = max(self._longest.get(self._phase, 0.0), gap)
        phase = phase_of(step)
        if phase is not None:
            # A phase's announcement closes the round running, even when the same phase starts again: a run that
            # evaluates every 1000 epochs has seen training through after its first epoch.
            self._completed.add(self._phase)
            self._phase = phase
        self._step = step
        self._last = now

    def limit(self) -> float:
        if not self.auto:
            return self.timeout
        phase = self._phase
        if phase not in self._completed or phase == "set-up":
            return AUTO_FIRST
        floor = AUTO_FLOOR if phase == "training" else AUTO_PHASE_FLOOR
        return max(floor, AUTO_FACTOR * self._longest.get(phase, 0.0))

    def describe_limit(self) -> str:
        if not self.auto:
            return f"--timeout {self.timeout:g}"
        return (f"--timeout auto: {self.limit():.0f} s in this phase ({self._phase}); pass --timeout S to fix it, 0 to "
                f"turn it off")

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll):
            idle = time.monotonic() - self._last
            if idle > self.limit():
                silent = self._explain() if self._explain is not None else []
                peers = f"; not answering: {', '.join(silent)}" if silent else "; a peer may have died or hung"
                print(f"gnn-dist train: error on rank {self.rank} ({socket.gethostname()}): no progress for {idle:.0f} s "
                      f"({self.describe_limit()}), stalled in: {self._step}{peers}: aborting the job",
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
