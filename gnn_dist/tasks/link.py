"""Link prediction (`--task link`): an encoder (any registered model, its last layer --embedding-dim wide), a
pair decoder (--decoder dot|mlp), BCE over each training positive and its --neg-ratio keyed negatives, and
AUC, Hits@K and MRR over the held-out pairs; the best epoch by validation AUC (by the official metric for
ogbl-* datasets). docs/link-prediction.md has the whole story.

The partition holds the split (partitioned with --task link): held-out edges never carry messages, and
each rank holds the pairs whose source it owns (gnn_dist.link.pairs). Scoring a pair whose other endpoint
lives elsewhere fetches that embedding from its owner (gnn_dist.link.row_fetch): `score_bytes`.
"""
from __future__ import annotations

from gnn_dist.link.metrics import OGB_METRICS
from gnn_dist.steps.state import sum_over_ranks
from gnn_dist.tasks.base import Task, best_record
from gnn_dist.tasks.registry import register_task


@register_task
class LinkTask(Task):
    name = "link"
    partition_task = "link"
    best_key = "val_auc"
    guard_names = {"metric": "validation AUC", "level_name": "chance"}

    @property
    def epoch_keys(self):  # type: ignore[override]
        from gnn_dist.link.evaluation import EPOCH_KEYS

        return EPOCH_KEYS

    @property
    def training_modes(self):  # type: ignore[override]
        from gnn_dist.link.full_batch import LinkFullBatchMode
        from gnn_dist.link.mini_batch import LinkMiniBatchMode

        return {"full": LinkFullBatchMode, "sampled": LinkMiniBatchMode}

    @property
    def selection_key(self) -> str:
        """The validation figure that picks the best epoch: AUC, or the ogbl-* dataset's official metric."""
        metric = OGB_METRICS.get(self.meta.dataset)
        return f"val_{metric}" if metric else "val_auc"

    def output_width(self) -> int:
        return self.config.link.embedding_dim or self.config.model.hidden

    def build_model(self, graph, exchanger, part=None, halo_blocking=None):
        from gnn_dist.link.decoders import make_decoder

        model = super().build_model(graph, exchanger, part, halo_blocking)
        model.decoder = make_decoder(self.config.link.decoder, self.output_width(), self.config.seed)
        return model

    def prepare(self, state, part) -> None:
        from gnn_dist.link.pairs import LinkPairs
        from gnn_dist.link.row_fetch import RowFetcher

        state.task_data = LinkPairs.from_part(self.config.parts, part)
        self.fetcher = RowFetcher(state.exchanger.comm, self.meta.partptr, state.ctx.rank, state.exchanger.counters,
                                  state.device)

    def evaluate(self, state) -> dict:
        from gnn_dist.link.evaluation import evaluate_link

        return evaluate_link(state)

    def traffic_figures(self, ctx, trained, evaluation) -> dict:
        score, eval_score = sum_over_ranks(ctx, [trained.score_bytes, evaluation.score_bytes])
        return {"score_bytes": int(score), "eval_score_bytes": int(eval_score)}

    def collapse_level(self, state) -> float | None:
        return 0.5  # the AUC of scores that know nothing

    def final_figures(self, state, records: list[dict]) -> dict:
        last = records[-1] if records else {}
        by_auc = best_record(records, "val_auc")
        selected = best_record(records, self.selection_key)
        test_key = "test_" + self.selection_key[len("val_"):]
        return {
            **{key: last.get(key) for key in ("test_auc", "val_auc", "test_hits@20", "test_hits@50",
                                              "test_hits@100", "test_mrr")},
            "best_val_auc": by_auc["val_auc"] if by_auc else None,
            "test_auc_at_best_val": by_auc["test_auc"] if by_auc else None,
            "selection_metric": self.selection_key[len("val_"):],
            "best_epoch": selected["epoch"] if selected else None,
            "test_at_best_val": selected[test_key] if selected else None,
            "score_bytes_total": sum(r["score_bytes"] for r in records),
            "eval_score_bytes_total": sum(r["eval_score_bytes"] for r in records),
        }

    @staticmethod
    def final_text(final: dict) -> str:
        return (f"test_auc={final['test_auc']:.4f} best_val_auc={final['best_val_auc']:.4f} "
                f"test_auc_at_best_val={final['test_auc_at_best_val']:.4f} test_hits@50={final['test_hits@50']:.4f} "
                f"test_mrr={final['test_mrr']:.4f} score_bytes_total={final['score_bytes_total']:,}")

    def describe(self) -> dict:
        link = self.config.link
        return {"task": self.name, "embedding_dim": self.output_width(), "decoder": link.decoder}
