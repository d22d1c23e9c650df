"""The chunked on-disk graph: node data by id range, edges in bounded files (docs/datasets.md).

    DIR/meta.json          ChunkedMeta: sizes, the node chunks' id ranges, the edge chunks' counts
    DIR/nodes-00000.npz    x float32 [n, F], y int64 [n], train/val/test_mask bool [n] for ids [start, stop)
    DIR/edges-00000.npy    int64 [2, m]: source, target by original id (directed or not, duplicates allowed)

No process needs the whole graph to read or write it: a writer appends node
ranges and edge chunks as it produces them, and a reader takes one chunk at a
time (each rank of the distributed partitioner reads about 1/R of them).
A directory is written under a temporary name and renamed when complete.
Everything is read with allow_pickle=False; every defect is one DatasetError
naming the file and the fix.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gnn_dist.partition.graph import DatasetError, Graph, symmetrize

CHUNKED_FORMAT = "gnn-dist-chunked"
CHUNKED_VERSION = 1
META_FILE = "meta.json"
NODE_FIELDS = {"x": "float32", "y": "int64", "train_mask": "bool", "val_mask": "bool", "test_mask": "bool"}
DEFAULT_EDGES_PER_CHUNK = 8_000_000   # 128 MB of int64 pairs per file
DEFAULT_NODES_PER_CHUNK = 262_144


@dataclass(frozen=True)
class NodeChunk:
    file: str
    start: int
    stop: int


@dataclass(frozen=True)
class EdgeChunk:
    file: str
    count: int


@dataclass(frozen=True)
class ChunkedMeta:
    name: str
    num_nodes: int
    num_features: int
    num_classes: int
    node_chunks: list[NodeChunk]
    edge_chunks: list[EdgeChunk]

    @property
    def num_input_edges(self) -> int:
        """Edges as stored (before symmetrising and de-duplicating)."""
        return sum(chunk.count for chunk in self.edge_chunks)


def _fail(path: Path, problem: str, fix: str = "re-create it with gnn-dist convert") -> DatasetError:
    return DatasetError(f"{path}: {problem}: {fix}")


def read_meta(directory: str | os.PathLike) -> ChunkedMeta:
    """The directory's meta, with its node ranges checked to tile [0, num_nodes) exactly."""
    directory = Path(directory)
    path = directory / META_FILE
    if not path.is_file():
        raise _fail(directory, f"no {META_FILE}, so not a chunked graph directory",
                    "write one with gnn-dist convert --dataset SPEC --out DIR")
    try:
        raw = json.loads(path.read_text())
        if raw.get("format") != CHUNKED_FORMAT or raw.get("version") != CHUNKED_VERSION:
            raise _fail(path, f"format {raw.get('format')!r} version {raw.get('version')!r}, this gnn-dist reads "
                              f"{CHUNKED_FORMAT} version {CHUNKED_VERSION}")
        meta = ChunkedMeta(name=str(raw["name"]), num_nodes=int(raw["num_nodes"]),
                           num_features=int(raw["num_features"]), num_classes=int(raw["num_classes"]),
                           node_chunks=[NodeChunk(str(c["file"]), int(c["start"]), int(c["stop"]))
                                        for c in raw["node_chunks"]],
                           edge_chunks=[EdgeChunk(str(c["file"]), int(c["count"])) for c in raw["edge_chunks"]])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
        if isinstance(err, DatasetError):
            raise
        raise _fail(path, f"malformed ({type(err).__name__}: {err})") from err
    covered = 0
    for chunk in sorted(meta.node_chunks, key=lambda c: (c.start, c.stop)):
        if chunk.start < covered:
            raise _fail(path, f"overlapping node ranges: {chunk.file} starts at node {chunk.start}, "
                              f"before the previous range ends at {covered}")
        if chunk.start > covered or chunk.stop <= chunk.start:
            raise _fail(path, f"nodes [{covered}, {chunk.start}) belong to no node chunk")
        covered = chunk.stop
    if covered != meta.num_nodes or meta.num_nodes == 0:
        raise _fail(path, f"node chunks cover [0, {covered}) but num_nodes is {meta.num_nodes}")
    for chunk in meta.edge_chunks:
        if chunk.count < 0:
            raise _fail(path, f"{chunk.file} has a negative edge count")
    return meta


