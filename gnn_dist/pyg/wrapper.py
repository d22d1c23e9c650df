"""gd.distribute: an unmodified PyG model over a rank's part, exact at any P.

The wrapper adds no layer and renames no parameter (state_dict() has the model's own keys; .module is the
model). It checks once that every layer can be exact under halo exchange, hooks each MessagePassing layer
(gnn_dist.pyg.halo_hooks), broadcasts the parameters from rank 0, and after each backward sums the gradients
over ranks: one Allreduce of every parameter's gradient in parameters() order, a parameter that got no
gradient on a rank counting as zero, so every rank joins it whatever its loss touched.
"""
from __future__ import annotations

import torch
from torch import nn

from gnn_dist.pyg import dropout as keyed_dropout
from gnn_dist.pyg import gcn_norm, passes, reductions
from gnn_dist.pyg.batch_norm import synchronise
from gnn_dist.pyg.batch_norm import unsupported as unsupported_norm
from gnn_dist.pyg.halo_hooks import LayerHooks
from gnn_dist.pyg.native_path import install_batch_path
from gnn_dist.pyg.part_data import graph_of
from gnn_dist.schedules import parse_schedule
from gnn_dist.steps.flat import pack_into, unpack_from

# Schedules that reweight each row's aggregation by the halo rows present (bns, adaptive) need the layer's
# aggregation operator, which a PyG layer does not expose; the others move rows and nothing more.
ROW_SCHEDULES = ("exact", "stale", "pipeline")
# Layers whose output row depends on rows beyond its in-edges and their sources
REFUSED_LAYERS = {
    "DynamicEdgeConv": "it builds a k-nearest-neighbour graph over every node, which no rank holds",
    "PairNorm": "it normalises by statistics over every node, which it computes on the rank's rows only",
    "InstanceNorm": "it normalises by statistics over every node, which it computes on the rank's rows only",
    "DiffGroupNorm": "it normalises by statistics over every node, which it computes on the rank's rows only",
    "ChebConv": "it builds its Laplacian from the edges it is given (every node's out-degree), which a part "
                "does not hold; not supported by gd.distribute yet",
    "GraphNorm": "its statistics are per graph of a batch over every node; over every rank's rows it is not "
                 "supported by gd.distribute yet",
}
# Aggregations whose result depends on the order of a row's in-edges, which a part does not keep
ORDERED_AGGREGATIONS = ("LSTMAggregation", "GRUAggregation", "SortAggregation", "SetTransformerAggregation",
                        "MLPAggregation", "EquilibriumAggregation")


def refusal(model: nn.Module, data, schedule: str) -> str | None:
    """Why gd.distribute cannot make this model exact on a partition (one line naming the layer), or None."""
    from torch_geometric.nn import MessagePassing

    if isinstance(model, DistributedModel):
        return "gd.distribute was given a model it already distributed: pass model.module, or keep the wrapped one"
    if type(model).__name__ == "OptimizedModule":
        return ("gd.distribute was given a torch.compile'd model: PyG's propagate hooks, which carry the halo rows, "
                "do not run under torch.compile; distribute the model itself")
    kinds = {s.kind for s in parse_schedule(schedule).per_layer(1)}
    if not kinds <= set(ROW_SCHEDULES):
        return (f"--schedule {schedule}: gd.distribute supports {', '.join(ROW_SCHEDULES)} (bns and adaptive "
                f"reweight a layer's aggregation, which a PyG layer does not expose)")
    if data.x.dim() == 2:
        first = next((m for m in model.modules() if isinstance(getattr(m, "in_channels", None), int)), None)
        if first is not None and first.in_channels > 0 and first.in_channels != data.x.shape[1]:
            return (f"the model's first layer {type(first).__name__} takes in_channels={first.in_channels} but the "
                    f"partition has {data.x.shape[1]} features: build it with in_channels=data.num_features")
    for name, module in model.named_modules():
        kind = type(module).__name__
        where = f"layer {name or 'model'} ({kind})"
        if kind in REFUSED_LAYERS:
            return f"{where} cannot be exact on a partition: {REFUSED_LAYERS[kind]}"
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and unsupported_norm(module):
            return f"{where}: {unsupported_norm(module)}"
        if isinstance(module, MessagePassing):
            if module.flow != "source_to_target":
                return (f"{where} uses flow='target_to_source': a part holds each owned node's in-edges only; "
                        f"use the default flow")
            aggregation = type(getattr(module, "aggr_module", None)).__name__
            if aggregation in ORDERED_AGGREGATIONS:
                return (f"{where} aggregates with {aggregation}, whose result depends on the order of a node's "
                        f"in-edges, which a part does not keep; use a sum, mean or max aggregation")
    return None


