"""The differentiable halo exchange of a rank (`HaloExchanger`), over its frozen plan (gnn_dist.halo.plan).

`HaloExchanger.gather` is an autograd function from owned rows [n_owned, F]
to [owned | halo] rows [n_owned + n_halo, F]. Under the `exact` schedule,
forward sends owners' boundary rows; backward sends the halo rows' gradients
back to their owners, which sum them into the owned rows' gradients (one node
may be in many peers' halos). Other schedules (gnn_dist.schedules) decide per
layer and epoch what actually travels. Every byte handed to the communicator
is counted; payloads are encoded by the `--halo-dtype` codec.

Buffers are allocated once per (slot, purpose, width, dtype) and reused every
epoch; a slot is the layer that owns it, so two layers never share a buffer.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from gnn_dist.comm.codec import Codec
from gnn_dist.comm.communicator import Comm, Pending
from gnn_dist.halo import overlap as halo_overlap
from gnn_dist.halo.exact import EXACT
from gnn_dist.halo.plan import HaloPlan


@dataclass
class TrafficCounters:
    """What this rank sent; the trainer resets and reduces them per epoch."""

    halo_bytes: int = 0
    halo_rows: int = 0
    halo_rows_skipped: int = 0  # rows exact training would have sent but this schedule did not
    allreduce_bytes: int = 0    # payload this rank contributed to allreduces (0 on a single rank)
    comm_s: float = 0.0         # wall time inside communication calls (blocking ones, posting, progress, waiting)
    wait_s: float = 0.0         # of which: waiting for non-blocking transfers to complete (what overlap did not hide)
    score_bytes: int = 0        # link prediction: endpoint embeddings fetched for scoring, and their gradients

    def reset(self) -> None:
        self.halo_bytes = self.halo_rows = self.halo_rows_skipped = self.allreduce_bytes = self.score_bytes = 0
        self.comm_s = self.wait_s = 0.0

    def waited(self, seconds: float) -> None:
        self.comm_s += seconds
        self.wait_s += seconds

    def take(self) -> TrafficCounters:
        """What was counted since the last reset, and a reset: one phase's figures (training, then evaluation)."""
        taken = dataclasses.replace(self)
        self.reset()
        return taken


