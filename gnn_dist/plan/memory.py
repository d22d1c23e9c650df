"""The memory plan: peak resident memory per rank of full-batch training, predicted before the run.

`gnn-dist inspect DIR` prints it per part; `train` compares it with the
memory its host has (gnn_dist.memory.host) and refuses to start when it does
not fit, because an out-of-memory kill half way through is worse than that
refusal.

The prediction walks the tensors that this implementation allocates and
frees, in order, through set-up, one training step (forward, then backward)
and evaluation, and keeps the largest total alive. Sizes come from the
partition's statistics (owned and halo rows, operator entries, rows sent to
each peer) and the model's widths; nothing is measured at plan time. On top
sits a fixed per-process cost (interpreter, torch, MPI and their buffers)
measured once on this implementation.

Shapes in the comments below: n owned rows, h halo rows, S rows sent, nnz
operator entries (GCN's self loops included).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gnn_dist.config import FEATURE_DTYPES, ModelConfig
from gnn_dist.halo import overlap as halo_overlap
from gnn_dist.halo.shared import shared_halo_enabled
from gnn_dist.kernels.attention import torch_backward_elements
from gnn_dist.kernels.native import torch_formulations_run
from gnn_dist.memory.host import PROCESS_BYTES, readable_bytes
from gnn_dist.models import model_class
from gnn_dist.nn import sparse_features
from gnn_dist.nn.cross_entropy import CHUNK_ROWS
from gnn_dist.partition.format import PartShape
from gnn_dist.plan.link import link_pairs_bytes, plan_link_evaluation, plan_link_scoring
from gnn_dist.plan.liveness import FLOAT, INDEX, Liveness
from gnn_dist.plan.options import PlanConfig
from gnn_dist.plan.traffic import exchanged_widths
from gnn_dist.schedules import parse_schedule

# Set-up builds the operator from COO entries: int64 rows and columns, float64 normalisation terms, the
# sort key and order of the CSR build, and their gathered copies (bytes per operator entry, counted from
# gnn_dist.graph.local_graph.normalised_rows and gnn_dist.kernels.spmm._csr).
SETUP_BYTES_PER_ENTRY = 64
# A GPU rank receives the entries normalised (int64 rows and columns, float32 values: 20 bytes) and sorts them
# into CSR on the device: the sort key and order (16) and the gathered copies (20).
DEVICE_SETUP_BYTES_PER_ENTRY = 56


@dataclass
class MemoryPlan:
    """Predicted peak bytes of one rank, where the peak falls (setup, train or eval) and what makes it up."""

    peak: int
    phase: str
    parts: dict = field(default_factory=dict)  # name -> bytes alive at the peak

    def summary(self, top: int = 6) -> str:
        largest = sorted(self.parts.items(), key=lambda kv: -kv[1])[:top]
        return ", ".join(f"{name} {readable_bytes(value)}" for name, value in largest if value)


def torch_kernels(config: PlanConfig) -> bool:
    """Whether the torch formulations run: always on a GPU (the native kernels serve host tensors only), and on
    CPUs under GNN_DIST_KERNEL=torch or when the native kernel could not be built. They keep more than the
    native kernels (the dropout's byte mask and the ReLU's output beside it, GAT's [E x H] tensors), and the
    plan counts what runs."""
    return config.device != "cpu" or torch_formulations_run()


@dataclass(frozen=True)
class _Sizes:
    n: int
    h: int
    block: int          # halo rows of the largest block received at once (sequential)
    sent_block: int     # rows of the largest block sent at once (sequential)
    touched: int        # owned rows with an entry in one block's columns (at most)
    feature_bytes: int
    sequential: bool
    entries: int        # the operator's entries (self loops included)
    torch_kernels: bool  # torch_kernels(config)
    sparse_input_dropped: int  # bytes of a dropped-out sparse copy of the features (gnn_dist.nn.sparse_features); 0: none
    # per exchanged layer (layer k at k - 1): whether its exchange overlaps the owned product (gnn_dist.halo.overlap),
    # which holds only the halo's rows and their gradients, never [owned | halo]
    overlapped: tuple = ()
    shared: bool = False  # overlapped exchanges write into and read from shared memory: no halo rows of their own


def largest_blocks(shape: PartShape, config: PlanConfig) -> tuple[int, int]:
    """Rows of the largest block received and of the largest block sent at once under sequential halos: a
    peer's rows, cut to --halo-block-rows (0: whole)."""
    bound = config.halo_block_rows if config.halo_block_rows > 0 else None
    received = min(max(shape.received_per_peer, default=0), bound or shape.halo)
    sent = min(max(shape.sent_per_peer, default=0), bound or shape.sent)
    return received, sent


def parameter_count(model: ModelConfig, widths) -> int:
    """The model's trainable values: its layers' and BatchNorm's after the hidden layers."""
    conv = model_class(model.model)
    params = sum(conv.parameter_count(i, o, **options) for i, o, options in widths)
    return params + (2 * sum(o for _, o, _ in widths[:-1]) if model.batch_norm else 0)


def plan_phases(shape: PartShape, config: PlanConfig, num_features: int, num_classes: int) -> dict[str, MemoryPlan]:
    """Predicted peak resident bytes of the rank that trains this part, per phase (setup, train, eval)."""
    n, h, S = shape.owned, shape.halo, shape.sent
    sequential = config.halo_memory == "sequential"
    feature_bytes = FEATURE_DTYPES[config.feature_dtype].itemsize
    model = config.model
    conv = model_class(model.model)
    nnz = shape.entries + (n if conv.self_loops else 0)
    widths = model.layers(num_features, num_classes)
    params = parameter_count(model, widths)
    peers = [r for r in shape.received_per_peer if r]
    bound = config.halo_block_rows if config.halo_block_rows > 0 else None
    block, sent_block = largest_blocks(shape, config)
    touched = min(n, shape.cut_entries * block // h) if h else 0
    sparse_copy = sparse_features.wanted(config, shape.feature_density, conv, *widths[0][:2])
    exchanged = [w for w in exchanged_widths(model, num_features, num_classes) if w]
    schedules = parse_schedule(config.schedule).per_layer(len(exchanged))
    overlapped = tuple(bool(peers) and halo_overlap.overlaps(s.kind, conv.attention, sequential, config.device)
                       for s in schedules)
    sizes = _Sizes(n, h, block, sent_block, touched, feature_bytes, sequential, nnz, torch_kernels(config),
                   sparse_features.dropped_bytes(n + h, num_features, shape.feature_density) if sparse_copy else 0,
                   overlapped, config.shared_halo)
    on_gpu = config.device != "cpu"

    blocks = sum(-(-r // (bound or r)) for r in peers)
    # On a GPU every tensor below lives on the device; the process itself, the part file and the staging
    # buffers are the host's (plan_host).
    persistent = {
        "process": 0 if on_gpu else PROCESS_BYTES,
        "input features": (n + h) * num_features * feature_bytes,
        "operator": nnz * 2 * (FLOAT + 4) + (2 * n + h + 2) * 4
        + (blocks * 8 + min(shape.cut_entries, n * blocks) * (INDEX + 8) if sequential else 0),
        "ids, labels, plan": n * (3 * INDEX + 3) + h * 3 * INDEX + S * 3 * INDEX,
        "parameters, Adam": params * FLOAT * 5,
    }
    if sparse_copy:
        persistent["sparse input features"] = sparse_features.copy_bytes(n + h, num_features, shape.feature_density)
    through_memory = [w for w, o in zip(exchanged, overlapped) if o and config.shared_halo]
    if not sequential and len(peers):
        # send rows and returned gradients, one buffer per distinct width (layers of one width share it)
        persistent["exchange buffers"] = 2 * S * sum(set(exchanged) - set(through_memory)) * FLOAT
    if through_memory:
        # its slot (the widest row times its send or halo rows, gnn_dist.halo.shared), and about as many pages
        # of the peers' slots it reads (their rows for its halo, their gradients of its send rows): RSS counts
        # both
        persistent["shared halo slots"] = 2 * max(S, h) * max(through_memory) * FLOAT
    if len(peers):
        # Rows the schedule keeps between epochs, per exchanged layer (gnn_dist.schedules).
        # an attention layer cannot leave absent rows out (its softmax), so a schedule may cache them there
        rows_kept = (lambda s: s.cached_rows_under_attention(h, S)) if conv.attention else (lambda s: s.cached_rows(h, S))
        persistent["schedule caches"] = sum(rows_kept(s) * w for s, w in zip(schedules, exchanged)) * FLOAT \
            + sum(s.state_bytes(n, h, S) for s in {id(s): s for s in schedules}.values())

    setup = Liveness({"process": persistent["process"]})
    setup.alloc("part file", 0 if on_gpu else part_file_bytes(shape, num_features))
    # on a GPU the normalisation terms are computed on the host: the device sees the CSR build only
    setup.alloc("operator build", nnz * (DEVICE_SETUP_BYTES_PER_ENTRY if on_gpu else SETUP_BYTES_PER_ENTRY))
    setup.alloc("operator", persistent["operator"])

    link = shape.link if config.task == "link" else None
    if link is not None:
        persistent["link pairs"] = link_pairs_bytes(link)
    train = Liveness(persistent)
    _forward(train, config, widths, sizes, training=True, loss=link is None)
    if link is not None:
        plan_link_scoring(train, config, link, n, widths[-1][1])
    _backward(train, config, widths, sizes, loss=link is None)

    evaluation = Liveness(persistent)
    _forward(evaluation, config, widths, sizes, training=False)
    if link is not None:
        plan_link_evaluation(evaluation, link, n, widths[-1][1])

    return {phase: MemoryPlan(peak=live.peak, phase=phase, parts=live.at_peak)
            for phase, live in (("setup", setup), ("train", train), ("eval", evaluation))}


def plan_part(shape: PartShape, config: PlanConfig, num_features: int, num_classes: int) -> MemoryPlan:
    """Predicted peak resident bytes of the rank that trains this part: the largest of its phases (on a GPU, the
    device's bytes: what torch.cuda.max_memory_allocated reports)."""
    return max(plan_phases(shape, config, num_features, num_classes).values(), key=lambda plan: plan.peak)


def part_file_bytes(shape: PartShape, num_features: int) -> int:
    """The part file's arrays as loaded (gnn_dist.partition.format)."""
    n, h, S = shape.owned, shape.halo, shape.sent
    return n * (num_features * FLOAT + 4 * INDEX + 3) + h * (3 * INDEX + 4) + shape.entries * INDEX + S * INDEX


def _overlapped_halo_rows(z: _Sizes) -> int:
    """Halo rows (or their gradients) an overlapped exchange holds of its own: none through shared
    memory (they lie in the slots), else the halo's."""
    return 0 if z.shared else z.h


def _forward(live: Liveness, config: PlanConfig, widths, z: _Sizes, training: bool, loss: bool = True) -> None:
    """The model's forward (gnn_dist.steps.layer_stack.LayerStack.forward; evaluation differs only in what it keeps)."""
    model = config.model
    conv = model_class(model.model)
    needs_root = conv.needs_root
    p = model.dropout if training else 0.0
    n = z.n
    for k, (i, o, options) in enumerate(widths):
        aggregate_first, w = conv.aggregation(i, o, **options)
        if k == 0:
            rows = n if z.sequential else n + z.h
            if z.sparse_input_dropped and p > 0:
                # the dropout is drawn on the sparse copy's non-zeros: new values, no dense dropped-out copy
                live.alloc("layer input", z.sparse_input_dropped)
            else:
                copies = p > 0 or z.feature_bytes != FLOAT
                live.alloc("layer input", rows * i * FLOAT if copies else 0)
        else:
            if model.batch_norm:
                live.alloc("batchnorm temporaries", 2 * n * i * FLOAT)
                live.free("batchnorm temporaries")
                live.alloc(f"saved norm {k}", n * i * FLOAT if training else 0)  # x_hat
            if training and p > 0 and z.torch_kernels:
                # torch's ReLU (in place) keeps its output for the backward, the dropout writes a new tensor
                # beside it and keeps a byte per element (gnn_dist.nn.dropout._KeyedDropout)
                live.rename("layer output", f"saved relu {k}")
                live.alloc("layer input", n * i * FLOAT)
                live.alloc(f"saved mask {k}", n * i)
            else:
                live.rename("layer output", "layer input")  # ReLU and dropout run in place (the native kernel)
                if training:
                    # one bit per element, rows padded to whole bytes, the ReLU folded in
                    live.alloc(f"saved mask {k}", n * ((i + 7) // 8) if p > 0 else 0)
        if not aggregate_first:
            live.alloc("transformed rows", (n + z.h if k == 0 and not z.sequential else n) * o * FLOAT)
        if z.sequential:
            # one block: the rows sent, then the rows received and their product into the touched rows
            live.alloc("halo block", (z.block + max(z.sent_block, z.touched)) * w * FLOAT
                       + (z.block * i * FLOAT if k == 0 else 0))
        elif k > 0:
            # training's overlapped exchange holds the halo's rows alone (evaluation: LayerStack.forward_layerwise)
            live.alloc("halo rows", _overlapped_halo_rows(z) * w * FLOAT if training and z.overlapped[k - 1]
                       else (n + z.h) * w * FLOAT)
        if conv.attention:
            # the aggregated rows [x W | a_src] stay for the backward (it recomputes the attention from them)
            live.rename("halo rows" if k > 0 and not z.sequential else "transformed rows",
                        f"saved source {k}" if training else "source")
        live.alloc("aggregated", n * w * FLOAT)
        live.free("halo block", "halo rows", "transformed rows", "source")
        keep_input = training and (not aggregate_first or needs_root or (k > 0 and p == 0))
        if keep_input:
            live.rename("layer input", f"saved input {k}")
        elif aggregate_first and not needs_root and (z.sequential or k > 0):
            live.free("layer input")  # the conv took the only reference and freed it after aggregating
        if aggregate_first:
            live.alloc("layer output", n * o * FLOAT)
            if training:
                live.rename("aggregated", f"saved aggregation {k}")
        else:
            live.rename("aggregated", "layer output")
        scratch, saved = conv.update_memory(i, o, **options)
        live.alloc("update scratch", n * scratch * FLOAT)
        live.alloc(f"saved update {k}", n * saved * FLOAT if training else 0)
        live.free("aggregated", "update scratch", "layer input")
    # the loss's temporaries: a chunk of the logits' rows and its log-sum-exp (gnn_dist.nn.cross_entropy)
    live.alloc("loss", 2 * min(CHUNK_ROWS, n) * widths[-1][1] * FLOAT if training and loss else 0)


def _backward(live: Liveness, config: PlanConfig, widths, z: _Sizes, loss: bool = True) -> None:
    """Gradients flow back layer by layer; each saved tensor goes when the step that needed it is done. loss:
    the node task's cross-entropy, whose backward makes the logits' gradient while it still holds them."""
    n = z.n
    if loss:
        live.alloc("output gradient", n * widths[-1][1] * FLOAT)
        live.free("layer output", "loss")
    else:
        live.free("layer output")
        live.alloc("output gradient", n * widths[-1][1] * FLOAT)
        live.free("loss")
    conv = model_class(config.model.model)
    for k in reversed(range(len(widths))):
        i, o, options = widths[k]
        aggregate_first, w = conv.aggregation(i, o, **options)
        if conv.attention:
            heads = options.get("heads", 1)
            # The native kernel keeps two [E x H] buffers; the torch formulation (a GPU, or GNN_DIST_KERNEL=torch)
            # more.
            extra = torch_backward_elements(z.entries, heads, (w - heads) // heads) if z.torch_kernels else 0
            live.alloc("attention buffers", (2 * z.entries * heads + extra) * FLOAT)
        if aggregate_first:
            if k == 0:
                break  # the first layer aggregates constant inputs: only its weight gradient remains
            live.alloc("aggregation gradient", n * w * FLOAT)  # through the output transform
        if conv.needs_root and k > 0:
            # the root term's gradient (SAGE's lin_r), made beside the aggregation's from the output gradient and
            # kept until both are summed into the input's
            live.alloc("root gradient", n * i * FLOAT)
        if aggregate_first:
            live.free(f"saved aggregation {k}", "output gradient", f"saved update {k}")
        else:
            live.rename("output gradient", "aggregation gradient")
        # through the aggregation: A^T times the gradient, the halo rows' share going back to their owners
        live.alloc("halo gradient", (z.block + max(z.sent_block, z.touched)) * w * FLOAT if z.sequential
                   else (_overlapped_halo_rows(z) if k > 0 and z.overlapped[k - 1] else n + z.h) * w * FLOAT)
        live.alloc("input gradient", n * w * FLOAT)
        live.free("halo gradient", "aggregation gradient", "attention buffers", f"saved source {k}")
        if not aggregate_first:
            if k == 0:
                break
            live.alloc("input gradient", n * (i - w) * FLOAT)  # through the input transform: width i
        live.free(f"saved input {k}")
        live.alloc("output gradient", n * i * FLOAT)  # through ReLU and dropout, into the layer below
        live.free("input gradient", "root gradient", f"saved mask {k}")
        if z.torch_kernels and config.model.dropout > 0:
            live.alloc("relu gradient", n * i * FLOAT)  # torch's ReLU backward: a second tensor
            live.free("output gradient", f"saved relu {k}")
            live.rename("relu gradient", "output gradient")
        if config.model.batch_norm:
            live.alloc("input gradient", n * i * FLOAT)
            live.free("output gradient", f"saved norm {k}")
            live.rename("input gradient", "output gradient")


def plan_config_of(train_config) -> PlanConfig:
    """The planner's view of a gnn_dist.config.TrainConfig."""
    return PlanConfig(model=train_config.model, halo_memory=train_config.halo_memory, schedule=train_config.schedule,
                      halo_block_rows=train_config.halo_block_rows, feature_dtype=train_config.feature_dtype,
                      eval_chunk_nodes=train_config.eval_chunk_nodes, task=train_config.task,
                      neg_ratio=train_config.link.neg_ratio, decoder=train_config.link.decoder,
                      negatives=train_config.link.negatives, mode=train_config.mode, device=train_config.device,
                      shared_halo=shared_halo_enabled() and train_config.halo_dtype == "fp32")


