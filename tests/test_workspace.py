"""The workspace allocator (kernels/workspace_allocator.cpp, gnn_dist.memory.rss.use_workspace), held to what it
promises: it never holds more than the largest total ever alive (counted here from the test's own tensor
sizes), tensors keep what is written to them, and against malloc with one mapping per large block
(GNN_DIST_ALLOCATOR=system, the reference) a process's peak RSS is no higher and its steady state faults in
far fewer pages.

Each check runs in its own process: installing an allocator is for the life of a process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gnn_dist.kernels.native import native_module

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(native_module() is None, reason="the native kernels (and the workspace) did not build")

# "Epochs" whose phases allocate different sizes, as a forward, a backward and an evaluation do: the forward's
# blocks are freed before the backward's are taken, so the backward's must come from resized cached blocks or
# new mappings. Sizes in float32 elements, all above the 1 MiB threshold.
PATTERN = r"""
import json, resource, sys
import torch
from gnn_dist.kernels.native import native_module
from gnn_dist.memory.rss import use_workspace, workspace_stats

native_module()  # loaded in both modes, so the reference's RSS holds the module's pages too
PAGE = 4096
PHASES = [[750_000, 1_250_000, 2_000_000, 500_000], [2_600_000, 400_000, 1_100_000], [3_500_000, 900_000]]
on = use_workspace()
report = {"on": on, "steps": [], "mismatches": 0, "faults": []}
highest = alive_bytes = 0
for epoch in range(int(sys.argv[1])):
    report["faults"].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
    for phase, sizes in enumerate(PHASES):
        held = []
        for index, count in enumerate(sizes):
            tensor = torch.empty(count, dtype=torch.float32)
            tensor.fill_(epoch * 100 + phase * 10 + index)
            held.append(tensor)
            alive_bytes += -(-count * 4 // PAGE) * PAGE
            highest = max(highest, alive_bytes)
            if on:
                stats = workspace_stats()
                report["steps"].append([epoch, stats["maps"], stats["alive_bytes"] + stats["cached_bytes"], highest])
        for index, tensor in enumerate(held):  # min and max: no temporary as large as the tensor
            expected = epoch * 100 + phase * 10 + index
            report["mismatches"] += int(tensor.min() != expected or tensor.max() != expected)
        alive_bytes -= sum(-(-t.numel() * 4 // PAGE) * PAGE for t in held)
        del held, tensor
report["faults"].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
report["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(report))
"""


def _run(epochs: int, allocator: str, slack: float = 0.0) -> dict:
    env = {**os.environ, "GNN_DIST_ALLOCATOR": allocator, "OMP_NUM_THREADS": "1", "GNN_DIST_WORKSPACE_SLACK": str(slack),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", PATTERN, str(epochs)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _faults_per_epoch(report: dict) -> list[int]:
    return [after - before for before, after in zip(report["faults"], report["faults"][1:])]


def test_the_workspace_never_holds_more_than_the_most_ever_alive():
    report = _run(4, "workspace")
    assert report["on"] and report["mismatches"] == 0
    for epoch, _, held, most_alive in report["steps"]:
        assert held <= most_alive, (epoch, held, most_alive)


def test_the_steady_state_faults_in_less_than_half_of_what_malloc_does_at_no_more_rss():
    """malloc with one mapping per large block faults in every block every epoch (12.7k pages an epoch here);
    the workspace faults in only what its resized blocks grow by."""
    workspace, system = _run(5, "workspace"), _run(5, "system")
    assert workspace["on"] and not system["on"]
    assert workspace["mismatches"] == 0 and system["mismatches"] == 0
    steady, reference = max(_faults_per_epoch(workspace)[2:]), min(_faults_per_epoch(system)[2:])
    assert steady <= 0.5 * reference, (_faults_per_epoch(workspace), _faults_per_epoch(system))
    # the phases peak at 18 MB alive; 1 MiB for the allocator's own bookkeeping
    assert workspace["peak_rss_kib"] <= system["peak_rss_kib"] + 1024, (workspace["peak_rss_kib"],
                                                                        system["peak_rss_kib"])


def test_with_slack_for_every_size_the_steady_state_maps_and_faults_in_nothing():
    """GNN_DIST_WORKSPACE_SLACK=s lets the cache hold (1 + s) x the most ever alive. With room for a block of its
    own, a size missing from the cache is mapped rather than taken from another size's cached block (which that
    size would then miss in turn), so once every size has its blocks an epoch maps, resizes and faults in
    nothing. The phases' nine sizes total 2.9x the most alive at once: slack 2 holds them all."""
    report = _run(5, "workspace", slack=2.0)
    assert report["on"] and report["mismatches"] == 0
    for epoch, _, held, most_alive in report["steps"]:
        assert held <= 3.0 * most_alive, (epoch, held, most_alive)
    maps_by_epoch = {epoch: maps for epoch, maps, _, _ in report["steps"]}  # the count after each epoch's last step
    assert maps_by_epoch[1] == maps_by_epoch[4], maps_by_epoch  # no mapping after the first epoch
    system = _run(5, "system")
    steady, reference = max(_faults_per_epoch(report)[2:]), min(_faults_per_epoch(system)[2:])
    assert steady <= 0.02 * reference, (_faults_per_epoch(report), _faults_per_epoch(system))


HUGE_PAGE_PROBE = r"""
import json, sys
import torch
from gnn_dist.memory.rss import use_workspace, workspace_stats

assert use_workspace()
tensors = {"large": torch.empty(3 << 20, dtype=torch.float32), "small": torch.empty(300_000, dtype=torch.float32)}
flags = {}
for name, tensor in tensors.items():
    tensor.fill_(1.0)
    address, lines = tensor.data_ptr(), open("/proc/self/smaps").read().splitlines()
    for at, line in enumerate(lines):  # a VMA's header "start-end perms ...", then its fields, VmFlags among them
        span = line.split(" ", 1)[0]
        if "-" in span and all(c in "0123456789abcdef-" for c in span):
            start, end = (int(v, 16) for v in span.split("-"))
            if start <= address < end:
                vm_flags = next(l for l in lines[at + 1:] if l.startswith("VmFlags:"))
                flags[name] = vm_flags.split()[1:]
                break
print(json.dumps({"flags": flags, "huge_advised": workspace_stats()["huge_advised"]}))
"""


@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists(),
                    reason="this kernel has no transparent huge pages")
@pytest.mark.parametrize("setting", ["default", "0"])
def test_blocks_of_a_huge_page_or_more_are_advised_to_use_huge_pages_unless_turned_off(setting):
    """The kernel's own view (the VMA's VmFlags in /proc/self/smaps: "hg" is MADV_HUGEPAGE): a 12 MiB tensor's
    block is advised by default and not under GNN_DIST_HUGEPAGES=0; a 1.2 MiB one (below 2 MiB) never is."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("GNN_DIST_HUGEPAGES", None)
    if setting != "default":
        env["GNN_DIST_HUGEPAGES"] = setting
    done = subprocess.run([sys.executable, "-c", HUGE_PAGE_PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert "hg" not in report["flags"]["small"], report
    if setting == "default":
        assert "hg" in report["flags"]["large"] and report["huge_advised"] >= 1, report
    else:
        assert "hg" not in report["flags"]["large"] and report["huge_advised"] == 0, report


def test_the_heap_is_trimmed_when_the_phase_changes_and_never_between_epochs_of_one_phase(monkeypatch):
    """enter_phase hands the heap's free pages back on a change of phase only: an epoch of the same phase
    allocates again what the last one freed, so a trim there only makes it fault the pages in anew."""
    from types import SimpleNamespace

    from gnn_dist.memory.rss import PhasePeaks
    from gnn_dist.training import loop

    trims = []
    monkeypatch.setattr(loop, "release_free_heap", lambda: trims.append(1))
    memory = PhasePeaks("setup", interval_s=0.05)
    try:
        state = SimpleNamespace(memory=memory)
        for phase, total in [("train", 1), ("train", 1), ("train", 1), ("eval", 2), ("train", 3), ("train", 3)]:
            loop.enter_phase(state, phase)
            assert (memory.phase, len(trims)) == (phase, total)
    finally:
        memory.stop()
