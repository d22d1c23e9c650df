"""The memory plan of a homogeneous graph's rank in sampled training (`--mode sampled`: GCN, SAGE or GAT).

It walks what gnn_dist.steps.mini_batch allocates, as gnn_dist.plan.memory walks the full-batch step:
- set-up: the part file, then the input features of the owned and halo rows ([owned | halo], the halo's fetched
  once) beside the part's own copy until it is dropped, the model with its weights;
- what stays: the part (the sampler reads its CSR, evaluation its row chunks), the input features, the
  sampler's and the store's per-row ids (global ids, original ids, the store's sorted ids and their order), the
  weights with their gradients, the allreduce's flat buffer and Adam's moments, and the feature cache
  (--feature-cache-mb);
- a training step: two prepared batches (the one training and the next, prepared before its allreduce: the
  outermost level's input rows, the blocks' edges, the levels' ids), the relabelling table, every layer's
  block operator, the forward's saved tensors (the dropped-out input of layer 0, the masks, the aggregated or
  transformed rows) and the backward's gradients, the first (widest) layer's at their largest;
- evaluation: layer by layer over the owned rows (LayerStack.forward_layerwise): the layer's input, its halo
  rows (and, while they travel, the rows sent), its output, and one chunk of --eval-chunk-nodes rows at a time
  (the chunk with the most entries).

A batch's sizes cannot be read from the partition: they are the sample's. `BatchShape.of` reads them from a real
batch (the mode samples epoch 0's first before training starts: MiniBatchMode.first_batch), so the plan covers
batches like it; another batch's levels differ by a few percent.

Shapes in the comments: n owned rows, h halo rows, S rows sent, F input features; per batch level k N_k nodes
(N_0 the seeds, N_L the outermost), per layer E its block's edges.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn_dist.config import FEATURE_DTYPES
from gnn_dist.kernels.attention import torch_backward_elements
from gnn_dist.memory.host import PROCESS_BYTES
from gnn_dist.models import model_class
from gnn_dist.partition.format import PartShape
from gnn_dist.plan.liveness import FLOAT, INDEX, Liveness
from gnn_dist.plan.memory import MemoryPlan, parameter_count, part_file_bytes, torch_kernels
from gnn_dist.plan.options import PlanConfig

CSR_INDEX = 4  # a block's operator: CSR with int32 indices (gnn_dist.kernels.spmm), and its transpose
ENTRY_BYTES = CSR_INDEX + FLOAT  # an entry of an operator (or of its transpose): index and value


@dataclass(frozen=True)
class BatchShape:
    """The sizes of one sampled batch."""

    levels: tuple  # nodes per level, the seeds first (N_0 .. N_L)
    edges: tuple   # per layer, the first (outermost) first: its block's sampled edges

    @classmethod
    def of(cls, blocks: list) -> BatchShape:
        """From a sample (gnn_dist.graph.sampler.DistributedSampler.sample: the blocks, hop 1 first)."""
        levels = [blocks[0].n_dst] + [b.n_src for b in blocks] if blocks else [0]
        return cls(tuple(int(v) for v in levels), tuple(int(len(b.dst)) for b in reversed(blocks)))


def largest_chunk_entries(indptr: np.ndarray, n_owned: int, chunk_nodes: int) -> int:
    """The most CSR entries in one of evaluation's chunks of chunk_nodes owned rows."""
    bounds = np.append(np.arange(0, n_owned, max(chunk_nodes, 1)), n_owned)
    return int(np.diff(np.asarray(indptr)[bounds]).max()) if n_owned else 0


def plan_sampled_phases(shape: PartShape, batch: BatchShape, config: PlanConfig, num_features: int,
                        num_classes: int, chunk_entries: int, cache_bytes: int = 0) -> dict[str, MemoryPlan]:
    """Predicted peak resident bytes of a rank in sampled training, per phase (setup, train, eval)."""
    persistent, setup = _kept(shape, config, num_features, num_classes, cache_bytes)
    widths = config.model.layers(num_features, num_classes)
    phases = {"setup": setup}
    live = Liveness(persistent)
    _step(live, batch, config, widths)
    phases["train"] = MemoryPlan(live.peak, "train", live.at_peak)
    live = Liveness(persistent)
    _evaluation(live, shape, config, widths, chunk_entries)
    phases["eval"] = MemoryPlan(live.peak, "eval", live.at_peak)
    return phases


def plan_sampled(shape: PartShape, batch: BatchShape, config: PlanConfig, num_features: int, num_classes: int,
                 chunk_entries: int, cache_bytes: int = 0) -> MemoryPlan:
    """The largest of the phases' peaks."""
    return max(plan_sampled_phases(shape, batch, config, num_features, num_classes, chunk_entries,
                                   cache_bytes).values(), key=lambda plan: plan.peak)


