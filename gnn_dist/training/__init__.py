"""Distributed training: set-up (setup.py), the training modes (mode.py: full_batch.py,
mini_batch.py), evaluation (evaluation.py) and the epoch loop with `train()` (loop.py).

May import: comm, config, context, device, graph, halo, kernels, log, memory, metrics, models, nn, partition,
    partition_report, plan, resilience, schedules, steps, tasks
"""
from gnn_dist.steps.state import RankState, TrainingDiverged
from gnn_dist.training.loop import run_epochs, train
from gnn_dist.training.setup import setup

__all__ = ["RankState", "TrainingDiverged", "run_epochs", "setup", "train"]
