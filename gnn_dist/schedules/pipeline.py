"""pipeline[:G[:H]]: PipeGCN, halo rows and halo gradients one epoch late, in flight while compute runs.

Stale values are smoothed as PipeGCN-GF does, v <- G v + (1 - G) v_new: halo rows with G, halo gradients
with H. `pipeline:G` smooths both with G (PipeGCN-GF's one decay rate), `pipeline:0` is plain PipeGCN, and
plain `pipeline` is the default rule: rows and gradients smoothed with DEFAULT_ROWS and DEFAULT_GRADIENTS
below on every exchanged layer but the last, whose rows (the class scores, as narrow as the classes) travel
exactly. A model with one exchanged layer (two layers) pipelines it. Why that rule, measured on every graph of
the schedule battery: docs/schedules.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gnn_dist.halo.blocks import BlockPass
from gnn_dist.schedules.base import Schedule, register_schedule
from gnn_dist.schedules.exact import ExactSchedule

# The default rule: PipeGCN-GF's own decay rate, 0.95, for rows and gradients alike, and the last exchanged
# layer exact (benchmarks/results/schedules-battery.md has the battery it holds on).
DEFAULT_ROWS = 0.95
DEFAULT_GRADIENTS = 0.95


@dataclass
class _PipeState:
    """One layer's pipeline: what this epoch uses, and what is in flight for the next."""

    halo: torch.Tensor | None = None          # halo rows used this epoch (smoothed)
    grads: torch.Tensor | None = None         # gradients of our sent rows, used this epoch (smoothed)
    recv_halo: torch.Tensor | None = None     # this epoch's halo rows, arriving
    recv_grads: torch.Tensor | None = None    # this epoch's returned gradients, arriving
    send_halo: torch.Tensor | None = None     # this epoch's sent rows, kept until their transfer completes
    send_grads: torch.Tensor | None = None    # this epoch's halo gradients, likewise
    # transfers in flight (waiting is idempotent: they stay listed until their values are taken in)
    pending_halo: list = field(default_factory=list)
    pending_grads: list = field(default_factory=list)


def _complete(pending: list) -> None:
    for transfer in pending:
        transfer.wait()


@dataclass
@register_schedule
class PipelineSchedule(Schedule):
    rows_smoothing: float = DEFAULT_ROWS
    grads_smoothing: float | None = None  # None: as the rows (pipeline:G smooths both with G)
    # Plain `pipeline`: the last exchanged layer exchanges exactly. Its rows are the class scores, which a stale
    # boundary perturbs straight into the loss; they are the narrowest rows, so exactness there costs little.
    exact_last_layer: bool = False
    states: dict = field(default_factory=dict)
    kind = "pipeline"
    form = ("pipeline (G = H = 0.95, the last exchanged layer exact), pipeline:G (0 <= G < 1: rows and gradients, "
            "every layer), pipeline:G:H (rows G, gradients H)")

    def __post_init__(self):
        if self.grads_smoothing is None:
            self.grads_smoothing = self.rows_smoothing

    @classmethod
    def parse(cls, arg, seed):
        if not arg:
            return cls(DEFAULT_ROWS, DEFAULT_GRADIENTS, exact_last_layer=True)
        rows_text, _, grads_text = arg.partition(":")
        rows = float(rows_text)
        grads = float(grads_text) if grads_text else rows
        return cls(rows, grads) if 0.0 <= rows < 1.0 and 0.0 <= grads < 1.0 else None

    def cached_rows(self, n_halo, n_sent):
        # halo rows in use, arriving, and gradients sent back; gradients in use, arriving, and rows sent
        return 3 * n_halo + 3 * n_sent

    def per_layer(self, exchanged_layers):
        if self.exact_last_layer and exchanged_layers >= 2:
            every_layer = PipelineSchedule(self.rows_smoothing, self.grads_smoothing)
            return [every_layer] * (exchanged_layers - 1) + [ExactSchedule()]
        return [self] * exchanged_layers

    @property
    def name(self) -> str:  # type: ignore[override]
        if self.exact_last_layer:
            return "pipeline"
        if self.rows_smoothing == self.grads_smoothing:
            return f"pipeline:{self.rows_smoothing:g}"
        return f"pipeline:{self.rows_smoothing:g}:{self.grads_smoothing:g}"

    @staticmethod
    def _smooth(old: torch.Tensor, new: torch.Tensor, gamma: float) -> None:
        if gamma == 0:
            old.copy_(new)
        else:
            old.mul_(gamma).add_(new, alpha=1 - gamma)

    def _arrived_rows(self, state: _PipeState) -> None:
        """Take in last epoch's rows, once they have arrived."""
        if state.pending_halo:
            _complete(state.pending_halo)
            state.pending_halo.clear()
            self._smooth(state.halo, state.recv_halo, self.rows_smoothing)

    def _arrived_grads(self, state: _PipeState) -> None:
        if state.pending_grads:
            _complete(state.pending_grads)
            state.pending_grads.clear()
            self._smooth(state.grads, state.recv_grads, self.grads_smoothing)

    def forward(self, ex, slot, x_owned):
        plan = ex.plan
        state = self.states.setdefault(slot, _PipeState())
        if state.halo is None:  # epoch 0: nothing stale to use yet
            full = ex.exact_forward(x_owned)
            state.halo = full[plan.n_owned:].clone()
            return full, True
        self._arrived_rows(state)
        full = ex.new_full(x_owned)
        full[plan.n_owned:] = state.halo
        # This epoch's rows travel while this and the next epoch compute.
        state.send_halo = x_owned.index_select(0, plan.send_idx)
        state.recv_halo = x_owned.new_empty(plan.n_halo, x_owned.shape[1])
        state.pending_halo.append(ex.send_rows(state.send_halo, plan.send_counts, state.recv_halo,
                                               plan.recv_counts, blocking=False))
        return full, False

    def backward(self, ex, slot, grad_full, warmup):
        plan = ex.plan
        state = self.states[slot]
        if warmup:
            returned = ex.buffer(("grad_recv",), plan.rows_sent, grad_full.shape[1])
            ex.send_rows(grad_full[plan.n_owned:], plan.recv_counts, returned, plan.send_counts)
            state.grads = returned.clone()
        else:
            self._arrived_grads(state)
            state.send_grads = grad_full[plan.n_owned:].clone()
            state.recv_grads = grad_full.new_empty(plan.rows_sent, grad_full.shape[1])
            state.pending_grads.append(ex.send_rows(state.send_grads, plan.recv_counts, state.recv_grads,
                                                    plan.send_counts, blocking=False))
        grad_owned = grad_full[:plan.n_owned].clone()
        grad_owned.index_add_(0, plan.send_idx, state.grads)
        return grad_owned

    def block_pass(self, ex, slot, x_owned):
        state = self.states.setdefault(slot, _PipeState())
        if state.halo is None:
            return _WarmupBlocks(ex, x_owned, state)
        self._arrived_rows(state)
        return _PipelinedBlocks(ex, x_owned, state, self)

    def drain(self, ex):
        for state in self.states.values():
            _complete(state.pending_halo)
            _complete(state.pending_grads)

    def reset(self):
        self.drain(None)
        self.states = {}

    def state_dict(self):
        out = {}
        self.drain(None)
        for slot, state in self.states.items():
            in_flight = (bool(state.pending_halo), bool(state.pending_grads))
            for name in ("halo", "grads", "recv_halo", "recv_grads"):
                value = getattr(state, name)
                if value is not None:
                    out[f"pipeline/{slot}/{name}"] = value
            out[f"pipeline/{slot}/in_flight"] = torch.tensor(in_flight)  # host: checkpoint metadata
        return out

    def load_state_dict(self, tensors):
        """Restored messages count as delivered: the resumed run applies them without resending."""
        self.states = {}
        for key, value in tensors.items():
            _, slot, name = key.split("/")
            state = self.states.setdefault(slot, _PipeState())
            if name == "in_flight":
                halo_flying, grads_flying = (bool(v) for v in value)
                state.pending_halo = [_Delivered()] if halo_flying else []
                state.pending_grads = [_Delivered()] if grads_flying else []
            else:
                setattr(state, name, value)


