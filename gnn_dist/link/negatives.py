"""Training negatives, keyed: each positive's K negatives are a hash of (seed, epoch, edge id, k).

Two rules (--negatives):
    source  keep the positive's source u, draw K destinations (DGL's global uniform sampler; the default)
    pairs   draw both ends: K pairs (s, d) uniform over ordered pairs of distinct nodes, as PyG's
            negative_sampling (without rejecting existing edges: see below)
Under `source` a node appears among the negatives as often as among the positives (in proportion to its
degree); under `pairs` every node appears equally, so the model also learns each node's popularity, which
held-out AUC against uniform pairs rewards (docs/link-prediction.md has the measured difference).

A positive (u, v) with global edge id e gets, at every epoch, K negatives whose draw is a pure function of
(seed, epoch, e, k) and u, by original id, so every rank, every P and every partition of the graph draws the
same negatives, and a checkpoint carries no generator state. A destination is never its source. A negative
may be a real edge (probability about deg / N per draw), as with DGL's uniform negative sampler: on sparse
graphs this is rare, and excluding it would need every node's adjacency on every rank.

Uniformity: the top 32 bits of a 64-bit SplitMix hash times the range (N - 1 destinations, N sources),
shifted down 32 bits (Lemire's multiply-shift). Its bias is below N / 2**32 per value, and it needs
N <= 2**32.
"""
from __future__ import annotations

import numpy as np

from gnn_dist.kernels.keyed_random import splitmix64

_NEGATIVES = np.uint64(0x6E65676174697665)  # "negative": this stream's salt
_SOURCES = np.uint64(0x736F7572636573)      # "sources": the pairs rule's source stream, apart from the destinations


def negatives_key(seed: int, epoch: int) -> np.uint64:
    """The key of one epoch's training negatives."""
    with np.errstate(over="ignore"):
        key = splitmix64(np.array([seed], dtype=np.uint64) ^ _NEGATIVES)
        return splitmix64(key ^ np.uint64(epoch))[0]


def _keyed_below(key: np.uint64, edge_ids: np.ndarray, ratio: int, bound: int) -> np.ndarray:
    """[len(edge_ids), ratio] int64 in [0, bound): draw k of edge e hashed with the key, multiply-shifted."""
    draws = edge_ids.astype(np.uint64)[:, None] * np.uint64(ratio) + np.arange(ratio, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        words = splitmix64(splitmix64(draws ^ key))
        value = ((words >> np.uint64(32)) * np.uint64(bound)) >> np.uint64(32)
    return value.astype(np.int64)


def negative_destinations(seed: int, epoch: int, edge_ids: np.ndarray, sources: np.ndarray, num_nodes: int,
                          ratio: int) -> np.ndarray:
    """[len(edge_ids), ratio] original ids: positive e's k-th negative destination at this epoch.

    sources: by original id, each positive's source [T] or each negative's own source [T, ratio]; a destination
    is never its source.
    """
    if num_nodes < 2 or num_nodes - 1 >= 1 << 32:
        raise ValueError(f"keyed negatives need 2 <= num_nodes <= 2**32, got {num_nodes}")
    value = _keyed_below(negatives_key(seed, epoch), edge_ids, ratio, num_nodes - 1)
    sources = sources.astype(np.int64)
    return value + (value >= (sources[:, None] if sources.ndim == 1 else sources))


def negative_sources(seed: int, epoch: int, edge_ids: np.ndarray, num_nodes: int, ratio: int) -> np.ndarray:
    """[len(edge_ids), ratio] original ids uniform over all nodes: the sources of the pairs rule's negatives
    (their destinations are negative_destinations given these sources)."""
    if num_nodes < 1 or num_nodes >= 1 << 32:
        raise ValueError(f"keyed negatives need 1 <= num_nodes <= 2**32, got {num_nodes}")
    return _keyed_below(negatives_key(seed, epoch) ^ _SOURCES, edge_ids, ratio, num_nodes)