@dataclass
class HaloExchanger:
    comm: Comm
    plan: HaloPlan
    codec: Codec = field(default_factory=Codec)
    schedule: object = None  # a gnn_dist.schedules.Schedule; None means exact
    counters: TrafficCounters = field(default_factory=TrafficCounters)
    epoch: int = 0
    training: bool = False
    beat: object = None  # callable(step: str) -> None: progress reports for the watchdog
    activity: str = "halo exchange"  # what the watchdog reports when this rank stalls
    # slot -> the parameters that shape its rows, flat, for schedules that measure drift (under dropout)
    shaping_parameters: dict = field(default_factory=dict)
    # Set by the divergence guard (gnn_dist.training.guard): training exchanges exactly while it is on.
    guard_exact: bool = False
    # Slots whose layer multiplies its aggregation by aggregation_scale (linear aggregations; set by the layers,
    # gnn_dist.models.base): there a schedule may leave halo rows absent, as each row is renormalised over what
    # it still has. An attention layer's softmax would count an absent (zero) row as a neighbour.
    renormalising_slots: set = field(default_factory=set)
    # Whether exact exchanges of linear layers overlap the owned product (gnn_dist.halo.overlap); set-up sets
    # the value every rank agreed on.
    overlap: bool = field(default_factory=halo_overlap.overlap_enabled)
    # a gnn_dist.halo.shared.SharedHalo when every rank shares one host (set-up opens it on all or none)
    shared: object = None
    _buffers: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.schedule is None:
            self.schedule = EXACT
        if self.beat is None:
            self.beat = lambda step: None

    def buffer(self, key: tuple, rows: int, width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A reusable scratch buffer; only for data that is dead when the exchange returns."""
        full_key = key + (rows, width, dtype)
        buf = self._buffers.get(full_key)
        if buf is None:
            buf = torch.empty(rows, width, dtype=dtype, device=self.plan.device)
            self._buffers[full_key] = buf
        return buf

    def begin_pass(self, epoch: int, training: bool) -> None:
        """Called by the model before each forward: schedules key their decisions on it."""
        self.epoch = epoch
        self.training = training

    def active_schedule(self, slot: str):
        """The schedule that moves slot's halo in this pass: the configured one in training, the exact exchange
        in evaluation and while the divergence guard holds training to it."""
        if not self.training or self.guard_exact:
            return EXACT
        return self.schedule.for_slot(slot)

    def overlapped(self, slot: str, attention: bool) -> bool:
        """Whether slot's exchange in this pass overlaps the owned rows' product (gnn_dist.halo.overlap): the
        same answer on every rank, as the exchange is a collective."""
        return self.plan.num_parts > 1 and halo_overlap.overlaps(self.active_schedule(slot).kind, attention,
                                                                 sequential=False, device=self.plan.device.type,
                                                                 enabled=self.overlap)

    def reweights_rows(self, slot: str) -> bool:
        """Whether slot's aggregation may be reweighted in this pass (then the layer adds its bias after
        aggregation_scale's factor). A single rank has no halo to leave out."""
        return self.plan.num_parts > 1 and self.active_schedule(slot).reweights_rows

    def aggregation_scale(self, slot: str, operator) -> torch.Tensor | None:
        """[n_owned, 1] factors the layer multiplies slot's aggregation by in this pass (before its bias), or None:
        the active schedule's (gnn_dist.schedules.base), asked after slot's exchange."""
        if self.plan.num_parts == 1:
            return None
        scale = self.active_schedule(slot).aggregation_scale(self, slot, operator)
        return None if scale is None else scale.reshape(-1, 1)

    def send_block(self, rows: torch.Tensor, dest: int, tag: int) -> Pending:
        """Point-to-point: encode `rows` and start sending them to `dest` (sequential halos). Counts bytes and rows;
        the returned handle keeps the wire rows alive until wait()."""
        self.beat(self.activity)
        with torch.profiler.record_function("halo exchange"):
            wire = self.codec.encode(rows)
            start = time.perf_counter()
            pending = self.comm.isend(wire, dest, tag)
        self.counters.comm_s += time.perf_counter() - start
        if dest != self.plan.rank:
            self.counters.halo_bytes += wire.numel() * wire.element_size()
            self.counters.halo_rows += rows.shape[0]
        return _Timed(pending, self)

    def receive_block(self, out: torch.Tensor, source: int, tag: int) -> Pending:
        """Point-to-point: start receiving out.shape[0] rows from `source` into `out` (decoded on wait())."""
        wire = out if self.codec.identity and out.is_contiguous() \
            else self.codec.empty_wire(out.shape[0], out.shape[1], out.device)
        start = time.perf_counter()
        inner = self.comm.irecv(wire, source, tag)
        self.counters.comm_s += time.perf_counter() - start
        return _DecodeOnWait(inner, self.codec, wire, out, self)

    def gather(self, x_owned: torch.Tensor, slot: str) -> torch.Tensor:
        """[owned | halo] rows of x; differentiable. Shapes: [n_owned, F] -> [n_owned + n_halo, F]."""
        if self.plan.num_parts == 1:
            return x_owned  # a single rank has no halo: nothing to copy or send
        return _HaloGather.apply(x_owned, self, slot)

    def gather_inputs(self, x_owned: torch.Tensor, slot: str) -> torch.Tensor:
        """[owned | halo] rows of a model's inputs that change every step (a typed graph's embedding rows:
        gnn_dist.hetero.inputs); differentiable. Always the exact exchange in fp32, whatever the schedule and
        --halo-dtype: a model's inputs are exact, as the cached input features of a homogeneous graph are.

        Shapes: [n_owned, F] -> [n_owned + n_halo, F]
        """
        if self.plan.num_parts == 1:
            return x_owned
        return _InputGather.apply(x_owned, self, slot)

    @contextlib.contextmanager
    def plain_rows(self):
        """Exchanges inside move fp32 rows, whatever --halo-dtype's codec."""
        codec, self.codec = self.codec, PLAIN_ROWS
        try:
            yield
        finally:
            self.codec = codec

    def send_rows(self, send: torch.Tensor, send_counts: np.ndarray, recv: torch.Tensor,
                  recv_counts: np.ndarray, blocking: bool = True) -> Pending | None:
        """Encode `send`, move it, decode into `recv` (float rows). Counts bytes and rows.

        Non-blocking: returns a Pending whose wait() also decodes.
        """
        self.beat(self.activity)
        with torch.profiler.record_function("halo exchange"):
            return self._send_rows(send, send_counts, recv, recv_counts, blocking)

    def _send_rows(self, send, send_counts, recv, recv_counts, blocking) -> Pending | None:
        wire_send = self.codec.encode(send)
        wire_recv = recv if self.codec.identity and recv.is_contiguous() \
            else self.codec.empty_wire(recv.shape[0], recv.shape[1], recv.device)
        start = time.perf_counter()
        if blocking:
            sent = self.comm.alltoallv(wire_send, send_counts, wire_recv, recv_counts)
            self.codec.decode(wire_recv, recv)
            pending = None
        else:
            inner, sent = self.comm.ialltoallv(wire_send, send_counts, wire_recv, recv_counts)
            pending = _DecodeOnWait(inner, self.codec, wire_recv, recv, self)
        self.counters.comm_s += time.perf_counter() - start
        self.counters.halo_bytes += sent
        self.counters.halo_rows += int(np.sum(send_counts) - send_counts[self.plan.rank])
        return pending

    def send_flags(self, flags: np.ndarray) -> np.ndarray:
        """One int32 per peer (metadata of adaptive schedules); returns the flags peers sent us."""
        send = torch.from_numpy(np.ascontiguousarray(flags, dtype=np.int32)).reshape(-1, 1)  # host: read back by numpy
        recv = torch.empty_like(send)
        ones = np.ones(self.plan.num_parts, dtype=np.int64)
        start = time.perf_counter()
        self.counters.halo_bytes += self.comm.alltoallv(send, ones, recv, ones)
        self.counters.comm_s += time.perf_counter() - start
        return recv.numpy().reshape(-1).copy()

    def new_full(self, x_owned: torch.Tensor) -> torch.Tensor:
        """[owned | halo] rows with the owned part filled in. Shapes: [n_owned, F] -> [n_owned + n_halo, F]."""
        full = torch.empty(self.plan.n_owned + self.plan.n_halo, x_owned.shape[1], dtype=x_owned.dtype,
                           device=x_owned.device)
        full[:self.plan.n_owned] = x_owned
        return full

    def exact_forward(self, x_owned: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        width = x_owned.shape[1]
        send = self.buffer(("send",), plan.rows_sent, width, x_owned.dtype)
        torch.index_select(x_owned, 0, plan.send_idx, out=send)
        full = self.new_full(x_owned)
        self.send_rows(send, plan.send_counts, full[plan.n_owned:], plan.recv_counts)
        return full

    def exact_backward(self, grad_full: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        returned = self.buffer(("grad_recv",), plan.rows_sent, grad_full.shape[1], grad_full.dtype)
        self.send_rows(grad_full[plan.n_owned:], plan.recv_counts, returned, plan.send_counts)
        grad_owned = grad_full[:plan.n_owned].clone()
        grad_owned.index_add_(0, plan.send_idx, returned)
        return grad_owned

    def allreduce_(self, tensor: torch.Tensor) -> None:
        """Sum a tensor over ranks in place (statistics of distributed layers), counting its bytes."""
        if self.comm.size > 1:
            self.beat(f"epoch {self.epoch}: allreduce of {tensor.numel()} values")
            start = time.perf_counter()
            with torch.profiler.record_function("allreduce"):
                self.comm.allreduce_(tensor)
            self.counters.comm_s += time.perf_counter() - start
            self.counters.allreduce_bytes += tensor.numel() * tensor.element_size()

    def halo_rows(self, x_owned: torch.Tensor, slot: str) -> torch.Tensor:
        """The exact halo rows of x, alone (no [owned | halo] copy); not differentiable: for evaluation. The same
        rows, codec and byte count as gather's forward under the exact schedule; the send rows are a temporary,
        so nothing of this exchange's width stays allocated after it. Shapes: [n_owned, F] -> [n_halo, F]"""
        plan = self.plan
        halo = torch.empty(plan.n_halo, x_owned.shape[1], dtype=x_owned.dtype, device=x_owned.device)
        if plan.num_parts == 1:
            return halo
        self.activity = f"epoch {self.epoch}: {slot} evaluation halo exchange"
        self.send_rows(x_owned.index_select(0, plan.send_idx), plan.send_counts, halo, plan.recv_counts)
        return halo

    def fetch_once(self, x_owned: torch.Tensor) -> torch.Tensor:
        """Halo rows of a tensor that never changes (input features), in fp32; not differentiable.

        Shapes: [n_owned, F] -> [n_halo, F]
        """
        plan = self.plan
        send = x_owned.index_select(0, plan.send_idx)
        halo = torch.empty(plan.n_halo, x_owned.shape[1], dtype=x_owned.dtype, device=x_owned.device)
        start = time.perf_counter()
        self.counters.halo_bytes += self.comm.alltoallv(send, plan.send_counts, halo, plan.recv_counts)
        self.counters.comm_s += time.perf_counter() - start
        return halo

    def drain(self) -> None:
        """Complete communication still in flight (pipelined schedules, shared halos) before the job ends."""
        self.schedule.drain(self)
        if self.shared is not None:
            self.shared.close()


class _Timed(Pending):
    """A transfer whose wait() time counts as communication time."""

    def __init__(self, inner: Pending, ex: HaloExchanger):
        super().__init__()
        self.inner, self.ex = inner, ex

    def wait(self) -> None:
        start = time.perf_counter()
        with torch.profiler.record_function("wait"):
            self.inner.wait()
        self.ex.counters.waited(time.perf_counter() - start)

    def progress(self) -> None:
        _progress(self.inner, self.ex)


class _DecodeOnWait(Pending):
    def __init__(self, inner: Pending, codec: Codec, wire: torch.Tensor, out: torch.Tensor, ex: HaloExchanger):
        super().__init__()
        self.inner, self.codec, self.wire, self.out, self.ex = inner, codec, wire, out, ex
        self.done = False

    def wait(self) -> None:
        if self.done:
            return
        start = time.perf_counter()
        with torch.profiler.record_function("wait"):
            self.inner.wait()
        self.ex.counters.waited(time.perf_counter() - start)
        self.codec.decode(self.wire, self.out)
        self.done = True

    def progress(self) -> None:
        if not self.done:
            _progress(self.inner, self.ex)


def _progress(inner: Pending, ex: HaloExchanger) -> None:
    """A transfer's progress call, timed as communication: MPI may copy the bytes inside it."""
    start = time.perf_counter()
    with torch.profiler.record_function("progress"):
        inner.progress()
    ex.counters.comm_s += time.perf_counter() - start


class _HaloGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_owned: torch.Tensor, ex: HaloExchanger, slot: str) -> torch.Tensor:  # type: ignore[override]
        ctx.ex = ex
        ctx.slot = slot
        schedule = ex.active_schedule(slot)
        ctx.schedule = schedule
        ex.activity = f"epoch {ex.epoch}: {slot} forward halo exchange"
        full, ctx.info = schedule.forward(ex, slot, x_owned.contiguous())
        return full

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):  # type: ignore[override]
        ctx.ex.activity = f"epoch {ctx.ex.epoch}: {ctx.slot} backward halo exchange"
        grad_owned = ctx.schedule.backward(ctx.ex, ctx.slot, grad_full.contiguous(), ctx.info)
        return grad_owned, None, None


PLAIN_ROWS = Codec()  # fp32 rows as they are (stateless: one serves every exchanger)


class _InputGather(torch.autograd.Function):
    """The exact exchange of a model's inputs (HaloExchanger.gather_inputs), gradients back to the owners."""

    @staticmethod
    def forward(ctx, x_owned: torch.Tensor, ex: HaloExchanger, slot: str) -> torch.Tensor:  # type: ignore[override]
        ctx.ex, ctx.slot = ex, slot
        ex.activity = f"epoch {ex.epoch}: {slot} forward exchange of input rows"
        with ex.plain_rows():
            return ex.exact_forward(x_owned.contiguous())

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):  # type: ignore[override]
        ctx.ex.activity = f"epoch {ctx.ex.epoch}: {ctx.slot} backward exchange of input rows"
        with ctx.ex.plain_rows():
            return ctx.ex.exact_backward(grad_full.contiguous()), None, None
