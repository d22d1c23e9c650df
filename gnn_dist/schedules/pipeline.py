"""pipeline[:G]: PipeGCN, halos and halo gradients one epoch late, in flight while compute runs.

Stale values are smoothed as PipeGCN-GF does, v <- G v + (1 - G) v_new, with G = 0.9 unless given
(`pipeline:0` is plain PipeGCN). Unsmoothed, a stale halo row or gradient carries the previous epoch's
dropout sample, uncorrelated with this epoch's masks, on top of one epoch of weight drift: on
synthetic:arxiv at P=2 (GCN 3x128, 60 epochs, dropout 0.5) plain PipeGCN lost 7.1 points against
exact (3.4 with dropout off), G = 0.5 lost 2.8, G = 0.8 0.5 and G = 0.9 none
(benchmarks/results/pipeline-smoothing.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gnn_dist.schedules.base import Schedule, register_schedule


@dataclass
class _PipeState:
    halo: torch.Tensor | None = None          # halo rows used this epoch
    grads: torch.Tensor | None = None         # gradients for our sent rows, used this epoch
    pending_halo: object = None
    pending_grads: object = None
    recv_halo: torch.Tensor | None = None
    recv_grads: torch.Tensor | None = None
    send_halo: torch.Tensor | None = None
    send_grads: torch.Tensor | None = None


DEFAULT_SMOOTHING = 0.9


@dataclass
@register_schedule
class PipelineSchedule(Schedule):
    gamma: float = DEFAULT_SMOOTHING
    states: dict = field(default_factory=dict)
    kind = "pipeline"
    form = "pipeline, pipeline:GAMMA (0 <= GAMMA < 1)"

    @classmethod
    def parse(cls, arg, seed):
        gamma = float(arg) if arg else DEFAULT_SMOOTHING
        return cls(gamma) if 0.0 <= gamma < 1.0 else None

    def cached_rows(self, n_halo, n_sent):
        return 2 * n_halo + 2 * n_sent  # rows and gradients in use, and the ones in flight

    @property
    def name(self) -> str:  # type: ignore[override]
        return "pipeline" if self.gamma == DEFAULT_SMOOTHING else f"pipeline:{self.gamma:g}"

    def _smooth(self, old: torch.Tensor, new: torch.Tensor) -> None:
        if self.gamma == 0:
            old.copy_(new)
        else:
            old.mul_(self.gamma).add_(new, alpha=1 - self.gamma)

    def forward(self, ex, slot, x_owned):
        plan = ex.plan
        state = self.states.setdefault(slot, _PipeState())
        width = x_owned.shape[1]
        if state.halo is None:  # epoch 0: nothing stale to use yet
            full = ex.exact_forward(x_owned)
            state.halo = full[plan.n_owned:].clone()
            return full, True
        if state.pending_halo is not None:
            state.pending_halo.wait()
            self._smooth(state.halo, state.recv_halo)
        full = ex.new_full(x_owned)
        full[plan.n_owned:] = state.halo
        # This epoch's rows travel while this and the next epoch compute.
        state.send_halo = x_owned.index_select(0, plan.send_idx)
        state.recv_halo = torch.empty(plan.n_halo, width)
        state.pending_halo = ex.send_rows(state.send_halo, plan.send_counts, state.recv_halo, plan.recv_counts,
                                          blocking=False)
        return full, False

    def backward(self, ex, slot, grad_full, warmup):
        plan = ex.plan
        state = self.states[slot]
        if warmup:
            returned = ex.buffer(("grad_recv",), plan.rows_sent, grad_full.shape[1])
            ex.send_rows(grad_full[plan.n_owned:], plan.recv_counts, returned, plan.send_counts)
            state.grads = returned.clone()
        else:
            if state.pending_grads is not None:
                state.pending_grads.wait()
                self._smooth(state.grads, state.recv_grads)
            state.send_grads = grad_full[plan.n_owned:].clone()
            state.recv_grads = torch.empty(plan.rows_sent, grad_full.shape[1])
            state.pending_grads = ex.send_rows(state.send_grads, plan.recv_counts, state.recv_grads,
                                               plan.send_counts, blocking=False)
        grad_owned = grad_full[:plan.n_owned].clone()
        grad_owned.index_add_(0, plan.send_idx, state.grads)
        return grad_owned

    def finish(self, ex):
        for state in self.states.values():
            for pending in (state.pending_halo, state.pending_grads):
                if pending is not None:
                    pending.wait()

    def state_dict(self):
        self.finish(None)
        out = {}
        for slot, state in self.states.items():
            for name in ("halo", "grads", "recv_halo", "recv_grads"):
                value = getattr(state, name)
                if value is not None:
                    out[f"pipeline/{slot}/{name}"] = value
            out[f"pipeline/{slot}/in_flight"] = torch.tensor(
                [state.pending_halo is not None, state.pending_grads is not None])
        return out

    def load_state_dict(self, tensors):
        """Restored messages count as delivered: the resumed run applies them without resending."""
        self.states = {}
        for key, value in tensors.items():
            _, slot, name = key.split("/")
            state = self.states.setdefault(slot, _PipeState())
            if name == "in_flight":
                halo_flying, grads_flying = (bool(v) for v in value)
                state.pending_halo = _Delivered() if halo_flying else None
                state.pending_grads = _Delivered() if grads_flying else None
            else:
                setattr(state, name, value)


class _Delivered:
    def wait(self) -> None:
        pass
