"""The L-layer stack of a rank (`LayerStack`): dropout, conv, BatchNorm and ReLU per layer, over its LocalGraph."""
from __future__ import annotations

import torch
from torch import nn

from gnn_dist.config import ModelConfig
from gnn_dist.graph.local_graph import LocalGraph
from gnn_dist.halo.exchange import HaloExchanger
from gnn_dist.kernels.keyed_random import stream_key
from gnn_dist.models import model_class
from gnn_dist.nn.batch_norm import DistBatchNorm
from gnn_dist.nn.dropout import keyed_dropout
from gnn_dist.schedules import layer_slot


class LayerStack(nn.Module):
    """dropout -> conv -> [BatchNorm] -> ReLU, L times (no activation after the last conv).

    Dropout precedes every conv, the input features included (Kipf and
    Welling's GCN, PyG's examples); its masks are keyed by original node id so
    every P draws the same masks.

    Shapes:
        forward(x_full [n_owned + n_halo, F]: owned then cached halo input rows) -> logits [n_owned, C]
    """

    def __init__(self, config: ModelConfig, in_dim: int, out_dim: int, graph: LocalGraph,
                 exchanger: HaloExchanger, seed: int):
        super().__init__()
        config.validate()
        self.config = config
        self.graph = graph
        self.seed = seed
        self.epoch = 0
        self.exchanger = exchanger
        conv_type = model_class(config.model)
        layers = config.layers(in_dim, out_dim)
        self.convs = nn.ModuleList(
            conv_type(i, o, graph.operator, exchanger, slot=layer_slot(k), blocked=graph.blocked, **options)
            for k, (i, o, options) in enumerate(layers))
        for conv in self.convs:
            conv.column_ids = graph.column_ids
        self.norms = nn.ModuleList(
            DistBatchNorm(o, exchanger) for _, o, _ in layers[:-1]) if config.batch_norm else None
        # A private generator: the initial weights depend on the seed alone, not on
        # whatever else consumed torch's global RNG (threads of simulated ranks do).
        generator = torch.Generator().manual_seed(seed)
        for conv in self.convs:
            conv.reset_parameters(generator)

    def forward(self, x_full: torch.Tensor) -> torch.Tensor:
        p = self.config.dropout
        graph = self.graph
        self.exchanger.begin_pass(self.epoch, self.training)
        h = x_full
        for k, conv in enumerate(self.convs):
            key = stream_key(self.seed, self.epoch, k)
            conv.pass_key = key
            if k == 0 and graph.blocked is not None:
                # Sequential halos: the owned and the cached halo input rows stay apart, and each halo block is
                # upcast (--feature-dtype) and dropped out only while its block is aggregated.
                halo = x_full[graph.n_owned:]
                halo_ids = graph.halo_ids

                def halo_source(start: int, stop: int, key=key, halo=halo, halo_ids=halo_ids) -> torch.Tensor:
                    return keyed_dropout(halo[start:stop].float(), halo_ids[start:stop], key, p, self.training)

                h = conv([keyed_dropout(x_full[:graph.n_owned].float(), graph.node_ids, key, p, self.training)],
                         halo_source=halo_source)
            elif k == 0 and self.training and p > 0 and _has_sparse_copy(conv, h):
                # Mostly-zero features with their CSR copy: the dropout is drawn at the non-zeros only and the
                # product is taken from the dropped-out copy (gnn_dist.nn.sparse_features); no dense copy is made.
                sparse = conv.input_features
                conv.input_features = sparse.dropped_out(graph.column_ids, key, p)
                try:
                    h = conv(x_full=h)
                finally:
                    conv.input_features = sparse
            elif k == 0:
                h = conv(x_full=keyed_dropout(h.float(), graph.column_ids, key, p, self.training))
            else:
                if self.training and p > 0 and self.exchanger.active_schedule(conv.slot).measures_parameter_drift:
                    self._note_shaping_parameters(k)
                # The previous layer's ReLU runs fused with this layer's dropout, in place: no backward saved
                # that output. The conv gets the only reference, so it can free its input early.
                inputs = [keyed_dropout(h, graph.node_ids, key, p, self.training, relu=True, inplace=True)]
                del h
                h = conv(inputs)
            if k < len(self.convs) - 1 and self.norms is not None:
                h = self.norms[k](h)
        return h

    @torch.no_grad()
    def _note_shaping_parameters(self, k: int) -> None:
        """For schedules that skip blocks which barely changed (gnn_dist.schedules.adaptive): the parameters
        that shape layer k's exchanged rows (layers 0..k and the norms between them). Under dropout the rows
        themselves differ by 50-110% from one epoch to the next (this layer's and every lower layer's masks),
        so their change says nothing; the parameters' relative change is the noise-free part of it."""
        shaping = [p for conv in self.convs[:k + 1] for p in conv.parameters()]
        if self.norms is not None:
            shaping += [p for norm in self.norms[:k] for p in norm.parameters()]
        self.exchanger.shaping_parameters[self.convs[k].slot] = torch.cat([p.reshape(-1) for p in shaping])

    @torch.no_grad()
    def forward_layerwise(self, x_full: torch.Tensor, chunk_nodes: int, upto: int | None = None) -> torch.Tensor:
        """Eval-mode logits of all owned nodes, one layer at a time, in chunks of `chunk_nodes` rows; with `upto`,
        the output of layer `upto` instead (a hidden layer's after its BatchNorm and ReLU: the next layer's input).

        Equal to forward() in eval mode. Each layer's input rows travel once
        (the same rows and bytes as forward) and are freed after the layer.
        Owned and received halo rows stay two tensors: each chunk's operator
        rows (from graph.rows, so no whole-part operator is needed) aggregate
        their owned and halo columns separately (DistConv.aggregate_chunk), so
        no [owned | halo] copy is made. Alive at once: the layer's input,
        its halo rows, its output, and one chunk's operator rows and temporaries.

        Shapes:
            x_full [n_owned + n_halo, F] -> logits [n_owned, C]
        """
        if chunk_nodes < 1:
            raise ValueError(f"--eval-chunk-nodes must be at least 1, got {chunk_nodes}")
        if self.training:
            # BatchNorm would then reduce statistics per chunk, and chunk counts differ across ranks.
            raise RuntimeError("forward_layerwise computes eval-mode logits: call model.eval() first")
        if self.graph.blocked is not None and upto is None:
            # Sequential halos already hold one layer's owned rows and one halo block at a time.
            return self.forward(x_full)
        self.exchanger.begin_pass(self.epoch, False)
        n = self.graph.n_owned
        device = self.graph.device
        h = x_full[:n].to(device).float()  # sampled mode keeps the features on the host
        last = len(self.convs) - 1
        for k, conv in enumerate(self.convs[:None if upto is None else upto + 1]):
            owned = conv.transform(h)
            # Layer 0's halo inputs are the cached features: nothing to exchange.
            halo = conv.transform(x_full[n:].to(device).float()) if k == 0 \
                else self.exchanger.halo_rows(owned, conv.slot)
            out = torch.empty(n, conv.out_dim, device=device)
            for start in range(0, n, chunk_nodes):
                stop = min(n, start + chunk_nodes)
                aggregated = conv.aggregate_chunk(self.graph.rows.chunk(start, stop), owned, halo)
                y = conv.update(aggregated, h[start:stop])
                if k < last:
                    if self.norms is not None:
                        y = self.norms[k](y)
                    y = torch.relu_(y)  # eval mode: dropout is the identity, so only the ReLU remains
                out[start:stop] = y
            del owned, halo
            h = out
        return h


