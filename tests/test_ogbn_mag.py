"""ogbn-mag read offline from OGB's raw layout: a tiny fixture written in that layout, read back as the typed
graph it describes, partitioned and trained with R-GCN; missing files get one line naming the fix."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from gnn_dist.partition.datasets import load_dataset
from gnn_dist.partition.graph import DatasetError
from tests.conftest import run_cli, run_mpi

COUNTS = {"author": 40, "field_of_study": 12, "institution": 5, "paper": 60}
RELATIONS = [("author", "affiliated_with", "institution"), ("author", "writes", "paper"), ("paper", "cites", "paper"),
             ("paper", "has_topic", "field_of_study")]
CLASSES = 4


def write_csv(path: Path, rows, header: list[str] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ([",".join(header)] if header else []) + [",".join(str(v) for v in row) for row in rows]
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(lines) + "\n")


def write_tiny_mag(root: Path, seed: int = 0) -> dict:
    """OGB's mag layout under root/ogbn_mag, small; returns what it wrote (the reference)."""
    rng = np.random.default_rng(seed)
    base = root / "ogbn_mag"
    raw = base / "raw"
    write_csv(raw / "num-node-dict.csv.gz", [[COUNTS[t] for t in COUNTS]], header=list(COUNTS))
    write_csv(raw / "triplet-type-list.csv.gz", RELATIONS)
    edges = {}
    for s, r, d in RELATIONS:
        e = np.stack([rng.integers(0, COUNTS[s], 150), rng.integers(0, COUNTS[d], 150)])
        edges[(s, r, d)] = e
        folder = raw / "relations" / f"{s}___{r}___{d}"
        write_csv(folder / "edge.csv.gz", e.T.tolist())
        write_csv(folder / "num-edge-list.csv.gz", [[e.shape[1]]])
        write_csv(folder / "edge_reltype.csv.gz", [[0]] * e.shape[1])
    x = rng.standard_normal((COUNTS["paper"], 8)).astype(np.float32)
    write_csv(raw / "node-feat" / "paper" / "node-feat.csv.gz", x.tolist())
    y = rng.integers(0, CLASSES, COUNTS["paper"])
    write_csv(raw / "node-label" / "paper" / "node-label.csv.gz", [[v] for v in y])
    write_csv(raw / "node_year" / "paper" / "node_year.csv.gz", [[2010 + v % 10] for v in range(COUNTS["paper"])])
    order = rng.permutation(COUNTS["paper"])
    split = {"train": order[:36], "valid": order[36:48], "test": order[48:]}
    for part, ids in split.items():
        write_csv(base / "split" / "time" / "paper" / f"{part}.csv.gz", [[v] for v in ids])
    return {"edges": edges, "x": x, "y": y, "split": split}


def test_ogbn_mag_reads_what_the_raw_files_hold(tmp_path):
    written = write_tiny_mag(tmp_path)
    graph = load_dataset("ogbn-mag", str(tmp_path))
    assert graph.target == "paper" and graph.node_types[0] == "paper"
    assert graph.num_nodes == COUNTS
    assert set(graph.x) == {"paper"}
    np.testing.assert_allclose(graph.x["paper"], written["x"], rtol=1e-6)
    assert set(graph.edges) == set(RELATIONS)
    for relation, e in written["edges"].items():
        assert np.array_equal(graph.edges[relation], e)
    assert np.array_equal(graph.y, written["y"])
    for mask, part in ((graph.train_mask, "train"), (graph.val_mask, "valid"), (graph.test_mask, "test")):
        assert np.array_equal(np.flatnonzero(mask), np.sort(written["split"][part]))
    # the second read comes from the typed .npz kept beside the raw files, and holds the same graph
    assert (tmp_path / "ogbn_mag" / "gnn_dist_cache_hetero.npz").is_file()
    again = load_dataset("ogbn-mag", str(tmp_path))
    assert again.name == "ogbn-mag" and again.num_nodes == graph.num_nodes
    for relation in RELATIONS:
        assert np.array_equal(again.edges[relation], graph.edges[relation])
    assert np.array_equal(again.x["paper"], graph.x["paper"]) and np.array_equal(again.y, graph.y)


