"""Graph attention over a fixed CSR (GAT's edge softmax and weighted aggregation), with autograd.

For destination row i, head h and each entry (i, j) of the row:

    z = a_src[j, h] + a_dst[i, h];   e = leaky_relu(z, slope);   alpha = softmax of e over row i
    out[i, h, :] = sum_j alpha * keep(i, j, h) / (1 - p) * x[j, h, :]  (+ bias)

`source` rows are [x (heads * width) | a_src (heads)]: the one row per node
that a halo exchange moves. keep() is the attention dropout, keyed by the
endpoints' original ids (gnn_dist.nn.dropout's hash), so no mask is drawn from a
generator and every P keeps the same entries.

Neither formulation forms an [E x H x C] tensor (PyG's GATConv does): the
forward keeps lse[i, h], the log of row i's softmax denominator, and the
backward recomputes alpha from it. The native kernel
(kernels/native_kernels.cpp, CPU only) keeps two [E x H] buffers; the torch
formulation (a GPU, or GNN_DIST_KERNEL=torch) keeps a few [E x H] tensors and
forms its per-edge products in chunks of EDGE_CHUNK_ELEMENTS. Both are held to
a plain autograd reference and to PyG (tests/test_gat.py).

A partial result over some of a row's columns is (out, lse); `merge` joins two
of them exactly (the online softmax), so rows split by columns, as in
layer-wise evaluation, need no [owned | halo] copy of the source.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from gnn_dist.kernels.keyed_random import id_hash, mix32, to_int32, wrap_int32
from gnn_dist.kernels.native import native_module
from gnn_dist.kernels.spmm import SparseOperator

NEGATIVE_SLOPE = 0.2  # PyG's GATConv default
_NO_HASH = torch.zeros(0, dtype=torch.int32)  # host: read only by the native (CPU) kernel, which ignores it


@dataclass(frozen=True)
class EdgeDropout:
    """Attention dropout: entry (i, j, head h) is kept when mix32(dst_hash[i] ^ src_hash[j] ^ head_hash[h]),
    read as int32, is at least `threshold` (probability 1 - p)."""

    dst_hash: torch.Tensor  # int32 [n_rows]
    src_hash: torch.Tensor  # int32 [n_cols]
    head_hash: torch.Tensor  # int32 [heads]
    threshold: int
    scale: float

    @classmethod
    def keyed(cls, dst_ids: torch.Tensor, src_ids: torch.Tensor, heads: int, key: int, p: float) -> EdgeDropout:
        """Masks of the rows with original ids dst_ids and the columns with original ids src_ids."""
        return cls(dst_hash=id_hash(dst_ids, key),
                   src_hash=mix32(wrap_int32(src_ids.to(torch.int64) * 0x85EBCA77 + 1) ^ to_int32(key * 3 + 1)),
                   head_hash=mix32(wrap_int32(torch.arange(heads, dtype=torch.int64, device=dst_ids.device) * 0x27D4EB2F
                                               + 0x165667B1)),
                   threshold=int(p * (1 << 32)) - (1 << 31), scale=1.0 / (1.0 - p))

    def restricted(self, rows=slice(None), cols=slice(None)) -> EdgeDropout:
        """The masks of some rows (a slice or an index tensor) and a slice of columns, renumbered from 0."""
        return EdgeDropout(self.dst_hash[rows], self.src_hash[cols], self.head_hash, self.threshold, self.scale)

    def factors(self, rows: torch.Tensor, cols: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[E, heads]: 1 / (1 - p) where kept, 0 where dropped (the fallback's mask)."""
        word = mix32((self.dst_hash[rows] ^ self.src_hash[cols])[:, None] ^ self.head_hash[None, :])
        return (word >= self.threshold).to(dtype) * self.scale

    def kernel_args(self) -> tuple:
        return self.dst_hash, self.src_hash, self.head_hash, self.threshold, self.scale, True


_NO_DROPOUT_ARGS = (_NO_HASH, _NO_HASH, _NO_HASH, 0, 1.0, False)


@dataclass(frozen=True)
class _Transpose:
    crow: torch.Tensor  # [n_cols + 1]
    row: torch.Tensor   # [nnz]: the destination row of each transposed entry
    perm: torch.Tensor  # [nnz]: its position in the forward CSR


# One transpose per operator (every GAT layer of a rank shares its operator), dropped with the operator. Keyed
# by id: a weak-keyed dict would compare two tensors with ==, which is elementwise.
_TRANSPOSES: dict[int, tuple[weakref.ref, _Transpose]] = {}


