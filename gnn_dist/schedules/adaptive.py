"""adaptive:E[:K]: Sancus-style skipping of blocks that barely changed (see gnn_dist.schedules)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from gnn_dist.schedules.base import Schedule, register_schedule


@register_schedule
@dataclass
class AdaptiveSchedule(Schedule):
    eps: float
    max_skips: int = 4
    last_sent: dict = field(default_factory=dict)      # (slot, direction) -> rows last sent, per send layout
    last_received: dict = field(default_factory=dict)  # (slot, direction) -> rows last received
    skips_in_a_row: dict = field(default_factory=dict)
    kind = "adaptive"
    form = "adaptive:EPS[:MAXSKIP]"

    @classmethod
    def parse(cls, arg, seed):
        eps_text, _, skips_text = (arg or "").partition(":")
        eps = float(eps_text)
        skips = int(skips_text) if skips_text else 4
        return cls(eps, skips) if eps >= 0 and skips >= 1 else None

    def predicted_bytes(self, exact_bytes, exchanged_layers, num_parts):
        # An upper bound: every block sent, plus one int32 flag per peer, direction and exchanged layer.
        return exact_bytes + 2 * exchanged_layers * num_parts * (num_parts - 1) * 4

    def cached_rows(self, n_halo, n_sent):
        return 2 * (n_halo + n_sent)  # last rows sent and received, both directions

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"adaptive:{self.eps:g}" + (f":{self.max_skips}" if self.max_skips != 4 else "")

    def _exchange(self, ex, key, send: torch.Tensor, send_segments, recv_shape, recv_segments):
        """Send the blocks that changed enough; returns all rows as the receiver should use them."""
        plan = ex.plan
        last = self.last_sent.get(key)
        skips = self.skips_in_a_row.setdefault(key, np.zeros(plan.num_parts, dtype=np.int64))
        sending = np.ones(plan.num_parts, dtype=np.int32)
        if last is not None:
            for q, seg in enumerate(send_segments):
                if q == plan.rank or seg.stop == seg.start:
                    continue
                change = torch.linalg.vector_norm(send[seg] - last[seg])
                scale = torch.linalg.vector_norm(last[seg]).clamp_min(1e-12)
                if change / scale < self.eps and skips[q] < self.max_skips:
                    sending[q] = 0
        skips[:] = np.where(sending == 1, 0, skips + 1)
        incoming = ex.send_flags(sending)
        send_counts = np.array([seg.stop - seg.start for seg in send_segments]) * sending
        recv_counts = np.array([seg.stop - seg.start for seg in recv_segments]) * incoming
        picked = torch.cat([send[seg] for q, seg in enumerate(send_segments) if sending[q]] or [send[:0]])
        compact = torch.empty(int(recv_counts.sum()), send.shape[1])
        ex.send_rows(picked, send_counts, compact, recv_counts)
        if last is None:
            self.last_sent[key] = send.clone()
        else:
            for q, seg in enumerate(send_segments):
                if sending[q]:
                    last[seg] = send[seg]
        skipped = sum(seg.stop - seg.start for q, seg in enumerate(send_segments) if q != plan.rank and not sending[q])
        ex.counters.halo_rows_skipped += skipped
        result = self.last_received.setdefault(key, torch.zeros(recv_shape))
        offset = 0
        for q, seg in enumerate(recv_segments):
            if incoming[q]:
                rows = seg.stop - seg.start
                result[seg] = compact[offset:offset + rows]
                offset += rows
        return result

    def forward(self, ex, slot, x_owned):
        plan = ex.plan
        send = x_owned.index_select(0, plan.send_idx)
        halo = self._exchange(ex, (slot, "fwd"), send, plan.send_segments(), (plan.n_halo, send.shape[1]),
                              plan.recv_segments())
        full = ex.new_full(x_owned)
        full[plan.n_owned:] = halo
        return full, None

    def backward(self, ex, slot, grad_full, info):
        plan = ex.plan
        grads = self._exchange(ex, (slot, "bwd"), grad_full[plan.n_owned:], plan.recv_segments(),
                               (plan.rows_sent, grad_full.shape[1]), plan.send_segments())
        grad_owned = grad_full[:plan.n_owned].clone()
        grad_owned.index_add_(0, plan.send_idx, grads)
        return grad_owned

    def state_dict(self):
        out = {}
        for prefix, table in (("sent", self.last_sent), ("received", self.last_received)):
            for (slot, direction), value in table.items():
                out[f"adaptive/{prefix}/{slot}/{direction}"] = value
        for (slot, direction), value in self.skips_in_a_row.items():
            out[f"adaptive/skips/{slot}/{direction}"] = torch.from_numpy(value.copy())
        return out

    def load_state_dict(self, tensors):
        for key, value in tensors.items():
            _, kind, slot, direction = key.split("/")
            if kind == "sent":
                self.last_sent[(slot, direction)] = value
            elif kind == "received":
                self.last_received[(slot, direction)] = value
            else:
                self.skips_in_a_row[(slot, direction)] = value.numpy().copy()
