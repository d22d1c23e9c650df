"""stale:R: delayed halos, refreshed every R epochs, as the DistGNN paper (Md et al., SC21) delays remote aggregates
(see gnn_dist.schedules)."""
from __future__ import annotations

from dataclasses import dataclass, field

from gnn_dist.halo.blocks import BlockPass
from gnn_dist.schedules.base import Schedule, register_schedule
from gnn_dist.schedules.exact import ExactSchedule


@register_schedule
@dataclass
class StaleSchedule(Schedule):
    refresh_every: int
    cache: dict = field(default_factory=dict)
    kind = "stale"
    form = "stale:R (R >= 1)"

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

    def block_pass(self, ex, slot, x_owned):
        if ex.epoch % self.refresh_every == 0 or slot not in self.cache:
            self.cache[slot] = x_owned.new_empty(ex.plan.n_halo, x_owned.shape[1])
            return _RefreshBlocks(ex, x_owned, self.cache[slot])
        plan = ex.plan
        ex.counters.halo_rows_skipped += plan.rows_sent_to_peers + plan.n_halo
        return _CachedBlocks(ex, x_owned, self.cache[slot])

    def reset(self):
        self.cache = {}

    def state_dict(self):
        return {f"stale/{slot}": t for slot, t in self.cache.items()}

    def load_state_dict(self, tensors):
        self.cache = {key.split("/", 1)[1]: t for key, t in tensors.items()}


class _RefreshBlocks(BlockPass):
    """A refresh epoch with sequential halos: the exact exchange, each block also kept in the cache."""

    def __init__(self, ex, x_owned, cache):
        super().__init__(ex, x_owned)
        self.cache = cache

    def in_buffer(self, exchange):
        return self.cache[exchange.block.col_start:exchange.block.col_stop]


class _CachedBlocks(BlockPass):
    """Between refreshes: every block from the cache, nothing travels either way (the halo rows are constants)."""

    def __init__(self, ex, x_owned, cache):
        super().__init__(ex, x_owned)
        self.cache = cache

    def out_rows(self, exchange):
        return None

    def in_buffer(self, exchange):
        return None

    def block_rows(self, exchange, received):
        return self.cache[exchange.block.col_start:exchange.block.col_stop]

    def out_gradients(self, exchange, grad_block):
        return None

    def in_gradients(self, exchange, like):
        return None
