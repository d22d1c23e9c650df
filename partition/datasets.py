"""Dataset loaders behind one SPEC string (see docs/datasets.md).

    synthetic:tiny|small|arxiv|medium|large|products   seeded generators (gnn_dist.partition.synthetic)
    synthetic:mag|mag200k|magtiny  typed, ogbn-mag's shape (gnn_dist.partition.synthetic_mag)
    planetoid:Cora|CiteSeer|PubMed PyG's Planetoid raw files under ROOT/<name>/raw
    ogbn-arxiv|ogbn-products|ogbn-papers100M
                                   OGB raw files under ROOT/<dir>/ (ogb's own raw readers)
    ogbn-mag                       OGB's typed raw files under ROOT/ogbn_mag/ (gnn_dist.partition.ogb_mag)
    npz:PATH                       a user's graph in our .npz format
    chunked:DIR                    a chunked directory (gnn_dist.partition.chunked; written by gnn-dist convert)

No loader unpickles anything and none touches the network unless asked
(`download=True`, OGB only).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from gnn_dist.partition.chunked import load_chunked, read_meta
from gnn_dist.partition.graph import (
    EDGE_ARRAYS,
    DatasetError,
    Graph,
    GraphSizes,
    random_split,
    symmetrize,
    symmetrize_with_values,
)
from gnn_dist.partition.ogb_raw import import_ogb_quietly, ogb_meta  # noqa: F401 - where callers find them
from gnn_dist.partition.registry import (  # noqa: F401 - the registry's API, here where every built-in kind is
    DatasetKind,
    dataset_forms,
    dataset_kind,
    dataset_sizes,
    load_dataset,
    need_root,
    register_dataset,
)
from gnn_dist.partition.synthetic import PRESETS, make_synthetic
from gnn_dist.partition.synthetic_mag import MAG_PRESETS, make_synthetic_mag

PLANETOID_NAMES = ("Cora", "CiteSeer", "PubMed")
OGB_NAMES = ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M")
NPZ_SPLIT = (0.6, 0.2, 0.2)


def load_planetoid(name: str, root: Path) -> Graph:
    """PyG's Planetoid (public split), read straight from the raw files.

    `torch_geometric.datasets.Planetoid` would write processed/ next to the
    raw files (often read-only, e.g. a shared data folder) and reload it with
    torch.load; reading the raw files with PyG's own reader avoids both.
    """
    matches = [n for n in PLANETOID_NAMES if n.lower() == name.lower()]
    if not matches:
        raise DatasetError(f"unknown Planetoid dataset {name!r}: use planetoid:Cora, planetoid:CiteSeer or planetoid:PubMed")
    name = matches[0]
    raw_dir = root / name / "raw"
    prefix = f"ind.{name.lower()}."
    expected = [prefix + s for s in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")]
    missing = [f for f in expected if not (raw_dir / f).is_file()]
    if missing:
        raise DatasetError(f"planetoid:{name}: missing {', '.join(missing)} in {raw_dir}: "
                           f"put the Planetoid raw files there (or pass the right --root)")
    from torch_geometric.io import read_planetoid_data

    data = read_planetoid_data(str(raw_dir), name.lower())
    num_nodes = int(data.num_nodes)
    graph = Graph(
        name=f"planetoid:{name}",
        edge_index=symmetrize(data.edge_index.numpy(), num_nodes),
        x=data.x.numpy().astype(np.float32, copy=False),
        y=data.y.numpy().astype(np.int64, copy=False),
        train_mask=data.train_mask.numpy(),
        val_mask=data.val_mask.numpy(),
        test_mask=data.test_mask.numpy(),
        num_classes=int(data.y.max()) + 1,
    )
    graph.validate()
    return graph


def ogb_expected_files(name: str, root: Path) -> list[Path]:
    meta = ogb_meta(name)
    base = root / name.replace("-", "_")
    split_dir = base / "split" / meta["split"]
    if meta["binary"] == "True":
        raw = [base / "raw" / "data.npz", base / "raw" / "node-label.npz"]
    else:
        raw = [base / "raw" / "edge.csv.gz", base / "raw" / "node-feat.csv.gz",
               base / "raw" / "num-node-list.csv.gz", base / "raw" / "num-edge-list.csv.gz",
               base / "raw" / "node-label.csv.gz"]
    return raw + [split_dir / f"{part}.csv.gz" for part in ("train", "valid", "test")]


def ogb_split_masks(base: Path, meta: dict, num_nodes: int) -> list[np.ndarray]:
    """train, valid and test masks from OGB's split/<type>/*.csv.gz."""
    import pandas as pd

    masks = []
    for part in ("train", "valid", "test"):
        idx = pd.read_csv(base / "split" / meta["split"] / f"{part}.csv.gz", compression="gzip", header=None).values[:, 0]
        mask = np.zeros(num_nodes, dtype=bool)
        mask[idx.astype(np.int64)] = True
        masks.append(mask)
    return masks


