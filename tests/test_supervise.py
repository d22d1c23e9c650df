"""Self-healing runs: a supervisor that restarts a crashed job from its checkpoint, and resume at another P."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.partition.format import load_meta, load_part
from gnn_dist.resilience.checkpoint import graph_identity
from tests.conftest import MPIEXEC, run_mpi
from tests.test_resilience import final_record, losses, train

pytestmark = pytest.mark.mpi

COMMON = ["--epochs", "12", "--hidden", "16", "--num-layers", "3", "--dropout", "0.5", "--no-progress"]


def supervise(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    if MPIEXEC is None:
        pytest.skip("mpiexec not found: pip install mpich (the [mpi] extra)")
    return subprocess.run([sys.executable, "-m", "gnn_dist", "supervise", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def train_command(num_parts: int, parts: Path, *args: str) -> list[str]:
    return [MPIEXEC or "mpiexec", "-n", str(num_parts), sys.executable, "-m", "gnn_dist", "train", "--parts", str(parts),
            *args]


def epochs_of(path: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in path.read_text().splitlines() if "final" not in json.loads(line)]


def assert_same_curve(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert abs(x - y) <= 1e-4 * abs(x), (a, b)


def test_a_killed_rank_is_restarted_and_the_run_equals_the_uninterrupted_one(partitioned, tmp_path):
    parts = partitioned("synthetic:small", 2)
    whole = tmp_path / "whole.jsonl"
    assert train(2, parts, *COMMON, "--metrics-out", str(whole)).returncode == 0
    metrics = tmp_path / "healed.jsonl"
    command = train_command(2, parts, *COMMON, "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "4",
                            "--metrics-out", str(metrics))
    # Rank 1 is SIGKILLed at epoch 6 of the first attempt only: the restarted job runs through.
    done = supervise("--max-restarts", "2", "--backoff", "0", "--", *command, env={"GNN_DIST_FAIL_AT": "1:6:kill@0"})
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("restart 1 of 2 in 0 s, resuming from epoch 4") == 1, done.stderr
    assert "restart 2" not in done.stderr
    assert epochs_of(metrics) == list(range(12))  # every epoch exactly once
    assert final_record(metrics)["restarts"] == 1
    assert final_record(metrics)["resumed_from_epoch"] == 4
    assert_same_curve(losses(whole), losses(metrics))


def test_bad_input_under_supervise_is_reported_once_and_never_retried(partitioned, tmp_path):
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    missing = supervise("--backoff", "0", "--", *train_command(2, tmp_path / "no-such-parts", *ckpt))
    assert missing.returncode == 3
    assert [line for line in missing.stderr.splitlines() if "error" in line] == \
        [line for line in missing.stderr.splitlines() if "gnn-dist train: error:" in line and "no-such-parts" in line]
    assert "not restarting" in missing.stderr and "restart 1" not in missing.stderr
    usage = supervise("--backoff", "0", "--", *train_command(2, partitioned("synthetic:small", 2), "--epochs", "x",
                                                             *ckpt))
    assert usage.returncode == 2 and "restart 1" not in usage.stderr
    no_checkpoints = supervise("--", *train_command(2, partitioned("synthetic:small", 2)))
    assert no_checkpoints.returncode == 2 and "has no --checkpoint-dir" in no_checkpoints.stderr


def test_a_job_that_keeps_failing_is_given_up_after_max_restarts(partitioned, tmp_path):
    command = train_command(2, partitioned("synthetic:small", 2), *COMMON, "--checkpoint-dir", str(tmp_path / "ckpt"),
                            "--checkpoint-every", "2")
    done = supervise("--max-restarts", "1", "--backoff", "0", "--", *command, env={"GNN_DIST_FAIL_AT": "0:3"})
    assert done.returncode == 1
    assert done.stderr.count("restart 1 of 1") == 1 and "giving up" in done.stderr


def test_sigterm_stops_the_job_and_the_supervisor_without_a_restart(partitioned, tmp_path):
    if MPIEXEC is None:
        pytest.skip("mpiexec not found")
    metrics = tmp_path / "m.jsonl"
    command = train_command(2, partitioned("synthetic:small", 2), "--epochs", "100000", "--no-progress",
                            "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics-out", str(metrics))
    job = subprocess.Popen([sys.executable, "-m", "gnn_dist", "supervise", "--backoff", "0", "--", *command],
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    partial = metrics.with_name(metrics.name + ".partial")
    deadline = time.monotonic() + 120
    while not (partial.exists() and partial.read_text().count("\n") >= 2):
        assert time.monotonic() < deadline and job.poll() is None, "the job never started training"
        time.sleep(0.2)
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=60)
    assert job.returncode != 0
    assert "stopped by signal 15: not restarting" in stderr and "restart 1" not in stderr


def checkpoint_after_a_failure(parts, num_parts: int, tmp_path: Path, name: str) -> Path:
    ckpt = tmp_path / name
    done = train(num_parts, parts, *COMMON, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "4",
                 env={"GNN_DIST_FAIL_AT": "0:6"})
    assert done.returncode != 0 and sorted(p.name for p in ckpt.iterdir())[-1] == "epoch-000004"
    return ckpt


def test_a_checkpoint_written_at_four_ranks_resumes_at_two_and_at_one(partitioned, tmp_path):
    whole = tmp_path / "whole.jsonl"
    assert train(4, partitioned("synthetic:small", 4), *COMMON, "--metrics-out", str(whole)).returncode == 0
    written = checkpoint_after_a_failure(partitioned("synthetic:small", 4), 4, tmp_path, "ckpt4")
    for resume_parts in (2, 1):
        ckpt = shutil.copytree(written, tmp_path / f"ckpt-at-{resume_parts}")  # each resume writes its own
        metrics = tmp_path / f"resumed-{resume_parts}.jsonl"
        done = train(resume_parts, partitioned("synthetic:small", resume_parts), *COMMON, "--checkpoint-dir",
                     str(ckpt), "--resume", "--metrics-out", str(metrics))
        assert done.returncode == 0, done.stderr
        assert done.stderr.count("was written by 4 ranks on another partition of this graph") == 1, done.stderr
        final = final_record(metrics)
        assert final["resumed_from_epoch"] == 4 and final["num_parts"] == resume_parts
        assert_same_curve(losses(whole), losses(metrics))


def test_resume_on_another_graph_or_model_is_refused_in_one_line(partitioned, tmp_path):
    ckpt = tmp_path / "ckpt"
    assert train(2, partitioned("synthetic:small", 2), "--epochs", "2", "--checkpoint-dir", str(ckpt)).returncode == 0
    cases = [
        (4, partitioned("synthetic:tiny", 4), [], "was trained on synthetic:small"),
        (2, partitioned("synthetic:small", 2), ["--hidden", "32"], "this run asks for"),
        (2, partitioned("synthetic:small", 2), ["--schedule", "stale:2"], "asks for stale:2"),
    ]
    for num_parts, parts, extra, message in cases:
        done = train(num_parts, parts, "--epochs", "4", "--checkpoint-dir", str(ckpt), "--resume", *extra)
        assert done.returncode == 3, done.stderr
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and message in errors[0], done.stderr


def test_the_graph_fingerprint_is_the_same_at_every_p_and_differs_for_another_seed(tmp_path):
    from gnn_dist.partition.datasets import load_dataset
    from gnn_dist.partition.partitioner import partition_graph

    def identity(directory: Path, num_parts: int) -> dict:
        meta = load_meta(directory)

        def rank_fn(comm):
            part = load_part(directory, comm.rank, meta)
            return graph_identity(comm, meta, part.node_ids, part.y, part.deg[:part.n_owned])

        return run_fake_ranks(num_parts, rank_fn)[0]

    graph = load_dataset("synthetic:small")
    seen = []
    for num_parts in (1, 2, 4):
        partition_graph(graph, num_parts, tmp_path / f"p{num_parts}")
        seen.append(identity(tmp_path / f"p{num_parts}", num_parts))
    assert seen[0] == seen[1] == seen[2]
    other = load_dataset("synthetic:small", seed=1)
    partition_graph(other, 2, tmp_path / "other")
    assert identity(tmp_path / "other", 2)["fingerprint"] != seen[0]["fingerprint"]


def test_the_replicated_state_is_written_once_whatever_the_rank_count(partitioned, tmp_path):
    sizes = {}
    for num_parts in (2, 4):
        ckpt = tmp_path / f"c{num_parts}"
        assert train(num_parts, partitioned("synthetic:small", num_parts), "--epochs", "2", "--hidden", "64",
                     "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2").returncode == 0
        files = {p.name: p.stat().st_size for p in (ckpt / "epoch-000002").iterdir()}
        assert set(files) == {"MANIFEST.json", "replicated.pt"} | {f"rank-{r:05d}.pt" for r in range(num_parts)}
        assert all(size < 2048 for name, size in files.items() if name.startswith("rank-"))  # exact: no state
        sizes[num_parts] = files
    assert abs(sizes[4]["replicated.pt"] - sizes[2]["replicated.pt"]) < 0.02 * sizes[2]["replicated.pt"]
    total = {p: sum(v for k, v in files.items() if k.endswith(".pt")) for p, files in sizes.items()}
    assert total[4] < 1.1 * total[2]


def test_a_finished_run_continues_with_more_epochs(partitioned, tmp_path):
    parts, ckpt, metrics = partitioned("synthetic:small", 2), tmp_path / "ckpt", tmp_path / "m.jsonl"
    assert train(2, parts, "--epochs", "5", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "4").returncode == 0
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-000004", "epoch-000005"]  # the last epoch too
    done = train(2, parts, "--epochs", "8", "--checkpoint-dir", str(ckpt), "--resume", "--metrics-out", str(metrics))
    assert done.returncode == 0, done.stderr
    assert final_record(metrics)["resumed_from_epoch"] == 5 and epochs_of(metrics) == list(range(8))


def test_restart_count_is_zero_without_a_supervisor(partitioned, tmp_path):
    metrics = tmp_path / "m.jsonl"
    assert run_mpi(2, "train", "--parts", str(partitioned("synthetic:small", 2)), "--epochs", "1", "--no-progress",
                   "--metrics-out", str(metrics)).returncode == 0
    assert final_record(metrics)["restarts"] == 0
    assert np.isfinite(losses(metrics)).all()


def test_a_job_that_lost_a_host_is_relaunched_smaller_on_the_hosts_that_answer(partitioned, tmp_path):
    """--hosts-file/--parts-for: the first launch runs 4 ranks on two "hosts" of 2 slots. That launch marks host
    beta as gone (the probe reads the marker) and rank 3 is killed at epoch 6; the relaunch probes again, finds
    alpha's 2 slots only, and resumes the 4-rank checkpoint at P=2: the curve is the uninterrupted P=4 run's."""
    whole = tmp_path / "whole.jsonl"
    assert train(4, partitioned("synthetic:small", 4), *COMMON, "--metrics-out", str(whole)).returncode == 0
    hosts, gone = tmp_path / "hosts", tmp_path / "gone"
    hosts.write_text("alpha:2\nbeta slots=2  # the second host\n")
    gone.mkdir()
    metrics, ckpt = tmp_path / "healed.jsonl", tmp_path / "ckpt"
    launch = ["sh", "-c", f'touch {gone}/beta; exec "$@"', "launch", MPIEXEC or "mpiexec", "-n", "{n}",
              sys.executable, "-m", "gnn_dist", "train", "--parts", "{parts}", *COMMON, "--checkpoint-dir", str(ckpt),
              "--checkpoint-every", "4", "--metrics-out", str(metrics)]
    parts_for = f"4:{partitioned('synthetic:small', 4)},2:{partitioned('synthetic:small', 2)}"
    done = supervise("--backoff", "0", "--hosts-file", str(hosts), "--parts-for", parts_for,
                     "--probe", f"test ! -e {gone}/{{host}}", "--", *launch, env={"GNN_DIST_FAIL_AT": "3:6:kill@0"})
    assert done.returncode == 0, done.stderr
    assert "not answering: beta (exit status 1)" in done.stderr, done.stderr
    assert done.stderr.count("relaunching at P=2 (was 4) on alpha:2") == 1, done.stderr
    final = final_record(metrics)
    assert (final["num_parts"], final["first_num_parts"], final["restarts"], final["resumed_from_epoch"]) == (2, 4, 1, 4)
    assert (ckpt / "supervise-hostfile").read_text() == "alpha slots=2\n"
    assert_same_curve(losses(whole), losses(metrics))


@pytest.mark.parametrize("options, command, message", [
    (["--hosts-file", "H"], ["-n", "{n}", "--parts", "{parts}"], "--hosts-file and --parts-for go together"),
    ([], ["-n", "{n}", "--parts", "p"], "the launch command holds {n}: give --hosts-file"),
    (["--hosts-file", "H", "--parts-for", "2:p"], ["-n", "2", "--parts", "{parts}"], "must take {n} and {parts}"),
    (["--hosts-file", "H", "--parts-for", "2"], ["-n", "{n}", "--parts", "{parts}"], "'2' is not P:DIR"),
    (["--hosts-file", "H", "--parts-for", "4:p"], ["-n", "{n}", "--parts", "{parts}"],
     "no partition in --parts-for (4 ranks) fits the 2 slot(s) of the hosts still answering"),
])
def test_shrink_options_that_cannot_work_are_refused_in_one_line(tmp_path, options, command, message):
    hosts = tmp_path / "hosts"
    hosts.write_text("alpha:2\nbeta:2\n")
    (tmp_path / "beta").touch()
    options = [str(hosts) if word == "H" else word for word in options]
    done = subprocess.run([sys.executable, "-m", "gnn_dist", "supervise", *options, "--probe",
                           f"test ! -e {tmp_path}/{{host}}", "--", "true", *command, "--checkpoint-dir",
                           str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=60)
    assert done.returncode in (1, 2), done.stderr
    lines = [line for line in done.stderr.splitlines() if "error" in line or "not launching" in line]
    assert len(lines) == 1 and message in lines[0], done.stderr
