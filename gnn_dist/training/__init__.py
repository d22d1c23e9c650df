"""Distributed training: set-up (setup.py), the training modes (mode.py: full_batch.py,
mini_batch.py), evaluation (evaluation.py) and the epoch loop with `train()` (loop.py)."""
from gnn_dist.training.loop import run_epochs, train
from gnn_dist.training.setup import setup
from gnn_dist.training.state import RankState, TrainingDiverged

__all__ = ["RankState", "TrainingDiverged", "run_epochs", "setup", "train"]
