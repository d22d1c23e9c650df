"""BatchNorm1d in a wrapped model: batch statistics over every rank's owned rows, as on the whole graph.

torch's BatchNorm1d (and PyG's BatchNorm, which holds one) inside a model given to gd.distribute keeps its
parameters, buffers and state_dict keys; only its forward in training is replaced, while a wrapped forward
runs, by gnn_dist.nn.batch_norm's synchronised statistics (the global mean and biased variance normalise, the
unbiased variance updates the running statistics, momentum as the layer's). Evaluation, and any call outside
a wrapped forward, is torch's own.
"""
from __future__ import annotations

import torch
from torch import nn

from gnn_dist.nn.batch_norm import synchronised_batch_norm
from gnn_dist.pyg import passes


def unsupported(norm: nn.modules.batchnorm._BatchNorm) -> str | None:
    """Why a BatchNorm layer cannot be synchronised, or None."""
    if not isinstance(norm, nn.BatchNorm1d):
        return f"{type(norm).__name__}: gd.distribute synchronises BatchNorm1d only"
    if not norm.affine or not norm.track_running_stats or norm.momentum is None:
        return "gd.distribute synchronises BatchNorm1d with affine=True, track_running_stats=True and a momentum"
    return None


def synchronise(norm: nn.BatchNorm1d, graph) -> None:
    """Route norm's training forward inside the wrapped forwards over graph through the synchronised one."""
    original = norm.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        active = passes.current()
        if active is None or active.graph is not graph or not norm.training:
            return original(x)
        if x.dim() != 2:
            raise ValueError(f"BatchNorm1d on a tensor of shape {tuple(x.shape)}: gd.distribute synchronises "
                             f"[rows, features] inputs only")
        norm.num_batches_tracked.add_(1)  # as torch's forward counts them
        return synchronised_batch_norm(x, norm.weight, norm.bias, norm.running_mean, norm.running_var,
                                       norm.eps, norm.momentum, graph.exchanger.allreduce_)

    norm.forward = forward
