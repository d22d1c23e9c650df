"""The `Schedule` protocol and the schedule registry behind `--schedule SPEC`.

A schedule decides, per layer (slot) and training epoch, what the forward and
backward of a hidden layer's halo exchange send. The halo exchanger
(gnn_dist.halo.exchange.HaloExchanger, `ex` below) calls it; a schedule talks to the
wire only through `ex` (exact_forward / exact_backward, send_rows, send_flags,
new_full, buffer) and counts rows it does not send in `ex.counters.halo_rows_skipped`.

    forward(ex, slot, x_owned) -> (full, info)
        full: [n_owned + n_halo, width], the owned rows then the halo rows this
        epoch aggregates; info: anything backward needs (passed back unchanged).
    backward(ex, slot, grad_full, info) -> grad_owned
        grad_full: the gradient of `full`; returns [n_owned, width], the owned
        rows' gradient with what the halo's owners sent back added in.
    block_pass(ex, slot, x_owned)    a BlockPass (gnn_dist.halo.blocks): what each halo block of slot carries
                                     this pass with --halo-memory sequential, and what it is aggregated with.
                                     A schedule without one is refused with sequential halos.
    reweights_rows                   whether the schedule may leave halo rows out of an aggregation and reweight
                                     each row over what it still has (bns, adaptive): the layer then adds its
                                     bias after aggregation_scale's factor.
    aggregation_scale(ex, slot, operator)
                                     a factor per owned row that the layer multiplies this pass's aggregation by
                                     (before its bias), or None; asked after slot's exchange, so a schedule may
                                     decide there what is left out (gnn_dist.schedules.renormalise: each row's
                                     entries still present reweighted to the whole row's weight). operator: the
                                     layer's SparseOperator (resident halos) or BlockedOperator (sequential).
                                     Only layers in ex.renormalising_slots ask (linear aggregations; an attention
                                     layer's softmax cannot be reweighted after the fact), so a schedule leaves
                                     rows absent only there.
    drain(ex)                        complete every transfer still in flight (end of training, checkpoints).
    reset()                          forget every cache: the next epoch starts afresh, as epoch 0 does
                                     (after the divergence guard's exact epochs).
    state_dict() / load_state_dict(d)  the caches a checkpoint keeps to resume exactly (tensors by name).
    predicted_bytes(exact_bytes, exchanged_layers, num_parts)
                                     training halo bytes per epoch given the exact schedule's (inspect).
    cached_rows(n_halo, n_sent)      rows per exchanged width kept between epochs (the memory plan), for a layer
                                     in ex.renormalising_slots.
    cached_rows_under_attention(n_halo, n_sent)
                                     the same for an attention layer, which cannot leave rows absent (default:
                                     cached_rows; adaptive keeps the rows it last received there).
    state_bytes(n_owned, n_halo, n_sent)  bytes kept beside those rows, whatever the width (the memory plan).
    measures_parameter_drift         whether forward reads ex.shaping_parameters[slot] (the model fills it
                                     in training with dropout on: the parameters that shape the slot's rows).
    per_layer(n) / for_slot(slot)    the schedule of each of n exchanged layers / of one slot: this one,
                                     except under a per-layer SPEC (gnn_dist.schedules.layered).

A schedule file registers its class with `@register_schedule`; the class
names its `kind` (the SPEC before the first colon), its `form` (for error
messages) and a `parse(arg, seed)` classmethod that returns the schedule for
`kind:arg` (arg None when SPEC has no colon), or None when arg is not valid.
Evaluation always uses the exact exchange.
"""
from __future__ import annotations

from typing import ClassVar

import torch

SCHEDULES: dict[str, type] = {}  # kind -> class (parse a SPEC with gnn_dist.schedules.spec)


class Schedule:
    kind: ClassVar[str] = ""
    form: ClassVar[str] = ""
    # Whether forward wants ex.shaping_parameters[slot]: a flat copy of the parameters that shape the rows.
    measures_parameter_drift: ClassVar[bool] = False
    # Whether aggregation_scale may return factors (the layer then adds its bias after them).
    reweights_rows: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.kind

    @classmethod
    def parse(cls, arg: str | None, seed: int) -> Schedule | None:
        raise NotImplementedError

    def forward(self, ex, slot: str, x_owned: torch.Tensor):
        raise NotImplementedError

    def backward(self, ex, slot: str, grad_full: torch.Tensor, info):
        raise NotImplementedError

    def block_pass(self, ex, slot: str, x_owned: torch.Tensor):
        """What slot's halo blocks carry in this pass with sequential halos (gnn_dist.halo.blocks.BlockPass)."""
        raise NotImplementedError

    @property
    def runs_with_sequential_halos(self) -> bool:
        """Whether --halo-memory sequential can run it (it defines block_pass)."""
        return type(self).block_pass is not Schedule.block_pass

    def aggregation_scale(self, ex, slot: str, operator) -> torch.Tensor | None:
        """A factor per owned row for this pass's aggregation (before the bias), or None: rows as aggregated."""
        return None

    def drain(self, ex) -> None:
        """Complete anything still in flight."""

    def reset(self) -> None:
        """Forget every cache, so the next epoch starts as epoch 0 does."""

    def state_dict(self) -> dict:
        """Caches a checkpoint must keep to resume this schedule exactly."""
        return {}

    def load_state_dict(self, tensors: dict) -> None:
        if tensors:
            raise ValueError(f"schedule {self.name} has no state to restore")

    def predicted_bytes(self, exact_bytes: float, exchanged_layers: int, num_parts: int) -> float:
        """Training halo bytes per epoch, from what the exact schedule sends (exact_bytes)."""
        return exact_bytes

    def cached_rows(self, n_halo: int, n_sent: int) -> int:
        """Rows of every exchanged width this schedule keeps between epochs."""
        return 0

    def cached_rows_under_attention(self, n_halo: int, n_sent: int) -> int:
        """cached_rows for an attention layer (its softmax cannot have rows left absent)."""
        return self.cached_rows(n_halo, n_sent)

    def state_bytes(self, n_owned: int, n_halo: int, n_sent: int) -> int:
        """Bytes this schedule keeps while an epoch runs beside its cached rows, shared by its layers."""
        return 0

    def per_layer(self, exchanged_layers: int) -> list[Schedule]:
        """The schedule of each exchanged layer, first exchanged layer first."""
        return [self] * exchanged_layers

    def for_slot(self, slot: str) -> Schedule:
        return self


def layer_slot(layer: int) -> str:
    """The exchange slot of the model's layer `layer` (counted from 0; layer 0 exchanges nothing: its halo
    inputs are the cached features)."""
    return f"layer{layer}"


def register_schedule(schedule_class: type) -> type:
    """Class decorator: make schedule_class available as --schedule schedule_class.kind[:ARG]."""
    kind = schedule_class.kind
    if not kind or ":" in kind:
        raise ValueError(f"{schedule_class.__name__} needs a class attribute `kind` without a colon")
    if kind in SCHEDULES and SCHEDULES[kind] is not schedule_class:
        raise ValueError(f"--schedule {kind} is registered twice")
    SCHEDULES[kind] = schedule_class
    return schedule_class


def schedule_forms() -> str:
    return ", ".join(cls.form for cls in SCHEDULES.values())
