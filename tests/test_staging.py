"""The device path's pieces that a machine without a GPU can run.

- Staging (gnn_dist.comm.staging): GNN_DIST_STAGING=always sends host tensors through separate host buffers, the
  path device tensors take, so the copy-in, the copy-back at wait() and the buffer reuse are exercised here;
  the reference is the same exchange or run without staging (what MPI itself delivers).
- The CPU path is untouched: no wrapper, no copies.
- The native kernels refuse, at their door, a tensor that is not on the host.
- `--device cuda` without a GPU is one line.
- Sampled batches move through host buffers kept from step to step (BatchMover), the path a GPU takes.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gnn_dist.comm.communicator import Comm
from gnn_dist.comm.simulated_ranks import run_fake_ranks, solo_comm
from gnn_dist.comm.staging import GROWTH, STAGING_ENV, BatchMover, StagedComm
from gnn_dist.config import ModelConfig
from gnn_dist.device import HOST, device_comm, rank_device
from gnn_dist.kernels.native import native_module
from gnn_dist.partition.format import load_meta, part_shapes
from gnn_dist.plan.host import staging_pool_bytes
from gnn_dist.plan.memory import PlanConfig
from tests.conftest import train_many


def _exchanges(comm: Comm) -> dict:
    """Every kind of exchange the runtime makes, on rank-dependent data; returns what arrived."""
    rank, size = comm.rank, comm.size
    send = torch.arange(size * 3 * 4, dtype=torch.float32).view(size * 3, 4) + 100 * rank
    counts = np.full(size, 3, dtype=np.int64)
    blocking = torch.zeros(size * 3, 4)
    comm.alltoallv(send, counts, blocking, counts)
    later = torch.zeros(size * 3, 4)
    pending, _ = comm.ialltoallv(send * 2, counts, later, counts)
    pending.wait()
    peer = (rank + 1) % size
    got = torch.zeros(5, dtype=torch.int64)
    receiving = comm.irecv(got, (rank - 1) % size, tag=7)
    sending = comm.isend(torch.arange(5, dtype=torch.int64) + 10 * rank, peer, tag=7)
    receiving.wait()
    sending.wait()
    total = torch.full((3,), float(rank + 1))
    comm.allreduce_(total)
    weights = torch.full((2,), float(rank))
    comm.bcast_(weights, root=size - 1)
    return {"blocking": blocking, "later": later, "p2p": got, "sum": total, "bcast": weights}


def test_staged_exchanges_deliver_what_unstaged_ones_do():
    plain = run_fake_ranks(3, _exchanges)
    staged_comms = []

    def staged(comm):
        wrapper = StagedComm(comm, HOST, always=True)
        staged_comms.append(wrapper)
        first = _exchanges(wrapper)
        held = wrapper.buffers.held_bytes, wrapper.buffers.buffers
        second = _exchanges(wrapper)  # the same shapes again: served from the buffers the first round returned
        assert (wrapper.buffers.held_bytes, wrapper.buffers.buffers) == held
        return first, second

    results = run_fake_ranks(3, staged)
    for rank in range(3):
        for round_ in results[rank]:
            for key, value in plain[rank].items():
                assert torch.equal(round_[key], value), (rank, key)
    # staging really happened: every exchange's payload went through host buffers and back
    assert all(w.staged_bytes > 0 for w in staged_comms)
    expected_sum = torch.full((3,), 1.0 + 2.0 + 3.0)
    assert torch.equal(plain[0]["sum"], expected_sum) and torch.equal(plain[1]["bcast"], torch.full((2,), 2.0))


def test_the_host_pool_stays_bounded_when_every_exchange_has_a_new_size():
    """bns, adaptive and sampled mode send a different number of rows every epoch; the pool must not keep a
    buffer per size ever seen (pinned memory that grew for the whole run), yet every payload still arrives."""
    rounds, width = 60, 4

    def body(comm):
        wrapper = StagedComm(comm, HOST, always=True)
        generator = np.random.default_rng(comm.rank)
        largest = 0
        for round_ in range(rounds):
            # both ranks must agree on the counts: peer p sends what p's row of a shared matrix says
            shared = np.random.default_rng(round_).integers(1, 300, size=(comm.size, comm.size))
            send_counts, recv_counts = shared[comm.rank], shared[:, comm.rank]
            send = torch.from_numpy(generator.standard_normal((int(send_counts.sum()), width))).float()
            recv = torch.zeros(int(recv_counts.sum()), width)
            plain = torch.zeros_like(recv)
            comm.alltoallv(send, send_counts, plain, recv_counts)
            wrapper.alltoallv(send, send_counts, recv, recv_counts)
            assert torch.equal(recv, plain)
            largest = max(largest, send.numel() * 4, recv.numel() * 4)
        return wrapper.buffers.buffers, wrapper.buffers.held_bytes, largest, wrapper.buffers.made

    for buffers, held, largest, made in run_fake_ranks(2, body):
        # two buffers in use at once (send, receive), each at most GROWTH times the largest payload
        assert buffers == 2
        # and reused: a new buffer only when a payload outgrows every free one (pinning is slow)
        assert made <= rounds // 4, made
        assert held <= 2 * GROWTH * largest
        assert held >= largest  # the largest payload did go through the pool


def test_a_non_blocking_receive_lands_only_at_wait():
    """The copy back from the host buffer is queued by wait(), so the destination is untouched before it."""
    def body(comm):
        wrapper = StagedComm(comm, HOST, always=True)
        counts = np.ones(comm.size, dtype=np.int64)
        recv = torch.full((comm.size, 2), -1.0)
        pending, _ = wrapper.ialltoallv(torch.full((comm.size, 2), float(comm.rank)), counts, recv, counts)
        before = recv.clone()
        pending.wait()
        pending.wait()  # idempotent, as Pending is
        return before, recv

    for before, after in run_fake_ranks(2, body):
        assert torch.equal(before, torch.full((2, 2), -1.0))  # simulated ranks deliver at once: into the buffer
        assert torch.equal(after, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))


def test_a_batch_mover_keeps_its_buffers_and_never_lets_a_batch_share_them():
    """Batches of every size arrive intact; a smaller batch reuses the buffers, a larger one grows them; a moved
    batch never aliases a buffer, so preparing the next batch cannot overwrite the one being trained."""
    mover = BatchMover(HOST, always=True)
    first = [torch.randn(100, 8), torch.arange(100, dtype=torch.int64), torch.arange(300, dtype=torch.int64) % 7]
    moved_first = mover.move(first)
    buffers = [b.data_ptr() for b in mover.host]
    second = [torch.randn(60, 8), torch.arange(60, dtype=torch.int64) + 5, torch.arange(0, dtype=torch.int64)]
    moved_second = mover.move(second)
    assert [b.data_ptr() for b in mover.host] == buffers  # smaller: the same buffers
    for sent, got in ((first, moved_first), (second, moved_second)):
        for a, b in zip(sent, got):
            assert torch.equal(a, b) and a.dtype == b.dtype and (a.numel() == 0 or b.data_ptr() != a.data_ptr())
    for got in moved_second:
        assert all(not (h.data_ptr() <= got.data_ptr() < h.data_ptr() + max(1, h.numel())) for h in mover.host)
    third = [torch.randn(500, 8), torch.arange(500, dtype=torch.int64), torch.arange(2000, dtype=torch.int64)]
    assert all(torch.equal(a, b) for a, b in zip(third, mover.move(third)))
    assert mover.host[0].numel() >= 500 * 8 * 4 and mover.host[0].data_ptr() != buffers[0]  # larger: grown
    assert mover.moved_bytes == sum(t.numel() * t.element_size() for t in first + second + third)
    unmoved = BatchMover(HOST)  # the CPU path: no copy at all
    assert all(a is b for a, b in zip(first, unmoved.move(first)))


def test_the_cpu_path_is_not_wrapped(monkeypatch):
    monkeypatch.delenv(STAGING_ENV, raising=False)
    comm = solo_comm()
    assert device_comm(comm, HOST) is comm
    monkeypatch.setenv(STAGING_ENV, "always")
    assert isinstance(device_comm(comm, HOST), StagedComm)
    monkeypatch.setenv(STAGING_ENV, "sometimes")
    with pytest.raises(ValueError, match="GNN_DIST_STAGING"):
        device_comm(comm, HOST)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the refusal cannot happen")
def test_cuda_without_a_gpu_is_refused_where_the_device_is_chosen():
    # The CLI's one line for --device cuda is pinned with the other bad options (tests/test_validation.py).
    with pytest.raises(ValueError, match="^no CUDA device visible: run with --device cpu$"):
        rank_device("cuda", solo_comm())
    assert rank_device("cpu", solo_comm()) == HOST


def test_the_native_kernels_refuse_a_tensor_that_is_not_on_the_host():
    native = native_module()
    if native is None:
        pytest.skip("native kernels unavailable (no C++ compiler)")
    crow = torch.tensor([0, 1], dtype=torch.int32)
    col = torch.tensor([0], dtype=torch.int32)
    values = torch.ones(1)
    elsewhere = torch.empty(1, 4, device="meta")  # a tensor with no host memory, as a CUDA one has none
    with pytest.raises(RuntimeError, match="csr_spmm: the native kernels serve CPU tensors only"):
        native.csr_spmm(crow, col, values, elsewhere, None)
    assert torch.equal(native.csr_spmm(crow, col, values, torch.ones(1, 4), None), torch.ones(1, 4))
    hashes = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="keyed_dropout: the native kernels serve CPU tensors only"):
        native.keyed_dropout(elsewhere, hashes, torch.zeros(4, dtype=torch.int32), 0, 2.0, False, False)


def _curve(path) -> tuple[list[float], int, float]:
    """(losses, halo bytes, test accuracy) of one run's metrics file."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r["loss"] for r in lines[:-1]], lines[-1]["halo_bytes_total"], lines[-1]["test_acc"]


