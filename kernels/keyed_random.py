"""Keyed randomness: every random choice of a run as a hash of (seed, epoch, layer or step, original ids).

Dropout masks, attention dropout, boundary sampling (bns) and the sampler's
neighbour scores draw no generator state: each is a pure function of a key and
the original ids involved, so every rank and every P draws the same, and a
checkpoint has no random state to carry. The hashes live here, one place:

    mix32 / mix32_reference   Wellons' "lowbias32" integer mixer, on int32 tensors (torch has no unsigned
                              32-bit shift, so each shift is masked) and on Python ints (for tests and keys)
    stream_key, sampled_stream_key   the key of one pass's layer (full-batch; one sampled step of one rank)
    splitmix64, sample_key, edge_scores   64-bit SplitMix on numpy uint64 (the sampler's neighbour scores)
    fingerprint_words         a per-node 64-bit word of a graph's fingerprint (checkpoints), not random at all
                              but the same family of mixers
    keyed_normal              an embedding row's initial N(0, 1) values from (seed, its id) (typed graphs)

The native kernels (kernels/native_kernels.cpp) implement mix32 bit for bit.
"""
from __future__ import annotations

import numpy as np
import torch

GOLDEN32 = 0x9E3779B9  # 2**32 / golden ratio: spreads consecutive ids over the 32-bit words

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)
_RELATION_KEY = np.uint64(0xD6E8FEB86659FD93)  # spreads relation indices apart in sample_key


def to_int32(value: int) -> int:
    """A Python int's low 32 bits as a signed int32 value (what an int32 tensor holds)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= (1 << 31) else value


def wrap_int32(values: torch.Tensor) -> torch.Tensor:
    """int64 -> int32 keeping the low 32 bits (two's complement)."""
    values = values & 0xFFFFFFFF
    return torch.where(values >= (1 << 31), values - (1 << 32), values).to(torch.int32)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (32 - bits)) - 1)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int32 tensors (bit patterns as unsigned 32-bit words); int32 products wrap as it needs."""
    x = x ^ _shr(x, 16)
    x = x * to_int32(0x7FEB352D)
    x = x ^ _shr(x, 15)
    x = x * to_int32(0x846CA68B)
    return x ^ _shr(x, 16)


def mix32_reference(value: int) -> int:
    """The same mixer on Python ints."""
    value &= 0xFFFFFFFF
    value ^= value >> 16
    value = (value * 0x7FEB352D) & 0xFFFFFFFF
    value ^= value >> 15
    value = (value * 0x846CA68B) & 0xFFFFFFFF
    return value ^ (value >> 16)


def stream_key(seed: int, epoch: int, layer: int) -> int:
    """The key of one full-batch pass's layer."""
    key = mix32_reference(seed ^ 0x5BD1E995)
    key = mix32_reference(key ^ (epoch * 0x27D4EB2F))
    return mix32_reference(key ^ (layer * 0x165667B1))


def sampled_stream_key(seed: int, epoch: int, step: int, rank: int, layer: int) -> int:
    """Dropout key of one sampled step's layer: rank and step mixed in, so ranks' batches draw apart."""
    key = mix32_reference(stream_key(seed, epoch, layer) ^ (step * 0x2C1B3C6D))
    return mix32_reference(key ^ (rank * 0x297A2D39 + 1))


def id_hash(ids: torch.Tensor, key: int) -> torch.Tensor:
    """One 32-bit word per original id under `key` (int32): the row half of a keyed mask."""
    return mix32(wrap_int32(ids.to(torch.int64) * GOLDEN32) ^ to_int32(key))


def column_hash(num_cols: int, device: torch.device) -> torch.Tensor:
    """One 32-bit word per column (int32, on `device`): the column half of a keyed mask."""
    return mix32(wrap_int32(torch.arange(num_cols, dtype=torch.int64, device=device) * 0x85EBCA77 + 1))


# rows of keyed_normal hashed at once: a few MB of temporaries at any width up to a few hundred
KEYED_NORMAL_CHUNK_ROWS = 4096


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (callers silence numpy's overflow warnings: products wrap)."""
    x = x + _M1
    x = (x ^ (x >> np.uint64(30))) * _M2
    x = (x ^ (x >> np.uint64(27))) * _M3
    return x ^ (x >> np.uint64(31))


def sample_key(seed: int, epoch: int, step: int, hop: int, relation: int | None = None) -> np.uint64:
    """The key of one sampling hop of one step (on a typed graph, of one relation's draw in that hop: each
    relation draws apart, even where two relations join the same pair of nodes)."""
    with np.errstate(over="ignore"):
        key = splitmix64(np.array([seed], dtype=np.uint64))
        for value in (epoch, step, hop):
            key = splitmix64(key ^ np.uint64(value))
        if relation is not None:
            key = splitmix64(key ^ (np.uint64(relation + 1) * _RELATION_KEY))
    return key[0]


def edge_scores(key: np.uint64, target_orig: np.ndarray, source_orig: np.ndarray) -> np.ndarray:
    """A uniform 64-bit score per (target, candidate neighbour) pair by original ids."""
    with np.errstate(over="ignore"):
        return splitmix64(splitmix64(target_orig.astype(np.uint64) ^ key) ^ source_orig.astype(np.uint64))


def fingerprint_words(node_ids: np.ndarray, labels: np.ndarray, degrees: np.ndarray) -> np.ndarray:
    """A 64-bit word per node from its (original id, label, degree): summed over nodes, a graph's fingerprint
    that any partition of it gives alike (gnn_dist.resilience.checkpoint.graph_identity)."""
    with np.errstate(over="ignore"):
        words = node_ids.astype(np.uint64) * _M1
        words ^= labels.astype(np.uint64) * _M2 + degrees.astype(np.uint64)
        words ^= words >> np.uint64(31)
        words *= _M3
        words ^= words >> np.uint64(29)
    return words


def keyed_normal(ids: np.ndarray, seed: int, width: int, dtype=np.float64,
                 chunk_rows: int = KEYED_NORMAL_CHUNK_ROWS) -> np.ndarray:
    """[len(ids), width] of standard normal values (computed in float64, returned as `dtype`), each row a
    function of (seed, its id) alone: a learnable embedding row's initial value (N(0, 1), as
    torch.nn.Embedding's), the same at every P and on whichever rank owns the row. Box-Muller on two 53-bit
    uniforms from SplitMix64 of (seed, id, column). chunk_rows rows at a time: each step of the hash makes a
    [rows, 2 x width] uint64 temporary, which over a whole shard of ogbn-mag's authors (600k rows at P=2) took
    gigabytes at set-up's peak; chunks change no value."""
    ids = np.asarray(ids, dtype=np.uint64)
    out = np.empty((len(ids), width), dtype=dtype)
    columns = np.arange(2 * width, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        seed_word = splitmix64(np.array([seed], dtype=np.uint64) ^ np.uint64(0x6A09E667F3BCC909))
        for start in range(0, len(ids), chunk_rows):
            base = splitmix64(seed_word ^ ids[start:start + chunk_rows])
            words = splitmix64(base[:, None] ^ columns[None, :])
            uniform = ((words >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)  # in (0, 1)
            u1, u2 = uniform[:, :width], uniform[:, width:]
            out[start:start + len(base)] = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return out
