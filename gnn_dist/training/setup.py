"""A rank's set-up: load its part, agree on errors, plan memory, fetch halo features, build the model and the
training step of the mode, and restore a checkpoint.

Initial weights come from the same seed and are broadcast from rank 0, so
every P starts from the same model. Set-up problems (missing or corrupt part
file, wrong rank count, unwritable directories) are agreed on by all ranks
before the first collective, so rank 0 can report them once and every rank
exits cleanly. Anything raised later is fatal to the job (gnn_dist.cli).
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
from pathlib import Path

import numpy as np
import torch

from gnn_dist.comm.codec import make_codec
from gnn_dist.comm.communicator import first_failure
from gnn_dist.comm.peers import PeerMonitor
from gnn_dist.comm.simulated_link import LinkModel, ModelledLinkComm
from gnn_dist.config import FEATURE_DTYPES, TrainConfig
from gnn_dist.context import RankContext, SetupError
from gnn_dist.device import HOST, device_comm, rank_device
from gnn_dist.graph.local_graph import LocalGraph
from gnn_dist.halo.exchange import HaloExchanger
from gnn_dist.halo.overlap import agreed_overlap
from gnn_dist.halo.plan import HaloPlan
from gnn_dist.halo.shared import SharedHalo
from gnn_dist.kernels.native import native_module
from gnn_dist.log import rank_logger
from gnn_dist.memory.host import RankMemory, available_memory_bytes, host_budget_bytes, memory_refusal
from gnn_dist.memory.rss import current_rss_bytes
from gnn_dist.metrics import MetricsWriter
from gnn_dist.models import model_class
from gnn_dist.nn import sparse_features
from gnn_dist.partition.format import load_meta, load_part, part_shape
from gnn_dist.partition_report import edge_imbalance_warning
from gnn_dist.plan.host import plan_host
from gnn_dist.plan.memory import MemoryPlan, plan_config_of, plan_part
from gnn_dist.plan.sampled import BatchShape, largest_chunk_entries, plan_sampled, plan_sampled_setup
from gnn_dist.plan.typed import TypedShape, plan_typed, typed_shape
from gnn_dist.plan.typed_sampled import (
    EvaluationChunks,
    SampledBatchShape,
    plan_typed_sampled,
    plan_typed_sampled_setup,
)
from gnn_dist.resilience.checkpoint import graph_identity, load_checkpoint
from gnn_dist.resilience.sharded import sharded_rows
from gnn_dist.resilience.watchdog import NoWatchdog, Watchdog
from gnn_dist.schedules import parse_schedule, schedule_for_model
from gnn_dist.steps.flat import pack_into, unpack_from
from gnn_dist.steps.gradients import flat_buffer, replicated_parameters
from gnn_dist.steps.state import RankState, sum_over_ranks
from gnn_dist.tasks import task_class
from gnn_dist.training.guard import DivergenceGuard


def agree_on_setup(ctx: RankContext, build) -> object:
    """Run the rank-local set-up; if any rank fails, every rank raises the same SetupError.

    This is the only point before which ranks may fail independently without
    a hang: nothing before it communicates.
    """
    try:
        result, error = build(), None
    except Exception as err:  # noqa: BLE001 - reported to all ranks below
        result, error = None, f"{err}" if isinstance(err, (ValueError, SetupError, OSError)) else f"{type(err).__name__}: {err}"
    failure = first_failure(ctx.comm, error)
    if failure:
        rank, msg, everyone_alike = failure
        raise SetupError(msg if everyone_alike else f"rank {rank}: {msg}")
    return result


def setup(ctx: RankContext, config: TrainConfig, peers: PeerMonitor | None = None) -> RankState:
    """peers: the rank's watch over its neighbours (gnn_dist.comm.peers; train() starts it), named by the watchdog when
    it finds the job stalled."""
    torch.set_num_threads(config.threads)

    def build_local():
        config.validate()
        meta = load_meta(config.parts)
        ctx.check_num_parts(meta.num_parts, config.parts)
        task = task_class(config.task)(config, meta)
        task.check_partition()
        part = load_part(config.parts, ctx.rank, meta)
        if config.checkpoint_dir:
            check_writable(config.checkpoint_dir, "--checkpoint-dir")
        if config.profile:
            check_writable(config.profile, "--profile")
        native_module()  # build (or load) the kernel now, not inside the first epoch the watchdog times
        metrics = MetricsWriter(config.metrics_out if ctx.is_root else None,
                                tensorboard=config.tensorboard if ctx.is_root else None)
        return meta, part, metrics, task

    meta, part, metrics, task = agree_on_setup(ctx, build_local)  # type: ignore[misc]
    if ctx.is_root and config.mode == "full":
        uneven = edge_imbalance_warning(meta, config.model.model)
        if uneven:
            rank_logger(ctx.rank).warning(uneven)
    device = rank_device(config.device, ctx.comm)
    # Training's data exchanges go through this communicator: under --simulate-link, a modelled network; on a
    # GPU, staged through pinned host buffers (gnn_dist.device).
    comm = ModelledLinkComm(ctx.comm, LinkModel.parse(config.simulate_link)) if config.simulate_link else ctx.comm
    comm = device_comm(comm, device)
    overlap = agree_on_setup(ctx, lambda: agreed_overlap(ctx.comm))
    shared = None
    if config.mode == "full" and overlap:
        # One host: the overlapped exchanges' rows go through shared memory instead of MPI's copies.
        shared = agree_on_setup(ctx, lambda: SharedHalo.open(comm, np.diff(part.send_ptr)))
    # a typed part's counts, which both of a typed sampled run's plans read (counted once: a pass over its entries)
    typed_counts = typed_shape(part.arrays, part.meta) if meta.hetero is not None else None
    # sampled training (typed graphs, and homogeneous ones on a CPU): set-up's plan now (no batch yet), the whole
    # plan once its sampler exists
    planned = refuse_if_memory_short(ctx, config, part, task, device, shared_halo=shared is not None,
                                     typed_counts=typed_counts) \
        if config.mode == "full" or device.type == "cpu" or meta.hetero is not None else (None, None)
    # Simulated ranks (threads of one process) have no job to abort: no watchdog there.
    watchdog = Watchdog(config.timeout, ctx.rank, ctx.comm.abort, explain=peers.unreachable if peers else None) \
        if config.timeout != 0 and ctx.comm.aborts_job else NoWatchdog()
    watchdog.beat("set-up: fetching halo input features")
    plan = HaloPlan.from_part(part, device)
    exchanger = HaloExchanger(comm, plan, codec=make_codec(config.halo_dtype, config.seed, ctx.rank),
                              schedule=schedule_for_model(config.schedule, config.seed, config.model.num_layers - 1),
                              beat=watchdog.beat, overlap=overlap, shared=shared)
    # Sampled training aggregates over its batches' blocks and evaluates chunk by chunk from the part's CSR,
    # so only full-batch training builds the whole part's operator and its transpose; sequential halos
    # build it split into column blocks instead.
    blocked_by = None
    if config.halo_memory == "sequential":
        blocked_by = (np.array(ctx.comm.allgather_object(plan.send_counts.tolist()), dtype=np.int64),
                      config.halo_block_rows)
    # a typed graph's operator is per relation, the typed stack's own (gnn_dist.hetero.typed_part)
    typed = meta.hetero is not None
    graph = LocalGraph.from_part(part, None if typed else model_class(config.model.model).normalise,
                                 whole_operator=config.mode == "full" and not typed,
                                 blocked_by=None if typed else blocked_by,
                                 device=device, row_access=not typed)
    # a typed graph's inputs are per type, the model's own (gnn_dist.hetero.inputs): nothing to cache here
    x_full = torch.cat([graph.x, exchanger.fetch_once(graph.x)]) if meta.hetero is None \
        else torch.zeros(part.n_owned + part.n_halo, 0, device=device)
    if config.feature_dtype != "fp32":
        x_full = x_full.to(FEATURE_DTYPES[config.feature_dtype])
    if config.mode == "sampled":
        # Sampling and feature serving stay on the host (the keyed draw is a CPU kernel); each batch's rows
        # move to the device when it trains (gnn_dist.steps.mini_batch).
        x_full = x_full.cpu()
    graph = dataclasses.replace(graph, x=x_full[:graph.n_owned])  # one copy of the features, not two
    if config.mode == "sampled":
        # Sampled mode keeps the part (its CSR) for sampling and evaluation: point its features at the same
        # rows too, or the part file's copy would stay resident beside x_full.
        part.arrays["x"] = graph.x.numpy()
    setup_halo_bytes = sum_over_ranks(ctx, [exchanger.counters.halo_bytes])[0]
    exchanger.counters.reset()

    model = task.build_model(graph, exchanger, part, halo_blocking=blocked_by if typed else None).to(device)
    output_rows = getattr(model, "output_rows", None)
    if output_rows is not None:
        # a typed graph's model outputs its target type's owned rows only: the labels and masks follow them
        graph = dataclasses.replace(graph, y=graph.y[output_rows], train_mask=graph.train_mask[output_rows],
                                    val_mask=graph.val_mask[output_rows], test_mask=graph.test_mask[output_rows])
    first = model.convs[0]
    if sparse_features.wanted(config, meta.feature_density, type(first), first.in_dim, first.out_dim):
        first.input_features = sparse_features.SparseFeatures.of(x_full)
    broadcast_parameters(ctx, replicated_parameters(model))
    optimizer = torch.optim.Adam(parameter_groups(model, config), lr=config.lr, weight_decay=config.weight_decay)
    state = RankState(ctx, config, graph, exchanger, x_full, model, optimizer, meta.num_train, metrics,
                      meta.dataset, setup_halo_bytes, meta.partition_id, watchdog, task=task, peers=peers,
                      device=device, planned_host_bytes=planned[0], planned_device_bytes=planned[1])
    if config.checkpoint_dir:
        state.graph_identity = graph_identity(ctx.comm, meta, part.node_ids, part.y, part.deg[:part.n_owned])
    task.prepare(state, part)
    lossy = any(s.kind != "exact" for s in parse_schedule(config.schedule).per_layer(config.model.num_layers - 1))
    if lossy and config.schedule_guard == "on":
        state.guard = DivergenceGuard(majority_rate=task.collapse_level(state), **task.guard_names)
    watchdog.beat(f"set-up: the {config.mode} training mode")
    state.mode = task.training_mode(state, part)
    if config.mode == "sampled":
        watchdog.beat("set-up: the memory plan of a sampled batch")
        state.planned_host_bytes = refuse_if_sampled_memory_short(ctx, config, part, state.mode, task, typed_counts)
    if config.resume:
        watchdog.beat("set-up: loading the checkpoint")
        resume(state, metrics)
    return state


def parameter_groups(model, config: TrainConfig) -> list[dict]:
    """Adam's parameter groups: every parameter in one, or, with --embedding-weight-decay on a model with
    embedding tables, the tables in a second group with their own decay (after the others, in model order)."""
    tables = [parameter for parameter, _ in sharded_rows(model).values()]
    if config.embedding_weight_decay is None:
        return [{"params": list(model.parameters())}]
    if not tables:
        raise SetupError("--embedding-weight-decay: this graph has no featureless types, so no embedding tables: "
                         "drop the option")
    table_ids = {id(t) for t in tables}
    return [{"params": [p for p in model.parameters() if id(p) not in table_ids]},
            {"params": tables, "weight_decay": config.embedding_weight_decay}]


def broadcast_parameters(ctx: RankContext, params: list[torch.Tensor]) -> None:
    """Same seed gives the same weights; the broadcast from rank 0 makes it true even across torch builds."""
    flat = flat_buffer(params, extras=0, device=HOST)  # the host communicator: the weights go through the host
    pack_into(params, flat, grads=False)
    ctx.comm.bcast_(flat)
    unpack_from(params, flat, grads=False)


def resume(state: RankState, metrics: MetricsWriter) -> None:
    ctx, directory = state.ctx, state.config.checkpoint_dir
    log = rank_logger(ctx.rank)
    restored = agree_on_setup(ctx, lambda: load_checkpoint(state, directory))
    if restored is None:
        if ctx.is_root:
            log.warning(f"no complete checkpoint in {directory}: starting at epoch 0")
        return
    state.start_epoch, state.records = restored
    if ctx.is_root:
        log.warning(f"resuming at epoch {state.start_epoch} from the checkpoint in {directory}")
    for record in state.records:
        metrics.write(record)


def refuse_if_memory_short(ctx: RankContext, config: TrainConfig, part, task, device: torch.device = HOST,
                           shared_halo: bool = False, typed_counts: TypedShape | None = None) -> tuple[int, int | None]:
    """Plan this rank's peak (gnn_dist.plan.memory) and refuse on every rank, before the big allocations, if any
    host's ranks would not fit (or a rank would pass --memory-limit). On a GPU the host's plan (the process,
    the part file, the pinned staging buffers) is checked against the host, and the device's plan (every
    tensor training makes) against the GPU: the ranks sharing each GPU must fit in what it has free.
    shared_halo: whether the job's overlapped exchanges go through shared memory (gnn_dist.halo.shared).
    typed_counts: a typed part's counts (gnn_dist.plan.typed.typed_shape), where the caller has them.
    Returns this rank's predicted peaks: (host bytes, device bytes or None)."""
    plan_config = plan_config_of(config)
    plan_config = dataclasses.replace(plan_config, device=device.type,
                                      shared_halo=plan_config.shared_halo and shared_halo)
    width = task.output_width()
    if part.meta.hetero is not None and typed_counts is None:
        typed_counts = typed_shape(part.arrays, part.meta)
    if part.meta.hetero is not None and config.mode == "sampled":  # set-up's share of gnn_dist.plan.typed_sampled
        shape, host = None, plan_typed_sampled_setup(typed_counts, plan_config, width)
    elif config.mode == "sampled":  # set-up's share of gnn_dist.plan.sampled (a CPU rank's)
        shape, host = None, plan_sampled_setup(part_shape(part), plan_config, part.meta.num_features, width)
    elif part.meta.hetero is not None:  # a typed graph's plan (gnn_dist.plan.typed): the host's, no device plan
        shape, host = None, plan_typed(typed_counts, plan_config, width)
    else:
        shape = part_shape(part)
        host = plan_host(shape, plan_config, part.meta.num_features, width)
    reason = host_refusal(ctx, config, host)
    on_device = plan_part(shape, plan_config, part.meta.num_features, width) \
        if device.type == "cuda" and shape is not None else None
    if reason is None and on_device is not None:
        free, _ = torch.cuda.mem_get_info(device)
        on_gpu = RankMemory(f"{socket.gethostname()} GPU {device.index}", on_device.peak, on_device.summary(3),
                            torch.cuda.memory_allocated(device), free)
        reason = memory_refusal(ctx.comm.allgather_object(on_gpu), None)
    if reason is not None:
        raise SetupError(reason)
    return host.peak, None if on_device is None else on_device.peak


