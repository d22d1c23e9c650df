"""Full-batch link prediction (`--task link --mode full`): one optimiser step per epoch over every training
positive of every rank and its --neg-ratio negatives (--negatives source|pairs: gnn_dist.link.negatives).

P-invariance, as node classification's: the loss is the BCE summed over this rank's pairs (positives whose
source it owns) divided by the global number of pairs; the negatives are keyed by (seed, epoch, edge id);
the embeddings of endpoints owned elsewhere arrive by one planned exchange (gnn_dist.link.row_fetch), and
their gradients go back to their owners in the backward, before the encoder's own backward needs them.
"""
from __future__ import annotations

import numpy as np
import torch

from gnn_dist.link.decoders import pair_loss_sum
from gnn_dist.steps.full_batch import FullBatchMode
from gnn_dist.steps.gradients import sync_gradients


class LinkFullBatchMode(FullBatchMode):
    """Node classification's epoch (gnn_dist.steps.full_batch), with the pairs' loss in place of the nodes'."""

    def __init__(self, state, part=None):
        super().__init__(state, part)
        self.pairs = state.task_data
        self.fetcher = state.task.fetcher
        self.ratio, self.rule = state.config.link.neg_ratio, state.config.link.negatives
        self.sources = torch.from_numpy(self.pairs.train[:, 0] - self.pairs.first).to(state.device)

    def compute_gradients(self, epoch: int) -> float:
        """Forward, scores, backward on this rank; afterwards every rank holds the gradient of the global mean
        pair loss. Returns that loss."""
        state, pairs = self.state, self.pairs
        model = state.model
        model.train()
        model.epoch = epoch
        state.optimizer.zero_grad(set_to_none=False)
        neg_sources, negatives = pairs.negatives(state.config.seed, epoch, np.arange(len(pairs.train)), self.ratio,
                                                 self.rule)
        wanted = [pairs.train[:, 1], negatives.reshape(-1)] + ([] if neg_sources is None else [neg_sources.reshape(-1)])
        request = self.fetcher.plan(np.concatenate(wanted))
        z = model(state.x_full)
        table = self.fetcher.table(z, request)
        n, drawn = len(pairs.train), negatives.size
        # Separate gathers, not one sliced apart: a slice's backward would allocate the whole gather's gradient.
        positions = torch.from_numpy(request.positions).to(state.device)
        z_pos = table.index_select(0, positions[:n])
        z_neg = table.index_select(0, positions[n:n + drawn]).view(n, self.ratio, -1)
        z_neg_src = None if neg_sources is None else table.index_select(0, positions[n + drawn:]).view(n, self.ratio, -1)
        loss = pair_loss_sum(model.decoder, z.index_select(0, self.sources), z_pos, z_neg, z_neg_src) \
            / (pairs.num_train_total * (1 + self.ratio))
        loss.backward()
        (global_loss,) = sync_gradients(state.exchanger, self.params, self.flat, [loss.detach()])
        return global_loss
