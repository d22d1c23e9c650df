"""The base class of every registered model's distributed layer (`DistConv`), and the initialisers they share.

A layer sees only its rank's rows. It aggregates over [owned | halo] columns
with the rank's local sparse operator and fetches halo rows through the
`HaloExchanger` (the layer holds the exchanger, never the communicator).

Order of operations: A (X W) equals (A X) W, so a layer either transforms
then aggregates or aggregates then transforms. The exchanged matrix is the
one that gets aggregated, so the layer picks the narrower of in/out width
(`aggregate_first = in_dim <= out_dim`), which also does the SpMM on the
narrower matrix. The first layer exchanges nothing per epoch: its halo
inputs are the cached input features, so the model passes the whole
[owned | halo] input as `x_full` and no exchange happens.
"""
from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from gnn_dist.halo.blocks import BlockedOperator, aggregate_exchanged, aggregate_local
from gnn_dist.halo.exchange import HaloExchanger
from gnn_dist.halo.overlap import overlapped_aggregation
from gnn_dist.kernels.spmm import SparseOperator, spmm, spmm_into


def glorot_(weight: torch.Tensor, generator: torch.Generator | None = None) -> None:
    """PyG's glorot (uniform in +-sqrt(6 / (fan_in + fan_out))), used by GCNConv."""
    bound = math.sqrt(6.0 / (weight.shape[0] + weight.shape[1]))
    with torch.no_grad():
        weight.uniform_(-bound, bound, generator=generator)


def with_self_loops(rows, cols, start: int, n_rows: int):
    """COO entries (numpy or torch) plus one self loop per row: row r's column is start + r (its own node)."""
    if isinstance(rows, np.ndarray):
        loops = np.arange(n_rows, dtype=np.int64)
        return np.concatenate([rows, loops]), np.concatenate([cols, loops + start])
    loops = torch.arange(n_rows, dtype=torch.int64, device=rows.device)
    return torch.cat([rows, loops]), torch.cat([cols, loops + start])


def aggregating_first_is_cheaper(in_dim: int, out_dim: int, n_src: int, n_dst: int, entries: int) -> bool:
    """Whether (A X) W costs no more multiply-adds than A (X W) on a block A [n_dst, n_src] with `entries` entries.

    Transforming first multiplies every source row by W and aggregates out-wide rows; aggregating first
    aggregates in-wide rows and multiplies only the targets. On a whole graph the rows are the same on both
    sides and the narrower width decides (DistConv.aggregation); a sampled block has several times more
    sources than targets, so a layer that narrows (a classifier's last: 256 in, a few dozen out) is cheaper
    aggregating first there too. (A root term, x_i W_r, costs the same either way.)
    """
    return entries * in_dim + n_dst * in_dim * out_dim <= n_src * in_dim * out_dim + entries * out_dim


def linear_uniform_(linear: nn.Linear, generator: torch.Generator | None = None) -> None:
    """torch.nn.Linear's default initialisation (what PyG's SAGEConv uses), from a given generator."""
    bound = 1.0 / math.sqrt(linear.in_features) if linear.in_features else 0.0
    with torch.no_grad():
        linear.weight.uniform_(-bound, bound, generator=generator)
        if linear.bias is not None:
            linear.bias.uniform_(-bound, bound, generator=generator)


