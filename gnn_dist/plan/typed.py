"""The memory plan of a typed graph's rank (R-GCN or R-GAT, full-batch, resident halos), predicted before the run.

It walks what gnn_dist.hetero's stack allocates, as gnn_dist.plan.memory walks a homogeneous one: set-up (the
part file and the relation operator's build), a training step (the typed inputs, each layer, the loss, the
backward layer by layer) and evaluation, and keeps the largest total alive. Sizes come from the part's counts
(`TypedShape`: rows per type, and per relation its entries, the nodes it reaches and its distinct sources) and
the model's widths; each relation's order (aggregated first or transformed first) is the layer's own rule
(gnn_dist.models.rgcn.relation_order). Nothing is measured at plan time.

Shapes in the comments: n owned rows, h halo rows, t the target type's owned rows, H --hidden, C classes, a_r
and s_r the nodes relation r reaches and its distinct sources, e_r its entries.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn_dist.memory.host import PROCESS_BYTES
from gnn_dist.models import model_class
from gnn_dist.models.rgcn import product_chunk_rows, relation_order
from gnn_dist.nn.cross_entropy import CHUNK_ROWS
from gnn_dist.partition.format import type_offsets
from gnn_dist.plan.liveness import FLOAT, INDEX, Liveness
from gnn_dist.plan.memory import MemoryPlan, largest_blocks
from gnn_dist.plan.options import PlanConfig
from gnn_dist.schedules import parse_schedule

CSR_INDEX = 4  # the relation forms' CSR indices are int32 (gnn_dist.kernels.spmm)
# Set-up's build of the relation operator (gnn_dist.hetero.typed_part.relation_operator): per entry, the
# destinations and the (relation, node) keys (int64 each), np.unique's sorted copy, order and inverse, the
# values (float32), the stable sort's order, and the sorted rows, columns and values the operator keeps
# (int64, int64, float32), alive together at the build's peak.
SETUP_BYTES_PER_ENTRY = 6 * INDEX + FLOAT + 2 * INDEX + FLOAT


@dataclass(frozen=True)
class TypedShape:
    """The counts of one typed part that its memory depends on."""

    owned: int
    halo: int
    target: int                 # the target type's owned rows (the last layer's output rows)
    train: int                  # training rows (the loss's)
    sent: int                   # rows sent to peers, every type
    sent_featureless: int       # of which rows of featureless types (embedding rows, every step)
    owned_per_type: tuple       # in the partition's node type order
    halo_per_type: tuple
    widths: tuple               # feature width per type (0: featureless, an embedding table)
    relations: tuple            # per relation: (entries, nodes reached, distinct sources, ends at the target)
    file_bytes: int             # the part file's arrays as loaded
    halo_entries: tuple = ()    # per relation: its entries from a halo column (sequential halos' blocks hold them)
    received_per_peer: tuple = ()  # halo rows from each peer (sequential halos' blocks are cut from them)
    sent_per_peer: tuple = ()      # rows sent to each peer


def typed_shape(arrays: dict, meta) -> TypedShape:
    """The counts of a typed part from its arrays (a loaded part's, or a part file's)."""
    hetero = meta.hetero
    types = list(hetero["node_types"])
    offsets = type_offsets(hetero)
    node_ids, halo_ids = arrays["node_ids"], arrays["halo_ids"]
    n, h = len(node_ids), len(halo_ids)
    owned_type = np.searchsorted(offsets, node_ids, side="right") - 1
    halo_type = np.searchsorted(offsets, halo_ids, side="right") - 1
    widths = tuple(int(hetero["feature_widths"][t] or 0) for t in types)
    featureless = np.array([w == 0 for w in widths])
    indptr, indices = arrays["indptr"], arrays["indices"]
    edge_type = arrays["edge_type"].astype(np.int64)
    destination = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    num_relations = len(hetero["relations"])
    # distinct (relation, node) pairs by marking a [relations, rows] table: one pass, where a sort of the pairs
    # took most of a minute on ogbn-mag's shape
    reached_marks = np.zeros((num_relations, n), dtype=bool)
    reached_marks[edge_type, destination] = True
    del destination
    source_marks = np.zeros((num_relations, n + h), dtype=bool)
    source_marks[edge_type, indices] = True
    reached, sources = reached_marks.sum(1), source_marks.sum(1)
    del reached_marks, source_marks
    entries = np.bincount(edge_type, minlength=num_relations)
    halo_entries = np.bincount(edge_type[indices >= n], minlength=num_relations)
    target = hetero["target"]
    send = arrays["send_idx"]
    num_parts = len(arrays["send_ptr"]) - 1
    return TypedShape(
        owned=n, halo=h, target=int((owned_type == types.index(target)).sum()),
        train=int(arrays["train_mask"].sum()), sent=len(send),
        sent_featureless=int(featureless[owned_type[send]].sum()) if len(send) else 0,
        owned_per_type=tuple(np.bincount(owned_type, minlength=len(types)).tolist()),
        halo_per_type=tuple(np.bincount(halo_type, minlength=len(types)).tolist()), widths=widths,
        relations=tuple((int(e), int(a), int(s), relation[2] == target)
                        for e, a, s, relation in zip(entries, reached, sources, hetero["relations"])),
        file_bytes=int(sum(value.nbytes for value in arrays.values() if isinstance(value, np.ndarray))),
        halo_entries=tuple(halo_entries.tolist()),
        received_per_peer=tuple(np.bincount(arrays["halo_owner"], minlength=num_parts).tolist()),
        sent_per_peer=tuple(np.diff(arrays["send_ptr"]).tolist()))


def _form_bytes(rows: int, cols: int, entries: int) -> int:
    """A relation form: CSR matrix and its transpose, int32 indices and float32 values."""
    return 2 * entries * (CSR_INDEX + FLOAT) + (rows + cols + 2) * CSR_INDEX


def _orders(shape: TypedShape, config: PlanConfig, num_classes: int) -> list[dict]:
    """Per layer: {relation: "aggregate" | "transform"} for the relations it computes (the last layer: those into
    the target type), as the layers decide (with sequential halos every relation with a halo source is
    aggregated first)."""
    model = config.model
    attends = model_class(model.model).attention  # R-GAT: every relation attends over its gathered form
    sequential = config.halo_memory == "sequential"
    layers = []
    for k, (i, o, _) in enumerate(model.layers(model.hidden, num_classes)):
        last = k == model.num_layers - 1
        layers.append({r: "attend" if attends else "aggregate" if sequential and shape.halo_entries[r]
                       else relation_order(a, s, e, i, o)
                       for r, (e, a, s, into_target) in enumerate(shape.relations) if e and (into_target or not last)})
    return layers


def plan_typed_phases(shape: TypedShape, config: PlanConfig, num_classes: int) -> dict[str, MemoryPlan]:
    """Predicted peak resident bytes of the rank that trains this typed part, per phase (setup, train, eval)."""
    model = config.model
    H, C, L = model.hidden, num_classes, model.num_layers
    n, h, t, S = shape.owned, shape.halo, shape.target, shape.sent
    relations = shape.relations
    entries = sum(e for e, _, _, _ in relations)
    orders = _orders(shape, config, num_classes)
    featured = [k for k, w in enumerate(shape.widths) if w]
    featureless_owned = sum(c for c, w in zip(shape.owned_per_type, shape.widths) if not w)
    featureless_halo = sum(c for c, w in zip(shape.halo_per_type, shape.widths) if not w)
    widths = model.layers(H, num_classes)
    conv_type = model_class(model.model)
    replicated = sum(shape.widths[k] * H + H for k in featured) + sum(
        conv_type.parameter_count(i, o, num_relations=len(relations), **options) for i, o, options in widths)
    reweights = S > 0 and any(s.reweights_rows for s in parse_schedule(config.schedule).per_layer(max(L - 1, 1)))

    sequential = config.halo_memory == "sequential"
    forms = 0  # every form the layers use, built once and shared (RelationOperator)
    built = set()
    builds = []  # sequential halos: each blocked form's entries, built one after another at set-up
    for order in orders:
        aggregated = tuple(r for r, how in order.items() if how == "aggregate")
        if sequential and aggregated not in built:
            built.add(aggregated)
            builds.append(sum(relations[r][0] for r in aggregated))
            forms += _blocked_form_bytes(shape, aggregated)
        elif aggregated and aggregated not in built:
            built.add(aggregated)
            forms += _form_bytes(sum(relations[r][1] for r in aggregated), n + h,
                                 sum(relations[r][0] for r in aggregated))
        for r in (r for r, how in order.items() if how in ("transform", "attend")):
            if r not in built:
                built.add(r)
                forms += _form_bytes(relations[r][1], relations[r][2], relations[r][0]) + relations[r][2] * INDEX
                if order[r] == "attend":  # the attention kernel's transpose, kept with the form
                    forms += (relations[r][2] + 1 + 2 * relations[r][0]) * CSR_INDEX
    if reweights:
        forms += _form_bytes(sum(a for _, a, _, _ in relations), n + h, entries)
    reached = sum(a for _, a, _, _ in relations)

    persistent = {
        "process": PROCESS_BYTES,
        # node ids (part, graph, the stack's columns), labels, masks, the typed rows' positions and orders, the
        # halo plans (the layers', the embedding rows', each featured type's)
        "ids, labels, plan": n * (6 * INDEX + 6) + h * 8 * INDEX + S * 6 * INDEX + t * (INDEX + 3),
        # sequential halos fetch no halo features: the first layer's halo rows travel as its input rows
        "typed input features": sum(shape.widths[k] * (shape.owned_per_type[k]
                                                       + (0 if sequential else shape.halo_per_type[k])) * FLOAT
                                    for k in featured),
        "relation forms": forms + reached * INDEX,
        # replicated: the values, their gradients, the flat allreduce buffer and Adam's two moments; the embedding
        # shards (this rank's rows only): the values, their gradients and Adam's moments
        "parameters, Adam": replicated * FLOAT * 5 + featureless_owned * H * FLOAT * 4,
    }

    phases = {"setup": _setup(shape, persistent, entries, forms, builds)}
    for phase, training in (("train", True), ("eval", False)):
        live = Liveness(persistent)
        _inputs(live, shape, H, featureless_halo, sequential)
        if conv_type.attention:
            _attention_layers(live, shape, config, orders, widths, training, C)
        else:
            _layers(live, shape, config, orders, widths, training, C)
        phases[phase] = MemoryPlan(live.peak, phase, live.at_peak)
    return phases


def plan_typed(shape: TypedShape, config: PlanConfig, num_classes: int) -> MemoryPlan:
    """The largest of the phases' peaks."""
    return max(plan_typed_phases(shape, config, num_classes).values(), key=lambda plan: plan.peak)


