"""What a wrapped MessagePassing layer aggregates gets its halo rows here, through PyG's own hooks.

A layer hands `propagate` (and `edge_updater`) the node tensors it aggregates: transformed rows, attention
coefficients. The pre-hooks replace each one, x, by the pair (x with its halo rows, x): PyG's message
functions then read sources from [owned | halo] rows and targets from owned rows, so the layer computes
exactly the owned rows' outputs. The halo rows come from the rank's exchanger (gnn_dist.halo.exchange), an
autograd function whose backward returns the halo rows' gradients to their owners, under the model's schedule
and wire format: what a built-in conv sends, a user's layer sends. Which tensors are node tensors is PyG's
own rule: the arguments its message, aggregate and update functions read with a _j (source) suffix.

A layer whose input is data.x (or data.x under keyed dropout) exchanges nothing: its forward pre-hook hands
it the cached [owned | halo] rows as the pair (all rows, owned rows), or, for a layer that takes one tensor and
aggregates it linearly (GCNConv, SGConv), all rows; its propagate then reads every tensor as already complete.
The decision rests on where the input came from, the same on every rank, never on sizes (a rank with no halo
rows has as many [owned | halo] rows as owned ones, and every exchange is a collective).
"""
from __future__ import annotations

import inspect

import torch

from gnn_dist.pyg import passes
from gnn_dist.pyg.part_data import WITH_HALO

# Layers that take one node tensor (no pair), transform rows independently and aggregate them linearly, so that
# [owned | halo] input rows give the owned rows' outputs after propagate
WHOLE_ROW_LAYERS = ("GCNConv", "SGConv")


def source_arguments(names) -> set[str]:
    """The node tensors a message-passing function reads at edges' sources (PyG's _j suffix): these need halo
    rows. Those read at targets only (_i: a TransformerConv's query) are owned rows already."""
    return {name[:-2] for name in names if name.endswith("_j")}


def takes_pairs(conv) -> bool:
    """Whether the layer's forward accepts a (source rows, target rows) pair as its first input."""
    parameters = list(inspect.signature(type(conv).forward).parameters.values())[1:]
    if not parameters:
        return False
    annotation = parameters[0].annotation
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return "Pair" in text or "Tuple" in text or "tuple" in text


class LayerHooks:
    """The hooks of one MessagePassing layer (named as in the model) over one rank's part."""

    def __init__(self, conv, name: str, graph, native: bool = True):
        from gnn_dist.pyg import native_path

        self.conv, self.name, self.graph = conv, name, graph
        self.pairs = takes_pairs(conv)
        self.whole_rows = type(conv).__name__ in WHOLE_ROW_LAYERS
        self.propagated = source_arguments(conv._user_args)
        self.edge_updated = source_arguments(conv._edge_user_args)
        conv.register_forward_pre_hook(self.before_forward, with_kwargs=True)
        conv.register_forward_hook(self.after_forward)
        conv.register_propagate_forward_pre_hook(self.before_propagate)
        conv.register_propagate_forward_hook(self.after_propagate)
        # PyG's compiled edge_updater calls its pre-hooks after lifting node tensors to edges (propagate's before),
        # too late to add halo rows: the layer's own edge_updater is wrapped instead
        self.edge_updater = conv.edge_updater
        conv.edge_updater = self.extended_edge_updater
        # a linear aggregation runs on the native SpMM (gnn_dist.pyg.native_path), the rest on PyG's propagate
        self.taken: str | None = None  # the path of the last wrapped forward (set by whichever path ran)
        self.native = native_path.install(self) if native and native_path.takes_native_path(conv) else None
        self.native_forward = native_path.install_gcn_forward(self, self.native) if self.native else None
        if native and self.native_forward is None:
            self.native_forward = native_path.install_gat_forward(self)

    @property
    def path(self) -> str:
        """The path the layer took in the last wrapped forward (before any: the one it is set up to take)."""
        if self.taken is not None:
            return self.taken
        if self.native_forward is not None:
            return "native " + type(self.conv).__name__[:-4].lower()  # native gcn, native gat
        return "native spmm" if self.native is not None else "pyg"

    def extended_edge_updater(self, edge_index, size=None, **kwargs):
        extended = self._extend((edge_index, size, kwargs), self.edge_updated, "edge update ")
        if extended is None:
            return self.edge_updater(edge_index, size=size, **kwargs)
        edge_index, size, kwargs = extended
        try:
            return self.edge_updater(edge_index, size=size, **kwargs)
        finally:
            passes.current().edges = None

    def _active(self):
        active = passes.current()
        return active if active is not None and active.graph is self.graph else None

    def before_forward(self, conv, args, kwargs):
        active = self._active()
        if active is None:
            return None
        x = args[0] if args else kwargs.get("x")
        full = getattr(x, WITH_HALO, None) if isinstance(x, torch.Tensor) else None
        if full is None or not (self.pairs or self.whole_rows):
            return None
        replacement = (full, x) if self.pairs else full
        active.full_input.add(self.name)
        if args:
            return (replacement, *args[1:]), kwargs
        return args, {**kwargs, "x": replacement}

    def after_forward(self, conv, args, output):
        active = self._active()
        if active is not None:
            active.full_input.discard(self.name)

    def before_propagate(self, conv, inputs):
        if self._active() is not None:
            self.taken = "pyg"
        return self._extend(inputs, self.propagated, "")

    def after_propagate(self, conv, inputs, output):
        active = self._active()
        if active is not None:
            active.edges = None
            # a later propagate of the same forward (SGConv's K hops) aggregates owned rows it computed itself
            active.full_input.discard(self.name)


    def _extend(self, inputs, arguments, what: str):
        active = self._active()
        if active is None:
            return None
        edge_index, size, kwargs = inputs
        suffix = active.call_suffix(self.name)
        complete = self.name in active.full_input
        graph = self.graph
        extended = dict(kwargs)
        for argument in arguments:
            value = kwargs.get(argument)
            if isinstance(value, torch.Tensor):
                source, target = value, value
            elif isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], torch.Tensor):
                source, target = value
            else:
                continue
            if complete:
                graph.check_complete(source, f"{self.name} {what}{argument}{suffix}")
                if target is source:
                    target = source[:graph.n_owned]
            else:
                source = graph.with_halo(source, f"{self.name} {what}{argument}{suffix}")
            extended[argument] = (source, target)
        if isinstance(edge_index, torch.Tensor) and edge_index.layout == torch.strided:
            active.edges = edge_index
        return edge_index, None, extended


def with_halo(x: torch.Tensor) -> torch.Tensor:
    """[owned | halo] rows of a node tensor, for a user's own code outside a conv (x[edge_index[0]]): the
    exact exchange, differentiable, a collective (every rank calls it alike). Inside a wrapped forward it
    uses that model's part, elsewhere the part this thread loaded last.

    Shapes: [n_owned, *] -> [n_owned + n_halo, *]
    """
    active = passes.current()
    graph = active.graph if active is not None else passes.last_loaded()
    if graph is None:
        raise RuntimeError("gd.with_halo needs a part: call it inside a distributed model's forward, or after "
                           "gd.load_partition")
    return graph.with_halo(x, "with_halo" + (active.call_suffix("with_halo") if active is not None else ""))
