"""R-GCN (Schlichtkrull et al.) as PyG's RGCNConv(aggr='mean') computes it, on a typed graph's relations.

    out_i = x_i Root + sum over relations r of (mean over j in N_r(i) of x_j) W_r + bias

A relation with no edge into i contributes nothing. `--num-bases B` shares the relation weights out of B bases,
W_r = sum_b comp[r, b] V_b, as PyG's num_bases does. A layer aggregates its input rows first (they are what
travels, at the input width) and transforms after.

Each relation is aggregated first or transformed first, whichever multiplies fewer rows by its weight
(gnn_dist.hetero.typed_part.RelationOperator): the relations aggregated first share one sparse product over
[owned | halo] rows, a block of rows per relation (only the nodes it reaches), each block then times its
weight; a relation transformed first multiplies only its sources' rows, then takes their mean at the output
width. Either way the sum lands in the nodes' rows, so a weight never meets a row its relation leaves empty.

The last layer of a typed stack computes the target type's rows only (restrict_output): its root term for
those rows, and only the relations into the target type; on ogbn-mag's shape the papers are 38% of the nodes
and three of seven relations end at them, so the class-wide products of the other types are never made.

The typed inputs (a Linear per featured type, an embedding table per featureless one) and the stack of layers
are gnn_dist.hetero's: this file is the layer alone.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from gnn_dist.halo.blocks import aggregate_exchanged
from gnn_dist.kernels.spmm import spmm
from gnn_dist.models.registry import register_model
from gnn_dist.models.relational import RelationConv, add_rows_, times


def glorot_3d_(tensor: torch.Tensor, generator: torch.Generator | None = None) -> None:
    """PyG's glorot on a [..., fan_in, fan_out] tensor: uniform in +-sqrt(6 / (fan_in + fan_out))."""
    bound = math.sqrt(6.0 / (tensor.shape[-2] + tensor.shape[-1]))
    with torch.no_grad():
        tensor.uniform_(-bound, bound, generator=generator)