def _setup(shape: TypedShape, persistent: dict, entries: int, forms: int, builds: list[int]) -> MemoryPlan:
    """The part file as loaded, then the relation operator's build, then its forms beside the entries; with
    sequential halos, each blocked form's build (builds: its entries) in turn."""
    live = Liveness({"process": PROCESS_BYTES, "part file": shape.file_bytes})
    live.alloc("operator build", entries * SETUP_BYTES_PER_ENTRY)
    live.free("operator build")
    # the entries the forms are built from (rows, columns, values) and each relation's source positions
    live.alloc("relation entries", entries * (2 * INDEX + FLOAT + INDEX))
    for built in builds:
        # the stacked entries (rows, columns, values), then their owned and halo columns' copies and the halo
        # columns' sort (gnn_dist.halo.blocks.build_blocked_operator)
        live.alloc("blocked form build", built * (2 * (2 * INDEX + FLOAT) + 1 + INDEX))
        live.free("blocked form build")
    live.alloc("relation forms", forms)
    return MemoryPlan(live.peak, "setup", live.at_peak)


def _relation_temporaries(relations: tuple, order: dict, o: int, i: int = 0) -> int:
    """Elements of a layer's largest per-relation temporaries at o output columns: a relation transformed first
    makes its sources times the weight and their mean over its nodes; one aggregated first a chunk of its
    block times the weight (gnn_dist.models.rgcn.add_product_). With i (the backward: the input width) each
    also makes its rows' gradients at i columns, an aggregated relation's joined into its whole block's."""
    return max(((relations[r][1] + relations[r][2]) * (o + i) if how == "transform"
                else min(relations[r][1], product_chunk_rows(o)) * o + relations[r][1] * i
                for r, how in order.items()), default=0)


