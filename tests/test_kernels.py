"""CSR SpMM against a dense reference, and its gradient by gradcheck."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import gnn_dist.kernels.native as native
from gnn_dist.kernels.spmm import SparseOperator, spmm


@pytest.fixture(params=["native", "torch"], autouse=True)
def kernel(request, monkeypatch):
    """Every test runs against the native kernel and the forced torch fallback."""
    monkeypatch.setenv(native.KERNEL_ENV, request.param)
    if request.param == "native":
        native.native_module()  # builds once per machine; a failure here fails the test (env says native)
    return request.param


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
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: spmm(op, t), (x,))
    assert torch.autograd.gradcheck(lambda t, b: spmm(op, t, b), (x, bias))


@pytest.mark.parametrize("width", [1, 3, 8, 17, 33])
def test_fused_bias_matches_dense(width):
    op, dense = random_operator(30, 40, 0.2, torch.float32, seed=width, empty_rows=(3, 4))
    x = torch.randn(40, width)
    bias = torch.randn(width)
    assert torch.allclose(spmm(op, x, bias), dense @ x + bias, atol=1e-5)


def test_fallback_warns_once_when_the_build_fails(monkeypatch):
    import torch.utils.cpp_extension as cpp

    monkeypatch.setenv(native.KERNEL_ENV, "auto")
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_failed", None)

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(cpp, "load", no_compiler)
    # A machine without a compiler has no earlier build either: nothing to load from the build cache.
    monkeypatch.setattr(native, "_load_built", lambda *args: None)
    op, dense = random_operator(10, 10, 0.3, torch.float32, seed=9)
    x = torch.randn(10, 4)
    with pytest.warns(UserWarning, match="native CSR kernel unavailable"):
        out = spmm(op, x)
    assert torch.allclose(out, dense @ x, atol=1e-5)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spmm(op, x)  # no second warning
    monkeypatch.setenv(native.KERNEL_ENV, "native")
    with pytest.raises(RuntimeError, match="could not be built"):
        spmm(op, x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_path_matches_dense():
    op, dense = random_operator(50, 60, 0.2, torch.float32, seed=5)
    cuda_op = SparseOperator(op.matrix.cuda(), op.transpose.cuda())
    x = torch.randn(60, 16, device="cuda", requires_grad=True)
    y = spmm(cuda_op, x)
    assert torch.allclose(y.cpu(), dense @ x.detach().cpu(), atol=1e-4)
    y.sum().backward()
    assert torch.allclose(x.grad.cpu(), dense.t() @ torch.ones(50, 16), atol=1e-4)


def test_shape_mismatch_is_an_error():
    op, _ = random_operator(4, 5, 0.5, torch.float32, seed=4)
    with pytest.raises(ValueError, match="5 columns"):
        spmm(op, torch.randn(4, 2))


@pytest.mark.parametrize("at", [0, 1, 17, 40])
def test_row_slices_and_column_splits_recompose_the_dense_product(at):
    generator = torch.Generator().manual_seed(at)
    dense = torch.rand(30, 40, generator=generator) * (torch.rand(30, 40, generator=generator) < 0.2)
    dense[5] = 0  # an empty row
    op = SparseOperator.from_coo(*dense.nonzero().t(), dense[dense != 0], (30, 40))
    x = torch.randn(40, 6, generator=generator, dtype=torch.float64).float()
    rows = op.row_slice(7, 23)
    assert rows.transpose is None and rows.shape == (16, 40)
    assert torch.allclose(spmm(rows, x), dense[7:23] @ x, atol=1e-6)
    left, right = rows.split_columns(at)
    assert left.shape == (16, at) and right.shape == (16, 40 - at)
    assert torch.allclose(spmm(left, x[:at]) + spmm(right, x[at:]), dense[7:23] @ x, atol=1e-6)
    with pytest.raises(RuntimeError, match="forward-only"):
        spmm(left, x[:at].clone().requires_grad_(True)).sum().backward()


def test_a_build_lock_left_by_a_killed_build_is_removed_and_a_fresh_one_kept(tmp_path):
    # torch waits without a bound for its build lock to go; a killed first build would hang every later run
    lock = tmp_path / "lock"
    assert native._remove_stale_build_lock(lock) is False  # nothing is building
    lock.touch()
    assert native._remove_stale_build_lock(lock) is False and lock.exists()  # a build may be running now
    old = lock.stat().st_mtime - native.STALE_BUILD_LOCK_S - 1
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="did not finish"):
        assert native._remove_stale_build_lock(lock) is True
    assert not lock.exists()


@pytest.mark.parametrize("at", [0, 13, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_owned_and_halo_entry_ranges_recompose_the_dense_product_and_its_transpose(at, dtype):
    from gnn_dist.halo.overlap import OwnedHaloSplit
    from gnn_dist.kernels.spmm import spmm_into

    op, dense = random_operator(30, 40, 0.25, dtype, seed=at, empty_rows=(4, 11))
    split = OwnedHaloSplit.of(op, at)
    x = torch.randn(40, 6, dtype=dtype)
    bias = torch.randn(6, dtype=dtype)
    out = torch.full((30, 6), float("nan"), dtype=dtype)
    # the owned columns' share in two row ranges (written over what was there, bias included), then the halo's
    for a, b in ((0, 9), (9, 30)):
        spmm_into(op.matrix, split.begin[a:b], split.mid[a:b], x[:at], out[a:b], bias=bias)
    assert torch.allclose(out, dense[:, :at] @ x[:at] + bias, atol=1e-5)
    spmm_into(op.matrix, split.mid, split.end, x[at:], out, col_offset=at, accumulate=True)
    assert torch.allclose(out, dense @ x + bias, atol=1e-5)
    # the transpose's rows [at, 40): the halo columns' gradient alone
    grad = torch.randn(30, 6, dtype=dtype)
    halo_grad = torch.empty(40 - at, 6, dtype=dtype)
    spmm_into(op.transpose, *split.halo_gradient_rows(), grad, halo_grad)
    assert torch.allclose(halo_grad, dense[:, at:].t() @ grad, atol=1e-5)
    with pytest.raises(ValueError, match="accumulating"):
        spmm_into(op.matrix, split.mid, split.end, x[at:], out, col_offset=at, bias=bias, accumulate=True)


def test_an_operator_whose_rows_are_not_sorted_by_column_cannot_be_split():
    from gnn_dist.halo.overlap import OwnedHaloSplit
    from gnn_dist.kernels.spmm import _csr_tensor

    crow, cols = torch.tensor([0, 2, 3]), torch.tensor([3, 0, 1])  # row 0 lists its halo column 3 first
    matrix = _csr_tensor(crow, cols, torch.ones(3), (2, 4))
    with pytest.raises(ValueError, match="sorted"):
        OwnedHaloSplit.of(SparseOperator(matrix=matrix, transpose=None), 2)
    assert [r.tolist() for r in SparseOperator(matrix=matrix, transpose=None).column_ranges(4)] == \
        [[0, 2], [2, 3], [2, 3]]  # every column left of 4: nothing to check
