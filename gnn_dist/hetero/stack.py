"""The model of a rank on a typed graph (`TypedStack`): the typed inputs, then L relational layers (R-GCN or
R-GAT: gnn_dist.models.relational).

    x0 = typed inputs (a Linear per featured type, an embedding row per featureless node), [owned | halo]
    per layer k: dropout -> relational conv -> ReLU (none after the last)

Dropout precedes every layer, the first included, keyed by (seed, epoch, layer, the node's id): ids are
homogeneous, unique per (type, type-local id), so paper 5 and author 5 never share a draw, and every P draws
the same masks. Layer 0 aggregates the typed inputs' [owned | halo] rows (the halo's embedding rows arrived
this step); every later layer exchanges its input rows like any layer: schedules (stale, pipeline, bns,
adaptive) and halo dtypes apply there, while the embedding rows always travel exactly, in fp32.

With --halo-memory sequential (R-GCN, exact schedule) the typed inputs are the owned rows alone: their owners
drop them out (the same keyed masks) and layer 0 receives its halo rows block by block like every later layer
(gnn_dist.halo.blocks), so the featured halo's raw features are never fetched and no rank holds an
[owned | halo] tensor; the halo's Linear outputs travel every step instead, at --hidden columns.

Two kinds of parameters: replicated ones (the Linears and every layer's weights), broadcast at set-up and whose
gradients are summed over ranks every step, and the embedding shards, which are this rank's alone (their
gradients already hold what the halo ranks sent back) and never enter the allreduce.

Shapes: forward() -> logits [n_target, C]: the target type's owned rows (output_rows), in the part's order; the
last layer computes no other row
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gnn_dist.halo.exchange import HaloExchanger
from gnn_dist.hetero.inputs import TypedInputs
from gnn_dist.hetero.typed_part import TypedPart, edges_operator, relation_operator
from gnn_dist.kernels.keyed_random import stream_key
from gnn_dist.models import model_class
from gnn_dist.nn.dropout import keyed_dropout
from gnn_dist.partition.format import PartData
from gnn_dist.partition.graph import entries_of_rows


class TypedStack(nn.Module):
    def __init__(self, config, out_dim: int, part: PartData, exchanger: HaloExchanger, seed: int,
                 layerwise: bool = False, halo_blocking: tuple[np.ndarray, int] | None = None):
        """layerwise: the stack never runs a whole forward (sampled training, embed): it keeps the part's typed
        CSR for forward_layerwise's chunks and builds none of the whole-part relation forms. halo_blocking:
        (the P x P send-count matrix, --halo-block-rows) under --halo-memory sequential: every layer, the first
        included, receives its halo rows block by block (gnn_dist.halo.blocks), so no rank holds an
        [owned | halo] tensor."""
        super().__init__()
        config.validate()
        self.config = config
        self.seed = seed
        self.epoch = 0
        self.exchanger = exchanger
        device = exchanger.plan.device
        typed = TypedPart.of(part)
        self.hetero = part.meta.hetero  # the graph's types and relations: checkpoints record them for export
        self.sequential = halo_blocking is not None and not layerwise
        self.inputs = TypedInputs(part, typed, config.hidden, exchanger, seed, with_halo=not self.sequential)
        # a whole forward's relation operator; a layerwise stack makes each block's own instead (its entries would
        # take 28 bytes each, and sorting them more, at set-up)
        operator = None if layerwise else relation_operator(part, typed.num_relations, device)
        conv_type = model_class(config.model)
        self.convs = nn.ModuleList(
            conv_type(i, o, operator, exchanger, slot=f"layer{k}", num_relations=typed.num_relations, **options)
            for k, (i, o, options) in enumerate(config.layers(config.hidden, out_dim)))
        # the last layer computes the target type's rows only: the logits (and the labels, set-up restricts
        # them alike) are the target's owned rows, in the part's order
        self.output_rows = torch.from_numpy(np.flatnonzero(typed.owned_type == typed.type_index(typed.target))
                                            ).to(device)
        ids = torch.from_numpy(part.node_ids).to(device)
        self.node_ids = ids
        self.column_ids = torch.cat([ids, torch.from_numpy(part.halo_ids).to(device)])
        owned_type = torch.from_numpy(typed.owned_type).to(device)
        destinations = [typed.type_index(relation[2]) for relation in typed.relations]
        for conv in self.convs:
            conv.bind_types(owned_type, destinations, len(typed.node_types))
            conv.column_ids = self.column_ids  # keyed draws inside a layer (R-GAT's attention dropout)
        self.owned_type = owned_type
        self.structure = None
        if layerwise:  # the chunks' operators come from the part's CSR, with each entry's relation
            self.structure = (part.indptr, part.indices, part.edge_type, part.n_owned + part.n_halo,
                              typed.num_relations)
        else:
            self.convs[-1].restrict_output(self.output_rows)
            blocking = None
            if self.sequential:
                send_counts_matrix, block_rows = halo_blocking
                blocking = (part.part_id, send_counts_matrix, exchanger.plan.recv_counts, block_rows)
            for k, conv in enumerate(self.convs):
                conv.build_forms(exchanges=k > 0, halo_blocking=blocking)
            operator.release_entries()  # every layer's forms are built: the entries they came from go
        generator = torch.Generator().manual_seed(seed)
        self.inputs.reset_parameters(generator)
        for conv in self.convs:
            conv.reset_parameters(generator)

    def replicated_parameters(self) -> list[nn.Parameter]:
        """What every rank holds alike: broadcast at set-up, gradients summed over ranks."""
        return self.inputs.replicated_parameters() + list(self.convs.parameters())

    def sharded_parameters(self) -> list[nn.Parameter]:
        """This rank's embedding rows: its own, stepped with its own gradients."""
        return self.inputs.sharded_parameters()

    def sharded_rows(self) -> dict:
        """{state_dict name: (shard, type-local ids of its rows)}: how checkpoints write and re-shard them."""
        return {f"inputs.shards.{name}": held for name, held in self.inputs.sharded_rows().items()}

    def forward(self, x_full: torch.Tensor | None = None) -> torch.Tensor:
        """x_full is ignored (a typed graph's inputs are the model's own); the argument keeps the stacks' call."""
        if self.structure is not None:
            raise RuntimeError("this typed stack was built layerwise (sampled training, embed): it runs sampled "
                               "blocks and forward_layerwise, whose forms it builds per chunk, not a whole forward")
        p = self.config.dropout
        self.exchanger.begin_pass(self.epoch, self.training)
        h = self.inputs()
        for k, conv in enumerate(self.convs):
            key = stream_key(self.seed, self.epoch, k)
            conv.pass_key = key
            if k == 0 and self.sequential:  # the owned rows, dropped by their owner, travel as any layer's
                h = conv([keyed_dropout(h, self.node_ids, key, p, self.training)])
            elif k == 0:
                h = conv(x_full=keyed_dropout(h, self.column_ids, key, p, self.training))
            else:
                if self.training and p > 0 and self.exchanger.active_schedule(conv.slot).measures_parameter_drift:
                    self._note_shaping_parameters(k)
                h = conv([keyed_dropout(h, self.node_ids, key, p, self.training, relu=True, inplace=True)])
        return h

    @torch.no_grad()
    def _note_shaping_parameters(self, k: int) -> None:
        """For schedules that skip halo blocks which barely changed (adaptive), under dropout: the replicated
        parameters that shape layer k's exchanged rows (the typed inputs' Linears, layers 0..k), as the
        homogeneous stack hands over (gnn_dist.steps.layer_stack). The embedding shards are left out: each rank
        holds other rows, and the measure should be one every rank computes alike."""
        shaping = self.inputs.replicated_parameters() + [q for conv in self.convs[:k + 1] for q in conv.parameters()]
        self.exchanger.shaping_parameters[self.convs[k].slot] = torch.cat([q.reshape(-1) for q in shaping])

    @torch.no_grad()
    def forward_layerwise(self, x_full: torch.Tensor | None, chunk_nodes: int, upto: int | None = None) -> torch.Tensor:
        """Evaluation in eval mode; with `upto`, layer upto's output after its ReLU. A stack built layerwise
        computes each layer for chunk_nodes output rows at a time (_chunked); otherwise one whole forward, through
        the forms training built."""
        if self.structure is not None:
            return self._chunked(chunk_nodes, upto)
        if upto is None:
            return self.forward(x_full)
        self.exchanger.begin_pass(self.epoch, False)
        h = self.inputs()
        for k, conv in enumerate(self.convs[:upto + 1]):
            h = conv(x_full=h) if k == 0 and not self.sequential else conv([h])
            if k < len(self.convs) - 1:
                h = torch.relu(h)
        return h

    def _chunked(self, chunk_nodes: int, upto: int | None) -> torch.Tensor:
        """Layer by layer: a layer's input rows ([owned | halo], its halo rows exchanged once, as a whole forward
        sends them), then its output rows chunk_nodes at a time, each chunk from its rows' in-edges in the part's
        CSR (the layer's block form, forward_block). Alive at once: a layer's input and output and one chunk's
        operator and temporaries; no whole-part relation form is ever made."""
        if chunk_nodes < 1:
            raise ValueError(f"--eval-chunk-nodes must be at least 1, got {chunk_nodes}")
        self.exchanger.begin_pass(self.epoch, False)
        last = len(self.convs) - 1
        h = self.inputs()  # [owned | halo]: the typed inputs bring the halo's rows
        all_owned = torch.arange(len(self.owned_type), device=h.device)
        for k, conv in enumerate(self.convs[:None if upto is None else upto + 1]):
            full = h if k == 0 else self.exchanger.gather(h, conv.slot)
            rows = self.output_rows if k == last else all_owned
            out = torch.empty(len(rows), conv.out_dim, device=h.device)
            for start in range(0, len(rows), chunk_nodes):
                chunk = rows[start:start + chunk_nodes]
                out[start:start + len(chunk)] = conv.forward_block(full, self._chunk_operator(chunk),
                                                                   self.owned_type.index_select(0, chunk),
                                                                   x_dst=full.index_select(0, chunk))
            del full
            h = torch.relu_(out) if k < last else out
        return h

    def _chunk_operator(self, rows: torch.Tensor):
        """The relations into these owned rows, over [owned | halo] columns, from the part's CSR."""
        indptr, indices, edge_type, n_columns, num_relations = self.structure
        rows = rows.cpu().numpy()
        starts = indptr[rows]
        degrees = indptr[rows + 1] - starts
        entries = entries_of_rows(starts, degrees)
        return edges_operator(np.repeat(np.arange(len(rows), dtype=np.int64), degrees),
                              indices[entries].astype(np.int64), edge_type[entries], len(rows), n_columns,
                              num_relations, self.output_rows.device)
