"""CSR sparse-dense matrix product with autograd: the one aggregation primitive.

Every layer aggregates with Y = A @ X, where A is a rank's local matrix
(rows: owned nodes; columns: [owned | halo]) with the layer's normalisation
folded into its values. The backward is dX = A^T @ dY; A^T is built once when
the operator is made, not per step. A's values are constants (the graph is
not learnt), so no gradient flows to them.

The dispatcher runs the native row-parallel kernel (kernels/native.py,
compiled on first use) for float32/float64 CPU tensors, torch's sparse CSR
kernels on CUDA and as the fallback (the tests compare both with a dense product).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from gnn_dist.kernels.native import native_module


@dataclass(frozen=True)
class SparseOperator:
    """A fixed sparse matrix A [n_rows, n_cols] and its transpose, both CSR.

    A forward-only operator (transpose None: row slices and the row chunks of
    layer-wise evaluation) costs half the memory; spmm refuses to
    differentiate through it.

    Shapes:
        matrix: [n_rows, n_cols]; transpose: [n_cols, n_rows] or None
    """

    matrix: torch.Tensor
    transpose: torch.Tensor | None
    # column_ranges(at), kept: training's overlapped exchange and evaluation's chunks ask for the same split
    _column_ranges: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.matrix.shape)  # type: ignore[return-value]

    @property
    def nnz(self) -> int:
        return int(self.matrix.values().numel())

    @classmethod
    def from_csr(cls, indptr: np.ndarray | torch.Tensor, indices: np.ndarray | torch.Tensor,
                 values: np.ndarray | torch.Tensor, shape: tuple[int, int],
                 dtype: torch.dtype = torch.float32) -> SparseOperator:
        """Build from CSR arrays; column indices inside a row need not be sorted. Numpy arrays land on the host,
        tensors stay where they are."""
        device = indptr.device if isinstance(indptr, torch.Tensor) else torch.device("cpu")
        indptr = torch.as_tensor(indptr, dtype=torch.int64, device=device)
        indices = torch.as_tensor(indices, dtype=torch.int64, device=device)
        values = torch.as_tensor(values, dtype=dtype, device=device)
        n_rows, n_cols = shape
        rows = torch.repeat_interleave(torch.arange(n_rows, dtype=torch.int64, device=device), indptr[1:] - indptr[:-1])
        return cls.from_coo(rows, indices, values, shape)

    @classmethod
    def from_coo(cls, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor,
                 shape: tuple[int, int], with_transpose: bool = True, rows_sorted: bool = False) -> SparseOperator:
        """rows_sorted: the entries come grouped by row already, and the matrix may keep each row's columns in
        the given order (not for operators whose column ranges are asked: sequential halos)."""
        transpose = _csr(cols, rows, values, (shape[1], shape[0])) if with_transpose else None
        return cls(matrix=_csr(rows, cols, values, shape, rows_sorted), transpose=transpose)

    def with_values(self, values: torch.Tensor, transpose_order: torch.Tensor) -> SparseOperator:
        """The same sparsity with new values, given in the matrix's entry order; transpose_order[j] is the
        matrix entry the transpose holds at its entry j. Views of the index arrays: only the values are new."""
        matrix, transpose = self.matrix, self.transpose
        return SparseOperator(
            matrix=_csr_tensor(matrix.crow_indices(), matrix.col_indices(), values, self.shape),
            transpose=None if transpose is None else _csr_tensor(
                transpose.crow_indices(), transpose.col_indices(), values[transpose_order], tuple(transpose.shape)))

    def row_slice(self, start: int, stop: int) -> SparseOperator:
        """Rows [start, stop) as a forward-only operator over the same columns; views, no copy of the entries."""
        crow = self.matrix.crow_indices()
        lo, hi = int(crow[start]), int(crow[stop])
        matrix = _csr_tensor(crow[start:stop + 1] - lo, self.matrix.col_indices()[lo:hi],
                             self.matrix.values()[lo:hi], (stop - start, self.shape[1]))
        return SparseOperator(matrix=matrix, transpose=None)

    def split_columns(self, at: int) -> tuple[SparseOperator, SparseOperator]:
        """(columns [0, at), columns [at, n_cols) renumbered from 0) as forward-only operators.

        A @ X equals left @ X[:at] + right @ X[at:], so the two halves of X need
        not be one tensor (evaluation aggregates owned rows and received halo
        rows without concatenating them). Entries keep their order within rows.
        """
        n_rows, n_cols = self.shape
        if at <= 0 or at >= n_cols:  # one side is empty (a part without halo rows): nothing to mask
            device = self.matrix.device
            no_entries = torch.zeros(0, dtype=torch.int64, device=device)
            empty = SparseOperator(matrix=_csr(no_entries, no_entries,
                                               torch.zeros(0, dtype=self.matrix.dtype, device=device), (n_rows, 0)),
                                   transpose=None)
            whole = SparseOperator(matrix=self.matrix, transpose=None)
            return (whole, empty) if at >= n_cols else (empty, whole)
        crow, col, values = self.matrix.crow_indices(), self.matrix.col_indices(), self.matrix.values()
        row_of = torch.repeat_interleave(torch.arange(n_rows, device=crow.device), (crow[1:] - crow[:-1]).to(torch.int64))
        halves = []
        for mask, shift, width in ((col < at, 0, at), (col >= at, at, n_cols - at)):
            new_crow = torch.zeros(n_rows + 1, dtype=torch.int64, device=crow.device)
            new_crow[1:] = torch.cumsum(torch.bincount(row_of[mask], minlength=n_rows), 0)
            matrix = _csr_tensor(new_crow.to(crow.dtype), col[mask] - shift, values[mask], (n_rows, width))
            halves.append(SparseOperator(matrix=matrix, transpose=None))
        return halves[0], halves[1]

    def column_ranges(self, at: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(begin, mid, end): row r's entries in columns [0, at) are [begin[r], mid[r]), the rest [mid[r],
        end[r]); views of the row pointers but mid (n_rows indices). What spmm_into multiplies each side with,
        without copying the entries as split_columns does. ValueError when a row's columns are not sorted
        (every operator built here has them sorted). Found once per operator and boundary."""
        if at in self._column_ranges:
            return self._column_ranges[at]
        crow, col = self.matrix.crow_indices(), self.matrix.col_indices()
        n_rows = self.shape[0]
        row_of = torch.repeat_interleave(torch.arange(n_rows, device=crow.device), (crow[1:] - crow[:-1]).long())
        left = col < at
        mid = crow[:-1] + torch.bincount(row_of[left], minlength=n_rows).to(crow.dtype)
        if not bool(torch.equal(left, torch.arange(len(col), device=crow.device) < mid[row_of])):
            raise ValueError("column ranges need each row's columns sorted")
        self._column_ranges[at] = crow[:-1], mid, crow[1:]
        return self._column_ranges[at]

    def to_dense(self) -> torch.Tensor:
        return self.matrix.to_dense()


