"""Evaluation: accuracies over all ranks' owned nodes, and every node's prediction (--predictions-out)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from gnn_dist.context import RankContext
from gnn_dist.graph.local_graph import LocalGraph
from gnn_dist.steps.state import RankState, sum_over_ranks


@torch.no_grad()
def evaluate(state: RankState) -> dict:
    """Train/val/test accuracy over all ranks' owned nodes (fractions in [0, 1]), layer by layer in chunks."""
    _, logits = gather_logits(state)
    return accuracies(state.ctx, logits, state.graph)


def accuracies(ctx: RankContext, logits: torch.Tensor, graph: LocalGraph) -> dict:
    correct = logits.argmax(1) == graph.y
    counts = []
    for mask in (graph.train_mask, graph.val_mask, graph.test_mask):
        counts += [float(correct[mask].sum()), float(mask.sum())]
    c = sum_over_ranks(ctx, counts)
    return {name: (c[2 * i] / c[2 * i + 1] if c[2 * i + 1] else 0.0)
            for i, name in enumerate(("train_acc", "val_acc", "test_acc"))}


@torch.no_grad()
def gather_logits(state: RankState) -> tuple[torch.Tensor, torch.Tensor]:
    """(original node ids, eval-mode logits) of this rank's owned nodes, layer by layer in chunks."""
    state.model.eval()
    return state.graph.node_ids, state.model.forward_layerwise(state.x_full, state.config.eval_chunk_nodes)


def majority_rate(ctx: RankContext, labels: torch.Tensor, num_classes: int) -> float | None:
    """The share of the most common class among all ranks' `labels` (None when there are none)."""
    counts = sum_over_ranks(ctx, torch.bincount(labels, minlength=num_classes).double().tolist())
    return max(counts) / sum(counts) if sum(counts) else None


def write_predictions(state: RankState, path: str) -> None:
    """Every node's predicted class (eval mode), indexed by original id, as a plain .npy (rank 0).

    Gathers one int per node on rank 0 through the object allgather: meant for
    graphs whose label vector fits one process (scoring with OGB's Evaluator).
    """
    node_ids, logits = gather_logits(state)
    pieces = state.ctx.comm.allgather_object((node_ids.cpu().numpy(), logits.argmax(1).cpu().numpy()))
    if state.ctx.is_root:
        total = sum(ids.shape[0] for ids, _ in pieces)
        predictions = np.full(total, -1, dtype=np.int64)
        for ids, pred in pieces:
            predictions[ids] = pred
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".partial.npy")
        np.save(tmp, predictions)
        os.replace(tmp, target)
