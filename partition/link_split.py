"""Edge splits for link prediction (`gnn-dist partition --task link [--edge-split 0.85,0.05,0.10]`).

The split is seeded and undirected: each undirected edge {u, v} of the graph is drawn into training,
validation or test as a whole. Validation and test edges, in both directions, leave the message-passing
graph before it is partitioned, so no held-out edge ever carries a message; the training positives are the
remaining undirected edges, each once, as (smaller original id, larger) with a global edge id (its index in
that list), which keys its training negatives (gnn_dist.link_negatives).

Validation and test each get, per positive:
- one negative pair (u', v'), uniform over pairs that are not edges of the graph and not self loops
  (AUC and Hits@K rank the positives against these);
- R negative destinations for the positive's own source (`--mrr-negatives R`, default 100; MRR ranks each
  positive against its own R, as OGB's citation2 does).

An edge belongs to the part of its source node: each part stores the training positives, and the
validation and test pairs, whose source it owns (partition/format.py: LINK_ARRAYS). Everything is by
original node id, so every partition of the graph stores the same split.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from gnn_dist.partition.graph import DatasetError, Graph

DEFAULT_EDGE_SPLIT = (0.85, 0.05, 0.10)
DEFAULT_MRR_NEGATIVES = 100


@dataclass(frozen=True)
class LinkSplit:
    """Original-id pairs of a split. train: [T, 2]; *_pos, *_neg: [M, 2]; *_mrr: [M, R] destinations."""

    train: np.ndarray
    val_pos: np.ndarray
    val_neg: np.ndarray
    val_mrr: np.ndarray | None   # None: drawn by with_mrr_negatives (a dataset's split without its own)
    test_pos: np.ndarray
    test_neg: np.ndarray
    test_mrr: np.ndarray | None

    def summary(self) -> dict:
        return {"train": int(self.train.shape[0]), "val": int(self.val_pos.shape[0]),
                "test": int(self.test_pos.shape[0]), "mrr_negatives": int(self.val_mrr.shape[1])}


def parse_edge_split(text: str) -> tuple[float, float, float]:
    """'0.85,0.05,0.10' -> fractions; ValueError naming the form when they are not three that sum to 1."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or any(v <= 0 for v in values) or abs(sum(values) - 1.0) > 1e-6:
        raise ValueError(f"bad --edge-split {text!r}: give train,val,test fractions, each above 0, that sum to 1, "
                         f"like 0.85,0.05,0.10")
    return values  # type: ignore[return-value]


def undirected_edges(graph: Graph) -> np.ndarray:
    """[E, 2] each undirected edge once, (smaller id, larger id), sorted."""
    src, dst = graph.edge_index
    keep = src < dst
    pairs = np.stack([src[keep], dst[keep]], 1)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]


def split_edges(graph: Graph, fractions: tuple[float, float, float], seed: int,
                mrr_negatives: int = DEFAULT_MRR_NEGATIVES) -> tuple[Graph, LinkSplit]:
    """(the message-passing graph: the training edges in both directions; the split)."""
    edges = undirected_edges(graph)
    if edges.shape[0] < 3:
        raise DatasetError(f"{graph.name} has {edges.shape[0]} undirected edges: too few to split for link "
                           f"prediction")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x11A7]))
    order = rng.permutation(edges.shape[0])
    n_val = int(round(fractions[1] * edges.shape[0]))
    n_test = int(round(fractions[2] * edges.shape[0]))
    if min(n_val, n_test) == 0 or n_val + n_test >= edges.shape[0]:
        raise DatasetError(f"{graph.name}: --edge-split {','.join(f'{f:g}' for f in fractions)} leaves "
                           f"{n_val} validation and {n_test} test of {edges.shape[0]} edges: give every part at "
                           f"least one edge")
    val, test = edges[order[:n_val]], edges[order[n_val:n_val + n_test]]
    train = edges[np.sort(order[n_val + n_test:])]
    n = graph.num_nodes
    existing = np.sort(edges[:, 0] * n + edges[:, 1])
    split = LinkSplit(
        train=train,
        val_pos=val, val_neg=_negative_pairs(rng, n, val.shape[0], existing),
        val_mrr=sample_destinations(rng, n, val[:, 0], mrr_negatives),
        test_pos=test, test_neg=_negative_pairs(rng, n, test.shape[0], existing),
        test_mrr=sample_destinations(rng, n, test[:, 0], mrr_negatives),
    )
    return with_edges(graph, train), split