def host_refusal(ctx: RankContext, config: TrainConfig, host: MemoryPlan) -> str | None:
    """Why the job's ranks would not fit their hosts (or a rank would pass --memory-limit) with these planned
    peaks, every rank's gathered (collective); None when they fit."""
    mine = RankMemory(socket.gethostname(), host.peak, f"in {host.phase}: {host.summary(3)}", current_rss_bytes(),
                      available_memory_bytes(), host_budget_bytes())
    return memory_refusal(ctx.comm.allgather_object(mine), config.memory_limit)


def refuse_if_sampled_memory_short(ctx: RankContext, config: TrainConfig, part, mode, task,
                                   typed_counts: TypedShape | None) -> int | None:
    """Sampled mode plans its peak from a real batch (gnn_dist.plan.sampled, gnn_dist.plan.typed_sampled: epoch
    0's first), so only once its sampler is built, before the first epoch: refuse on every rank if any host's
    ranks would not fit. Returns this rank's predicted peak (None without a plan: a homogeneous graph's sampled
    training on a GPU, whose batches live on the device)."""
    cache_bytes = int(config.sampled.feature_cache_mb * 2**20) if mode.caching else 0
    if part.meta.hetero is None:
        if config.device != "cpu":
            return None
        _, blocks = mode.first_batch()
        host = plan_sampled(part_shape(part), BatchShape.of(blocks), plan_config_of(config), part.meta.num_features,
                            task.output_width(),
                            largest_chunk_entries(part.indptr, part.n_owned, config.eval_chunk_nodes), cache_bytes)
    else:
        names, blocks = mode.first_batch()
        host = plan_typed_sampled(typed_counts, SampledBatchShape.of(names, blocks, mode.sampler.num_types),
                                  EvaluationChunks.of(part.arrays, part.meta, config.eval_chunk_nodes),
                                  plan_config_of(config), task.output_width(), cache_bytes)
    reason = host_refusal(ctx, config, host)
    if reason is not None:
        raise SetupError(reason)
    return host.peak


def check_writable(directory: str, option: str) -> None:
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}-{threading.get_ident()}"  # simulated ranks share a pid
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise SetupError(f"{option} {directory} is not writable ({err.strerror or err}): choose a directory you "
                         f"can write to") from err
