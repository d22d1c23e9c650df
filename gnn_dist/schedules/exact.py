"""exact: every epoch, every halo row forward and every halo gradient back (gnn_dist.halo.exact's behaviour,
registered as `--schedule exact`)."""
from __future__ import annotations

from gnn_dist.halo.exact import ExactExchange
from gnn_dist.schedules.base import Schedule, register_schedule


@register_schedule
class ExactSchedule(ExactExchange, Schedule):
    kind = "exact"
    form = "exact"

    @classmethod
    def parse(cls, arg, seed):
        return cls() if arg is None else None
