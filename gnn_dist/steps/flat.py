"""Parameters and gradients as one flat buffer: one Allreduce (or Bcast) moves them all."""
from __future__ import annotations

from collections.abc import Iterable

import torch


def pack_into(params: Iterable[torch.Tensor], flat: torch.Tensor, grads: bool) -> None:
    """Copy every parameter (or its gradient; a missing one as zeros) into consecutive slices of `flat`."""
    offset = 0
    for p in params:
        n = p.numel()
        source = p.grad if grads else p.data
        if source is None:
            flat[offset:offset + n].zero_()
        else:
            flat[offset:offset + n].copy_(source.reshape(-1))
        offset += n


def unpack_from(params: Iterable[torch.Tensor], flat: torch.Tensor, grads: bool) -> None:
    """The inverse of pack_into: write the slices back into the parameters (or their gradients)."""
    offset = 0
    for p in params:
        n = p.numel()
        view = flat[offset:offset + n].view_as(p)
        if grads:
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)
        else:
            p.data.copy_(view)
        offset += n
