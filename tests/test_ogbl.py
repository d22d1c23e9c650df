"""OGB link datasets read offline from tiny fixtures in OGB's raw layout: the official split is kept, the
message-passing graph is the training edges only, the official metric comes from OGB's Evaluator, and a
split file holding anything but arrays is refused."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest
import torch

from gnn_dist.partition.format import load_meta, load_part
from tests.conftest import run_cli, run_mpi

NUM_NODES = 120


def write_csv(path, array) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        pd.DataFrame(array).to_csv(handle, header=False, index=False)


def random_pairs(rng, count: int) -> np.ndarray:
    pairs = rng.integers(0, NUM_NODES, size=(count, 2))
    return pairs[pairs[:, 0] != pairs[:, 1]]


@pytest.fixture(scope="module")
def ogbl_root(tmp_path_factory):
    """ogbl_collab (Hits@50) and ogbl_citation2 (MRR against 1,000... here 30 official negatives) as OGB unpacks
    them: raw/*.csv.gz and split/<name>/{train,valid,test}.pt of numpy arrays."""
    root = tmp_path_factory.mktemp("ogbl")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(NUM_NODES, 6)).astype(np.float32)
    collab, citation = root / "ogbl_collab", root / "ogbl_citation2"
    for base in (collab, citation):
        write_csv(base / "raw" / "num-node-list.csv.gz", np.array([[NUM_NODES]]))
        write_csv(base / "raw" / "node-feat.csv.gz", x)
    train = random_pairs(rng, 500)
    write_csv(collab / "raw" / "edge.csv.gz", train)
    split = collab / "split" / "time"
    split.mkdir(parents=True)
    torch.save({"edge": train, "weight": np.ones(len(train)), "year": np.full(len(train), 2010)}, split / "train.pt")
    for phase in ("valid", "test"):
        torch.save({"edge": random_pairs(rng, 40), "edge_neg": random_pairs(rng, 200)}, split / f"{phase}.pt")
    split = citation / "split" / "time"
    split.mkdir(parents=True)
    torch.save({"source_node": train[:, 0], "target_node": train[:, 1]}, split / "train.pt")
    for phase in ("valid", "test"):
        pairs = random_pairs(rng, 30)
        torch.save({"source_node": pairs[:, 0], "target_node": pairs[:, 1],
                    "target_node_neg": rng.integers(0, NUM_NODES, size=(len(pairs), 30))}, split / f"{phase}.pt")
    return root


def partition(root, name, out, *extra) -> None:
    done = run_cli("partition", "--dataset", name, "--root", str(root), "--num-parts", "2", "--out", str(out),
                   "--task", "link", "--mrr-negatives", "7", *extra)
    assert done.returncode == 0, done.stderr


def stored(directory, name) -> np.ndarray:
    meta = load_meta(directory)
    return np.concatenate([load_part(directory, k, meta).arrays[f"link_{name}"] for k in range(meta.num_parts)])


def sorted_rows(pairs) -> np.ndarray:
    return pairs[np.lexsort(pairs.T[::-1])]


def test_collab_keeps_the_official_split_and_passes_messages_over_training_edges_only(ogbl_root, tmp_path):
    partition(ogbl_root, "ogbl-collab", tmp_path / "p")
    meta = load_meta(tmp_path / "p")
    assert meta.task == "link" and meta.link["source"] == "official" and meta.link["mrr_negatives"] == 7
    split = {phase: torch.load(ogbl_root / "ogbl_collab" / "split" / "time" / f"{phase}.pt", weights_only=False)
             for phase in ("train", "valid", "test")}
    official = {tuple(sorted(p)) for p in split["train"]["edge"].tolist() if p[0] != p[1]}
    assert {tuple(p) for p in stored(tmp_path / "p", "train").tolist()} == official
    for ours, theirs in (("val", "valid"), ("test", "test")):
        assert np.array_equal(sorted_rows(stored(tmp_path / "p", f"{ours}_pos")), sorted_rows(split[theirs]["edge"]))
        assert np.array_equal(sorted_rows(stored(tmp_path / "p", f"{ours}_neg")),
                              sorted_rows(split[theirs]["edge_neg"]))
    # every part's adjacency is made of training edges only
    for k in range(2):
        part = load_part(tmp_path / "p", k, meta)
        columns = np.concatenate([part.node_ids, part.halo_ids])
        rows = np.repeat(part.node_ids, np.diff(part.indptr))
        assert {tuple(sorted(e)) for e in zip(rows.tolist(), columns[part.indices].tolist())} <= official


@pytest.mark.mpi
def test_collab_trains_and_reports_ogbs_metric(ogbl_root, tmp_path):
    partition(ogbl_root, "ogbl-collab", tmp_path / "p")
    out = tmp_path / "m.jsonl"
    done = run_mpi(2, "train", "--parts", str(tmp_path / "p"), "--task", "link", "--epochs", "3", "--hidden", "8",
                   "--metrics-out", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr
    final = json.loads(out.read_text().splitlines()[-1])
    assert final["selection_metric"] == "hits@50" and final["dataset"] == "ogbl-collab"
    assert 0.0 <= final["test_at_best_val"] <= 1.0


def test_citation2_ranks_against_its_official_negatives(ogbl_root, tmp_path):
    partition(ogbl_root, "ogbl-citation2", tmp_path / "p")
    split = torch.load(ogbl_root / "ogbl_citation2" / "split" / "time" / "test.pt", weights_only=False)
    pos, mrr = stored(tmp_path / "p", "test_pos"), stored(tmp_path / "p", "test_mrr")
    assert load_meta(tmp_path / "p").link["mrr_negatives"] == 30  # the official ones, not --mrr-negatives
    official = {(s, t): tuple(n) for s, t, n in zip(split["source_node"].tolist(), split["target_node"].tolist(),
                                                     split["target_node_neg"].tolist())}
    assert {tuple(p): tuple(n) for p, n in zip(pos.tolist(), mrr.tolist())} == official


def test_node_classification_of_an_ogbl_dataset_is_one_line(ogbl_root, tmp_path):
    done = run_cli("partition", "--dataset", "ogbl-collab", "--root", str(ogbl_root), "--num-parts", "2",
                   "--out", str(tmp_path / "p"))
    assert done.returncode != 0 and "partition it with --task link" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_split_file_holding_objects_is_refused_not_executed(ogbl_root, tmp_path):
    import shutil

    root = tmp_path / "root"
    shutil.copytree(ogbl_root / "ogbl_collab", root / "ogbl_collab")
    torch.save({"edge": np.zeros((2, 2), dtype=np.int64), "note": np.array(["x", 1], dtype=object)},
               root / "ogbl_collab" / "split" / "time" / "valid.pt")
    done = run_cli("partition", "--dataset", "ogbl-collab", "--root", str(root), "--num-parts", "2",
                   "--out", str(tmp_path / "p"), "--task", "link")
    assert done.returncode != 0 and "not a split file of plain arrays" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "p").exists()
