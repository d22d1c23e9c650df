"""The one gradient synchronisation every training mode uses: all gradients (and a few scalars) summed over
ranks in one Allreduce of one flat buffer."""
from __future__ import annotations

from collections.abc import Callable

import torch

from gnn_dist.steps.flat import pack_into, unpack_from


def replicated_parameters(model) -> list[torch.Tensor]:
    """The parameters every rank holds alike, whose gradients the allreduce sums: all of a model's, but a typed
    model's embedding shards (gnn_dist.hetero.stack.TypedStack.sharded_parameters: each rank's own rows)."""
    chosen = getattr(model, "replicated_parameters", None)
    return chosen() if chosen is not None else list(model.parameters())


def flat_buffer(params: list[torch.Tensor], extras: int, device: torch.device | None = None) -> torch.Tensor:
    """One buffer for every gradient and `extras` scalars (allocated once per run), on `device` (by default the
    parameters')."""
    if device is None:
        device = params[0].device if params else torch.device("cpu")
    return torch.zeros(sum(p.numel() for p in params) + extras, device=device)


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