class _Delivered:
    def wait(self) -> None:
        pass


class _WarmupBlocks(BlockPass):
    """Epoch 0 with sequential halos: the exact exchange, each block and each returned gradient also kept."""

    def __init__(self, ex, x_owned, state: _PipeState):
        super().__init__(ex, x_owned)
        self.state = state
        state.halo = x_owned.new_empty(ex.plan.n_halo, x_owned.shape[1])

    def in_buffer(self, exchange):
        return self.state.halo[exchange.block.col_start:exchange.block.col_stop]

    def begin_backward(self):
        self.state.grads = self.like.new_zeros(self.plan.rows_sent, self.like.shape[1])

    def in_gradients(self, exchange, like):
        return self.state.grads[exchange.send_start:exchange.send_stop], self.send_range(exchange)


class _PipelinedBlocks(BlockPass):
    """Every block is aggregated with last epoch's (smoothed) rows while this epoch's travel; in the backward,
    this epoch's halo gradients travel and last epoch's returned ones are added at the end."""

    defers = True

    def __init__(self, ex, x_owned, state: _PipeState, schedule: PipelineSchedule):
        super().__init__(ex, x_owned)
        self.state, self.schedule = state, schedule
        plan, width = ex.plan, x_owned.shape[1]
        state.send_halo = x_owned.index_select(0, plan.send_idx)
        if state.recv_halo is None or state.recv_halo.shape != state.halo.shape:
            state.recv_halo = x_owned.new_empty(plan.n_halo, width)
        self.kept = state.pending_halo

    def out_rows(self, exchange):
        return self.state.send_halo[exchange.send_start:exchange.send_stop]

    def in_buffer(self, exchange):
        return self.state.recv_halo[exchange.block.col_start:exchange.block.col_stop]

    def block_rows(self, exchange, received):
        return self.state.halo[exchange.block.col_start:exchange.block.col_stop]

    def keep(self, pending):
        self.kept.append(pending)

    def begin_backward(self):
        state = self.state
        self.schedule._arrived_grads(state)
        width = self.like.shape[1]
        if state.send_grads is None or state.send_grads.shape != (self.plan.n_halo, width):
            state.send_grads = self.like.new_empty(self.plan.n_halo, width)
        if state.recv_grads is None or state.recv_grads.shape != state.grads.shape:
            state.recv_grads = self.like.new_empty(self.plan.rows_sent, width)
        self.kept = state.pending_grads

    def out_gradients(self, exchange, grad_block):
        rows = self.state.send_grads[exchange.block.col_start:exchange.block.col_stop]
        rows.copy_(grad_block)
        return rows

    def in_gradients(self, exchange, like):
        return self.state.recv_grads[exchange.send_start:exchange.send_stop], self.send_range(exchange)

    def finish_backward(self, grad_x):
        grad_x.index_add_(0, self.plan.send_idx, self.state.grads)
