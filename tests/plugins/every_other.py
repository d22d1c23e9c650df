"""A schedule added from one file (--plugin tests/plugins/every_other.py --schedule every-other): hidden-layer
halos travel on even epochs only; odd epochs reuse the rows received last and send no gradients back (stale:2
written from scratch, as a user would)."""
from __future__ import annotations

from gnn_dist.halo.blocks import BlockPass
from gnn_dist.schedules import Schedule, register_schedule


@register_schedule
class EveryOtherEpoch(Schedule):
    kind = "every-other"
    form = "every-other"
    name = "every-other"

    def __init__(self):
        self.rows = {}

    @classmethod
    def parse(cls, arg, seed):
        return cls() if arg is None else None

    def _fresh(self, ex, slot) -> bool:
        return ex.epoch % 2 == 0 or slot not in self.rows

    def forward(self, ex, slot, x_owned):
        if self._fresh(ex, slot):
            full = ex.exact_forward(x_owned)
            self.rows[slot] = full[ex.plan.n_owned:].clone()
            return full, True
        full = ex.new_full(x_owned)
        full[ex.plan.n_owned:] = self.rows[slot]
        ex.counters.halo_rows_skipped += ex.plan.rows_sent_to_peers
        return full, False

    def backward(self, ex, slot, grad_full, fresh):
        if fresh:
            return ex.exact_backward(grad_full)
        ex.counters.halo_rows_skipped += ex.plan.n_halo
        return grad_full[:ex.plan.n_owned].clone()

    def block_pass(self, ex, slot, x_owned):
        if self._fresh(ex, slot):
            self.rows[slot] = x_owned.new_empty(ex.plan.n_halo, x_owned.shape[1])
            return _Keep(ex, x_owned, self.rows[slot])
        return _Reuse(ex, x_owned, self.rows[slot])

    def predicted_bytes(self, exact_bytes, exchanged_layers, num_parts):
        return exact_bytes / 2

    def cached_rows(self, n_halo, n_sent):
        return n_halo

    def reset(self):
        self.rows = {}

    def state_dict(self):
        return {f"every-other/{slot}": rows for slot, rows in self.rows.items()}

    def load_state_dict(self, tensors):
        self.rows = {key.split("/", 1)[1]: rows for key, rows in tensors.items()}


class _Keep(BlockPass):
    def __init__(self, ex, x_owned, rows):
        super().__init__(ex, x_owned)
        self.rows = rows

    def in_buffer(self, exchange):
        return self.rows[exchange.block.col_start:exchange.block.col_stop]


class _Reuse(_Keep):
    def out_rows(self, exchange):
        return None

    def in_buffer(self, exchange):
        return None

    def block_rows(self, exchange, received):
        return self.rows[exchange.block.col_start:exchange.block.col_stop]

    def out_gradients(self, exchange, grad_block):
        return None

    def in_gradients(self, exchange, like):
        return None
