"""The torch formulations of every kernel (GNN_DIST_KERNEL=torch: sparse CSR products, the edge softmax and
aggregation of GAT (by edge chunks, no [E x H x C] product: tests/test_gat.py), keyed dropout with torch
integer ops) held to the same exactness tests against PyG as the native kernels: GCN and SAGE at P = 1 and 3,
GAT at P = 1, 2 and 4, the sampled step of each model. These are the formulations a device without the C++
kernels runs, so CI exercises them here. The tests are the ones of test_halo_fake, test_gat and test_sampled,
collected again in this module, where every test runs with the native kernels switched off."""
from __future__ import annotations

import pytest
import torch

from gnn_dist.kernels.native import native_module
from gnn_dist.nn.dropout import keep_mask, keyed_dropout
from tests.test_gat import test_distributed_gat_equals_pyg_on_the_whole_graph  # noqa: F401
from tests.test_halo_fake import test_distributed_model_equals_pyg_on_the_whole_graph  # noqa: F401
from tests.test_sampled import test_a_sampled_step_equals_pyg_on_the_same_blocks  # noqa: F401


@pytest.fixture(autouse=True)
def torch_kernels(monkeypatch):
    monkeypatch.setenv("GNN_DIST_KERNEL", "torch")
    assert native_module() is None


def test_the_torch_dropout_mask_is_the_native_mask_bit_for_bit(monkeypatch):
    """The same keyed hash with torch integer ops: the same kept elements and the same scaled values."""
    monkeypatch.delenv("GNN_DIST_KERNEL")
    if native_module() is None:
        pytest.skip("native kernels unavailable (no C++ compiler): nothing to compare the torch mask with")
    ids = torch.arange(0, 3000, 7, dtype=torch.int64) * 1_000_003
    x = torch.randn(len(ids), 37)
    native = keyed_dropout(x, ids, key=12345, p=0.3, training=True, relu=True)
    monkeypatch.setenv("GNN_DIST_KERNEL", "torch")
    torch_made = keyed_dropout(x, ids, key=12345, p=0.3, training=True, relu=True)
    assert torch.equal(native, torch_made)
    assert torch.equal(torch_made != 0, keep_mask(ids, 37, 12345, 0.3) & (x > 0))
