"""A run, from its TrainConfig to its final record: set-up (setup.py: load, agree, plan, refuse, build), the
epoch loop and `train()` (loop.py), and the divergence guard that holds a lossy schedule to exact exchanges
while the loss climbs (guard.py). A user's PyG model (--model MODULE_OR_FILE:NAME) runs the same loop's
figures, checkpoints and guard through gd.distribute (user_model.py). What one epoch does on a rank is
gnn_dist.steps'.

May import: comm, config, context, device, graph, halo, kernels, log, memory, metrics, models, nn, options,
    partition, partition_report, plan, plugins, pyg, resilience, schedules, steps, tasks
"""
from gnn_dist.steps.state import RankState, TrainingDiverged
from gnn_dist.training.loop import run_epochs, train
from gnn_dist.training.setup import setup

__all__ = ["RankState", "TrainingDiverged", "run_epochs", "setup", "train"]
