"""Seeded typed graphs with ogbn-mag's shape (docs/hetero.md, "synthetic:mag"), for measuring at its scale.

    synthetic:mag        ogbn-mag's counts: 736,389 papers (128 features, 349 classes), 1,134,649 authors,
                         8,740 institutions, 59,965 fields of study (featureless); writes (author-paper)
                         7,145,660, cites (paper-paper) 5,416,271, has_topic (paper-field) 7,505,078,
                         affiliated_with (author-institution) 1,043,998
    synthetic:mag200k    the same at a tenth of each count: about 194k nodes
    synthetic:magtiny    the same at 1/500: about 3.9k nodes, for tests

How it is drawn, fixed before any figure was measured on it (report its replication factor beside every
figure; its locality is not tuned to a target):
- Every paper has a class, and every author, institution and field a home class, with class sizes falling
  as a power law (Zipf exponent 1), all drawn once.
- A paper's counts of references, authors and topics, and an author's count of institutions, are lognormal
  (sigma 1) around ogbn-mag's means (edge count over source count), at least one each (references and
  affiliations may be zero, as in ogbn-mag).
- Each edge's other end is, with probability 0.7, of the paper's (or author's) class and otherwise of any
  class; within the chosen class it is the entity at position floor(n * u^3) of a random order of that class's
  entities (u uniform), so a few entities of each class gather most edges: heavy-tailed degrees.
- Papers' features are their class's centroid (unit normal, 128 values) scaled by 0.1 plus unit noise, as the
  homogeneous synthetic graphs' are.
- A synthetic year splits the papers as ogbn-mag's time split does: 85.5% train, 8.8% valid, 5.7% test.

Only numpy's PCG64 generator is used, in a fixed order: the same (name, seed) gives the same graph anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn_dist.partition.graph import DatasetError
from gnn_dist.partition.hetero import HeteroGraph

TYPES = ("paper", "author", "institution", "field_of_study")
FULL_NODES = {"paper": 736_389, "author": 1_134_649, "institution": 8_740, "field_of_study": 59_965}
# (source type, relation, target type): ogbn-mag's edge count
FULL_EDGES = {("author", "affiliated_with", "institution"): 1_043_998, ("author", "writes", "paper"): 7_145_660,
              ("paper", "cites", "paper"): 5_416_271, ("paper", "has_topic", "field_of_study"): 7_505_078}
CLASSES = 349
FEATURES = 128
IN_CLASS = 0.7          # the chance that an edge's other end shares the class
POPULARITY = 3.0        # u^3: position within the class's random order, so a few entities gather most edges
FEATURE_SIGNAL = 0.1
SPLIT = (0.855, 0.088, 0.057)


@dataclass(frozen=True)
class MagSpec:
    scale: float
    in_class: float = IN_CLASS  # lower draws more edges across classes: a higher cut (benchmarks stress with it)


MAG_PRESETS = {"mag": MagSpec(1.0), "mag200k": MagSpec(0.1), "magtiny": MagSpec(0.002)}


def make_synthetic_mag(name: str, seed: int = 0) -> HeteroGraph:
    if name not in MAG_PRESETS:
        raise DatasetError(f"synthetic:{name}: unknown typed preset: use one of {', '.join(MAG_PRESETS)}")
    return make_mag(MAG_PRESETS[name], name, seed)


def make_mag(spec: MagSpec, name: str, seed: int = 0) -> HeteroGraph:
    """The graph of `spec` (the module's docstring says how it is drawn), named synthetic:`name`."""
    scale = spec.scale
    rng = np.random.default_rng([seed, 0x6D6167])
    counts = {t: max(CLASSES if t == "paper" else 1, int(round(n * scale))) for t, n in FULL_NODES.items()}
    class_weights = 1.0 / np.arange(1, CLASSES + 1)
    class_weights /= class_weights.sum()
    home = {t: rng.choice(CLASSES, size=counts[t], p=class_weights) for t in TYPES}
    members = {t: _ClassMembers(home[t], rng) for t in TYPES}
    edges = {}
    for (src, rel, dst), full in FULL_EDGES.items():
        # the side whose per-node counts ogbn-mag fixes: a paper's authors, references and topics, an
        # author's institutions; the other end is drawn for each of its edges
        driver, other = (dst, src) if rel == "writes" else (src, dst)
        per_node = _lognormal_counts(rng, counts[driver], full / FULL_NODES[driver],
                                     at_least_one=rel in ("writes", "has_topic"))
        ends = np.repeat(np.arange(counts[driver], dtype=np.int64), per_node)
        same = rng.random(len(ends)) < spec.in_class
        wanted = np.where(same, home[driver][ends], rng.choice(CLASSES, size=len(ends), p=class_weights))
        drawn = members[other].draw(wanted, rng)
        edges[(src, rel, dst)] = np.stack([drawn, ends] if rel == "writes" else [ends, drawn])
    y = home["paper"].astype(np.int64)
    centroids = rng.standard_normal((CLASSES, FEATURES)).astype(np.float32)
    x = (FEATURE_SIGNAL * centroids[y] + rng.standard_normal((counts["paper"], FEATURES)).astype(np.float32))
    split = rng.choice(3, size=counts["paper"], p=SPLIT)
    graph = HeteroGraph(name=f"synthetic:{name}", node_types=TYPES, target="paper", num_nodes=counts,
                        x={"paper": x.astype(np.float32)}, edges={r: edges[r] for r in FULL_EDGES}, y=y,
                        train_mask=split == 0, val_mask=split == 1, test_mask=split == 2, num_classes=CLASSES)
    graph.validate()
    return graph


def _lognormal_counts(rng, n: int, mean: float, at_least_one: bool) -> np.ndarray:
    """n counts, lognormal with sigma 1 around `mean` (its mean is exp(mu + 1/2))."""
    draws = np.floor(rng.lognormal(np.log(mean) - 0.5, 1.0, size=n) + 0.5).astype(np.int64)
    return np.maximum(draws, 1) if at_least_one else draws


class _ClassMembers:
    """Entities grouped by home class, each class in a random order; draw() picks, for each wanted class, the
    entity at floor(size * u^POPULARITY) of its order (a class with no entity gives way to a random entity)."""

    def __init__(self, home: np.ndarray, rng):
        order = np.lexsort((rng.random(len(home)), home))
        self.ordered = order.astype(np.int64)
        self.start = np.searchsorted(home[order], np.arange(CLASSES + 1))
        self.size = np.diff(self.start)

    def draw(self, wanted: np.ndarray, rng) -> np.ndarray:
        size = self.size[wanted]
        empty = size == 0
        position = np.floor(size * rng.random(len(wanted)) ** POPULARITY).astype(np.int64)
        picked = self.ordered[np.minimum(self.start[wanted] + position, len(self.ordered) - 1)]
        if empty.any():
            picked[empty] = rng.integers(0, len(self.ordered), int(empty.sum()))
        return picked
