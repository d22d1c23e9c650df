"""Sparse input features: the first layer's X @ W^T from a CSR copy of X, when X is mostly zeros.

Bag-of-words features (Planetoid's word counts: 98.7% zeros on Cora) make the first layer's dense product
[n, F] x [F, H] the largest cost of a small graph's epoch, and its weight gradient X^T dY another of the same
size. From a CSR copy of X both become products over X's non-zeros with the aggregation's own kernel
(kernels/spmm.py: the weight gradient is the backward of spmm(X, W^T), a product with the CSR of X^T).

The dense X stays: every other reader uses it (SAGE's root term, layer-wise evaluation's chunks, sampled
batches, checkpoints' fingerprints). The copy serves exactly the tensor it was made from (`dense`), so a
slice or a converted copy of the features takes the dense path. It is made (`wanted`) for full-batch
training with resident halos when the partition recorded its features' density (meta.json feature_density)
at or below MAX_DENSITY, the features are fp32, and the first layer multiplies before it aggregates (GCN,
SAGE) instead of aggregating first; the memory plan counts it (copy_bytes, dropped_bytes).

Input dropout (Kipf and Welling's recipe on Planetoid) runs on the copy too: a dropped element of X is
zero whether or not it was drawn, so the keyed mask is drawn at X's non-zeros only (`dropped_out`: the same
mask gnn_dist.nn.dropout draws on the dense matrix, read at those entries) and the product takes the copy's
structure with the kept values scaled. No dense dropped-out copy of X is made, and its n x F draw, product
and weight gradient become work over the non-zeros. A layer that also reads its rows' own input (SAGE's
root term) would need the dense dropped-out rows as well, so with dropout the copy is made only for layers
without one (GCN).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gnn_dist.kernels.spmm import SparseOperator, spmm
from gnn_dist.nn.dropout import keep_entries

# Above this density the CSR copy (8 bytes per non-zero, twice) outgrows a fifth of the dense features and
# the sparse product gains little over a dense one.
MAX_DENSITY = 0.05


@dataclass(frozen=True)
class SparseFeatures:
    dense: torch.Tensor            # x_full, [n_owned + n_halo, F]: the one tensor multiplied sparsely
    operator: SparseOperator       # the same matrix and its transpose, CSR
    transpose_order: torch.Tensor  # [nnz]: the matrix entry at each entry of the transpose (for new values)

    @classmethod
    def of(cls, x_full: torch.Tensor) -> SparseFeatures:
        rows, cols = torch.nonzero(x_full, as_tuple=True)  # row-major: already the matrix's CSR order
        operator = SparseOperator.from_coo(rows, cols, x_full[rows, cols], tuple(x_full.shape))
        # The transpose holds the entries sorted by (column, row), the stable sort SparseOperator made for it.
        transpose_order = torch.argsort(cols * max(x_full.shape[0], 1) + rows, stable=True)
        return cls(x_full, operator, transpose_order)

    def dropped_out(self, row_ids: torch.Tensor, key: int, p: float) -> SparseFeatures:
        """The copy with the keyed dropout of gnn_dist.nn.dropout applied (rows keyed by their original ids
        row_ids), for the same dense tensor: kept non-zeros scaled by 1 / (1 - p), dropped ones zero."""
        matrix = self.operator.matrix
        crow = matrix.crow_indices().to(torch.int64)
        rows = torch.repeat_interleave(torch.arange(matrix.shape[0], device=crow.device), crow.diff())
        kept = keep_entries(row_ids, rows, matrix.col_indices().to(torch.int64), matrix.shape[1], key, p)
        # values * kept, then * scale: the dense path's arithmetic, so a kept element is the same float there
        values = (matrix.values() * kept).mul_(1.0 / (1.0 - p))
        return SparseFeatures(self.dense, self.operator.with_values(values, self.transpose_order),
                              self.transpose_order)


def wanted(config, feature_density: float | None, conv_class, in_dim: int, out_dim: int) -> bool:
    """Whether a rank builds the sparse copy; the memory plan asks the same question. config: a TrainConfig or
    the memory plan's PlanConfig (feature_dtype, mode, halo_memory, model.dropout).

    Only where the first layer is handed the features themselves: resident halos (sequential mode hands it the
    owned and halo rows apart), and, with input dropout, a layer that reads the features only through its
    transform (a root term would need the dense dropped-out rows too)."""
    return (feature_density is not None and feature_density <= MAX_DENSITY and config.feature_dtype == "fp32"
            and config.mode == "full" and config.halo_memory == "resident"
            and (config.model.dropout == 0 or not conv_class.needs_root)
            and conv_class.takes_sparse_input and not conv_class.aggregation(in_dim, out_dim)[0])


def _entries(n_rows: int, num_features: int, feature_density: float) -> tuple[int, int]:
    """(expected non-zeros, bytes per index: int32 below 2**31 entries)."""
    nnz = int(n_rows * num_features * feature_density)
    return nnz, 4 if max(nnz, n_rows, num_features) < 2**31 else 8


def copy_bytes(n_rows: int, num_features: int, feature_density: float) -> int:
    """Expected bytes of the copy: X and X^T as CSR, each a value and a column index per non-zero and a row
    pointer per row, and the transpose's entry order (int64 per non-zero)."""
    nnz, index = _entries(n_rows, num_features, feature_density)
    return 2 * nnz * (4 + index) + (n_rows + num_features + 2) * index + nnz * 8


def dropped_bytes(n_rows: int, num_features: int, feature_density: float) -> int:
    """Expected bytes a training step keeps of a dropped-out copy (dropped_out): the new values of X and X^T."""
    return 2 * _entries(n_rows, num_features, feature_density)[0] * 4


def linear(h: torch.Tensor, weight: torch.Tensor, features: SparseFeatures | None) -> torch.Tensor:
    """h @ weight^T, from the sparse copy when h is the tensor it mirrors."""
    if features is not None and h is features.dense:
        return spmm(features.operator, weight.t())
    return h @ weight.t()