def plan_sampled_setup(shape: PartShape, config: PlanConfig, num_features: int, num_classes: int) -> MemoryPlan:
    """Set-up's peak alone, which needs no batch: what a rank can be refused on before it fetches the halo's
    features or builds its sampler (the whole plan follows once a batch is drawn)."""
    return _kept(shape, config, num_features, num_classes, 0)[1]


def _kept(shape: PartShape, config: PlanConfig, num_features: int, num_classes: int,
          cache_bytes: int) -> tuple[dict, MemoryPlan]:
    """(what stays alive through training and evaluation, set-up's plan)."""
    n, h, S = shape.owned, shape.halo, shape.sent
    widths = config.model.layers(num_features, num_classes)
    params = parameter_count(config.model, widths)
    feature_bytes = FEATURE_DTYPES[config.feature_dtype].itemsize
    part_file = part_file_bytes(shape, num_features)
    owned_features = n * num_features * FLOAT
    cached_rows = cache_bytes // max(num_features * feature_bytes, 1)
    persistent = {
        "process": PROCESS_BYTES,
        # the part stays (its CSR for the sampler and evaluation's chunks); its features become the owned rows of
        # the input features, so they are counted there
        "part file": part_file - owned_features,
        "input features": (n + h) * num_features * feature_bytes,
        # the graph's column ids, the exchange plan; the sampler's global and original ids per row, the store's
        # sorted ids and their order
        "ids, labels, plan": (n + h) * INDEX + S * 3 * INDEX + (n + h) * 4 * INDEX,
        "parameters, Adam": params * FLOAT * 5,
        "feature cache": cached_rows * (num_features * feature_bytes + INDEX),
    }
    setup = Liveness({"process": PROCESS_BYTES, "part file": part_file})
    setup.alloc("parameters", params * FLOAT)
    # the halo's rows arrive, then [owned | halo] is made beside them and the part's own features
    setup.alloc("received halo features", h * num_features * FLOAT)
    setup.alloc("input features", (n + h) * num_features * feature_bytes)
    setup.free("received halo features")
    setup.alloc("ids, labels, plan", persistent["ids, labels, plan"])
    return persistent, MemoryPlan(setup.peak, "setup", setup.at_peak)


def _prepared_bytes(batch: BatchShape, num_features: int) -> int:
    """A prepared batch (gnn_dist.steps.mini_batch.PreparedBatch): the outermost level's input rows, the blocks'
    targets and sources, the levels' global ids (numpy) and their tensor."""
    return batch.levels[-1] * (num_features * FLOAT + 2 * INDEX) + sum(batch.edges) * 2 * INDEX


def _relabel_bytes(batch: BatchShape) -> int:
    """The sampler's relabelling table (kernels/native_kernels.cpp Relabel): 16-byte slots, a power of two at
    least twice the sample's nodes, and the slots it filled."""
    nodes = batch.levels[-1]
    return (1 << max(12, int(2 * nodes - 1).bit_length())) * 2 * INDEX + nodes * INDEX


