"""Halo exchange and whole-model equivalence with P simulated ranks in one process (FakeComm)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from gnn_dist.comm.communicator import CommWrapper, Pending
from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import ModelConfig, TrainConfig
from gnn_dist.context import RankContext, SetupError
from gnn_dist.halo import overlap as halo_overlap
from gnn_dist.halo.exchange import HaloExchanger
from gnn_dist.halo.plan import HaloPlan
from gnn_dist.kernels.spmm import SparseOperator
from gnn_dist.partition.datasets import load_dataset
from gnn_dist.partition.format import load_part
from gnn_dist.training import setup
from tests.reference import reference_logits_and_grads


def node_values(ids: np.ndarray, width: int) -> torch.Tensor:
    """A value per (original id, column) that any rank can compute."""
    ids = torch.as_tensor(ids, dtype=torch.float64)
    return torch.sin(ids[:, None] * 0.37 + torch.arange(width, dtype=torch.float64)[None, :])


@pytest.mark.parametrize("num_parts", [2, 3, 4])
def test_gather_delivers_exactly_the_halo_rows(partitioned, num_parts):
    directory = partitioned("synthetic:tiny", num_parts)
    width = 5

    def rank_fn(comm):
        part = load_part(directory, comm.rank)
        ex = HaloExchanger(comm, HaloPlan.from_part(part))
        full = ex.gather(node_values(part.node_ids, width), slot="t")
        assert torch.equal(full, node_values(np.concatenate([part.node_ids, part.halo_ids]), width))
        return ex.counters.halo_bytes, part.n_halo

    results = run_fake_ranks(num_parts, rank_fn)
    total_bytes = sum(b for b, _ in results)
    assert total_bytes == sum(h for _, h in results) * width * 8  # float64 rows, nothing more


def test_backward_returns_halo_gradients_to_their_owners(partitioned):
    directory = partitioned("synthetic:tiny", 3)

    def rank_fn(comm):
        part = load_part(directory, comm.rank)
        ex = HaloExchanger(comm, HaloPlan.from_part(part))
        x = torch.zeros(part.n_owned, 2, dtype=torch.float64, requires_grad=True)
        full = ex.gather(x, slot="t")
        upstream = node_values(np.concatenate([part.node_ids, part.halo_ids]), 2) * (comm.rank + 1)
        full.backward(upstream)
        return part.node_ids, part.halo_ids, upstream, x.grad

    results = run_fake_ranks(3, rank_fn)
    # reference: each node's gradient is the sum of the upstream rows of every copy of it
    expected = {}
    for node_ids, halo_ids, upstream, _ in results:
        for row, node in enumerate(np.concatenate([node_ids, halo_ids])):
            expected[node] = expected.get(node, 0) + upstream[row]
    for node_ids, _, _, grad in results:
        for row, node in enumerate(node_ids):
            assert torch.allclose(grad[row], expected[node])


class DeliveredOnWait(CommWrapper):
    """Non-blocking exchanges whose rows land only when waited for (the receive buffer holds NaN until then),
    recording the order of posts, progress calls and waits."""

    def __init__(self, inner, events: list):
        super().__init__(inner)
        self.events = events

    def ialltoallv(self, send, send_counts, recv, recv_counts):
        landed = torch.empty_like(recv)
        sent = self.inner.alltoallv(send, send_counts, landed, recv_counts)
        recv.fill_(float("nan"))
        self.events.append("post")
        return _LandsOnWait(landed, recv, self.events), sent


class _LandsOnWait(Pending):
    def __init__(self, landed, recv, events):
        super().__init__()
        self.landed, self.recv, self.events = landed, recv, events

    def progress(self):
        self.events.append("progress")

    def wait(self):
        self.events.append("wait")
        self.recv.copy_(self.landed)


def edge_weight(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """A weight per directed edge of original ids, the same on whichever rank holds it."""
    return np.cos(rows * 0.11 + cols * 0.07)


@pytest.mark.parametrize("chunk_rows", [7, 4096])
def test_overlapped_aggregation_multiplies_owned_rows_while_the_halo_travels_and_equals_the_dense_products(
        partitioned, monkeypatch, chunk_rows):
    monkeypatch.setattr(halo_overlap, "CHUNK_ROWS", chunk_rows)
    directory = partitioned("synthetic:tiny", 3)
    width = 4

    def rank_fn(comm):
        part = load_part(directory, comm.rank)
        events = []
        ex = HaloExchanger(DeliveredOnWait(comm, events), HaloPlan.from_part(part))
        ids = np.concatenate([part.node_ids, part.halo_ids])
        rows = np.repeat(np.arange(part.n_owned), np.diff(part.indptr))
        weights = edge_weight(part.node_ids[rows], ids[part.indices])
        op = SparseOperator.from_csr(part.indptr, part.indices, weights, (part.n_owned, len(ids)), torch.float64)
        assert ex.overlapped("t", attention=False)
        x = node_values(part.node_ids, width).requires_grad_(True)
        bias = torch.arange(width, dtype=torch.float64)
        out = halo_overlap.overlapped_aggregation(op, ex, x, bias, "t")
        forward_events = list(events)
        upstream = node_values(part.node_ids, width) * (comm.rank + 1)
        out.backward(upstream)
        dense = op.to_dense()
        assert torch.allclose(out.detach(), dense @ node_values(ids, width) + bias, atol=1e-12)
        # the bytes this rank sends in a blocking exchange: its boundary rows to the peers that read them, then
        # the gradient of every halo row back to its owner, float64
        assert ex.counters.halo_bytes == (ex.plan.rows_sent_to_peers + part.n_halo) * width * 8
        return ids, dense.t() @ upstream, x.grad, forward_events, events[len(forward_events):], part.n_owned

    results = run_fake_ranks(3, rank_fn)
    expected = {}  # each node's gradient: the sum over every rank that reads it of A^T times that rank's upstream
    for ids, through_transpose, *_ in results:
        for row, node in enumerate(ids):
            expected[node] = expected.get(node, 0) + through_transpose[row]
    for ids, _, grad, forward_events, backward_events, n_owned in results:
        for row in range(n_owned):
            assert torch.allclose(grad[row], expected[ids[row]], atol=1e-12)
        # posted, then nudged after each chunk of the owned product, then waited for: in both directions
        chunks = -(-n_owned // chunk_rows)
        assert forward_events == backward_events == ["post"] + ["progress"] * chunks + ["wait"]


def test_only_exact_exchanges_of_linear_layers_on_the_host_overlap(monkeypatch):
    assert halo_overlap.overlaps("exact", attention=False, sequential=False, device="cpu")
    assert not halo_overlap.overlaps("pipeline", attention=False, sequential=False, device="cpu")
    assert not halo_overlap.overlaps("exact", attention=True, sequential=False, device="cpu")
    assert not halo_overlap.overlaps("exact", attention=False, sequential=True, device="cpu")
    assert not halo_overlap.overlaps("exact", attention=False, sequential=False, device="cuda")
    monkeypatch.setenv(halo_overlap.OVERLAP_ENV, "0")
    assert not halo_overlap.overlaps("exact", attention=False, sequential=False, device="cpu")


def one_step_on_every_rank(config: TrainConfig, num_parts: int) -> list[tuple]:
    """Per rank: (node ids, train-mode logits, loss, parameters, gradients, the rank's LocalGraph) after one step."""
    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        loss = state.mode.compute_gradients(epoch=0)
        state.model.train()
        with torch.no_grad():
            logits = state.model(state.x_full)
        params = {name: p.detach().clone() for name, p in state.model.named_parameters()}
        grads = {name: p.grad.clone() for name, p in state.model.named_parameters()}
        return state.graph.node_ids, logits, loss, params, grads, state.graph

    return run_fake_ranks(num_parts, rank_fn)


CASES = [
    ("gcn", 32, 3, False),   # widths 16->32->32->4: aggregate-first, then transform-first last layer
    ("gcn", 8, 2, False),    # 16->8: the first layer transforms first
    ("sage", 32, 3, False),
    ("sage", 8, 2, False),
    ("gcn", 24, 3, True),    # BatchNorm with statistics across ranks
]


@pytest.mark.parametrize("model, hidden, num_layers, batch_norm", CASES)
@pytest.mark.parametrize("num_parts, overlap", [(1, "1"), (3, "1"), (3, "0")])  # one rank exchanges nothing
def test_distributed_model_equals_pyg_on_the_whole_graph(partitioned, monkeypatch, model, hidden, num_layers,
                                                         batch_norm, num_parts, overlap):
    monkeypatch.setenv(halo_overlap.OVERLAP_ENV, overlap)  # on: gnn_dist.halo.overlap; off: the blocking exchange
    directory = partitioned("synthetic:tiny", num_parts)
    config = TrainConfig(parts=str(directory), epochs=0, progress=False, seed=3,
                         model=ModelConfig(model=model, hidden=hidden, num_layers=num_layers, dropout=0.0,
                                           batch_norm=batch_norm))

    results = one_step_on_every_rank(config, num_parts)
    params = results[0][3]
    for r in results[1:]:  # weights are identical on all ranks
        assert all(torch.equal(params[k], r[3][k]) for k in params)
    assert_equal_to_pyg(results, config, load_dataset("synthetic:tiny"))


def assert_equal_to_pyg(results: list[tuple], config: TrainConfig, graph) -> None:
    """The ranks' logits, loss and gradients (one_step_on_every_rank) equal PyG's on the whole graph."""
    params = results[0][3]
    model = config.model
    widths = model.layers(graph.num_features, graph.num_classes)
    ref_logits, ref_loss, ref_grads = reference_logits_and_grads(
        graph, model.model, widths, model.batch_norm, {k: v.double() for k, v in params.items()})
    logits = torch.zeros(graph.num_nodes, graph.num_classes, dtype=torch.float64)
    for node_ids, rank_logits, *_ in results:
        logits[node_ids] = rank_logits.double()
    assert (logits - ref_logits).abs().max() <= 1e-5
    for _, _, loss, _, grads, _ in results:
        assert loss == pytest.approx(float(ref_loss), rel=1e-5)
        for name, grad in grads.items():
            assert (grad.double() - ref_grads[name]).abs().max() <= 1e-5, name


def test_wrong_rank_count_is_refused_by_every_rank(partitioned):
    directory = partitioned("synthetic:tiny", 2)

    def rank_fn(comm):
        with pytest.raises(SetupError, match="num_parts=2 .* 3 ranks were started: run mpiexec -n 2"):
            setup(RankContext(comm), TrainConfig(parts=str(directory), progress=False))
        return True

    assert run_fake_ranks(3, rank_fn) == [True, True, True]


def test_one_rank_failing_setup_fails_all_without_hanging(partitioned, tmp_path):
    import shutil

    directory = tmp_path / "p"
    shutil.copytree(partitioned("synthetic:tiny", 2), directory)
    (directory / "part-00001.npz").unlink()

    def rank_fn(comm):
        with pytest.raises(SetupError, match=r"rank 1: .*part-00001\.npz is missing"):
            setup(RankContext(comm), TrainConfig(parts=str(directory), progress=False))
        return True

    assert run_fake_ranks(2, rank_fn, timeout=20) == [True, True]


def setup_refusals_when_ranks_see_it_differently(partitioned, monkeypatch, module, setting: str) -> list[str]:
    """Each of 3 simulated ranks' set-up error when module.setting() (an environment switch) says True at ranks
    0 and 2 and False at rank 1. Simulated ranks share one environment, so each thread sees its own value."""
    seen_by_rank = {0: True, 1: False, 2: True}
    local = threading.local()
    monkeypatch.setattr(module, setting, lambda: seen_by_rank[local.rank])
    directory = partitioned("synthetic:tiny", 3)
    config = TrainConfig(parts=str(directory), epochs=1, progress=False, model=ModelConfig(hidden=8, num_layers=2))

    def rank_fn(comm):
        local.rank = comm.rank
        with pytest.raises(SetupError) as refused:
            setup(RankContext(comm), config)
        return str(refused.value)

    return run_fake_ranks(3, rank_fn)


def test_ranks_that_see_gnn_dist_overlap_differently_are_refused_before_any_exchange(partitioned, monkeypatch):
    # Overlapped ranks post non-blocking exchanges; a rank with it off would block in a collective they never
    # call: the job would hang.
    messages = setup_refusals_when_ranks_see_it_differently(partitioned, monkeypatch, halo_overlap, "overlap_enabled")
    assert len(set(messages)) == 1  # every rank raises the same error: rank 0 prints it once
    assert "GNN_DIST_OVERLAP differs across ranks (overlap on at ranks [0, 2]" in messages[0]
    assert "-genv GNN_DIST_OVERLAP 0" in messages[0]
