"""Checkpoint and resume, a killed or hung rank, and bad input that never costs data (issue: no hangs)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import MPIEXEC, run_cli, run_mpi

pytestmark = pytest.mark.mpi


def losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines() if "final" not in json.loads(line)]


def train(num_parts, parts, *args, env=None, timeout=180):
    return run_mpi(num_parts, "train", "--parts", str(parts), "--no-progress", *args, env=env, timeout=timeout)


def final_record(path: Path) -> dict:
    return json.loads(path.read_text().splitlines()[-1])


def resume_and_prove_the_start(parts, args: list[str], metrics: Path, start: int):
    """Resume, proving the run began at epoch `start`: a failure is planted at epoch start - 1, which a run
    that silently retrained from epoch 0 would reach, and the final record counts the epochs it executed."""
    env = {"GNN_DIST_FAIL_AT": f"0:{start - 1}"} if start > 0 else None
    done = train(2, parts, *args, "--resume", "--metrics-out", str(metrics), env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(f"resuming at epoch {start} from the checkpoint") == 1, done.stderr
    final = final_record(metrics)
    assert final["resumed_from_epoch"] == start
    assert final["epochs_run"] == final["epochs"] - start
    return done


def whole_and_resumed_losses(parts, common: list[str], tmp_path: Path, every: int, fail_at: str):
    """Loss curves of an uninterrupted run and of one stopped by a failing rank, then resumed."""
    whole = tmp_path / "whole.jsonl"
    assert train(2, parts, *common, "--metrics-out", str(whole)).returncode == 0
    ckpt, resumed = tmp_path / "ckpt", tmp_path / "resumed.jsonl"
    done = train(2, parts, *common, "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(every),
                 "--metrics-out", str(resumed), env={"GNN_DIST_FAIL_AT": fail_at})
    assert done.returncode != 0 and not resumed.exists()
    stopped_at = int(fail_at.split(":")[1])
    assert sorted(p.name for p in ckpt.iterdir())[-1] == f"epoch-{stopped_at // every * every:06d}"
    resume_and_prove_the_start(parts, [*common, "--checkpoint-dir", str(ckpt)], resumed, stopped_at // every * every)
    return losses(whole), losses(resumed)


# "adaptive:0.05,pipeline": per-layer state restored by layer; adaptive skips its layer on every other epoch
# from epoch 2 in this run, so the resumed run must restore its reused blocks and skip counts to match.
@pytest.mark.parametrize("schedule, dtype, halo_memory", [
    ("exact", "fp32", "resident"), ("pipeline", "fp32", "resident"), ("stale:3", "int8", "resident"),
    ("adaptive:0.05,pipeline", "fp32", "resident"), ("exact", "bf16", "sequential"), ("stale:3", "fp32", "sequential")])
def test_stopped_and_resumed_run_equals_the_uninterrupted_one(partitioned, tmp_path, schedule, dtype, halo_memory):
    common = ["--epochs", "12", "--hidden", "32", "--num-layers", "3", "--schedule", schedule, "--halo-dtype", dtype,
              "--batch-norm", "--halo-memory", halo_memory, "--halo-block-rows", "200"]
    a, b = whole_and_resumed_losses(partitioned("synthetic:small", 2), common, tmp_path, every=4, fail_at="1:6")
    assert len(a) == len(b) == 12
    for x, y in zip(a, b):
        assert abs(x - y) <= 1e-4 * abs(x)


def test_sampled_run_resumes_where_it_stopped(partitioned, tmp_path):
    # Batches, samples and dropout masks are keyed by (seed, epoch, step, rank), so a resumed
    # sampled run repeats the uninterrupted one; the feature cache changes bytes, never values.
    common = ["--epochs", "6", "--model", "sage", "--mode", "sampled", "--fanouts", "5,5", "--batch-size", "64",
              "--hidden", "16", "--num-layers", "2", "--feature-cache-mb", "0.05"]
    a, b = whole_and_resumed_losses(partitioned("synthetic:small", 2), common, tmp_path, every=2, fail_at="1:5")
    assert len(a) == len(b) == 6
    for x, y in zip(a, b):
        assert abs(x - y) <= 1e-6 * abs(x)


def test_keep_only_the_last_checkpoints(partitioned, tmp_path):
    ckpt = tmp_path / "ckpt"
    done = train(2, partitioned("synthetic:small", 2), "--epochs", "10", "--checkpoint-dir", str(ckpt),
                 "--checkpoint-every", "2", "--keep-checkpoints", "2")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-000008", "epoch-000010"]
    for folder in ckpt.iterdir():
        assert sorted(p.name for p in folder.iterdir()) == ["MANIFEST.json", "rank-00000.pt", "rank-00001.pt",
                                                          "replicated.pt"]


def _python_ranks_of(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(b"python" in part for part in cmdline[:1]) and marker.encode() in b" ".join(cmdline):
                pids.append(int(entry.name))
    return pids


def test_a_killed_rank_ends_the_job_and_resume_loses_little(partitioned, tmp_path):
    if MPIEXEC is None:
        pytest.skip("mpiexec not found")
    parts = tmp_path / "parts-kill"  # a unique path to find this job's processes by
    shutil.copytree(partitioned("synthetic:small", 2), parts)
    ckpt = tmp_path / "ckpt"
    metrics = tmp_path / "m.jsonl"
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "gnn_dist", "train", "--parts", str(parts), "--epochs", "100000",
           "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5", "--no-progress", "--metrics-out", str(metrics)]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (ckpt.exists() and len(list(ckpt.glob("*/MANIFEST.json"))) >= 2):
        assert time.monotonic() < deadline and job.poll() is None, "no checkpoint appeared"
        time.sleep(0.2)
    ranks = _python_ranks_of(str(parts))
    assert len(ranks) == 2
    os.kill(ranks[1], signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        job.wait(timeout=60)
    finally:
        job.kill()
    assert job.returncode != 0
    assert time.monotonic() - killed_at < 60
    newest = max(int(p.name.split("-")[1]) for p in ckpt.glob("*") if (p / "MANIFEST.json").exists())
    resume_and_prove_the_start(parts, ["--epochs", str(newest + 2), "--checkpoint-dir", str(ckpt)], metrics, newest)
    assert len(losses(metrics)) == newest + 2


def assert_names_the_hang_at_epoch_3(stderr: str) -> None:
    """Rank 1 hangs before epoch 3's first beat (GNN_DIST_FAIL_AT=1:3:hang), so its own watchdog names its last
    progress (epoch 2's end) while rank 0's names epoch 3, where it waits for rank 1; whichever fires first is the
    one reported (CI has seen both). Either names the hang's place; an earlier epoch would not."""
    assert "no progress for" in stderr
    assert "stalled in: epoch 2" in stderr or "stalled in: epoch 3" in stderr, stderr


def test_watchdog_names_the_stalled_step(partitioned):
    start = time.monotonic()
    # --timeout 10, not less: a busy 2-core host can leave a healthy epoch silent for several seconds, and the
    # watchdog would then rightly fire at that epoch instead of the injected hang.
    done = train(2, partitioned("synthetic:small", 2), "--epochs", "1000", "--timeout", "10",
                 env={"GNN_DIST_FAIL_AT": "1:3:hang"}, timeout=120)
    assert done.returncode != 0
    assert time.monotonic() - start < 80  # far below the 1000 epochs' run: the stall, not the end, stopped it
    assert_names_the_hang_at_epoch_3(done.stderr)


WATCHDOG_PROBE = """
import sys, time
from gnn_dist.resilience.watchdog import Watchdog

def abort(code):
    print("aborted", flush=True)
    sys.stdout.flush()
    import os
    os._exit(3)

dog = Watchdog(timeout=0.5, rank=0, abort=abort, poll=0.05)
for step in range(int(sys.argv[1])):  # a slow phase that keeps reporting progress: 3x the timeout in all
    time.sleep(0.1)
    dog.beat(f"step {step}")
print("survived", flush=True)
time.sleep(float(sys.argv[2]))  # then silence
dog.stop()
print("finished", flush=True)
"""


@pytest.mark.parametrize("silence, expect_abort", [(0.2, False), (3.0, True)])
def test_watchdog_waits_while_progress_is_reported_and_aborts_on_silence(silence, expect_abort):
    done = subprocess.run([sys.executable, "-c", WATCHDOG_PROBE, "15", str(silence)], capture_output=True,
                          text=True, timeout=60)
    assert "survived" in done.stdout  # 1.5 s of steady beats never trip a 0.5 s timeout
    if expect_abort:
        assert done.returncode == 3 and "aborted" in done.stdout and "finished" not in done.stdout
        assert "no progress for" in done.stderr and "stalled in: step 14" in done.stderr
    else:
        assert done.returncode == 0 and "finished" in done.stdout and "aborted" not in done.stdout


def test_watchdog_catches_a_hang_in_sampled_mode(partitioned):
    start = time.monotonic()
    # --timeout 30, not 4: --timeout S holds in set-up too, and on a busy 2-core host (CI's parallel pass on a
    # slower CPU) one set-up step ran past 4 s, so the watchdog fired there instead of at the injected hang.
    done = train(2, partitioned("synthetic:small", 2), "--mode", "sampled", "--model", "sage", "--fanouts", "5,5",
                 "--batch-size", "64", "--epochs", "1000", "--timeout", "30", env={"GNN_DIST_FAIL_AT": "1:3:hang"},
                 timeout=240)
    assert done.returncode != 0
    assert time.monotonic() - start < 200
    assert "(--timeout 30)" in done.stderr, done.stderr
    assert_names_the_hang_at_epoch_3(done.stderr)


def test_corrupt_checkpoint_shard_is_named(partitioned, tmp_path):
    ckpt = tmp_path / "ckpt"
    parts = partitioned("synthetic:small", 2)
    assert train(2, parts, "--epochs", "2", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2").returncode == 0
    shard = ckpt / "epoch-000002" / "rank-00001.pt"
    shard.write_bytes(shard.read_bytes()[:-20])
    done = train(2, parts, "--epochs", "4", "--checkpoint-dir", str(ckpt), "--resume")
    assert done.returncode != 0
    assert "rank-00001.pt is missing or corrupt" in done.stderr


def test_full_disk_during_a_checkpoint(partitioned, tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a small tmpfs")
    parts = partitioned("synthetic:small", 2)
    args = ["--epochs", "6", "--hidden", "256", "--num-layers", "3", "--checkpoint-every", "2"]
    sized = tmp_path / "sized"
    assert train(2, parts, *args, "--checkpoint-dir", str(sized), "--keep-checkpoints", "5").returncode == 0
    one = sum(f.stat().st_size for f in (sized / "epoch-000002").iterdir())
    disk = tmp_path / "disk"
    disk.mkdir()
    metrics = tmp_path / "m.jsonl"
    script = (f"mount -t tmpfs -o size={int(one * 1.5)} tmpfs {disk} || exit 77; "
              + " ".join([MPIEXEC, "-n", "2", sys.executable, "-m", "gnn_dist", "train", "--parts", str(parts),
                          "--no-progress", *args, "--checkpoint-dir", str(disk / "ckpt"), "--keep-checkpoints", "5",
                          "--metrics-out", str(metrics)])
              + f"; code=$?; ls -a {disk}/ckpt/*/ > {tmp_path}/listing; exit $code")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=180)
    if done.returncode == 77:
        pytest.skip("mounting a tmpfs is not permitted here")
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "checkpoint to" in errors[0] and "No space left on device" in errors[0]
    assert "epoch-000004" in errors[0]
    listing = (tmp_path / "listing").read_text()
    # the first checkpoint is complete, the failed one left no shard and no manifest
    assert listing.count("MANIFEST.json") == 1 and ".tmp" not in listing
    assert not metrics.exists()


@pytest.mark.parametrize("where", ["metrics", "checkpoint"])
def test_unwritable_output_is_refused_before_training(partitioned, tmp_path, where):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    target = ["--metrics-out", str(blocker / "m.jsonl")] if where == "metrics" else \
        ["--checkpoint-dir", str(blocker / "ckpt")]
    done = train(2, partitioned("synthetic:small", 2), "--epochs", "2", *target, timeout=60)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and str(blocker) in errors[0]


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(format_version=7), "format_version 7"),
    (lambda m: m.pop("num_classes"), "missing keys num_classes"),
])
def test_bad_meta_json_under_mpiexec(partitioned, tmp_path, change, message):
    parts = tmp_path / "p"
    shutil.copytree(partitioned("synthetic:small", 2), parts)
    meta = json.loads((parts / "meta.json").read_text())
    change(meta)
    (parts / "meta.json").write_text(json.dumps(meta))
    done = train(2, parts, timeout=60)
    assert done.returncode != 0
    assert done.stderr.count(message) == 1


