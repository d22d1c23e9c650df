"""Property: any small graph partitions and trains one epoch at P = 1 and 2 with the same loss."""
from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings
from hypothesis import strategies as st

from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import ModelConfig, TrainConfig
from gnn_dist.context import RankContext
from gnn_dist.partition.graph import Graph, random_split, symmetrize
from gnn_dist.partition.partitioner import partition_graph
from gnn_dist.training import setup


@st.composite
def small_graphs(draw):
    n = draw(st.integers(1, 24))
    m = draw(st.integers(0, 60))
    edges = np.array(draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), min_size=m,
                                   max_size=m)), dtype=np.int64).reshape(-1, 2).T  # self loops and duplicates allowed
    seed = draw(st.integers(0, 1000))
    rng = np.random.default_rng(seed)
    train, val, test = random_split(n, seed, (0.5, 0.25, 0.25))
    graph = Graph("prop", symmetrize(edges.reshape(2, -1), n), rng.standard_normal((n, 3)).astype(np.float32),
                  rng.integers(0, 3, n).astype(np.int64), train, val, test, 3)
    return graph, draw(st.integers(1, min(n, 4))), draw(st.sampled_from(["gcn", "sage"]))


def one_epoch_loss(directory, num_parts, model):
    config = TrainConfig(parts=str(directory), progress=False, timeout=0,
                         model=ModelConfig(model=model, hidden=4, num_layers=2, dropout=0.5))

    def rank_fn(comm):
        return setup(RankContext(comm), config).mode.train_epoch(0)["loss"]

    return run_fake_ranks(num_parts, rank_fn)[0]


@settings(max_examples=30, deadline=None)
@given(small_graphs())
def test_any_small_graph_trains_the_same_on_one_and_more_ranks(tmp_path_factory, case):
    graph, num_parts, model = case
    base = tmp_path_factory.mktemp("prop")
    partition_graph(graph, 1, base / "p1")
    partition_graph(graph, num_parts, base / "pn")
    single = one_epoch_loss(base / "p1", 1, model)
    multi = one_epoch_loss(base / "pn", num_parts, model)
    assert np.isfinite(single)
    assert multi == pytest.approx(single, rel=1e-5, abs=1e-6)

