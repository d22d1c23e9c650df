"""Ranking metrics of link prediction, on plain score arrays (higher: more likely an edge).

    auc(pos, neg)            the probability that a positive outscores a negative, ties counting one half
                             (the Mann-Whitney U statistic: what sklearn's roc_auc_score computes)
    hits_at_k(pos, neg, k)   OGB's Hits@K: the share of positives scoring above the k-th best negative
                             (1.0 when there are fewer than k negatives)
    reciprocal_ranks(pos, neg)   OGB's MRR terms: each positive ranked among its own negatives [M, R], ties
                             counted half-way between the optimistic and pessimistic rank

For the ogbl-* datasets the official figure comes from OGB's own Evaluator (ogb_figures), which these
functions match (tests/test_link.py).
"""
from __future__ import annotations

import numpy as np

HITS_AT = (20, 50, 100)
# The official metric of each OGB link dataset (ogb/linkproppred/master.csv)
OGB_METRICS = {"ogbl-collab": "hits@50", "ogbl-ppa": "hits@100", "ogbl-ddi": "hits@20", "ogbl-citation2": "mrr"}


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    scores = np.concatenate([pos, neg]).astype(np.float64)
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based rank of each distinct score, ties averaged
    ranks = average_rank[inverse]
    u = ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2.0
    return float(u / (len(pos) * len(neg)))


def hits_at_k(pos: np.ndarray, neg: np.ndarray, k: int) -> float:
    if len(pos) == 0:
        return float("nan")
    if len(neg) < k:
        return 1.0
    kth_best = np.partition(neg, len(neg) - k)[len(neg) - k]
    return float((pos > kth_best).mean())


def reciprocal_ranks(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """[M]: 1 / rank of each positive among its row of neg [M, R]."""
    optimistic = (neg > pos[:, None]).sum(1)
    pessimistic = (neg >= pos[:, None]).sum(1)
    return 1.0 / (0.5 * (optimistic + pessimistic) + 1.0)


def ogb_figures(dataset: str, pos: np.ndarray, neg: np.ndarray, mrr_pos=None, mrr_neg=None) -> dict:
    """{metric name: value} from OGB's Evaluator for an ogbl-* dataset: hits@K over (pos, neg) pairs, or MRR
    over each positive's own negatives (mrr_pos [M], mrr_neg [M, R])."""
    import torch
    from ogb.linkproppred import Evaluator

    metric = OGB_METRICS[dataset]
    evaluator = Evaluator(name=dataset)
    if metric == "mrr":
        result = evaluator.eval({"y_pred_pos": torch.from_numpy(mrr_pos), "y_pred_neg": torch.from_numpy(mrr_neg)})
        return {"mrr": float(result["mrr_list"].mean())}
    result = evaluator.eval({"y_pred_pos": torch.from_numpy(pos), "y_pred_neg": torch.from_numpy(neg)})
    return {metric: float(result[metric])}
