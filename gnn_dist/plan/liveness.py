"""The memory plan's units and its walk: bytes per float and per index, and the tensors alive allocation by
allocation (`Liveness`), which remembers the largest total and what made it up."""
from __future__ import annotations

FLOAT = 4
INDEX = 8


class Liveness:
    """Bytes alive, allocation by allocation; remembers the largest total and what made it up."""

    def __init__(self, base: dict):
        self.alive = dict(base)
        self.peak = sum(self.alive.values())
        self.at_peak = dict(self.alive)

    def alloc(self, name: str, size: float) -> None:
        self.alive[name] = self.alive.get(name, 0) + int(size)
        total = sum(self.alive.values())
        if total > self.peak:
            self.peak, self.at_peak = total, dict(self.alive)

    def free(self, *names: str) -> None:
        for name in names:
            self.alive.pop(name, None)

    def rename(self, old: str, new: str) -> None:
        """The tensor called `old` is now kept as (part of) `new`: no bytes change."""
        self.alive[new] = self.alive.get(new, 0) + self.alive.pop(old, 0)
