"""OGB's link-prediction datasets with their official splits, read offline from OGB's raw layout:

    --dataset ogbl-collab|ogbl-ppa|ogbl-ddi|ogbl-citation2 --root DIR      (DIR/ogbl_collab/raw/..., split/...)

They have no node labels: only partitioning with --task link takes them. What is read:

- raw/num-node-list.csv.gz and raw/node-feat.csv.gz (ogbl-ddi has no node features: each node gets a one-hot
  row of its id, so the first layer's weight is a learnable embedding per node, as OGB's ddi examples learn);
- split/<split>/{train,valid,test}.pt, OGB's dictionaries of arrays. They are torch pickles: they are read
  with torch.load(weights_only=True) and only numpy's array reconstruction allowed besides tensors, so a file
  holding any other object is refused rather than executed (nothing is unpickled beyond numeric arrays).

The message-passing graph is the training edges, undirected (duplicates, as collab's repeated
collaborations, kept once); validation and test edges never enter it. Positives and negatives are the
official ones: `edge` and `edge_neg` (collab, ppa, ddi), or citation2's `source_node`, `target_node` and its
1,000 `target_node_neg` per positive, which MRR ranks against (its AUC and Hits@K pair each positive with its
first official negative). For the Hits datasets MRR ranks each positive against --mrr-negatives seeded
destinations, as for any graph. The official metric comes from OGB's Evaluator (gnn_dist.link.metrics).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from gnn_dist.partition.graph import DatasetError, Graph
from gnn_dist.partition.link_split import LinkSplit, with_edges
from gnn_dist.partition.registry import need_root, register_dataset

# name -> (folder, split folder, directed positives: citation2's are source -> target)
OGBL = {"ogbl-collab": ("ogbl_collab", "time", False), "ogbl-ppa": ("ogbl_ppa", "throughput", False),
        "ogbl-ddi": ("ogbl_ddi", "target", False), "ogbl-citation2": ("ogbl_citation2", "time", True)}


def read_split_file(path: Path) -> dict:
    """One of OGB's split dictionaries as numpy arrays; DatasetError when missing or holding anything else."""
    import torch
    from numpy._core.multiarray import _reconstruct

    numeric = [type(np.dtype(t)) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                            np.float16, np.float32, np.float64)]
    if not path.is_file():
        raise DatasetError(f"{path} is missing: place OGB's split files there (as ogb unpacks them)")
    try:
        with torch.serialization.safe_globals([_reconstruct, np.ndarray, np.dtype, *numeric]):
            raw = torch.load(path, weights_only=True)
    except Exception as err:  # noqa: BLE001 - a refused global, a damaged zip: one message
        raise DatasetError(f"{path}: not a split file of plain arrays ({str(err).splitlines()[0][:120]}): "
                           f"re-download the dataset") from err
    if not isinstance(raw, dict):
        raise DatasetError(f"{path}: expected a dictionary of arrays, found {type(raw).__name__}")
    return {key: np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value) for key, value in raw.items()}


def _read_csv(path: Path) -> np.ndarray:
    import pandas as pd

    if not path.is_file():
        raise DatasetError(f"{path} is missing: place OGB's raw files there (as ogb unpacks them)")
    return pd.read_csv(path, compression="gzip", header=None).values


def _unique_pairs(pairs: np.ndarray, directed: bool) -> np.ndarray:
    """Each pair once ((smaller, larger) when undirected), self loops dropped, sorted."""
    pairs = pairs.astype(np.int64)
    if not directed:
        pairs = np.sort(pairs, axis=1)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return np.unique(pairs, axis=0) if len(pairs) else pairs.reshape(0, 2)


def load_ogbl(name: str, root: Path) -> Graph:
    folder, split_name, directed = OGBL[name]
    base = root / folder
    if not base.is_dir():
        raise DatasetError(f"{name}: no folder {base}: place OGB's unpacked {folder} there (or pass the right --root)")
    num_nodes = int(_read_csv(base / "raw" / "num-node-list.csv.gz")[0, 0])
    if name == "ogbl-ddi":
        x = np.eye(num_nodes, dtype=np.float32)
    else:
        x = _read_csv(base / "raw" / "node-feat.csv.gz").astype(np.float32)
    if x.shape[0] != num_nodes:
        raise DatasetError(f"{base / 'raw'}: node-feat has {x.shape[0]} rows for {num_nodes} nodes: re-download")
    split_dir = base / "split" / split_name
    parts = {phase: read_split_file(split_dir / f"{phase}.pt") for phase in ("train", "valid", "test")}
    try:
        if directed:
            train = _unique_pairs(np.stack([parts["train"]["source_node"], parts["train"]["target_node"]], 1), True)
            held = {}
            for phase in ("valid", "test"):
                pos = np.stack([parts[phase]["source_node"], parts[phase]["target_node"]], 1).astype(np.int64)
                mrr = parts[phase]["target_node_neg"].astype(np.int64)
                held[phase] = (pos, np.stack([pos[:, 0], mrr[:, 0]], 1), mrr)
        else:
            train = _unique_pairs(parts["train"]["edge"], False)
            held = {phase: (parts[phase]["edge"].astype(np.int64), parts[phase]["edge_neg"].astype(np.int64),
                            None) for phase in ("valid", "test")}
    except KeyError as err:
        raise DatasetError(f"{split_dir}: split files without {err}: re-download {name}") from None
    for phase, arrays in held.items():
        for array in arrays:
            if array is None:
                continue  # the Hits datasets: the partitioner draws MRR's destinations (--mrr-negatives)
            if array.size and (array.min() < 0 or array.max() >= num_nodes):
                raise DatasetError(f"{split_dir / phase}.pt names nodes outside 0..{num_nodes - 1}: re-download")
    split = LinkSplit(train=train, val_pos=held["valid"][0], val_neg=held["valid"][1], val_mrr=held["valid"][2],
                      test_pos=held["test"][0], test_neg=held["test"][1], test_mrr=held["test"][2])
    unlabelled = np.zeros(num_nodes, dtype=bool)
    graph = Graph(name=name, edge_index=np.zeros((2, 0), dtype=np.int64), x=x, y=np.zeros(num_nodes, np.int64),
                  train_mask=unlabelled, val_mask=unlabelled.copy(), test_mask=unlabelled.copy(), num_classes=1)
    return dataclasses.replace(with_edges(graph, _unique_pairs(train, False)), link_split=split)


for _name in OGBL:
    register_dataset(_name, _name, takes_arg=False)(
        lambda arg, root, *, seed, download, _name=_name: load_ogbl(_name, need_root(_name, root)))
