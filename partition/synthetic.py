"""Seeded synthetic graphs shaped like citation graphs.

A degree-corrected stochastic block model: every node belongs to a community
(its class), has a heavy-tailed "activity" weight (so degrees follow a power
law), and most of its edges stay inside its community (so METIS finds the
communities and GCN gains from aggregation). Features are a class centroid
plus noise, so they predict the class only in part and the graph is needed
for good accuracy (on `small`, a 2-layer MLP scores about 27% test accuracy
and a 2-layer GCN about 88%). Everything is vectorised: `arxiv` (169,343 nodes, about
1.17M directed edges before symmetrisation) generates in a few seconds.

The same (name, seed) gives the same graph on every machine: only numpy's
PCG64 generator is used, in a fixed order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn_dist.partition.graph import DatasetError, Graph, add_both_directions, edges_from_keys, random_split


@dataclass(frozen=True)
class SyntheticSpec:
    num_nodes: int
    num_directed_edges: int
    num_features: int
    num_classes: int
    intra_fraction: float  # share of edges whose endpoints share a community
    feature_signal: float  # centroid scale against unit noise
    split: tuple[float, float, float]


PRESETS: dict[str, SyntheticSpec] = {
    "tiny": SyntheticSpec(400, 1_600, 16, 4, 0.8, 0.25, (0.6, 0.2, 0.2)),
    "small": SyntheticSpec(5_000, 30_000, 64, 10, 0.7, 0.12, (0.5, 0.2, 0.3)),
    # A stress test for lossy schedules: 2 classes (unequal sizes), weak homophily (about 55% of edges join
    # nodes of one class, where 50% would be chance) and no community structure for METIS to follow, so it
    # cuts over 40% of the edges at P=4; the features carry a weak class signal.
    "weak": SyntheticSpec(20_000, 100_000, 32, 2, 0.1, 0.3, (0.6, 0.2, 0.2)),
    # The speed benchmarks' graph (gnn_dist.benchmarks.regression): 60k nodes, about 600k directed edges after
    # symmetrisation, 128 features.
    "sbm60k": SyntheticSpec(60_000, 300_000, 128, 40, 0.65, 0.1, (0.54, 0.18, 0.28)),
    # ogbn-arxiv's size: 169,343 nodes, 1,166,243 directed edges, 128 features, 40 classes;
    # its time split is 54% / 18% / 28%.
    "arxiv": SyntheticSpec(169_343, 1_166_243, 128, 40, 0.65, 0.1, (0.54, 0.18, 0.28)),
    # A sixth of ogbn-products (400,000 nodes, about 12M directed edges after symmetrisation) with its
    # 100 features, 47 classes and its sales-rank split (8% / 1.6% / 90.4%): the graph the sampled-memory
    # benchmark runs on, small enough to train full-batch on one 24 GiB host for the comparison.
    "medium": SyntheticSpec(400_000, 6_100_000, 100, 47, 0.7, 0.1, (0.08, 0.016, 0.904)),
    # Past the 600k nodes the scale-out memory benchmark needs, with replication above 1.8 at P=2.
    "large": SyntheticSpec(600_000, 9_200_000, 100, 47, 0.7, 0.1, (0.08, 0.016, 0.904)),
    # ogbn-products' size: 2,449,029 nodes, about 62M undirected edges (122.3M directed after
    # symmetrisation), 100 features, 47 classes, its 8% / 1.6% / 90.4% split.
    "products": SyntheticSpec(2_449_029, 62_000_000, 100, 47, 0.7, 0.1, (0.08, 0.016, 0.904)),
}

_EDGE_CHUNK = 8_000_000  # edges per draw; above medium's count, so the existing presets draw in one chunk


def _weighted_pick(rng: np.random.Generator, cumulative: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Indices i drawn with probability proportional to weight, restricted to [low, high) of `cumulative`."""
    start = np.where(low > 0, cumulative[np.maximum(low - 1, 0)], 0.0)
    stop = cumulative[high - 1]
    targets = start + rng.random(low.shape[0]) * (stop - start)
    picked = np.searchsorted(cumulative, targets, side="right")
    return np.minimum(picked, high - 1)


