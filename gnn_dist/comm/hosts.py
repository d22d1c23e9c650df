"""The hosts a supervised job may run on (`gnn-dist supervise --hosts-file F --parts-for P:DIR,...`): which of
them still answer, the largest rank count with a partition that fits them, and where its ranks go.

A hosts file lists one host a line, as `HOST`, `HOST:SLOTS` (MPICH) or `HOST slots=SLOTS` (Open MPI); blank
lines and `#` comments are skipped; a host without a count has one slot. A host "answers" when the probe
command (by default a non-interactive ssh running `true`) exits 0 within its timeout.
"""
from __future__ import annotations

import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PROBE = "ssh -o BatchMode=yes -o ConnectTimeout=5 {host} true"
PROBE_TIMEOUT_S = 20.0
_LINE = re.compile(r"^(?P<host>[A-Za-z0-9._-]+)(?::(?P<colon>\d+)|\s+slots\s*=\s*(?P<slots>\d+))?$")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def read_hosts_file(path: str | Path) -> list[Host]:
    """The hosts in file order; ValueError naming the line that is not HOST, HOST:SLOTS or HOST slots=N."""
    hosts: list[Host] = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"{path} line {number}: {line!r} is not HOST, HOST:SLOTS or HOST slots=N")
        slots = int(match["colon"] or match["slots"] or 1)
        if slots < 1:
            raise ValueError(f"{path} line {number}: {match['host']} has {slots} slots; give 1 or more")
        if any(host.name == match["host"] for host in hosts):
            raise ValueError(f"{path} line {number}: {match['host']} is listed twice; give its slots once")
        hosts.append(Host(match["host"], slots))
    if not hosts:
        raise ValueError(f"{path} lists no host")
    return hosts


def parse_parts_for(text: str) -> dict[int, str]:
    """'4:DIR4,2:DIR2' -> {4: 'DIR4', 2: 'DIR2'}; ValueError naming the item that is not P:DIR."""
    parts_for: dict[int, str] = {}
    for item in text.split(","):
        count, sep, directory = item.strip().partition(":")
        if not sep or not count.isdigit() or int(count) < 1 or not directory:
            raise ValueError(f"--parts-for: {item.strip()!r} is not P:DIR (e.g. 4:parts4,2:parts2)")
        if int(count) in parts_for:
            raise ValueError(f"--parts-for: {count} ranks are given two partitions")
        parts_for[int(count)] = directory
    return parts_for


def answering(hosts: list[Host], probe: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[list[Host], list[str]]:
    """(the hosts whose probe succeeded, in file order; 'HOST (why not)' for each of the others). Probes run
    at once, so a host that does not answer costs one timeout, not one per host."""
    def why_not(host: Host) -> str | None:
        command = shlex.split(probe.replace("{host}", host.name))  # not format(): a shell probe may hold braces
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"{host.name} (no answer in {timeout:g} s)"
        except OSError as err:
            return f"{host.name} ({command[0]}: {err.strerror or err})"
        if done.returncode == 0:
            return None
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return f"{host.name} (exit status {done.returncode}{': ' + said[-1] if said else ''})"

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        verdicts = list(pool.map(why_not, hosts))
    return [h for h, v in zip(hosts, verdicts) if v is None], [v for v in verdicts if v is not None]


def largest_that_fits(parts_for: dict[int, str], slots: int) -> int | None:
    """The largest rank count with a partition that the given number of slots holds (None: none does)."""
    fitting = [count for count in parts_for if count <= slots]
    return max(fitting) if fitting else None


def place(hosts: list[Host], num_ranks: int) -> list[tuple[str, int]]:
    """Ranks onto hosts in file order, each host filled to its slots before the next: [(host, ranks), ...]."""
    placed, left = [], num_ranks
    for host in hosts:
        if left == 0:
            break
        take = min(host.slots, left)
        placed.append((host.name, take))
        left -= take
    if left:
        raise ValueError(f"{num_ranks} ranks do not fit the {sum(h.slots for h in hosts)} slots given")
    return placed


def hydra_hosts(placed: list[tuple[str, int]]) -> str:
    """MPICH's `-hosts` value: 'h0:2,h1:2'."""
    return ",".join(f"{host}:{count}" for host, count in placed)


def open_mpi_hostfile(placed: list[tuple[str, int]]) -> str:
    """An Open MPI hostfile's text ('h0 slots=2' a line; MPICH's -hosts takes hydra_hosts instead)."""
    return "".join(f"{host} slots={count}\n" for host, count in placed)
