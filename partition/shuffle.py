"""Variable-sized all-to-all of numpy rows over gnn_dist.comm.communicator's interface, and collective error agreement.

The distributed partitioner moves edges, node rows and id lists between ranks
with `exchange`; `agree` makes a failure on one rank (a bad chunk, a part that
cannot be written) a clean, identical error on every rank instead of a hang
in the next collective.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from gnn_dist.comm.communicator import exchange_rows, first_failure
from gnn_dist.partition.graph import DatasetError
from gnn_dist.partition.metis import PartitionError

# MPI counts are C ints: keep each peer's message in one round below 1 GiB.
MAX_MESSAGE_BYTES = 1 << 30
T = TypeVar("T")


class CollectiveError(RuntimeError):
    """Another rank failed; the message is that rank's error line."""


def agree(comm, step: Callable[[], T]) -> T:
    """Run `step` on every rank; if it raised a user-facing error anywhere, raise it everywhere."""
    result, message = None, None
    try:
        result = step()
    except (DatasetError, PartitionError, OSError, ValueError) as err:
        message = str(err)
    failure = first_failure(comm, message)
    if failure:
        rank, first, _ = failure
        raise DatasetError(first) if comm.size == 1 else CollectiveError(f"{first} (rank {rank})")
    return result  # type: ignore[return-value]


def allreduce_array(comm, values: np.ndarray, op: str = "sum") -> np.ndarray:
    tensor = torch.from_numpy(np.array(values, dtype=np.int64, copy=True).reshape(-1))
    comm.allreduce_(tensor, op)
    return tensor.numpy().reshape(np.shape(values))


def exchange(comm, send: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of `send` grouped by destination (counts[d] rows for rank d) -> (received rows by source, their counts),
    in rounds that keep each message under MAX_MESSAGE_BYTES."""
    recv, recv_counts, _ = exchange_rows(comm, send, counts, MAX_MESSAGE_BYTES)
    return recv, recv_counts


def group_by(dest: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(stable order putting rows in destination order, rows per destination)."""
    order = np.argsort(dest, kind="stable")
    return order, np.bincount(dest, minlength=size).astype(np.int64)
