"""Chunked input and the distributed partitioner, checked against the dataset itself.

The simulated-rank tests (FakeComm threads) check the shuffles and the
numbering at R = 2, 3 with a simple seeded assignment, and need no MPI. The
PT-Scotch tests run the real thing under Open MPI's mpirun and skip, with the
reason, where PT-Scotch is not installed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.partition.chunked import load_chunked, read_meta, write_graph
from gnn_dist.partition.convert import convert
from gnn_dist.partition.datasets import load_dataset
from gnn_dist.partition.distributed import ChunkedSource, partition_distributed
from gnn_dist.partition.format import load_meta
from gnn_dist.partition.graph import DatasetError
from tests.conftest import run_cli, run_mpi
from tests.test_datasets import write_tiny_ogbn_arxiv
from tests.test_partition import check_round_trip


def same_graph(a, b) -> None:
    assert a.num_nodes == b.num_nodes and a.num_classes == b.num_classes
    assert np.array_equal(a.edge_index, b.edge_index)
    for name in ("x", "y", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def hashed_parts(comm, vtxdist, indptr, adjacency, num_parts, seed):
    """A seeded assignment that needs no partitioner: enough to exercise every shuffle."""
    ids = np.arange(vtxdist[comm.rank], vtxdist[comm.rank + 1], dtype=np.int64)
    return (ids * 2654435761 + seed) % 7919 % num_parts


@pytest.fixture(scope="module")
def small_graph():
    return load_dataset("synthetic:small")


@pytest.fixture(scope="module")
def small_chunked(tmp_path_factory, small_graph):
    out = tmp_path_factory.mktemp("chunked") / "small"
    convert("synthetic:small", out, edges_per_chunk=4_000)  # 8 edge chunks, so every rank reads several
    return out


def test_streamed_synthetic_is_the_loaded_graph(small_chunked, small_graph):
    meta = read_meta(small_chunked)
    assert len(meta.edge_chunks) == 8 and meta.num_input_edges == 30_000
    same_graph(load_chunked(small_chunked), small_graph)


def test_ogb_fixture_streams_to_the_same_graph(tmp_path, monkeypatch):
    write_tiny_ogbn_arxiv(tmp_path)
    monkeypatch.setattr("gnn_dist.partition.convert.CSV_ROWS", 3)  # several csv chunks even on 7 edges
    convert("ogbn-arxiv", tmp_path / "chunked", root=tmp_path, nodes_per_chunk=4, edges_per_chunk=2)
    assert len(read_meta(tmp_path / "chunked").node_chunks) == 2
    same_graph(load_chunked(tmp_path / "chunked"), load_dataset("ogbn-arxiv", tmp_path))


def test_cora_round_trips(tmp_path, cora_root):
    graph = load_dataset("planetoid:Cora", cora_root)
    write_graph(graph, tmp_path / "cora", nodes_per_chunk=1000, edges_per_chunk=3000)
    same_graph(load_chunked(tmp_path / "cora"), graph)
    done = run_cli("convert", "--dataset", "planetoid:Cora", "--root", str(cora_root), "--out", str(tmp_path / "c2"))
    assert done.returncode == 0, done.stderr
    same_graph(load_dataset(f"chunked:{tmp_path / 'c2'}"), graph)


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("num_parts", [2, 4])
def test_simulated_ranks_write_every_invariant(tmp_path, small_chunked, small_graph, ranks, num_parts):
    out = tmp_path / "parts"
    run_fake_ranks(ranks, lambda comm: partition_distributed(comm, ChunkedSource(small_chunked), num_parts, out,
                                                             assigner=hashed_parts, method="hashed"))
    check_round_trip(small_graph, out)
    # the parts follow the assignment: node v is in part hashed(v)
    meta = load_meta(out)
    node_map = np.load(out / "node_map.npy")
    expected = (node_map * 2654435761) % 7919 % num_parts
    owner = np.searchsorted(meta.partptr, np.arange(meta.num_nodes), side="right") - 1
    assert np.array_equal(owner, expected)


def test_one_rank_with_sequential_scotch_in_process(tmp_path, small_chunked, small_graph):
    pytest.importorskip("pyscotch", reason="pyscotch is not installed (pip install 'gnn-dist[distpart]')")
    done = run_cli("partition", "--dataset", f"chunked:{small_chunked}", "--num-parts", "4", "--method", "ptscotch",
                   "--out", str(tmp_path / "s1"))
    assert done.returncode == 0, done.stderr
    check_round_trip(small_graph, tmp_path / "s1")
    metis = run_cli("partition", "--dataset", "synthetic:small", "--num-parts", "4", "--out", str(tmp_path / "m"))
    assert metis.returncode == 0, metis.stderr
    assert load_meta(tmp_path / "s1").edge_cut <= 1.1 * load_meta(tmp_path / "m").edge_cut


def _need_ptscotch() -> None:
    from gnn_dist.partition.scotch import missing_for_ranks

    problem = missing_for_ranks()
    if problem:
        pytest.skip(problem)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("num_parts", [2, 4])
def test_ptscotch_under_open_mpi(tmp_path, small_chunked, small_graph, ranks, num_parts):
    _need_ptscotch()
    out = tmp_path / "parts"
    done = run_cli("partition", "--dataset", f"chunked:{small_chunked}", "--num-parts", str(num_parts),
                   "--method", "ptscotch", "--ranks", str(ranks), "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"on {ranks} ranks" in done.stdout
    check_round_trip(small_graph, out)
    assert load_meta(out).method == "ptscotch"


@pytest.mark.mpi
def test_training_on_ptscotch_parts_matches_pymetis_parts(tmp_path, small_chunked, partitioned):
    _need_ptscotch()
    scotch = tmp_path / "scotch"
    done = run_cli("partition", "--dataset", f"chunked:{small_chunked}", "--num-parts", "2", "--method", "ptscotch",
                   "--ranks", "2", "--out", str(scotch), timeout=300)
    assert done.returncode == 0, done.stderr
    metis = partitioned("synthetic:small", 2)
    assert not np.array_equal(np.load(scotch / "node_map.npy"), np.load(metis / "node_map.npy"))
    curves = []
    for parts in (scotch, metis):
        metrics = tmp_path / f"{parts.name}.jsonl"
        run = run_mpi(2, "train", "--parts", str(parts), "--epochs", "5", "--no-progress", "--metrics-out", str(metrics))
        assert run.returncode == 0, run.stderr
        curves.append([json.loads(line)["loss"] for line in metrics.read_text().splitlines()[:-1]])
    assert len(curves[0]) == 5
    assert np.allclose(curves[0], curves[1], rtol=1e-4, atol=0)


def _break(directory, how: str) -> None:
    meta_path = directory / "meta.json"
    raw = json.loads(meta_path.read_text())
    if how == "missing edge chunk":
        (directory / raw["edge_chunks"][1]["file"]).unlink()
    elif how == "overlapping node ranges":
        raw["node_chunks"].append(dict(raw["node_chunks"][0], file="nodes-extra.npz"))
        meta_path.write_text(json.dumps(raw))
    elif how == "edge ids outside":
        path = directory / raw["edge_chunks"][2]["file"]
        edges = np.load(path)
        edges[1, 5] = raw["num_nodes"] + 3
        np.save(path, edges)
    elif how == "expected int64":
        path = directory / raw["edge_chunks"][0]["file"]
        np.save(path, np.load(path).astype(np.int32))


@pytest.mark.parametrize("how", ["missing edge chunk", "overlapping node ranges", "edge ids outside", "expected int64"])
@pytest.mark.parametrize("method, ranks", [("metis", None), ("hashed", 2), ("ptscotch", 2)])
def test_bad_chunked_input_is_one_clear_line(tmp_path, how, method, ranks):
    source = tmp_path / "in"
    convert("synthetic:tiny", source, edges_per_chunk=400)
    _break(source, how)
    out = tmp_path / "parts"
    if method == "hashed":  # simulated ranks: the error reaches every rank, nothing is written
        with pytest.raises(Exception, match=how):
            run_fake_ranks(ranks, lambda comm: partition_distributed(comm, ChunkedSource(source), 2, out,
                                                                     assigner=hashed_parts, method="hashed"))
    else:
        if method == "ptscotch":
            _need_ptscotch()
        args = ["--ranks", str(ranks)] if ranks else []
        done = run_cli("partition", "--dataset", f"chunked:{source}", "--num-parts", "2", "--method", method,
                       "--out", str(out), *args, timeout=300)
        assert done.returncode != 0
        errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and how in errors[0], done.stderr
    assert sorted(os.listdir(tmp_path)) == ["in"]  # no output, not even a hidden temporary


def test_chunked_reader_names_each_defect(tmp_path):
    convert("synthetic:tiny", tmp_path / "t", edges_per_chunk=400)
    _break(tmp_path / "t", "overlapping node ranges")
    with pytest.raises(DatasetError, match="overlapping node ranges"):
        read_meta(tmp_path / "t")
    with pytest.raises(DatasetError, match="not a chunked graph directory"):
        read_meta(tmp_path)


@pytest.mark.parametrize("method", ["metis", "ptscotch"])
def test_memory_guard_refuses_before_loading(tmp_path, small_chunked, method):
    done = run_cli("partition", "--dataset", f"chunked:{small_chunked}", "--num-parts", "2", "--method", method,
                   "--memory-limit", "100M", "--out", str(tmp_path / "p"))
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and "over the --memory-limit 100.0 MiB" in done.stderr, done.stderr
    assert ("--method ptscotch" in done.stderr) == (method == "metis")  # the fix: the chunked path, or more ranks
    assert not (tmp_path / "p").exists()
    fits = run_cli("partition", "--dataset", f"chunked:{small_chunked}", "--num-parts", "2", "--method", "metis",
                   "--memory-limit", "8G", "--out", str(tmp_path / "p"))
    assert fits.returncode == 0, fits.stderr


def test_guard_grows_with_the_graph_and_shrinks_with_ranks():
    from gnn_dist.partition.graph import GraphSizes
    from gnn_dist.partition.memory_model import predicted_peak

    small, big = GraphSizes(10**6, 100, 10**7), GraphSizes(10**6, 100, 10**8)
    assert predicted_peak(big, "metis") > predicted_peak(small, "metis")
    assert predicted_peak(big, "ptscotch", 4) < predicted_peak(big, "ptscotch", 2) < predicted_peak(big, "ptscotch", 1)


@pytest.mark.parametrize("args, message", [
    (["--method", "metis", "--ranks", "2"], "--ranks is for --method ptscotch"),
    (["--method", "ptscotch", "--balance-train"], "--balance-train needs METIS"),
    (["--method", "ptscotch", "--balance-edges"], "--balance edges weighs METIS's vertices"),
    (["--method", "ptscotch", "--balance", "both"], "--balance both weighs METIS's vertices"),
])
def test_bad_flag_combinations(tmp_path, small_chunked, args, message):
    done = run_cli("partition", "--dataset", f"chunked:{small_chunked}", "--num-parts", "2", "--out",
                   str(tmp_path / "p"), *args)
    assert done.returncode != 0 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_ptscotch_without_pyscotch_says_how_to_install(tmp_path, small_chunked):
    # a python that cannot import pyscotch (hidden by a shadowing module that raises ImportError)
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "pyscotch.py").write_text("raise ImportError('no pyscotch here')\n")
    env = {"PYTHONPATH": f"{shadow}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "gnn_dist", "partition", "--dataset", f"chunked:{small_chunked}",
                           "--num-parts", "2", "--method", "ptscotch", "--out", str(tmp_path / "p")],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    assert done.returncode != 0 and "pip install 'gnn-dist[distpart]'" in done.stderr, done.stderr