@register_model
class DistRGCNConv(RelationConv):
    name = "rgcn"
    needs_root = True
    basis_decomposition = True  # --num-bases applies

    def __init__(self, in_dim, out_dim, operator, exchanger, slot, blocked=None, num_relations: int = 1,
                 num_bases: int = 0):
        super().__init__(in_dim, out_dim, operator, exchanger, slot, blocked)
        self.num_relations = num_relations
        self.num_bases = num_bases
        if num_bases > 0:
            self.basis = nn.Parameter(torch.empty(num_bases, in_dim, out_dim))  # host: moved with its module
            self.comp = nn.Parameter(torch.empty(num_relations, num_bases))  # host: moved with its module
        else:
            self.weight = nn.Parameter(torch.empty(num_relations, in_dim, out_dim))  # host: moved with its module
        self.root = nn.Parameter(torch.empty(in_dim, out_dim))  # host: moved with its module
        self.bias = nn.Parameter(torch.zeros(out_dim))  # host: moved with its module
        self.sequential_halos = False  # build_forms(halo_blocking=...): relations with halo sources aggregated first
        self.reset_parameters()

    @classmethod
    def layer_options(cls, config, layer: int, num_layers: int) -> dict:
        return {"num_bases": config.num_bases}

    @classmethod
    def aggregation(cls, in_dim: int, out_dim: int, **layer_options) -> tuple[bool, int]:
        return True, in_dim  # the input rows travel and are aggregated, per relation, before the weights

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        # PyG's RGCNConv: glorot on the weight (or the bases and their coefficients) and the root, zero bias
        if self.num_bases > 0:
            glorot_3d_(self.basis, generator)
            glorot_3d_(self.comp, generator)
        else:
            glorot_3d_(self.weight, generator)
        glorot_3d_(self.root, generator)
        with torch.no_grad():
            self.bias.zero_()

    def relation_weights(self) -> torch.Tensor:
        """[R, in, out]: the relations' weights (from the bases when there are some)."""
        if self.num_bases > 0:
            return (self.comp @ self.basis.reshape(self.num_bases, -1)).reshape(self.num_relations, self.in_dim,
                                                                              self.out_dim)
        return self.weight

    def forward(self, x: torch.Tensor | list | None = None, x_full: torch.Tensor | None = None,
                halo_source=None) -> torch.Tensor:
        """x: [n_owned, in] (the halo's rows arrive through the exchange), or x_full: [n_owned + n_halo, in]
        (the first layer: the typed inputs, halo rows included). Returns [n_owned, out]."""
        if isinstance(x, list):
            x = x.pop()
        if self.blocked is not None:
            return self._forward_sequential(x)
        full = x_full if x_full is not None else self.exchanger.gather(x, self.slot)
        relations = self.operator
        weights = self.relation_weights()
        if self.output_rows is not None:  # only these rows: their root term, the relations into them
            own = full.index_select(0, self.output_rows)
        elif full.shape[0] == relations.n_owned:
            own = full  # a rank without halo rows (P=1): a slice's backward would copy the whole input
        else:
            own = full[:relations.n_owned]
        out = times(own, self.root, self.bias)
        first = self._plan()
        scale = self._relation_scale() if x_full is None else None
        if first["aggregate"]:  # one product aggregates these relations; each block then meets its weight
            add_aggregated_(out, spmm(relations.stacked(first["aggregate"]), full), relations, first["aggregate"],
                            self._nodes, weights, scale)
        self._add_transformed(out, full, first["transform"], weights, scale)
        return out

    def _add_transformed(self, out: torch.Tensor, x: torch.Tensor, transformed: tuple, weights: torch.Tensor,
                         scale: torch.Tensor | None) -> None:
        """Add the relations whose sources are transformed first, then aggregated at the output width, into out:
        their sources' rows of x (with sequential halos, only relations whose sources are all owned)."""
        if not transformed:
            return
        relations = self.operator
        gathered = [relations.gathered(r) for r in transformed]
        sources = x.index_select(0, torch.cat([s for _, s in gathered]))  # one gather, one scatter back
        for r, (operator, _), rows in zip(transformed, gathered, torch.split(sources, [len(s) for _, s in gathered])):
            add_rows_(out, self._nodes(r), _scaled(spmm(operator, times(rows, weights[r])), scale, relations, r))

    def _forward_sequential(self, x: torch.Tensor) -> torch.Tensor:
        """--halo-memory sequential: x is the owned rows [n_owned, in] (every layer's, the first included: its
        owners made and dropped them); the halo's rows arrive block by block into one product that aggregates
        every relation the layer computes (gnn_dist.halo.blocks over the stacked form), so no [owned | halo]
        tensor is made, forward or backward. Every relation with a halo source is aggregated first here
        (transforming its sources first would need its halo rows at once); one whose sources are all owned (every
        relation at P=1) keeps the cheaper order."""
        relations = self.operator
        weights = self.relation_weights()
        own = x if self.output_rows is None else x.index_select(0, self.output_rows)
        out = times(own, self.root, self.bias)
        del own
        first = self._plan()
        # every rank moves its blocks, even one whose part this layer reaches nowhere
        add_aggregated_(out, aggregate_exchanged(self.blocked, self.exchanger, x, None, self.slot), relations,
                        first["aggregate"], self._nodes, weights)
        self._add_transformed(out, x, first["transform"], weights, None)
        return out

    def forward_block(self, x_src: torch.Tensor, relations, dst_type: torch.Tensor,
                      ids: torch.Tensor | None = None, x_dst: torch.Tensor | None = None) -> torch.Tensor:
        """A block (a sampled batch's, or a chunk of evaluation's rows): x_src [sources, in], relations the block's
        RelationOperator (gnn_dist.hetero.typed_part.edges_operator), x_dst the targets' rows (by default the first
        of x_src, as in a sampled block). Returns [targets, out]: each relation's mean over the block's neighbours,
        aggregated first (a block's sources are few), plus root and bias."""
        weights = self.relation_weights()
        out = times(x_src[:relations.n_owned] if x_dst is None else x_dst, self.root, self.bias)
        computed = tuple(r for r in range(relations.num_relations) if relations.offsets[r + 1] > relations.offsets[r])
        if computed:
            add_aggregated_(out, spmm(relations.stacked(computed), x_src), relations, computed, relations.reached,
                            weights)
        return out

    def _relation_scale(self) -> torch.Tensor | None:
        """Under a schedule that leaves halo rows out this pass (bns, adaptive), a factor per (relation, node
        reached) row: that relation's mean renormalised over the sources still present, as a homogeneous layer
        renormalises its row (gnn_dist.schedules.renormalise), so each relation keeps its weight in the sum.
        Rows are every relation's blocks in relation order: relation r's are offsets[r]:offsets[r + 1].
        None when every row is present (exact, stale, pipeline, or one rank)."""
        if not self.exchanger.reweights_rows(self.slot):
            return None
        relations = self.operator
        return self.exchanger.aggregation_scale(self.slot, relations.stacked(tuple(range(relations.num_relations))))

    def build_forms(self, exchanges: bool = True, halo_blocking: tuple | None = None) -> None:
        """Build every relation form this layer will use (set-up), so the entries can be released after: the
        stacked blocks it aggregates first, the gathered form of each relation it transforms first, and, where
        the layer's schedule may leave halo rows out (bns, adaptive), every relation's blocks for the
        renormalising factors. exchanges: whether the layer's halo rows come through its schedule (not the first
        layer's: the typed inputs bring them). halo_blocking: (rank, the P x P send-count matrix, this rank's
        halo rows per owner, --halo-block-rows) under --halo-memory sequential: the layer aggregates every
        relation with a halo source first, over the stacked form split into halo blocks
        (RelationOperator.blocked), and builds the gathered form of the others it transforms first."""
        if halo_blocking is not None:
            self.sequential_halos = True
            self._order = None
            self.blocked = self.operator.blocked(self._plan()["aggregate"], *halo_blocking)
            for r in self._plan()["transform"]:
                self.operator.gathered(r)
            return
        relations, first = self.operator, self._plan()
        if first["aggregate"]:
            relations.stacked(first["aggregate"])
        for r in first["transform"]:
            relations.gathered(r)
        exchanger = self.exchanger
        if exchanges and exchanger.plan.num_parts > 1 and exchanger.schedule is not None and \
                exchanger.schedule.for_slot(self.slot).reweights_rows:
            relations.stacked(tuple(range(relations.num_relations)))

    def _plan(self) -> dict:
        """Which relations this layer aggregates first and which it transforms first: the cheaper of
        (nodes reached x in x out + entries x in) and (sources x in x out + entries x out), decided once."""
        if self._order is None:
            order = {"aggregate": [], "transform": []}
            for r in range(self.operator.num_relations):
                if not self.computes(r):
                    continue
                if self.sequential_halos and self.operator.has_halo_sources(r):
                    order["aggregate"].append(r)  # its halo sources come in blocks: aggregated as they arrive
                    continue
                reached, sources, entries = self.operator.counts(r)
                order[relation_order(reached, sources, entries, self.in_dim, self.out_dim)].append(r)
            self._order = {k: tuple(v) for k, v in order.items()}
        return self._order

    @staticmethod
    def pyg_spec(in_dim: int, out_dim: int, num_relations: int = 1, num_bases: int = 0) -> tuple[str, dict]:
        return "torch_geometric.nn.RGCNConv", {"in_channels": in_dim, "out_channels": out_dim,
                                               "num_relations": num_relations,
                                               "num_bases": num_bases or None, "aggr": "mean"}

    @staticmethod
    def pyg_parameter_names() -> dict[str, str]:
        return {"weight": "weight", "basis": "weight", "comp": "comp", "root": "root", "bias": "bias"}


