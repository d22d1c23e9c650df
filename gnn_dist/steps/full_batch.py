"""Full-batch training (`--mode full`): one optimiser step per epoch over every owned training node.

P-invariance (the `exact` schedule reproduces one process on the whole graph):
the loss is the sum over owned training nodes divided by the global number of
training nodes, and gradients are summed across ranks (one Allreduce of one
flat buffer per step, which also carries the loss); dropout masks are keyed
by (seed, epoch, layer, original node id).
"""
from __future__ import annotations

import math

import torch

from gnn_dist.nn.cross_entropy import rows_cross_entropy
from gnn_dist.steps.gradients import flat_buffer, replicated_parameters, sync_gradients
from gnn_dist.steps.state import TrainingDiverged


class FullBatchMode:
    def __init__(self, state, part=None):
        self.state = state
        self.params = replicated_parameters(state.model)
        self.flat = flat_buffer(self.params, extras=1)  # gradients, then the loss
        graph = state.graph
        self.train_rows = graph.train_mask.nonzero().squeeze(1)
        self.train_labels = graph.y.index_select(0, self.train_rows)

    def compute_gradients(self, epoch: int) -> float:
        """Forward and backward on this rank, then gradients (and the loss) summed over ranks.

        Afterwards every rank holds the gradient of the global mean training loss; returns that loss.
        """
        state = self.state
        model = state.model
        model.train()
        model.epoch = epoch
        state.optimizer.zero_grad(set_to_none=False)
        # chunked: no [training rows, classes] copy of the logits (gnn_dist.nn.cross_entropy); the loss keeps
        # the logits until its backward has made their gradient, then they go
        loss = rows_cross_entropy(model(state.x_full), self.train_rows, self.train_labels) / state.num_train
        loss.backward()
        (global_loss,) = sync_gradients(state.exchanger, self.params, self.flat, [loss.detach()])
        return global_loss

    def train_epoch(self, epoch: int) -> dict:
        loss = self.compute_gradients(epoch)
        check_finite(loss, epoch)
        with torch.profiler.record_function("optimizer step"):
            self.state.optimizer.step()
        return {"loss": loss}

    def epoch_metrics(self, figures: dict, epoch_s: float) -> dict:
        return {}


def check_finite(loss: float, epoch: int) -> None:
    """Every rank holds the same reduced loss, so every rank raises alike."""
    if not math.isfinite(loss):
        raise TrainingDiverged(f"loss became {loss} at epoch {epoch}: lower --lr, or check the input "
                               f"features for NaN/inf")