def _transpose(op: SparseOperator) -> _Transpose:
    """The operator's entries ordered by column, with each one's forward position (for the backward's gathers)."""
    key = id(op.matrix)
    entry = _TRANSPOSES.get(key)
    cached = entry[1] if entry is not None and entry[0]() is op.matrix else None
    if cached is None:
        crow, col = op.matrix.crow_indices(), op.matrix.col_indices()
        n_rows, n_cols = op.shape
        row = torch.repeat_interleave(torch.arange(n_rows, dtype=col.dtype, device=col.device),
                                      (crow[1:] - crow[:-1]).to(torch.int64))
        perm = torch.argsort(col, stable=True)  # within a column, rows ascend: CSR order of the transpose
        t_crow = torch.zeros(n_cols + 1, dtype=torch.int64, device=col.device)
        t_crow[1:] = torch.cumsum(torch.bincount(col.to(torch.int64), minlength=n_cols), 0)
        cached = _Transpose(t_crow.to(col.dtype), row[perm].contiguous(), perm.to(col.dtype))
        _TRANSPOSES[key] = (weakref.ref(op.matrix, lambda _, key=key: _TRANSPOSES.pop(key, None)), cached)
    return cached


def attention(op: SparseOperator, source: torch.Tensor, dst_score: torch.Tensor, heads: int,
              bias: torch.Tensor | None = None, dropout: EdgeDropout | None = None,
              slope: float = NEGATIVE_SLOPE, with_lse: bool = False):
    """Attention-weighted aggregation of `source` rows over op's entries (op's values are ignored).

    Shapes:
        op: [n_rows, n_cols]; source: [n_cols, heads * C + heads]; dst_score: [n_rows, heads]; bias: [heads * C]
        -> out [n_rows, heads * C] (and lse [n_rows, heads] with with_lse)
    """
    if source.shape[0] != op.shape[1] or dst_score.shape != (op.shape[0], heads):
        raise ValueError(f"attention: operator {op.shape}, source {tuple(source.shape)}, "
                         f"dst_score {tuple(dst_score.shape)} with {heads} heads do not fit")
    native = native_module()
    if native is not None and source.dtype in (torch.float32, torch.float64) and source.device.type == "cpu":
        out, lse = _NativeAttention.apply(op, source.contiguous(), dst_score.contiguous(), bias, heads, slope,
                                          dropout, native)
    else:
        out, lse = _TorchAttention.apply(op, source, dst_score, bias, heads, slope, dropout)
    return (out, lse) if with_lse else out