def read_nodes(directory: str | os.PathLike, meta: ChunkedMeta, start: int, stop: int) -> dict[str, np.ndarray]:
    """NODE_FIELDS of nodes [start, stop), read from the node chunks that overlap the range."""
    directory = Path(directory)
    pieces: dict[str, list[np.ndarray]] = {name: [] for name in NODE_FIELDS}
    for chunk in sorted(meta.node_chunks, key=lambda c: c.start):
        lo, hi = max(start, chunk.start), min(stop, chunk.stop)
        if lo >= hi:
            continue
        arrays = _read_node_chunk(directory / chunk.file, chunk, meta)
        for name in NODE_FIELDS:
            pieces[name].append(arrays[name][lo - chunk.start:hi - chunk.start])
        del arrays
    out = {}
    for name, dtype in NODE_FIELDS.items():
        if pieces[name]:
            out[name] = np.concatenate(pieces[name])
        else:
            shape = (0, meta.num_features) if name == "x" else (0,)
            out[name] = np.zeros(shape, dtype=dtype)
    return out


def _read_node_chunk(path: Path, chunk: NodeChunk, meta: ChunkedMeta) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise _fail(path, f"missing node chunk (nodes [{chunk.start}, {chunk.stop}))")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except Exception as err:  # noqa: BLE001 - zipfile, pickle refusal and OS errors all mean the same
        raise _fail(path, f"unreadable node chunk ({type(err).__name__}: {err})") from err
    rows = chunk.stop - chunk.start
    for name, dtype in NODE_FIELDS.items():
        shape = (rows, meta.num_features) if name == "x" else (rows,)
        array = arrays.get(name)
        if array is None:
            raise _fail(path, f"missing array {name!r}")
        if str(array.dtype) != dtype or array.shape != shape:
            raise _fail(path, f"array {name} is {array.dtype} {array.shape}, expected {dtype} {shape}")
    return arrays


def read_edges(directory: str | os.PathLike, meta: ChunkedMeta, index: int, start: int = 0,
               stop: int | None = None) -> np.ndarray:
    """Edges [start, stop) of chunk `index` as int64 [2, m], their ids checked against [0, num_nodes).

    The file is memory-mapped, so reading a slice costs the slice, not the chunk.
    """
    chunk = meta.edge_chunks[index]
    path = Path(directory) / chunk.file
    if not path.is_file():
        raise _fail(path, f"missing edge chunk ({chunk.count:,} edges)")
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:  # noqa: BLE001
        raise _fail(path, f"unreadable edge chunk ({type(err).__name__}: {err})") from err
    if mapped.dtype != np.int64 or mapped.shape != (2, chunk.count):
        raise _fail(path, f"edges are {mapped.dtype} {mapped.shape}, expected int64 (2, {chunk.count})")
    edges = np.array(mapped[:, start:chunk.count if stop is None else stop])
    del mapped
    if edges.size and (edges.min() < 0 or edges.max() >= meta.num_nodes):
        raise _fail(path, f"edge ids outside [0, {meta.num_nodes})", "fix the edge list")
    return edges


def load_chunked(directory: str | os.PathLike) -> Graph:
    """The whole graph in one process (for pymetis and for checks): symmetrised like every loader."""
    meta = read_meta(directory)
    nodes = read_nodes(directory, meta, 0, meta.num_nodes)
    edges = [read_edges(directory, meta, i) for i in range(len(meta.edge_chunks))]
    edge_index = np.concatenate(edges, axis=1) if edges else np.zeros((2, 0), dtype=np.int64)
    del edges
    graph = Graph(meta.name, symmetrize(edge_index, meta.num_nodes), nodes["x"], nodes["y"],
                  nodes["train_mask"], nodes["val_mask"], nodes["test_mask"], meta.num_classes)
    graph.validate()
    return graph


