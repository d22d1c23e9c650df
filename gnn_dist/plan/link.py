"""The link task's share of a rank's memory plan (gnn_dist.plan.memory): its pairs, the scoring of a training
step and of evaluation, priced in the plan's units."""
from __future__ import annotations

import math

from gnn_dist.link.evaluation import SCORE_CHUNK_PAIRS
from gnn_dist.plan.liveness import FLOAT, INDEX, Liveness
from gnn_dist.plan.options import PlanConfig


def link_pairs_bytes(link) -> int:
    """gnn_dist.link.pairs.LinkPairs: training pairs, edge ids and source ids; held-out pairs and MRR candidates;
    the original-to-global id map of every node."""
    held_out = (link.val + link.val_neg + link.test + link.test_neg) * 2 + (link.val + link.test) * link.mrr_negatives
    return link.train * 4 * INDEX + held_out * INDEX + link.num_nodes * (4 if link.num_nodes < 2**31 else 8)


def distinct_remote(link, n: int, draws: int) -> int:
    """Expected distinct nodes owned elsewhere among `draws` uniform endpoints (what one exchange fetches)."""
    if link.num_nodes <= n:
        return 0
    return int((link.num_nodes - n) * -math.expm1(-draws / link.num_nodes))


def plan_link_scoring(live: Liveness, config: PlanConfig, link, n: int, width: int) -> None:
    """gnn_dist.link.full_batch: the negatives and the exchange's plan (numpy), [owned | fetched]
    embeddings, every pair's rows, and the decoder's saved tensors; their gradients in the backward."""
    ratio = config.neg_ratio
    negatives = link.train * ratio
    pairs = link.train + negatives
    # the pairs rule also draws, fetches and gathers each negative's source (the source rule broadcasts the
    # positive's own: no copy)
    neg_sources = negatives if config.negatives == "pairs" else 0
    endpoints = pairs + neg_sources
    fetched = distinct_remote(link, n, endpoints)
    live.alloc("negatives, plan", (4 * (negatives + neg_sources) + 3 * endpoints) * INDEX)  # keyed words, ids, unique
    live.free("negatives, plan")
    live.alloc("negatives, plan", (negatives + neg_sources + 2 * endpoints) * INDEX)  # kept: the draw, each row
    # [owned | fetched] embeddings, then the sources', positives', negatives' (and negative sources') rows
    live.alloc("pair rows", ((n + fetched) + 2 * link.train + negatives + neg_sources) * width * FLOAT)
    if config.decoder == "mlp":
        live.alloc("decoder saved", 3 * pairs * width * FLOAT)  # Hadamard products, hidden layer, its ReLU
    live.alloc("pair products", negatives * width * FLOAT)
    live.free("pair products")
    # the backward: the negatives' and their sources' gradients, the positives' and sources', and the gradient
    # of the [owned | fetched] table
    live.alloc("pair gradients", (2 * negatives + 2 * link.train + (n + fetched)) * width * FLOAT)
    live.free("pair gradients", "pair rows", "decoder saved", "negatives, plan")
    live.alloc("loss", 0)


def plan_link_evaluation(live: Liveness, link, n: int, width: int) -> None:
    """gnn_dist.link.evaluation, the larger of the two held-out sets: [owned | fetched] rows of its endpoints and
    MRR candidates, the positive and negative pairs' rows, and one chunk of MRR candidates."""
    worst = max((link.val, link.val_neg), (link.test, link.test_neg))
    ends = worst[0] + worst[1] + worst[0] * link.mrr_negatives
    fetched = distinct_remote(link, n, ends)
    chunk = min(SCORE_CHUNK_PAIRS, worst[0] * link.mrr_negatives)
    live.alloc("scoring", ((n + fetched) + 2 * (worst[0] + worst[1]) + 3 * chunk) * width * FLOAT + 3 * ends * INDEX)
