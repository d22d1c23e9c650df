"""The same-host exchange through shared memory (gnn_dist.halo.shared), on simulated ranks."""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest
import torch

from gnn_dist.comm.communicator import CommWrapper, Pending, SharedMemory
from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import ModelConfig, TrainConfig
from gnn_dist.context import RankContext
from gnn_dist.halo import overlap as halo_overlap
from gnn_dist.halo import shared as halo_shared
from gnn_dist.halo.exchange import HaloExchanger
from gnn_dist.halo.plan import HaloPlan
from gnn_dist.halo.shared import SharedHalo
from gnn_dist.kernels.spmm import SparseOperator
from gnn_dist.partition.format import load_part
from gnn_dist.training import setup
from tests.test_halo_fake import edge_weight, node_values, setup_refusals_when_ranks_see_it_differently


class PublishedOnWait(SharedMemory):
    """Shared regions whose writes reach the peers only when the writer's arrival is waited for: until then a
    peer reads NaN where the rows will be (a read before the barrier shows). Records arrivals."""

    def __init__(self, comm, events: list):
        self.comm, self.events = comm, events

    def allocate(self, nbytes: int) -> list[torch.Tensor]:
        nan_bytes = lambda: torch.full((max(nbytes, 1),), 0xFF, dtype=torch.uint8)  # noqa: E731 - all-ones: NaN
        self.private = nan_bytes()
        self.published = self.comm.allgather_object(nan_bytes())
        return [self.private if q == self.comm.rank else region for q, region in enumerate(self.published)]

    def arrive(self) -> Pending:
        self.events.append("arrive")
        return _Publish(self)

    def free(self) -> None:
        self.comm.barrier()
        self.events.append("free")


class _Publish(Pending):
    def __init__(self, memory: PublishedOnWait):
        super().__init__()
        self.memory = memory

    def wait(self):
        if self.memory is not None:
            self.memory.comm.barrier()  # every rank is done reading what it read before this arrival
            self.memory.published[self.memory.comm.rank].copy_(self.memory.private)
            self.memory.comm.barrier()
            self.memory = None


class CountedExchanges(CommWrapper):
    """Passes shared memory through (as PublishedOnWait) and records every exchange through MPI."""

    def __init__(self, inner, events: list):
        super().__init__(inner)
        self.events = events

    def shared_memory(self):
        return PublishedOnWait(self.inner, self.events)

    def alltoallv(self, send, send_counts, recv, recv_counts):
        self.events.append("alltoallv")
        return self.inner.alltoallv(send, send_counts, recv, recv_counts)

    def ialltoallv(self, send, send_counts, recv, recv_counts):
        self.events.append("ialltoallv")
        return self.inner.ialltoallv(send, send_counts, recv, recv_counts)


@pytest.mark.parametrize("num_parts", [2, 3, 4])
def test_peers_read_the_rows_where_their_owner_wrote_them_and_the_products_equal_the_dense_ones(
        partitioned, num_parts):
    directory = partitioned("synthetic:tiny", num_parts)

    def rank_fn(comm):
        part = load_part(directory, comm.rank)
        events = []
        shared_comm = CountedExchanges(comm, events)
        plan = HaloPlan.from_part(part)
        ex = HaloExchanger(shared_comm, plan, shared=SharedHalo.open(shared_comm, plan.send_counts))
        assert ex.shared is not None
        ids = np.concatenate([part.node_ids, part.halo_ids])
        rows = np.repeat(np.arange(part.n_owned), np.diff(part.indptr))
        op = SparseOperator.from_csr(part.indptr, part.indices, edge_weight(part.node_ids[rows], ids[part.indices]),
                                     (part.n_owned, len(ids)), torch.float64)
        dense = op.to_dense()
        outcomes = []
        # two layers' widths, the wider second: the regions grow between them
        for width, scale in ((3, 1.0), (5, -2.0)):
            x = (node_values(part.node_ids, width) * scale).requires_grad_(True)
            out = halo_overlap.overlapped_aggregation(op, ex, x, None, f"w{width}")
            upstream = node_values(part.node_ids, width) * (comm.rank + 1)
            out.backward(upstream)
            assert torch.allclose(out.detach(), dense @ (node_values(ids, width) * scale), atol=1e-12)
            outcomes.append((dense.t() @ upstream, x.grad))
        # rows to peers and every halo row's gradient back, float64, as MPI would have moved them
        assert ex.counters.halo_bytes == (plan.rows_sent_to_peers + part.n_halo) * (3 + 5) * 8
        ex.drain()  # the job's end: the last readers are waited for and the regions freed
        assert ex.shared.read is None and ex.shared.regions is None and ex.shared.used
        return ids, outcomes, part.n_owned, events

    results = run_fake_ranks(num_parts, rank_fn)
    for layer in range(2):
        expected = {}  # a node's gradient: the sum over every rank that reads it of A^T times its upstream
        for ids, outcomes, *_ in results:
            for row, node in enumerate(ids):
                expected[node] = expected.get(node, 0) + outcomes[layer][0][row]
        for ids, outcomes, n_owned, _ in results:
            grad = outcomes[layer][1]
            for row in range(n_owned):
                assert torch.allclose(grad[row], expected[ids[row]], atol=1e-12)
    for *_, events in results:
        # nothing through MPI; per exchange, rows written then rows read: 2 layers, forward and backward; the
        # regions freed at the end
        assert events == ["arrive"] * 8 + ["free"]


