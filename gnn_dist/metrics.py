"""Run metrics: the JSON Lines records of docs/metrics.md, written by rank 0 only, and the same epochs as
TensorBoard scalars (--tensorboard DIR).

Records stream to FILE.partial while the run goes on and are renamed to FILE
when it ends, so a file under the final name is always a complete run.
TensorBoard's event files are written as torchtitan writes them, with
torch.utils.tensorboard; the `tensorboard` package is an optional extra.

May import: nothing of gnn_dist
"""
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

TENSORBOARD_INSTALL = "pip install 'gnn-dist[tensorboard]' (or pip install tensorboard)"
# Each epoch's scalars as TensorBoard tags: group/name, so the dashboard shows loss, accuracy, traffic, time and
# memory as panels.
TENSORBOARD_GROUPS = {"loss": "loss", "train_acc": "accuracy", "val_acc": "accuracy", "test_acc": "accuracy",
                      "halo_bytes": "traffic", "eval_halo_bytes": "traffic", "allreduce_bytes": "traffic",
                      "halo_rows_skipped": "traffic", "epoch_s": "time", "comm_s": "time", "wait_s": "time",
                      "compute_s": "time", "eval_s": "time", "peak_rss_bytes_rank0": "memory",
                      "score_bytes": "traffic", "eval_score_bytes": "traffic",
                      **{f"{phase}_{name}": "link" for phase in ("val", "test")
                         for name in ("auc", "hits@20", "hits@50", "hits@100", "mrr")}}


def tensorboard_writer(directory: str):
    """A SummaryWriter for `directory`; ValueError with the install line when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ValueError(f"--tensorboard needs the tensorboard package: {TENSORBOARD_INSTALL}") from err
    return SummaryWriter(log_dir=directory)


class MetricsWriter:
    def __init__(self, path: str | os.PathLike | None, tensorboard: str | None = None):
        self.path = Path(path) if path else None
        self._handle = None
        self._board = tensorboard_writer(tensorboard) if tensorboard else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._partial = self.path.with_name(self.path.name + ".partial")
            self._handle = open(self._partial, "w")

    def write(self, record: dict) -> None:
        if self._handle is not None:
            self._handle.write(json.dumps(record) + "\n")
            self._handle.flush()
        if self._board is not None and not record.get("final"):
            for key, value in record.items():
                if key in TENSORBOARD_GROUPS and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._board.add_scalar(f"{TENSORBOARD_GROUPS[key]}/{key}", value, global_step=record["epoch"])
            self._board.flush()

    def close(self, complete: bool) -> None:
        if self._board is not None:
            self._board.close()
            self._board = None
        if self._handle is None:
            return
        self._handle.close()
        self._handle = None
        if complete:
            os.replace(self._partial, self.path)


def summarise(epochs: list[dict], run_fields: dict, task_figures: dict) -> dict:
    """The final record: run description, the task's figures (gnn_dist.tasks: Task.final_figures) and the traffic
    and time users compare runs by."""
    return {
        "final": True,
        **run_fields,
        "epochs": len(epochs),
        **task_figures,
        "halo_bytes_total": sum(r["halo_bytes"] for r in epochs),
        "halo_rows_total": sum(r["halo_rows"] for r in epochs),
        "halo_rows_skipped_total": sum(r["halo_rows_skipped"] for r in epochs),
        "eval_halo_bytes_total": sum(r["eval_halo_bytes"] for r in epochs),
        "allreduce_bytes_total": sum(r["allreduce_bytes"] for r in epochs),
        "epoch_s_median": statistics.median(r["epoch_s"] for r in epochs) if epochs else None,
    }
