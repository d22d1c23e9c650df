"""The modelled network of --simulate-link: an exchange of B bytes takes at least latency + B / bandwidth,
non-blocking exchanges stay non-blocking, results do not change, and a run that does not ask is not wrapped."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from gnn_dist.comm.simulated_link import LinkModel, ModelledLinkComm
from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import ModelConfig, TrainConfig
from gnn_dist.context import RankContext
from gnn_dist.training import setup, train

LINK = LinkModel(gbps=0.1, latency_us=2000)  # 12.5 MB/s and 2 ms: slow enough to measure on a busy host


def test_the_link_spec_is_parsed_and_checked():
    assert LinkModel.parse("10") == LinkModel(10.0, 0.0)
    assert LinkModel.parse("10,5") == LinkModel(10.0, 5.0)
    assert LinkModel(10, 5).seconds(1_250_000_000) == pytest.approx(1.0 + 5e-6)
    for bad in ("0", "-1", "x", "10,-1", "1,2,3"):
        with pytest.raises(ValueError, match="bad --simulate-link"):
            LinkModel.parse(bad)
    with pytest.raises(ValueError, match="bad --simulate-link"):
        TrainConfig(parts="unused", simulate_link="fast").validate()


def exchange_rows_timed(comm, rows: int, blocking: bool):
    send = torch.ones(rows, 250)  # 1000 bytes per row
    counts = np.array([0, rows]) if comm.rank == 0 else np.array([rows, 0])
    recv = torch.empty(rows, 250)
    start = time.perf_counter()
    if blocking:
        sent = comm.alltoallv(send, counts, recv, counts)
        return sent, time.perf_counter() - start, None
    pending, sent = comm.ialltoallv(send, counts, recv, counts)
    returned = time.perf_counter() - start
    pending.wait()
    return sent, time.perf_counter() - start, returned


@pytest.mark.parametrize("blocking", [True, False])
def test_an_exchange_of_b_bytes_takes_at_least_b_over_the_bandwidth(blocking):
    results = run_fake_ranks(2, lambda comm: exchange_rows_timed(ModelledLinkComm(comm, LINK), 2000, blocking))
    for sent, elapsed, returned in results:
        assert sent == 2_000_000
        assert elapsed >= LINK.seconds(sent) - 1e-3  # 0.162 s for 2 MB at 0.1 Gb/s plus 2 ms
        if not blocking:
            assert returned < LINK.seconds(sent) / 2  # the exchange is in flight, not waited for


def test_an_allreduce_is_held_to_a_rings_bytes():
    def rank_fn(comm):
        modelled = ModelledLinkComm(comm, LINK)
        tensor = torch.ones(1_000_000)
        start = time.perf_counter()
        modelled.allreduce_(tensor)
        return time.perf_counter() - start, float(tensor[0])

    for elapsed, value in run_fake_ranks(2, rank_fn):
        assert value == 2.0
        assert elapsed >= LINK.seconds(4_000_000) - 1e-3  # ring: 2 (P - 1) / P of 4 MB at P = 2


def test_a_modelled_run_computes_the_same_and_says_it_is_modelled(partitioned):
    directory = partitioned("synthetic:tiny", 2)
    base = dict(parts=str(directory), model=ModelConfig(hidden=8), epochs=3, progress=False, timeout=0)
    plain = run_fake_ranks(2, lambda comm: train(RankContext(comm), TrainConfig(**base)))
    modelled = run_fake_ranks(2, lambda comm: train(RankContext(comm), TrainConfig(**base, simulate_link="1,50")))
    assert plain[0]["simulated_link"] is None
    assert modelled[0]["simulated_link"] == "1 Gb/s, 50 us latency (modelled)"
    for key in ("test_acc", "halo_bytes_total", "allreduce_bytes_total"):
        assert modelled[0][key] == plain[0][key]
    # a run that does not ask for the model talks to its communicator directly
    wrapped = run_fake_ranks(2, lambda comm: type(setup(RankContext(comm), TrainConfig(**base)).exchanger.comm))
    assert ModelledLinkComm not in wrapped
