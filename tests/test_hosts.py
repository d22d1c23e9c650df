"""gnn_dist.comm.hosts: the hosts file, the probe, and where a shrinking supervisor puts its ranks."""
from __future__ import annotations

import pytest

from gnn_dist.comm.hosts import (
    Host,
    answering,
    hydra_hosts,
    largest_that_fits,
    open_mpi_hostfile,
    parse_parts_for,
    place,
    read_hosts_file,
)


def test_the_hosts_file_reads_mpich_and_open_mpi_lines(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the rack\nnode01:4\nnode02 slots=2   # the small one\n\nnode03\n")
    assert read_hosts_file(path) == [Host("node01", 4), Host("node02", 2), Host("node03", 1)]


@pytest.mark.parametrize("text, message", [
    ("node01\nnode 02\n", "line 2: 'node 02' is not HOST"),
    ("node01:0\n", "node01 has 0 slots"),
    ("node01:2\nnode01:2\n", "node01 is listed twice"),
    ("# nothing\n", "lists no host"),
])
def test_a_bad_hosts_file_names_its_line(tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_hosts_file(path)


def test_parts_for_maps_rank_counts_to_directories():
    assert parse_parts_for("4:/p/four, 2:rel/two") == {4: "/p/four", 2: "rel/two"}
    for bad in ("4", "x:dir", "0:dir", "4:", "4:a,4:b"):
        with pytest.raises(ValueError, match="--parts-for"):
            parse_parts_for(bad)


def test_the_largest_partition_that_fits_and_its_placement():
    parts_for = {8: "p8", 4: "p4", 2: "p2"}
    assert largest_that_fits(parts_for, 7) == 4 and largest_that_fits(parts_for, 8) == 8
    assert largest_that_fits(parts_for, 1) is None
    placed = place([Host("a", 3), Host("b", 3)], 4)
    assert placed == [("a", 3), ("b", 1)]
    assert hydra_hosts(placed) == "a:3,b:1" and open_mpi_hostfile(placed) == "a slots=3\nb slots=1\n"
    with pytest.raises(ValueError, match="do not fit"):
        place([Host("a", 1)], 2)


def test_the_probe_tells_answering_hosts_from_silent_ones(tmp_path):
    (tmp_path / "b").touch()
    hosts = [Host("a", 1), Host("b", 2), Host("c", 1)]
    probe = f"sh -c 'test ! -e {tmp_path}/{{host}} || {{ echo {{host}} is down >&2; exit 3; }}'"
    alive, silent = answering(hosts, probe)
    assert alive == [Host("a", 1), Host("c", 1)]
    assert silent == ["b (exit status 3: b is down)"]
    alive, silent = answering([Host("a", 1)], "sleep 5", timeout=0.5)
    assert alive == [] and silent == ["a (no answer in 0.5 s)"]
    alive, silent = answering([Host("a", 1)], "no-such-probe-command {host}")
    assert alive == [] and "no-such-probe-command" in silent[0]
