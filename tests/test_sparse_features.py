"""The sparse first layer (gnn_dist.nn.sparse_features): mostly-zero input features multiply from a CSR copy, with
PyG's logits, loss and gradients on the whole graph; input dropout drawn on the copy's non-zeros equals the
dense dropped-out product; only where the first layer is handed the features themselves; and the memory plan
counts the copy."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from gnn_dist.config import ModelConfig, TrainConfig
from gnn_dist.nn import sparse_features
from gnn_dist.partition.datasets import load_dataset
from gnn_dist.partition.format import load_meta, part_shapes
from gnn_dist.partition.partitioner import partition_graph
from gnn_dist.plan.memory import plan_config_of, plan_phases
from tests.test_halo_fake import assert_equal_to_pyg, one_step_on_every_rank


def bag_of_words_tiny():
    """synthetic:tiny (400 nodes, 16 features) with 96% of its feature entries zeroed, as word counts are."""
    graph = load_dataset("synthetic:tiny")
    keep = np.random.default_rng(7).random(graph.x.shape) < 0.04
    return dataclasses.replace(graph, x=np.where(keep, graph.x, 0.0).astype(np.float32))


@pytest.fixture
def copies_made(monkeypatch):
    """The shapes of the sparse copies the ranks built; `.products` counts the products taken from one."""
    made = CopiesMade()
    original_of, original_spmm = sparse_features.SparseFeatures.of.__func__, sparse_features.spmm

    def counting_of(cls, x_full):
        made.append(x_full.shape)
        return original_of(cls, x_full)

    def counting_spmm(operator, x, *rest):
        made.products += 1
        return original_spmm(operator, x, *rest)

    monkeypatch.setattr(sparse_features.SparseFeatures, "of", classmethod(counting_of))
    monkeypatch.setattr(sparse_features, "spmm", counting_spmm)
    return made


class CopiesMade(list):
    products = 0


def config_for(directory, model_name="gcn", **changes) -> TrainConfig:
    # 16 features -> 8: the first layer multiplies before it aggregates
    config = TrainConfig(parts=str(directory), epochs=0, progress=False, seed=3,
                         model=ModelConfig(model=model_name, hidden=8, num_layers=2, dropout=0.0))
    return dataclasses.replace(config, **changes)


@pytest.mark.parametrize("model", ["gcn", "sage"])
@pytest.mark.parametrize("num_parts", [1, 3])
def test_the_sparse_first_layer_equals_pyg_on_the_whole_graph(tmp_path, copies_made, model, num_parts):
    graph = bag_of_words_tiny()
    partition_graph(graph, num_parts, tmp_path / "p")
    assert load_meta(tmp_path / "p").feature_density == pytest.approx(np.count_nonzero(graph.x) / graph.x.size)
    config = config_for(tmp_path / "p", model)
    results = one_step_on_every_rank(config, num_parts)
    assert len(copies_made) == num_parts  # every rank built the copy, and multiplied from it (twice: one step, then
    assert copies_made.products == 2 * num_parts  # the logits one_step_on_every_rank reads)
    assert_equal_to_pyg(results, config, graph)


@pytest.mark.parametrize("changes", [
    {"model": ModelConfig(model="sage", hidden=8, num_layers=2, dropout=0.5)},  # dropout, and a root term reads X
    {"halo_memory": "sequential"},                                               # owned and halo rows apart
    {"model": ModelConfig(model="gcn", hidden=32, num_layers=2, dropout=0.0)},  # 16 -> 32 aggregates first
    {"model": ModelConfig(model="gat", hidden=8, num_layers=2, dropout=0.0)},   # its own fused transform
    {"feature_dtype": "fp16"},
])
def test_no_copy_where_the_first_layer_is_not_handed_the_features_themselves(tmp_path, copies_made, changes):
    partition_graph(bag_of_words_tiny(), 2, tmp_path / "p")
    config = config_for(tmp_path / "p", **changes)
    one_step_on_every_rank(config, 2)
    assert copies_made == []
    assert "sparse input features" not in plan_phases(part_shapes(tmp_path / "p")[0], plan_config_of(config), 16,
                                                      4)["train"].parts


def test_dropping_out_the_copy_equals_the_keyed_mask_on_the_dense_features():
    """dropped_out against keep_mask, drawn on the whole dense matrix (gnn_dist.nn.dropout's independent torch
    formulation): kept entries scaled, dropped ones zero, the transpose the same matrix transposed."""
    from gnn_dist.nn.dropout import keep_mask

    x = torch.from_numpy(bag_of_words_tiny().x)
    row_ids = torch.randperm(10_000)[:x.shape[0]]  # original ids: not the row numbers
    dropped = sparse_features.SparseFeatures.of(x).dropped_out(row_ids, key=12345, p=0.4)
    expected = x * keep_mask(row_ids, x.shape[1], 12345, 0.4) / 0.6
    assert dropped.dense is x
    assert torch.allclose(dropped.operator.matrix.to_dense(), expected, rtol=1e-6, atol=0)
    assert torch.allclose(dropped.operator.transpose.to_dense(), expected.t(), rtol=1e-6, atol=0)
    assert 0 < int((dropped.operator.matrix.values() == 0).sum()) < dropped.operator.nnz  # some kept, some dropped


@pytest.mark.parametrize("num_parts", [1, 3])
def test_input_dropout_on_the_copy_trains_as_the_dense_path_does(tmp_path, copies_made, monkeypatch, num_parts):
    """GCN with input dropout 0.5: one step from the copy (the mask drawn at the non-zeros) and one from the dense
    features (the mask drawn on every element) give the same train-mode logits, loss and gradients."""
    partition_graph(bag_of_words_tiny(), num_parts, tmp_path / "p")
    config = config_for(tmp_path / "p", model=ModelConfig(model="gcn", hidden=8, num_layers=2, dropout=0.5))
    sparse = one_step_on_every_rank(config, num_parts)
    assert len(copies_made) == num_parts and copies_made.products >= num_parts
    monkeypatch.setattr(sparse_features, "wanted", lambda *args: False)
    dense = one_step_on_every_rank(config, num_parts)
    assert len(copies_made) == num_parts  # the second run made none
    for (ids, logits, loss, _, grads, _), (dense_ids, dense_logits, dense_loss, _, dense_grads, _) in zip(sparse, dense):
        assert torch.equal(ids, dense_ids)
        assert torch.allclose(logits, dense_logits, rtol=1e-5, atol=1e-6)
        assert loss == pytest.approx(dense_loss, rel=1e-6)
        for name, grad in grads.items():
            assert torch.allclose(grad, dense_grads[name], rtol=1e-5, atol=1e-6), name
    # and dropout was really on: the train-mode logits differ from those of the same weights without it
    undropped = one_step_on_every_rank(dataclasses.replace(config, model=dataclasses.replace(config.model,
                                                                                           dropout=0.0)), num_parts)
    assert not torch.allclose(sparse[0][1], undropped[0][1], atol=1e-3)


def test_dense_features_get_no_copy(partitioned, copies_made):
    one_step_on_every_rank(config_for(partitioned("synthetic:tiny", 2)), 2)
    assert copies_made == []


def test_the_memory_plan_counts_the_copy(tmp_path):
    graph = bag_of_words_tiny()
    partition_graph(graph, 1, tmp_path / "p")
    config = config_for(tmp_path / "p")
    train = plan_phases(part_shapes(tmp_path / "p")[0], plan_config_of(config), graph.num_features,
                        graph.num_classes)["train"]
    planned = train.parts["sparse input features"]  # kept through training: among what is alive at its peak
    features = sparse_features.SparseFeatures.of(torch.from_numpy(graph.x))
    operator = features.operator
    built = sum(t.nbytes for m in (operator.matrix, operator.transpose)
                for t in (m.crow_indices(), m.col_indices(), m.values())) + features.transpose_order.nbytes
    assert planned == pytest.approx(built, rel=0.02)


def test_layerwise_evaluation_takes_the_dense_path_and_agrees(tmp_path, copies_made):
    """Evaluation hands the first layer slices of the features (owned rows, halo rows, chunk by chunk): they must
    take the dense product, and the logits equal the full forward's, which took the sparse one."""
    from gnn_dist.comm.simulated_ranks import run_fake_ranks
    from gnn_dist.context import RankContext
    from gnn_dist.training import setup

    partition_graph(bag_of_words_tiny(), 2, tmp_path / "p")
    config = config_for(tmp_path / "p")

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        state.model.eval()
        with torch.no_grad():
            whole = state.model(state.x_full)
            chunked = state.model.forward_layerwise(state.x_full, 50)
        return whole, chunked

    for whole, chunked in run_fake_ranks(2, rank_fn):
        assert torch.allclose(whole, chunked, rtol=1e-5, atol=1e-6)
    assert len(copies_made) == 2 and copies_made.products == 2  # one per rank's whole forward; the chunks took none