def test_resume_without_a_checkpoint_starts_fresh(partitioned, tmp_path):
    done = train(2, partitioned("synthetic:small", 2), "--epochs", "2", "--checkpoint-dir", str(tmp_path / "c"),
                 "--resume")
    assert done.returncode == 0
    assert "starting at epoch 0" in done.stderr


def test_unknown_dataset_and_missing_files_from_the_cli(tmp_path):
    for args, message in ((["--dataset", "ogbn-foo"], "unknown dataset"),
                          (["--dataset", "planetoid:Cora", "--root", str(tmp_path)], "missing ind.cora.x")):
        done = run_cli("partition", *args, "--num-parts", "2", "--out", str(tmp_path / "p"))
        assert done.returncode != 0 and message in done.stderr
        assert not (tmp_path / "p").exists()


def test_timeout_auto_fits_the_limit_to_the_steps_seen(monkeypatch):
    """--timeout auto: 600 s through set-up and a phase's first round; then 20 x the longest quiet gap of the
    phase, at least 60 s in training and 300 s in evaluation."""
    import gnn_dist.resilience.watchdog as watchdog

    clock = [0.0]
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: clock[0])
    dog = watchdog.Watchdog("auto", rank=0, abort=lambda code: None, poll=3600)
    try:
        def beat(step, after):
            clock[0] += after
            dog.beat(step)

        beat("set-up: fetching halo input features", 30.0)
        assert dog.limit() == watchdog.AUTO_FIRST
        beat("epoch 0: training step", 5.0)
        beat("halo exchange", 0.5)
        beat("halo exchange", 4.0)  # the longest quiet gap inside training: 4 s
        assert dog.limit() == watchdog.AUTO_FIRST  # training not yet seen through
        beat("epoch 0: evaluation", 1.0)
        assert dog.limit() == watchdog.AUTO_FIRST  # nor evaluation
        beat("epoch 1: training step", 20.0)  # evaluation was quiet for 20 s
        assert dog.limit() == 80.0  # 20 x 4 s
        beat("epoch 1: evaluation", 1.0)
        assert dog.limit() == 400.0  # 20 x 20 s
        beat("epoch 2: training step", 2.0)
        beat("epoch 2: evaluation", 0.1)
        beat("epoch 3: training step", 0.1)
        assert dog.limit() == 80.0  # the longest gap so far still rules
        beat("epoch 3: training step: summing the epoch's figures over ranks", 0.1)
        assert dog.limit() == 80.0  # the epoch's bookkeeping stays under training's limit, not evaluation's
    finally:
        dog.stop()
    # A run that evaluates rarely: training is seen through when the next epoch's step is announced.
    dog = watchdog.Watchdog("auto", rank=0, abort=lambda code: None, poll=3600)
    try:
        beat("set-up: fetching halo input features", 30.0)
        beat("epoch 0: training step", 5.0)
        beat("halo exchange", 1.5)
        assert dog.limit() == watchdog.AUTO_FIRST
        beat("epoch 0: training step: summing the epoch's figures over ranks", 0.5)
        beat("epoch 1: training step", 0.1)
        assert dog.limit() == watchdog.AUTO_FLOOR
        beat("halo exchange", 4.0)
        assert dog.limit() == 80.0
    finally:
        dog.stop()
    fixed = watchdog.Watchdog(45, rank=0, abort=lambda code: None, poll=3600)
    assert fixed.limit() == 45
    fixed.stop()


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "written-before-subpackages"