class SyntheticDraw:
    """One seeded draw of a preset, produced in chunks: edge chunks first, then feature rows.

    The chunks come in the order of one whole-graph draw (numpy's PCG64 in a fixed order), so
    `make_synthetic` and `gnn-dist convert` (which writes chunks to disk as they come, in bounded
    memory) give the same graph.
    """

    def __init__(self, name: str, seed: int = 0):
        if name not in PRESETS:
            raise DatasetError(f"unknown synthetic graph {name!r}: use one of "
                               + ", ".join(f"synthetic:{k}" for k in PRESETS))
        self.name, self.seed, self.spec = name, seed, PRESETS[name]
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED]))
        n, c = self.spec.num_nodes, self.spec.num_classes
        # Unequal class sizes, as in real graphs.
        class_share = self.rng.dirichlet(np.full(c, 4.0))
        self.y = self.rng.choice(c, size=n, p=class_share).astype(np.int64)
        # Pareto activity with exponent ~2.5 gives a power-law degree tail.
        activity = self.rng.pareto(1.5, size=n) + 1.0
        activity = np.minimum(activity, np.quantile(activity, 0.9995) * 4)
        # Nodes sorted by community so each community is a contiguous range of
        # the cumulative-weight array and an in-community pick is one searchsorted.
        self.by_community = np.argsort(self.y, kind="stable")
        self.cumulative = np.cumsum(activity[self.by_community])
        self.community_end = np.cumsum(np.bincount(self.y, minlength=c))
        self.community_start = self.community_end - np.bincount(self.y, minlength=c)

    def edge_chunks(self):
        """(source, target) arrays of at most _EDGE_CHUNK drawn edges (self loops and repeats included)."""
        spec, n = self.spec, self.spec.num_nodes
        for start in range(0, spec.num_directed_edges, _EDGE_CHUNK):
            count = min(_EDGE_CHUNK, spec.num_directed_edges - start)
            src = self.by_community[_weighted_pick(self.rng, self.cumulative, np.zeros(count, dtype=np.int64),
                                                   np.full(count, n, dtype=np.int64))]
            inside = self.rng.random(count) < spec.intra_fraction
            low = np.where(inside, self.community_start[self.y[src]], 0)
            high = np.where(inside, self.community_end[self.y[src]], n)
            dst = self.by_community[_weighted_pick(self.rng, self.cumulative, low, high)]
            yield src, dst

    def feature_rows(self):
        """(start, x rows) in node order; call after edge_chunks is exhausted."""
        spec, n = self.spec, self.spec.num_nodes
        centroids = self.rng.standard_normal((spec.num_classes, spec.num_features)) * spec.feature_signal
        rows_per_chunk = max(1, _EDGE_CHUNK // spec.num_features)
        for start in range(0, n, rows_per_chunk):
            stop = min(n, start + rows_per_chunk)
            rows = centroids[self.y[start:stop]] + self.rng.standard_normal((stop - start, spec.num_features))
            yield start, rows.astype(np.float32)

    def masks(self) -> tuple[np.ndarray, ...]:
        return random_split(self.spec.num_nodes, self.seed + 1, self.spec.split)


def make_synthetic(name: str, seed: int = 0) -> Graph:
    draw = SyntheticDraw(name, seed)
    spec, n = draw.spec, draw.spec.num_nodes
    # Edges and features are drawn in chunks, so the generator's peak is about the finished graph, not a
    # dozen edge-sized temporaries: at ogbn-products' size 3.26 GB for a 2.94 GB graph (measured with
    # /usr/bin/time), where drawing everything at once and np.unique needed over 12 GB.
    keys = np.empty(2 * spec.num_directed_edges, dtype=np.int64)
    filled = 0
    for src, dst in draw.edge_chunks():
        filled = add_both_directions(keys, filled, src, dst, n)
        del src, dst
    holder = [keys[:filled]]
    del keys
    edge_index = edges_from_keys(holder, n)
    x = np.empty((n, spec.num_features), dtype=np.float32)
    for start, rows in draw.feature_rows():
        x[start:start + rows.shape[0]] = rows
    train, val, test = draw.masks()
    graph = Graph(f"synthetic:{name}", edge_index, x, draw.y, train, val, test, spec.num_classes)
    graph.validate()
    return graph
