"""Dropout whose mask depends on (seed, epoch, layer, original node id, column) only.

The mask of a row is therefore the same whichever rank computes it and
whatever P is: that is what makes a distributed run with dropout reproduce
the single-process run. The key's hash (gnn_dist.kernels.keyed_random) gives 32
random bits per element; the torch path runs in row chunks small enough to
stay in cache, the native kernel in one fused pass.
"""
from __future__ import annotations

import torch

from gnn_dist.kernels.keyed_random import column_hash, id_hash, mix32
from gnn_dist.kernels.native import native_module

_CHUNK_ELEMENTS = 1 << 20


def _threshold(p: float) -> int:
    """Element (i, c) is kept where mix32(row_hash[i] ^ col_hash[c]), read as signed, is at or above this
    (probability 1 - p)."""
    return int(p * (1 << 32)) - (1 << 31)


def _mask_terms(node_ids: torch.Tensor, num_cols: int, key: int, p: float) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(row hashes, column hashes, threshold) of the keyed mask of node rows.

    node_ids are original dataset ids (int64, below 2**32). Every formulation (the torch chunks, the native
    kernel, the sparse entries) draws from these, so all of them draw one mask.
    """
    return id_hash(node_ids, key), column_hash(num_cols, node_ids.device), _threshold(p)


def keep_entries(node_ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, num_cols: int, key: int,
                 p: float) -> torch.Tensor:
    """bool [nnz]: keep_mask(node_ids, num_cols, key, p) read at the entries (rows[k], cols[k]) only, for a sparse
    matrix whose dropped-out zeros need no draw (gnn_dist.nn.sparse_features)."""
    row_hash, col_hash, threshold = _mask_terms(node_ids, num_cols, key, p)
    return mix32(row_hash[rows] ^ col_hash[cols]) >= threshold


def _keep_chunks(row_hash: torch.Tensor, col_hash: torch.Tensor, threshold: int):
    """Yields (row slice, bool [rows, num_cols] True where kept) chunk by chunk, while a chunk stays in cache."""
    step = max(1, _CHUNK_ELEMENTS // max(col_hash.shape[0], 1))
    for start in range(0, row_hash.shape[0], step):
        rows = slice(start, start + step)
        yield rows, mix32(row_hash[rows, None] ^ col_hash[None, :]) >= threshold


def keep_rows_mask(row_hash: torch.Tensor, num_cols: int, p: float) -> torch.Tensor:
    """bool [len(row_hash), num_cols]: True where the element is kept (probability 1 - p), from row hashes."""
    keep = torch.empty(row_hash.shape[0], num_cols, dtype=torch.bool, device=row_hash.device)
    for rows, kept in _keep_chunks(row_hash, column_hash(num_cols, row_hash.device), _threshold(p)):
        keep[rows] = kept
    return keep


def keep_mask(node_ids: torch.Tensor, num_cols: int, key: int, p: float) -> torch.Tensor:
    """bool [len(node_ids), num_cols]: True where the element is kept (probability 1 - p)."""
    return keep_rows_mask(id_hash(node_ids, key), num_cols, p)


def keyed_dropout(x: torch.Tensor, node_ids: torch.Tensor, key: int, p: float, training: bool,
                  relu: bool = False, inplace: bool = False) -> torch.Tensor:
    """Inverted dropout with a node-keyed mask, after an optional ReLU. Shapes: x [n, F], node_ids [n] -> [n, F].

    With relu=True this is dropout(relu(x)), in one pass where the native kernel is available.
    inplace=True overwrites x (a contiguous layer output that no backward saved), so the
    layer's input and the previous layer's output are one tensor, not two.
    """
    if not training or p == 0.0:
        if relu:
            return torch.relu_(x) if inplace else torch.relu(x)
        return x
    return row_hashed_dropout(x, id_hash(node_ids, key), p, relu, inplace)


def row_hashed_dropout(x: torch.Tensor, row_hash: torch.Tensor, p: float, relu: bool = False,
                       inplace: bool = False) -> torch.Tensor:
    """keyed_dropout's mask from given row hashes (int32 [n]: a node's id_hash, or an edge's word from its two
    ends), so rows of any kind draw the same masks through the native kernel or the torch chunks."""
    threshold = _threshold(p)
    col_hash = column_hash(x.shape[1], x.device)
    native = native_module()
    # The native kernel serves host tensors only; on a GPU the torch formulation draws the same mask.
    if native is not None and x.dtype == torch.float32 and x.device.type == "cpu" and (x.is_contiguous() or not inplace):
        return _NativeKeyedDropout.apply(x, row_hash, col_hash, threshold, p, relu, native, inplace)
    if relu:
        x = torch.relu_(x) if inplace else torch.relu(x)
    return _KeyedDropout.apply(x, row_hash, col_hash, threshold, p)


class _NativeKeyedDropout(torch.autograd.Function):
    """The same masks computed in C++ in one pass, the ReLU folded into the saved mask.

    The mask is saved packed, one bit per element: the dropout half could be
    recomputed from its key, but the ReLU half depends on the overwritten
    input, and one bit holds both in a thirty-second of the activation's size.
    """

    @staticmethod
    def forward(ctx, x, row_hash, col_hash, threshold, p, relu, native, inplace=False):  # type: ignore[override]
        out, mask = native.keyed_dropout(x.contiguous(), row_hash, col_hash, threshold, 1.0 / (1.0 - p), relu,
                                         inplace)
        if inplace:
            ctx.mark_dirty(x)
        ctx.save_for_backward(mask)
        ctx.scale = 1.0 / (1.0 - p)
        ctx.native = native
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        grad_in = ctx.native.masked_scale(grad_out.float(), mask, ctx.scale).to(grad_out.dtype)
        return grad_in, None, None, None, None, None, None, None


class _KeyedDropout(torch.autograd.Function):
    """Masks and scales chunk by chunk while the chunk is in cache; saves the 1-byte mask.

    Multiplying by the mask viewed as uint8 is several times faster on CPU
    than masked_fill or where with a bool mask (measured with torch 2.13).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, row_hash: torch.Tensor, col_hash: torch.Tensor, threshold: int,  # type: ignore[override]
                p: float) -> torch.Tensor:
        scale = 1.0 / (1.0 - p)
        x = x.contiguous()
        out = torch.empty_like(x)
        keep = torch.empty(x.shape, dtype=torch.bool, device=x.device)
        for rows, kept in _keep_chunks(row_hash, col_hash, threshold):
            keep[rows] = kept
            torch.mul(x[rows], kept.view(torch.uint8), out=out[rows]).mul_(scale)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_in = torch.empty_like(grad_out)
        step = max(1, _CHUNK_ELEMENTS // max(grad_out.shape[1], 1))
        for start in range(0, grad_out.shape[0], step):
            rows = slice(start, start + step)
            torch.mul(grad_out[rows], keep[rows].view(torch.uint8), out=grad_in[rows]).mul_(ctx.scale)
        return grad_in, None, None, None, None
