"""The memory plan of a typed graph's rank in sampled training (`--mode sampled`: R-GCN or R-GAT on mini-batches).

It walks what gnn_dist.hetero's sampled mode allocates, as gnn_dist.plan.typed walks the full-batch stack:
- set-up: the part file, each featured type's rows (owned and halo) and the embedding shards, then the typed
  sampler's build (one relation's CSR at a time over the part's entries);
- what stays: the part (the sampler reads its CSR, evaluation its chunks), every featured type's rows, the shards
  with SparseAdam's two moments (no dense gradient: the tables step row by row), the replicated weights with
  Adam's state, the sampler's relation CSRs and the per-row index arrays of the stores, tables and stack, and
  the feature cache (--feature-cache-mb);
- a training step: two prepared batches (the one training and the next one, prepared during its allreduce:
  blocks, relation operators, gathered raw features) and the step's forward and backward over the batch's
  levels;
- evaluation: layer by layer in chunks of --eval-chunk-nodes rows (TypedStack._chunked).

A batch's sizes cannot be read from the partition: they are the sample's. `SampledBatchShape.of` reads them
from a real batch (the mode samples epoch 0's first one before training starts: gnn_dist.hetero.mini_batch), so
the plan covers batches like it; another batch's levels differ by a few percent.

Shapes in the comments: n owned rows, h halo rows, t the target type's owned rows, H --hidden, C classes, E
the part's entries; per batch level k N_k nodes (N_0 the seeds, N_L the outermost), per layer its edges and
the (relation, node) rows it aggregates.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn_dist.memory.host import PROCESS_BYTES
from gnn_dist.models import model_class
from gnn_dist.partition.format import type_offsets
from gnn_dist.partition.graph import entries_of_rows
from gnn_dist.plan.liveness import FLOAT, INDEX, Liveness
from gnn_dist.plan.memory import MemoryPlan
from gnn_dist.plan.options import PlanConfig
from gnn_dist.plan.typed import TypedShape, _inputs

CSR_INDEX = 4  # a block's stacked form: CSR with int32 indices (gnn_dist.kernels.spmm)
# A block's RelationOperator keeps its entries (int64 rows and sources, float32 values) beside its forms; the
# block itself holds int64 targets, sources and relations
OPERATOR_BYTES_PER_EDGE = 2 * INDEX + FLOAT
BLOCK_BYTES_PER_EDGE = 3 * INDEX


@dataclass(frozen=True)
class SampledBatchShape:
    """The sizes of one sampled batch."""

    levels: tuple        # nodes per level, the seeds first (N_0 .. N_L)
    edges: tuple         # per layer, the first (outermost) first: its block's edges
    reached: tuple       # per layer: the (relation, target) rows it aggregates
    outer_per_type: tuple  # the outermost level's nodes per type, in the partition's type order

    @classmethod
    def of(cls, names: np.ndarray, blocks: list, num_types: int) -> SampledBatchShape:
        """From a sample (gnn_dist.hetero.sampler.TypedSampler.sample: every level's names, blocks hop 1 first)."""
        levels = [blocks[0].n_dst] + [b.n_src for b in blocks]
        edges, reached = [], []
        for block in reversed(blocks):
            pair = block.relation.numpy() * max(block.n_dst, 1) + block.dst.numpy()  # runs: sorted by (relation, dst)
            edges.append(len(pair))
            reached.append(int(np.count_nonzero(pair[1:] != pair[:-1])) + (1 if len(pair) else 0))
        return cls(tuple(int(v) for v in levels), tuple(edges), tuple(reached),
                   tuple(np.bincount(np.asarray(names) % num_types, minlength=num_types).tolist()))


@dataclass(frozen=True)
class EvaluationChunks:
    """The sizes of evaluation's chunks (TypedStack._chunked), read from the part's CSR: for every chunk of the
    owned rows (the hidden layers') and of the target's rows (the last layer's), its rows and per relation its
    (entries, (relation, row) rows reached, distinct sources). A chunk's distinct sources are what R-GAT gathers
    and transforms; they depend on the graph's locality, which no average over the part predicts."""

    owned: tuple   # per chunk: (rows, ((entries, reached, sources) per relation))
    target: tuple

    @classmethod
    def of(cls, arrays: dict, meta, chunk_nodes: int) -> EvaluationChunks:
        hetero = meta.hetero
        owned_type = np.searchsorted(type_offsets(hetero), arrays["node_ids"], side="right") - 1
        target = np.flatnonzero(owned_type == list(hetero["node_types"]).index(hetero["target"]))
        sizes = [_chunk_sizes(rows, arrays, len(hetero["relations"]), chunk_nodes)
                 for rows in (np.arange(len(arrays["node_ids"])), target)]
        return cls(*sizes)


def _chunk_sizes(rows: np.ndarray, arrays: dict, num_relations: int, chunk_nodes: int) -> tuple:
    indptr, indices, edge_type = arrays["indptr"], arrays["indices"], arrays["edge_type"]
    columns = int(indices.max()) + 1 if len(indices) else 1
    chunks = []
    for start in range(0, len(rows), max(chunk_nodes, 1)):
        chunk = rows[start:start + chunk_nodes]
        starts = indptr[chunk]
        degrees = indptr[chunk + 1] - starts
        entries = entries_of_rows(starts, degrees)
        relation = edge_type[entries].astype(np.int64)
        target = np.repeat(np.arange(len(chunk), dtype=np.int64), degrees)
        counts = [np.bincount(relation, minlength=num_relations),
                  np.bincount(np.unique(relation * len(chunk) + target) // len(chunk), minlength=num_relations),
                  np.bincount(np.unique(relation * columns + indices[entries]) // columns, minlength=num_relations)]
        chunks.append((len(chunk), tuple(zip(*(c.tolist() for c in counts)))))
    return tuple(chunks)


def plan_typed_sampled_phases(shape: TypedShape, batch: SampledBatchShape, chunks: EvaluationChunks,
                              config: PlanConfig, num_classes: int, cache_bytes: int = 0) -> dict[str, MemoryPlan]:
    """Predicted peak resident bytes of a rank in typed sampled training, per phase (setup, train, eval)."""
    H = config.model.hidden
    widths = config.model.layers(H, num_classes)
    persistent, setup = _kept(shape, config, num_classes, cache_bytes)
    phases = {"setup": setup}
    live = Liveness(persistent)
    _step(live, batch, shape, widths, H, num_classes)
    phases["train"] = MemoryPlan(live.peak, "train", live.at_peak)
    live = Liveness(persistent)
    # the last step's fetched embedding rows and their gradients stay referenced (TypedBatchInputs.fetched)
    live.alloc("last step's embedding rows", 2 * sum(c for c, w in zip(batch.outer_per_type, shape.widths) if not w)
               * H * FLOAT)
    _evaluation(live, shape, widths, H, chunks, model_class(config.model.model).attention)
    phases["eval"] = MemoryPlan(live.peak, "eval", live.at_peak)
    return phases


def plan_typed_sampled_setup(shape: TypedShape, config: PlanConfig, num_classes: int) -> MemoryPlan:
    """Set-up's peak alone, which needs no batch: what a rank can be refused on before it loads features, builds
    shards or samples anything (the whole plan follows once a batch is drawn)."""
    return _kept(shape, config, num_classes, 0)[1]


def _kept(shape: TypedShape, config: PlanConfig, num_classes: int, cache_bytes: int) -> tuple[dict, MemoryPlan]:
    """(what stays alive through training and evaluation, set-up's plan)."""
    model = config.model
    H = model.hidden
    n, h = shape.owned, shape.halo
    E = sum(e for e, _, _, _ in shape.relations)
    R = len(shape.relations)
    widths = model.layers(H, num_classes)
    conv_type = model_class(model.model)
    featured = [k for k, w in enumerate(shape.widths) if w]
    featureless = [k for k, w in enumerate(shape.widths) if not w]
    replicated = sum(shape.widths[k] * H + H for k in featured) + sum(
        conv_type.parameter_count(i, o, num_relations=R, **options) for i, o, options in widths)
    shard_bytes = sum(shape.owned_per_type[k] for k in featureless) * H * FLOAT
    halo_features = sum(shape.halo_per_type[k] * shape.widths[k] for k in featured) * FLOAT
    featured_rows = sum(shape.owned_per_type[k] + shape.halo_per_type[k] for k in featured)

    persistent = {
        "process": PROCESS_BYTES,
        # the part stays (its CSR for the sampler's names and evaluation's chunks); each featured type's owned
        # rows are the part's, its halo rows join them once
        "part file": shape.file_bytes,
        "halo features": halo_features,
        # per row: the types (part, stack), the inputs' positions and orders, the sampler's global ids, original
        # ids and names, the stack's column ids and node ids, the labels; per featured type's row its store's
        # sorted ids, their order and its row ids; per owned row each store's and table's served row
        "ids and positions": (n + h) * 9 * INDEX + n * 3 * INDEX + featured_rows * 3 * INDEX
        + n * (len(featured) + len(featureless)) * INDEX + shape.sent * 4 * INDEX,
        # every relation's CSR over the owned rows: the entries' sources (int64) and a row pointer per relation
        "sampler CSRs": E * INDEX + R * (n + 1) * INDEX,
        # replicated weights: values, gradients, the allreduce's flat buffer and Adam's moments; the embedding
        # shards: values and SparseAdam's two moments (their gradients are per batch, never a dense copy)
        "parameters, Adam": replicated * FLOAT * 5 + shard_bytes * 3,
        "feature cache": cache_bytes,
        # the exchanges' send buffers, kept for reuse (HaloExchanger.buffer, one per width) from the first
        # evaluation on: the later layers' input rows at each of their widths, and the embedding rows' own exchange
        "halo send buffers": (shape.sent * sum({i for i, _, _ in widths[1:]}) + shape.sent_featureless * H) * FLOAT
        if shape.sent else 0,
    }
    return persistent, _setup(shape, persistent, E, replicated * FLOAT, shard_bytes)


def plan_typed_sampled(shape: TypedShape, batch: SampledBatchShape, chunks: EvaluationChunks, config: PlanConfig,
                       num_classes: int, cache_bytes: int = 0) -> MemoryPlan:
    """The largest of the phases' peaks."""
    return max(plan_typed_sampled_phases(shape, batch, chunks, config, num_classes, cache_bytes).values(),
               key=lambda plan: plan.peak)


def _setup(shape: TypedShape, persistent: dict, E: int, replicated_bytes: int, shard_bytes: int) -> MemoryPlan:
    """Everything but the sampler's CSRs, then their build: relation by relation, a mask over the entries, the
    running count (int64) and the relation's sources gathered (gnn_dist.hetero.sampler.TypedSampler)."""
    kept = ("sampler CSRs", "feature cache", "parameters, Adam", "halo send buffers")
    live = Liveness({name: size for name, size in persistent.items() if name not in kept})
    # the weights and the shards' values; gradients, the flat buffer and the optimisers' moments come with training
    live.alloc("parameters", replicated_bytes + shard_bytes)
    largest = max((e for e, _, _, _ in shape.relations), default=0)
    live.alloc("sampler CSRs", persistent["sampler CSRs"])
    live.alloc("sampler build", E * (1 + INDEX) + largest * INDEX)
    live.free("sampler build")
    return MemoryPlan(live.peak, "setup", live.at_peak)


def _prepared_bytes(batch: SampledBatchShape, shape: TypedShape) -> int:
    """A prepared batch (gnn_dist.hetero.mini_batch.TypedPreparedBatch): its blocks and relation operators, the
    levels' names and ids, the gathered raw rows of featured nodes."""
    edges = sum(batch.edges)
    raw = sum(count * width for count, width in zip(batch.outer_per_type, shape.widths)) * FLOAT
    return edges * (BLOCK_BYTES_PER_EDGE + OPERATOR_BYTES_PER_EDGE) + sum(batch.reached) * INDEX \
        + batch.levels[-1] * 4 * INDEX + raw


def _step(live: Liveness, batch: SampledBatchShape, shape: TypedShape, widths, H: int, C: int) -> None:
    """One training step: the next batch is prepared while this one's gradients travel, so two prepared batches
    are alive at its end; the forward keeps each layer's input, its aggregated rows and its dropout mask for the
    backward; the backward's largest moment is the first layer's (its input's gradient over N_L rows)."""
    levels, L = batch.levels, len(batch.edges)
    live.alloc("prepared batch", _prepared_bytes(batch, shape))
    outer = levels[-1]
    featureless_rows = sum(c for c, w in zip(batch.outer_per_type, shape.widths) if not w)
    # the inputs: each type's rows (Linear outputs, fetched embedding rows), joined, then in the sample's order
    live.alloc("fetched embedding rows", featureless_rows * H * FLOAT)
    live.alloc("inputs: pieces", (outer - featureless_rows) * H * FLOAT)
    live.alloc("inputs: joined", outer * H * FLOAT)
    live.free("inputs: pieces")
    live.alloc("layer input", outer * H * FLOAT)
    live.free("inputs: joined")
    for k, ((i, o, _), edges, reached) in enumerate(zip(widths, batch.edges, batch.reached)):
        rows_in, rows_out = levels[L - k], levels[L - k - 1]
        # dropout: a new tensor for layer 0's input (the inputs are kept), in place after a ReLU; a packed mask
        live.alloc(f"layer {k} input", rows_in * i * FLOAT if k == 0 else 0)
        live.rename("layer input", f"layer {k} input")
        live.alloc(f"layer {k} mask", rows_in * i / 8)
        # the block's stacked form (CSR and its transpose for the backward), the aggregated rows (kept), the
        # output; each relation's product with its weight is a temporary
        live.alloc(f"layer {k} form", 2 * edges * (CSR_INDEX + FLOAT) + 2 * (reached + rows_in) * CSR_INDEX)
        live.alloc(f"layer {k} aggregated", reached * i * FLOAT)
        live.alloc("layer output", rows_out * o * FLOAT)
        live.alloc("relation temporaries", 2 * reached * o * FLOAT / max(len(shape.relations), 1))
        live.free("relation temporaries")
        live.rename("layer output", "layer input")
    live.alloc("loss", 2 * levels[0] * C * FLOAT)
    for k in reversed(range(L)):
        (i, o, _), rows_in = widths[k], levels[L - k]
        # the aggregated rows' gradient, then the input's: the sparse product's transpose, the root term's (its
        # rows in a zero-filled [rows_in, i]) and their sum, alive together for a moment
        live.alloc(f"layer {k} aggregated gradient", batch.reached[k] * i * FLOAT)
        live.alloc(f"layer {k} input gradient", 3 * rows_in * i * FLOAT)
        live.free(f"layer {k} aggregated gradient", f"layer {k} aggregated", f"layer {k} form", f"layer {k} mask",
                  "layer input" if k == L - 1 else f"layer {k + 1} input gradient", "loss")
        live.free(f"layer {k + 1} input", f"layer {k} input gradient")
        live.alloc(f"layer {k} input gradient", rows_in * i * FLOAT)
    # the inputs' backward: dropout's, the ordering's (a zero-filled [N_L, H] the rows are added into), then the
    # embedding rows' gradients, sent home and summed per row
    live.alloc("inputs gradient", outer * H * FLOAT)
    live.free("layer 0 input gradient", "layer 0 input")
    live.alloc("inputs gradient: ordered", outer * H * FLOAT)
    live.free("inputs gradient")
    live.alloc("embedding rows' gradients", 2 * featureless_rows * H * FLOAT)
    live.free("inputs gradient: ordered")
    # the next batch, prepared before the allreduce: the sampler's temporaries over a hop's draws (counts,
    # places, targets, relations, the relabelled sources: int64 each), then the batch
    live.alloc("sampling temporaries", max(batch.edges, default=0) * 6 * INDEX)
    live.free("sampling temporaries")
    live.alloc("next prepared batch", _prepared_bytes(batch, shape))


def _evaluation(live: Liveness, shape: TypedShape, widths, H: int, chunks: EvaluationChunks, attends: bool) -> None:
    """TypedStack._chunked: the typed inputs' [owned | halo] rows (made per type, joined, ordered), then per layer
    its input rows, its output rows, and one chunk's operator and temporaries at a time (the costliest chunk)."""
    n, h, t = shape.owned, shape.halo, shape.target
    featureless_halo = sum(c for c, w in zip(shape.halo_per_type, shape.widths) if not w)
    _inputs(live, shape, H, featureless_halo)  # the whole forward's typed inputs: the same code
    L = len(widths)
    for k, (i, o, options) in enumerate(widths):
        last = k == L - 1
        if k > 0:  # the layer's halo rows exchanged into a new [owned | halo]; the previous output stays referenced
            live.rename("layer input", "previous output")  # until the layer is done
            live.alloc("layer input", (n + h) * i * FLOAT)
            live.alloc("send buffer", shape.sent * i * FLOAT)
            live.free("send buffer")
        live.alloc("layer output", (t if last else n) * o * FLOAT)
        heads = options.get("heads", 1)
        operator, temporaries = max((_chunk_bytes(rows, relations, i, o, heads, attends)
                                     for rows, relations in (chunks.target if last else chunks.owned)),
                                    key=sum, default=(0, 0))
        live.alloc("chunk", operator)
        live.alloc("relation temporaries", temporaries)
        live.free("relation temporaries", "chunk", "layer input", "previous output")
        live.rename("layer output", "layer input")


def _chunk_bytes(rows: int, relations: tuple, i: int, o: int, heads: int, attends: bool) -> tuple[int, int]:
    """(a chunk's operator and rows, its relations' temporaries at their largest). The operator as a batch's: the
    entries, their targets, sources and relations; the chunk's target rows and output."""
    edges = sum(e for e, _, _ in relations)
    operator = edges * (OPERATOR_BYTES_PER_EDGE + BLOCK_BYTES_PER_EDGE) + rows * (i + o) * FLOAT
    if attends:
        # R-GAT, relation by relation (each freed before the next): its gathered form (the distinct sources found
        # by a sort of the entries, CSR and transpose), its sources' rows and their [x W | a_src], its nodes' rows
        # and a_dst, its edges' scores and weights, its output rows
        temporaries = max((e * (2 * INDEX + 2 * (CSR_INDEX + FLOAT) + 3 * heads * FLOAT)
                           + s * (INDEX + (i + o + heads) * FLOAT) + a * (i + heads + o) * FLOAT
                           for e, a, s in relations if e), default=0)
    else:
        # R-GCN: the stacked form (CSR and transpose), the aggregated rows, one relation's product with its weight
        temporaries = edges * 2 * (CSR_INDEX + FLOAT) + sum(a for _, a, _ in relations) * i * FLOAT \
            + max((a for _, a, _ in relations), default=0) * o * FLOAT
    return int(operator), int(temporaries)
