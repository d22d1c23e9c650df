"""A dataset added from one file (--plugin tests/plugins/grid.py --dataset test-grid:N): an N x N grid whose
nodes' class is their quadrant, with features that are their position plus noise."""
from __future__ import annotations

import numpy as np

from gnn_dist.partition.datasets import register_dataset
from gnn_dist.partition.graph import DatasetError, Graph, GraphSizes, random_split, symmetrize

FEATURES = 4


def _side(arg: str) -> int:
    if not arg.isdigit() or int(arg) < 2:
        raise DatasetError(f"test-grid:{arg}: give the side as an integer of at least 2, like test-grid:20")
    return int(arg)


def grid_sizes(arg, root) -> GraphSizes:
    n = _side(arg)
    return GraphSizes(n * n, FEATURES, 2 * n * (n - 1))


@register_dataset("test-grid", "test-grid:N", sizes=grid_sizes)
def load_grid(arg, root, *, seed, download) -> Graph:
    n = _side(arg)
    ids = np.arange(n * n).reshape(n, n)
    right = np.stack([ids[:, :-1].ravel(), ids[:, 1:].ravel()])
    down = np.stack([ids[:-1, :].ravel(), ids[1:, :].ravel()])
    rows, cols = np.divmod(np.arange(n * n), n)
    y = (2 * (rows >= n // 2) + (cols >= n // 2)).astype(np.int64)
    noise = np.random.default_rng(seed).normal(scale=0.5, size=(n * n, FEATURES))
    x = (np.stack([rows / n, cols / n, rows * cols / n**2, np.ones(n * n)], 1) + noise).astype(np.float32)
    return Graph(f"test-grid:{n}", symmetrize(np.concatenate([right, down], 1), n * n), x, y,
                 *random_split(n * n, seed, (0.6, 0.2, 0.2)), num_classes=4)