class DistConv(nn.Module):
    """A registered model's layer (gnn_dist.models): the full-graph forward over [owned | halo] columns, the
    sampled-block forward, and what the rest of the system asks of a model.

    A subclass sets `name` (its --model NAME), `needs_root` (whether `update` takes the rows' own input)
    and `self_loops` (whether its operator adds one entry per row, for the memory plan), `block_order_by_work`
    where its forward_block aggregates first whenever aggregates_block_first says so, and defines:

        reset_parameters(generator)   initial weights from a private generator
        transform(h)                  the rows it aggregates: h, or h times its weight when the output is narrower
        aggregation_bias              the bias fused into the aggregation of transformed rows, else None
        update(aggregated, root)   output rows from their aggregation (and their own input when needs_root)
        normalise(rows, cols, deg, start, n_rows)   the full-graph operator's entries of a row range
        block_operator(block, with_transpose)   a sampled block's operator (its transpose only when asked:
                                          block_needs_transpose says when)
        pyg_spec(in_dim, out_dim) or pyg_conv(in_dim, out_dim), pyg_parameter_names()
                                          the PyG layer the tests compare it with (and `gnn-dist export` writes:
                                          pyg_spec names its class and arguments, so only a layer with one exports)
        pyg_block_conv(in_dim, out_dim)   optional: what its forward_block equals in PyG on a sampled block
                                          (default: pyg_conv on the bipartite pair of the block's rows)

    Shapes:
        x: [n_owned, in_dim], or x_full: [n_owned + n_halo, in_dim] (halo known) -> [n_owned, out_dim]
    """

    name: ClassVar[str] = ""
    needs_root: ClassVar[bool] = False
    self_loops: ClassVar[bool] = False
    # Attention: the aggregation's weights come from the rows (the layer transforms first, keeps the aggregated
    # rows for its backward, and that backward holds two [entries x heads] buffers: for the memory plan).
    attention: ClassVar[bool] = False
    multi_head: ClassVar[bool] = False  # whether --heads applies (hidden layers then output heads * hidden columns)
    # Whether transform() multiplies through gnn_dist.nn.sparse_features.linear, so a first layer given the CSR copy
    # of mostly-zero input features (input_features) multiplies sparsely.
    takes_sparse_input: ClassVar[bool] = False
    # Whether forward_block takes either order on a sampled block, so block_aggregation may pick the one with
    # fewer multiply-adds there rather than aggregation()'s whole-graph order.
    block_order_by_work: ClassVar[bool] = False
    # Set by the model stack: the original ids of the operator's columns ([owned | halo], rows first), and the
    # key of the current pass and layer, for randomness inside the layer that every P must draw alike.
    column_ids: torch.Tensor | None = None
    pass_key: int | None = None

    def __init__(self, in_dim: int, out_dim: int, operator: SparseOperator | None, exchanger: HaloExchanger | None,
                 slot: str, blocked: BlockedOperator | None = None):
        super().__init__()
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.operator = operator
        self.exchanger = exchanger
        self.slot = slot
        self.blocked = blocked
        # A (X W) = (A X) W: aggregate the narrower of the input and the output (it is also what travels), unless
        # the model says otherwise (aggregation()).
        self.aggregate_first = type(self).aggregation(in_dim, out_dim)[0]
        # the first layer's CSR copy of the input features, where setup made one (gnn_dist.nn.sparse_features)
        self.input_features = None
        if exchanger is not None and not self.attention:
            # a linear aggregation renormalises rows a schedule leaves out (_conv_forward's aggregation_scale)
            exchanger.renormalising_slots.add(slot)

    @classmethod
    def layer_options(cls, config, layer: int, num_layers: int) -> dict:
        """Keyword arguments of layer `layer`'s constructor beyond the widths (GAT: its heads), from the ModelConfig."""
        return {}

    @classmethod
    def exchanged_width(cls, in_dim: int, out_dim: int, **layer_options) -> int:
        """Width of the rows this layer puts on the wire (when its inputs are not the cached features)."""
        return cls.aggregation(in_dim, out_dim, **layer_options)[1]

    @classmethod
    def aggregation(cls, in_dim: int, out_dim: int, **layer_options) -> tuple[bool, int]:
        """(whether the layer aggregates its input before transforming it, the width of the rows it aggregates):
        the narrower side, A (X W) = (A X) W. The memory plan and the byte prediction ask this."""
        return in_dim <= out_dim, min(in_dim, out_dim)

    @classmethod
    def block_aggregation(cls, in_dim: int, out_dim: int, n_src: int, n_dst: int, entries: int,
                          **layer_options) -> tuple[bool, int]:
        """aggregation() for a sampled block of n_src source rows, n_dst targets and `entries` operator entries:
        the same, unless the model's forward_block takes either order (block_order_by_work); then aggregating
        first wherever that makes fewer multiply-adds (aggregating_first_is_cheaper). The sampled step, its
        operators' transposes and the sampled memory plan ask this."""
        if cls.block_order_by_work and aggregating_first_is_cheaper(in_dim, out_dim, n_src, n_dst, entries):
            return True, in_dim
        return cls.aggregation(in_dim, out_dim, **layer_options)

    def aggregates_block_first(self, n_src: int, n_dst: int, entries: int) -> bool:
        """Whether forward_block aggregates a block's rows before transforming them (block_aggregation); entries
        are its operator's: the sampled edges, and one per target where the model adds self loops."""
        return type(self).block_aggregation(self.in_dim, self.out_dim, n_src, n_dst, entries)[0]

    def aggregates_operator_first(self, block_op: SparseOperator) -> bool:
        """aggregates_block_first for a built block operator (what forward_block asks)."""
        n_dst, n_src = block_op.shape
        return self.aggregates_block_first(n_src, n_dst, block_op.nnz)

    @classmethod
    def update_memory(cls, in_dim: int, out_dim: int, **layer_options) -> tuple[int, int]:
        """(columns per row that `update` allocates while it runs beyond its output, columns per row it keeps
        for the backward beyond its input): what the memory plan charges the update with. A linear update
        keeps nothing of its own."""
        return 0, 0

    @classmethod
    def parameter_count(cls, in_dim: int, out_dim: int, **layer_options) -> int:
        return sum(p.numel() for p in cls(in_dim, out_dim, None, None, "count", **layer_options).parameters())

    @classmethod
    def pyg_spec(cls, in_dim: int, out_dim: int, **layer_options) -> tuple[str, dict] | None:
        """("module.Class", keyword arguments) of the PyG layer this one equals, in JSON (gnn-dist export writes it);
        None when it has none that plain arguments build."""
        return None

    @classmethod
    def pyg_conv(cls, in_dim: int, out_dim: int, **layer_options) -> nn.Module:
        """The PyG layer this one equals (the tests' reference): pyg_spec's, unless a model builds its own."""
        spec = cls.pyg_spec(in_dim, out_dim, **layer_options)
        if spec is None:
            raise NotImplementedError(f"--model {cls.name} names no PyG layer (pyg_spec or pyg_conv)")
        return build_module(*spec)

    @classmethod
    def pyg_block_conv(cls, in_dim: int, out_dim: int, **layer_options) -> nn.Module:
        """The PyG computation forward_block equals on a sampled block (tests compare them): a module called as
        module(h_src, n_dst, edge_index) -> [n_dst, out_dim] whose `reference` holds the parameters named as
        pyg_parameter_names() says. By default pyg_conv applied to the pair (h_src, h_src[:n_dst])."""
        return PygOnBlock(cls.pyg_conv(in_dim, out_dim, **layer_options), lambda conv, h, n_dst, edges:
                          conv((h, h[:n_dst]), edges))

    def combine(self, op: SparseOperator, source: torch.Tensor, root: torch.Tensor | None) -> torch.Tensor:
        """Output rows of op's rows from the rows `source` it aggregates (and `root`, those rows' own input)."""
        aggregated = spmm(op, source, self.aggregation_bias)
        with torch.profiler.record_function("dense"):
            return self.update(aggregated, root)

    def forward(self, x: torch.Tensor | None = None, x_full: torch.Tensor | None = None,
                halo_source=None) -> torch.Tensor:
        return _conv_forward(self, x, x_full, halo_source)

    @classmethod
    def block_needs_transpose(cls, aggregate_first: bool, input_needs_grad: bool) -> bool:
        """Whether a layer's sampled-block operator needs its transpose: a gradient flows back through the
        aggregation when the layer's input needs one, or when it aggregates rows its weight transformed. (The
        input layer aggregating the features first needs none: half the block's set-up.)"""
        return input_needs_grad or not aggregate_first

    @classmethod
    def block_input_gradients(cls, aggregate_first: bool) -> int:
        """How many [source rows, in] tensors a block's backward makes for its input's gradient (for the memory
        plan): the aggregation's, and where the root term is a separate node, the root rows' in a zero-filled
        one that autograd adds to it."""
        return 2 if cls.needs_root else 1

    def forward_block(self, h_src: torch.Tensor, block_op: SparseOperator, ids: torch.Tensor | None = None):
        """One sampled block: block_op [n_dst, n_src] already holds the normalisation (and any self loops);
        ids are the original ids of the block's source rows (destinations first)."""
        return self.combine(block_op, self.transform(h_src), h_src[:block_op.shape[0]] if self.needs_root else None)

    def aggregate_rows(self, start: int, stop: int, from_owned: SparseOperator, from_halo: SparseOperator,
                       owned: torch.Tensor, halo: torch.Tensor) -> torch.Tensor:
        """Evaluation's chunk of rows [start, stop): their aggregation of transformed owned and halo rows, the
        operator's rows split at the owned/halo column boundary (no [owned | halo] copy)."""
        aggregated = spmm(from_owned, owned, self.aggregation_bias)
        if halo.shape[0]:
            aggregated += spmm(from_halo, halo)
        return aggregated

    def aggregate_chunk(self, chunk, owned: torch.Tensor, halo: torch.Tensor) -> torch.Tensor:
        """Evaluation's chunk (gnn_dist.graph.local_graph.RowChunk): aggregate_rows on its operator rows split at the
        owned/halo boundary. A model that keeps the default aggregate_rows (two linear products) gets them from
        the operator's entry ranges in place instead: the same sums, without copying the chunk's entries into
        two operators every evaluation (at P=2 on sbm60k that copy was a quarter of evaluation's time)."""
        if type(self).aggregate_rows is not DistConv.aggregate_rows:
            return self.aggregate_rows(chunk.start, chunk.stop, *chunk.split_operators(), owned, halo)
        matrix, begin, mid, end = chunk.ranges()
        aggregated = torch.empty(chunk.stop - chunk.start, owned.shape[1], dtype=owned.dtype, device=owned.device)
        with torch.profiler.record_function("spmm"):
            spmm_into(matrix, begin, mid, owned, aggregated, bias=self.aggregation_bias)
            if halo.shape[0]:
                spmm_into(matrix, mid, end, halo, aggregated, col_offset=owned.shape[0], accumulate=True)
        return aggregated


