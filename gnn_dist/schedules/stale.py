"""stale:R: DistGNN-style delayed halos (see gnn_dist.schedules)."""
from __future__ import annotations

from dataclasses import dataclass, field

from gnn_dist.schedules.base import Schedule, register_schedule
from gnn_dist.schedules.exact import ExactSchedule


@register_schedule
@dataclass
class StaleSchedule(Schedule):
    refresh_every: int
    cache: dict = field(default_factory=dict)
    kind = "stale"
    form = "stale:R (R >= 1)"
    runs_with_sequential_halos = True

    @classmethod
    def parse(cls, arg, seed):
        refresh = int(arg or "")
        if refresh < 1:
            return None
        return ExactSchedule() if refresh == 1 else cls(refresh)

    def predicted_bytes(self, exact_bytes, exchanged_layers, num_parts):
        return exact_bytes / self.refresh_every  # averaged over the R epochs of a refresh cycle

    def cached_rows(self, n_halo, n_sent):
        return n_halo

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"stale:{self.refresh_every}"

    def forward(self, ex, slot, x_owned):
        plan = ex.plan
        refresh = ex.epoch % self.refresh_every == 0 or slot not in self.cache
        if refresh:
            full = ex.exact_forward(x_owned)
            self.cache[slot] = full[plan.n_owned:].clone()
            return full, True
        full = ex.new_full(x_owned)
        full[plan.n_owned:] = self.cache[slot]
        ex.counters.halo_rows_skipped += plan.rows_sent_to_peers
        return full, False

    def backward(self, ex, slot, grad_full, refreshed):
        if refreshed:
            return ex.exact_backward(grad_full)
        ex.counters.halo_rows_skipped += ex.plan.n_halo
        return grad_full[:ex.plan.n_owned].clone()

    def state_dict(self):
        return {f"stale/{slot}": t for slot, t in self.cache.items()}

    def load_state_dict(self, tensors):
        self.cache = {key.split("/", 1)[1]: t for key, t in tensors.items()}
