"""Sparse input features: the first layer's X @ W^T from a CSR copy of X, when X is mostly zeros.

Bag-of-words features (Planetoid's word counts: 98.7% zeros on Cora) make the first layer's dense product
[n, F] x [F, H] the largest cost of a small graph's epoch, and its weight gradient X^T dY another of the same
size. From a CSR copy of X both become products over X's non-zeros with the aggregation's own kernel
(kernels/spmm.py: the weight gradient is the backward of spmm(X, W^T), a product with the CSR of X^T).

The dense X stays: every other reader uses it (SAGE's root term, layer-wise evaluation's chunks, sampled
batches, checkpoints' fingerprints). The copy serves exactly the tensor it was made from (`dense`), so a
slice, a dropped-out or a converted copy of the features takes the dense path. It is made (`wanted`) for
full-batch training with resident halos and no dropout (link prediction's usual recipe) when the partition
recorded its features' density (meta.json feature_density) at or below MAX_DENSITY, the features are fp32,
and the first layer multiplies before it aggregates (GCN, SAGE) instead of aggregating first; the memory
plan counts it (copy_bytes).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gnn_dist.kernels.spmm import SparseOperator, spmm

# Above this density the CSR copy (8 bytes per non-zero, twice) outgrows a fifth of the dense features and
# the sparse product gains little over a dense one.
MAX_DENSITY = 0.05


@dataclass(frozen=True)
class SparseFeatures:
    dense: torch.Tensor        # x_full, [n_owned + n_halo, F]: the one tensor multiplied sparsely
    operator: SparseOperator   # the same matrix and its transpose, CSR

    @classmethod
    def of(cls, x_full: torch.Tensor) -> SparseFeatures:
        rows, cols = torch.nonzero(x_full, as_tuple=True)
        return cls(x_full, SparseOperator.from_coo(rows, cols, x_full[rows, cols], tuple(x_full.shape)))


def wanted(config, feature_density: float | None, conv_class, in_dim: int, out_dim: int) -> bool:
    """Whether a rank builds the sparse copy; the memory plan asks the same question. config: a TrainConfig or
    the memory plan's PlanConfig (feature_dtype, mode, halo_memory, model.dropout).

    Only where the first layer is handed the features themselves: resident halos (sequential mode hands it the
    owned and halo rows apart) without input dropout (a dropped-out copy is a new dense tensor)."""
    return (feature_density is not None and feature_density <= MAX_DENSITY and config.feature_dtype == "fp32"
            and config.mode == "full" and config.halo_memory == "resident" and config.model.dropout == 0
            and conv_class.takes_sparse_input and not conv_class.aggregation(in_dim, out_dim)[0])


def copy_bytes(n_rows: int, num_features: int, feature_density: float) -> int:
    """Expected bytes of the copy: X and X^T as CSR, each a value and a column index per non-zero (int32 below
    2**31 entries) and a row pointer per row."""
    nnz = int(n_rows * num_features * feature_density)
    index = 4 if max(nnz, n_rows, num_features) < 2**31 else 8
    return 2 * nnz * (4 + index) + (n_rows + num_features + 2) * index


def linear(h: torch.Tensor, weight: torch.Tensor, features: SparseFeatures | None) -> torch.Tensor:
    """h @ weight^T, from the sparse copy when h is the tensor it mirrors."""
    if features is not None and h is features.dense:
        return spmm(features.operator, weight.t())
    return h @ weight.t()