def test_ogbn_mag_without_its_files_names_what_is_missing(tmp_path):
    with pytest.raises(DatasetError, match=r"ogbn-mag: missing .*num-node-dict.csv.gz.*place OGB's raw files"):
        load_dataset("ogbn-mag", str(tmp_path))
    done = run_cli("partition", "--dataset", "ogbn-mag", "--num-parts", "2", "--out", str(tmp_path / "p"))
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--root" in done.stderr and not (tmp_path / "p").exists()


@pytest.mark.mpi
def test_ogbn_mag_partitions_and_trains_with_rgcn(tmp_path):
    write_tiny_mag(tmp_path)
    parts = tmp_path / "p2"
    done = run_cli("partition", "--dataset", "ogbn-mag", "--root", str(tmp_path), "--num-parts", "2", "--out",
                   str(parts))
    assert done.returncode == 0, done.stderr
    meta = json.loads((parts / "meta.json").read_text())
    # PyG's ToUndirected: three relations between two types get their reverses, cites is made symmetric
    relations = {tuple(r) for r in meta["hetero"]["relations"]}
    assert relations == set(RELATIONS) | {("institution", "rev_affiliated_with", "author"),
                                          ("paper", "rev_writes", "author"),
                                          ("field_of_study", "rev_has_topic", "paper")}
    out = tmp_path / "m.jsonl"
    done = run_mpi(2, "train", "--parts", str(parts), "--model", "rgcn", "--hidden", "8", "--epochs", "3",
                   "--metrics-out", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr
    final = json.loads(out.read_text().splitlines()[-1])
    assert final["epochs_run"] == 3 and 0.0 <= final["test_acc"] <= 1.0 and final["halo_bytes_total"] > 0


def test_synthetic_mag_has_ogbn_mags_shape_at_its_scale():
    """synthetic:magtiny against ogbn-mag's published counts (docs/hetero.md) times 1/500: every type's nodes,
    every relation's edges within 15%, the split near 85.5 / 8.8 / 5.7%, papers mostly linked within their
    class, heavy-tailed degrees; the same seed gives the same graph."""
    # ogbn-mag's published counts (OGB's dataset page), written here rather than read from the generator
    FULL_NODES = {"paper": 736_389, "author": 1_134_649, "institution": 8_740, "field_of_study": 59_965}
    FULL_EDGES = {("author", "affiliated_with", "institution"): 1_043_998, ("author", "writes", "paper"): 7_145_660,
                  ("paper", "cites", "paper"): 5_416_271, ("paper", "has_topic", "field_of_study"): 7_505_078}
    IN_CLASS = 0.7  # the share of edges within a class that docs/hetero.md states

    graph = load_dataset("synthetic:magtiny")
    scale = 0.002
    for t, n in FULL_NODES.items():
        assert abs(graph.num_nodes[t] - n * scale) <= 1  # rounded
    for relation, n in FULL_EDGES.items():
        assert graph.edges[relation].shape[1] == pytest.approx(n * scale, rel=0.15), relation
    papers = graph.num_nodes["paper"]
    assert graph.train_mask.sum() / papers == pytest.approx(0.855, abs=0.03)
    assert graph.test_mask.sum() / papers == pytest.approx(0.057, abs=0.02)
    assert graph.x["paper"].shape == (papers, 128) and set(graph.x) == {"paper"} and graph.num_classes == 349
    cites = graph.edges[("paper", "cites", "paper")]
    within = np.mean(graph.y[cites[0]] == graph.y[cites[1]])
    assert within >= IN_CLASS - 0.05  # the class's share plus chance
    topics = np.bincount(graph.edges[("paper", "has_topic", "field_of_study")][1],
                         minlength=graph.num_nodes["field_of_study"])
    assert topics.max() > 5 * np.median(topics)
    again = load_dataset("synthetic:magtiny")
    assert all(np.array_equal(again.edges[r], graph.edges[r]) for r in FULL_EDGES)
    assert np.array_equal(again.x["paper"], graph.x["paper"])
