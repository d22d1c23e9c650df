"""What one rank holds while it trains (`RankState`), passed explicitly to every part of the trainer."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from gnn_dist.config import TrainConfig
from gnn_dist.context import RankContext, SetupError
from gnn_dist.graph.local_graph import LocalGraph
from gnn_dist.halo.exchange import HaloExchanger
from gnn_dist.memory.rss import PhasePeaks
from gnn_dist.metrics import MetricsWriter
from gnn_dist.steps.layer_stack import LayerStack


class TrainingDiverged(SetupError):
    """The (globally reduced) loss is NaN or infinite; every rank sees the same value."""


@dataclass
class RankState:
    ctx: RankContext
    config: TrainConfig
    graph: LocalGraph
    exchanger: HaloExchanger
    x_full: torch.Tensor  # [owned | halo] input features: the halo fetched once at start-up
    model: LayerStack
    optimizer: torch.optim.Optimizer
    num_train: int
    metrics: MetricsWriter
    dataset: str
    setup_halo_bytes: int
    partition_id: str
    watchdog: object
    mode: object = None  # the training mode (gnn_dist.steps.mode.TrainingMode)
    graph_identity: dict | None = None  # what checkpoints record of the graph (gnn_dist.resilience.checkpoint.graph_identity)
    start_epoch: int = 0
    epochs_run: int = 0  # training epochs this process executed (a resumed run skips the restored ones)
    records: list = dataclasses.field(default_factory=list)
    memory: PhasePeaks | None = None  # peak RSS per phase (set by train(); absent when a test drives the steps)
    guard: object = None  # the divergence guard of a lossy schedule (gnn_dist.training.guard), else None
    val_majority_rate: float | None = None  # the validation accuracy of always answering the most common class
    task: object = None  # what the run learns (gnn_dist.tasks.base.Task)
    peers: object = None  # this rank's watch over its ring neighbours (gnn_dist.comm.peers.PeerMonitor), real MPI only
    task_data: object = None  # the task's own data on this rank (link prediction: gnn_dist.link.pairs.LinkPairs)
    device: torch.device = torch.device("cpu")  # where this rank computes (--device; gnn_dist.device)
    # the memory plan's prediction for this rank (full-batch mode; None where no plan is made): host bytes, and
    # device bytes on a GPU (gnn_dist.plan.host.plan_host and gnn_dist.plan.memory.plan_part)
    planned_host_bytes: int | None = None
    planned_device_bytes: int | None = None


def sum_over_ranks(ctx: RankContext, values: list[float]) -> list[float]:
    buf = torch.tensor(values, dtype=torch.float64)  # host: scalars reduced over the host communicator
    if ctx.size > 1:
        ctx.comm.allreduce_(buf)
    return buf.tolist()


def max_over_ranks(ctx: RankContext, values: list[float]) -> list[float]:
    buf = torch.tensor(values, dtype=torch.float64)  # host: scalars reduced over the host communicator
    if ctx.size > 1:
        ctx.comm.allreduce_(buf, op="max")
    return buf.tolist()
