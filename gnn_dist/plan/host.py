"""The host's share of a GPU rank's memory plan (gnn_dist.plan.memory plans the device's).

A rank that computes on a GPU keeps on its host what the device does not
hold: the process, the part file, the normalisation terms while the operator
is built, and the pinned buffers its exchanges are staged through. `train
--device cuda` checks this plan against the host and memory_plan's against
the GPU; on CPUs the two are one plan.
"""
from __future__ import annotations

from gnn_dist.comm.staging import GROWTH as STAGING_GROWTH
from gnn_dist.memory.host import PROCESS_BYTES
from gnn_dist.models import model_class
from gnn_dist.partition.format import PartShape
from gnn_dist.plan.liveness import FLOAT, Liveness
from gnn_dist.plan.memory import (
    SETUP_BYTES_PER_ENTRY,
    MemoryPlan,
    largest_blocks,
    parameter_count,
    part_file_bytes,
    plan_part,
)
from gnn_dist.plan.options import PlanConfig
from gnn_dist.plan.traffic import exchanged_widths
from gnn_dist.schedules import parse_schedule


def plan_host(shape: PartShape, config: PlanConfig, num_features: int, num_classes: int) -> MemoryPlan:
    """Predicted peak resident bytes of the host process of the rank that trains this part.

    On CPUs that is plan_part. A GPU rank's host keeps the process, the part file (the device holds copies of
    its arrays), the normalisation terms while the operator is built, and the pinned staging buffers that every
    exchange goes through (gnn_dist.comm.staging: reused by size, kept for the run). The CUDA runtime's own
    host memory is not counted (it has not been measured here); the refusal compares the plan with what is
    still available after the runtime has started, so it is covered there.
    """
    if config.device == "cpu":
        return plan_part(shape, config, num_features, num_classes)
    nnz = shape.entries + (shape.owned if model_class(config.model.model).self_loops else 0)
    base = {"process": PROCESS_BYTES, "part file": part_file_bytes(shape, num_features)}
    setup = Liveness(base)
    setup.alloc("operator terms", nnz * SETUP_BYTES_PER_ENTRY)
    train = Liveness(base)
    train.alloc("pinned staging buffers", staging_pool_bytes(shape, config, num_features, num_classes))
    return max((MemoryPlan(peak=live.peak, phase=phase, parts=live.at_peak)
                for phase, live in (("setup", setup), ("train", train))), key=lambda plan: plan.peak)


def staging_pool_bytes(shape: PartShape, config: PlanConfig, num_features: int, num_classes: int) -> int:
    """The pinned host buffers a GPU rank's exchanges leave in its staging pool (gnn_dist.comm.staging), an upper
    bound. The pool holds as many buffers as were in use at once, each at most GROWTH times the largest
    payload it served: a blocking exchange holds a send and a receive buffer (the input features' at set-up
    are the widest rows), a pipelined schedule every exchanged layer's, both directions, at once (beside the
    set-up pair); the gradient allreduce's flat buffer is counted apart. Payloads are counted in fp32 (int8
    and bf16 halos send fewer bytes)."""
    model = config.model
    widths = model.layers(num_features, num_classes)
    flat = (parameter_count(model, widths) + 2) * FLOAT
    h, S = largest_blocks(shape, config) if config.halo_memory == "sequential" else (shape.halo, shape.sent)
    exchanged = [w for w in exchanged_widths(model, num_features, num_classes) if w]
    if not (h or S) or not exchanged:
        return int(flat * STAGING_GROWTH)
    schedules = parse_schedule(config.schedule).per_layer(len(exchanged))
    if any(s.kind == "pipeline" for s in schedules):
        # the set-up pair (input features) stays in the pool beside the layers' in-flight buffers
        rows = (num_features + 2 * sum(exchanged)) * (S + h)
    else:
        rows = max(num_features, *exchanged) * (S + h)
    return int((rows * FLOAT + flat) * STAGING_GROWTH)
