"""The on-disk partition directory: typed, versioned, checksummed, pickle-free.

    OUT/meta.json        PartitionMeta (format_version, sizes, per-part stats, sha256 of each file)
    OUT/node_map.npy     int64 [N]: new (contiguous per part) id -> the dataset's original id
    OUT/part-00000.npz   one per part: the arrays of PART_ARRAYS (and of LINK_ARRAYS when task is link)

A directory is written under a temporary name and renamed into place at the
end, so an interrupted run never leaves a directory that looks complete.
Every load checks the version, the checksum of the file it reads, and the
names, dtypes and shapes of its arrays; each failure is one PartitionFormatError
naming the file and the fix.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import threading
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnn_dist.partition.graph import EDGE_ARRAYS

FORMAT_VERSION = 3
# version 1 predates --task (its partitions are node classification's), version 2 typed graphs (meta.hetero)
READABLE_VERSIONS = (1, 2, 3)
META_FILE = "meta.json"
NODE_MAP_FILE = "node_map.npy"

# name -> (dtype, shape in terms of n_owned, n_halo, nnz, P, F, S = total rows sent)
PART_ARRAYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "node_ids": ("int64", ("n_owned",)),
    "halo_ids": ("int64", ("n_halo",)),
    "halo_owner": ("int32", ("n_halo",)),
    "halo_index_on_owner": ("int64", ("n_halo",)),
    "indptr": ("int64", ("n_owned+1",)),
    "indices": ("int64", ("nnz",)),
    "x": ("float32", ("n_owned", "F")),
    "y": ("int64", ("n_owned",)),
    "train_mask": ("bool", ("n_owned",)),
    "val_mask": ("bool", ("n_owned",)),
    "test_mask": ("bool", ("n_owned",)),
    "deg": ("int64", ("n_owned+n_halo",)),
    "send_ptr": ("int64", ("P+1",)),
    "send_idx": ("int64", ("S",)),
}


# --task link: original-id pairs whose source the part owns (partition/link_split.py); R = meta.link's
# mrr_negatives
LINK_ARRAYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "link_train": ("int64", ("*", "2")),
    "link_train_eid": ("int64", ("link_train",)),
    "link_val_pos": ("int64", ("*", "2")),
    "link_val_neg": ("int64", ("*", "2")),
    "link_val_mrr": ("int64", ("link_val_pos", "R")),
    "link_test_pos": ("int64", ("*", "2")),
    "link_test_neg": ("int64", ("*", "2")),
    "link_test_mrr": ("int64", ("link_test_pos", "R")),
}


class PartitionFormatError(ValueError):
    """A partition directory or part file is unusable; the message names the file and the fix."""


@dataclass(frozen=True)
class PartInfo:
    file: str
    sha256: str
    owned: int
    halo: int
    local_edges: int
    cut_edges: int
    train: int


@dataclass(frozen=True)
class PartitionMeta:
    format_version: int
    partition_id: str  # random per partition run: refuses part files mixed from two runs
    dataset: str
    num_nodes: int
    num_edges: int     # directed entries of the symmetrised graph
    num_parts: int
    num_features: int
    num_classes: int
    num_train: int
    method: str
    seed: int
    partptr: list[int]
    parts: list[PartInfo]
    task: str = "node"        # what the part files hold data for: node (labels and masks) or link (edge splits)
    link: dict | None = None  # --task link: {edge_split, train, val, test, mrr_negatives, source}
    # non-zero fraction of the input features (None: not recorded); mostly-zero features get a sparse first
    # layer (gnn_dist.nn.sparse_features)
    feature_density: float | None = None
    # a typed graph (gnn_dist.partition.hetero_parts): node_types, target, num_nodes and feature_widths per type,
    # relations [[src, name, dst], ...] and their edge counts, reverse_relations; None: a homogeneous graph
    hetero: dict | None = None
    # what METIS evened across parts (nodes, edges or both: gnn_dist.partition.metis.assign_parts); None: not
    # recorded (older partitions), or another partitioner's own balance
    balance: str | None = None

    @property
    def edge_cut(self) -> int:
        """Undirected edges whose endpoints lie in different parts."""
        return sum(p.cut_edges for p in self.parts) // 2

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_dict(cls, raw: dict, where: Path) -> PartitionMeta:
        version = raw.get("format_version")
        if version not in READABLE_VERSIONS:
            raise PartitionFormatError(f"{where}: format_version {version!r}, this gnn-dist reads versions "
                                       f"{', '.join(map(str, READABLE_VERSIONS))}: re-run gnn-dist partition")
        names = [f.name for f in dataclasses.fields(cls)]
        optional = {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        names = [name for name in names if name in raw or name not in optional]
        missing = [name for name in names if name not in raw]
        if missing:
            raise PartitionFormatError(f"{where}: missing keys {', '.join(missing)}: the directory is damaged, "
                                       f"re-run gnn-dist partition")
        try:
            parts = [PartInfo(**p) for p in raw["parts"]]
            values = {name: raw[name] for name in names if name != "parts"}
            meta = cls(parts=parts, **values)
        except TypeError as err:
            raise PartitionFormatError(f"{where}: malformed parts list ({err}): re-run gnn-dist partition") from err
        if len(meta.parts) != meta.num_parts or len(meta.partptr) != meta.num_parts + 1:
            raise PartitionFormatError(f"{where}: num_parts={meta.num_parts} disagrees with its parts list: "
                                       f"re-run gnn-dist partition")
        return meta


@dataclass(frozen=True)
class PartData:
    """One part as loaded: numpy arrays named as in PART_ARRAYS, plus the meta."""

    meta: PartitionMeta
    part_id: int
    arrays: dict

    def __getattr__(self, name: str):
        arrays = object.__getattribute__(self, "arrays")
        if name in arrays:
            return arrays[name]
        raise AttributeError(name)

    @property
    def n_owned(self) -> int:
        return int(self.arrays["node_ids"].shape[0])

    @property
    def n_halo(self) -> int:
        return int(self.arrays["halo_ids"].shape[0])


def part_file_name(k: int) -> str:
    return f"part-{k:05d}.npz"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def save(out: str | os.PathLike, meta_fields: dict, node_map: np.ndarray, part_arrays: list[dict],
         part_infos: list[dict], *, overwrite: bool = False) -> PartitionMeta:
    """Write a partition directory atomically and return its meta.

    meta_fields: every PartitionMeta field except format_version, partition_id and parts.
    part_infos: per part the stats (owned, halo, local_edges, cut_edges); file and sha256 are filled here.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise PartitionFormatError(f"{out} already exists: pass --overwrite or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        partition_id = uuid.uuid4().hex
        infos = []
        for k, (arrays, stats) in enumerate(zip(part_arrays, part_infos)):
            name = part_file_name(k)
            np.savez(tmp / name, partition_id=np.array(partition_id), part_id=np.int64(k), **arrays)
            infos.append(PartInfo(file=name, sha256=sha256_of(tmp / name), **stats))
        np.save(tmp / NODE_MAP_FILE, node_map.astype(np.int64))
        meta = PartitionMeta(format_version=FORMAT_VERSION, partition_id=partition_id, parts=infos, **meta_fields)
        (tmp / META_FILE).write_text(meta.to_json())
        move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def move_into_place(tmp: Path, out: Path) -> None:
    """Rename a finished temporary directory to `out`, replacing an older `out` only once the new one is whole."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)


def load_meta(directory: str | os.PathLike) -> PartitionMeta:
    directory = Path(directory)
    path = directory / META_FILE
    if not directory.is_dir():
        raise PartitionFormatError(f"{directory}: no such partition directory: run gnn-dist partition --out {directory}")
    if not path.is_file():
        raise PartitionFormatError(f"{path} is missing: {directory} is not a complete partition directory, "
                                   f"re-run gnn-dist partition")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PartitionFormatError(f"{path}: not valid JSON ({err}): re-run gnn-dist partition") from err
    if not isinstance(raw, dict):
        raise PartitionFormatError(f"{path}: expected a JSON object: re-run gnn-dist partition")
    return PartitionMeta.from_dict(raw, path)


def verify_part_file(directory: Path, meta: PartitionMeta, k: int) -> Path:
    info = meta.parts[k]
    path = directory / info.file
    if not path.is_file():
        raise PartitionFormatError(f"{path} is missing: re-run gnn-dist partition")
    actual = sha256_of(path)
    if actual != info.sha256:
        raise PartitionFormatError(f"{path} is corrupt (sha256 {actual[:12]}... != {info.sha256[:12]}... in "
                                   f"{META_FILE}): re-run gnn-dist partition")
    return path


# numpy parses each .npy header with ast.literal_eval, and CPython 3.11's parser is not thread-safe (concurrent
# calls can fail with "SystemError: AST constructor recursion depth mismatch"): simulated ranks are threads of
# one process, so they read part files one at a time.
_READ_LOCK = threading.Lock()


def load_part(directory: str | os.PathLike, k: int, meta: PartitionMeta | None = None) -> PartData:
    """Load and check part k; never unpickles."""
    directory = Path(directory)
    meta = meta or load_meta(directory)
    if not 0 <= k < meta.num_parts:
        raise PartitionFormatError(f"{directory}: part {k} requested but there are {meta.num_parts} parts")
    path = verify_part_file(directory, meta, k)
    try:
        with _READ_LOCK, np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise PartitionFormatError(f"{path}: unreadable part file ({err}): re-run gnn-dist partition") from err

    stored_id = str(arrays.pop("partition_id", ""))
    if stored_id != meta.partition_id:
        raise PartitionFormatError(f"{path} belongs to another partition run than {directory / META_FILE}: "
                                   f"do not mix part files; re-run gnn-dist partition")
    if int(arrays.pop("part_id", -1)) != k:
        raise PartitionFormatError(f"{path} does not hold part {k}: do not rename part files; re-run gnn-dist partition")
    _check_arrays(path, arrays, meta, k)
    return PartData(meta=meta, part_id=k, arrays=arrays)


def _check_arrays(path: Path, arrays: dict, meta: PartitionMeta, k: int) -> None:
    missing = [name for name in PART_ARRAYS if name not in arrays]
    if missing:
        raise PartitionFormatError(f"{path}: missing arrays {', '.join(missing)}: re-run gnn-dist partition")
    info = meta.parts[k]
    sizes = {
        "n_owned": info.owned, "n_halo": info.halo, "n_owned+1": info.owned + 1,
        "nnz": info.local_edges + info.cut_edges, "n_owned+n_halo": info.owned + info.halo,
        "F": meta.num_features, "P+1": meta.num_parts + 1, "S": int(arrays["send_ptr"][-1]) if arrays["send_ptr"].size else -1,
    }
    for name, (dtype, shape) in PART_ARRAYS.items():
        array = arrays[name]
        expected = tuple(sizes[s] for s in shape)
        if str(array.dtype) != dtype or array.shape != expected:
            raise PartitionFormatError(f"{path}: array {name} is {array.dtype} {array.shape}, expected {dtype} "
                                       f"{expected}: re-run gnn-dist partition")
    for name, ndim in EDGE_ARRAYS.items():  # optional: graphs with edge values have them
        if name in arrays and (str(arrays[name].dtype) != "float32" or arrays[name].ndim != ndim
                               or arrays[name].shape[0] != sizes["nnz"]):
            raise PartitionFormatError(f"{path}: array {name} is {arrays[name].dtype} {arrays[name].shape}, expected "
                                       f"float32 with {sizes['nnz']} rows: re-run gnn-dist partition")
    if meta.task == "link":
        _check_link_arrays(path, arrays, meta)
    if meta.hetero is not None:
        _check_typed_arrays(path, arrays, meta)
    indices = arrays["indices"]
    if indices.size and (indices.min() < 0 or indices.max() >= info.owned + info.halo):
        raise PartitionFormatError(f"{path}: CSR column out of range: re-run gnn-dist partition")
    if arrays["indptr"][0] != 0 or arrays["indptr"][-1] != indices.size or np.any(np.diff(arrays["indptr"]) < 0):
        raise PartitionFormatError(f"{path}: CSR indptr is not a valid row pointer: re-run gnn-dist partition")


def _check_link_arrays(path: Path, arrays: dict, meta: PartitionMeta) -> None:
    missing = [name for name in LINK_ARRAYS if name not in arrays]
    if missing:
        raise PartitionFormatError(f"{path}: missing link arrays {', '.join(missing)}: re-run gnn-dist partition "
                                   f"--task link")
    rows = {name: arrays[name].shape[0] for name in LINK_ARRAYS if arrays[name].ndim >= 1}
    sizes = {"2": 2, "R": int((meta.link or {}).get("mrr_negatives", 0)), **rows}
    for name, (dtype, shape) in LINK_ARRAYS.items():
        array = arrays[name]
        expected = tuple(array.shape[0] if s == "*" else sizes[s] for s in shape)
        if str(array.dtype) != dtype or array.shape != expected:
            raise PartitionFormatError(f"{path}: array {name} is {array.dtype} {array.shape}, expected {dtype} "
                                       f"{expected}: re-run gnn-dist partition --task link")
        if array.size and (array.min() < 0 or (name != "link_train_eid" and array.max() >= meta.num_nodes)):
            raise PartitionFormatError(f"{path}: {name} names nodes outside the graph: re-run gnn-dist partition")


def type_offsets(hetero: dict) -> np.ndarray:
    """int64 [T + 1]: the first homogeneous id of each node type, and the total."""
    return np.concatenate([[0], np.cumsum([hetero["num_nodes"][t] for t in hetero["node_types"]])]).astype(np.int64)


def _check_typed_arrays(path: Path, arrays: dict, meta: PartitionMeta) -> None:
    hetero = meta.hetero
    edge_type = arrays.get("edge_type")
    if edge_type is None or str(edge_type.dtype) != "int32" or edge_type.shape != arrays["indices"].shape:
        raise PartitionFormatError(f"{path}: a typed partition's part needs edge_type int32 [nnz]: re-run gnn-dist "
                                   f"partition")
    if edge_type.size and (edge_type.min() < 0 or edge_type.max() >= len(hetero["relations"])):
        raise PartitionFormatError(f"{path}: edge_type names a relation outside the meta's list: re-run gnn-dist "
                                   f"partition")
    owned_type = np.searchsorted(type_offsets(hetero), arrays["node_ids"], side="right") - 1
    for k, t in enumerate(hetero["node_types"]):
        width = hetero["feature_widths"][t]
        if not width:
            continue
        x = arrays.get(f"x__{t}")
        expected = (int(np.count_nonzero(owned_type == k)), width)
        if x is None or str(x.dtype) != "float32" or x.shape != expected:
            raise PartitionFormatError(f"{path}: x__{t} should be float32 {expected}: re-run gnn-dist partition")


def load_node_map(directory: str | os.PathLike) -> np.ndarray:
    path = Path(directory) / NODE_MAP_FILE
    try:
        with _READ_LOCK:  # simulated ranks read it together (see _READ_LOCK)
            return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as err:
        raise PartitionFormatError(f"{path}: unreadable ({err}): re-run gnn-dist partition") from err


@dataclass(frozen=True)
class LinkShape:
    """A --task link part's pair counts (gnn_dist.plan.memory prices what link training holds)."""

    train: int
    val: int
    val_neg: int
    test: int
    test_neg: int
    mrr_negatives: int
    num_nodes: int


def link_shape(arrays, meta) -> LinkShape | None:
    if meta.task != "link":
        return None
    return LinkShape(train=len(arrays["link_train"]), val=len(arrays["link_val_pos"]),
                     val_neg=len(arrays["link_val_neg"]), test=len(arrays["link_test_pos"]),
                     test_neg=len(arrays["link_test_neg"]), mrr_negatives=int(meta.link["mrr_negatives"]),
                     num_nodes=meta.num_nodes)


@dataclass(frozen=True)
class PartShape:
    """The statistics of one part that its memory depends on (gnn_dist.plan.memory)."""

    owned: int
    halo: int
    entries: int              # CSR entries of the part file (local + cut edges)
    cut_entries: int          # entries whose source is a halo row
    sent_per_peer: tuple      # rows this part sends to each peer
    received_per_peer: tuple  # halo rows owned by each peer
    link: LinkShape | None = None  # --task link partitions: the pairs this part holds
    feature_density: float | None = None  # the partition's, for the sparse first layer's copy

    @property
    def sent(self) -> int:
        return int(sum(self.sent_per_peer))


def part_shape(part) -> PartShape:
    """The statistics of a loaded part (gnn_dist.partition.format.PartData)."""
    num_parts = part.meta.num_parts
    return PartShape(owned=part.n_owned, halo=part.n_halo, entries=int(part.indptr[-1]),
                     cut_entries=int(np.count_nonzero(part.indices >= part.n_owned)),
                     sent_per_peer=tuple(int(v) for v in np.diff(part.send_ptr)),
                     received_per_peer=tuple(int(v) for v in np.bincount(part.halo_owner, minlength=num_parts)),
                     link=link_shape(part.arrays, part.meta), feature_density=part.meta.feature_density)


def part_shapes(directory) -> list[PartShape]:
    """Statistics of every part of a partition directory, reading only the small arrays of each file."""
    directory = Path(directory)
    meta = load_meta(directory)
    shapes = []
    for k, info in enumerate(meta.parts):
        with np.load(directory / part_file_name(k), allow_pickle=False) as arrays:
            sent = np.diff(arrays["send_ptr"])
            received = np.bincount(arrays["halo_owner"], minlength=meta.num_parts)
            link = link_shape(arrays, meta)
        shapes.append(PartShape(owned=info.owned, halo=info.halo, entries=info.local_edges + info.cut_edges,
                                cut_entries=info.cut_edges,
                                sent_per_peer=tuple(int(v) for v in sent),
                                received_per_peer=tuple(int(v) for v in received), link=link,
                                feature_density=meta.feature_density))
    return shapes