def _blocked_form_bytes(shape: TypedShape, relations: tuple) -> int:
    """A stacked form split into its owned columns and halo blocks (sequential halos): every entry in one CSR
    matrix and its transpose, the owned part's row pointers, each block's over its own rows and columns and the
    owned rows it adds into (at most one per halo entry)."""
    reached = sum(shape.relations[r][1] for r in relations)
    entries = sum(shape.relations[r][0] for r in relations)
    halo_entries = sum(shape.halo_entries[r] for r in relations) if shape.halo_entries else 0
    rows_of_blocks = min(halo_entries, reached * max(len(shape.received_per_peer), 1))
    return _form_bytes(reached, shape.owned, entries) + 2 * (shape.halo + rows_of_blocks) * CSR_INDEX \
        + rows_of_blocks * INDEX


def _inputs(live: Liveness, shape: TypedShape, H: int, featureless_halo: int, sequential: bool = False) -> None:
    """gnn_dist.hetero.inputs.TypedInputs.forward: each type's rows, placed in the part's order per side, then
    [owned | halo] (sequential halos, or no halo rows: the owned rows alone)."""
    n, h = shape.owned, shape.halo
    live.alloc("inputs: pieces", n * H * FLOAT)        # each type's owned rows (the Linears' outputs, the shards)
    live.alloc("inputs: owned", n * H * FLOAT)         # the pieces placed in the part's order
    live.free("inputs: pieces")
    if sequential:
        live.rename("inputs: owned", "layer input")
        return
    # the embedding rows' exact exchange returns [owned | featureless halo] (sliced) and sends its rows
    live.alloc("inputs: embedding exchange", (n + featureless_halo + shape.sent_featureless) * H * FLOAT)
    live.alloc("inputs: halo", 2 * h * H * FLOAT)      # the halo's pieces, then placed in order
    live.free("inputs: embedding exchange")
    if h == 0:
        live.free("inputs: halo")
        live.rename("inputs: owned", "layer input")
        return
    live.alloc("layer input", (n + h) * H * FLOAT)     # [owned | halo]
    live.free("inputs: owned", "inputs: halo")