class _SumGradientsAfterBackward(torch.autograd.Function):
    """Identity on the model's output whose backward (the first node of the model's backward) has the gradient
    sum queued for the end of the whole backward pass."""

    @staticmethod
    def forward(ctx, out, model):  # type: ignore[override]
        ctx.model = model
        return out.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        ctx.model._queue_gradient_sum()
        return grad, None


class DistributedModel(nn.Module):
    """A PyG model on a rank's part. Call it as the model itself; it returns one row per owned node."""

    def __init__(self, module: nn.Module, data, schedule: str = "exact", halo_dtype: str | None = None,
                 native: bool = True):
        super().__init__()
        self.module = module
        # data=None: mini-batches (gd.NeighborLoader's), whole subgraphs that need no halo: the model runs as it
        # is, and only its parameters' broadcast and its gradients' sum are distributed
        self._graph = graph_of(data) if data is not None else None
        self._ctx = self._graph.ctx if self._graph is not None else reductions.context()
        # dropout's seed: rank 0's, so every rank draws the same masks
        self.seed = int(self._ctx.comm.allgather_object(torch.initial_seed() % (1 << 31))[0])
        self.step = 0
        self._hooks = []
        if self._graph is None:
            keyed_dropout.install()  # a batch's rows keyed by (seed, step, rank, row): torch's bernoulli is slow
            if native:
                install_batch_path(module)  # linear aggregations of a batch on the native CSR product
        if self._graph is not None:
            self._graph.configure(schedule, halo_dtype, self.seed)
            gcn_norm.install()
            keyed_dropout.install()
            from torch_geometric.nn import MessagePassing

            self._hooks = [LayerHooks(m, name, self._graph, native) for name, m in module.named_modules()
                           if isinstance(m, MessagePassing)]
            for norm in module.modules():
                if isinstance(norm, nn.BatchNorm1d):
                    synchronise(norm, self._graph)
        self._lazy = any(_is_lazy(p) for p in module.parameters())
        self._broadcast_parameters()
        self._sum_queued = False
        self._before: dict = {}

    @property
    def graph(self):
        """The part's halo graph (gnn_dist.pyg.part_data.PartGraph); None for a model of mini-batches."""
        return self._graph

    @property
    def ctx(self):
        return self._ctx

    def paths(self) -> dict[str, str]:
        """Which path each message-passing layer took in the last forward: "native gcn" (a GCNConv ordered as
        --model gcn, on the native SpMM), "native gat" (a GATConv on the built-in attention kernels), "native
        spmm" (a linear aggregation on gnn-dist's CSR product; gnn_dist.pyg.native_path) or "pyg" (PyG's own
        message passing over [owned | halo] rows)."""
        if self._graph is None:  # mini-batches: the batch path of each layer (gnn_dist.pyg.native_path)
            from torch_geometric.nn import MessagePassing

            return {name: getattr(m.propagate, "path", "pyg") for name, m in self.module.named_modules()
                    if isinstance(m, MessagePassing)}
        return {hooks.name: hooks.path for hooks in self._hooks}

    def forward(self, *args, **kwargs):
        if self._lazy:
            self._materialise(*args, **kwargs)
        graph = self._graph
        if graph is None:
            active = passes.BatchPass(seed=self.seed, step=self.step, rank=self._ctx.rank)
            with passes.running_batches(active):
                out = self.module(*args, **kwargs)
        else:
            graph.exchanger.begin_pass(self.step, self.training)
            with passes.running(passes.Pass(graph=graph, seed=self.seed, step=self.step, training=self.training)):
                out = self.module(*args, **kwargs)
        if self.training:
            self.step += 1
        if torch.is_grad_enabled():
            out = _map_tensors(out, lambda t: _SumGradientsAfterBackward.apply(t, self) if t.requires_grad else t)
        return out

    def _materialise(self, *args, **kwargs) -> None:
        """Lazy layers (in_channels=-1) take their widths from a first forward, and each rank would draw its own
        initial values: a forward without gradients gives them their widths, rank 0's values are broadcast,
        and only then does the real forward run, so even the first step is the same at every P."""
        if self._graph is None:
            with torch.no_grad():
                self.module(*args, **kwargs)
        else:
            self._graph.exchanger.begin_pass(self.step, False)  # exact, and no schedule keeps anything of it
            with torch.no_grad(), passes.running(passes.Pass(graph=self._graph, seed=self.seed, step=self.step,
                                                             training=False)):
                self.module(*args, **kwargs)
        self._lazy = any(_is_lazy(p) for p in self.module.parameters())
        if self._lazy:
            raise ValueError("a forward left some lazy parameters without a width: gd.distribute needs every "
                             "parameter initialised by the model's first forward")
        self._broadcast_parameters()

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def _parameters_in_order(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad and not _is_lazy(p)]

    def _broadcast_parameters(self) -> None:
        tensors = [p for p in self.module.parameters() if not _is_lazy(p)]
        tensors += [b for b in self.module.buffers() if b.is_floating_point() and not _is_lazy(b)]
        if not tensors or self._ctx.size == 1:
            return
        for group in _by_dtype(tensors):
            flat = torch.empty(sum(t.numel() for t in group), dtype=group[0].dtype, device=group[0].device)
            pack_into(group, flat, grads=False)
            self._ctx.comm.bcast_(flat, root=0)
            unpack_from(group, flat, grads=False)

    def _queue_gradient_sum(self) -> None:
        if self._sum_queued:
            return
        self._sum_queued = True
        # Gradients accumulated by earlier backwards were summed then: set them aside, so that this backward's
        # own gradients alone are summed, and add them back after.
        self._before = {}
        for p in self._parameters_in_order():
            if p.grad is not None:
                self._before[id(p)], p.grad = p.grad, None
        torch.autograd.Variable._execution_engine.queue_callback(self._sum_gradients)

    def _sum_gradients(self) -> None:
        self._sum_queued = False
        params = self._parameters_in_order()
        if self._ctx.size > 1:
            # the exchanger's allreduce counts the bytes (and beats the watchdog); mini-batches use the world's
            reduce = self._graph.exchanger.allreduce_ if self._graph is not None else self._ctx.comm.allreduce_
            for group in _by_dtype(params):  # a parameter without a gradient here counts as zero
                flat = torch.empty(sum(p.numel() for p in group), dtype=group[0].dtype, device=group[0].device)
                pack_into(group, flat, grads=True)
                reduce(flat)
                unpack_from(group, flat, grads=True)
        for p in params:
            before = self._before.get(id(p))
            if before is not None:
                p.grad = before if p.grad is None else before.add_(p.grad)
        self._before = {}