def load_ogb(name: str, root: Path, *, download: bool = False) -> Graph:
    """An OGB node-property dataset with its official split, from ogb's raw files.

    ogb's own `NodePropPredDataset` prompts with input() on a version mismatch,
    downloads when raw files are missing and caches pickles that torch's
    weights_only loading refuses; we call its raw readers directly instead and
    keep a cache of our own as a plain .npz.
    """
    import pandas as pd

    raw_readers, _ = import_ogb_quietly()
    meta = ogb_meta(name)
    base = root / name.replace("-", "_")
    cache = base / "gnn_dist_cache.npz"
    if cache.is_file():
        return _graph_from_npz(cache, name, seed=0, split_required=True)

    missing = [p for p in ogb_expected_files(name, root) if not p.is_file()]
    if missing and download:
        _download_ogb(name, root, meta)
        missing = [p for p in ogb_expected_files(name, root) if not p.is_file()]
    if missing:
        raise DatasetError(f"{name}: missing {', '.join(str(p) for p in missing)}: place OGB's raw files "
                           f"under {base} (as ogb unpacks them), or pass --download on a machine with internet")

    raw_dir = str(base / "raw")
    add_inverse = meta["add_inverse_edge"] == "True"
    if meta["binary"] == "True":
        graph_dict = raw_readers.read_binary_graph_raw(raw_dir, add_inverse_edge=add_inverse)[0]
        labels = np.load(base / "raw" / "node-label.npz", allow_pickle=False)["node_label"]
    else:
        graph_dict = raw_readers.read_csv_graph_raw(raw_dir, add_inverse_edge=add_inverse)[0]
        labels = pd.read_csv(base / "raw" / "node-label.csv.gz", compression="gzip", header=None).values
    num_nodes = int(graph_dict["num_nodes"])
    labels = np.asarray(labels).reshape(num_nodes, -1)[:, 0]
    # papers100M labels only a small subset; unlabelled nodes carry NaN.
    y = np.where(np.isnan(labels.astype(np.float64)), -1, labels).astype(np.int64)

    masks = ogb_split_masks(base, meta, num_nodes)

    graph = Graph(
        name=name,
        edge_index=symmetrize(graph_dict["edge_index"], num_nodes),
        x=np.asarray(graph_dict["node_feat"], dtype=np.float32),
        y=y,
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        num_classes=int(meta["num classes"]),
    )
    graph.validate()
    _write_cache(graph, cache)
    return graph


def _download_ogb(name: str, root: Path, meta: dict) -> None:
    import shutil

    from ogb.utils.url import download_url, extract_zip

    root.mkdir(parents=True, exist_ok=True)
    path = download_url(meta["url"], str(root))
    extract_zip(path, str(root))
    os.unlink(path)
    target = root / name.replace("-", "_")
    unpacked = root / meta["download_name"]
    if unpacked != target:
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(unpacked), str(target))


def _write_cache(graph: Graph, cache: Path) -> None:
    """Best effort: a read-only dataset folder simply goes uncached."""
    tmp = cache.with_name(cache.name + f".tmp-{os.getpid()}.npz")
    try:
        np.savez(tmp, edge_index=graph.edge_index, x=graph.x, y=graph.y, train_mask=graph.train_mask,
                 val_mask=graph.val_mask, test_mask=graph.test_mask, num_classes=np.int64(graph.num_classes))
        os.replace(tmp, cache)
    except OSError:
        tmp.unlink(missing_ok=True)