def _layer_input(live: Liveness, shape: TypedShape, k: int, width: int, dropped: bool,
                 sequential: bool = False) -> None:
    """Layer k's [owned | halo] input as "layer input": layer 0's typed inputs (a copy when dropout is on: its
    input is then free), a later layer's exchange (its [owned | halo] rows and the rows it sends). With
    sequential halos a layer's input is its owned rows (layer 0's dropped into a copy, a later layer's in place)
    and its halo arrives in blocks ("halo blocks" in _layers)."""
    rows = shape.owned + (0 if sequential else shape.halo)
    if sequential and k > 0:
        return
    if k == 0:
        if dropped:
            live.alloc("layer 0 dropped input", rows * width * FLOAT)
            live.free("layer input")
            live.rename("layer 0 dropped input", "layer input")
        return
    live.alloc(f"layer {k} [owned | halo]", rows * width * FLOAT)
    live.alloc("send buffer", shape.sent * width * FLOAT)
    live.free("send buffer", "layer input")
    live.rename(f"layer {k} [owned | halo]", "layer input")


def _loss(live: Liveness, shape: TypedShape, C: int) -> None:
    """The loss over the training rows, a chunk of their logits at a time (gnn_dist.nn.cross_entropy), then the
    logits' gradient, made beside the logits ("layer input"), which are free after."""
    live.alloc("loss", 2 * min(CHUNK_ROWS, shape.train) * C * FLOAT)
    live.alloc("loss gradient", shape.target * C * FLOAT)
    live.free("loss", "layer input")


def _attention_layers(live: Liveness, shape: TypedShape, config: PlanConfig, orders: list[dict], widths,
                      training: bool, C: int) -> None:
    """R-GAT's layers (gnn_dist.models.rgat), the loss and the backward. Per relation r a layer gathers its
    sources' and its nodes' input rows (kept for the backward), transforms the sources to [x W | a_src] (kept by
    the attention) and the nodes to their a_dst, and adds the attention's output into the layer's rows. The layer
    input itself is kept by nobody: no root term."""
    n, h, t = shape.owned, shape.halo, shape.target
    relations = shape.relations
    p = config.model.dropout
    L = len(orders)
    for k, ((i, o, options), order) in enumerate(zip(widths, orders)):
        heads = options.get("heads", 1)
        rows = t if k == L - 1 else n
        if k > 0 and training:  # the ReLU's output (no dropout) or dropout's packed mask (one bit an element)
            live.alloc(f"layer {k} activation", n * i * (FLOAT if p == 0 else 1 / 8))
        _layer_input(live, shape, k, i, training and p > 0)
        kept = sum((relations[r][2] + relations[r][1]) * i + relations[r][2] * (o + heads) + 2 * relations[r][1] * heads
                   for r in order)
        live.alloc(f"layer {k} relation rows", kept * FLOAT)
        live.alloc(f"layer {k} output", rows * o * FLOAT)
        # a relation's attention output, added into the layer's rows
        largest = max((relations[r][1] * o for r in order), default=0)
        live.alloc("relation temporaries", largest * FLOAT)
        live.free("relation temporaries", "layer input")
        if not training:
            live.free(f"layer {k} relation rows")
        live.rename(f"layer {k} output", "layer input")
    if not training:
        return
    _loss(live, shape, C)
    for k in reversed(range(L)):
        (i, o, options), order = widths[k], orders[k]
        heads = options.get("heads", 1)
        # per relation: its output rows' gradient, the attention's gradients of the sources and the nodes and the
        # recomputed transform; each gathered piece's gradient stays until the one gather's backward joins them
        # all and scatters them into [owned | halo]
        gathered = sum(relations[r][1] + relations[r][2] for r in order) * i
        largest = max((relations[r][1] * (o + heads) + relations[r][2] * (3 * o + heads) for r in order), default=0)
        live.alloc("relation gradients", largest * FLOAT)
        live.free("relation gradients")
        live.alloc(f"layer {k} gathered gradients", 2 * gathered * FLOAT)
        live.alloc(f"layer {k} input gradient", (n + h) * i * FLOAT)
        live.free("loss gradient", f"layer {k} relation rows", f"layer {k} output gradient",
                  f"layer {k} gathered gradients")
        if k > 0:
            live.free(f"layer {k} activation")
        live.alloc(f"layer {k - 1} output gradient", n * i * FLOAT)  # after the exchange's backward
        live.free(f"layer {k} input gradient")