def _by_dtype(tensors: list) -> list[list]:
    """The tensors grouped by dtype, each group in the given order and the groups in a fixed order (one flat
    buffer a group, the same on every rank)."""
    return [[t for t in tensors if t.dtype == dtype] for dtype in sorted({t.dtype for t in tensors}, key=str)]


def _is_lazy(tensor) -> bool:
    return isinstance(tensor, nn.parameter.UninitializedTensorMixin)


def _map_tensors(out, fn):
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, tuple):
        return tuple(_map_tensors(o, fn) for o in out)
    if isinstance(out, list):
        return [_map_tensors(o, fn) for o in out]
    if isinstance(out, dict):
        return {k: _map_tensors(v, fn) for k, v in out.items()}
    return out


def distribute(model: nn.Module, data=None, schedule: str = "exact", halo_dtype: str | None = None,
               native: bool = True) -> DistributedModel:
    """The model over this rank's part: every MessagePassing layer aggregates its owned rows' in-edges over
    [owned | halo] rows, parameters start as rank 0's and gradients are summed over ranks after each backward.

    schedule: any of --schedule's exact, stale:R, pipeline (per exchanged layer as in gnn-dist train);
    halo_dtype: fp32 (default), fp16, bf16 or int8 for what travels; native: linear aggregations on the
    native SpMM (False: every layer on PyG's own propagate; paths() tells which). A layer that cannot be exact
    raises ValueError naming it, on every rank alike.
    """
    if data is None:
        if isinstance(model, DistributedModel):
            raise ValueError(refusal(model, None, schedule))
        if schedule != "exact" or halo_dtype not in (None, "fp32"):
            raise ValueError("gd.distribute(model) without data trains on mini-batches, whose subgraphs need no "
                             "halo: a schedule or halo_dtype applies with data (full-batch)")
        return DistributedModel(model, None, native=native)
    graph_of(data)
    why = refusal(model, data, schedule)
    if why is not None:
        raise ValueError(why)
    return DistributedModel(model, data, schedule, halo_dtype, native)