def forward_blocks(model: LayerStack, x_src: torch.Tensor, operators: list, node_ids: torch.Tensor,
                   layer_keys: list[int]) -> torch.Tensor:
    """Sampled mini-batch forward: operators[k] is layer k's block, outermost first.

    Layer k's input rows are the first rows of the outermost level (levels are
    prefixes of one another), so `node_ids` (one int64 id per outermost row)
    keys every layer's dropout mask with layer_keys[k]: one fused pass for
    ReLU and dropout, a one-bit mask saved, and nothing drawn from a
    generator whose state a checkpoint would have to carry.

    Shapes:
        x_src: [n_nodes of the outermost level, F]; node_ids: [n_nodes] -> logits [n_seeds, C]
    """
    h = x_src
    p = model.config.dropout
    for k, (conv, op) in enumerate(zip(model.convs, operators)):
        h = keyed_dropout(h, node_ids[:h.shape[0]], layer_keys[k], p, model.training, relu=k > 0, inplace=k > 0)
        conv.pass_key = layer_keys[k]
        h = conv.forward_block(h, op, ids=node_ids[:h.shape[0]])
    return h


def _has_sparse_copy(conv, x_full: torch.Tensor) -> bool:
    """Whether the first layer holds the CSR copy of exactly these features (gnn_dist.nn.sparse_features)."""
    return conv.input_features is not None and x_full is conv.input_features.dense
