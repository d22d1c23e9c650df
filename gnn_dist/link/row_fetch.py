"""Rows of any node's embedding by global id, for scoring pairs whose endpoint lives on another rank.

Negatives change every epoch, so this is not the halo plan: each step plans
its own exchange. The rank lists the distinct remote ids it needs, grouped
by owner (global ids are contiguous per part, so sorting them groups them),
and sends the ids (one all-to-all of counts, one of ids); each owner answers
with its rows (one all-to-all), and in training the rows' gradients go back
the same way in the backward and are added into the owners' embeddings.
The bytes this rank puts on the wire (ids, rows, gradients) and the time
spent go to the exchanger's counters (score_bytes, comm_s): summed over
ranks, the metrics' `score_bytes` and `eval_score_bytes`.

Every rank must take part in every exchange, including a rank that needs
nothing or owns nothing asked for: a step's plan and fetch are collective.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from gnn_dist.comm.communicator import Comm, exchange_rows
from gnn_dist.device import HOST
from gnn_dist.halo.exchange import TrafficCounters


@dataclass
class RowRequest:
    """One step's exchange: what this rank asks of each rank, and what it serves."""

    ask_counts: np.ndarray   # rows this rank receives from each rank (grouped by owner)
    serve_rows: torch.Tensor # int64: this rank's own rows it sends, grouped by the asking rank
    serve_counts: np.ndarray # rows it sends to each rank
    positions: np.ndarray    # each requested id's row in the table [owned | fetched]


class RowFetcher:
    def __init__(self, comm: Comm, partptr, rank: int, counters: TrafficCounters,
                 device: torch.device = HOST):
        self.comm = comm
        self.device = device  # where the embeddings it serves live
        self.counters = counters
        self.partptr = np.asarray(partptr, dtype=np.int64)
        self.rank = rank
        self.first = int(self.partptr[rank])
        self.n_owned = int(self.partptr[rank + 1] - self.first)

    def _count(self, sent: int, start: float) -> None:
        self.counters.score_bytes += sent
        self.counters.comm_s += time.perf_counter() - start

    def plan(self, global_ids: np.ndarray) -> RowRequest:
        """Collective: agree with every rank on the rows each needs. global_ids: any ids, repeats allowed."""
        start = time.perf_counter()
        ids = np.unique(global_ids)
        owners = np.searchsorted(self.partptr, ids, side="right") - 1
        remote = owners != self.rank
        ask_counts = np.bincount(owners[remote], minlength=self.comm.size).astype(np.int64)
        asked, serve_counts, sent = exchange_rows(self.comm, ids[remote], ask_counts)
        self._count(sent, start)
        # row of each distinct id in [owned | fetched]: owned ids at their local row, remote ones in fetch order
        table_row = np.where(remote, self.n_owned + np.cumsum(remote) - 1, ids - self.first)
        return RowRequest(ask_counts=ask_counts, serve_rows=torch.from_numpy(asked - self.first).to(self.device),
                          serve_counts=serve_counts.astype(np.int64),
                          positions=table_row[np.searchsorted(ids, global_ids)])

    def table(self, z_owned: torch.Tensor, request: RowRequest) -> torch.Tensor:
        """[owned | fetched] rows (autograd: the fetched rows' gradients return to their owners in the backward;
        collective in both directions)."""
        fetched = _FetchRows.apply(z_owned, self, request)
        return torch.cat([z_owned, fetched])


class _FetchRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z_owned: torch.Tensor, fetcher: RowFetcher, request: RowRequest) -> torch.Tensor:  # type: ignore[override]
        ctx.fetcher, ctx.request, ctx.n_owned = fetcher, request, z_owned.shape[0]
        start = time.perf_counter()
        send = z_owned.detach().index_select(0, request.serve_rows).contiguous()
        received = z_owned.new_empty(int(request.ask_counts.sum()), z_owned.shape[1])
        fetcher._count(fetcher.comm.alltoallv(send, request.serve_counts, received, request.ask_counts), start)
        return received

    @staticmethod
    def backward(ctx, grad_received: torch.Tensor):  # type: ignore[override]
        fetcher, request = ctx.fetcher, ctx.request
        start = time.perf_counter()
        returned = grad_received.new_empty(request.serve_rows.shape[0], grad_received.shape[1])
        fetcher._count(fetcher.comm.alltoallv(grad_received.contiguous(), request.ask_counts, returned,
                                              request.serve_counts), start)
        grad_owned = grad_received.new_zeros(ctx.n_owned, grad_received.shape[1])
        grad_owned.index_add_(0, request.serve_rows, returned)
        return grad_owned, None, None


def predicted_score_bytes(directory, width: int, neg_ratio: int, rule: str = "source") -> tuple[float, int]:
    """(training bytes per epoch, evaluation bytes per evaluation) of the endpoint exchanges, summed over ranks,
    for a --task link partition: what `gnn-dist inspect` reports and the metrics' score_bytes and
    eval_score_bytes measure.

    Per rank and exchange: the counts of the id request ((P - 1) int64), one int64 id per distinct remote
    endpoint, and its row (width fp32) back, plus in training its gradient. The held-out pairs are fixed, so the
    evaluation's figure is exact. Training negatives are drawn anew each epoch, so that figure is an
    expectation: the positives' remote destinations are known, and each other remote node is among the
    rank's T * K uniform draws over the N - 1 nodes other than the source with probability
    1 - (1 - 1 / (N - 1))**(T K); under the pairs rule also among its T * K sources drawn over all N nodes,
    with probability 1 - (1 - 1 / (N - 1))**(T K) (1 - 1 / N)**(T K).
    """
    from gnn_dist.partition.format import load_meta, load_node_map, load_part

    meta = load_meta(directory)
    owner = np.empty(meta.num_nodes, dtype=np.int32)
    owner[load_node_map(directory)] = np.repeat(np.arange(meta.num_parts, dtype=np.int32), np.diff(meta.partptr))
    size, row = meta.num_parts, 4 * width
    request = (size - 1) * 8
    train, evaluation = 0.0, 0
    for k in range(size):
        arrays = load_part(directory, k, meta).arrays
        n_remote = meta.num_nodes - meta.parts[k].owned
        destinations = arrays["link_train"][:, 1]
        known = np.unique(destinations[owner[destinations] != k])
        draws = len(destinations) * neg_ratio
        missed = draws * np.log1p(-1.0 / (meta.num_nodes - 1)) if meta.num_nodes > 1 else 0.0
        if rule == "pairs":
            missed += draws * np.log1p(-1.0 / meta.num_nodes)
        hit = -np.expm1(missed)
        expected = len(known) + (n_remote - len(known)) * hit
        train += request + expected * (8 + 2 * row)
        for phase in ("val", "test"):
            ends = np.concatenate([arrays[f"link_{phase}_pos"][:, 1], arrays[f"link_{phase}_neg"][:, 1],
                                   arrays[f"link_{phase}_mrr"].reshape(-1)])
            remote = len(np.unique(ends[owner[ends] != k]))
            evaluation += request + remote * (8 + row)
    return (train, evaluation) if size > 1 else (0.0, 0)