def _csr(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int],
         rows_sorted: bool = False) -> torch.Tensor:
    if not rows_sorted:
        order = torch.argsort(rows * max(shape[1], 1) + cols, stable=True)
        rows, cols, values = rows[order], cols[order], values[order]
    crow = torch.zeros(shape[0] + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=shape[0]), 0)
    if max(len(cols), shape[1]) < 2**31:
        # int32 indices: half the index bytes the kernels stream per non-zero
        crow, cols = crow.to(torch.int32), cols.to(torch.int32)
    return _csr_tensor(crow, cols, values.contiguous(), shape)


def _csr_tensor(crow: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A CSR tensor from arrays already in CSR order (unchecked: the callers build them valid)."""
    with warnings.catch_warnings():
        # torch labels CSR "beta" on every construction; the kernels we use are stable.
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols, values, size=shape, check_invariants=False)


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op: SparseOperator, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # type: ignore[override]
        ctx.op = op
        ctx.has_bias = bias is not None
        return csr_matmul(op.matrix, x, bias)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        if ctx.needs_input_grad[1] and ctx.op.transpose is None:
            raise RuntimeError("spmm: this operator is forward-only (built without its transpose): build it with "
                               "with_transpose=True to differentiate through it")
        grad_x = csr_matmul(ctx.op.transpose, grad_out) if ctx.needs_input_grad[1] else None
        grad_bias = grad_out.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return None, grad_x, grad_bias


def csr_matmul(matrix: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """matrix @ x (+ bias), not differentiable: the product spmm and the fused layers built on it run.

    Shapes:
        matrix: CSR [n_rows, n_cols]; x: [n_cols, F]; bias: [F] -> [n_rows, F]
    """
    if matrix.shape[0] == 0 or matrix.shape[1] == 0 or x.shape[1] == 0:
        out = torch.zeros(matrix.shape[0], x.shape[1], dtype=x.dtype, device=x.device)
        return out if bias is None else out + bias
    if matrix.dtype != x.dtype:
        matrix = matrix.to(x.dtype)
    x = x.contiguous()
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        native = native_module()
        if native is not None:
            return native.csr_spmm(matrix.crow_indices(), matrix.col_indices(), matrix.values(), x,
                                   None if bias is None else bias.to(x.dtype).contiguous())
    out = torch.sparse.mm(matrix, x)
    return out if bias is None else out + bias


def spmm(op: SparseOperator, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Y = A @ X (+ bias, fused into the same pass), differentiable in X and bias.

    Shapes:
        op: [n_rows, n_cols]; x: [n_cols, F]; bias: [F] -> [n_rows, F]
    """
    if x.shape[0] != op.shape[1]:
        raise ValueError(f"spmm: operator has {op.shape[1]} columns but x has {x.shape[0]} rows")
    with torch.profiler.record_function("spmm"):
        return _SpMM.apply(op, x, bias)



def spmm_into(matrix: torch.Tensor, begin: torch.Tensor, end: torch.Tensor, x: torch.Tensor, out: torch.Tensor,
              col_offset: int = 0, bias: torch.Tensor | None = None, accumulate: bool = False) -> None:
    """out[r] = (or += with accumulate) the sum over matrix's entries k in [begin[r], end[r]) of
    values[k] * x[col[k] - col_offset] (+ bias); not differentiable (gnn_dist.halo.overlap builds its autograd).

    The ranges select entries of a CSR matrix without copying them: crow[a:b] and crow[a+1:b+1] are rows
    [a, b); a row's owned-column entries alone, or its halo-column ones (whose x is then the halo rows only,
    col_offset the owned count), when its columns are sorted.

    Shapes:
        matrix: CSR [n_rows, n_cols]; begin, end: [R] (matrix's index dtype); x: [*, F]; out: [R, F]; bias: [F]
    """
    if accumulate and bias is not None:
        raise ValueError("spmm_into: an accumulating product takes no bias")
    values = matrix.values() if matrix.dtype == x.dtype else matrix.values().to(x.dtype)
    if out.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and out.is_contiguous():
        native = native_module()
        if native is not None:
            native.csr_spmm_into(begin.contiguous(), end.contiguous(), matrix.col_indices(), values, x.contiguous(),
                                 col_offset, None if bias is None else bias.to(x.dtype).contiguous(), accumulate, out)
            return
    # torch formulation: the ranges' entries as a CSR matrix of their own over x's rows
    lengths = (end - begin).to(torch.int64)
    crow = torch.zeros(len(lengths) + 1, dtype=torch.int64, device=x.device)
    torch.cumsum(lengths, 0, out=crow[1:])
    entries = torch.arange(int(crow[-1]), device=x.device) \
        + torch.repeat_interleave(begin.to(torch.int64) - crow[:-1], lengths)
    part = csr_matmul(_csr_tensor(crow, matrix.col_indices()[entries].to(torch.int64) - col_offset, values[entries],
                               (len(lengths), x.shape[0])), x, bias)
    if accumulate:
        out.add_(part)
    else:
        out.copy_(part)