PRODUCT_CHUNK_BYTES = 64 * 2**20  # the largest [rows, out] product add_product_ makes at once


def product_chunk_rows(out_dim: int) -> int:
    """Rows of one chunk of add_product_'s products at out_dim columns (also the memory plan's)."""
    return max(1, PRODUCT_CHUNK_BYTES // (4 * out_dim))


def add_aggregated_(out: torch.Tensor, aggregated: torch.Tensor, relations, computed: tuple, nodes,
                    weights: torch.Tensor, scale: torch.Tensor | None = None) -> None:
    """Add each relation's block of `aggregated` (the stacked form of `computed`, relation after relation)
    times its weight into out's rows nodes(r). Split, not slices: its backward joins the blocks' gradients in
    one tensor, where each slice's would fill a zero tensor of the whole. out comes from addmm, which keeps its
    inputs for the backward, not its output: adding in place is safe."""
    if not computed:
        return
    sizes = [relations.offsets[r + 1] - relations.offsets[r] for r in computed]
    for r, block in zip(computed, torch.split(aggregated, sizes)):
        add_product_(out, nodes(r), _scaled(block, scale, relations, r), weights[r])


def add_product_(out: torch.Tensor, nodes: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor) -> None:
    """out[nodes] += rows @ weight, a chunk of rows at a time: the last layer's products are [nodes reached,
    classes] (on ogbn-mag's shape 736k papers x 349 classes, 1 GiB per relation), which no step needs whole.
    Chunks by split, whose backward joins the chunks' gradients in one tensor (a slice's would fill a zero
    tensor of the whole per chunk)."""
    step = product_chunk_rows(weight.shape[1])
    if rows.shape[0] <= step:
        add_rows_(out, nodes, times(rows, weight))
        return
    for chunk_nodes, chunk in zip(torch.split(nodes, step), torch.split(rows, step)):
        add_rows_(out, chunk_nodes, times(chunk, weight))


def relation_order(reached: int, sources: int, entries: int, in_dim: int, out_dim: int) -> str:
    """"aggregate" or "transform": the cheaper way to apply one relation in a layer (also the memory plan's)."""
    product = in_dim * out_dim
    aggregate_cost = reached * product + entries * in_dim
    transform_cost = sources * product + entries * out_dim
    return "transform" if transform_cost < aggregate_cost else "aggregate"


def _scaled(rows: torch.Tensor, scale: torch.Tensor | None, relations, r: int) -> torch.Tensor:
    """Relation r's rows times their renormalising factors ([rows, 1]), or the rows as they are."""
    return rows if scale is None else rows * scale[relations.offsets[r]:relations.offsets[r + 1]]
