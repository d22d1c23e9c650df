"""R-GAT: attention per relation, outputs summed over relations, as PyG's
HeteroConv({relation: GATConv(in, out // heads, heads, add_self_loops=False)}, aggr='sum') computes it (the
relational GAT of GraphLearn-for-PyTorch's IGBH example).

    per relation r (its own lin W_r, att_src_r, att_dst_r, bias_r):
        x'_j = x_j W_r^T viewed [heads, C];  a_src_j = <x'_j, att_src_r>;  a_dst_i = <x_i W_r^T, att_dst_r>
        alpha_ij = softmax over j in N_r(i) of leaky_relu(a_src_j + a_dst_i, 0.2)
        out_r(i) = concat over heads of sum_j alpha_ij x'_j  + bias_r
    out(i) = sum over the relations r whose destination type is i's type of out_r(i)

No self loops: a node takes no message from itself unless an edge says so. Every relation into a node's type
adds its bias to it, reached or not (GATConv's output over no in-edge is its bias), and a relation with no
edge into a node adds nothing else. Hidden layers have --heads heads of width --hidden, concatenated; the
output layer has one head. Attention dropout is off unless --attn-dropout is given (GATConv's default, which
the IGBH recipe keeps); it is keyed like GAT's, with the relation mixed in.

Across ranks the input rows travel (each relation transforms them with its own weight, so there is no one
transformed row to send) and every softmax is the destination's, on its owner: exact at any P. Each relation
transforms only its distinct sources and the nodes it reaches (RelationOperator.gathered), and its attention
runs in the kernel GAT uses (gnn_dist.kernels.attention), which never forms an [entries x heads x C] tensor.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from gnn_dist.kernels.attention import EdgeDropout, attention
from gnn_dist.kernels.keyed_random import mix32_reference
from gnn_dist.models.base import glorot_
from gnn_dist.models.gat import transformed_rows
from gnn_dist.models.registry import register_model
from gnn_dist.models.relational import RelationConv, add_rows_

_ATTENTION_SALT = 0x3C6EF372  # apart from GAT's and from the same layer's feature dropout
_RELATION_STRIDE = 0x2545F491


@register_model
class DistRGATConv(RelationConv):
    name = "rgat"
    needs_root = False
    attention = True
    multi_head = True

    def __init__(self, in_dim, out_dim, operator, exchanger, slot, blocked=None, num_relations: int = 1,
                 heads: int = 1, attn_dropout: float = 0.0):
        if out_dim % heads:
            raise ValueError(f"R-GAT layer: {out_dim} output columns do not split into {heads} heads")
        super().__init__(in_dim, out_dim, operator, exchanger, slot, blocked)
        self.num_relations, self.heads, self.head_width = num_relations, heads, out_dim // heads
        self.attn_dropout = attn_dropout
        # relation r's GATConv: lin.weight [out, in] (no bias), att_src and att_dst [heads, C], bias [out]
        self.weight = nn.Parameter(torch.empty(num_relations, out_dim, in_dim))  # host: moved with its module
        self.att_src = nn.Parameter(torch.empty(num_relations, heads, self.head_width))  # host: moved with its module
        self.att_dst = nn.Parameter(torch.empty(num_relations, heads, self.head_width))  # host: moved with its module
        self.bias = nn.Parameter(torch.zeros(num_relations, out_dim))  # host: moved with its module
        self._owned_type: torch.Tensor | None = None    # the type of each owned row
        self._row_type: torch.Tensor | None = None      # the type of each output row
        self._destination: torch.Tensor | None = None   # each relation's destination type
        self._num_types = 0
        self._gathers: tuple | None = None  # _gather_plan's
        self.reset_parameters()

    @classmethod
    def layer_options(cls, config, layer: int, num_layers: int) -> dict:
        return {"heads": 1 if layer == num_layers - 1 else config.heads, "attn_dropout": config.attn_dropout or 0.0}

    @classmethod
    def aggregation(cls, in_dim: int, out_dim: int, **layer_options) -> tuple[bool, int]:
        return True, in_dim  # the input rows travel: each relation transforms them with its own weight

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        # PyG's GATConv, per relation: glorot on the weight and on each attention vector, zero bias
        for r in range(self.num_relations):
            glorot_(self.weight[r], generator)
        bound = math.sqrt(6.0 / (self.heads + self.head_width))
        with torch.no_grad():
            self.att_src.uniform_(-bound, bound, generator=generator)
            self.att_dst.uniform_(-bound, bound, generator=generator)
            self.bias.zero_()

    def bind_types(self, owned_type: torch.Tensor, relation_destinations: list[int], num_types: int) -> None:
        self._owned_type = self._row_type = owned_type
        self._num_types = num_types
        self._destination = torch.tensor(relation_destinations, dtype=torch.int64, device=owned_type.device)

    def restrict_output(self, rows: torch.Tensor) -> None:
        super().restrict_output(rows)
        if self._row_type is not None:
            self._row_type = self._owned_type.index_select(0, rows)

    def _type_bias(self) -> torch.Tensor:
        """[types, out]: per node type, the sum of the biases of the relations into it."""
        if self._destination is None:
            raise RuntimeError("R-GAT needs its rows' types: the typed stack calls bind_types at set-up")
        return self.bias.new_zeros(self._num_types, self.out_dim).index_add(0, self._destination, self.bias)

    def forward(self, x: torch.Tensor | list | None = None, x_full: torch.Tensor | None = None,
                halo_source=None) -> torch.Tensor:
        """x: [n_owned, in] (the halo's rows arrive through the exchange), or x_full: [n_owned + n_halo, in]
        (the first layer: the typed inputs, halo rows included). Returns [output rows, out]."""
        if isinstance(x, list):
            x = x.pop()
        full = x_full if x_full is not None else self.exchanger.gather(x, self.slot)
        del x
        relations = self.operator
        out = self._type_bias().index_select(0, self._row_type)
        computed, index, sizes = self._gather_plan()
        # one gather of every relation's sources and nodes: its backward is one scatter into [owned | halo]
        # (a gather per relation made one zeroed [owned | halo] gradient each)
        pieces = torch.split(full.index_select(0, index), sizes)
        del full
        for k, r in enumerate(computed):
            operator, source_ids = relations.gathered(r)
            sources, reached = pieces[2 * k], pieces[2 * k + 1]
            source = transformed_rows(sources, self.weight[r], self.att_src[r].view(1, self.heads, self.head_width))
            dropout = self._edge_dropout(r, self.column_ids, relations.reached(r), source_ids)
            add_rows_(out, self._nodes(r), attention(operator, source, reached @ self._folded(r), self.heads, None,
                                                     dropout))
        return out

    def forward_block(self, x_src: torch.Tensor, relations, dst_type: torch.Tensor,
                      ids: torch.Tensor | None = None, x_dst: torch.Tensor | None = None) -> torch.Tensor:
        """A block (a sampled batch's, or a chunk of evaluation's rows): x_src [sources, in], relations the block's
        RelationOperator, dst_type [targets] each target's type, ids [sources] the keys of attention dropout
        (a sampled block's targets are its first sources), x_dst the targets' rows (by default the first of
        x_src). Returns [targets, out]: each relation's softmax over the block's neighbours."""
        if x_dst is None:
            x_dst = x_src[:relations.n_owned]
        out = self._type_bias().index_select(0, dst_type)
        for r in range(relations.num_relations):
            if relations.offsets[r + 1] == relations.offsets[r]:
                continue
            operator, sources = relations.gathered(r)
            reached = relations.reached(r)
            source = transformed_rows(x_src.index_select(0, sources), self.weight[r],
                                      self.att_src[r].view(1, self.heads, self.head_width))
            dropout = self._edge_dropout(r, ids, reached, sources)
            add_rows_(out, reached, attention(operator, source, x_dst.index_select(0, reached) @ self._folded(r),
                                              self.heads, None, dropout))
            # without autograd (evaluation's chunks) nothing else holds a relation's rows: free them before the
            # next relation gathers its own, or two relations' [sources, in + out] rows would be alive at once
            del source, dropout
        return out

    def _folded(self, r: int) -> torch.Tensor:
        """Relation r's weight folded with att_dst ([in, heads]): a_dst through it alone, as the nodes' transformed
        rows are never needed, only their scores."""
        return (self.weight[r].view(self.heads, self.head_width, self.in_dim)
                * self.att_dst[r].view(self.heads, self.head_width, 1)).sum(1).t()

    def _gather_plan(self) -> tuple[tuple[int, ...], torch.Tensor, list[int]]:
        """(the relations this layer computes, the [owned | halo] rows they read: each one's sources then its
        nodes, in that order, the size of each piece), made once."""
        if self._gathers is None:
            relations, computed, pieces = self.operator, [], []
            for r in range(relations.num_relations):
                if self.computes(r):
                    computed.append(r)
                    pieces += [relations.gathered(r)[1], relations.reached(r)]
            index = torch.cat(pieces) if pieces else relations.nodes[:0]
            self._gathers = tuple(computed), index, [len(piece) for piece in pieces]
        return self._gathers

    def _edge_dropout(self, r: int, ids: torch.Tensor | None, reached: torch.Tensor,
                      sources: torch.Tensor) -> EdgeDropout | None:
        """Relation r's attention dropout over (reached, sources) rows, keyed by their original ids (`ids`, indexed
        by those rows), the pass and the relation."""
        if not self.training or self.attn_dropout == 0.0:
            return None
        if ids is None or self.pass_key is None:
            raise RuntimeError("R-GAT attention dropout needs the pass key and node ids (set by the typed stack)")
        key = mix32_reference(self.pass_key ^ _ATTENTION_SALT ^ ((r + 1) * _RELATION_STRIDE & 0xFFFFFFFF))
        return EdgeDropout.keyed(ids.index_select(0, reached), ids.index_select(0, sources), self.heads, key,
                                 self.attn_dropout)

    def build_forms(self, exchanges: bool = True, halo_blocking: tuple | None = None) -> None:
        """Build every relation's gathered form at set-up, before the entries are released. R-GAT keeps its
        halo resident (halo_blocking must be None: gnn_dist.tasks.base.check_typed refuses sequential halos)."""
        if halo_blocking is not None:
            raise ValueError("R-GAT runs with --halo-memory resident only so far")
        self._gathers = None  # the output rows may have changed (restrict_output)
        self._gather_plan()
