"""Messages for people: one logger, every line prefixed with the rank that wrote it.

Errors that end a command keep their one-line `gnn-dist CMD: error: ...` form
(gnn_dist.cli); this is for what a run reports along the way (resuming,
warnings), which under mpiexec would otherwise be anonymous lines from any rank.

May import: nothing of gnn_dist
"""
from __future__ import annotations

import logging
import sys


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record is emitted (test capture replaces it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _RankPrefix(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        rank = self.extra["rank"]
        return (f"gnn-dist rank {rank}: {msg}" if rank is not None else f"gnn-dist: {msg}"), kwargs


def rank_logger(rank: int | None) -> logging.LoggerAdapter:
    """The gnn_dist logger with `gnn-dist rank R: ` before each message (`gnn-dist: ` without a rank)."""
    logger = logging.getLogger("gnn_dist")
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return _RankPrefix(logger, {"rank": rank})