def _step(live: Liveness, batch: BatchShape, config: PlanConfig, widths) -> None:
    """One training step: the forward keeps each layer's input, its aggregated (or transformed) rows and its
    dropout mask for the backward; every layer's block operator is built before the first layer runs; the next
    batch is prepared while this one's gradients travel."""
    model = config.model
    conv = model_class(model.model)
    levels, L = batch.levels, len(batch.edges)
    loops = 1 if conv.self_loops else 0
    live.alloc("relabelling table", _relabel_bytes(batch))
    live.alloc("prepared batch", _prepared_bytes(batch, widths[0][0]))
    # each layer's operator entries (its block's edges, and a self loop per target where the model adds them),
    # and its order on this batch's block (DistConv.block_aggregation): (aggregates first, width aggregated)
    layer_entries = [batch.edges[k] + loops * levels[L - k - 1] for k in range(L)]
    orders = [conv.block_aggregation(i, o, levels[L - k], levels[L - k - 1], layer_entries[k], **options)
              for k, (i, o, options) in enumerate(widths)]
    operators, input_needs_grad = 0, False  # a batch's input rows need no gradient
    for k, entries in enumerate(layer_entries):
        rows_in, rows_out = levels[L - k], levels[L - k - 1]
        operators += entries * ENTRY_BYTES + (rows_out + 1) * CSR_INDEX + rows_out * FLOAT  # the matrix, the counts
        if conv.block_needs_transpose(orders[k][0], input_needs_grad):
            operators += entries * ENTRY_BYTES + (rows_in + 1) * CSR_INDEX
        input_needs_grad = True
    live.alloc("block operators", operators)
    p = model.dropout
    for k, (i, o, options) in enumerate(widths):
        rows_in, rows_out = levels[L - k], levels[L - k - 1]
        aggregate_first, w = orders[k]
        # dropout: a new tensor for layer 0's input (the batch's rows are kept), in place after a ReLU; a packed mask
        live.alloc(f"layer {k} input", rows_in * i * FLOAT if k == 0 and p > 0 else 0)
        if k > 0:
            live.rename("layer output", f"layer {k} input")
        live.alloc(f"layer {k} mask", rows_in * ((i + 7) // 8) if p > 0 else 0)
        if conv.attention:
            heads = options.get("heads", 1)
            # [x W | a_src] of every source row, kept for the backward, and the targets' a_dst
            live.alloc(f"layer {k} source", rows_in * (o + heads) * FLOAT + rows_out * heads * FLOAT)
            live.alloc("layer output", rows_out * o * FLOAT)
            continue
        if not aggregate_first:
            live.alloc("transformed rows", rows_in * o * FLOAT)
        live.alloc(f"layer {k} aggregated", rows_out * w * FLOAT if aggregate_first else 0)
        live.alloc("layer output", rows_out * o * FLOAT)
        live.free("transformed rows")
    # the loss over the seeds: its chunk's log-softmax and the logits' gradient
    live.alloc("loss", 2 * levels[0] * widths[-1][1] * FLOAT)
    live.rename("layer output", "output gradient")
    for k in reversed(range(L)):
        (i, o, options), rows_in, rows_out = widths[k], levels[L - k], levels[L - k - 1]
        aggregate_first, w = orders[k]
        edges = layer_entries[k]
        if conv.attention:
            heads = options.get("heads", 1)
            extra = torch_backward_elements(edges, heads, o // heads) if torch_kernels(config) else 0
            live.alloc("attention buffers", (2 * edges * heads + extra) * FLOAT)
        if k == 0 and aggregate_first and not conv.attention:
            break  # the first layer aggregates constant inputs: only its weight gradient remains
        # the aggregation's gradient (through the output transform), then the input's: the operator's
        # transpose times it, and a root term's (block_input_gradients)
        live.alloc("aggregation gradient", rows_out * (w if aggregate_first else o) * FLOAT)
        live.free("output gradient", f"layer {k} aggregated", "loss")
        if k == 0:
            break  # the first layer's input is the batch's features: no gradient of its own
        live.alloc("input gradient", conv.block_input_gradients(aggregate_first) * rows_in * i * FLOAT)
        live.free("aggregation gradient", "attention buffers", f"layer {k} source", f"layer {k} mask",
                  f"layer {k} input")
        live.alloc("output gradient", rows_in * i * FLOAT)
        live.free("input gradient")
    live.free("aggregation gradient", "attention buffers", "output gradient")
    # the next batch, prepared before the allreduce: the sampler's temporaries over a hop's draws (counts,
    # targets, the drawn and relabelled sources: int64 each), then the batch
    live.alloc("sampling temporaries", max(batch.edges, default=0) * 4 * INDEX)
    live.free("sampling temporaries")
    live.alloc("next prepared batch", _prepared_bytes(batch, widths[0][0]))


def _evaluation(live: Liveness, shape: PartShape, config: PlanConfig, widths, chunk_entries: int) -> None:
    """LayerStack.forward_layerwise: per layer its transformed owned and halo rows (none where it aggregates
    first), its halo rows after the first layer (exchanged), its output, and one chunk's operator rows and
    temporaries at a time."""
    n, h = shape.owned, shape.halo
    conv = model_class(config.model.model)
    loops = 1 if conv.self_loops else 0
    chunk = min(config.eval_chunk_nodes, n) if n else 0
    for k, (i, o, options) in enumerate(widths):
        aggregate_first, w = conv.aggregation(i, o, **options)
        if k > 0:  # the previous output is this layer's input; its halo rows come through the exchange, whose
            # send rows are a temporary (HaloExchanger.halo_rows)
            live.rename("layer output", "layer input")
            live.alloc("halo rows", h * i * FLOAT)
            live.alloc("send rows", shape.sent * i * FLOAT)
            live.free("send rows")
        if not aggregate_first:
            heads = options.get("heads", 1) if conv.attention else 0
            live.alloc("transformed rows", (n + h) * (o + heads) * FLOAT)
        live.alloc("layer output", n * o * FLOAT)
        # the chunk's entries as normalised (int64 rows and columns, float64 values), its CSR, its aggregated
        # rows and the update's product
        entries = chunk_entries + loops * chunk
        live.alloc("chunk", entries * (3 * INDEX + CSR_INDEX + FLOAT) + chunk * (w + o) * FLOAT)
        live.free("chunk", "transformed rows", "halo rows", "layer input")
