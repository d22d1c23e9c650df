"""Dataset loaders against independent references: PyG's Planetoid, hand-written fixtures, plain sets."""
from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest

from gnn_dist.partition.datasets import load_dataset
from gnn_dist.partition.graph import DatasetError, symmetrize


def test_symmetrize_matches_a_set_reference():
    rng = np.random.default_rng(1)
    edges = rng.integers(0, 30, size=(2, 200))
    edges[:, :10] = edges[0, :10]  # self loops
    edges = np.concatenate([edges, edges[:, :50]], axis=1)  # duplicates
    expected = {(a, b) for a, b in edges.T if a != b} | {(b, a) for a, b in edges.T if a != b}
    out = symmetrize(edges, 30)
    pairs = list(map(tuple, out.T.tolist()))
    assert len(pairs) == len(set(pairs)) == len(expected)
    assert set(pairs) == expected


def test_synthetic_is_deterministic_and_learnable_shaped():
    a = load_dataset("synthetic:small", seed=3)
    b = load_dataset("synthetic:small", seed=3)
    c = load_dataset("synthetic:small", seed=4)
    for field in ("edge_index", "x", "y", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.edge_index, c.edge_index)
    deg = np.bincount(a.edge_index[1], minlength=a.num_nodes)
    assert deg.max() > 8 * np.median(deg)  # heavy tail, not a regular graph
    same_class = (a.y[a.edge_index[0]] == a.y[a.edge_index[1]]).mean()
    assert same_class > 0.5  # community structure along the classes
    assert not (a.train_mask & a.test_mask).any()


def test_synthetic_arxiv_has_ogbn_arxiv_size():
    g = load_dataset("synthetic:arxiv")
    assert (g.num_nodes, g.num_features, g.num_classes) == (169_343, 128, 40)
    # ogbn-arxiv: 1,166,243 directed edges, about 2.3M once symmetrised
    assert 2_000_000 < g.num_edges < 2_400_000
    assert abs(g.train_mask.mean() - 0.54) < 0.01


def test_unknown_dataset_names_the_valid_forms():
    with pytest.raises(DatasetError, match="synthetic:tiny"):
        load_dataset("cora")
    with pytest.raises(DatasetError, match="synthetic:tiny"):
        load_dataset("synthetic:huge")


def test_planetoid_matches_pyg_planetoid(cora_root, tmp_path):
    from torch_geometric.datasets import Planetoid

    # PyG's own class writes processed/ beside raw/, so give it a private copy.
    shutil.copytree(cora_root / "Cora" / "raw", tmp_path / "Cora" / "raw")
    reference = Planetoid(str(tmp_path), "Cora")[0]
    ours = load_dataset("planetoid:Cora", cora_root)
    assert ours.num_nodes == reference.num_nodes == 2708
    assert ours.num_edges == reference.num_edges == 10556
    assert {tuple(e) for e in ours.edge_index.T.tolist()} == {tuple(e) for e in reference.edge_index.T.tolist()}
    assert np.array_equal(ours.x, reference.x.numpy())
    assert np.array_equal(ours.y, reference.y.numpy())
    assert np.array_equal(ours.train_mask, reference.train_mask.numpy())
    assert np.array_equal(ours.test_mask, reference.test_mask.numpy())
    assert (ours.train_mask.sum(), ours.val_mask.sum(), ours.test_mask.sum()) == (140, 500, 1000)


def test_planetoid_missing_files_name_them(tmp_path):
    with pytest.raises(DatasetError, match="ind.cora.x"):
        load_dataset("planetoid:Cora", tmp_path)
    with pytest.raises(DatasetError, match="--root"):
        load_dataset("planetoid:Cora", None)


