"""A --schedule SPEC -> the schedule it names: one registered kind, or one per exchanged layer, comma-separated
(gnn_dist.schedules.layered)."""
from __future__ import annotations

from gnn_dist.schedules.base import SCHEDULES, Schedule, schedule_forms
from gnn_dist.schedules.layered import LayeredSchedule


def schedule_for_model(spec: str, seed: int, exchanged_layers: int) -> Schedule:
    """The schedule a model with `exchanged_layers` exchanged layers runs: parse_schedule's, with a rule whose
    layers differ (plain `pipeline` keeps its last exchanged layer exact) spelled out one schedule per layer."""
    schedule = parse_schedule(spec, seed)
    layers = schedule.per_layer(exchanged_layers)
    if all(layer is schedule for layer in layers):
        return schedule
    return LayeredSchedule(layers)


def parse_schedule(spec: str, seed: int = 0) -> Schedule:
    """The schedule named by a --schedule SPEC; a bad SPEC raises ValueError listing the valid forms.

    A SPEC with commas names one schedule per exchanged layer (gnn_dist.schedules.layered)."""
    if "," in spec:
        return LayeredSchedule([parse_schedule(entry.strip(), seed) for entry in spec.split(",")])
    kind, colon, arg = spec.partition(":")
    schedule = None
    if kind in SCHEDULES:
        try:
            schedule = SCHEDULES[kind].parse(arg if colon else None, seed)
        except ValueError:
            schedule = None
    if schedule is None:
        raise ValueError(f"bad --schedule {spec!r}: valid forms: {schedule_forms()}, or one of them per exchanged "
                         f"layer, comma-separated")
    return schedule
