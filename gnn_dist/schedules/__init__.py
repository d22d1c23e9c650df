"""Communication schedules for hidden-layer halos (`--schedule`).

Each schedule decides, per layer (slot) and epoch of training, what the
forward and backward of the halo exchange send. Evaluation always uses the
exact exchange, so reported accuracies are of the trained model itself.
Input-feature halos are fetched once at start-up under every schedule.

    exact          every epoch, every halo row forward and every halo gradient back.
    stale:R        DistGNN-style delayed halos: exchange on epochs 0, R, 2R, ...;
                   in between the forward reuses the cached halo rows and the
                   backward treats them as constants: their gradients are
                   discarded and nothing is sent back. stale:1 is exact.
    pipeline[:G]   PipeGCN: epoch e uses the halo rows and halo gradients of
                   epoch e-1 while epoch e's travel with non-blocking MPI,
                   overlapping compute. Epoch 0 is exact (nothing to reuse yet).
                   With G > 0 stale values are smoothed: v <- G v + (1 - G) v_new.
    bns:P          BNS-GCN: each epoch each receiving rank keeps a random fraction
                   P of its halo rows, chosen by a hash of (seed, epoch, node,
                   receiver) that owner and receiver both compute, so no ids
                   travel. Dropped rows contribute nothing; kept rows keep the
                   full-graph normalisation (as BNS-GCN's code keeps the full
                   in-degree). Gradients flow back for kept rows only. bns:1 is exact.
    adaptive:E[:K] Sancus-style skipping: per peer and direction, a rank skips
                   sending a block whose relative change since it was last sent
                   (||new - last|| / ||last||) is below E, at most K (default 4)
                   times in a row; the receiver reuses the last block it got.
                   One int32 flag per peer tells receivers what comes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from gnn_dist.dropout import _wrap_int32, mix32, stream_key

SCHEDULE_FORMS = "exact, stale:R (R >= 1), pipeline, pipeline:GAMMA (0 <= GAMMA < 1), bns:P (0 < P <= 1), adaptive:EPS[:MAXSKIP]"


class Schedule:
    name = "exact"

    def forward(self, ex, slot: str, x_owned: torch.Tensor):
        raise NotImplementedError

    def backward(self, ex, slot: str, grad_full: torch.Tensor, info):
        raise NotImplementedError

    def finish(self, ex) -> None:
        """Complete anything still in flight."""

    def state_tensors(self) -> dict:
        """Caches a checkpoint must keep to resume this schedule exactly."""
        return {}

    def load_state_tensors(self, tensors: dict) -> None:
        if tensors:
            raise ValueError(f"schedule {self.name} has no state to restore")


class ExactSchedule(Schedule):
    name = "exact"

    def forward(self, ex, slot, x_owned):
        return ex.exact_forward(x_owned), None

    def backward(self, ex, slot, grad_full, info):
        return ex.exact_backward(grad_full)


ExactSchedule.shared = ExactSchedule()


@dataclass
class StaleSchedule(Schedule):
    refresh_every: int
    cache: dict = field(default_factory=dict)

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

    def state_tensors(self):
        return {f"stale/{slot}": t for slot, t in self.cache.items()}

    def load_state_tensors(self, tensors):
        self.cache = {key.split("/", 1)[1]: t for key, t in tensors.items()}


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


@dataclass
class PipelineSchedule(Schedule):
    gamma: float = 0.0
    states: dict = field(default_factory=dict)

    @property
    def name(self) -> str:  # type: ignore[override]
        return "pipeline" if self.gamma == 0 else f"pipeline:{self.gamma:g}"

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

    def state_tensors(self):
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

    def load_state_tensors(self, tensors):
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


def _bernoulli_keep(node_ids: torch.Tensor, receivers: torch.Tensor, key: int, p: float) -> torch.Tensor:
    """True with probability p, a function of (node, receiver, key) only: owner and receiver agree."""
    words = mix32(mix32(_wrap_int32(node_ids * 0x9E3779B1) ^ _wrap_int32(receivers * 0x85EBCA77 + key)))
    # uniform 32-bit words read as signed fall below this threshold with probability p
    return words < int(p * (1 << 32)) - (1 << 31) if p < 1 else torch.ones(node_ids.shape, dtype=torch.bool)


@dataclass
class BoundarySamplingSchedule(Schedule):
    keep_fraction: float
    seed: int = 0
    _epoch_masks: tuple | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"bns:{self.keep_fraction:g}"

    def _masks(self, ex):
        """(send rows kept, counts per peer, halo rows kept, counts per owner) for this epoch."""
        if self._epoch_masks is None or self._epoch_masks[0] != ex.epoch:
            plan = ex.plan
            key = stream_key(self.seed, ex.epoch, 0x0B5)
            send_keep = _bernoulli_keep(plan.send_node_ids, plan.send_peer, key, self.keep_fraction)
            me = torch.full((plan.n_halo,), plan.rank, dtype=torch.int64)
            halo_keep = _bernoulli_keep(plan.halo_ids, me, key, self.keep_fraction)
            send_counts = np.bincount(plan.send_peer[send_keep].numpy(), minlength=plan.num_parts)
            recv_counts = np.bincount(plan.halo_owner[halo_keep].numpy(), minlength=plan.num_parts)
            self._epoch_masks = (ex.epoch, torch.nonzero(send_keep).squeeze(1), send_counts,
                                 torch.nonzero(halo_keep).squeeze(1), recv_counts)
        return self._epoch_masks[1:]

    def forward(self, ex, slot, x_owned):
        plan = ex.plan
        send_rows, send_counts, halo_rows, recv_counts = self._masks(ex)
        width = x_owned.shape[1]
        send = x_owned.index_select(0, plan.send_idx[send_rows])
        received = torch.empty(halo_rows.shape[0], width)
        ex.send_rows(send, send_counts, received, recv_counts)
        full = ex.new_full(x_owned)
        full[plan.n_owned:] = 0
        full[plan.n_owned + halo_rows] = received
        ex.counters.halo_rows_skipped += plan.rows_sent_to_peers \
            - (int(send_counts.sum()) - int(send_counts[plan.rank]))
        return full, (send_rows, send_counts, halo_rows, recv_counts)

    def backward(self, ex, slot, grad_full, info):
        plan = ex.plan
        send_rows, send_counts, halo_rows, recv_counts = info
        grads_back = grad_full[plan.n_owned + halo_rows]
        returned = torch.empty(send_rows.shape[0], grad_full.shape[1])
        ex.send_rows(grads_back, recv_counts, returned, send_counts)
        ex.counters.halo_rows_skipped += plan.n_halo - halo_rows.shape[0]
        grad_owned = grad_full[:plan.n_owned].clone()
        grad_owned.index_add_(0, plan.send_idx[send_rows], returned)
        return grad_owned


@dataclass
class AdaptiveSchedule(Schedule):
    eps: float
    max_skips: int = 4
    last_sent: dict = field(default_factory=dict)      # (slot, direction) -> rows last sent, per send layout
    last_received: dict = field(default_factory=dict)  # (slot, direction) -> rows last received
    skips_in_a_row: dict = field(default_factory=dict)

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

    def state_tensors(self):
        out = {}
        for prefix, table in (("sent", self.last_sent), ("received", self.last_received)):
            for (slot, direction), value in table.items():
                out[f"adaptive/{prefix}/{slot}/{direction}"] = value
        for (slot, direction), value in self.skips_in_a_row.items():
            out[f"adaptive/skips/{slot}/{direction}"] = torch.from_numpy(value.copy())
        return out

    def load_state_tensors(self, tensors):
        for key, value in tensors.items():
            _, kind, slot, direction = key.split("/")
            if kind == "sent":
                self.last_sent[(slot, direction)] = value
            elif kind == "received":
                self.last_received[(slot, direction)] = value
            else:
                self.skips_in_a_row[(slot, direction)] = value.numpy().copy()


def parse_schedule(spec: str, seed: int = 0) -> Schedule:
    """The schedule named by a --schedule SPEC; a bad SPEC raises ValueError listing the valid forms."""
    kind, _, arg = spec.partition(":")
    try:
        if spec == "exact":
            return ExactSchedule()
        if kind == "stale" and arg:
            refresh = int(arg)
            if refresh >= 1:
                return ExactSchedule() if refresh == 1 else StaleSchedule(refresh)
        if kind == "pipeline":
            gamma = float(arg) if arg else 0.0
            if 0.0 <= gamma < 1.0:
                return PipelineSchedule(gamma)
        if kind == "bns" and arg:
            fraction = float(arg)
            if 0.0 < fraction <= 1.0:
                return ExactSchedule() if fraction == 1.0 else BoundarySamplingSchedule(fraction, seed)
        if kind == "adaptive" and arg:
            eps_text, _, skips_text = arg.partition(":")
            eps = float(eps_text)
            skips = int(skips_text) if skips_text else 4
            if eps >= 0 and skips >= 1:
                return AdaptiveSchedule(eps, skips)
    except ValueError:
        pass
    raise ValueError(f"bad --schedule {spec!r}: valid forms: {SCHEDULE_FORMS}")
