"""Training negatives, keyed: each positive's K destinations are a hash of (seed, epoch, edge id, k).

A positive (u, v) with global edge id e gets, at every epoch, K destinations
uniform over the N - 1 nodes other than u, by original id: the draw is a pure
function of (seed, epoch, e, k) and u, so every rank, every P and every
partition of the graph draws the same negatives, and a checkpoint carries no
generator state. A destination is never the source itself. It may be a real
neighbour of u (probability about deg(u) / N per draw), as with DGL's
uniform negative sampler: on sparse graphs this is rare, and excluding it
would need every node's adjacency on every rank.

Uniformity: the top 32 bits of a 64-bit SplitMix hash times (N - 1), shifted
down 32 bits (Lemire's multiply-shift). Its bias is below N / 2**32 per value,
and it needs N - 1 < 2**32.
"""
from __future__ import annotations

import numpy as np

from gnn_dist.keyed_random import splitmix64

_NEGATIVES = np.uint64(0x6E65676174697665)  # "negative": this stream's salt


def negatives_key(seed: int, epoch: int) -> np.uint64:
    """The key of one epoch's training negatives."""
    with np.errstate(over="ignore"):
        key = splitmix64(np.array([seed], dtype=np.uint64) ^ _NEGATIVES)
        return splitmix64(key ^ np.uint64(epoch))[0]


def negative_destinations(seed: int, epoch: int, edge_ids: np.ndarray, sources: np.ndarray, num_nodes: int,
                          ratio: int) -> np.ndarray:
    """[len(edge_ids), ratio] original ids: positive e's k-th negative destination at this epoch.

    sources: each positive's source, by original id (never drawn).
    """
    if num_nodes < 2 or num_nodes - 1 >= 1 << 32:
        raise ValueError(f"keyed negatives need 2 <= num_nodes <= 2**32, got {num_nodes}")
    key = negatives_key(seed, epoch)
    draws = edge_ids.astype(np.uint64)[:, None] * np.uint64(ratio) + np.arange(ratio, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        words = splitmix64(splitmix64(draws ^ key))
        value = ((words >> np.uint64(32)) * np.uint64(num_nodes - 1)) >> np.uint64(32)
    value = value.astype(np.int64)
    return value + (value >= sources.astype(np.int64)[:, None])
