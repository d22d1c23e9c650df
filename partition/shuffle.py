"""Variable-sized all-to-all of numpy rows over gnn_dist.comm's interface, and collective error agreement.

The distributed partitioner moves edges, node rows and id lists between ranks
with `exchange`; `agree` makes a failure on one rank (a bad chunk, a part that
cannot be written) a clean, identical error on every rank instead of a hang
in the next collective.
"""
from __future__ import annotations

from typing import Callable, TypeVar

import numpy as np
import torch

from gnn_dist.comm import first_failure
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


def all_to_all_counts(comm, counts: np.ndarray) -> np.ndarray:
    """counts[d] sent to each rank d -> counts received from each rank."""
    send = torch.from_numpy(np.ascontiguousarray(counts, dtype=np.int64))
    recv = torch.empty(comm.size, dtype=torch.int64)
    ones = np.ones(comm.size, dtype=np.int64)
    comm.alltoallv(send, ones, recv, ones)
    return recv.numpy()


def allreduce_array(comm, values: np.ndarray, op: str = "sum") -> np.ndarray:
    tensor = torch.from_numpy(np.array(values, dtype=np.int64, copy=True).reshape(-1))
    comm.allreduce_(tensor, op)
    return tensor.numpy().reshape(np.shape(values))


def exchange(comm, send: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of `send` grouped by destination (counts[d] rows for rank d) -> (received rows by source, their counts)."""
    send = np.ascontiguousarray(send)
    counts = np.asarray(counts, dtype=np.int64)
    recv_counts = all_to_all_counts(comm, counts)
    recv = np.empty((int(recv_counts.sum()),) + send.shape[1:], dtype=send.dtype)
    row_bytes = max(1, send.dtype.itemsize * int(np.prod(send.shape[1:], dtype=np.int64)))
    max_rows = max(1, MAX_MESSAGE_BYTES // row_bytes)
    longest = max(int(counts.max(initial=0)), int(recv_counts.max(initial=0)))
    rounds = int(allreduce_array(comm, np.array([-(-longest // max_rows)]), "max")[0])
    if rounds <= 1:
        comm.alltoallv(torch.from_numpy(send), counts, torch.from_numpy(recv), recv_counts)
        return recv, recv_counts
    send_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    recv_start = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
    for t in range(rounds):
        sent = np.clip(counts - t * max_rows, 0, max_rows)
        got = np.clip(recv_counts - t * max_rows, 0, max_rows)
        piece = np.concatenate([send[s + t * max_rows:s + t * max_rows + c] for s, c in zip(send_start, sent)])
        landing = np.empty((int(got.sum()),) + send.shape[1:], dtype=send.dtype)
        comm.alltoallv(torch.from_numpy(piece), sent, torch.from_numpy(landing), got)
        offset = 0
        for s, c in zip(recv_start, got):
            recv[s + t * max_rows:s + t * max_rows + c] = landing[offset:offset + c]
            offset += c
    return recv, recv_counts


def group_by(dest: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(stable order putting rows in destination order, rows per destination)."""
    order = np.argsort(dest, kind="stable")
    return order, np.bincount(dest, minlength=size).astype(np.int64)
