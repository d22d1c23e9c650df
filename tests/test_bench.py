"""`gnn-dist bench`: outputs, failure handling, plots and OGB scoring, on tiny sweeps."""
from __future__ import annotations

import csv
import json

import pytest

from gnn_dist.benchmarks.harness import CSV_COLUMNS, BenchConfig, config_from_args, plan_runs, sweep
from tests.conftest import MPIEXEC, run_cli
from tests.test_datasets import write_tiny_ogbn_arxiv

pytestmark = pytest.mark.mpi
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _needs_mpiexec():
    if MPIEXEC is None:
        pytest.skip("mpiexec not found")


def small(tmp_path, **overrides) -> BenchConfig:
    base = dict(datasets=["synthetic:tiny"], parts=[1, 2], epochs=3, hidden=8, num_layers=2, out=str(tmp_path / "b"),
                timeout=300)
    return BenchConfig(**{**base, **overrides})


def test_two_run_sweep_writes_every_output(tmp_path):
    config = small(tmp_path)
    rows = sweep(config, progress=False)
    out = tmp_path / "b"
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    header, results = lines[0]["header"], lines[1:]
    assert header["config"]["parts"] == [1, 2] and "torch" in header["environment"]
    assert "git_commit" in header["environment"] and "cpu" in header["environment"]
    assert {(r["backend"], r["parts"]) for r in results} == {("pyg", 1), ("gnn-dist", 1), ("gnn-dist", 2)}
    ours = [r for r in results if r["backend"] == "gnn-dist"]
    for r in ours:
        metrics = [json.loads(line) for line in (out / "runs" / r["run_id"] / "metrics.jsonl").read_text().splitlines()]
        assert r["test_acc"] == metrics[-1]["test_acc"]  # the table carries what the run measured
        assert 0 <= r["test_acc"] <= 1 and r["epoch_s_median"] > 0
    assert [r for r in ours if r["parts"] == 1][0]["halo_bytes_total"] == 0
    assert [r for r in ours if r["parts"] == 2][0]["halo_bytes_total"] > 0
    with open(out / "results.csv") as handle:
        assert handle.readline().startswith("# {")
        table = list(csv.DictReader(handle))
    assert list(table[0].keys()) == CSV_COLUMNS and len(table) == 3
    summary = (out / "summary.md").read_text()
    for section in ("## Epoch time", "## Halo bytes per epoch", "## Accuracy", "git commit"):
        assert section in summary
    for name in ("epoch_time_vs_parts.png", "bytes_by_schedule.png", "accuracy_vs_bytes.png", "peak_memory.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        import matplotlib.image

        assert matplotlib.image.imread(out / name).shape[0] > 100


def test_a_failing_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    config = small(tmp_path, parts=[2], schedules=["nonsense", "exact"], pyg=False)
    rows = sweep(config, progress=False)
    assert [r["status"] for r in rows] == ["failed", "ok"]
    assert "valid forms" in rows[0]["error"]
    summary = (tmp_path / "b" / "summary.md").read_text()
    assert "Runs that did not complete" in summary and "nonsense" in summary


def test_partitions_are_cached_and_reused(tmp_path):
    config = small(tmp_path, parts=[2], seeds=[0, 1], pyg=False)
    sweep(config, progress=False)
    partitions = list((tmp_path / "b" / "partitions").iterdir())
    assert len(partitions) == 1
    stamp = (partitions[0] / "meta.json").stat().st_mtime_ns
    sweep(config, progress=False)
    assert (partitions[0] / "meta.json").stat().st_mtime_ns == stamp


def test_ogb_datasets_are_scored_by_ogbs_evaluator(tmp_path):
    write_tiny_ogbn_arxiv(tmp_path / "ogb")
    config = small(tmp_path, datasets=["ogbn-arxiv"], root=str(tmp_path / "ogb"), parts=[1], pyg=False)
    rows = sweep(config, progress=False)
    assert rows[0]["status"] == "ok", rows[0]
    assert rows[0]["ogb_test_acc"] == pytest.approx(rows[0]["test_acc"])
    summary = (tmp_path / "b" / "summary.md").read_text()
    assert "71.74" in summary  # the leaderboard's GCN figure beside ours
    assert "more than 1 point" in summary  # a 6-node graph does not reach it


def test_dry_run_and_toml_config(tmp_path):
    toml = tmp_path / "bench.toml"
    toml.write_text('datasets = ["synthetic:tiny"]\nparts = [1, 2, 4]\nschedules = ["exact", "stale:4"]\n'
                    'seeds = [0, 1]\nepochs = 7\n')
    config, dry_run = config_from_args(["--config", str(toml), "--parts", "1,2", "--dry-run"])
    assert dry_run and config.parts == [1, 2] and config.epochs == 7 and config.seeds == [0, 1]
    assert len(plan_runs(config)) == 2 * 2 * 2
    done = run_cli("bench", "--config", str(toml), "--dry-run")
    assert done.returncode == 0
    assert done.stdout.count("mpiexec -n 4") == 4
    config, _ = config_from_args(["--schedules", "exact,stale:4/exact", "--dry-run"])
    assert config.schedules == ["exact", "stale:4,exact"]  # a per-layer schedule on the command line


def test_time_to_accuracy_on_a_modelled_link(tmp_path):
    # 20 ms latency per exchange on the slow link: several exchanges per epoch make it measurably slower.
    config = small(tmp_path, parts=[2], epochs=8, schedules=["exact", "stale:4"], links=["100", "0.01,20000"],
                   pyg=False)
    rows = sweep(config, progress=False)
    assert [r["status"] for r in rows] == ["ok"] * 4
    for r in rows:
        final = json.loads((tmp_path / "b" / "runs" / r["run_id"] / "metrics.jsonl").read_text().splitlines()[-1])
        assert final["simulated_link"].endswith("(modelled)")
    exact = {r["link"]: r for r in rows if r["schedule"] == "exact"}
    assert exact["100"]["test_acc"] == exact["0.01,20000"]["test_acc"]  # the model costs time, never results
    target = exact["100"]["target_val_acc"]
    assert target == pytest.approx(0.98 * exact["100"]["best_val_acc"])
    assert exact["100"]["time_to_target_s"] is not None
    assert exact["0.01,20000"]["time_to_target_s"] > exact["100"]["time_to_target_s"]
    summary = (tmp_path / "b" / "summary.md").read_text()
    assert "## Time to target validation accuracy (modelled link)" in summary and "20000 us latency (modelled)" in summary
    assert (tmp_path / "b" / "time_to_accuracy.png").read_bytes().startswith(PNG_SIGNATURE)
