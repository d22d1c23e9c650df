"""Sampled link prediction (`--task link --mode sampled`): mini-batches of this rank's training positives.

A batch's seeds are every endpoint of its positives and of their keyed negatives (the same negatives as
full-batch training draws, both ends under --negatives pairs); the sampler grows the k-hop neighbourhood of
each seed, wherever it lives, as PyG's LinkNeighborLoader does, and the pairs are scored from the seeds'
outputs. Everything else (sampling, remote features, the cache, one gradient allreduce per step) is node
classification's (gnn_dist.steps.mini_batch). The loss of a step is the BCE summed over its pairs divided
by the global number of pairs of that step.
"""
from __future__ import annotations

import numpy as np
import torch

from gnn_dist.link.decoders import pair_loss_sum
from gnn_dist.steps.mini_batch import MiniBatchMode


class LinkMiniBatchMode(MiniBatchMode):
    def __init__(self, state, part):
        self.pairs = state.task_data
        self.ratio, self.rule = state.config.link.neg_ratio, state.config.link.negatives
        self.terms_per_item = 1 + self.ratio
        super().__init__(state, part)

    def training_items(self, part) -> np.ndarray:
        return np.arange(len(self.pairs.train), dtype=np.int64)

    def batch_seeds(self, epoch: int, batch: np.ndarray):
        positives = self.pairs.train[batch]
        neg_sources, negatives = self.pairs.negatives(self.state.config.seed, epoch, batch, self.ratio, self.rule)
        endpoints = [positives[:, 0], positives[:, 1], negatives.reshape(-1)]
        seeds, where = np.unique(np.concatenate(endpoints + ([] if neg_sources is None else [neg_sources.reshape(-1)])),
                                 return_inverse=True)
        return seeds, (len(batch), torch.from_numpy(where.reshape(-1)).to(self.state.device))

    def batch_loss(self, out: torch.Tensor, targets) -> tuple[torch.Tensor, int]:
        n, where = targets
        if n == 0:
            return out.sum() * 0.0, 0
        drawn = n * self.ratio
        z_src, z_pos = out.index_select(0, where[:n]), out.index_select(0, where[n:2 * n])
        z_neg = out.index_select(0, where[2 * n:2 * n + drawn]).view(n, self.ratio, -1)
        z_neg_src = out.index_select(0, where[2 * n + drawn:]).view(n, self.ratio, -1) if self.rule == "pairs" \
            else None
        return pair_loss_sum(self.state.model.decoder, z_src, z_pos, z_neg, z_neg_src), n * (1 + self.ratio)
