"""Link prediction's evaluation: every owned node's embedding by the chunked layer-wise forward, then each rank
scores the validation and test pairs whose source it owns, fetching the other endpoints' embeddings from their
owners (gnn_dist.link.row_fetch), and the ranks combine the scores into one figure each.

AUC and Hits@K rank every positive against the shared negative pairs, so their scores are gathered on every
rank (two floats per pair); MRR ranks each positive against its own negatives, so only its sum of reciprocal
ranks and its count are summed. For ogbl-* datasets the official metric comes from OGB's Evaluator on the same
scores (gnn_dist.link.metrics.ogb_figures).
"""
from __future__ import annotations

import numpy as np
import torch

from gnn_dist.link.metrics import HITS_AT, OGB_METRICS, auc, hits_at_k, ogb_figures, reciprocal_ranks
from gnn_dist.link.pairs import PHASES, LinkPairs
from gnn_dist.steps.state import sum_over_ranks

# Pairs scored at once: bounds the temporaries of the MRR candidates ([M, R] pairs of D-wide rows).
SCORE_CHUNK_PAIRS = 1 << 16


# The figures of every evaluation, in every epoch record
EPOCH_KEYS = tuple(f"{phase}_{name}" for phase in PHASES for name in ("auc", *(f"hits@{k}" for k in HITS_AT), "mrr"))


def score_pairs(decoder, z_src: torch.Tensor, z_dst: torch.Tensor) -> torch.Tensor:
    """Decoder scores of row-aligned pairs, in chunks."""
    out = torch.empty(z_src.shape[0], device=z_src.device)
    for start in range(0, z_src.shape[0], SCORE_CHUNK_PAIRS):
        stop = start + SCORE_CHUNK_PAIRS
        out[start:stop] = decoder(z_src[start:stop], z_dst[start:stop])
    return out


@torch.no_grad()
def evaluate_link(state) -> dict:
    """{val,test}_{auc, hits@20, hits@50, hits@100, mrr} over all ranks' pairs (collective)."""
    pairs: LinkPairs = state.task_data
    task = state.task
    model = state.model
    model.eval()
    z = model.forward_layerwise(state.x_full, state.config.eval_chunk_nodes)
    figures = {}
    for phase in PHASES:
        pos, neg, mrr = (getattr(pairs, f"{phase}_{kind}") for kind in ("pos", "neg", "mrr"))
        request = task.fetcher.plan(np.concatenate([pos[:, 1], neg[:, 1], mrr.reshape(-1)]))
        table = task.fetcher.table(z, request)
        device = z.device
        rows = torch.from_numpy(request.positions).to(device)
        n_pos, n_neg = len(pos), len(neg)
        pos_scores = score_pairs(model.decoder, z[torch.from_numpy(pos[:, 0] - pairs.first).to(device)],
                                 table[rows[:n_pos]])
        neg_scores = score_pairs(model.decoder, z[torch.from_numpy(neg[:, 0] - pairs.first).to(device)],
                                 table[rows[n_pos:n_pos + n_neg]])
        r = mrr.shape[1]
        mrr_scores = torch.empty(n_pos, r, device=device)
        per_chunk = max(1, SCORE_CHUNK_PAIRS // max(r, 1))
        for start in range(0, n_pos, per_chunk):
            stop = min(n_pos, start + per_chunk)
            sources = z[torch.from_numpy(pos[start:stop, 0] - pairs.first).to(device)].unsqueeze(1)  # over r
            candidates = table[rows[n_pos + n_neg + start * r:n_pos + n_neg + stop * r]].view(stop - start, r, -1)
            mrr_scores[start:stop] = model.decoder(sources, candidates)
        figures.update(_combine(state, phase, pos_scores.cpu().numpy(), neg_scores.cpu().numpy(),
                                mrr_scores.cpu().numpy()))
    return figures


def _combine(state, phase: str, pos: np.ndarray, neg: np.ndarray, mrr_neg: np.ndarray) -> dict:
    gathered = state.ctx.comm.allgather_object((pos, neg)) if state.ctx.size > 1 else [(pos, neg)]
    all_pos = np.concatenate([p for p, _ in gathered])
    all_neg = np.concatenate([n for _, n in gathered])
    rr = reciprocal_ranks(pos, mrr_neg)
    rr_sum, rr_count = sum_over_ranks(state.ctx, [float(rr.sum()), float(len(rr))])
    figures = {f"{phase}_auc": auc(all_pos, all_neg),
               **{f"{phase}_hits@{k}": hits_at_k(all_pos, all_neg, k) for k in HITS_AT},
               f"{phase}_mrr": rr_sum / rr_count if rr_count else float("nan")}
    dataset = state.dataset
    if dataset in OGB_METRICS:
        # The official figure from OGB's own Evaluator, in place of ours (they agree: tests/test_link.py).
        metric = OGB_METRICS[dataset]
        if metric == "mrr":
            official = ogb_figures(dataset, all_pos, all_neg, pos, mrr_neg)["mrr"] if len(pos) else 0.0
            total, count = sum_over_ranks(state.ctx, [official * len(pos), float(len(pos))])
            figures[f"{phase}_mrr"] = total / count if count else float("nan")
        else:
            figures[f"{phase}_{metric}"] = ogb_figures(dataset, all_pos, all_neg)[metric]
    return figures
