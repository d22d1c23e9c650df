"""Resident memory of a rank: measured per phase, and freed heap pages handed back between phases.

Peak RSS per rank is what users compare runs by, so the figures come from the kernel's own accounting
(/proc/self/statm and the high-water mark behind getrusage), never from
tensor sizes added up.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import threading

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def current_rss_bytes() -> int:
    """This process's resident set size now (0 where /proc is absent)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE_BYTES
    except OSError:
        return 0


class PhasePeaks:
    """Peak resident memory of each phase of a run ("setup", "train", "eval"), without resetting the process's own.

    The process's high-water mark is never reset (clear_refs would make
    /usr/bin/time and every other outside tool report only the last phase).
    Instead:
    - a phase during which the high-water mark rose gets that new mark, exactly;
    - a phase below the earlier mark gets the largest of RSS samples taken by a
      daemon thread (a lower bound that can miss short spikes).
    The phase that sets the run's peak is therefore always exact.

    The sampler starts every phase at `interval_s` and doubles its interval, up
    to `max_interval_s`, while the samples stop rising (back to `interval_s`
    when one rises by more than 1/64: a few pages creep in all the time).
    A short phase is sampled densely; a long steady one (the
    training epochs, whose memory recurs) is not woken a hundred times a
    second (at P=2 on two cores the 10 ms sampler cost about 2-3% of the epoch
    time: median of 9 paired rounds against a 1 s interval).
    """

    def __init__(self, first_phase: str = "setup", interval_s: float = 0.01, max_interval_s: float = 0.32):
        self.peaks: dict[str, int] = {}
        self.phase = first_phase
        self._mark = peak_rss_bytes()  # the high-water mark when the current phase began
        self._sampled = current_rss_bytes()
        self._lock = threading.Lock()  # a sample must not land in the phase after the one it was taken in
        self._stop = threading.Event()
        self._new_phase = threading.Event()  # wakes the sampler at a phase's start, to sample it densely
        self._interval = interval_s
        self._max_interval = max(interval_s, max_interval_s)
        self.samples = 0
        self._thread = threading.Thread(target=self._sample, name="gnn-dist-rss", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        interval = self._interval
        while not self._stop.is_set():
            if self._new_phase.wait(interval):
                self._new_phase.clear()
                interval = self._interval
                continue
            rss = current_rss_bytes()
            with self._lock:
                rose = rss > self._sampled + (self._sampled >> 6)  # by more than 1/64: pages creep up all the time
                self._sampled = max(self._sampled, rss)
                self.samples += 1
            interval = self._interval if rose else min(2 * interval, self._max_interval)

    def _close_phase(self) -> None:
        mark = peak_rss_bytes()
        with self._lock:
            peak = mark if mark > self._mark else max(self._sampled, current_rss_bytes())
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), peak)
        self._mark = mark

    def enter(self, phase: str) -> None:
        """End the current phase and start `phase` (a phase may be entered many times: peaks are the max)."""
        if phase == self.phase:
            return
        self._close_phase()
        self.phase = phase
        with self._lock:
            self._sampled = current_rss_bytes()
        self._new_phase.set()

    def stop(self) -> dict[str, int]:
        """Close the current phase, stop sampling and return {phase: peak bytes}; later calls return the same."""
        if self._stop.is_set():
            return dict(self.peaks)
        self._close_phase()
        self._stop.set()
        self._new_phase.set()
        self._thread.join(timeout=1.0)
        return dict(self.peaks)


def _glibc_function(name: str):
    """A function of glibc's allocator, or None where the C library is not glibc (nothing to tune there)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _glibc_function("malloc_trim")
_MALLOPT = _glibc_function("mallopt")
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 1 << 20


def return_large_blocks_on_free() -> None:
    """Serve every malloc of 1 MiB or more by its own mmap, so freeing it returns it to the OS at once.

    glibc raises its mmap threshold (up to 32 MiB) each time a large block is freed, after which such blocks
    come from the heap and stay resident when freed; a process whose large arrays are allocated and freed
    phase by phase then keeps the largest mix ever seen (benchmarks/results/memory-scaling-synthetic-arxiv.md).
    Torch's own tensors go to the workspace allocator instead (use_workspace), which reuses them.
    """
    if _MALLOPT is not None:
        _MALLOPT(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


ALLOCATOR_ENV = "GNN_DIST_ALLOCATOR"
# The workspace advises blocks of at least one huge page to use transparent huge pages (where the kernel's THP
# setting is "madvise" or "always"); GNN_DIST_HUGEPAGES=0 keeps small pages. On sbm60k GCN 3x256 the epoch
# fell by 4-16% at P=1 and 1-22% at P=2 (benchmarks/results/workspace-hugepages-sbm60k.md), RSS unchanged.
HUGE_PAGES_ENV = "GNN_DIST_HUGEPAGES"
HUGE_PAGE_BYTES = 2 << 20


def use_workspace() -> bool:
    """Serve torch's CPU tensors of 1 MiB or more from the workspace allocator (kernels/workspace_allocator.cpp):
    blocks freed in one epoch serve the next epoch's requests, as they are or resized in place (mremap), so only
    the pages a resize grows by are faulted in and zero-filled, and the mapped total never exceeds the largest
    total ever alive (so peak RSS is what unmapping every block at once gives; tests/test_workspace.py).
    Returns whether it is on: GNN_DIST_ALLOCATOR=system, or no native kernel, keeps malloc with large blocks
    mapped on their own (return_large_blocks_on_free)."""
    return_large_blocks_on_free()
    if os.environ.get(ALLOCATOR_ENV, "workspace") == "system":
        return False
    from gnn_dist.kernels.native import native_module

    native = native_module()
    if native is None:
        return False
    huge = os.environ.get(HUGE_PAGES_ENV, "1") != "0"
    native.install_workspace_allocator(MMAP_THRESHOLD_BYTES, float(os.environ.get("GNN_DIST_WORKSPACE_SLACK", "0")),
                                       HUGE_PAGE_BYTES if huge else 0)
    return True


def workspace_stats() -> dict[str, int]:
    """The workspace allocator's counters (maps, huge_advised, reuses, resizes, unmaps, alive/cached/high-water
    bytes); {} when off."""
    from gnn_dist.kernels.native import native_module

    native = native_module()
    return dict(native.workspace_stats()) if native is not None else {}


def release_free_heap() -> None:
    """Hand the heap's free pages back to the OS (glibc's malloc_trim; a no-op elsewhere).

    The many small tensors and arrays of one phase (sampled blocks, per-step temporaries) come from malloc's
    heap; when they are freed, glibc keeps most of those pages resident for reuse, and the next phase's
    buffers then add to them. Trimming between phases keeps a phase's peak its own
    (benchmarks/results/sampled-memory-synthetic-medium.md). The workspace's cached blocks stay: they are the
    next epoch's tensors, and never take the total above the largest ever alive.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