# Written by commit ec388d8, before the runtime was grouped into subpackages (the fixture folder holds the partition
# it trained on, its checkpoint at epoch 4 and its metrics): the options of each run.
OLD_RUNS = {"checkpoint-gcn": ["--hidden", "8"],
            "checkpoint-gat-stale": ["--model", "gat", "--heads", "2", "--hidden", "4", "--schedule", "stale:3"]}


@pytest.mark.parametrize("run", sorted(OLD_RUNS))
def test_a_checkpoint_written_before_the_layout_moved_resumes_on_the_uninterrupted_curve(tmp_path, run):
    # The same partition, so each rank's own state (stale's cached halos) comes back too; a run of today's code
    # from epoch 0 is the curve the resumed one must follow.
    parts = tmp_path / "parts"
    shutil.copytree(FIXTURES / "parts-tiny-2", parts)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / run, ckpt, ignore=shutil.ignore_patterns("metrics.jsonl"))
    common = ["--epochs", "8", "--checkpoint-every", "4", *OLD_RUNS[run]]
    whole, resumed = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl"
    assert train(2, parts, *common, "--metrics-out", str(whole)).returncode == 0
    resume_and_prove_the_start(parts, [*common, "--checkpoint-dir", str(ckpt)], resumed, 4)
    a, b = losses(whole), losses(resumed)
    assert len(a) == len(b) == 8
    for x, y in zip(a[4:], b[4:]):
        assert abs(x - y) <= 1e-5 * abs(x)
    # and the epochs before the checkpoint are those the old code trained (the move changed no arithmetic)
    for x, y in zip(a[:4], losses(FIXTURES / run / "metrics.jsonl")):
        assert abs(x - y) <= 1e-5 * abs(x)


def test_a_checkpoint_written_before_the_layout_moved_resumes_at_another_rank_count(partitioned, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "checkpoint-gcn", ckpt, ignore=shutil.ignore_patterns("metrics.jsonl"))
    parts = partitioned("synthetic:tiny", 1)
    common = ["--epochs", "8", "--hidden", "8"]
    whole, resumed = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl"
    assert run_mpi(1, "train", "--parts", str(parts), "--no-progress", *common, "--metrics-out", str(whole)
                   ).returncode == 0
    done = run_mpi(1, "train", "--parts", str(parts), "--no-progress", *common, "--checkpoint-dir", str(ckpt),
                   "--resume", "--metrics-out", str(resumed))
    assert done.returncode == 0, done.stderr
    assert final_record(resumed)["resumed_from_epoch"] == 4
    for x, y in zip(losses(whole)[4:], losses(resumed)[4:], strict=True):
        assert abs(x - y) <= 1e-5 * abs(x)