def _layers(live: Liveness, shape: TypedShape, config: PlanConfig, orders: list[dict], widths, training: bool,
            C: int) -> None:
    """The layers' forward, the loss and the backward (training), or the forward alone (evaluation)."""
    n, h, t = shape.owned, shape.halo, shape.target
    relations = shape.relations
    p = config.model.dropout
    L = len(orders)
    sequential = config.halo_memory == "sequential"
    block, sent_block = largest_blocks(shape, config) if sequential else (0, 0)
    saved = []
    for k, ((i, o, _), order) in enumerate(zip(widths, orders)):
        last = k == L - 1
        rows = t if last else n
        # R-GCN's root term keeps the layer's input for the backward
        _layer_input(live, shape, k, i, training and p > 0, sequential)
        if last:
            live.alloc(f"layer {k} target rows", t * i * FLOAT)  # the root term's input rows
        aggregated = sum(relations[r][1] for r, how in order.items() if how == "aggregate")
        gathered = sum(relations[r][2] for r, how in order.items() if how == "transform")
        if sequential:  # a block received and one sent, and the next of each already on the wire
            live.alloc("halo blocks", 2 * (block + sent_block) * i * FLOAT)
        live.alloc(f"layer {k} aggregated and gathered rows", (aggregated + gathered) * i * FLOAT)
        if sequential:
            live.free("halo blocks")
        live.alloc(f"layer {k} output", rows * o * FLOAT)
        live.alloc("relation temporaries", _relation_temporaries(relations, order, o) * FLOAT)
        live.free("relation temporaries")
        if training:
            saved.append(k)
            live.rename("layer input", f"layer {k} kept input")  # the root term keeps its [owned | halo] rows
        else:
            live.free("layer input", f"layer {k} aggregated and gathered rows", f"layer {k} target rows")
        live.rename(f"layer {k} output", "layer input")
    if not training:
        return
    _loss(live, shape, C)
    for k in reversed(range(L)):
        (i, o, _), order = widths[k], orders[k]
        # per relation: the output gradient's rows and their product with the weight (a relation aggregated
        # first: chunk by chunk, joined into its block's gradient); then the gradients of the aggregated rows,
        # and of [owned | halo] (the sparse product's and the root term's, summed)
        live.alloc("relation gradients", _relation_temporaries(relations, order, o, i) * FLOAT)
        live.free("relation gradients")
        if sequential:
            # the aggregated rows' gradient, whole, then the blocks' gradients sent back and the owners' received,
            # one ahead of each, beside the owned input's gradient (the sparse product's and the root term's)
            aggregated = sum(relations[r][1] for r, how in order.items() if how == "aggregate")
            live.alloc(f"layer {k} aggregated gradient", aggregated * i * FLOAT)
            live.alloc(f"layer {k} input gradient", (2 * n + 2 * (block + sent_block)) * i * FLOAT)
            live.free(f"layer {k} aggregated gradient")
        else:
            live.alloc(f"layer {k} input gradient", 2 * (n + h) * i * FLOAT)
        live.free("loss gradient", f"layer {k} kept input", f"layer {k} aggregated and gathered rows",
                  f"layer {k} target rows", f"layer {k} output gradient")
        live.alloc(f"layer {k - 1} output gradient", n * i * FLOAT)  # after the exchange's backward
        live.free(f"layer {k} input gradient")