def test_a_staged_run_is_bit_identical_to_an_unstaged_one(partitioned, tmp_path, monkeypatch):
    """Under mpiexec at P=2: every exchange of training (blocking and non-blocking collectives, point-to-point
    blocks, the gradient allreduce, sampled mode's fetches) through staging buffers gives the same losses, bytes
    and accuracy, bit for bit, as the run without staging."""
    parts = partitioned("synthetic:small", 2)
    configs = ["--schedule exact", "--schedule pipeline", "--halo-dtype int8", "--halo-memory sequential",
               "--schedule bns:0.5", "--mode sampled --fanouts 5,5,5 --batch-size 64"]
    results = {}
    for tag, staging in (("plain", "auto"), ("staged", "always")):
        monkeypatch.setenv(STAGING_ENV, staging)
        runs = [f"{c} --metrics-out {tmp_path / f'{tag}-{k}.jsonl'}" for k, c in enumerate(configs)]
        train_many(2, ["--parts", str(parts), "--epochs", "6", "--hidden", "16", "--num-layers", "3"], runs)
        results[tag] = {c: _curve(tmp_path / f"{tag}-{k}.jsonl") for k, c in enumerate(configs)}
    for config in configs:
        plain, staged = results["plain"][config], results["staged"][config]
        assert plain == staged, (config, plain, staged)
        assert plain[0][-1] < plain[0][0], config  # the loss moved: equal curves of a stalled run prove little
    # The host buffers the staged runs held, against the memory plan's bound for a GPU rank's pinned pool
    # (gnn_dist.plan.memory.staging_pool_bytes); the unstaged runs hold none.
    meta, shapes = load_meta(parts), part_shapes(parts)
    for k, config in enumerate(configs):
        plain_final = json.loads((tmp_path / f"plain-{k}.jsonl").read_text().splitlines()[-1])
        staged_final = json.loads((tmp_path / f"staged-{k}.jsonl").read_text().splitlines()[-1])
        assert plain_final["staging_host_bytes_per_rank"] is None, config
        held = staged_final["staging_host_bytes_per_rank"]
        assert len(held) == 2 and min(held) > 0, config
        if "sampled" in config:
            continue  # the plan covers full-batch training
        words = config.split()
        options = dict(zip(words[::2], words[1::2]))
        plan_config = PlanConfig(model=ModelConfig(hidden=16, num_layers=3), device="cuda",
                                 schedule=options.get("--schedule", "exact"),
                                 halo_memory=options.get("--halo-memory", "resident"))
        for rank, shape in enumerate(shapes):
            bound = staging_pool_bytes(shape, plan_config, meta.num_features, meta.num_classes)
            # an upper bound, and not a loose one: int8 halos send a quarter of what it counts in fp32
            floor = 0.2 if "int8" in config else 0.6
            assert floor * bound <= held[rank] <= bound, (config, rank, held[rank], bound)
