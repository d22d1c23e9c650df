"""The ring watch that names a lost rank (gnn_dist.comm.peers), across real processes and real sockets, without a
launcher: under mpiexec the launcher races the survivors to the teardown (tests/test_cluster.py), so the naming
itself is pinned here, where nothing kills the survivors.

Each process runs one PeerMonitor; the only collective (the roster swap) goes through files."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# One rank: its roster swap goes through DIR/RANK.json; then it obeys stdin, one command a line:
# "probe" prints the peers that do not answer, "close" leaves on purpose (as a finished rank does), "fail"
# leaves on purpose saying it failed.
RANK = r"""
import json, os, sys, time
from pathlib import Path
from gnn_dist.comm.peers import PeerMonitor

class FileComm:
    def __init__(self, rank, size, folder):
        self.rank, self.size, self.folder = rank, size, Path(folder)
    def allgather_object(self, obj):
        mine = self.folder / f"{self.rank}.json"
        mine.with_suffix(".tmp").write_text(json.dumps(obj))
        os.replace(mine.with_suffix(".tmp"), mine)
        paths = [self.folder / f"{r}.json" for r in range(self.size)]
        while not all(p.exists() for p in paths):
            time.sleep(0.01)
        return [json.loads(p.read_text()) for p in paths]

rank, size, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
monitor = PeerMonitor.start(FileComm(rank, size, folder))
print("ready", flush=True)
for command in sys.stdin:
    command = command.strip()
    if command == "probe":
        print("unreachable:", "; ".join(monitor.unreachable()) or "none", flush=True)
    elif command in ("close", "fail"):
        monitor.close(failing=command == "fail")
        print("closed", flush=True)
        time.sleep(0.5)
        break
"""


def _ranks(size: int, folder: Path) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(size), str(folder)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank in range(size)]
    for process in ranks:
        assert process.stdout.readline().strip() == "ready", process.stderr.read()
    return ranks


def _tell(process: subprocess.Popen, command: str) -> str:
    process.stdin.write(command + "\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


def _stderr_after(process: subprocess.Popen, seconds: float) -> str:
    """What the process printed on stderr, once it has had `seconds` to react (then it leaves on purpose, so
    its own neighbours have nothing to report)."""
    time.sleep(seconds)
    assert _tell(process, "close") == "closed"
    return process.communicate(timeout=30)[1]


@pytest.fixture
def cleanup():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)


def test_both_neighbours_name_a_killed_rank_and_its_host(tmp_path, cleanup):
    ranks = _ranks(4, tmp_path)
    cleanup.extend(ranks)
    os.kill(ranks[2].pid, signal.SIGKILL)  # no chance to say goodbye, as when its host dies
    ranks[2].wait(timeout=30)
    host = socket.gethostname()
    # the ring is 0 -> 1 -> 2 -> 3 -> 0: ranks 1 and 3 are rank 2's neighbours, rank 0 is not
    assert _tell(ranks[0], "probe") == f"unreachable: rank 2 on {host} (Connection refused)"
    said = {rank: _stderr_after(ranks[rank], 1.0 if rank == 1 else 0) for rank in (1, 3, 0)}
    for rank in (1, 3):
        lines = [line for line in said[rank].splitlines() if "lost rank" in line]
        assert lines == [f"gnn-dist train: error on rank {rank} ({host}): lost rank 2 on host {host}: its connection "
                         f"closed without a word (the process or its host died); the job stops"], said[rank]
    assert "lost rank" not in said[0], said[0]


@pytest.mark.parametrize("how", ["close", "fail"])
def test_a_rank_that_leaves_on_purpose_is_not_reported_lost(tmp_path, cleanup, how):
    """A finished rank (close) and a rank that reports its own error first (fail) say so on their links."""
    ranks = _ranks(3, tmp_path)
    cleanup.extend(ranks)
    assert _tell(ranks[1], how) == "closed"
    ranks[1].wait(timeout=30)
    assert _tell(ranks[0], "probe") == f"unreachable: rank 1 on {socket.gethostname()} (Connection refused)"
    for rank in (0, 2):
        assert "lost rank" not in _stderr_after(ranks[rank], 1.0 if rank == 0 else 0)


def test_two_ranks_report_the_one_peer_once(tmp_path, cleanup):
    """At P = 2 both ring links lead to the same peer: one line, not two."""
    ranks = _ranks(2, tmp_path)
    cleanup.extend(ranks)
    os.kill(ranks[1].pid, signal.SIGKILL)
    ranks[1].wait(timeout=30)
    said = _stderr_after(ranks[0], 1.5)
    assert len([line for line in said.splitlines() if "lost rank 1 on host" in line]) == 1, said
