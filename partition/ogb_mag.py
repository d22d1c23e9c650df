"""ogbn-mag, typed, read offline from OGB's raw layout with ogb's own reader:

    --dataset ogbn-mag --root DIR          (DIR/ogbn_mag/raw/..., DIR/ogbn_mag/split/time/paper/...)

What is read (ogb.io.read_graph_raw.read_csv_heterograph_raw, then the labels and the split):
- raw/num-node-dict.csv.gz: the four node types and their counts (paper, author, institution, field_of_study);
- raw/triplet-type-list.csv.gz and raw/relations/SRC___REL___DST/edge.csv.gz: the four relations (author
  affiliated_with institution, author writes paper, paper cites paper, paper has_topic field_of_study), with
  type-local ids;
- raw/node-feat/paper/node-feat.csv.gz: the papers' 128 features (the other three types have none, so they
  learn embeddings);
- raw/node-label/paper/node-label.csv.gz: each paper's venue, 349 classes;
- split/time/paper/{train,valid,test}.csv.gz: the official split by year (629,571 / 64,879 / 41,939).

The target type is paper, listed first; the other types follow in ogb's (sorted) order. Reverse relations are
added at partitioning, as for hetero:PATH (PyG's ToUndirected). Reading the csv files takes minutes at full
size, so the graph is kept beside them as a typed .npz (gnn_dist_cache_hetero.npz, written under a temporary
name and renamed) and read from there afterwards; nothing is downloaded and nothing is unpickled.
"""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import numpy as np

from gnn_dist.partition.graph import DatasetError
from gnn_dist.partition.hetero import HeteroGraph, load_hetero_npz, save_hetero_npz
from gnn_dist.partition.ogb_raw import import_ogb_quietly, ogb_meta
from gnn_dist.partition.registry import need_root, register_dataset

NAME = "ogbn-mag"
TARGET = "paper"
CACHE = "gnn_dist_cache_hetero.npz"


def expected_files(base: Path, split: str) -> list[Path]:
    raw = base / "raw"
    return [raw / "num-node-dict.csv.gz", raw / "triplet-type-list.csv.gz",
            raw / "node-feat" / TARGET / "node-feat.csv.gz", raw / "node-label" / TARGET / "node-label.csv.gz",
            *(base / "split" / split / TARGET / f"{part}.csv.gz" for part in ("train", "valid", "test"))]


def load_ogbn_mag(root: Path, download: bool = False) -> HeteroGraph:
    """ogbn-mag as a HeteroGraph (type-local ids; no reverse relations yet), from the cache when it is there."""
    import pandas as pd

    base = Path(root) / NAME.replace("-", "_")
    cache = base / CACHE
    if cache.is_file():
        return _named(load_hetero_npz(str(cache)))
    meta = ogb_meta(NAME)
    missing = [str(p) for p in expected_files(base, meta["split"]) if not p.is_file()]
    if missing:
        fetch = " (--download does not fetch it: download mag.zip where there is internet)" if download else ""
        raise DatasetError(f"{NAME}: missing {', '.join(missing)}: place OGB's raw files under {base} (as ogb "
                           f"unpacks mag.zip), or pass the right --root{fetch}")
    raw_readers, _ = import_ogb_quietly()
    quiet = io.StringIO()  # ogb prints its progress and tqdm bars; the command prints its own one line
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        try:
            graph_dict = raw_readers.read_csv_heterograph_raw(str(base / "raw"), add_inverse_edge=False)[0]
        except (RuntimeError, FileNotFoundError, KeyError, ValueError) as err:
            raise DatasetError(f"{NAME}: cannot read the raw files under {base / 'raw'} ({err}): place OGB's "
                               f"raw files there as ogb unpacks mag.zip") from None
    num_nodes = {t: int(np.asarray(count).reshape(-1)[0]) for t, count in graph_dict["num_nodes_dict"].items()}
    node_types = (TARGET, *sorted(t for t in num_nodes if t != TARGET))
    papers = num_nodes[TARGET]
    labels = pd.read_csv(base / "raw" / "node-label" / TARGET / "node-label.csv.gz", compression="gzip",
                         header=None).values.reshape(-1)
    masks = []
    for part in ("train", "valid", "test"):
        ids = pd.read_csv(base / "split" / meta["split"] / TARGET / f"{part}.csv.gz", compression="gzip",
                          header=None).values.reshape(-1).astype(np.int64)
        mask = np.zeros(papers, dtype=bool)
        mask[ids] = True
        masks.append(mask)
    graph = HeteroGraph(
        name=NAME, node_types=node_types, target=TARGET, num_nodes={t: num_nodes[t] for t in node_types},
        x={t: np.asarray(v, dtype=np.float32) for t, v in graph_dict["node_feat_dict"].items()},
        edges={tuple(r): np.asarray(e, dtype=np.int64) for r, e in graph_dict["edge_index_dict"].items()},
        y=labels.astype(np.int64), train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
        num_classes=int(meta["num classes"]))
    graph.validate()
    temporary = cache.with_name(f".{CACHE}.{os.getpid()}.tmp.npz")
    try:
        save_hetero_npz(graph, temporary)
        os.replace(temporary, cache)
    except OSError:  # a read-only data folder keeps no cache: the next run reads the csv files again
        with contextlib.suppress(OSError):
            temporary.unlink()
    return graph


def _named(graph: HeteroGraph) -> HeteroGraph:
    import dataclasses

    return dataclasses.replace(graph, name=NAME)


register_dataset(NAME, NAME, takes_arg=False)(
    lambda arg, root, *, seed, download: load_ogbn_mag(need_root(NAME, root), download))