def _write_csv_gz(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        for row in rows:
            handle.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def write_tiny_ogbn_arxiv(root):
    """A 6-node graph in ogbn-arxiv's raw layout, as ogb unpacks it."""
    base = root / "ogbn_arxiv"
    edges = np.array([[0, 1], [1, 2], [2, 0], [3, 4], [4, 5], [5, 3], [0, 3]])  # directed, like arxiv
    feats = np.arange(6 * 3, dtype=np.float32).reshape(6, 3) / 10
    labels = np.array([0, 1, 0, 2, 1, 2])
    _write_csv_gz(base / "raw" / "edge.csv.gz", edges)
    _write_csv_gz(base / "raw" / "node-feat.csv.gz", feats)
    _write_csv_gz(base / "raw" / "node-label.csv.gz", labels)
    _write_csv_gz(base / "raw" / "num-node-list.csv.gz", [6])
    _write_csv_gz(base / "raw" / "num-edge-list.csv.gz", [len(edges)])
    _write_csv_gz(base / "split" / "time" / "train.csv.gz", [0, 1, 3])
    _write_csv_gz(base / "split" / "time" / "valid.csv.gz", [4])
    _write_csv_gz(base / "split" / "time" / "test.csv.gz", [2, 5])
    (base / "RELEASE_v1.txt").write_text("tiny fixture\n")
    return edges, feats, labels


def test_ogb_raw_layout_loads_through_ogb_readers(tmp_path):
    edges, feats, labels = write_tiny_ogbn_arxiv(tmp_path)
    g = load_dataset("ogbn-arxiv", tmp_path)
    expected = {tuple(e) for e in edges.tolist()} | {(b, a) for a, b in edges.tolist()}
    assert {tuple(e) for e in g.edge_index.T.tolist()} == expected
    assert np.allclose(g.x, feats)
    assert np.array_equal(g.y, labels)
    assert g.num_classes == 40
    assert np.flatnonzero(g.train_mask).tolist() == [0, 1, 3]
    assert np.flatnonzero(g.test_mask).tolist() == [2, 5]
    # the second load comes from our pickle-free cache and is identical
    assert (tmp_path / "ogbn_arxiv" / "gnn_dist_cache.npz").is_file()
    again = load_dataset("ogbn-arxiv", tmp_path)
    assert np.array_equal(again.edge_index, g.edge_index) and np.array_equal(again.test_mask, g.test_mask)


def test_ogb_missing_files_are_named_and_nothing_is_downloaded(tmp_path):
    with pytest.raises(DatasetError, match=r"edge\.csv\.gz.*--download"):
        load_dataset("ogbn-products", tmp_path)


def test_npz_round_trip_and_random_split(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = tmp_path / "g.npz"
    edge_index = np.array([[0, 1, 2, 2, 3], [1, 0, 3, 2, 0]])
    np.savez(path, edge_index=edge_index, x=rng.random((5, 4)).astype(np.float32), y=np.array([0, 1, 1, 0, 2]))
    g = load_dataset(f"npz:{path}", seed=7)
    assert "random" in capsys.readouterr().err
    assert {tuple(e) for e in g.edge_index.T.tolist()} == {(0, 1), (1, 0), (2, 3), (3, 2), (3, 0), (0, 3)}
    assert g.num_classes == 3
    assert g.train_mask.sum() == 3 and not (g.train_mask & g.val_mask).any()


def test_npz_real_facebook(facebook_npz):
    g = load_dataset(f"npz:{facebook_npz}")
    with np.load(facebook_npz, allow_pickle=False) as raw:
        assert np.array_equal(g.x, raw["x"].astype(np.float32))
        assert np.array_equal(g.train_mask, raw["train_mask"])
        pairs = raw["edge_index"].T.tolist()
    expected = {(a, b) for a, b in pairs if a != b} | {(b, a) for a, b in pairs if a != b}
    assert (g.num_nodes, g.num_classes) == (22_470, 4)
    assert g.num_edges == len(expected)  # the file stores 171,002 pairs, a few of them self loops


@pytest.mark.parametrize("arrays, message", [
    ({"x": np.zeros((2, 2), np.float32), "y": np.zeros(2, np.int64)}, "edge_index"),
    ({"edge_index": np.zeros((2, 1), np.int64), "x": np.zeros((2, 2), np.float32), "y": np.zeros(3, np.int64)}, "y must"),
    ({"edge_index": np.array([[0], [5]]), "x": np.zeros((2, 2), np.float32), "y": np.zeros(2, np.int64)}, "outside"),
    ({"edge_index": np.zeros((2, 1), np.int64), "x": np.zeros((2, 2), np.float32), "y": np.zeros(2, np.int64),
      "train_mask": np.ones(2, bool)}, "all three"),
])
def test_npz_bad_input_is_one_clear_error(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DatasetError, match=message):
        load_dataset(f"npz:{path}")


def test_npz_refuses_pickled_arrays(tmp_path):
    path = tmp_path / "pickled.npz"
    np.savez(path, edge_index=np.zeros((2, 1), np.int64), x=np.array([object()], dtype=object), y=np.zeros(1))
    with pytest.raises(DatasetError, match="unpickling"):
        load_dataset(f"npz:{path}")


def test_npz_missing_file(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(f"npz:{tmp_path / 'nope.npz'}")
