"""The wrapped forward in progress on this thread: which part it runs on, its step, and its calls so far.

PyG's layers call module-level functions (gcn_norm, F.dropout) that gnn-dist replaces once for the process
(gnn_dist.pyg.gcn_norm, gnn_dist.pyg.dropout); the replacements act only inside a wrapped forward and read
what they need here. It is thread-local because simulated ranks are threads of one process, each running its
own rank's forward at the same time.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import torch

_local = threading.local()


@dataclass
class Pass:
    """One forward of a distributed model on one rank."""

    graph: object           # the gnn_dist.pyg.part_data.PartGraph of the rank
    seed: int               # dropout's seed (the same on every rank)
    step: int               # training forwards before this one (keys dropout masks and schedules)
    training: bool
    dropout_calls: int = 0  # dropout calls so far in this pass: each draws its own mask
    propagate_calls: dict = field(default_factory=dict)  # module name -> propagates so far (exchange slots)
    # modules running on [owned | halo] inputs that gnn-dist supplied without an exchange (data.x's cached rows)
    full_input: set = field(default_factory=set)
    # the local edge_index of the propagate or edge update running now, for dropout on per-edge tensors
    # (attention coefficients); None outside message passing
    edges: torch.Tensor | None = None


    def call_suffix(self, name: str) -> str:
        """Counts a call of `name` (a layer's propagate, or with_halo) in this pass and returns what tells its
        exchange slots from an earlier call's ("" for the first, " #k" after: APPNP's hops). Slots are the
        same on every rank and every step, so schedules keep their per-slot state."""
        calls = self.propagate_calls.get(name, 0)
        self.propagate_calls[name] = calls + 1
        return f" #{calls}" if calls else ""


def current() -> Pass | None:
    """The wrapped forward running on this thread, or None."""
    return getattr(_local, "active", None)


@contextlib.contextmanager
def _on_this_thread(name: str, active):
    """`active` as this thread's `name` for the block, the outer one restored after (forwards nest)."""
    outer = getattr(_local, name, None)
    setattr(_local, name, active)
    try:
        yield active
    finally:
        setattr(_local, name, outer)


def running(active: Pass):
    return _on_this_thread("active", active)


@dataclass
class BatchPass:
    """One forward of a model distributed without data, on one rank's mini-batch."""

    seed: int
    step: int
    rank: int
    dropout_calls: int = 0


def in_batches() -> BatchPass | None:
    """The forward of a model distributed without data (on mini-batches) running on this thread, or None."""
    return getattr(_local, "batches", None)


def running_batches(active: BatchPass):
    return _on_this_thread("batches", active)


def last_context(ctx=None):
    """The RankContext this thread initialised or loaded a part with last (gd.all_reduce's communicator)."""
    if ctx is not None:
        _local.ctx = ctx
    return getattr(_local, "ctx", None)


def last_loaded(graph=None):
    """The part this thread loaded last (gd.with_halo outside a forward); with graph, records it."""
    if graph is not None:
        _local.loaded = graph
        _local.ctx = graph.ctx
    return getattr(_local, "loaded", None)
