"""What a training mode is (`--mode full|sampled`): the protocol the epoch loop drives.

    class TrainingMode(Protocol):
        def train_epoch(self, epoch: int) -> dict: ...
            # one epoch of optimiser steps; returns {"loss": the global mean training loss, ...}
        def epoch_metrics(self, figures: dict, epoch_s: float) -> dict: ...
            # the mode's own per-epoch figures for the metrics record (reduced over ranks)

Full-batch training (gnn_dist.steps.full_batch) takes one optimiser step per
epoch; sampled training (gnn_dist.steps.mini_batch) takes many. Each owns the
flat buffer its gradients travel in (gnn_dist.steps.gradients).
"""
from __future__ import annotations

from typing import Protocol


class TrainingMode(Protocol):
    def train_epoch(self, epoch: int) -> dict: ...

    def epoch_metrics(self, figures: dict, epoch_s: float) -> dict: ...
