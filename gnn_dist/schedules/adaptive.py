"""adaptive:E[:K]: Sancus-style skipping of halo blocks that barely changed (see gnn_dist.schedules).

The rule, per exchanged layer and peer: the owner skips sending a block when
what shapes it changed by less than E (relative) since the block was last
sent, and it has skipped that block fewer than K times in a row (Sancus's
bound on staleness, in epochs). One int32 flag per peer says what comes.

What "changed" measures:
- dropout off: the block's rows, ||new - last|| / ||last|| (Sancus's rule);
- dropout on: the parameters that shape the layer's rows (its own and the
  layers' below), ||theta - theta_last|| / ||theta_last||, which the model
  hands over in `ex.shaping_parameters[slot]`. The rows themselves cannot
  tell: two epochs' dropout masks (this layer's and every lower layer's)
  make the sent rows differ by 50-110% from one epoch to the next all
  through training (facebook, P=4, GCN 3x64, dropout 0.5; with dropout off
  they settle to about 1% by epoch 50), so Sancus's rule never skips
  (adaptive:0.05 sent all of exact's bytes on facebook at P=2 and 4:
  benchmarks/results/schedules-facebook.md). The weights are the
  only noise-free source of change, and all ranks hold the same ones, so
  every block of a layer is skipped or sent alike: early in training, when
  the weights move fast, the layer exchanges every epoch; later it skips up
  to K epochs in a row.

What a skipped block is to the receiver: *absent*. Where the layer's
aggregation is linear (GCN, SAGE: the layers in ex.renormalising_slots) its
rows aggregate as nothing and each owned row is renormalised over the
entries still present, R_i / R'_i before the bias, as `bns:P` does with the
rows it drops (gnn_dist.schedules.renormalise). Nothing travels back for it.
The rule before this one reused the rows last received as constants of the
epoch (their gradients discarded, as `stale:R` does); it lost 1.8 points on
twitch FR at P=8 and 3.6 on synthetic:arxiv at P=4 (3 seeds, GCN 3x64):
every reused row carries an old dropout sample and old weights across a
boundary that holds 43% of arxiv's edges, and reusing the returned gradients
as well costs 5-9 points there (benchmarks/results/adaptive-probe-nine-rules.md).
Dropping the block costs no bytes and holds every battery cell
(benchmarks/results/schedules-battery.md). Attention layers (GAT) keep the
reuse rule: their softmax would count an absent (zero) row as a neighbour,
and a row's attention cannot be renormalised after the fact.

Gradient blocks need no flags: both sides know which forward blocks travelled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from gnn_dist.halo.blocks import BlockPass
from gnn_dist.schedules.base import Schedule, register_schedule
from gnn_dist.schedules.renormalise import RowRenormaliser


@register_schedule
@dataclass
class AdaptiveSchedule(Schedule):
    eps: float
    max_skips: int = 4
    last_sent: dict = field(default_factory=dict)        # slot -> rows as last sent (dropout off)
    last_parameters: dict = field(default_factory=dict)  # slot -> shaping parameters at the last send (dropout on)
    last_received: dict = field(default_factory=dict)    # slot -> halo rows as last received (attention layers)
    skips_in_a_row: dict = field(default_factory=dict)   # slot -> per peer
    incoming: dict = field(default_factory=dict)         # slot -> this pass's flags: which peers' blocks came
    # factors of the recent patterns of absent blocks (with dropout on every block of a layer skips alike, so
    # one or two patterns recur)
    _renormaliser: RowRenormaliser = field(default_factory=lambda: RowRenormaliser(capacity=4))
    kind = "adaptive"
    form = "adaptive:EPS[:MAXSKIP]"
    measures_parameter_drift = True
    reweights_rows = True

    @classmethod
    def parse(cls, arg, seed):
        eps_text, _, skips_text = (arg or "").partition(":")
        eps = float(eps_text)
        skips = int(skips_text) if skips_text else 4
        return cls(eps, skips) if eps >= 0 and skips >= 1 else None

    def predicted_bytes(self, exact_bytes, exchanged_layers, num_parts):
        # An upper bound: every block sent, plus one int32 flag per peer and exchanged layer.
        return exact_bytes + exchanged_layers * num_parts * (num_parts - 1) * 4

    def cached_rows(self, n_halo, n_sent):
        # the rows last sent (dropout off): a skipped block is left out on the receiving side, not cached
        return n_sent

    def cached_rows_under_attention(self, n_halo, n_sent):
        # an attention layer reuses the rows it last received for a skipped block
        return n_sent + n_halo

    def state_bytes(self, n_owned, n_halo, n_sent):
        return self._renormaliser.state_bytes(n_owned)

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"adaptive:{self.eps:g}" + (f":{self.max_skips}" if self.max_skips != 4 else "")

    def _changes(self, plan, slot: str, send: torch.Tensor, parameters: torch.Tensor | None) -> list[float]:
        """Each peer block's relative change since it was last sent (inf before the first send)."""
        if parameters is not None:
            last = self.last_parameters.get(slot)
            drift = math.inf if last is None else _relative_change(parameters, last)
            return [drift] * plan.num_parts
        last = self.last_sent.get(slot)
        return [math.inf if last is None else _relative_change(send[seg], last[seg]) for seg in plan.send_segments()]

    def _choose(self, plan, slot: str, send: torch.Tensor, parameters: torch.Tensor | None) -> np.ndarray:
        """1 for each peer whose block travels this epoch; records what was sent."""
        changes = self._changes(plan, slot, send, parameters)
        skips = self.skips_in_a_row.setdefault(slot, np.zeros(plan.num_parts, dtype=np.int64))
        segments = plan.send_segments()
        peers = [q for q, seg in enumerate(segments) if q != plan.rank and seg.stop > seg.start]
        sending = np.ones(plan.num_parts, dtype=np.int32)
        for q in peers:
            if changes[q] < self.eps and skips[q] < self.max_skips:
                sending[q] = 0
        skips[:] = np.where(sending == 1, 0, skips + 1)
        peers_sent = [q for q in peers if sending[q]]
        if parameters is not None:
            if peers_sent or slot not in self.last_parameters:
                self.last_parameters[slot] = parameters.clone()
        elif slot not in self.last_sent:
            self.last_sent[slot] = send.clone()
        else:
            for q in peers_sent:
                self.last_sent[slot][segments[q]] = send[segments[q]]
        return sending

    def forward(self, ex, slot, x_owned):
        plan = ex.plan
        send = x_owned.index_select(0, plan.send_idx)
        sending = self._choose(plan, slot, send, ex.shaping_parameters.pop(slot, None))
        incoming = ex.send_flags(sending)
        send_segments, recv_segments = plan.send_segments(), plan.recv_segments()
        send_counts = plan.send_counts * sending
        recv_counts = plan.recv_counts * incoming
        picked = torch.cat([send[seg] for q, seg in enumerate(send_segments) if sending[q]] or [send[:0]])
        compact = send.new_empty(int(recv_counts.sum()), send.shape[1])
        ex.send_rows(picked, send_counts, compact, recv_counts)
        ex.counters.halo_rows_skipped += int((plan.send_counts * (1 - sending)).sum())
        self.incoming[slot] = incoming
        full = ex.new_full(x_owned)
        # an absent block aggregates as zeros (the layer renormalises each row); an attention layer reuses the
        # rows last received instead
        reuses = slot not in ex.renormalising_slots
        halo = self.last_received.setdefault(slot, send.new_zeros(plan.n_halo, send.shape[1])) if reuses \
            else full[plan.n_owned:]
        offset = 0
        for q, seg in enumerate(recv_segments):
            if incoming[q]:
                halo[seg] = compact[offset:offset + seg.stop - seg.start]
                offset += seg.stop - seg.start
            elif not reuses:
                halo[seg] = 0
        if reuses:
            full[plan.n_owned:] = halo
        return full, (sending, incoming)

    def aggregation_scale(self, ex, slot, operator):
        """R_i / R'_i per owned row over the blocks that came this pass (gnn_dist.schedules.renormalise), or None
        when every block came."""
        plan, incoming = ex.plan, self.incoming[slot]
        absent = [seg for q, seg in enumerate(plan.recv_segments()) if not incoming[q] and seg.stop > seg.start]
        if not absent:
            return None
        halo_present = torch.ones(plan.n_halo, dtype=torch.bool, device=plan.device)
        for seg in absent:
            halo_present[seg] = False
        return self._renormaliser.factors(plan, operator, halo_present, pattern=incoming.tobytes())

    def block_pass(self, ex, slot, x_owned):
        plan = ex.plan
        parameters = ex.shaping_parameters.pop(slot, None)
        send = None if parameters is not None else x_owned.index_select(0, plan.send_idx)  # the row rule's input
        sending = self._choose(plan, slot, send, parameters)
        incoming = ex.send_flags(sending)
        ex.counters.halo_rows_skipped += int((plan.send_counts * (1 - sending)).sum()) \
            + int((plan.recv_counts * (1 - incoming)).sum())
        self.incoming[slot] = incoming
        return _AdaptiveBlocks(ex, x_owned, sending, incoming)

    def reset(self):
        self.last_sent, self.last_parameters, self.last_received, self.skips_in_a_row = {}, {}, {}, {}
        self.incoming = {}

    def backward(self, ex, slot, grad_full, flags):
        """Gradients go back for the blocks that came fresh this epoch only."""
        sending, incoming = flags
        plan = ex.plan
        send_segments, recv_segments = plan.send_segments(), plan.recv_segments()
        halo_grads = grad_full[plan.n_owned:]
        picked = torch.cat([halo_grads[seg] for q, seg in enumerate(recv_segments) if incoming[q]]
                           or [halo_grads[:0]])
        returned = grad_full.new_empty(int((plan.send_counts * sending).sum()), grad_full.shape[1])
        ex.send_rows(picked, plan.recv_counts * incoming, returned, plan.send_counts * sending)
        ex.counters.halo_rows_skipped += int((plan.recv_counts * (1 - incoming)).sum())
        grad_owned = grad_full[:plan.n_owned].clone()
        fresh = [seg for q, seg in enumerate(send_segments) if sending[q]]
        if fresh:
            rows = torch.cat([plan.send_idx[seg] for seg in fresh])
            grad_owned.index_add_(0, rows, returned)
        return grad_owned

    def state_dict(self):
        out = {}
        for prefix, table in (("sent", self.last_sent), ("parameters", self.last_parameters),
                              ("received", self.last_received)):
            for slot, value in table.items():
                out[f"adaptive/{prefix}/{slot}"] = value
        for slot, value in self.skips_in_a_row.items():
            out[f"adaptive/skips/{slot}"] = torch.from_numpy(value.copy())  # host: checkpoint metadata
        return out

    def load_state_dict(self, tensors):
        tables = {"sent": self.last_sent, "parameters": self.last_parameters, "received": self.last_received}
        for key, value in tensors.items():
            _, kind, slot = key.split("/")
            if kind == "skips":
                self.skips_in_a_row[slot] = value.cpu().numpy().copy()
            else:
                tables[kind][slot] = value


class _AdaptiveBlocks(BlockPass):
    """Sequential halos under adaptive: a block travels when its owner sends that peer's rows this epoch (the
    flags say which); otherwise it is absent (nothing aggregated, the layer renormalises each row) and no
    gradient goes back for it. Sequential halos run linear aggregations only under a lossy schedule
    (gnn_dist.config), so no block is ever reused here."""

    def __init__(self, ex, x_owned, sending: np.ndarray, incoming: np.ndarray):
        super().__init__(ex, x_owned)
        self.sending, self.incoming = sending, incoming

    def out_rows(self, exchange):
        return super().out_rows(exchange) if self.sending[exchange.dest] else None

    def in_buffer(self, exchange):
        return super().in_buffer(exchange) if self.incoming[exchange.src] else None

    def out_gradients(self, exchange, grad_block):
        return grad_block if self.incoming[exchange.src] else None

    def in_gradients(self, exchange, like):
        return super().in_gradients(exchange, like) if self.sending[exchange.dest] else None


def _relative_change(new: torch.Tensor, last: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(new - last) / torch.linalg.vector_norm(last).clamp_min(1e-12))
