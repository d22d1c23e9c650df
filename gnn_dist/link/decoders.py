"""Pair decoders (`--decoder dot|mlp`): a pair's score (a logit) from its two endpoints' embeddings.

    dot   <z_u, z_v>, PyG's link_pred example and GAE's inner-product decoder (no parameters)
    mlp   Linear(D, D) -> ReLU -> Linear(D, 1) on z_u * z_v (the Hadamard product), OGB's LinkPredictor for
          ogbl-collab/ppa/citation2 with two layers

Both are symmetric in u and v, as the undirected split is. The decoder is a submodule of the model
(`LayerStack.decoder`), so its parameters are broadcast, summed across ranks, checkpointed and restored
with the encoder's.
"""
from __future__ import annotations

import torch
from torch import nn

from gnn_dist.models.base import linear_uniform_


class DotDecoder(nn.Module):
    """Shapes, for both decoders: z_u [..., D] and z_v [..., D], broadcasting -> scores [...]."""

    def reset_parameters(self, generator: torch.Generator) -> None:
        pass

    def forward(self, z_u: torch.Tensor, z_v: torch.Tensor) -> torch.Tensor:
        return (z_u * z_v).sum(-1)


class MLPDecoder(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.hidden = nn.Linear(width, width)
        self.out = nn.Linear(width, 1)

    def reset_parameters(self, generator: torch.Generator) -> None:
        linear_uniform_(self.hidden, generator)
        linear_uniform_(self.out, generator)

    def forward(self, z_u: torch.Tensor, z_v: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(z_u * z_v))).squeeze(-1)


def make_decoder(name: str, width: int, seed: int) -> nn.Module:
    """The decoder of --decoder NAME over embeddings of `width`, its weights from the seed alone."""
    decoder = {"dot": DotDecoder, "mlp": lambda: MLPDecoder(width)}[name]()
    decoder.reset_parameters(torch.Generator().manual_seed(seed + 0x5EED))
    return decoder


def pair_loss_sum(decoder: nn.Module, z_src: torch.Tensor, z_pos: torch.Tensor, z_neg: torch.Tensor,
                  z_neg_src: torch.Tensor | None = None) -> torch.Tensor:
    """Summed binary cross-entropy of T positives (z_src[i], z_pos[i]) scored 1 and their T*K negatives scored 0:
    (z_neg_src[i, k], z_neg[i, k]), or under the `source` rule (z_neg_src None) (z_src[i], z_neg[i, k]), the
    sources broadcast over their K negatives (no [T*K, D] copy of them is made or saved).
    z_src, z_pos: [T, D]; z_neg, z_neg_src: [T, K, D]."""
    positive = decoder(z_src, z_pos)
    negative = decoder(z_src.unsqueeze(1) if z_neg_src is None else z_neg_src, z_neg)
    return (nn.functional.binary_cross_entropy_with_logits(positive, torch.ones_like(positive), reduction="sum")
            + nn.functional.binary_cross_entropy_with_logits(negative, torch.zeros_like(negative), reduction="sum"))
