"""The explicit per-rank state: who am I, how many of us, which communicator.

May import: comm
"""
from __future__ import annotations

from dataclasses import dataclass

from gnn_dist.comm.communicator import Comm


class SetupError(RuntimeError):
    """A problem every rank detects the same way (bad input, wrong rank count); the message names the fix."""


@dataclass(frozen=True)
class RankContext:
    comm: Comm

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def is_root(self) -> bool:
        return self.comm.rank == 0

    def check_num_parts(self, num_parts: int, parts_dir: str) -> None:
        if num_parts != self.size:
            raise SetupError(f"num_parts={num_parts} in {parts_dir} but {self.size} ranks were started: "
                             f"run mpiexec -n {num_parts}, or re-partition with --num-parts {self.size}")
