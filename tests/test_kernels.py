"""CSR SpMM against a dense reference, and its gradient by gradcheck."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.spmm import SparseOperator, spmm


def random_operator(n_rows, n_cols, density, dtype, seed, empty_rows=()):
    rng = np.random.default_rng(seed)
    dense = (rng.random((n_rows, n_cols)) < density) * rng.standard_normal((n_rows, n_cols))
    for r in empty_rows:
        dense[r] = 0
    rows, cols = np.nonzero(dense)
    op = SparseOperator.from_coo(torch.from_numpy(rows), torch.from_numpy(cols),
                                 torch.from_numpy(dense[rows, cols]).to(dtype), (n_rows, n_cols))
    return op, torch.from_numpy(dense).to(dtype)


@pytest.mark.parametrize("n_rows, n_cols, width", [(7, 7, 1), (20, 35, 5), (33, 33, 17), (1, 4, 3), (50, 80, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_and_backward_match_dense(n_rows, n_cols, width, dtype):
    op, dense = random_operator(n_rows, n_cols, 0.3, dtype, seed=n_rows * width, empty_rows=(0,))
    x = torch.randn(n_cols, width, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    y = spmm(op, x)
    y_ref = dense @ x_ref
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(y, y_ref, atol=tol)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    assert torch.allclose(x.grad, x_ref.grad, atol=tol)


def test_no_halo_columns_and_empty_matrix():
    op, dense = random_operator(6, 6, 0.0, torch.float32, seed=1)
    x = torch.randn(6, 3)
    assert torch.equal(spmm(op, x), torch.zeros(6, 3))
    empty = SparseOperator.from_coo(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                                    torch.zeros(0), (0, 5))
    assert spmm(empty, torch.randn(5, 2)).shape == (0, 2)


def test_non_contiguous_input():
    op, dense = random_operator(10, 12, 0.4, torch.float32, seed=2)
    x = torch.randn(5, 12).t()  # [12, 5], not contiguous
    assert not x.is_contiguous()
    assert torch.allclose(spmm(op, x), dense @ x, atol=1e-6)


def test_from_csr_with_unsorted_columns():
    indptr = np.array([0, 2, 2, 5])
    indices = np.array([3, 0, 2, 1, 0])
    values = np.array([1.0, 2.0, 3.0, 4.0, 5.0], dtype=np.float32)
    op = SparseOperator.from_csr(indptr, indices, values, (3, 4))
    expected = torch.tensor([[2.0, 0, 0, 1], [0, 0, 0, 0], [5, 4, 3, 0]])
    assert torch.equal(op.to_dense(), expected)
    assert torch.equal(op.transpose.to_dense(), expected.t())


def test_gradcheck():
    op, _ = random_operator(8, 11, 0.4, torch.float64, seed=3)
    x = torch.randn(11, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: spmm(op, t), (x,))


def test_shape_mismatch_is_an_error():
    op, _ = random_operator(4, 5, 0.5, torch.float32, seed=4)
    with pytest.raises(ValueError, match="5 columns"):
        spmm(op, torch.randn(4, 2))