def with_edges(graph: Graph, undirected: np.ndarray) -> Graph:
    """The graph with exactly these undirected edges, in both directions."""
    both = np.concatenate([undirected, undirected[:, ::-1]]).T
    order = np.lexsort((both[0], both[1]))
    return dataclasses.replace(graph, edge_index=np.ascontiguousarray(both[:, order]))


def _negative_pairs(rng: np.random.Generator, n: int, count: int, existing: np.ndarray) -> np.ndarray:
    """count uniform pairs (u, v), u != v, {u, v} not an edge (by rejection)."""
    out = np.empty((0, 2), dtype=np.int64)
    while out.shape[0] < count:
        draw = rng.integers(0, n, size=(2 * (count - out.shape[0]) + 16, 2))
        draw = draw[draw[:, 0] != draw[:, 1]]
        key = np.minimum(draw[:, 0], draw[:, 1]) * n + np.maximum(draw[:, 0], draw[:, 1])
        found = np.searchsorted(existing, key)
        is_edge = (found < existing.size) & (existing[np.minimum(found, existing.size - 1)] == key)
        out = np.concatenate([out, draw[~is_edge]])
    return out[:count].astype(np.int64)


def with_mrr_negatives(split: LinkSplit, num_nodes: int, seed: int, count: int) -> LinkSplit:
    """The split with MRR's negative destinations drawn (seeded) where it has none of its own."""
    if split.val_mrr is not None and split.test_mrr is not None:
        return split
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x3A2]))
    return dataclasses.replace(
        split, val_mrr=split.val_mrr if split.val_mrr is not None else
        sample_destinations(rng, num_nodes, split.val_pos[:, 0], count),
        test_mrr=split.test_mrr if split.test_mrr is not None else
        sample_destinations(rng, num_nodes, split.test_pos[:, 0], count))


def sample_destinations(rng: np.random.Generator, n: int, sources: np.ndarray, count: int) -> np.ndarray:
    """[len(sources), count] destinations uniform over the nodes other than each row's source."""
    draw = rng.integers(0, n - 1, size=(sources.shape[0], count))
    return (draw + (draw >= sources[:, None])).astype(np.int64)


def part_link_arrays(split: LinkSplit, owner: np.ndarray, num_parts: int) -> list[dict]:
    """Per part, the pairs whose source it owns (owner: the part of each original id), with the training
    positives' global edge ids."""
    eid = np.arange(split.train.shape[0], dtype=np.int64)
    arrays = []
    for k in range(num_parts):
        part = {"link_train": split.train[owner[split.train[:, 0]] == k],
                "link_train_eid": eid[owner[split.train[:, 0]] == k]}
        for phase in ("val", "test"):
            mine = owner[getattr(split, f"{phase}_pos")[:, 0]] == k
            part[f"link_{phase}_pos"] = getattr(split, f"{phase}_pos")[mine]
            part[f"link_{phase}_mrr"] = getattr(split, f"{phase}_mrr")[mine]
            mine_neg = owner[getattr(split, f"{phase}_neg")[:, 0]] == k
            part[f"link_{phase}_neg"] = getattr(split, f"{phase}_neg")[mine_neg]
        arrays.append({key: np.ascontiguousarray(value, dtype=np.int64) for key, value in part.items()})
    return arrays