class ChunkedWriter:
    """Writes a chunked directory piece by piece, under a temporary name until `finish`.

    Node data must come in increasing id order; edges in any order and any
    number of calls (each call's edges are split into files of at most
    edges_per_chunk). Use as a context manager: an exception removes the
    temporary directory, so nothing half-written is left that looks complete.
    """

    def __init__(self, out: str | os.PathLike, *, name: str, num_nodes: int, num_features: int, num_classes: int,
                 overwrite: bool = False, edges_per_chunk: int = DEFAULT_EDGES_PER_CHUNK):
        self.out = Path(out)
        if self.out.exists() and not overwrite:
            raise DatasetError(f"{self.out} already exists: pass --overwrite or choose another --out")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.out.parent / f".{self.out.name}.tmp-{uuid.uuid4().hex[:8]}"
        self.tmp.mkdir()
        self.name, self.num_nodes, self.num_features, self.num_classes = name, num_nodes, num_features, num_classes
        self.edges_per_chunk = max(1, int(edges_per_chunk))
        self.node_chunks: list[NodeChunk] = []
        self.edge_chunks: list[EdgeChunk] = []
        self.nodes_written = 0

    def __enter__(self) -> ChunkedWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return False

    def add_nodes(self, x: np.ndarray, y: np.ndarray, train_mask: np.ndarray, val_mask: np.ndarray,
                  test_mask: np.ndarray) -> None:
        start, stop = self.nodes_written, self.nodes_written + int(x.shape[0])
        file = f"nodes-{len(self.node_chunks):05d}.npz"
        np.savez(self.tmp / file, x=np.ascontiguousarray(x, dtype=np.float32), y=np.asarray(y, dtype=np.int64),
                 train_mask=np.asarray(train_mask, dtype=bool), val_mask=np.asarray(val_mask, dtype=bool),
                 test_mask=np.asarray(test_mask, dtype=bool))
        self.node_chunks.append(NodeChunk(file, start, stop))
        self.nodes_written = stop

    def add_edges(self, src: np.ndarray, dst: np.ndarray) -> None:
        for begin in range(0, int(src.shape[0]), self.edges_per_chunk):
            end = min(int(src.shape[0]), begin + self.edges_per_chunk)
            file = f"edges-{len(self.edge_chunks):05d}.npy"
            np.save(self.tmp / file, np.stack([np.asarray(src[begin:end], dtype=np.int64),
                                               np.asarray(dst[begin:end], dtype=np.int64)]))
            self.edge_chunks.append(EdgeChunk(file, end - begin))

    def finish(self) -> ChunkedMeta:
        if self.nodes_written != self.num_nodes:
            raise DatasetError(f"{self.out}: wrote {self.nodes_written} nodes of {self.num_nodes}")
        meta = ChunkedMeta(self.name, self.num_nodes, self.num_features, self.num_classes,
                           self.node_chunks, self.edge_chunks)
        raw = {"format": CHUNKED_FORMAT, "version": CHUNKED_VERSION, **asdict(meta)}
        (self.tmp / META_FILE).write_text(json.dumps(raw, indent=1))
        from gnn_dist.partition.format import move_into_place

        move_into_place(self.tmp, self.out)
        return meta


def write_graph(graph: Graph, out: str | os.PathLike, *, overwrite: bool = False,
                nodes_per_chunk: int = DEFAULT_NODES_PER_CHUNK,
                edges_per_chunk: int = DEFAULT_EDGES_PER_CHUNK) -> ChunkedMeta:
    """A loaded graph as a chunked directory (its symmetric edges, each direction stored)."""
    with ChunkedWriter(out, name=graph.name, num_nodes=graph.num_nodes, num_features=graph.num_features,
                       num_classes=graph.num_classes, overwrite=overwrite, edges_per_chunk=edges_per_chunk) as writer:
        for start in range(0, graph.num_nodes, nodes_per_chunk):
            rows = slice(start, min(graph.num_nodes, start + nodes_per_chunk))
            writer.add_nodes(graph.x[rows], graph.y[rows], graph.train_mask[rows], graph.val_mask[rows],
                             graph.test_mask[rows])
        writer.add_edges(graph.edge_index[0], graph.edge_index[1])
        return writer.finish()
