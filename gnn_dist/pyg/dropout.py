"""Dropout inside a wrapped forward, keyed so that its masks do not depend on P.

torch.nn.Dropout and F.dropout draw from torch's generator, whose state differs between ranks holding
different rows. Inside a wrapped forward, gnn-dist's F.dropout draws each element from a hash of (seed, step,
the pass's dropout call, the row's original id, the column) instead: node rows are keyed by their original
node ids (owned rows, or [owned | halo] rows), and inside a propagate or an edge update, per-edge tensors
(attention coefficients) by their edge's original (source, target) ids and the column, as the built-in GAT's
attention dropout draws them (edge_dropout). A tensor that is none of those raises,
naming its size. Outside a wrapped forward, or when not training, F.dropout is torch's own.

`keep_mask_for` (node rows) and `edge_dropout` (edges) are the mask functions: the tests patch them into plain
PyG as the reference.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gnn_dist.kernels.attention import EdgeDropout
from gnn_dist.kernels.keyed_random import id_hash, sampled_stream_key, stream_key
from gnn_dist.nn.dropout import keep_rows_mask, row_hashed_dropout
from gnn_dist.pyg import passes
from gnn_dist.pyg.part_data import WITH_HALO

_ORIGINAL = None


def install() -> None:
    """Route F.dropout (which torch.nn.Dropout calls too) through the keyed one (once per process)."""
    global _ORIGINAL
    if _ORIGINAL is None:
        _ORIGINAL = F.dropout
        F.dropout = keyed_or_torch_dropout


def dropout_key(seed: int, step: int, call: int) -> int:
    """The key of a pass's call-th dropout at a training step."""
    return stream_key(seed, step, call)


def row_hashes(ids: torch.Tensor, key: int) -> torch.Tensor:
    """int32 [rows]: one word per node row, from its original id."""
    return id_hash(ids, key)


def edge_dropout(target_ids: torch.Tensor, source_ids: torch.Tensor, num_cols: int, key: int,
                 p: float) -> EdgeDropout:
    """The keyed mask of per-edge tensors [E, num_cols] (attention coefficients: a column per head) whose
    targets and sources have these original ids (tables indexed by local target and source ids): the
    built-in GAT's attention dropout (kernels.attention.EdgeDropout), so a wrapped GATConv draws the same
    mask on PyG's path and on the native attention kernel."""
    return EdgeDropout.keyed(target_ids, source_ids, num_cols, key, p)


def edge_factors(mask: EdgeDropout, edges: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[E, cols]: 1 / (1 - p) where an edge's entry is kept, 0 where dropped; edges are local (source, target)."""
    return mask.factors(edges[1], edges[0], dtype)


def keep_mask_for(rows: torch.Tensor, num_cols: int, p: float) -> torch.Tensor:
    """bool [len(rows), num_cols]: True where an element is kept (probability 1 - p), from row hashes: the
    built-in models' node mask (gnn_dist.nn.dropout), which apply_mask draws."""
    return keep_rows_mask(rows, num_cols, p)


def apply_mask(x: torch.Tensor, rows: torch.Tensor, p: float) -> torch.Tensor:
    """Inverted dropout of x [n, *] with row hashes rows [n] (keep_mask_for's mask, drawn by the native
    kernel where it serves, as the built-in models' dropout)."""
    if p >= 1.0:
        return x * 0.0
    flat = x.reshape(x.shape[0], -1)
    return row_hashed_dropout(flat, rows, p).reshape(x.shape)


def batch_dropout(input: torch.Tensor, p: float, batch: passes.BatchPass) -> torch.Tensor:
    """Dropout in a forward on a mini-batch: each row keyed by (seed, step, call, rank, its position), drawn by
    the native kernel (torch's bernoulli costs a third of a sampled GraphSAGE step); a resumed run draws alike."""
    # the built-in sampled mode's key (rank and step mixed in), its epoch and step being this model's step
    key = sampled_stream_key(batch.seed, 0, batch.step, batch.rank, batch.dropout_calls)
    batch.dropout_calls += 1
    positions = torch.arange(input.shape[0], dtype=torch.int64, device=input.device)
    return apply_mask(input, row_hashes(positions, key), p)


def keyed_or_torch_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False):
    active = passes.current()
    if active is None and training and p != 0.0 and isinstance(input, torch.Tensor) and input.dim() > 0:
        batch = passes.in_batches()
        if batch is not None:
            return batch_dropout(input, p, batch)
    if active is None or not training or p == 0.0 or not isinstance(input, torch.Tensor):
        return _ORIGINAL(input, p, training, inplace)
    key = dropout_key(active.seed, active.step, active.dropout_calls)
    active.dropout_calls += 1
    graph = active.graph
    rows = input.shape[0] if input.dim() else 0
    if active.edges is not None and rows == active.edges.shape[1]:
        flat = input.reshape(rows, -1)
        mask = edge_dropout(graph.node_ids, graph.all_ids, flat.shape[1], key, p)
        return (flat * edge_factors(mask, active.edges, input.dtype)).reshape(input.shape)
    if rows == graph.n_owned:
        full = getattr(input, WITH_HALO, None)
        if full is None:
            return apply_mask(input, row_hashes(graph.node_ids, key), p)
        # the halo rows masked alike (keys are original ids), so the next layer still needs no exchange
        masked_full = apply_mask(full, row_hashes(graph.all_ids, key), p)
        out = masked_full[:graph.n_owned]
        setattr(out, WITH_HALO, masked_full)
        return out
    if rows == graph.n_all:
        return apply_mask(input, row_hashes(graph.all_ids, key), p)
    raise ValueError(f"dropout on a tensor of {rows} rows: gnn-dist keys each mask by the rows' original node or "
                     f"edge ids, and these rows are neither the {graph.n_owned} owned nodes, the {graph.n_all} "
                     f"[owned | halo] rows nor the edges of a propagate; apply dropout to node or edge tensors")