def build_module(path: str, kwargs: dict) -> nn.Module:
    """A module from its dotted class path and keyword arguments (what an exported model's JSON lists)."""
    import importlib

    module_name, _, class_name = path.rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)(**kwargs)


class PygOnBlock(nn.Module):
    """A PyG layer called on a sampled block's rows the way one model's forward_block reads them."""

    def __init__(self, reference: nn.Module, call):
        super().__init__()
        self.reference = reference
        self.call = call

    def forward(self, h_src: torch.Tensor, n_dst: int, edge_index: torch.Tensor) -> torch.Tensor:
        return self.call(self.reference, h_src, n_dst, edge_index)


def _conv_forward(conv, x, x_full: torch.Tensor | None, halo_source=None) -> torch.Tensor:
    """Whole-part forward of a conv: aggregate over [owned | halo] rows with the part's operator.

    x is the owned input rows, or a one-element list holding them: then the
    conv takes the only reference and frees the rows as soon as nothing needs
    them (a GCN layer that aggregates first needs its input only until the
    aggregation, so the layer's input and its output are never alive together).

    Resident (conv.blocked is None): with x_full (the cached [owned | halo]
    inputs of the first layer) nothing is exchanged; otherwise the transformed
    owned rows travel through the halo exchange, so the narrower of the two
    widths goes on the wire. An exact exchange of a linear layer travels while
    the owned columns' share is multiplied (gnn_dist.halo.overlap).

    Sequential (conv.blocked set, gnn_dist.halo.blocks): x is the owned rows;
    the halo rows either travel block by block, or, for the first layer, come
    from halo_source(start, stop) one block at a time (cached input features).
    """
    if isinstance(x, list):
        x = x.pop()
    if x_full is not None:
        with torch.profiler.record_function("dense"):
            source = conv.transform(x_full)
        root = x_full[:conv.operator.shape[0]] if conv.needs_root else None
        return conv.combine(conv.operator, source, root)
    with torch.profiler.record_function("dense"):
        source = conv.transform(x)
    root = x if conv.needs_root else None
    del x
    if halo_source is None:
        # The schedule may reweight each row's aggregation (bns, adaptive: the rows still present to the whole
        # row's weight), then the bias comes after the factor.
        reweights = conv.exchanger.reweights_rows(conv.slot)
        bias = None if reweights else conv.aggregation_bias
        if conv.blocked is None and conv.exchanger.overlapped(conv.slot, conv.attention):
            aggregated = overlapped_aggregation(conv.operator, conv.exchanger, source, bias, conv.slot)
        elif conv.blocked is None:
            aggregated = spmm(conv.operator, conv.exchanger.gather(source, conv.slot), bias)
        else:
            aggregated = aggregate_exchanged(conv.blocked, conv.exchanger, source, bias, conv.slot)
        if reweights:
            # asked after the exchange: adaptive decides there which blocks came
            scale = conv.exchanger.aggregation_scale(conv.slot, conv.operator if conv.blocked is None else conv.blocked)
            if scale is not None:  # in place: the aggregation's backward keeps no output to overwrite
                aggregated = aggregated.mul_(scale)
            if conv.aggregation_bias is not None:
                aggregated = aggregated.add_(conv.aggregation_bias)
    else:
        aggregated = aggregate_local(conv.blocked, source, lambda start, stop: conv.transform(halo_source(start, stop)),
                                     conv.aggregation_bias)
    del source
    with torch.profiler.record_function("dense"):
        return conv.update(aggregated, root)