def load_npz(path: str | os.PathLike, *, seed: int = 0) -> Graph:
    """A user's graph in the .npz format of docs/datasets.md."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"npz:{path}: no such file: give the path of a .npz graph (format in docs/datasets.md)")
    return _graph_from_npz(path, f"npz:{path}", seed=seed, split_required=False)


def _graph_from_npz(path: Path, name: str, *, seed: int, split_required: bool) -> Graph:
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except ValueError as err:  # object arrays need pickle, which we refuse
        raise DatasetError(f"{path}: cannot read without unpickling ({err}): save plain numeric arrays") from err
    except (OSError, EOFError, Exception) as err:  # zipfile.BadZipFile and friends
        raise DatasetError(f"{path}: not a readable .npz archive ({type(err).__name__}: {err}): re-create the file") from err

    for key in ("edge_index", "x", "y"):
        if key not in arrays:
            raise DatasetError(f"{path}: missing array {key!r}: a graph .npz needs edge_index, x and y "
                               f"(format in docs/datasets.md)")
    x = np.asarray(arrays["x"])
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.number):
        raise DatasetError(f"{path}: x must be a numeric [N, F] array, got {x.dtype} {x.shape}")
    num_nodes = x.shape[0]
    y = np.asarray(arrays["y"]).reshape(-1)
    if y.shape[0] != num_nodes or not np.issubdtype(y.dtype, np.integer):
        raise DatasetError(f"{path}: y must be integer [{num_nodes}] (one label per row of x), got {y.dtype} {y.shape}")
    edge_index = np.asarray(arrays["edge_index"])
    if edge_index.ndim != 2 or edge_index.shape[0] != 2 or not np.issubdtype(edge_index.dtype, np.integer):
        raise DatasetError(f"{path}: edge_index must be integer [2, E], got {edge_index.dtype} {edge_index.shape}")

    mask_keys = ("train_mask", "val_mask", "test_mask")
    present = [k for k in mask_keys if k in arrays]
    if present and len(present) != 3:
        raise DatasetError(f"{path}: has {', '.join(present)} but not all of {', '.join(mask_keys)}: give all three or none")
    if present:
        masks = tuple(np.asarray(arrays[k]).astype(bool).reshape(-1) for k in mask_keys)
    elif split_required:
        raise DatasetError(f"{path}: cached dataset lacks its split: delete the file to rebuild it")
    else:
        masks = random_split(num_nodes, seed, NPZ_SPLIT)
        print(f"{name}: no train/val/test masks in the file; using a seeded random "
              f"{int(NPZ_SPLIT[0]*100)}/{int(NPZ_SPLIT[1]*100)}/{int(NPZ_SPLIT[2]*100)} split (seed {seed})",
              file=sys.stderr)

    y = y.astype(np.int64)
    if "num_classes" in arrays:
        num_classes = int(arrays["num_classes"])
    else:
        num_classes = int(y.max()) + 1 if y.size else 0
    edge_arrays = {}
    for key, ndim in EDGE_ARRAYS.items():
        if key in arrays:
            value = np.asarray(arrays[key])
            if value.ndim != ndim or value.shape[0] != edge_index.shape[1] or not np.issubdtype(value.dtype, np.number):
                raise DatasetError(f"{path}: {key} must be numeric [{edge_index.shape[1]}{', D' if ndim == 2 else ''}] "
                                   f"(one value per column of edge_index), got {value.dtype} {value.shape}")
            edge_arrays[key] = value.astype(np.float32, copy=False)
    if edge_arrays:
        edges, edge_arrays = symmetrize_with_values(edge_index, num_nodes, edge_arrays, str(path))
    else:
        edges = symmetrize(edge_index, num_nodes)
    graph = Graph(name, edges, x.astype(np.float32, copy=False), y, masks[0], masks[1], masks[2], num_classes,
                  **edge_arrays)
    graph.validate()
    return graph


def _make_any_synthetic(arg: str, seed: int):
    """A homogeneous preset (gnn_dist.partition.synthetic), or a typed one with ogbn-mag's shape (synthetic_mag)."""
    if arg in MAG_PRESETS:
        return make_synthetic_mag(arg, seed)
    return make_synthetic(arg, seed)


def _synthetic_sizes(arg, root) -> GraphSizes | None:
    preset = PRESETS.get(arg)
    return GraphSizes(preset.num_nodes, preset.num_features, preset.num_directed_edges) if preset else None


def _npz_sizes(arg, root) -> GraphSizes:
    import zipfile

    shapes = {}
    with zipfile.ZipFile(arg) as archive:
        for name in ("x", "edge_index"):
            with archive.open(f"{name}.npy") as handle:
                version = np.lib.format.read_magic(handle)
                shapes[name] = np.lib.format._read_array_header(handle, version)[0]
    return GraphSizes(int(shapes["x"][0]), int(shapes["x"][1]), int(shapes["edge_index"][1]))


def _chunked_sizes(arg, root) -> GraphSizes:
    meta = read_meta(arg)
    return GraphSizes(meta.num_nodes, meta.num_features, meta.num_input_edges)


def _already_chunked(arg, root, out, **options):
    raise DatasetError(f"chunked:{arg} is already chunked: pass it to gnn-dist partition as it is")


# The built-in datasets, in the order error messages list them.
register_dataset("synthetic", "synthetic:tiny|small|weak|sbm60k|arxiv|medium|large|products|mag|mag200k|magtiny",
                 sizes=_synthetic_sizes)(lambda arg, root, *, seed, download: _make_any_synthetic(arg, seed))
register_dataset("planetoid", "planetoid:Cora|CiteSeer|PubMed")(
    lambda arg, root, *, seed, download: load_planetoid(arg, need_root(f"planetoid:{arg}", root)))
for _name in OGB_NAMES:
    register_dataset(_name, _name, takes_arg=False)(
        lambda arg, root, *, seed, download, _name=_name: load_ogb(_name, need_root(_name, root), download=download))
from gnn_dist.partition import ogb_mag  # noqa: E402, F401 - registers ogbn-mag, typed, beside the others

register_dataset("npz", "npz:PATH", sizes=_npz_sizes)(lambda arg, root, *, seed, download: load_npz(arg, seed=seed))


@register_dataset("chunked", "chunked:DIR", sizes=_chunked_sizes, convert=_already_chunked)
def _load_chunked(arg, root, *, seed, download) -> Graph:
    return load_chunked(arg)


@register_dataset("hetero", "hetero:PATH")
def _load_hetero(arg, root, *, seed, download):
    from gnn_dist.partition.hetero import load_hetero_npz  # a typed graph: gnn-dist partition adds the reverses

    return load_hetero_npz(arg)


# ogbl-* after the node datasets: error messages list the kinds in registration order
from gnn_dist.partition import ogb_link  # noqa: E402, F401
