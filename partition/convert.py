"""`gnn-dist convert`: any dataset SPEC as a chunked directory (gnn_dist.partition.chunked), streaming where it can.

- synthetic presets are drawn and written chunk by chunk (SyntheticDraw), so the
  peak is a few node-sized arrays and one edge chunk, not the graph;
- OGB's csv.gz datasets (arxiv, products) are read with pandas in chunks;
- everything else (Planetoid, npz, OGB's binary papers100M files) is loaded
  whole once and then written in chunks.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from gnn_dist.partition.chunked import DEFAULT_EDGES_PER_CHUNK, DEFAULT_NODES_PER_CHUNK, ChunkedMeta, ChunkedWriter, write_graph
from gnn_dist.partition.datasets import (
    OGB_NAMES,
    dataset_kind,
    import_ogb_quietly,
    load_dataset,
    need_root,
    ogb_expected_files,
    ogb_meta,
    ogb_split_masks,
)
from gnn_dist.partition.graph import DatasetError
from gnn_dist.partition.registry import register_converter
from gnn_dist.partition.synthetic import SyntheticDraw

CSV_ROWS = 4_000_000  # rows of a csv.gz read at a time


def convert(spec: str, out: str | os.PathLike, *, root: str | os.PathLike | None = None, seed: int = 0,
            overwrite: bool = False, edges_per_chunk: int = DEFAULT_EDGES_PER_CHUNK,
            nodes_per_chunk: int = DEFAULT_NODES_PER_CHUNK) -> ChunkedMeta:
    """Write `spec` as a chunked directory: streamed where its dataset kind can (DatasetKind.convert), else
    loaded whole once and written in chunks."""
    entry, arg = dataset_kind(spec)
    if entry.convert is not None:
        return entry.convert(arg, root, out, seed=seed, overwrite=overwrite, edges_per_chunk=edges_per_chunk,
                             nodes_per_chunk=nodes_per_chunk)
    graph = load_dataset(spec, root, seed=seed)
    return write_graph(graph, out, overwrite=overwrite, nodes_per_chunk=nodes_per_chunk,
                       edges_per_chunk=edges_per_chunk)


def convert_synthetic(name: str, out, *, seed: int, overwrite: bool, edges_per_chunk: int,
                      nodes_per_chunk: int) -> ChunkedMeta:
    """A synthetic preset drawn and written chunk by chunk: the peak is a few node-sized arrays and one edge chunk."""
    draw = SyntheticDraw(name, seed)
    spec = draw.spec
    with ChunkedWriter(out, name=f"synthetic:{name}", num_nodes=spec.num_nodes, num_features=spec.num_features,
                       num_classes=spec.num_classes, overwrite=overwrite, edges_per_chunk=edges_per_chunk) as writer:
        for src, dst in draw.edge_chunks():
            writer.add_edges(src, dst)
        train, val, test = draw.masks()
        for start, rows in draw.feature_rows():
            stop = start + rows.shape[0]
            writer.add_nodes(rows, draw.y[start:stop], train[start:stop], val[start:stop], test[start:stop])
        return writer.finish()


def convert_ogb(name: str, root: Path, out, *, seed: int, overwrite: bool, edges_per_chunk: int,
                nodes_per_chunk: int) -> ChunkedMeta:
    """OGB's csv.gz datasets (arxiv, products) read with pandas in chunks; its binary ones (papers100M) loaded
    whole once, then written in chunks."""
    if ogb_meta(name)["binary"] == "True":
        graph = load_dataset(name, root, seed=seed)
        return write_graph(graph, out, overwrite=overwrite, nodes_per_chunk=nodes_per_chunk,
                           edges_per_chunk=edges_per_chunk)
    import pandas as pd

    import_ogb_quietly()
    meta = ogb_meta(name)
    base = root / name.replace("-", "_")
    missing = [p for p in ogb_expected_files(name, root) if not p.is_file()]
    if missing:
        raise DatasetError(f"{name}: missing {', '.join(str(p) for p in missing)}: place OGB's raw files under {base}")
    raw = base / "raw"
    num_nodes = int(pd.read_csv(raw / "num-node-list.csv.gz", header=None).values.sum())
    masks = ogb_split_masks(base, meta, num_nodes)
    num_features = len(pd.read_csv(raw / "node-feat.csv.gz", header=None, nrows=1).columns)
    with ChunkedWriter(out, name=name, num_nodes=num_nodes, num_features=num_features,
                       num_classes=int(meta["num classes"]), overwrite=overwrite,
                       edges_per_chunk=edges_per_chunk) as writer:
        for frame in pd.read_csv(raw / "edge.csv.gz", header=None, dtype=np.int64, chunksize=CSV_ROWS):
            edges = frame.values
            writer.add_edges(edges[:, 0], edges[:, 1])
        features = pd.read_csv(raw / "node-feat.csv.gz", header=None, dtype=np.float32, chunksize=nodes_per_chunk)
        labels = pd.read_csv(raw / "node-label.csv.gz", header=None, chunksize=nodes_per_chunk)
        for x_frame, y_frame in zip(features, labels):
            start = writer.nodes_written
            stop = start + len(x_frame)
            y = y_frame.values[:, 0].astype(np.float64)
            y = np.where(np.isnan(y), -1, y).astype(np.int64)  # unlabelled nodes carry NaN
            writer.add_nodes(x_frame.values, y, *(mask[start:stop] for mask in masks))
        return writer.finish()


def _convert_ogb(name: str):
    def convert_one(arg, root, out, **options):
        return convert_ogb(name, need_root(name, root), out, **options)
    return convert_one


# The built-in kinds that stream: a synthetic preset drawn chunk by chunk, OGB's csv files read in pieces.
register_converter("synthetic", lambda arg, root, out, **options: convert_synthetic(arg, out, **options))
for _name in OGB_NAMES:
    register_converter(_name, _convert_ogb(_name))