def test_a_wrapped_communicator_or_one_rank_exchanges_through_mpi(partitioned):
    directory = partitioned("synthetic:tiny", 2)

    def rank_fn(comm):
        counts = HaloPlan.from_part(load_part(directory, comm.rank)).send_counts
        return SharedHalo.open(CommWrapper(comm), counts), SharedHalo.open(comm, counts)

    for modelled_link, direct in run_fake_ranks(2, rank_fn):
        assert modelled_link is None  # a modelled network, a device's staging: their rows must cross them
        assert direct is not None
    assert run_fake_ranks(1, lambda comm: SharedHalo.open(comm, np.zeros(1, dtype=np.int64))) == [None]


def test_gnn_dist_shared_halo_0_exchanges_through_mpi_and_trains_the_same(partitioned, monkeypatch):
    directory = partitioned("synthetic:tiny", 3)
    config = TrainConfig(parts=str(directory), epochs=1, progress=False, model=ModelConfig(hidden=8, num_layers=3))

    def one_step(comm):
        state = setup(RankContext(comm), config)
        loss = state.mode.compute_gradients(epoch=0)
        used = state.exchanger.shared is not None and state.exchanger.shared.used
        return used, loss, [p.grad.clone() for p in state.model.parameters()]

    through_memory = run_fake_ranks(3, one_step)
    monkeypatch.setenv(halo_shared.SHARED_HALO_ENV, "0")
    through_mpi = run_fake_ranks(3, one_step)
    assert [opened for opened, *_ in through_memory] == [True] * 3
    assert [opened for opened, *_ in through_mpi] == [False] * 3
    for (_, loss_a, grads_a), (_, loss_b, grads_b) in zip(through_memory, through_mpi):
        assert loss_a == pytest.approx(loss_b, rel=1e-6)
        for a, b in zip(grads_a, grads_b):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    # GAT's attention needs [owned | halo] rows whole: its exchanges keep MPI, and the record must not say otherwise
    monkeypatch.delenv(halo_shared.SHARED_HALO_ENV)
    config = dataclasses.replace(config, model=ModelConfig(model="gat", hidden=4, heads=2, num_layers=3))
    assert [used for used, *_ in run_fake_ranks(3, one_step)] == [False] * 3


def test_ranks_that_see_gnn_dist_shared_halo_differently_are_refused_in_one_line(partitioned, monkeypatch):
    # One rank through MPI and the others through memory would wait for each other in calls the other side
    # never makes: the job would hang.
    messages = setup_refusals_when_ranks_see_it_differently(partitioned, monkeypatch, halo_shared,
                                                            "shared_halo_enabled")
    assert len(set(messages)) == 1
    assert "GNN_DIST_SHARED_HALO differs across ranks (on at ranks [0, 2]" in messages[0]
    assert "-genv GNN_DIST_SHARED_HALO 0" in messages[0]


def test_a_rank_writes_its_next_rows_only_after_every_peer_has_read_the_last(partitioned, monkeypatch):
    # One slot per rank: rank 0's next exchange would overwrite the rows rank 1 is still to multiply (rank 1 is
    # held back just before its halo product) unless the exchange waits for every peer to have read them.
    directory = partitioned("synthetic:tiny", 2)
    local = threading.local()
    multiply = halo_overlap.spmm_into

    def slow_halo_product_on_rank_1(*args, **kwargs):
        if kwargs.get("accumulate") and local.rank == 1 and local.forward:
            time.sleep(0.3)
        multiply(*args, **kwargs)

    monkeypatch.setattr(halo_overlap, "spmm_into", slow_halo_product_on_rank_1)

    def rank_fn(comm):
        local.rank, local.forward = comm.rank, True
        part = load_part(directory, comm.rank)
        plan = HaloPlan.from_part(part)
        ex = HaloExchanger(comm, plan, shared=SharedHalo.open(comm, plan.send_counts))  # truly shared regions
        ids = np.concatenate([part.node_ids, part.halo_ids])
        rows = np.repeat(np.arange(part.n_owned), np.diff(part.indptr))
        op = SparseOperator.from_csr(part.indptr, part.indices, edge_weight(part.node_ids[rows], ids[part.indices]),
                                     (part.n_owned, len(ids)), torch.float64)
        x = node_values(part.node_ids, 3)
        out = halo_overlap.overlapped_aggregation(op, ex, x, None, "t")
        local.forward = False
        # The next exchange, rows nothing like the first's. A second forward rather than the backward: torch's
        # autograd engine does not start rank 0's backward while rank 1 is still inside its forward, so the
        # backward's write could never overtake rank 1's read, whether the exchange waited or not.
        halo_overlap.overlapped_aggregation(op, ex, torch.full_like(x, 1e6), None, "t")
        return torch.allclose(out, op.to_dense() @ node_values(ids, 3), atol=1e-12)

    assert run_fake_ranks(2, rank_fn) == [True, True]
