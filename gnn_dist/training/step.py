"""The training step of a mode, and the one gradient synchronisation every step uses.

    class Step(Protocol):
        def train_epoch(self, epoch: int) -> dict: ...
            # one epoch of optimiser steps; returns {"loss": the global mean training loss, ...}
        def epoch_metrics(self, figures: dict, epoch_s: float) -> dict: ...
            # the mode's own per-epoch figures for the metrics record (reduced over ranks)

Full-batch training (gnn_dist.training.full_batch) takes one step per epoch;
sampled training (gnn_dist.training.mini_batch) takes many. Each owns the flat
buffer its gradients travel in.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from gnn_dist.flat import pack_into, unpack_from


class Step(Protocol):
    def train_epoch(self, epoch: int) -> dict: ...

    def epoch_metrics(self, figures: dict, epoch_s: float) -> dict: ...


def flat_buffer(params: list[torch.Tensor], extras: int) -> torch.Tensor:
    """One buffer for every gradient and `extras` scalars (allocated once per run)."""
    return torch.zeros(sum(p.numel() for p in params) + extras)


def sync_gradients(exchanger, params: list[torch.Tensor], flat: torch.Tensor, extras: list,
                   divisor: Callable[[list[float]], float] | None = None) -> list[float]:
    """Sum every rank's gradients and `extras` (loss, counts) in one Allreduce of `flat`.

    Afterwards each parameter's .grad holds the sum over ranks, divided by
    divisor(summed extras) when given; returns the summed extras.
    """
    grads = flat[:flat.numel() - len(extras)]
    pack_into(params, grads, grads=True)
    for k, value in enumerate(extras):
        flat[grads.numel() + k] = value
    exchanger.allreduce_(flat)
    totals = flat[grads.numel():].tolist()
    if divisor is not None:
        grads.div_(divisor(totals))
    unpack_from(params, grads, grads=True)
    return totals
