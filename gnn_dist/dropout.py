"""Dropout whose mask depends on (seed, epoch, layer, original node id, column) only.

The mask of a row is therefore the same whichever rank computes it and
whatever P is: that is what makes a distributed run with dropout reproduce
the single-process run. A counter-based hash (Wellons' "lowbias32" integer
mixer) turns the key into 32 random bits per element; it runs on int32
tensors in row chunks small enough to stay in cache.

torch has no logical right shift for signed integers, so each shift is
masked to emulate one; int32 multiplication wraps modulo 2**32 as the
hash requires.
"""
from __future__ import annotations

import torch

from gnn_dist.kernels.native import native_module

_CHUNK_ELEMENTS = 1 << 20
_GOLDEN = 0x9E3779B9


def _to_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= (1 << 31) else value


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (32 - bits)) - 1)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int32 tensors (bit patterns as unsigned 32-bit words)."""
    x = x ^ _shr(x, 16)
    x = x * _to_int32(0x7FEB352D)
    x = x ^ _shr(x, 15)
    x = x * _to_int32(0x846CA68B)
    return x ^ _shr(x, 16)


def mix32_reference(value: int) -> int:
    """The same mixer on Python ints, for tests."""
    value &= 0xFFFFFFFF
    value ^= value >> 16
    value = (value * 0x7FEB352D) & 0xFFFFFFFF
    value ^= value >> 15
    value = (value * 0x846CA68B) & 0xFFFFFFFF
    return value ^ (value >> 16)


def stream_key(seed: int, epoch: int, layer: int) -> int:
    key = mix32_reference(seed ^ 0x5BD1E995)
    key = mix32_reference(key ^ (epoch * 0x27D4EB2F))
    return mix32_reference(key ^ (layer * 0x165667B1))


def sampled_stream_key(seed: int, epoch: int, step: int, rank: int, layer: int) -> int:
    """Dropout key of one sampled step's layer: rank and step mixed in, so ranks' batches draw apart."""
    key = mix32_reference(stream_key(seed, epoch, layer) ^ (step * 0x2C1B3C6D))
    return mix32_reference(key ^ (rank * 0x297A2D39 + 1))


def _keep_chunks(node_ids: torch.Tensor, num_cols: int, key: int, p: float):
    """Yields (row slice, bool [rows, num_cols] True where kept) chunk by chunk.

    node_ids are original dataset ids (int64, below 2**32). Uniform 32-bit
    words read as signed are at or above `threshold` with probability 1 - p.
    """
    key32 = _to_int32(key)
    row_hash = mix32(_wrap_int32(node_ids.to(torch.int64) * _GOLDEN) ^ key32)
    col_hash = mix32(_wrap_int32(torch.arange(num_cols, dtype=torch.int64) * 0x85EBCA77 + 1))
    threshold = int(p * (1 << 32)) - (1 << 31)
    step = max(1, _CHUNK_ELEMENTS // max(num_cols, 1))
    for start in range(0, node_ids.shape[0], step):
        rows = slice(start, start + step)
        yield rows, mix32(row_hash[rows, None] ^ col_hash[None, :]) >= threshold


def keep_mask(node_ids: torch.Tensor, num_cols: int, key: int, p: float) -> torch.Tensor:
    """bool [len(node_ids), num_cols]: True where the element is kept (probability 1 - p)."""
    keep = torch.empty(node_ids.shape[0], num_cols, dtype=torch.bool)
    for rows, kept in _keep_chunks(node_ids, num_cols, key, p):
        keep[rows] = kept
    return keep


def _wrap_int32(values: torch.Tensor) -> torch.Tensor:
    """int64 -> int32 keeping the low 32 bits (two's complement)."""
    values = values & 0xFFFFFFFF
    return torch.where(values >= (1 << 31), values - (1 << 32), values).to(torch.int32)


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
    native = native_module()
    if native is not None and x.dtype == torch.float32 and (x.is_contiguous() or not inplace):
        return _NativeKeyedDropout.apply(x, node_ids, key, p, relu, native, inplace)
    if relu:
        x = torch.relu_(x) if inplace else torch.relu(x)
    return _KeyedDropout.apply(x, node_ids, key, p)


class _NativeKeyedDropout(torch.autograd.Function):
    """The same masks computed in C++ in one pass, the ReLU folded into the saved mask.

    The mask is saved packed, one bit per element: the dropout half could be
    recomputed from its key, but the ReLU half depends on the overwritten
    input, and one bit holds both in a thirty-second of the activation's size.
    """

    @staticmethod
    def forward(ctx, x, node_ids, key, p, relu, native, inplace=False):  # type: ignore[override]
        row_hash = mix32(_wrap_int32(node_ids.to(torch.int64) * _GOLDEN) ^ _to_int32(key))
        col_hash = mix32(_wrap_int32(torch.arange(x.shape[1], dtype=torch.int64) * 0x85EBCA77 + 1))
        threshold = int(p * (1 << 32)) - (1 << 31)
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
        return grad_in, None, None, None, None, None, None


class _KeyedDropout(torch.autograd.Function):
    """Masks and scales chunk by chunk while the chunk is in cache; saves the 1-byte mask.

    Multiplying by the mask viewed as uint8 is several times faster on CPU
    than masked_fill or where with a bool mask (measured with torch 2.13).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, node_ids: torch.Tensor, key: int, p: float) -> torch.Tensor:  # type: ignore[override]
        scale = 1.0 / (1.0 - p)
        x = x.contiguous()
        out = torch.empty_like(x)
        keep = torch.empty(x.shape, dtype=torch.bool)
        for rows, kept in _keep_chunks(node_ids, x.shape[1], key, p):
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
        return grad_in, None, None, None
