"""Node classification (`--task node`, the default): a class per node, cross-entropy over the training
nodes, accuracies over the masks, the best epoch by validation accuracy."""
from __future__ import annotations

from gnn_dist.tasks.base import Task, best_record
from gnn_dist.tasks.registry import register_task


@register_task
class NodeTask(Task):
    name = "node"
    partition_task = "node"
    epoch_keys = ("train_acc", "val_acc", "test_acc")
    best_key = "val_acc"

    @property
    def training_modes(self):  # type: ignore[override]
        from gnn_dist.hetero.mini_batch import TypedMiniBatchMode
        from gnn_dist.steps.full_batch import FullBatchMode
        from gnn_dist.steps.mini_batch import MiniBatchMode

        return {"full": FullBatchMode, "sampled": MiniBatchMode if self.meta.hetero is None else TypedMiniBatchMode}

    def output_width(self) -> int:
        return self.meta.num_classes

    def prepare(self, state, part) -> None:
        from gnn_dist.steps.evaluation import majority_rate

        state.val_majority_rate = majority_rate(state.ctx, state.graph.y[state.graph.val_mask],
                                                self.meta.num_classes)

    def evaluate(self, state) -> dict:
        from gnn_dist.steps.evaluation import evaluate

        return evaluate(state)

    def collapse_level(self, state) -> float | None:
        return state.val_majority_rate

    def final_figures(self, state, records: list[dict]) -> dict:
        best = best_record(records, "val_acc")
        return {
            "test_acc": records[-1]["test_acc"] if records else None,
            "best_val_acc": best["val_acc"] if best else None,
            "test_acc_at_best_val": best["test_acc"] if best else None,
            "val_majority_rate": state.val_majority_rate,
        }

    @staticmethod
    def final_text(final: dict) -> str:
        return (f"test_acc={final['test_acc']:.4f} best_val_acc={final['best_val_acc']:.4f} "
                f"test_acc_at_best_val={final['test_acc_at_best_val']:.4f}")