def merge(first: tuple[torch.Tensor, torch.Tensor], second: tuple[torch.Tensor, torch.Tensor],
          heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Join two partial results (out, lse) of the same rows over disjoint columns: the online softmax step.

    Each part is normalised by its own denominator exp(lse); the whole is their
    mix weighted by each one's share of the joint denominator. A part with no
    entry in a row (lse = -inf) gets weight 0. Neither part may carry a bias.
    """
    (out_a, lse_a), (out_b, lse_b) = first, second
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    wa, wb = torch.exp(lse_a - safe), torch.exp(lse_b - safe)
    n = out_a.shape[0]
    out = (out_a.view(n, heads, -1) * wa[:, :, None] + out_b.view(n, heads, -1) * wb[:, :, None]).view(n, -1)
    return out, lse


class _NativeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, source, dst_score, bias, heads, slope, dropout, native):  # type: ignore[override]
        drop_args = dropout.kernel_args() if dropout is not None else _NO_DROPOUT_ARGS
        crow, col = op.matrix.crow_indices(), op.matrix.col_indices()
        b = None if bias is None else bias.to(source.dtype).contiguous()
        out, lse = native.attention_forward(crow, col, source, dst_score, b, heads, slope, *drop_args)
        ctx.save_for_backward(source, dst_score, lse)
        ctx.op, ctx.heads, ctx.slope, ctx.drop_args, ctx.native = op, heads, slope, drop_args, native
        ctx.has_bias = bias is not None
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):  # type: ignore[override]
        source, dst_score, lse = ctx.saved_tensors
        op = ctx.op
        t = _transpose(op)
        grad_out = grad_out.to(source.dtype).contiguous()
        grad_lse = None if grad_lse is None else grad_lse.to(source.dtype).contiguous()
        grad_source, grad_dst = ctx.native.attention_backward(
            op.matrix.crow_indices(), op.matrix.col_indices(), t.crow, t.row, t.perm, source, dst_score, lse,
            grad_out, grad_lse, None, ctx.heads, ctx.slope, *ctx.drop_args)
        grad_bias = grad_out.sum(0) if ctx.has_bias and ctx.needs_input_grad[3] else None
        return None, grad_source, grad_dst, grad_bias, None, None, None, None


# The torch formulation's edges go through [chunk x H x C] products of at most this many elements, so no
# [E x H x C] tensor is formed (16 MiB in fp32; the backward holds three such products at once): what a device
# without the native kernel runs.
EDGE_CHUNK_ELEMENTS = 1 << 22


def _edge_chunks(n_edges: int, per_edge: int) -> list[slice]:
    step = max(1, EDGE_CHUNK_ELEMENTS // max(1, per_edge))
    return [slice(start, min(start + step, n_edges)) for start in range(0, n_edges, step)]


def torch_backward_elements(entries: int, heads: int, width: int) -> int:
    """Elements the torch formulation's backward holds at its peak beyond the native kernel's two [E x H] buffers
    (what the memory plan adds when it runs): five more [E x H] tensors (scores, attention, the dropout factors,
    dL/dalpha, dz) and one chunk's three [chunk x H x C] products (rows gathered, columns gathered, product)."""
    chunk_edges = min(entries, max(1, EDGE_CHUNK_ELEMENTS // max(1, heads * width)))
    return 5 * entries * heads + 3 * chunk_edges * heads * width


def _entries(op: SparseOperator) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of every entry, int64, in CSR order."""
    crow, col = op.matrix.crow_indices().to(torch.int64), op.matrix.col_indices().to(torch.int64)
    row = torch.repeat_interleave(torch.arange(op.shape[0], device=crow.device), crow[1:] - crow[:-1])
    return row, col


def _torch_forward(op: SparseOperator, source: torch.Tensor, dst_score: torch.Tensor, heads: int,
                   dropout: EdgeDropout | None, slope: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out without bias, lse) with torch ops and no autograd: [E x H] scores, the aggregation by edge chunks."""
    row, col = _entries(op)
    n_rows = op.shape[0]
    hc = source.shape[1] - heads
    x, a_src = source[:, :hc].view(-1, heads, hc // heads), source[:, hc:]
    e = torch.nn.functional.leaky_relu(a_src[col] + dst_score[row], slope)  # [E, H]
    peak = e.new_full((n_rows, heads), float("-inf")).scatter_reduce(0, row[:, None].expand(-1, heads), e, "amax")
    w = torch.exp(e - peak[row])
    total = e.new_zeros(n_rows, heads).index_add(0, row, w)
    lse = torch.where(total > 0, peak + torch.log(total), torch.full_like(total, float("-inf")))
    alpha = w.div_(total[row])
    if dropout is not None:
        alpha.mul_(dropout.factors(row, col, alpha.dtype))
    out = x.new_zeros(n_rows, heads, hc // heads)
    for part in _edge_chunks(len(col), hc):
        out.index_add_(0, row[part], alpha[part, :, None] * x[col[part]])
    return out.view(n_rows, hc), lse


def _torch_backward(op: SparseOperator, source: torch.Tensor, dst_score: torch.Tensor, lse: torch.Tensor,
                    grad_out: torch.Tensor, row_delta: torch.Tensor | None, grad_lse: torch.Tensor | None,
                    heads: int, dropout: EdgeDropout | None, slope: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of (source, dst_score), attention recomputed from lse, products by edge chunks.

    row_delta: each row's sum of alpha * dL/dalpha over all its columns; None: op holds whole rows, and it is
    summed here. grad_lse: the gradient reaching lse, if lse was used."""
    row, col = _entries(op)
    n_rows = op.shape[0]
    hc = source.shape[1] - heads
    x, a_src = source[:, :hc].view(-1, heads, hc // heads), source[:, hc:]
    g = grad_out.reshape(n_rows, heads, hc // heads)
    z = a_src[col] + dst_score[row]
    alpha = torch.exp(torch.nn.functional.leaky_relu(z, slope) - lse[row])  # [E, H]
    factors = None if dropout is None else dropout.factors(row, col, alpha.dtype)  # keep / (1-p), hashed once
    dot = torch.empty_like(alpha)  # dL/dalpha = keep / (1-p) x <g[row], x[col]>, chunk by chunk
    grad_x = torch.zeros_like(x)
    for part in _edge_chunks(len(col), hc):
        kept = alpha[part] if factors is None else alpha[part] * factors[part]
        dot[part] = (g[row[part]] * x[col[part]]).sum(-1)
        grad_x.index_add_(0, col[part], kept[:, :, None] * g[row[part]])
    if factors is not None:
        dot.mul_(factors)
    if row_delta is None:
        row_delta = dot.new_zeros(n_rows, heads).index_add_(0, row, alpha * dot)
    shift = row_delta[row] if grad_lse is None else row_delta[row] - grad_lse[row]
    dz = alpha * (dot - shift)
    dz = torch.where(z > 0, dz, slope * dz)
    grad_a_src = torch.zeros_like(a_src).index_add_(0, col, dz)
    grad_dst = torch.zeros_like(dst_score).index_add_(0, row, dz)
    return torch.cat([grad_x.view(-1, hc), grad_a_src], 1), grad_dst


class _TorchAttention(torch.autograd.Function):
    """The native kernel's contract with torch ops: the forward keeps lse, the backward recomputes alpha."""

    @staticmethod
    def forward(ctx, op, source, dst_score, bias, heads, slope, dropout):  # type: ignore[override]
        out, lse = _torch_forward(op, source, dst_score, heads, dropout, slope)
        ctx.save_for_backward(source, dst_score, lse)
        ctx.op, ctx.heads, ctx.slope, ctx.dropout, ctx.has_bias = op, heads, slope, dropout, bias is not None
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):  # type: ignore[override]
        source, dst_score, lse = ctx.saved_tensors
        grad_source, grad_dst = _torch_backward(ctx.op, source, dst_score, lse, grad_out.to(source.dtype), None,
                                                None if grad_lse is None else grad_lse.to(source.dtype), ctx.heads,
                                                ctx.dropout, ctx.slope)
        grad_bias = grad_out.sum(0) if ctx.has_bias and ctx.needs_input_grad[3] else None
        return None, grad_source, grad_dst, grad_bias, None, None, None


def partial_forward(op: SparseOperator, source: torch.Tensor, dst_score: torch.Tensor, heads: int,
                    dropout: EdgeDropout | None = None, slope: float = NEGATIVE_SLOPE):
    """(out, lse) of op's rows over op's columns only, without autograd: one block of a row's columns, to be
    merged with the others (`merge`). Shapes as `attention`."""
    with torch.no_grad():
        native = native_module()
        if native is not None and source.dtype in (torch.float32, torch.float64) and source.device.type == "cpu":
            drop_args = dropout.kernel_args() if dropout is not None else _NO_DROPOUT_ARGS
            return tuple(native.attention_forward(op.matrix.crow_indices(), op.matrix.col_indices(),
                                                  source.contiguous(), dst_score.contiguous(), None, heads, slope,
                                                  *drop_args))
        return _torch_forward(op, source, dst_score, heads, dropout, slope)


def partial_backward(op: SparseOperator, source: torch.Tensor, dst_score: torch.Tensor, lse: torch.Tensor,
                     grad_out: torch.Tensor, row_delta: torch.Tensor, heads: int, dropout: EdgeDropout | None = None,
                     slope: float = NEGATIVE_SLOPE) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of (source, dst_score) through op's share of rows whose softmax spans more columns than op's.

    lse is the whole rows' (all their columns), so alpha is the whole rows' attention; row_delta is the whole
    rows' sum of alpha * dL/dalpha, which equals <grad_out, out - bias> per head. No op's transpose is built
    by the caller; the native kernel gathers through a cached one.

    Shapes: op [n_rows, n_cols]; source [n_cols, W]; dst_score, lse, row_delta [n_rows, heads];
        grad_out [n_rows, W - heads] -> grad_source [n_cols, W], grad_dst_score [n_rows, heads]
    """
    native = native_module()
    if native is not None and source.dtype in (torch.float32, torch.float64) and source.device.type == "cpu":
        t = _transpose(op)
        drop_args = dropout.kernel_args() if dropout is not None else _NO_DROPOUT_ARGS
        return tuple(native.attention_backward(
            op.matrix.crow_indices(), op.matrix.col_indices(), t.crow, t.row, t.perm, source.contiguous(),
            dst_score.contiguous(), lse.contiguous(), grad_out.contiguous(), None, row_delta.contiguous(), heads,
            slope, *drop_args))
    return _torch_backward(op, source, dst_score, lse, grad_out, row_delta, None, heads, dropout, slope)
